"""gsim traces: the ElasticFlow format, column mappings, errors that name file/line/column, drawn fields."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from garrison.controller.sim.trace import (
    COMMON_LIMITS_H,
    ELASTICFLOW,
    ColumnMapping,
    CompletionModel,
    TraceError,
    TraceJob,
    complete_jobs,
    read_trace,
    read_trace_counted,
    round_up_limit,
)

DATA = Path(__file__).resolve().parents[1] / "data"


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_shipped_elasticflow_traces_read_whole() -> None:
    for name, count in (("cluster06.csv", 2396), ("cluster10.csv", 260)):
        with (DATA / name).open() as handle:
            rows = list(csv.DictReader(handle))
        jobs = read_trace(DATA / name)
        assert len(jobs) == len(rows) == count
        assert [j.submit_s for j in jobs] == sorted(j.submit_s for j in jobs)
        first = rows[0]
        assert (jobs[0].job_id, jobs[0].submit_s, jobs[0].duration_s, jobs[0].gpus) == (
            first["job_id"], float(first["submission_time"]), float(first["duration"]), int(first["num_gpu"]))
        assert all(j.user is None and j.account is None and j.time_limit_s is None for j in jobs)


def test_simultaneous_arrivals_keep_file_order(tmp_path: Path) -> None:
    path = write(tmp_path, "job_id,submission_time,duration,num_gpu\nb,5,1,1\na,0,1,1\nc,5,1,2\nd,5,1,3\n")
    assert [j.job_id for j in read_trace(path)] == ["a", "b", "c", "d"]
    assert [j.line for j in read_trace(path)] == [3, 2, 4, 5]


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("x,10,abc,1", "line 3, column 'duration': expected a number of seconds or a duration like 01:02:03, got 'abc'"),
        ("x,-4,100,1", "line 3, column 'submission_time': expected a non-negative number, got '-4'"),
        ("x,10,100,-1", "line 3, column 'num_gpu': expected a number of GPUs, got '-1'"),
        ("x,10,100,two", "line 3, column 'num_gpu': expected a number of GPUs, got 'two'"),
        ("x,10,inf,1", "line 3, column 'duration': expected a number of seconds or a duration like 01:02:03, got 'inf'"),
        ("x,10,-5,1", "line 3, column 'duration': expected a non-negative number, got '-5'"),
        ("x,10,100", "line 3: 3 columns, the header has 4"),
    ],
)
def test_a_malformed_row_names_file_line_and_column(tmp_path: Path, row: str, expected: str) -> None:
    path = write(tmp_path, f"job_id,submission_time,duration,num_gpu\nok,0,5,1\n{row}\nlater,20,5,1\n")
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert str(err.value) == f"{path}, {expected}"


def test_unknown_format_and_empty_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"line 1: not the ElasticFlow format .* give a column mapping"):
        read_trace(write(tmp_path, "submit,run,ngpu\n0,1,1\n"))
    with pytest.raises(TraceError, match="the trace is empty"):
        read_trace(write(tmp_path, ""))
    with pytest.raises(TraceError, match="has no job with GPUs that ran$"):
        read_trace(write(tmp_path, "job_id,submission_time,duration,num_gpu\n\n"))
    with pytest.raises(TraceError, match=r"has no job with GPUs that ran \(left out: 2 jobs without GPUs\)"):
        read_trace(write(tmp_path, "job_id,submission_time,duration,num_gpu\na,0,5,0\nb,1,5,0\n"))
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "missing.csv")


def test_a_column_mapping_reads_other_csvs_with_users_accounts_qos_and_limits(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "id,t,run,g,who,acct,q,limit\n"
        "j1,0,30,2,alice,vision,high,3600\n"
        "j2,5.5,60,1,bob,nlp,,4:00:00\n"
        "j3,7,60,1,,,,\n",
    )
    mapping = ColumnMapping.parse("arrival=t,duration=run,gpus=g,job_id=id,user=who,account=acct,qos=q,time_limit=limit")
    jobs = read_trace(path, mapping)
    assert jobs == [
        TraceJob("j1", 2, 0.0, 30.0, 2, "alice", "vision", "high", 3600),
        TraceJob("j2", 3, 5.5, 60.0, 1, "bob", "nlp", None, 4 * 3600),
        TraceJob("j3", 4, 7.0, 60.0, 1, None, None, None, None),
    ]


def test_cpu_jobs_and_jobs_that_never_ran_are_left_out_and_counted(tmp_path: Path) -> None:
    # A trace as real clusters keep them (Helios-like): CPU jobs, and a job cancelled while pending, with no
    # start or end; the run time follows from the start and end, dates or seconds.
    path = write(
        tmp_path,
        "job_id,user,gpu_num,submit_time,start_time,end_time,state\n"
        "1,u1,8,2020-04-01 00:00:00,2020-04-01 00:00:05,2020-04-01 01:00:05,COMPLETED\n"
        "2,u2,0,2020-04-01 00:01:00,2020-04-01 00:01:00,2020-04-01 00:11:00,COMPLETED\n"
        "3,u1,16,2020-04-01 00:02:00,2020-04-01 00:03:00,2020-04-01 00:04:00,FAILED\n"
        "4,u3,1,2020-04-01 00:03:00,,,CANCELLED\n",
    )
    read = read_trace_counted(path, ColumnMapping.parse(
        "arrival=submit_time,start=start_time,end=end_time,gpus=gpu_num,user=user,job_id=job_id"))
    assert [(j.job_id, j.duration_s, j.gpus) for j in read.jobs] == [("1", 3600.0, 8), ("3", 60.0, 16)]
    assert (read.without_gpus, read.never_ran) == (1, 1)
    assert read.left_out_text() == "left out: 1 job without GPUs, 1 that never ran (no run time)"
    # An empty duration is a job that never ran too; a row that ends before it starts is refused.
    read = read_trace_counted(write(tmp_path, "t,run,g\n0,,1\n1,5,2\n"), ColumnMapping.parse("arrival=t,duration=run,gpus=g"))
    assert ([j.gpus for j in read.jobs], read.never_ran, read.left_out_text()) == ([2], 1, "left out: 1 that never ran (no run time)")
    with pytest.raises(TraceError, match=r"line 2, column 'e': the job ends \('3'\) before it starts \('5'\)"):
        read_trace(write(tmp_path, "a,s,e,g\n1,5,3,1\n"), ColumnMapping.parse("arrival=a,start=s,end=e,gpus=g"))
    with pytest.raises(TraceError, match="the start and end must both be dates or both seconds"):
        read_trace(write(tmp_path, "a,s,e,g\n1,5,2020-01-01 00:00:00,1\n"), ColumnMapping.parse("arrival=a,start=s,end=e,gpus=g"))


SACCT_DUMP = """JobID|User|Account|Submit|Start|End|Elapsed|Timelimit|AllocTRES|State
101|alice|vision|2024-03-01T09:00:00|2024-03-01T09:00:05|2024-03-01T10:00:05|01:00:00|04:00:00|billing=8,cpu=8,gres/gpu=2,mem=64G,node=1|COMPLETED
101.batch||vision|2024-03-01T09:00:05|2024-03-01T09:00:05|2024-03-01T10:00:05|01:00:00||cpu=8,gres/gpu=2,mem=64G,node=1|COMPLETED
101.extern||vision|2024-03-01T09:00:05|2024-03-01T09:00:05|2024-03-01T10:00:05|01:00:00||billing=8,cpu=8,gres/gpu=2,mem=64G,node=1|COMPLETED
102|bob|nlp|2024-03-01T09:10:00|Unknown|Unknown|00:00:00|1-00:00:00||CANCELLED by 1001
103|carol|nlp|2024-03-01T09:20:00|2024-03-01T09:20:01|2024-03-01T09:30:01|00:10:00|UNLIMITED|billing=4,cpu=4,mem=16G,node=1|COMPLETED
104_3|dave|vision|2024-03-01T09:30:00|2024-03-01T09:31:00|2024-03-02T09:31:00|1-00:00:00|2-00:00:00|billing=16,cpu=16,gres/gpu:a100=8,mem=500G,node=1|TIMEOUT
104_3.0|dave|vision|2024-03-01T09:31:00|2024-03-01T09:31:00|2024-03-02T09:31:00|1-00:00:00||cpu=16,gres/gpu:a100=8,node=1|CANCELLED
"""


def test_a_slurm_sacct_dump_is_read_as_it_is(tmp_path: Path) -> None:
    # `sacct -a -P -o JobID,User,Account,Submit,Start,End,Elapsed,Timelimit,AllocTRES,State`: '|'-separated,
    # dates with a T, Slurm durations, GPUs inside the TRES list, step rows, Unknown and UNLIMITED.
    path = write(tmp_path, SACCT_DUMP)
    read = read_trace_counted(path, ColumnMapping.parse(
        "job_id=JobID,arrival=Submit,start=Start,end=End,gpus=AllocTRES,user=User,account=Account,"
        "time_limit=Timelimit"))
    assert [(j.job_id, j.duration_s, j.gpus, j.user, j.time_limit_s) for j in read.jobs] == [
        ("101", 3600.0, 2, "alice", 4 * 3600), ("104_3", 86400.0, 8, "dave", 2 * 86400)]
    assert (read.without_gpus, read.never_ran, read.steps) == (1, 1, 3)
    # Elapsed as the run time instead: the cancelled job ran for no time at all, which is never having run.
    read = read_trace_counted(path, ColumnMapping.parse("job_id=JobID,arrival=Submit,duration=Elapsed,gpus=AllocTRES"))
    assert [(j.job_id, j.duration_s) for j in read.jobs] == [("101", 3600.0), ("104_3", 86400.0)]
    assert (read.without_gpus, read.never_ran, read.steps) == (1, 1, 3)
    with pytest.raises(TraceError, match=r"line 2, column 'g': expected a GPU count in 'gres/gpu=two'"):
        read_trace(write(tmp_path, "a|d|g\n0|5|cpu=1,gres/gpu=two\n"), ColumnMapping.parse("arrival=a,duration=d,gpus=g"))


def test_mapping_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"missing duration \(or start and end\)$"):
        ColumnMapping.parse("arrival=a,gpus=c,start=s")
    with pytest.raises(TraceError, match="either duration or start and end, not both"):
        ColumnMapping.parse("arrival=a,gpus=c,duration=d,start=s,end=e")
    with pytest.raises(TraceError, match="missing gpus"):
        ColumnMapping.parse("arrival=a,duration=b")
    with pytest.raises(TraceError, match="unknown field 'size'"):
        ColumnMapping.parse("arrival=a,duration=b,gpus=c,size=d")
    with pytest.raises(TraceError, match="expected FIELD=COLUMN"):
        ColumnMapping.parse("arrival=a,duration")
    path = write(tmp_path, "a,b,c,lim\n0,1,1,soon\n")
    with pytest.raises(TraceError, match=r"line 1: no column 'gpus' \(for gpus\)"):
        read_trace(path, ColumnMapping.parse("arrival=a,duration=b,gpus=gpus"))
    with pytest.raises(TraceError, match=r"line 2, column 'lim': expected seconds or a duration like 4:00:00, got 'soon'"):
        read_trace(path, ColumnMapping.parse("arrival=a,duration=b,gpus=c,time_limit=lim"))


def test_limits_round_up_to_common_values() -> None:
    assert round_up_limit(1) == 3600
    assert round_up_limit(3600) == 3600
    assert round_up_limit(3601) == 4 * 3600
    assert round_up_limit(25 * 3600) == 72 * 3600
    assert round_up_limit(200 * 3600) == 336 * 3600
    assert round_up_limit(337 * 3600) == 2 * 336 * 3600


def test_drawn_accounts_and_limits_are_seeded_and_never_below_the_duration() -> None:
    jobs = read_trace(DATA / "cluster06.csv")
    first = complete_jobs(jobs, CompletionModel(seed=7))
    assert first == complete_jobs(jobs, CompletionModel(seed=7))
    other = complete_jobs(jobs, CompletionModel(seed=8))
    assert [j.time_limit_s for j in other] != [j.time_limit_s for j in first]
    allowed = {h * 3600 for h in COMMON_LIMITS_H}
    for job in first:
        assert job.time_limit_s is not None and job.time_limit_s >= job.duration_s
        assert job.time_limit_s in allowed or job.time_limit_s % (COMMON_LIMITS_H[-1] * 3600) == 0
        assert job.account in {"acct0", "acct1", "acct2", "acct3"}
        assert job.user == f"{job.account}-user"
    # Zipf-skewed: the first account is the busiest, the last the lightest.
    counts = [sum(1 for j in first if j.account == f"acct{k}") for k in range(4)]
    assert counts == sorted(counts, reverse=True) and counts[-1] > 0
    # Users overestimate: most limits are well above the true duration.
    assert sum(1 for j in first if j.time_limit_s and j.time_limit_s >= 1.5 * j.duration_s) > 0.6 * len(first)
    # The number of accounts does not change anyone's limit.
    more = complete_jobs(jobs, CompletionModel(seed=7, accounts=9))
    assert [j.time_limit_s for j in more] == [j.time_limit_s for j in first]


def test_what_the_trace_gives_is_kept() -> None:
    job = TraceJob("x", 2, 0.0, 10.0, 1, user="alice", account="vision", time_limit_s=60)
    (done,) = complete_jobs([job], CompletionModel())
    assert (done.user, done.account, done.time_limit_s) == ("alice", "vision", 60)


def test_arrival_times_may_be_dates(tmp_path: Path) -> None:
    """Traces such as Philly's give submission times as dates: read as UTC seconds, in arrival order."""
    path = write(tmp_path, "id,submit,run,gpus\n"
                           "b,2017-10-09 07:01:55,60,1\n"
                           "a,2017-10-09 07:00:00,60,2\n"
                           "c,2017-10-10T07:00:00+00:00,60,1\n")
    jobs = read_trace(path, ColumnMapping.parse("arrival=submit,duration=run,gpus=gpus,job_id=id"))
    assert [j.job_id for j in jobs] == ["a", "b", "c"]
    assert jobs[1].submit_s - jobs[0].submit_s == 115
    assert jobs[2].submit_s - jobs[0].submit_s == 86400
    assert jobs[0].submit_s == 1507532400  # 2017-10-09 07:00:00 UTC


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ("a,2017-10-09 07:01:55,60,1\nb,2017-13-09 07:00:00,60,1\n",
         "line 3, column 'submit': expected seconds or a date and time like '2017-10-09 07:01:55', "
         "got '2017-13-09 07:00:00'"),
        ("a,2017-10-09 07:01:55,60,1\nb,100,60,1\n",
         "line 3, column 'submit': a number of seconds among arrival times given as dates, got '100'"),
        ("a,100,60,1\nb,2017-10-09 07:01:55,60,1\n",
         "line 3, column 'submit': a date among arrival times given as seconds, got '2017-10-09 07:01:55'"),
    ],
)
def test_a_bad_date_names_its_line(tmp_path: Path, rows: str, expected: str) -> None:
    path = write(tmp_path, "id,submit,run,gpus\n" + rows)
    with pytest.raises(TraceError) as err:
        read_trace(path, ColumnMapping.parse("arrival=submit,duration=run,gpus=gpus,job_id=id"))
    assert str(err.value) == f"{path}, {expected}"


