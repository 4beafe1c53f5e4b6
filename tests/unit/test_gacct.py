"""gacct: time arguments and views as pure functions, then the real command against a real controller whose
store holds jobs the controller has long forgotten from memory, across a controller restart."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from daemon_helpers import NotifySocket
from helpers.ports import free_port

from garrison.cli.accounting import (
    FormatError,
    TimeSpecError,
    format_columns,
    parse_time,
    record_rows,
    records_csv,
    records_json,
    select_columns,
    usage_rows,
)
from garrison.controller.rpc.convert_admin import job_record_to_pb, usage_to_pb
from garrison.controller.store import UsageRow, open_store
from garrison.model.domain import Allocation, Attempt, AttemptUsage, Job, JobSpec, JobState, NodeAllocation

BIN = Path(sys.executable).parent
# 2024-03-01T12:00:00Z and around: long before any test runs, so far past finished_job_retention_s.
T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC).timestamp()


# -- time arguments ----------------------------------------------------------------------------------------


def test_parse_time() -> None:
    zone = timezone(timedelta(hours=2))
    now = datetime(2024, 3, 1, 15, 30, 10, tzinfo=zone)
    midnight = datetime(2024, 3, 1, tzinfo=zone).timestamp()
    assert parse_time("now", now) == now.timestamp()
    assert parse_time("today", now) == parse_time("midnight", now) == midnight
    assert parse_time("yesterday", now) == midnight - 86400
    assert parse_time("now-7days", now) == now.timestamp() - 7 * 86400
    assert parse_time("now-2h", now) == now.timestamp() - 7200
    assert parse_time("now+30", now) == now.timestamp() + 30  # seconds by default, like Slurm
    assert parse_time("2024-02-01", now) == datetime(2024, 2, 1, tzinfo=zone).timestamp()  # local time
    assert parse_time("2024-02-01T08:15", now) == datetime(2024, 2, 1, 8, 15, tzinfo=zone).timestamp()
    assert parse_time("2024-02-01T08:15:00+00:00", now) == datetime(2024, 2, 1, 8, 15, tzinfo=UTC).timestamp()
    for bad in ("last tuesday", "now-3fortnights", "2024-13-01", ""):
        with pytest.raises(TimeSpecError):
            parse_time(bad, now)


# -- views ---------------------------------------------------------------------------------------------------


def attempt(job_id: int, number: int, node_gpus: tuple[tuple[str, tuple[int, ...]], ...], start: float,
            end: float | None, state: JobState, exit_code: int | None = None, cpus: tuple[int, ...] = (),
            mem_mb: int = 0, usage: AttemptUsage | None = None) -> Attempt:
    allocation = Allocation(tuple(NodeAllocation(node, gpus, cpus, mem_mb) for node, gpus in node_gpus))
    return Attempt(job_id, number, allocation, start, end_time=end, state=state, exit_code=exit_code, usage=usage)


# Job 1's second attempt: 300 MiB at its peak, 2 CPU-hours on 16 CPUs in 1 hour (12.5%), GPUs 75% busy.
MEASURED = AttemptUsage(max_rss_bytes=300 << 20, cpu_time_s=7200.0, gpu_utilization_pct=75.0,
                        gpu_memory_bytes=40 << 30)


def sample_jobs() -> list[Job]:
    def job(job_id: int, user: str, account: str, **changes: object) -> Job:
        base = Job(job_id=job_id, spec=JobSpec(name=f"train-{job_id}", command=("python", "t.py"), gpus=4),
                   user=user, uid=1000 + job_id, gid=1000, account=account, partition="gpu", time_limit_s=7200,
                   submit_time=T0)
        return replace(base, **changes)  # type: ignore[arg-type]

    return [
        # 4 GPUs on two nodes for an hour, then a node failure; requeued, then 1 hour more and completed
        job(1, "ada", "research", state=JobState.COMPLETED, start_time=T0 + 3600 * 2, end_time=T0 + 3600 * 3,
            exit_code=0, restart_count=1, attempts=(
                attempt(1, 0, (("n1", (0, 1)), ("n2", (0, 1))), T0, T0 + 3600, JobState.NODE_FAIL, -9),
                attempt(1, 1, (("n3", (0, 1, 2, 3)),), T0 + 3600 * 2, T0 + 3600 * 3, JobState.COMPLETED, 0,
                        cpus=tuple(range(16)), mem_mb=64_000, usage=MEASURED))),
        # bob: failed after half an hour on 2 GPUs
        job(2, "bob", "default", state=JobState.FAILED, start_time=T0, end_time=T0 + 1800, exit_code=3,
            attempts=(attempt(2, 0, (("n1", (2, 3)),), T0, T0 + 1800, JobState.FAILED, 3),)),
        # bob: cancelled while pending
        job(3, "bob", "research", state=JobState.CANCELLED, end_time=T0 + 60, reason="cancelled"),
    ]


def test_record_rows_show_each_attempt() -> None:
    records = [job_record_to_pb(job, now=T0 + 10 * 3600) for job in sample_jobs()]
    rows = record_rows(records, now=T0 + 10 * 3600, zone=UTC)
    assert [row[0] for row in rows] == ["1", "1.0", "1.1", "2", "2.0", "3"]
    job1, first, second = rows[0], rows[1], rows[2]
    assert job1[5:14] == ("COMPLETED", "2024-03-01T14:00:00", "2024-03-01T15:00:00", "1:00:00", "4", "16", "8.00", "n3",
                        "0")
    assert first[5:14] == ("NODE_FAIL", "2024-03-01T12:00:00", "2024-03-01T13:00:00", "1:00:00", "4", "0", "4.00",
                         "n[1-2]", "-9")
    assert second[9:12] == ("4", "16", "4.00")
    assert second[14:] == job1[14:] == ("300.00M", "02:00:00", "12.5%", "75.0%", "40.00G")  # sacct's job line: the last
    assert first[14:] == ("-", "-", "-", "-", "-")  # not measured (an unconfined node, or before containment)
    assert rows[5][5:14] == ("CANCELLED", "-", "2024-03-01T12:01:00", "0:00", "4", "-", "0.00", "-", "-")
    assert [row[0] for row in record_rows(records, T0, UTC, with_attempts=False)] == ["1", "2", "3"]


def test_format_chooses_orders_and_cuts_columns_as_sacct() -> None:
    records = [job_record_to_pb(job, now=T0 + 10 * 3600) for job in sample_jobs()]
    rows = record_rows(records, now=T0 + 10 * 3600, zone=UTC, with_attempts=False)
    headers, chosen = select_columns(rows, format_columns("State,JobID, jobname%5,ExitCode%1,AllocCPUS"))
    assert headers == ("STATE", "JOBID", "NAME", "+", "CPUS")
    assert chosen[0] == ("COMPLETED", "1", "trai+", "0", "16")  # train-1, cut to 5 with sacct's '+'
    headers, chosen = select_columns(rows, format_columns("JobID,MaxRSS,TotalCPU,CPUEff,GPUUtil,GPUMem"))
    assert headers == ("JOBID", "MAXRSS", "TOTALCPU", "CPUEFF", "GPUUTIL", "GPUMEM")
    assert chosen[0] == ("1", "300.00M", "02:00:00", "12.5%", "75.0%", "40.00G")
    for bad, message in (("JobID,Nope", "unknown field 'Nope'"), ("State%x", "must be a number"),
                         ("State%0", "must be a number"), (" , ", "no fields")):
        with pytest.raises(FormatError, match=message):
            format_columns(bad)


def test_records_json_and_csv() -> None:
    records = [job_record_to_pb(job, now=T0) for job in sample_jobs()]
    document = json.loads(records_json(records, now=T0))
    job1 = document["jobs"][0]
    assert job1["job_id"] == "1" and job1["gpu_hours"] == 8.0 and job1["exit_code"] == 0
    assert [a["state"] for a in job1["attempts"]] == ["NODE_FAIL", "COMPLETED"]
    assert job1["attempts"][0]["allocation"] == [{"node": "n1", "gpus": [0, 1], "cpus": [], "mem_mb": 0},
                                                 {"node": "n2", "gpus": [0, 1], "cpus": [], "mem_mb": 0}]
    assert job1["attempts"][1]["cpus"] == 16 and job1["attempts"][1]["allocation"][0]["mem_mb"] == 64_000
    assert job1["attempts"][1]["usage"] == job1["usage"] == {
        "max_rss_bytes": 300 << 20, "total_cpu_s": 7200.0, "cpu_efficiency_pct": 12.5, "gpu_utilization_pct": 75.0,
        "gpu_memory_bytes": 40 << 30, "oom_kills": 0}
    assert job1["attempts"][0]["usage"] is None
    assert document["jobs"][2]["start_time"] is None and document["jobs"][2]["attempts"] == []

    lines = list(csv.DictReader(io.StringIO(records_csv(records, T0, UTC))))
    assert lines[2]["max_rss_bytes"] == str(300 << 20) and lines[2]["cpu_efficiency_pct"] == "12.5"
    assert lines[1]["max_rss_bytes"] == ""
    assert [(line["job_id"], line["attempt"]) for line in lines] == [
        ("1", ""), ("1", "0"), ("1", "1"), ("2", ""), ("2", "0"), ("3", "")]
    assert lines[1]["nodes"] == "n1,n2" and lines[1]["gpu_hours"] == "4.000000"
    assert [line["cpus"] for line in lines[:3]] == ["16", "0", "16"]
    assert lines[0]["start_time"] == "2024-03-01T14:00:00+00:00"
    assert lines[5]["exit_code"] == "" and lines[5]["start_time"] == ""


def test_usage_rows_total_per_account_and_overall() -> None:
    rows = [usage_to_pb(UsageRow("default", "bob", 3600.0, 1, 1)),
            usage_to_pb(UsageRow("research", "ada", 7200.0 * 4, 1, 2)),
            usage_to_pb(UsageRow("research", "bob", 1800.0, 2, 2))]
    assert usage_rows(rows) == [
        ("default", "bob", "1.00", "1", "1"),
        ("research", "ada", "8.00", "1", "2"),
        ("research", "bob", "0.50", "2", "2"),
        ("research", "(total)", "8.50", "3", "4"),
        ("(all)", "", "9.50", "4", "5"),
    ]
    assert usage_rows([]) == [("(all)", "", "0.00", "0", "0")]


# -- gacct against a controller -------------------------------------------------------------------------------


class Controller:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.address = f"127.0.0.1:{free_port()}"
        self.database = f"sqlite:///{base}/controller.db"
        self.config = base / "garrison.toml"
        self.config.write_text(f"""
