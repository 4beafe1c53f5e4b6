"""Issue 21 end to end, through the CLI on a real local cluster (a DGX A100 and a DGX-1V): ``gsub -x``
naming every node is refused in one line with the reason, the queue unchanged; a job behind a look-alike
that can never run is not held back; ``gqueue --explain JOBID`` and ``gjob`` say why a job waits."""

from __future__ import annotations

from helpers.polling import wait_until

from .conftest import Cluster


def node_names(cluster: Cluster) -> list[str]:
    """garrison up names its nodes node1, node2... (the first column of ginfo -N's rows)."""
    rows = cluster.run("ginfo").stdout.splitlines()[1:]
    return sorted({word for row in rows for word in row.split() if word.startswith("node")})


def test_gsub_x_every_node_is_refused_with_the_reason(cluster: Cluster) -> None:
    names = node_names(cluster)
    before = cluster.jobs()
    proc = cluster.run("gsub", "-G", "1", "-x", ",".join(names), "--wrap", "true", check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "can ever run 1 GPUs" in proc.stderr and "excluded by -x/--exclude" in proc.stderr, proc.stderr
    test_only = cluster.run("gsub", "--test-only", "-G", "1", "-x", ",".join(names), "--wrap", "true", check=False)
    assert test_only.returncode == 2 and "excluded by -x/--exclude" in test_only.stderr
    assert cluster.jobs() == before


def test_gqueue_explain_and_gjob_say_why_a_job_waits(cluster: Cluster) -> None:
    big = cluster.submit("-N", "1", "--gpus-per-node", "8", "-C", "a100", "-t", "0:40", "--wrap", "sleep 60")
    cluster.wait_state(big, {"RUNNING"})
    waiting = cluster.submit("-N", "1", "--gpus-per-node", "8", "-C", "a100", "-t", "0:30", "--wrap", "true")
    explained = wait_until(
        lambda: (lambda p: p.stdout if p.returncode == 0 and "busy" in p.stdout else None)(
            cluster.run("gqueue", "--explain", waiting, check=False)),
        30, what="an explanation of the waiting job")
    assert explained.startswith(f"{waiting} ("), explained
    assert "8 GPUs on one node: 1 node(s) could hold it, all busy until ~" in explained, explained
    shown = cluster.run("gjob", waiting).stdout
    assert "Why=8 GPUs on one node: 1 node(s) could hold it, all busy" in shown, shown
    not_pending = cluster.run("gqueue", "--explain", big, check=False)
    assert not_pending.returncode == 1 and "is not pending" in not_pending.stderr
    cluster.run("gcancel", big, waiting)
