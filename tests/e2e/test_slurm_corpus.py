"""Real public sbatch scripts (tests/data/slurm_corpus, MANIFEST.toml says whose), run unchanged end to end
with Slurm's own command names on a local cluster of four 8-GPU fake nodes.

The training program of each script is a stub (harness/stub.py) that joins the process group its launcher
described and does a real gloo all_reduce; the test then checks what every rank got (rank, world size, master
address and port, CUDA_VISIBLE_DEVICES) and the job itself (nodes, GPUs, time limit, output files) against
the script's directives. The scripts run side by side where the cluster allows; two that bind the same fixed
port take turns, since every fake node is this one host.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .conftest import BIN, TERMINAL, Cluster, start_cluster, stop_cluster

# The whole corpus runs in the module's first test's setup: about 2-3 minutes on 2 idle cores.
# As root only: then each fake node resolves (garrison up names them in /etc/hosts) and names itself (its own
# UTS namespace), which scripts taking MASTER_ADDR from the node list or $(hostname) need.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600),
              pytest.mark.skipif(os.geteuid() != 0, reason="fake nodes resolve and name themselves only as root")]

CORPUS = Path(__file__).resolve().parents[1] / "data" / "slurm_corpus"
HARNESS = CORPUS / "harness"
MANIFEST: list[dict[str, Any]] = tomllib.loads((CORPUS / "MANIFEST.toml").read_text())["script"]
TOPOLOGIES = ["dgx-a100", "dgx-a100", "dgx1v", "dgx1v"]  # 4 nodes of 8 GPUs: 2 A100, 2 V100
GPU_NODES = {"a100": {"node1", "node2"}, "v100": {"node3", "node4"}}  # node N is TOPOLOGIES[N - 1]
FAKE_CPUS = "128"
# The sites' partitions and accounts the scripts name (gpuq, where the array's torchruns all bind 29500 on
# 127.0.0.1, is one node, so its tasks take turns as they would on separate hosts).
CLUSTER_CONFIG = """\
accounts = ["default", "project_2001659", "six@gpu"]
partitions = [
  {name = "main", default = true}, {name = "gputest"}, {name = "xyz-cluster"}, {name = "gpu_p5"},
  {name = "tier2q"}, {name = "gpuq", nodes = ["node4"]},
]
"""
# From submission, queueing behind the others included: every script is submitted at once, and on a loaded
# 2-core machine the last of fms-ehrs-chain's four 8-rank torchrun tasks ran past 240 s. Only a failure waits it out.
JOB_TIMEOUT_S = 420.0


@dataclass
class Outcome:
    """What running one corpus entry left behind."""

    entry: dict[str, Any]
    root: Path  # the entry's copied directory
    submit: subprocess.CompletedProcess[str] | None = None
    jobs: list[list[dict[str, Any]]] = field(default_factory=list)  # per submitted job: its records (array tasks)
    error: str = ""


def slurm_path(cluster: Cluster) -> Path:
    return Path(cluster.run("garrison", "slurm-path").stdout.strip())


def expand(pattern: str, job: dict[str, Any]) -> str:
    """An output pattern as sbatch expands it for ``job`` (%j %x %A %a %%)."""
    values = {
        "j": str(job["job_id"]), "x": job["name"], "A": str(job.get("array_job_id") or job["job_id"]),
        "a": str(job.get("array_task_id") if job.get("array_task_id") is not None else "4294967294"),
        "%": "%",
    }
    return re.sub(r"%([jxAa%])", lambda m: values[m.group(1)], pattern)


def job_key(job: dict[str, Any]) -> str:
    """The directory the stub writes its records to for ``job``."""
    if job.get("array_task_id") is not None:
        return f"{job['array_job_id']}_{job['array_task_id']}"
    return str(job["job_id"])


def prepare(cluster: Cluster, entry: dict[str, Any]) -> Path:
    """The entry's repository directory, copied unchanged, with the stub at each training program's path and
    the user's own files and directories beside it."""
    root = cluster.work / entry["id"]
    shutil.copytree(CORPUS / entry["root"], root)
    for program in entry.get("programs", []):
        (root / program).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(HARNESS / "stub.py", root / program)
    for name, text in entry.get("files", {}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text.replace("{python_bin}", str(BIN)))
    for name in entry.get("dirs", []):
        (root / name).mkdir(parents=True, exist_ok=True)
    for path in [root, *root.rglob("*")]:
        os.chmod(path, 0o777 if path.is_dir() else 0o755)
    return root