[controller]
address = "{self.address}"
database = "{self.database}"
state_dir = "{base}/controller"
key_file = "{base}/controller/credential.key"
credential_socket = "{base}/auth.sock"
local_socket = "{base}/controller.sock"
finished_job_retention_s = 60
accounts = ["default", "research"]
""")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GARRISON_")}
        self.env.update(GARRISON_CONTROLLER=self.address, XDG_CACHE_HOME=str(base / "cache"), TZ="UTC")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        notify = NotifySocket(self.base / f"notify-{os.urandom(4).hex()}")
        try:
            with open(self.base / "controller.log", "ab") as log:
                self.process = subprocess.Popen(
                    [str(BIN / "garrison-controller"), "--config", str(self.config)],
                    env=dict(self.env, NOTIFY_SOCKET=str(notify.path)), stdout=log, stderr=log,
                    stdin=subprocess.DEVNULL, start_new_session=True)
            notify.wait_for(lambda message: message.get("READY") == "1", 60)
        finally:
            notify.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / args[0]), *args[1:]], env=self.env, capture_output=True, text=True,
                              timeout=60)

    def ok(self, *args: str) -> str:
        result = self.run(*args)
        assert result.returncode == 0, f"{args}: {result.stderr}"
        return result.stdout


@pytest.fixture(scope="module")
def controller() -> Iterator[Controller]:
    base = Path(tempfile.mkdtemp(prefix="gacct-", dir="/tmp"))
    running = Controller(base)
    store = open_store(running.database)
    try:
        store.save_jobs(sample_jobs())
    finally:
        store.close()
    running.start()
    try:
        yield running
    finally:
        running.stop()
        shutil.rmtree(base, ignore_errors=True)


PERIOD = ("-S", "2024-03-01", "-E", "2024-03-02")


def test_gacct_shows_jobs_the_controller_has_forgotten(controller: Controller) -> None:
    assert json.loads(controller.ok("gqueue", "--json", "-t", "all"))["jobs"] == []  # long past their retention
    out = controller.ok("gacct", "-a", *PERIOD)
    lines = out.splitlines()
    assert lines[0].split() == ["JOBID", "NAME", "USER", "ACCOUNT", "PARTITION", "STATE", "START", "END", "ELAPSED",
                                "GPUS", "CPUS", "GPU-HOURS", "NODELIST", "EXITCODE"]
    assert [line.split()[0] for line in lines[1:]] == ["1", "1.0", "1.1", "2", "2.0", "3"]
    assert lines[1].split()[5:] == ["COMPLETED", "2024-03-01T14:00:00", "2024-03-01T15:00:00", "1:00:00", "4", "16",
                                    "8.00", "n3", "0"]


def test_gacct_filters(controller: Controller) -> None:
    def ids(*args: str) -> list[str]:
        return [job["job_id"] for job in json.loads(controller.ok("gacct", "--json", *args))["jobs"]]

    assert ids("-a", *PERIOD) == ["1", "2", "3"]
    assert ids("-u", "bob", *PERIOD) == ["2", "3"]
    assert ids("-A", "research", "-a", *PERIOD) == ["1", "3"]
    assert ids("-s", "failed,cancelled", "-a", *PERIOD) == ["2", "3"]
    assert ids("-j", "1,3") == ["1", "3"]  # -j: any time, any user
    assert ids("-a", "-S", "2024-03-01T12:30", "-E", "2024-03-01T12:45") == ["1", "2"]  # 3 ended at 12:01
    assert ids("-a", "-S", "2024-03-02") == []
    assert ids("-a") == []  # today (the default -S) has none of them
    assert controller.ok("gacct", "-X", "-j", "1,2", "-o", "JobID,State").splitlines() == [
        "JOBID  STATE", "1      COMPLETED", "2      FAILED"]
    refused = controller.run("gacct", "-j", "1", "-o", "JobID,Bogus")
    assert refused.returncode == 2 and "--format: unknown field 'Bogus'" in refused.stderr
    assert refused.stderr.count("\n") == 1
    csv_lines = controller.ok("gacct", "--csv", "-X", "-j", "2").splitlines()
    assert csv_lines[0].startswith("job_id,attempt,name,user") and len(csv_lines) == 2
    assert csv_lines[1].startswith("2,,train-2,bob,default,gpu,FAILED,")


def test_gacct_usage(controller: Controller) -> None:
    document = json.loads(controller.ok("gacct", "--usage", "--json", *PERIOD))
    usage = {(row["account"], row["user"]): row["gpu_hours"] for row in document["usage"]}
    assert usage == {("default", "bob"): 1.0, ("research", "ada"): 8.0}
    # A period that cuts attempts: 12:30-13:30 holds half of job 1's first attempt (4 GPUs); job 2 ended
    # exactly at 12:30 and has nothing in it.
    document = json.loads(controller.ok("gacct", "--usage", "--json", "-S", "2024-03-01T12:30", "-E",
                                        "2024-03-01T13:30"))
    assert {(r["account"], r["user"]): r["gpu_hours"] for r in document["usage"]} == {("research", "ada"): 2.0}
    table = controller.ok("gacct", "--usage", "-A", "research", *PERIOD).splitlines()
    assert table[0] == "GPU usage from 2024-03-01T00:00:00 to 2024-03-02T00:00:00"
    assert table[2].split() == ["research", "ada", "8.00", "1", "2"]


def test_gacct_refuses_bad_input_with_one_line(controller: Controller) -> None:
    for args, message in [
        (("-S", "yesterdayish"), "cannot read the time 'yesterdayish'"),
        (("-s", "SLEEPING", "-a"), "unknown job state 'SLEEPING'"),
        (("-j", "12x"), "invalid job id '12x'"),
        (("-S", "2024-03-02", "-E", "2024-03-01"), "the start time (-S) is after the end time (-E)"),
        (("--usage", "-S", "now", "-E", "now-1d"), "the period is empty"),
        (("--usage", "-j", "1"), "--usage takes only"),
        (("--json", "--csv"), "choose one of --json and --csv"),
    ]:
        result = controller.run("gacct", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.count("\n") == 1 and message in result.stderr, (args, result.stderr)


def test_records_survive_a_controller_restart(controller: Controller) -> None:
    before = controller.ok("gacct", "--json", "-a", *PERIOD)
    controller.process.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
    controller.process.wait(timeout=30)  # type: ignore[union-attr]
    controller.start()
    assert controller.ok("gacct", "--json", "-a", *PERIOD) == before


def test_default_table_rows_fit_160_columns() -> None:
    from garrison.cli.accounting import DEFAULT_LAYOUT, select_columns
    from garrison.cli.render import plain_table

    records = [job_record_to_pb(job, now=T0 + 10 * 3600) for job in sample_jobs()]
    for record in records:
        record.name, record.user, record.account, record.partition = "n" * 80, "u" * 30, "a" * 40, "p" * 30
        for attempt in record.attempts:
            for index, node in enumerate(attempt.allocation):
                node.node = f"gpu-node-{index * 7:04d}.cluster.example.org"
    headers, rows = select_columns(record_rows(records, T0 + 10 * 3600, UTC), DEFAULT_LAYOUT)
    lines = plain_table(headers, rows).splitlines()
    assert max(len(line) for line in lines) <= 160, max(lines, key=len)
    assert rows[0][0] == "1" and rows[0][1] == "n" * 9 + "+"  # cut as sacct cuts, the id never