# The ElasticFlow ITP traces' shape as other clusters of the family (and the tools that touch them) write
# it: the same two jobs, each way must read as the plain file does.
ITP_JOBS = [("a", 0.0, 100.0, 1), ("b", 5.0, 200.0, 2)]
ITP_VARIANTS = {
    "plain": b"job_id,submission_time,duration,num_gpu\na,0,100,1\nb,5,200,2\n",
    "columns in another order": b"num_gpu,duration,job_id,submission_time\n1,100,a,0\n2,200,b,5\n",
    "extra columns": b"job_id,user,submission_time,duration,num_gpu,vc\na,u1,0,100,1,x\nb,u2,5,200,2,y\n",
    "blank lines": b"\njob_id,submission_time,duration,num_gpu\n\na,0,100,1\n\n,,,\nb,5,200,2\n\n",
    "CRLF": b"job_id,submission_time,duration,num_gpu\r\na,0,100,1\r\nb,5,200,2\r\n",
    "a BOM": b"\xef\xbb\xbfjob_id,submission_time,duration,num_gpu\na,0,100,1\nb,5,200,2\n",
    "a BOM, CRLF and a blank first line": b"\xef\xbb\xbf\r\njob_id,submission_time,duration,num_gpu\r\na,0,100,1\r\n"
                                          b"b,5,200,2\r\n",
    "CR alone": b"job_id,submission_time,duration,num_gpu\ra,0,100,1\rb,5,200,2\r",
    "quoted cells and spaces": b'"job_id", "submission_time", "duration", "num_gpu"\n"a", 0, 100, 1\n"b", 5, 200, 2\n',
    "a trailing comma": b"job_id,submission_time,duration,num_gpu,\na,0,100,1,\nb,5,200,2,\n",
}


