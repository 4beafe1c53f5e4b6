"""gqueue's and gjob's fast paths (cli/fastpath.py) against their full paths, on a real controller.

The launchers (bin/gqueue, bin/gjob) print exactly what `python -m garrison.cli.gqueue` / `gjob` print for
the same command line, whether they take the fast path (the options it reads, output into a pipe) or hand
over to the full one (anything else); and on the fast path they import nothing heavy. The controller folds
an array's pending tasks into one row (ListJobs' fold_pending_arrays), as gqueue used to fold them itself.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from security_helpers import running_controller

from garrison.cli.client import Client
from garrison.protos.v1 import garrison_pb2 as pb


@pytest.fixture(scope="module")
def queue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, Path, int]]:
    """A controller without agents: everything submitted stays pending. An array of 40 tasks, two jobs."""
    root = tmp_path_factory.mktemp("fastqueries")
    with running_controller(root, extra="request_rate_per_s = 0\n", local_socket=True) as controller:
        cache = root / "cache"
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("XDG_CACHE_HOME", str(cache))
            with Client(controller.address) as client:  # fills the endpoint cache, as a first call does
                spec = {"name": "sweep", "command": ["true"], "gpus": 1, "workdir": str(root)}
                array = client.call_plain("SubmitJob", {"spec": spec, "array_indices": list(range(40)),
                                                        "array_max_running": 4})
                for name in ("alpha", "beta"):
                    client.call_plain("SubmitJob", {"spec": {**spec, "name": name}})
        yield controller, cache, int(array.job_id)


def run(queue: tuple[object, Path, int], argv: list[str]) -> tuple[int, str, str, str]:
    controller, cache, _ = queue
    env = {"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(cache), "USER": "root",
           "GARRISON_CONTROLLER": controller.address, "PYTHONPROFILEIMPORTTIME": "1"}  # type: ignore[attr-defined]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    lines = proc.stderr.splitlines()
    imported = " ".join(line.split("|")[-1].strip() for line in lines if line.startswith("import time:"))
    stderr = "\n".join(line for line in lines if not line.startswith("import time:"))
    return proc.returncode, proc.stdout, stderr, imported


def launcher(name: str) -> str:
    return str(Path(sys.executable).parent / name)


GQUEUE_ARGS = [
    [], ["-h"], ["-r"], ["--noheader", "--array"], ["-u", "root"], ["--user=root,nobody"], ["--me"],
    ["-t", "PD"], ["--states=all"], ["-p", "main"], ["-A", "nosuch"], ["-n", "alpha,beta"], ["-j", "{array}_3"],
    ["--jobs", "{array}"],
    # the full path's: its options, its errors
    ["-o", "%i %j"], ["--json"], ["--start"], ["--part=main"], ["-hr"], ["-j"], ["--bogus"], ["-u", "-r"],
]


@pytest.mark.parametrize("args", GQUEUE_ARGS, ids=lambda args: " ".join(args) or "(none)")
def test_gqueue_prints_what_its_full_path_prints(queue, args: list[str]) -> None:  # type: ignore[no-untyped-def]
    args = [arg.replace("{array}", str(queue[2])) for arg in args]
    fast = run(queue, [launcher("gqueue"), *args])
    full = run(queue, [sys.executable, "-m", "garrison.cli.gqueue", *args])
    assert fast[:3] == full[:3]


def test_gqueue_folds_on_the_controller_and_imports_nothing_heavy(queue) -> None:  # type: ignore[no-untyped-def]
    status, out, err, imported = run(queue, [launcher("gqueue"), "-h"])
    assert status == 0, err
    rows = out.splitlines()
    assert len(rows) == 3 and rows[0].split()[0] == f"{queue[2]}_[0-39%4]"
    assert len(run(queue, [launcher("gqueue"), "-h", "-r"])[1].splitlines()) == 42
    assert "garrison.cli.fastpath" in imported
    for heavy in ("site", "re", "enum", "argparse", "garrison.cli.client", "google.protobuf", "grpc", "json", "os",
                  "_collections_abc"):
        assert f" {heavy} " not in f" {imported} ", heavy


@pytest.mark.parametrize("job", ["{array}_5", "{array}", "{first}", "999999", "--help", "x_y"])
def test_gjob_prints_what_its_full_path_prints(queue, job: str) -> None:  # type: ignore[no-untyped-def]
    job = job.replace("{array}", str(queue[2])).replace("{first}", str(queue[2] + 40))
    fast = run(queue, [launcher("gjob"), job])
    full = run(queue, [sys.executable, "-m", "garrison.cli.gjob", job])
    assert fast[:3] == full[:3]


def test_gjob_on_the_fast_path_imports_nothing_heavy(queue) -> None:  # type: ignore[no-untyped-def]
    status, out, err, imported = run(queue, [launcher("gjob"), f"{queue[2]}_5"])
    assert status == 0 and "JobState=PENDING" in out and "   Why=" in out, err
    assert "garrison.cli.fastpath" in imported
    for heavy in ("site", "re", "enum", "click", "garrison.cli.client", "google.protobuf", "grpc"):
        assert f" {heavy} " not in f" {imported} ", heavy


def test_listjobs_folds_only_pending_tasks_that_wait_alike(queue) -> None:  # type: ignore[no-untyped-def]
    controller, cache, array = queue
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(cache))
        with Client(controller.address) as client:
            folded = client.call("ListJobs", pb.ListJobsRequest(fold_pending_arrays=True))
            every = client.call("ListJobs", pb.ListJobsRequest())
    assert [job.folded_tasks for job in folded.jobs] == [40, 0, 0]
    assert folded.jobs[0].display_id == f"{array}_[0-39%4]" and folded.jobs[0].array_task_id == 0
    assert len(every.jobs) == 42 and all(job.folded_tasks == 0 for job in every.jobs)


def test_scontrol_show_job_prints_full_records_without_grpc(queue) -> None:  # type: ignore[no-untyped-def]
    """scontrol show job on the controller's host asks GetJob in plain form on the local socket: neither gRPC
    nor protobuf (nor json, re or socket) is imported; without an id every job's full record is printed,
    its specification's fields included (ListJobs' rows carry none: WorkDir= used to be empty)."""
    _, _, array_id = queue
    status, out, err, imported = run(queue, [launcher("garrison-scontrol"), "show", "job"])
    assert status == 0, err
    records = [record for record in out.split("\n\n") if record.strip()]
    assert len(records) == 42
    workdir = str(queue[1].parent)
    assert all(f"WorkDir={workdir}\n" in record for record in records), records[0]
    status, out, err, imported = run(queue, [launcher("garrison-scontrol"), "show", "job", f"{array_id}_3"])
    assert status == 0, err
    assert f"ArrayJobId={array_id} ArrayTaskId=3" in out and f"StdOut={workdir}/garrison-{array_id}_3.out" in out
    for heavy in ("grpc", "google.protobuf", "json", "re", "socket", "dataclasses", "argparse"):
        assert f" {heavy} " not in f" {imported} ", heavy


def test_sacct_reads_job_records_on_the_local_socket_without_grpc(queue) -> None:  # type: ignore[no-untyped-def]
    """sacct asks ListJobRecords (the Accounting service's) in plain form on the controller's local socket,
    which serves it as gRPC does: the same records, and neither gRPC nor protobuf imported."""
    controller, _, array_id = queue
    argv = [launcher("garrison-sacct"), "-j", f"{array_id}_3", "--parsable2", "-o", "JobID,JobName,State"]
    status, out, err, imported = run(queue, argv)
    assert status == 0, err
    assert out.splitlines() == ["JobID|JobName|State", f"{array_id}_3|sweep|PENDING"]
    for heavy in ("grpc", "google.protobuf"):
        assert f" {heavy} " not in f" {imported} ", heavy
    env_grpc = subprocess.run(argv, env={"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(queue[1]), "USER": "root",
                                         "GARRISON_CONTROLLER": controller.address, "GARRISON_TRANSPORT": "grpc"},
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert env_grpc.returncode == 0 and env_grpc.stdout == out, env_grpc.stderr


def test_gcancel_reads_slurms_state_codes(tmp_path: Path) -> None:
    """gcancel -t takes Slurm's codes (PD, R) as scancel -t does, and the long names; an unknown state is a
    one-line usage error and cancels nothing."""
    with running_controller(tmp_path / "ctl", extra="request_rate_per_s = 0\n", local_socket=True) as controller:
        env = {"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(tmp_path / "cache"),
               "GARRISON_CONTROLLER": controller.address}

        def gcli(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([launcher(argv[0]), *argv[1:]], env=env, capture_output=True, text=True, timeout=60,
                                  stdin=subprocess.DEVNULL, cwd=tmp_path)

        for name in ("alpha", "beta"):
            assert gcli("gsub", "-J", name, "--wrap", "true").returncode == 0
        bad = gcli("gcancel", "-t", "bogus")
        assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1 and "BOGUS" in bad.stderr
        assert gcli("gcancel", "-n", "alpha", "-t", "PD").returncode == 0
        left = gcli("gqueue", "-h", "-t", "PD")
        assert [row.split()[2] for row in left.stdout.splitlines()] == ["beta"]
