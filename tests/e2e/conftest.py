"""End-to-end fixtures: a real local cluster (controller + two agents over gRPC) driven through the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.polling import wait_until

BIN = Path(sys.executable).parent
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


@dataclass
class Cluster:
    state_dir: Path
    env: dict[str, str]
    work: Path

    def run(self, *args: str, check: bool = True, input: str | None = None, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        exe = args[0] if "/" in args[0] else str(BIN / args[0])
        proc = subprocess.run(
            [exe, *args[1:]], capture_output=True, text=True, env=env or self.env, input=input,
            cwd=str(cwd or self.work), timeout=120,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def submit(self, *args: str) -> str:
        return self.run("gsub", "--parsable", *args).stdout.strip()

    def jobs(self, *ids: str) -> list[dict[str, Any]]:
        args = ["gqueue", "--json"] + (["-j", ",".join(ids)] if ids else ["-t", "all"])
        return json.loads(self.run(*args).stdout)["jobs"]

    def job(self, job_id: str) -> dict[str, Any]:
        (job,) = self.jobs(job_id)
        return job

    def wait_state(self, job_id: str, states: set[str], timeout: float = 60.0) -> dict[str, Any]:
        return wait_until(
            lambda: next((j for j in self.jobs(job_id) if j["state"] in states), None),
            timeout, what=f"job {job_id} to reach {sorted(states)}",
        )

    def wait_done(self, job_id: str, timeout: float = 60.0) -> dict[str, Any]:
        return self.wait_state(job_id, TERMINAL, timeout)

    def up(self) -> None:
        out = self.run("garrison", "up", "--state-dir", str(self.state_dir)).stdout.strip()
        assert out == f"export GARRISON_CONTROLLER={self.env['GARRISON_CONTROLLER']}", out

    def pid(self, daemon: str) -> int:
        return int((self.state_dir / f"{daemon}.pid").read_text())


def start_cluster(topologies: list[str], extra_args: Sequence[str] = ()) -> Cluster:
    state_dir = Path(tempfile.mkdtemp(prefix="gtest-", dir="/tmp"))
    work = state_dir / "work"
    work.mkdir()
    os.chmod(state_dir, 0o755)
    os.chmod(work, 0o777)
    env = dict(os.environ)
    env.pop("GARRISON_CONTROLLER", None)
    env["XDG_CACHE_HOME"] = str(state_dir / "cache")
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    args = [str(BIN / "garrison"), "up", "--state-dir", str(state_dir)]
    for topology in topologies:
        args += ["--fake-topology", topology]
    args += list(extra_args)  # e.g. --database URL
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode != 0:
        logs = "\n".join(p.read_text()[-2000:] for p in state_dir.glob("*.log"))
        raise RuntimeError(f"garrison up failed: {proc.stderr}\n{logs}")
    line = proc.stdout.strip()
    assert line.startswith("export GARRISON_CONTROLLER=127.0.0.1:"), line
    env["GARRISON_CONTROLLER"] = line.split("=", 1)[1]
    return Cluster(state_dir=state_dir, env=env, work=work)


def stop_cluster(cluster: Cluster) -> None:
    subprocess.run([str(BIN / "garrison"), "down", "--state-dir", str(cluster.state_dir)], env=cluster.env,
                   capture_output=True, timeout=120)
    shutil.rmtree(cluster.state_dir, ignore_errors=True)


PREEMPTION_CONFIG = Path(__file__).resolve().parents[1] / "data" / "preemption.toml"


@pytest.fixture
def preempting_cluster() -> Iterator[Cluster]:
    """One DGX A100 node under tests/data/preemption.toml (QoS `urgent` may preempt `low`), per test."""
    c = start_cluster(["dgx-a100"], ["--agents", "1", "--extra-config", str(PREEMPTION_CONFIG)])
    try:
        yield c
    finally:
        stop_cluster(c)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = start_cluster(["dgx-a100", "dgx1v"])
    try:
        yield c
    finally:
        stop_cluster(c)
