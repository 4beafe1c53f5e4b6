"""The libraries that drive Slurm, unchanged, on a real local cluster with Slurm's command names on the PATH.

PyTorch Lightning: ``SLURMEnvironment(auto_requeue=True)`` in a job submitted with ``sbatch`` and
``#SBATCH --signal=SIGUSR1@N``. Lightning itself gets SIGUSR1 before the time limit, saves ``hpc_ckpt_<n>.ckpt``
and calls ``scontrol requeue``; the job runs again (not FAILED with 138, not COMPLETED half trained), resumes
from the checkpoint with its global step, and completes.

submitit: ``AutoExecutor`` submits a function as a 2-node job through ``sbatch`` (its own script, which runs
``srun --unbuffered --output %j_%t_log.out ... python -m submitit.core._submit``), polls it with ``sacct``,
collects each rank's result, and cancels another job with ``scancel``, as it does on Slurm.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.polling import wait_until

from .conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow
pytest.importorskip("lightning")
pytest.importorskip("submitit")

TRAIN = Path(__file__).resolve().parents[1] / "data" / "lightning_requeue.py"
MAX_STEPS = 60  # lightning_requeue.py's default


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[Cluster]:
    """Two nodes of 4 GPUs; the cluster's environment has `garrison slurm-path` first on its PATH."""
    c = start_cluster(["pcie4", "pcie4"])
    try:
        slurm_dir = c.run("garrison", "slurm-path").stdout.strip()
        c.env["PATH"] = f"{slurm_dir}:{c.env['PATH']}"
        yield c
    finally:
        stop_cluster(c)


def slurm(c: Cluster, command: str, *args: str) -> str:
    """Run one of Slurm's commands by its name, as the libraries do (found on the cluster's PATH)."""
    slurm_dir = c.env["PATH"].split(":", 1)[0]
    return c.run(f"{slurm_dir}/{command}", *args).stdout


def test_lightning_requeues_itself_at_the_time_limit_and_resumes_its_global_step(slurm_cluster: Cluster) -> None:
    c = slurm_cluster
    root = c.work / "lightning"
    root.mkdir()
    # The first run takes a second a step, so it cannot reach MAX_STEPS before the warning at 45 s (time enough to
    # import torch and Lightning on a busy machine: a warning before Lightning's handler is installed would kill
    # the program); a resumed run goes at full speed, with 60 s before its own warning.
    (c.work / "lightning.sh").write_text(
        "#!/bin/bash\n"
        "#SBATCH --job-name=lightning\n"
        "#SBATCH --nodes=1\n"
        "#SBATCH --ntasks-per-node=1\n"
        "#SBATCH --time=1:45\n"
        "#SBATCH --signal=SIGUSR1@60\n"
        "#SBATCH --output=lightning-%j.out\n"
        f"srun {sys.executable} {TRAIN} {root}\n"
    )
    submitted = slurm(c, "sbatch", "lightning.sh")
    match = re.fullmatch(r"Submitted batch job (\d+)\n", submitted)
    assert match, submitted
    job_id = match.group(1)
    job = c.wait_done(job_id, timeout=240)
    log = (c.work / f"lightning-{job_id}.out").read_text()
    assert job["state"] == "COMPLETED" and job["restart_count"] >= 1, (job, log)

    # Lightning's own handler did it: it saved an hpc checkpoint and asked for the requeue, which worked.
    assert "Handling auto-requeue signal: 10" in log and f"requeing job {job_id}" in log, log
    assert "failed with error code" not in log, log
    assert (root / "hpc_ckpt_1.ckpt").exists()

    # gacct: every run but the last was requeued (by Lightning's scontrol requeue, never FAILED with 138),
    # the last COMPLETED; one attempt per run.
    (record,) = json.loads(c.run("gacct", "--json", "-j", job_id).stdout)["jobs"]
    attempts = record["attempts"]
    assert [a["state"] for a in attempts] == ["REQUEUED"] * (len(attempts) - 1) + ["COMPLETED"], attempts
    assert all(a["reason"] == "requeued by request" for a in attempts[:-1]), attempts
    started = {int(r): int(s) for r, s in re.findall(r"^run (\d+) started at global_step (\d+)$", log, re.M)}
    saved = {int(r): int(s) for r, s in re.findall(r"^run (\d+) saved global_step (\d+)$", log, re.M)}
    finished = {int(r): int(s) for r, s in re.findall(r"^run (\d+) finished at global_step (\d+)$", log, re.M)}
    assert sorted(started) == list(range(len(attempts))), log
    assert finished == {len(attempts) - 1: MAX_STEPS}, log

    # Each run started where the one before stopped: the global step its checkpoint holds.
    assert started[0] == 0, log
    for run in range(1, len(attempts)):
        assert started[run] == saved[run - 1] > started[run - 1], log

    # sacct, as Slurm users read it: the job COMPLETED; with -D, each earlier run REQUEUED.
    lines = slurm(c, "sacct", "-j", job_id, "-o", "JobID,State", "--parsable2").splitlines()
    assert f"{job_id}|COMPLETED" in lines, lines
    runs = slurm(c, "sacct", "-j", job_id, "-D", "-X", "-n", "-P", "-o", "JobID,State").splitlines()
    assert runs == [f"{job_id}|REQUEUED"] * (len(attempts) - 1) + [f"{job_id}|COMPLETED"], runs


