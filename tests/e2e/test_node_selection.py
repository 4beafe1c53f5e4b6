"""Node selection as Slurm scripts ask for it, on a real local cluster (node1: DGX A100 with the features
a100,nvswitch; node2: DGX-1V with v100,nvlink, as `garrison up` configures them): #SBATCH -C, -w and
--exclusive, and their one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.polling import wait_until

from .conftest import Cluster

pytestmark = pytest.mark.slow


def _script(*directives: str, body: str) -> str:
    return "#!/bin/bash\n" + "".join(f"#SBATCH {d}\n" for d in directives) + body + "\n"


def _submit_script(cluster: Cluster, script: str) -> str:
    proc = cluster.run("gsub", "--parsable", input=script)
    assert proc.stderr == "", proc.stderr
    return proc.stdout.strip()


def _node_columns(cluster: Cluster) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in cluster.run("ginfo").stdout.splitlines()[1:]}


def test_ginfo_shows_each_nodes_features(cluster: Cluster) -> None:
    header, *rows = cluster.run("ginfo").stdout.splitlines()
    assert "FEATURES" in header.split()
    lines = {row.split()[0]: row.split() for row in rows}  # the MODEL column has spaces: look for the value
    assert "a100,nvswitch" in lines["node1"] and "v100,nvlink" in lines["node2"], rows


def test_constraint_selects_nodes_by_feature(cluster: Cluster) -> None:
    for expression, expected in (("v100", "node2"), ("a100&nvswitch", "node1"), ("a100&nvlink|v100", "node2")):
        job = _submit_script(cluster, _script(
            f"--constraint={expression}", "--gpus=1", "--time=5",
            f"--output=feature-{expected}-%j.out", body="echo $GARRISON_NODENAME"))
        assert cluster.wait_done(job)["state"] == "COMPLETED"
        assert (cluster.work / f"feature-{expected}-{job}.out").read_text() == f"{expected}\n", expression
        assert f"Features={expression}" in cluster.run("gjob", job).stdout


def test_nodelist_runs_the_job_on_the_named_node(cluster: Cluster) -> None:
    job = _submit_script(cluster, _script("-w node2", "--time=5", "--output=nodelist-%j.out",
                                          body="echo $GARRISON_NODENAME"))
    assert cluster.wait_done(job)["state"] == "COMPLETED"
    assert (cluster.work / f"nodelist-{job}.out").read_text() == "node2\n"
    assert "ReqNodeList=node2" in cluster.run("gjob", job).stdout


def test_an_exclusive_job_holds_the_whole_node(cluster: Cluster, tmp_path: Path) -> None:
    release = tmp_path / "release"
    job = _submit_script(cluster, _script(
        "--exclusive", "--gpus=1", "-w node1", "--time=5", "--output=/dev/null",
        body=f"while [ ! -e {release} ]; do sleep 0.1; done"))
    cluster.wait_state(job, {"RUNNING"})
    detail = cluster.run("gjob", job).stdout
    assert "GPUs=8 " in detail and "Exclusive=yes" in detail, detail
    node1 = wait_until(lambda: (cols := _node_columns(cluster)["node1"])[1] == "ALLOCATED" and cols, 30,
                       what="ginfo to show node1 fully allocated")
    assert node1[2] == "8/8" and node1[3].split("/")[0] == node1[3].split("/")[1], node1
    # Nothing joins it, not even a job that asks for no GPU: it waits until the exclusive job ends.
    other = cluster.submit("-w", "node1", "-t", "5", "-o", "/dev/null", "--wrap", "true")
    pending = cluster.wait_state(other, {"PENDING"})
    assert pending["state"] == "PENDING"
    release.touch()
    assert cluster.wait_done(job)["state"] == "COMPLETED"
    assert cluster.wait_done(other)["state"] == "COMPLETED"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("-C", "nosuch"), "gsub: error: --constraint: invalid feature specification: no node in partition "
                           "'main' has feature 'nosuch'"),
        (("-C", "a100&v100"), "gsub: error: --constraint: no node in partition 'main' has features 'a100&v100'"),
        (("-C", "a100&&ib"), "invalid --constraint 'a100&&ib'"),
        (("-w", "nosuch"), "gsub: error: --nodelist: no such node 'nosuch'"),
        (("-w", "node[1-2]", "-N", "1"), "gsub: error: --nodelist names 2 nodes but --nodes asks for 1"),
        (("--exclusive=bogus",), "--exclusive"),
    ],
)
def test_bad_node_selection_is_a_one_line_error_and_submits_nothing(
    cluster: Cluster, args: tuple[str, ...], message: str
) -> None:
    before = {j["job_id"] for j in cluster.jobs()}
    proc = cluster.run("gsub", *args, "--wrap", "true", check=False)
    assert proc.returncode == 2, proc
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert {j["job_id"] for j in cluster.jobs()} == before


def test_mem_0_and_exclusive_give_a_job_whole_nodes(cluster: Cluster) -> None:
    out = cluster.work / "whole-%j.out"
    job = _submit_script(cluster, _script(
        "--exclusive", "--mem=0", "-N 1", "-w node2", "--time=5", f"--output={out}",
        body='echo "$SLURM_MEM_PER_NODE $SLURM_GPUS_ON_NODE $SLURM_JOB_GPUS"'))
    assert cluster.wait_done(job)["state"] == "COMPLETED"
    mem, gpus, ids = (cluster.work / f"whole-{job}.out").read_text().split()
    assert (gpus, ids) == ("8", "0,1,2,3,4,5,6,7")
    total = _node_columns(cluster)["node2"][4].split("/")[1]  # MEM(A/T): what the node has, rounded ("24G")
    total_mb = float(total[:-1]) * {"M": 1, "G": 1024, "T": 1024 * 1024}[total[-1]]
    assert abs(int(mem) - total_mb) < 1024, (mem, total)  # all of the node's memory, not a share of it
