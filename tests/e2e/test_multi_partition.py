"""sbatch -p a,b end to end: a job that names two partitions starts in the one with room, waits listed as
"a,b" (gqueue -p b finds it), and is refused with every partition's reason when none accepts it."""

from __future__ import annotations

import getpass

from .conftest import Cluster


def test_a_job_naming_two_partitions_starts_where_there_is_room(cluster: Cluster) -> None:
    cluster.run("gadmin", "partition", "add", "pa", "--nodes", "node1")
    cluster.run("gadmin", "partition", "add", "pb", "--nodes", "node2", "--max-time", "2:00:00")
    filler = cluster.submit("-p", "pa", "-G", "8", "--wrap", "sleep 300")
    try:
        cluster.wait_state(filler, {"RUNNING"})
        out = cluster.work / "two.out"
        two = cluster.submit("-p", "pa,pb", "-G", "1", "-o", str(out), "--wrap", "echo $SLURM_JOB_PARTITION")
        assert cluster.wait_done(two)["state"] == "COMPLETED"
        assert cluster.job(two)["partition"] == "pb"
        assert out.read_text() == "pb\n"

        blocker = cluster.submit("-p", "pb", "-G", "8", "-t", "10", "--wrap", "sleep 300")
        cluster.wait_state(blocker, {"RUNNING"})
        waiting = cluster.submit("-p", "pa,pb", "-G", "8", "-t", "10", "--wrap", "true")
        listed = cluster.run("gqueue", "-p", "pb", "-h", "-o", "%i %P %T").stdout.split("\n")
        assert f"{waiting} pa,pb PENDING" in listed, listed
        assert "Partition=pa,pb" in cluster.run("gjob", waiting).stdout

        refused = cluster.run("gsub", "-p", "nosuch,pb", "-t", "3:00:00", "--wrap", "true", check=False)
        assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1
        assert "nosuch: unknown partition" in refused.stderr and "pb: time limit 10800s exceeds" in refused.stderr

        cluster.run("gcancel", filler)  # pa frees: the waiting job starts there
        assert cluster.wait_done(waiting)["state"] == "COMPLETED"
        assert cluster.job(waiting)["partition"] == "pa"
        cluster.run("gcancel", blocker)
    finally:
        cluster.run("gcancel", "-u", getpass.getuser(), check=False)