LIGHTNING_ENV = (
    "import os; from lightning.fabric.plugins.environments import SLURMEnvironment as S; e = S(); "
    "print(S.detect(), e.global_rank(), e.local_rank(), e.node_rank(), e.world_size(), os.environ['SLURM_NODELIST'], "
    "e.main_address == os.environ['MASTER_ADDR'])"
)


def test_lightnings_slurm_environment_reads_a_batch_script_and_an_srun_outside_a_job(slurm_cluster: Cluster) -> None:
    """Lightning picks SLURMEnvironment wherever SLURM_NTASKS is set: in a batch script run without srun
    (#SBATCH --ntasks=1, the common single-GPU script) it reads SLURM_PROCID, and the tasks of an srun outside
    a job have the job's variables (SLURM_NODELIST, which Lightning reads where MASTER_ADDR is not set), as
    under Slurm."""
    c = slurm_cluster
    out = c.work / "lightning-env.out"
    job_id = slurm(c, "sbatch", "--parsable", "--ntasks=1", "--gres=gpu:1", "-o", str(out),
                   "--wrap", f"{sys.executable} -c \"{LIGHTNING_ENV}\"").strip()
    assert c.wait_done(job_id, timeout=120)["state"] == "COMPLETED", out.read_text()
    assert out.read_text().split()[-7:] == ["True", "0", "0", "0", "1", "node1", "True"], out.read_text()
    outside = {k: v for k, v in c.env.items() if not k.startswith(("SLURM_", "GARRISON_JOB"))}
    tasks = c.run(c.env["PATH"].split(":", 1)[0] + "/srun", "-N", "2", "--ntasks-per-node=1", "--gpus-per-node=1",
                  sys.executable, "-c", LIGHTNING_ENV, env=outside).stdout.splitlines()
    assert sorted(tasks) == ["True 0 0 0 2 node[1-2] True", "True 1 0 1 2 node[1-2] True"], tasks


def _where(value: int) -> tuple[int, str, str, str, str]:
    """The submitted function (pickled by value: it is this module's, which the job cannot import)."""
    import os

    return (value * 2, os.environ["SLURM_PROCID"], os.environ["SLURM_NTASKS"], os.environ["SLURM_JOB_NODELIST"],
            os.environ["SLURMD_NODENAME"])


def test_submitit_runs_a_function_on_two_nodes_and_cancels_another_job(
    slurm_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cloudpickle
    import submitit

    c = slurm_cluster
    # submitit runs sbatch, sacct and scancel from this process, by Slurm's names.
    for name in ("PATH", "GARRISON_CONTROLLER", "XDG_CACHE_HOME"):
        monkeypatch.setenv(name, c.env[name])
    monkeypatch.chdir(c.work)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        _run_submitit(c, submitit)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _run_submitit(c: Cluster, submitit: Any) -> None:
    folder = c.work / "submitit"
    executor = submitit.AutoExecutor(folder=folder)
    assert executor.cluster == "slurm"  # it found srun on the PATH
    executor.update_parameters(name="ranks", slurm_nodes=2, slurm_tasks_per_node=1, slurm_gpus_per_node=1,
                               timeout_min=3)
    job = executor.submit(_where, 21)
    wait_until(job.done, 120, what=f"submitit to see job {job.job_id} done")
    results = job.results()
    assert [r[:3] for r in results] == [(42, "0", "2"), (42, "1", "2")], results
    assert job.task(0).result() == results[0]
    assert {r[4] for r in results} == {"node1", "node2"} and {r[3] for r in results} == {"node[1-2]"}, results
    # The results are there before the job has ended; sacct then says COMPLETED, as submitit reads it.
    wait_until(lambda: job.get_info(mode="force").get("State") == "COMPLETED", 60,
               what=f"sacct to show job {job.job_id} COMPLETED")
    # srun --output %j_%t_log.out: a log of each task's own (submitit reads them with job.stdout(task)).
    assert all((folder / f"{job.job_id}_{task}_log.out").exists() for task in (0, 1))

    executor.update_parameters(name="cancelled")
    import time

    doomed = executor.submit(time.sleep, 600)
    wait_until(lambda: doomed.get_info(mode="force").get("State") == "RUNNING", 60,
               what=f"job {doomed.job_id} to run")
    doomed.cancel()
    wait_until(lambda: doomed.done(force_check=True), 60, what=f"submitit to see job {doomed.job_id} cancelled")
    assert doomed.state.startswith("CANCELLED"), doomed.state  # sacct's "CANCELLED by UID", as Slurm's
    assert c.job(doomed.job_id)["state"] == "CANCELLED"
