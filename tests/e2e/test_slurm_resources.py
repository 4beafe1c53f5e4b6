"""sbatch's resource options on a real local cluster (issue 15), from scripts written the way Slurm users
write them: directives only, no Garrison option."""

from __future__ import annotations

import json
import os

import pytest
from helpers.polling import wait_until

from .conftest import Cluster

pytestmark = pytest.mark.slow


def _allocation(cluster: Cluster, job_id: str) -> list[dict[str, object]]:
    records = json.loads(cluster.run("gacct", "--json", "-j", job_id).stdout)["jobs"]
    return list(records[0]["attempts"][-1]["allocation"])


def test_ntasks_per_node_gres_and_cpus_per_task_give_4_gpus_on_each_of_2_nodes(cluster: Cluster) -> None:
    script = (
        "#!/bin/bash\n"
        "#SBATCH --job-name=ddp\n"
        "#SBATCH --nodes=2\n"
        "#SBATCH --ntasks-per-node=4\n"
        "#SBATCH --gres=gpu:4\n"
        "#SBATCH --cpus-per-task=1\n"
        "#SBATCH --mem=16GB\n"
        "#SBATCH --output=ddp-%j.out\n"
        'echo "batch on $GARRISON_NODENAME"\n'
    )
    cpus = os.cpu_count() or 1  # the fake nodes have the test host's CPUs
    if cpus < 4:
        # As in Slurm: 4 tasks x 1 CPU cannot fit a node with fewer CPUs; refused at once, not left pending.
        proc = cluster.run("gsub", input=script, check=False)
        assert proc.returncode == 2 and "--cpus-per-task: 4 CPUs per node exceed" in proc.stderr, proc.stderr
        script = script.replace("#SBATCH --cpus-per-task=1\n", "")
    (cluster.work / "train.sh").write_text(script)
    job_id = cluster.submit("train.sh")
    job = cluster.wait_done(job_id)
    assert job["state"] == "COMPLETED", job
    allocation = _allocation(cluster, job_id)
    assert len(allocation) == 2
    for node in allocation:
        assert len(node["gpus"]) == 4 and node["mem_mb"] == 16 * 1024, node
        assert len(node.get("cpus", ())) == (4 if cpus >= 4 else 0), node
    assert (cluster.work / f"ddp-{job_id}.out").read_text().count("batch on") == 1  # the script ran once


def test_bad_resource_requests_are_one_line_errors_and_submit_nothing(cluster: Cluster) -> None:
    before = {j["job_id"] for j in cluster.jobs()}
    for directives, problem in (
        ("#SBATCH --gres=gpu:x:y\n", "invalid --gres 'gpu:x:y'"),
        ("#SBATCH --gres=nvme:1\n", "unknown generic resource 'nvme'"),
        ("#SBATCH -N 2\n#SBATCH -n 16\n#SBATCH --ntasks-per-node=4\n", "--ntasks 16 cannot fit"),
        ("#SBATCH --mem=64T\n", "--mem: 67108864 MB per node exceeds the largest node"),
        ("#SBATCH --gpus-per-node=4\n#SBATCH --mem-per-gpu=8T\n", "--mem-per-gpu"),
    ):
        proc = cluster.run("gsub", input=f"#!/bin/bash\n{directives}hostname\n", check=False)
        assert proc.returncode == 2 and problem in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
    assert {j["job_id"] for j in cluster.jobs()} == before


@pytest.mark.parametrize(("mode", "expected"), [("", ["run 0", "run 1"]), ("#SBATCH --open-mode=truncate\n", ["run 1"])])
def test_a_requeued_job_appends_to_its_first_attempts_output(cluster: Cluster, mode: str, expected: list[str]) -> None:
    marker = cluster.work / f"first{len(mode)}.done"
    (cluster.work / "requeue.sh").write_text(
        "#!/bin/bash\n"
        "#SBATCH --gres=gpu:1\n"
        "#SBATCH --output=requeue-%j.out\n"
        f"{mode}"
        'echo "run $GARRISON_RESTART_COUNT"\n'
        f"if [ ! -e {marker} ]; then touch {marker}; exec sleep 300; fi\n"
    )
    job_id = cluster.submit("requeue.sh")
    log = cluster.work / f"requeue-{job_id}.out"
    wait_until(marker.exists, 60, what="the first attempt to start")
    cluster.run("gcontrol", "requeue", job_id)
    job = cluster.wait_done(job_id, timeout=90)
    assert job["state"] == "COMPLETED", job
    assert log.read_text().splitlines() == expected


def test_concurrent_cpu_steps_run_on_a_node_with_more_cpus_than_its_host() -> None:
    # A Duke example script (docs/slurm.md, corpus pass): `-n 4 -c 2`, then four `srun --exclusive -n 1 -c 2 ... &`
    # and wait. On `garrison up --fake-cpus 32` over a smaller host the later steps were bound to CPUs the host
    # lacks and failed with exit code 127; the supervisor now keeps a rank to CPUs that exist.
    from .conftest import start_cluster, stop_cluster

    cluster = start_cluster(["pcie4"], ["--fake-cpus", "32"])
    try:
        script = cluster.work / "steps.sh"
        script.write_text(
            "#!/bin/bash\n#SBATCH -N 1 -n 4 -c 2\n"
            "for i in 1 2 3 4; do gsrun -Q -n 1 -c 2 bash -c \"sleep 1; echo hello $i\" & done\nwait\n")
        job = cluster.submit("-o", str(cluster.work / "steps-%j.out"), str(script))
        assert cluster.wait_done(job, timeout=120)["state"] == "COMPLETED"
        out = (cluster.work / f"steps-{job}.out").read_text()
        assert sorted(out.split("\n")[:-1]) == [f"hello {i}" for i in range(1, 5)], out
    finally:
        stop_cluster(cluster)
