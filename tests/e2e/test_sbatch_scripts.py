"""Slurm batch scripts as Slurm users write them, on a real local cluster: #SBATCH directives, a script on
standard input, the script run once, options Garrison does not act on, and gsub --wait."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from helpers.polling import wait_until

from .conftest import BIN, Cluster

pytestmark = pytest.mark.slow


def test_an_sbatch_script_on_standard_input_runs_once_with_its_directives(cluster: Cluster) -> None:
    script = (
        "#!/bin/bash\n"
        "#SBATCH --job-name=from-stdin\n"
        "#SBATCH -N 2\n"
        "#SBATCH --gpus-per-node=2\n"
        "#SBATCH --time=00:05:00\n"
        "#SBATCH --mail-type=END\n"
        "#SBATCH --output=stdin-%j.out\n"
        'echo "once on $GARRISON_NODENAME of $GARRISON_NODELIST"\n'
    )
    proc = cluster.run("gsub", input=script)
    assert proc.stdout.startswith("Submitted batch job "), proc.stdout
    assert proc.stderr == "gsub: warning: ignoring --mail-type: Garrison does not act on it\n"
    job_id = proc.stdout.split()[-1]
    job = cluster.wait_done(job_id)
    assert job["state"] == "COMPLETED" and job["name"] == "from-stdin" and job["time_limit_s"] == 300, job
    assert len(job["nodes"]) == 2
    lines = (cluster.work / f"stdin-{job_id}.out").read_text().splitlines()
    assert lines == [f"once on {job['nodes'][0]} of {','.join(job['nodes'])}"]  # once, on the first node


def test_bad_scripts_are_refused_in_one_line_and_submit_nothing(cluster: Cluster) -> None:
    before = {j["job_id"] for j in cluster.jobs()}
    for script, problem in (
        ("#!/bin/bash\r\n#SBATCH -N 1\r\nhostname\r\n", "DOS line breaks"),
        ("#!/bin/bash\n#SBATCH --frobnicate\nhostname\n", "--frobnicate"),
        ("#!/bin/bash\n#SBATCH --time=" + "7" * 3000 + "q\nhostname\n", "--time"),
    ):
        proc = cluster.run("gsub", input=script, check=False)
        assert proc.returncode == 2 and problem in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and len(proc.stderr) < 300, proc.stderr
    assert {j["job_id"] for j in cluster.jobs()} == before


def test_gsub_wait_exits_with_the_job_exit_code_through_a_controller_restart(cluster: Cluster) -> None:
    marker = cluster.work / "wait-started"
    waiter = subprocess.Popen(
        [str(BIN / "gsub"), "--wait", "--parsable", "-G", "1", "-o", "/dev/null", "--wrap",
         f"touch {marker}; while [ ! -e {marker}.go ]; do sleep 0.05; done; exit 3"],
        env=cluster.env, cwd=cluster.work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert waiter.stdout is not None
    job_id = waiter.stdout.readline().strip()
    wait_until(marker.exists, 60, what="the job to start")
    os.kill(cluster.pid("controller"), signal.SIGKILL)
    cluster.up()  # the same controller, at the same address, from its database
    (cluster.work / "wait-started.go").touch()
    assert waiter.wait(timeout=90) == 3, waiter.stderr.read() if waiter.stderr else ""
    assert cluster.job(job_id)["state"] == "FAILED"
    done = cluster.run("gsub", "--wait", "-G", "1", "-o", "/dev/null", "--wrap", "true")
    assert done.returncode == 0 and done.stdout.startswith("Submitted batch job ")