@pytest.mark.parametrize("variant", list(ITP_VARIANTS))
def test_elasticflow_traces_of_other_clusters_read_alike(tmp_path: Path, variant: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_bytes(ITP_VARIANTS[variant])
    assert [(j.job_id, j.submit_s, j.duration_s, j.gpus) for j in read_trace(path)] == ITP_JOBS


def test_a_bom_does_not_stick_to_a_mapped_column(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_bytes(b"\xef\xbb\xbft,run,g\n0,30,2\n")
    (job,) = read_trace(path, ColumnMapping.parse("arrival=t,duration=run,gpus=g"))
    assert (job.line, job.submit_s, job.duration_s, job.gpus) == (2, 0.0, 30.0, 2)


def test_submission_times_as_dates_in_the_elasticflow_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "job_id,submission_time,duration,num_gpu\n"
                           "b,2020-05-01T10:00:05Z,200,2\n"
                           "a,2020-05-01 10:00:00,100,1\n")
    jobs = read_trace(path)
    assert [(j.job_id, j.submit_s) for j in jobs] == [("a", 1588327200.0), ("b", 1588327205.0)]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # Two columns of one name: which one holds the GPUs is a guess, so neither is read.
        (b"job_id,submission_time,duration,num_gpu,num_gpu\na,0,100,1,4\n",
         "{path}, line 1: column 'num_gpu' (for gpus) appears 2 times in the header"),
        (b"\n\njob_id,job_id,submission_time,duration,num_gpu\na,a,0,100,1\n",
         "{path}, line 3: column 'job_id' (for job_id) appears 2 times in the header"),
        # A byte that is not UTF-8 (a Latin-1 export), named by its line, not the header's.
        (b"job_id,submission_time,duration,num_gpu\na,0,100,1\ncaf\xe9,5,100,1\n",
         "{path}, line 3: not UTF-8 text (byte 0xe9); a trace must be UTF-8 (convert it: iconv -t UTF-8)"),
        (b"job_id,submission_time,duration,num_gpu\r\n\xff,0,100,1\r\n",
         "{path}, line 2: not UTF-8 text (byte 0xff); a trace must be UTF-8 (convert it: iconv -t UTF-8)"),
        ("job_id,submission_time,duration,num_gpu\na,0,100,1\n".encode("utf-16"),
         "{path}: UTF-16 or UTF-32 text; a trace must be UTF-8 (convert it: iconv -t UTF-8)"),
        (b"\xef\xbb\xbf\r\n\r\n", "{path}: the trace is empty"),
        (b"job_id;submission_time;duration;num_gpu\na;0;100;1\n",
         "{path}, line 1: not the ElasticFlow format (job_id,submission_time,duration,num_gpu); header is "
         "'job_id;submission_time;duration;num_gpu': give a column mapping (--columns arrival=...,duration=...,gpus=...)"),
    ],
)
def test_traces_read_ambiguously_are_refused_in_one_line(tmp_path: Path, data: bytes, expected: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_bytes(data)
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert str(err.value) == expected.format(path=path)


def test_what_other_clusters_traces_write_is_read(tmp_path: Path) -> None:
    """Cells other clusters' traces hold (found replaying Helios, Alibaba PAI and v2025, Philly and PM100
    extracts): NaN/NA/null/NaT as pandas, R and databases write a missing value, read as an empty cell; an
    empty arrival (a task still waiting when the trace was cut) leaves its row out, counted; a zero run time
    (a CANCELLED row whose start is its end) never ran; a share of a GPU takes a whole one; INFINITE as
    UNLIMITED; dates with slashes."""
    mapping = ColumnMapping.parse("job_id=id,arrival=a,duration=d,gpus=g,time_limit=lim")
    path = write(tmp_path, "id,a,d,g,lim\n"
                           "1,5,100,0.5,INFINITE\n"   # half a GPU: one
                           "2,,100,1,\n"              # no arrival: left out
                           "3,6,NaN,1,\n"             # no run time
                           "4,7,0,8,\n"               # ran for no time: never ran
                           "5,8,100,NA,\n"            # no GPUs known
                           "6,9,50,2,null\n")
    read = read_trace_counted(path, mapping)
    assert [(j.job_id, j.gpus, j.time_limit_s) for j in read.jobs] == [("1", 1, None), ("6", 2, None)]
    assert (read.without_arrival, read.never_ran, read.without_gpus) == (1, 2, 1)
    assert read.left_out_text() == "left out: 1 job without GPUs, 2 that never ran (no run time), 1 without an arrival time"
    running = write(tmp_path, "a,s,e,g\n0,5,15,1\n1,6,,1\n2,,,1\n")  # a start and no end: running at the cut
    read = read_trace_counted(running, ColumnMapping.parse("arrival=a,start=s,end=e,gpus=g"))
    assert (len(read.jobs), read.still_running, read.never_ran) == (1, 1, 1)
    assert read.left_out_text() == "left out: 1 that never ran (no run time), 1 still running when the trace ends"
    dated = write(tmp_path, "a,d,g\n2020/06/09 18:41:01,10,1\n2020-06-09 18:41:02,10,1\n")
    assert [j.submit_s for j in read_trace(dated, ColumnMapping.parse("arrival=a,duration=d,gpus=g"))] == [
        1591728061.0, 1591728062.0]


def test_a_users_jobs_share_the_account_drawn_for_them() -> None:
    """A trace with users and no accounts: each user's jobs all get one drawn account (they were drawn job by
    job, which split one user's jobs over several accounts and made fair share meaningless)."""
    jobs = [TraceJob(job_id=str(i), line=i, submit_s=float(i), duration_s=10.0, gpus=1, user=f"u{i % 5}")
            for i in range(200)]
    done = complete_jobs(jobs, CompletionModel(seed=3, accounts=4))
    by_user: dict[str | None, set[str | None]] = {}
    for job in done:
        by_user.setdefault(job.user, set()).add(job.account)
    assert all(len(accounts) == 1 for accounts in by_user.values())
    assert len({a for accounts in by_user.values() for a in accounts}) > 1  # still drawn, not one for all


def test_plain_numbers_of_time_are_read_in_the_unit_given(tmp_path: Path) -> None:
    from dataclasses import replace

    trace = write(tmp_path, "id,submit,begin,finish,g,limit\nj0,1500,2000,62000,1,120000\n"
                            "j1,90000,2020-01-01 00:00:00,2020-01-01 00:01:00,2,4:00:00\n")
    mapping = replace(ColumnMapping.parse("job_id=id,arrival=submit,start=begin,end=finish,gpus=g,time_limit=limit"),
                      seconds_per_unit=0.001)
    first, second = read_trace(trace, mapping)
    assert (first.submit_s, first.duration_s, first.time_limit_s) == (1.5, 60.0, 120)
    # Dates and Slurm durations say their own unit.
    assert (second.submit_s, second.duration_s, second.time_limit_s) == (90.0, 60.0, 4 * 3600)
    minutes = write(tmp_path, "job_id,submission_time,duration,num_gpu\n1,2,3,1\n", "minutes.csv")
    [job] = read_trace(minutes, replace(ELASTICFLOW, seconds_per_unit=60.0))
    assert (job.submit_s, job.duration_s) == (120.0, 180.0)
