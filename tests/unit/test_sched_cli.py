"""gadmin's and gqueue's scheduling views as text, and the CLI's refusals of bad arguments (which need no
controller: they exit 2 before any call)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from garrison.cli.gadmin_policy import account_rows, limits_text, partition_rows, qos_rows, usage_rows
from garrison.cli.queue_views import details_json, priority_rows, start_rows
from garrison.controller.admin import PendingLine
from garrison.controller.rpc import convert_admin
from garrison.controller.sched.priority import PriorityFactors, PriorityWeights
from garrison.model.accounts import Account, Accounting, Limits, PartitionDef, Qos
from garrison.model.domain import Job, JobSpec
from garrison.protos.v1 import admin_pb2 as adminpb

BIN = Path(sys.executable).parent


def policy() -> adminpb.PolicyInfo:
    accounting = Accounting(
        accounts=(Account("default"), Account("org", shares=2), Account("team", "org", allowed_qos=("high",))),
        qos=(Qos("normal", 10), Qos("high", 20, ("normal",), max_gpus_per_user=4, max_time_s=7200, grace_s=90)),
        partitions=(PartitionDef("main", default=True), PartitionDef("debug", ("n1", "n2"), 600, 1800, priority=5)),
        account_limits=(("team", Limits(max_gpus=8, max_gpu_hours=12.5)),),
        default_qos="normal",
    )
    return convert_admin.policy_to_pb(accounting)


def test_account_tree_and_tables() -> None:
    assert account_rows(policy()) == [
        ("default", "1", "-", "-", ""),
        ("org", "2", "-", "-", ""),
        ("  team", "1", "high", "gpus=8 gpu_hours=12.5", ""),
    ]
    assert qos_rows(policy()) == [
        ("normal (default)", "10", "-", "-", "-", "-", "1:00"),
        ("high", "20", "normal", "4", "-", "2:00:00", "1:30"),
    ]
    assert partition_rows(policy())[1] == ("debug", "n1,n2", "10:00", "30:00", "ALL", "ALL", "5")
    assert partition_rows(policy())[0][0] == "main*"
    assert limits_text(adminpb.LimitsInfo()) == "-"


def test_usage_rows_are_gpu_hours() -> None:
    response = adminpb.FairShareResponse(entries=[adminpb.FairShareEntry(
        account="team", user="ann", decayed_gpu_s=7200, period_gpu_s=3600, total_gpu_s=36000,
        normalised_shares=0.25, fair_share=0.5)])
    assert usage_rows(response) == [("team", "ann", "0.2500", "2.00", "1.00", "10.00", "0.5000")]


def test_queue_views_show_positions_estimates_and_weighted_factors() -> None:
    job = Job(job_id=7, spec=JobSpec(name="train", command=("x",), gpus=8), user="ann", uid=1, gid=1,
              account="team", partition="main", time_limit_s=60, submit_time=0.0, reason="Resources")
    factors = PriorityFactors(age=0.5, fair_share=0.25, qos=1.0, job_size=0.1, partition=0.0, admin=3, total=0,
                              time_limit=0.25, nice=-7)
    detail = convert_admin.pending_detail_to_pb(PendingLine(job, 2, 1000.0, 4103, factors), now=10.0)
    unknown = convert_admin.pending_detail_to_pb(PendingLine(job, 0, None, None, None), now=10.0)
    response = adminpb.QueueDetailsResponse(
        jobs=[detail, unknown], now=10.0,
        weights=convert_admin.priority_weights_to_pb(PriorityWeights(age=1000, fair_share=10000, qos=2000,
                                                                job_size=1000, partition=1000, time_limit=4000)))
    rows = start_rows(response)
    assert rows[0][5] == "2" and rows[0][6] != "N/A" and rows[0][7] == "(Resources)"
    assert rows[1][5:7] == ("-", "N/A")
    assert priority_rows(response)[0] == ("7", "ann", "team", "4103", "500", "2500", "2000", "100", "0", "1000", "3", "-7")
    assert '"time_limit": 0.25' in details_json(response) and '"time_limit": 4000' in details_json(response)
    assert '"position": 2' in details_json(response) and '"estimated_start": null' in details_json(response)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "GARRISON_CONTROLLER": "127.0.0.1:1"}  # nothing listens there
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, env=env, timeout=60)


def test_bad_arguments_exit_2_with_one_line() -> None:
    for args, message in (
        (("gadmin", "quota", "set", "-A", "a", "-u", "b", "--max-gpus", "1"), "exactly one of --account and --user"),
        (("gadmin", "quota", "set", "-A", "a"), "at least one of --max-gpus"),
        (("gadmin", "quota", "set", "-A", "a", "--max-gpus", "lots"), "--max-gpus: expected a number or 'none'"),
        (("gadmin", "qos", "add", "q", "--max-time", "soon"), "--max-time: invalid time limit 'soon'"),
        (("gcontrol", "update", "12"), "nothing to update"),
        (("gcontrol", "update", "12", "-t", "1:x"), "--time-limit: invalid time limit"),
        (("gcontrol", "hold"), "nothing to hold: give job ids"),
        (("gcontrol", "update", "12", "--nice", "99999999999"), "--nice"),
    ):
        proc = run(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_an_unreachable_controller_is_one_line_and_status_1() -> None:
    proc = run("gadmin", "account", "list")
    assert proc.returncode == 1 and proc.stderr.startswith("gadmin: error: cannot reach the controller")


def test_ginfo_summary_counts_nodes_and_gpus_per_partition() -> None:
    from garrison.cli.render import partition_rows
    from garrison.model.hostlist import compress_hostlist
    from garrison.protos.v1 import garrison_pb2 as pb

    def node(name: str, state: str, used: int, partitions: list[str]) -> pb.NodeInfo:
        gpus = [pb.GpuInfo(index=i, name="A100") for i in range(8)]
        return pb.NodeInfo(name=name, state=state, inventory=pb.NodeInventory(gpus=gpus),
                           allocated_gpus=list(range(used)), partitions=partitions)

    response = pb.ListNodesResponse(
        nodes=[node("node1", "UP", 8, ["main"]), node("node2", "UP", 3, ["main", "long"]),
               node("node3", "UP", 0, ["main", "long"]), node("node4", "DRAIN", 0, ["long"])],
        partitions=[pb.PartitionSummary(name="main", default=True, max_time_s=7 * 86400),
                    pb.PartitionSummary(name="long", max_time_s=0), pb.PartitionSummary(name="empty")])
    assert partition_rows(response, compress_hostlist) == [
        ("main*", "7-00:00:00", "2/1/0/3", "11/13/0/24", "node[1-3]"),
        ("long", "infinite", "1/1/1/3", "3/13/8/24", "node[2-4]"),
        ("empty", "infinite", "0/0/0/0", "0/0/0/0", "-"),
    ]
