"""Slurm's variables, node names that resolve, and --signal=B:, on a real local cluster, with scripts written
as Slurm users write them: directives only, no Garrison option."""

from __future__ import annotations

import os
import pwd
import socket
import sys

import pytest

from .conftest import Cluster

pytestmark = pytest.mark.slow

SLURM_VARS = (
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
    "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_TASKS_PER_NODE", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS",
    "SLURM_SUBMIT_DIR", "SLURM_SUBMIT_HOST", "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT",
    "SLURM_CLUSTER_NAME", "SLURM_CPUS_ON_NODE",
)


def values(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_a_two_node_batch_script_runs_once_and_sees_slurms_variables(cluster: Cluster) -> None:
    resolve = f"{sys.executable} -c 'import os, socket; print(\"resolved=\" + \",\".join(socket.gethostbyname(n) for n in os.environ[\"GARRISON_NODELIST\"].split(\",\")))'"
    script = (
        "#!/bin/bash\n"
        "#SBATCH --job-name=slurm-env\n"
        "#SBATCH -N 2\n"
        "#SBATCH --gpus-per-node=4\n"
        "#SBATCH --time=00:05:00\n"
        "#SBATCH --output=env-%j.out\n"
        "echo run=once\n"
        + "".join(f'echo "{name}=${name}"\n' for name in SLURM_VARS)
        + 'echo "procid=${SLURM_PROCID-unset} torchelastic=${TORCHELASTIC_RUN_ID-unset}"\n'
        + 'echo "restarts=${SLURM_RESTART_COUNT-unset}"\n'
        + (resolve + "\n" if os.geteuid() == 0 else "")
    )
    (cluster.work / "env.sh").write_text(script)
    job_id = cluster.run("gsub", "--parsable", "env.sh").stdout.strip()
    job = cluster.wait_done(job_id)
    assert job["state"] == "COMPLETED", job
    out = (cluster.work / f"env-{job_id}.out").read_text()
    assert out.count("run=once") == 1, out
    env = values(out)
    nodes = job["nodes"]
    assert sorted(nodes) == ["node1", "node2"]
    assert env["SLURM_JOB_ID"] == env["SLURM_JOBID"] == job_id and env["SLURM_JOB_NAME"] == "slurm-env"
    assert env["SLURM_JOB_NODELIST"] == env["SLURM_NODELIST"] == "node[1-2]"
    assert env["SLURM_JOB_NUM_NODES"] == env["SLURM_NNODES"] == "2" and env["SLURM_TASKS_PER_NODE"] == "1(x2)"
    assert env["SLURM_GPUS_ON_NODE"] == "4" and len(env["SLURM_JOB_GPUS"].split(",")) == 4
    assert env["SLURM_SUBMIT_DIR"] == str(cluster.work) and env["SLURM_SUBMIT_HOST"] == os.uname().nodename
    assert (env["SLURM_JOB_PARTITION"], env["SLURM_JOB_ACCOUNT"]) == (job["partition"], job["account"])
    assert (env["restarts"], env["SLURM_CLUSTER_NAME"]) == ("unset", "garrison")  # set on reruns only, as slurmd does
    assert int(env["SLURM_CPUS_ON_NODE"]) >= 1
    assert "procid=0 torchelastic=unset" in out  # the batch step's task 0, as under slurmstepd; no torchrun agent
    if os.geteuid() == 0:
        # garrison up named the nodes in /etc/hosts: each its own loopback address.
        addresses = dict(zip(nodes, env["resolved"].split(","), strict=True))
        assert addresses == {name: f"127.0.1.{name.removeprefix('node')}" for name in nodes}
        assert socket.gethostbyname("node1") == "127.0.1.1"


def test_array_tasks_read_their_index_and_the_arrays_index_set(cluster: Cluster) -> None:
    script = (
        "#!/bin/bash\n"
        "#SBATCH --array=1-4%2\n"
        "#SBATCH --output=array-%A_%a.out\n"
        'echo "$SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID $SLURM_ARRAY_TASK_COUNT $SLURM_ARRAY_TASK_MIN '
        '$SLURM_ARRAY_TASK_MAX $SLURM_ARRAY_TASK_STEP"\n'
    )
    (cluster.work / "array.sh").write_text(script)
    array_id = cluster.run("gsub", "--parsable", "array.sh").stdout.strip()
    tasks = [cluster.wait_done(f"{array_id}_{i}") for i in range(1, 5)]
    assert all(t["state"] == "COMPLETED" for t in tasks), tasks
    for i in range(1, 5):
        line = (cluster.work / f"array-{array_id}_{i}.out").read_text().strip()
        assert line == f"{array_id} {i} 4 1 4 1"


def test_a_script_submitted_with_export_none_has_a_login_environment_and_srun_works(cluster: Cluster) -> None:
    """sbatch --export=NONE: none of the submitter's variables, but what a login gives (Slurm's implied
    --get-user-env): HOME, USER, a PATH, and srun inside finds the controller."""
    script = (
        "#!/bin/bash\n"
        "#SBATCH --export=NONE\n"
        "#SBATCH --output=export-none-%j.out\n"
        'echo "home=$HOME"; echo "user=$USER"; echo "mine=${SUBMITTERS_OWN:-unset}"\n'
        'srun bash -c \'echo "step_home=$HOME"\'\n'
    )
    (cluster.work / "export-none.sh").write_text(script)
    env = dict(cluster.env, SUBMITTERS_OWN="1")
    job_id = cluster.run("gsub", "--parsable", "export-none.sh", env=env).stdout.strip()
    assert cluster.wait_done(job_id)["state"] == "COMPLETED"
    me = pwd.getpwuid(os.getuid())
    seen = values((cluster.work / f"export-none-{job_id}.out").read_text())
    assert seen == {"home": me.pw_dir, "user": me.pw_name, "mine": "unset", "step_home": me.pw_dir}, seen


def test_exported_shell_functions_reach_the_job_and_its_steps(cluster: Cluster) -> None:
    """Lmod's `module` is a bash function its init exports (BASH_FUNC_module%%): sbatch carries it into the
    job, whose bash scripts and srun steps call it. gsub and gsrun are launched through a shell, which must
    not drop it (dash drops every variable whose name is no identifier; a job's `module load` failed)."""
    script = (
        "#!/bin/bash\n"
        "#SBATCH --output=functions-%j.out\n"
        "mymodule load cuda\n"
        "srun bash -c 'mymodule load in-a-step'\n"
        'echo "odd=$(printenv odd-name)"\n'
    )
    (cluster.work / "functions.sh").write_text(script)
    env = dict(cluster.env, **{"BASH_FUNC_mymodule%%": '() {  echo "module $*"\n}', "odd-name": "kept"})
    job_id = cluster.run("gsub", "--parsable", "functions.sh", env=env).stdout.strip()
    assert cluster.wait_done(job_id)["state"] == "COMPLETED"
    lines = (cluster.work / f"functions-{job_id}.out").read_text().splitlines()
    assert lines == ["module load cuda", "module load in-a-step", "odd=kept"], lines


def test_signal_b_reaches_the_batch_shell_and_not_its_children(cluster: Cluster) -> None:
    log = cluster.work / "batch-signal.log"
    script = (
        "#!/bin/bash\n"
        "#SBATCH --time=0:06\n"
        "#SBATCH --signal=B:USR1@3\n"
        "#SBATCH --output=/dev/null\n"
        f"trap 'echo shell got USR1 >> {log}' USR1\n"
        f"sh -c \"trap 'echo child got USR1 >> {log}' USR1; echo child ready >> {log}; "
        'while :; do sleep 0.05; done" &\n'
        "while :; do sleep 0.05; done\n"
    )
    (cluster.work / "bsignal.sh").write_text(script)
    job_id = cluster.run("gsub", "--parsable", "bsignal.sh").stdout.strip()
    job = cluster.wait_done(job_id, timeout=30)
    assert job["state"] == "TIMEOUT", job
    lines = log.read_text().splitlines()
    assert "child ready" in lines and "shell got USR1" in lines, lines
    assert "child got USR1" not in lines, lines


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may write /etc/hosts")
def test_garrison_up_names_its_nodes_in_etc_hosts_and_down_removes_them() -> None:
    from pathlib import Path

    from .conftest import start_cluster, stop_cluster

    hosts = Path("/etc/hosts")
    cluster = start_cluster(["pcie4"], ["--agents", "1"])
    marker = f"# BEGIN garrison local cluster {cluster.state_dir.resolve()}\n"
    try:
        text = hosts.read_text()
        # Live, or "#also" where another cluster up now (this module's) has the line live: node1 resolves once.
        assert marker + "127.0.1.1 node1\n" in text or marker + "#also 127.0.1.1 node1\n" in text, text
        assert text.splitlines().count("127.0.1.1 node1") == 1, text
    finally:
        stop_cluster(cluster)
    assert marker not in hosts.read_text()