def environment(cluster: Cluster, entry: dict[str, Any], sbatch_dir: Path) -> dict[str, str]:
    env = dict(cluster.env)
    # Slurm's names first, as on a login node; then the site's stand-ins (module, deepspeed, ...) and our Python.
    env["PATH"] = f"{sbatch_dir}:{HARNESS / 'bin'}:{BIN}:{env['PATH']}"
    env["CORPUS_RESULTS"] = str(cluster.work / "results")
    env["CORPUS_MODE"] = entry.get("mode", "torch")
    env.update(entry.get("env", {}))
    return env


def submitted_ids(entry: dict[str, Any], proc: subprocess.CompletedProcess[str]) -> list[str]:
    if entry.get("run") == "bash":  # a driver prints the ids it got from sbatch --parsable
        return re.findall(r"\d+", proc.stdout.strip().splitlines()[-1])
    match = re.fullmatch(r"Submitted batch job (\d+)", proc.stdout.strip())
    assert match, proc.stdout
    return [match.group(1)]


class Board:
    """The cluster's jobs as one poller sees them: every waiting entry reads this one `gqueue` (one call a
    second for all of them), not a poll of its own, which would keep the two cores busy starting gqueues."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.jobs: dict[str, dict[str, Any]] = {}
        self.changed = threading.Condition()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stopped.is_set():
            try:
                jobs = {str(job["job_id"]): job for job in self.cluster.jobs()}
            except (AssertionError, OSError, subprocess.SubprocessError, ValueError):
                jobs = self.jobs  # a gqueue that failed once: the next poll tells
            with self.changed:
                self.jobs = jobs
                self.changed.notify_all()
            self.stopped.wait(1.0)  # the next poll; stop() ends the wait at once

    def wait_done(self, ids: list[str], timeout_s: float) -> list[dict[str, Any]]:
        def done() -> bool:
            return all(self.jobs.get(i, {}).get("state") in TERMINAL for i in ids)

        with self.changed:
            if not self.changed.wait_for(done, timeout_s):
                states = {i: self.jobs.get(i, {}).get("state") for i in ids}
                raise AssertionError(f"jobs not ended after {timeout_s}s: {states}")
            return [self.jobs[i] for i in ids]

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()


def run_entry(cluster: Cluster, entry: dict[str, Any], sbatch_dir: Path, locks: dict[int, threading.Lock],
              board: Board) -> Outcome:
    root = prepare(cluster, entry)
    outcome = Outcome(entry=entry, root=root)
    held = [locks[port] for port in sorted(entry.get("ports", []))]
    for lock in held:
        lock.acquire()
    try:
        env = environment(cluster, entry, sbatch_dir)
        script = root / entry["file"]
        cwd = root / entry.get("cwd", script.parent.relative_to(root))
        if entry.get("run") == "bash":
            argv = ["bash", str(script)]
        else:
            argv = [str(sbatch_dir / "sbatch"), *entry.get("sbatch_args", []), script.name, *entry.get("script_args", [])]
        outcome.submit = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
        if outcome.submit.returncode != 0:
            outcome.error = f"submission exited {outcome.submit.returncode}: {outcome.submit.stderr.strip()}"
            return outcome
        specs = entry.get("jobs") or [{"expect": entry["expect"]}]
        for job_id, spec in zip(submitted_ids(entry, outcome.submit), specs, strict=True):
            ids = [f"{job_id}_{i}" for i in spec["array"]] if "array" in spec else [job_id]
            outcome.jobs.append(board.wait_done(ids, JOB_TIMEOUT_S))
    except Exception as problem:  # reported by the entry's own test, never hiding the other entries' results
        outcome.error = f"{type(problem).__name__}: {problem}"
    finally:
        for lock in held:
            lock.release()
    return outcome


@pytest.fixture(scope="module")
def corpus_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    config = tmp_path_factory.mktemp("corpus") / "cluster.toml"
    config.write_text(CLUSTER_CONFIG)
    cluster = start_cluster(TOPOLOGIES, ["--extra-config", str(config), "--fake-cpus", FAKE_CPUS])
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.fixture(scope="module")
def outcomes(corpus_cluster: Cluster) -> dict[str, Outcome]:
    """Every entry, run at once: each waits only for the cluster and for entries binding its fixed ports."""
    sbatch_dir = slurm_path(corpus_cluster)
    if not (sbatch_dir / "sbatch").exists():
        pytest.skip(f"no sbatch in {sbatch_dir} (Slurm's command names: cli/slurm)")
    locks = {port: threading.Lock() for entry in MANIFEST for port in entry.get("ports", [])}
    board = Board(corpus_cluster)
    try:
        with ThreadPoolExecutor(max_workers=len(MANIFEST)) as pool:
            futures = {e["id"]: pool.submit(run_entry, corpus_cluster, e, sbatch_dir, locks, board) for e in MANIFEST}
            return {name: future.result() for name, future in futures.items()}
    finally:
        board.stop()


def records(cluster: Cluster, job: dict[str, Any]) -> list[dict[str, Any]]:
    directory = cluster.work / "results" / job_key(job)
    return [json.loads(p.read_text()) for p in sorted(directory.glob("rank-*.json"))]


def job_output(outcome: Outcome, job: dict[str, Any], expect: dict[str, Any], workdir: Path) -> str:
    texts = []
    for pattern in expect["outputs"]:
        path = workdir / expand(pattern, job)
        texts.append(f"--- {path.name}:\n{path.read_text()[-3000:]}" if path.exists() else f"--- {path}: missing")
    return "\n".join(texts)


def check_job(cluster: Cluster, outcome: Outcome, job: dict[str, Any], expect: dict[str, Any], workdir: Path) -> None:
    where = f"job {job['job_id']} ({job['name']})"
    assert job["state"] == "COMPLETED", f"{where}: {job['state']}\n{job_output(outcome, job, expect, workdir)}"
    assert len(job["nodes"]) == expect["nodes"], f"{where}: nodes {job['nodes']}"
    if "gpu" in expect:
        assert set(job["nodes"]) <= GPU_NODES[expect["gpu"]], f"{where}: {expect['gpu']} wanted, ran on {job['nodes']}"
    assert job["gpus"] == expect["nodes"] * expect["gpus_per_node"], f"{where}: {job['gpus']} GPUs"
    assert job["time_limit_s"] == expect["time_limit_s"], f"{where}: time limit {job['time_limit_s']}"
    for pattern in expect["outputs"]:
        assert (workdir / expand(pattern, job)).is_file(), f"{where}: no output file {pattern}"
    ranks = records(cluster, job)
    world = expect["world"]
    assert sorted(r["rank"] for r in ranks) == list(range(world)), f"{where}: ranks {[r['rank'] for r in ranks]}"
    assert {r["world"] for r in ranks} == {world}
    assert all(r["sum"] == world * (world - 1) / 2 for r in ranks), "the all_reduce's sum"
    assert len({(r["addr"], r["port"]) for r in ranks}) == 1, f"{where}: masters {[(r['addr'], r['port']) for r in ranks]}"
    port = expect.get("port")
    if port == "10000+job":
        port = 10000 + int(str(job["job_id"])[-4:])
    if port is not None:
        assert ranks[0]["port"] == port, f"{where}: master port {ranks[0]['port']}, the script chose {port}"
    nodes = {r["node"] for r in ranks}
    assert nodes <= set(job["nodes"]) and len(nodes) == min(expect["nodes"], world), f"{where}: ranks on {nodes}"
    for r in ranks:
        visible = [d for d in (r["cuda_visible_devices"] or "").split(",") if d]
        assert len(visible) == expect["visible"], f"{where}: rank {r['rank']} sees GPUs {visible}"
        assert not visible or r["local_rank"] < len(visible), f"{where}: rank {r['rank']} local rank {r['local_rank']}"
        if r["local_rank_argument"] is not None:
            assert r["local_rank_argument"] == r["local_rank"]
    per_node = world // expect["nodes"] if world >= expect["nodes"] else 1
    for node in nodes:
        assert sorted(r["local_rank"] for r in ranks if r["node"] == node) == list(range(per_node)), node


@pytest.mark.parametrize("entry", MANIFEST, ids=[e["id"] for e in MANIFEST])
def test_a_real_script_runs_unchanged(corpus_cluster: Cluster, outcomes: dict[str, Outcome],
                                      entry: dict[str, Any]) -> None:
    outcome = outcomes[entry["id"]]
    submit = outcome.submit
    assert not outcome.error, outcome.error + (f"\n{submit.stdout}\n{submit.stderr}" if submit else "")
    specs = entry.get("jobs") or [{"file": entry["file"], "expect": entry["expect"]}]
    assert len(outcome.jobs) == len(specs)
    for spec, tasks in zip(specs, outcome.jobs, strict=True):
        script = outcome.root / spec["file"]
        for job in tasks:
            check_job(corpus_cluster, outcome, job, spec["expect"], script.parent)
    if len(outcome.jobs) > 1:  # a dependency chain: each job after the one it waited for
        first_end = outcome.jobs[0][0]["end_time"]
        assert all(t["start_time"] >= first_end for tasks in outcome.jobs[1:] for t in tasks)
