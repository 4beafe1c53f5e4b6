"""The gsim command as users run it (a real process): table, --json, --out, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

GSIM = Path(sys.executable).parent / "gsim"
COLUMNS = "job_id=id,arrival=t,duration=d,gpus=g,account=acct,time_limit=limit"
U = 600


def gsim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(GSIM), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def queue_trace(tmp_path: Path) -> Path:
    """The one-node FIFO queue of test_sim_replay, as a CSV with its own column names."""
    rows = [(0, 8, 100), (10, 4, 50), (20, 4, 30), (30, 8, 10), (40, 1, 5)]
    path = tmp_path / "queue.csv"
    path.write_text("id,t,d,g,acct,limit\n" + "".join(
        f"j{i},{t * U},{d * U},{g},a,{d * U}\n" for i, (t, g, d) in enumerate(rows)))
    return path


def test_json_figures(queue_trace: Path) -> None:
    proc = gsim(str(queue_trace), "--cluster", "1x8", "--policy", "fifo", "--columns", COLUMNS, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    (fifo,) = data["policies"]
    assert data["jobs"] == 5
    assert fifo["policy"] == "fifo"
    assert fifo["avg_jct_s"] == pytest.approx(121 * U)
    assert fifo["max_wait_s"] == pytest.approx(120 * U)
    assert fifo["p95_wait_s"] == pytest.approx(120 * U)
    assert fifo["utilization"] == pytest.approx(1205 / 1320)
    for key in ("p50_jct_s", "p95_jct_s", "p99_jct_s", "avg_wait_s", "p50_wait_s", "p99_wait_s", "makespan_s",
                "jain_fairness", "preemptions", "gpu_hours_lost", "wall_s"):
        assert key in fifo


def test_the_rows_left_out_are_said(queue_trace: Path) -> None:
    with queue_trace.open("a") as trace:
        trace.write(f"cpu,{U},{U},0,a,{U}\nnever,{U},,1,a,{U}\n")
    proc = gsim(str(queue_trace), "--cluster", "1x8", "--policy", "fifo", "--columns", COLUMNS, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["jobs"], data["left_out"]) == (5, "1 job without GPUs, 1 that never ran (no run time)")
    table = gsim(str(queue_trace), "--cluster", "1x8", "--policy", "fifo", "--columns", COLUMNS)
    assert "5 jobs on 1x8 GPU" in table.stdout and "(left out: 1 job without GPUs, 1 that never ran" in table.stdout


def test_table_by_default(queue_trace: Path) -> None:
    proc = gsim(str(queue_trace), "--cluster", "1x8", "--policy", "fifo", "--columns", COLUMNS)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "queue.csv: 5 jobs on 1x8 GPU; 8 GPUs; 1 switch(es)"
    assert lines[1].split() == ["metric", "fifo"]
    assert any(line.split()[:4] == ["avg", "JCT", "20.17", "h"] for line in lines)


def test_out_writes_plots_results_and_jobs(queue_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    proc = gsim(str(queue_trace), "--cluster", "1x8", "--policy", "fifo", "--columns", COLUMNS, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    for name in ("queue_length.png", "utilization.png", "jct_cdf.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "results.json").read_text())["policies"][0]["policy"] == "fifo"
    rows = (out / "jobs.csv").read_text().splitlines()
    assert rows[0].startswith("policy,job_id,trace_job_id,account,gpus,submit_s,start_s,end_s")
    assert rows[5].startswith(f"fifo,5,j4,a,1,{40 * U}.0,{160 * U}.0,{165 * U}.0")


def test_a_malformed_row_stops_before_any_replay(queue_trace: Path, tmp_path: Path) -> None:
    text = queue_trace.read_text().splitlines()
    text[3] = "j2,12000,soon,4,a,18000"
    queue_trace.write_text("\n".join(text) + "\n")
    out = tmp_path / "report"
    proc = gsim(str(queue_trace), "--cluster", "1x8", "--columns", COLUMNS, "--out", str(out))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        f"gsim: error: {queue_trace}, line 4, column 'd': expected a number of seconds or a duration like 01:02:03, got 'soon'\n"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster", "12by8"], "gsim: error: cluster '12by8': expected NODESxGPUS"),
        (["--cluster", "1x4"], "gsim: error: {trace}, line 2: job j0 asks for 8 GPUs; the cluster has 4"),
        (["--cluster", "1x8", "--config", "/nonexistent.toml"], "gsim: error: /nonexistent.toml"),
        (["--cluster", "1x8", "--columns", "arrival=t"], "gsim: error: column mapping: missing duration (or start and end), gpus"),
    ],
)
def test_bad_input_is_one_line(queue_trace: Path, args: list[str], message: str) -> None:
    if "--columns" not in args:
        args = [*args, "--columns", COLUMNS]
    proc = gsim(str(queue_trace), "--policy", "fifo", *args)
    assert proc.returncode == 2
    assert proc.stderr.startswith(message.format(trace=queue_trace))
    assert proc.stderr.count("\n") == 1


def test_a_trace_that_is_not_utf8_is_refused_in_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "latin1.csv"
    trace.write_bytes(b"job_id,submission_time,duration,num_gpu\na,0,100,1\ncaf\xe9,5,100,1\n")
    proc = gsim(str(trace), "--cluster", "1x8", "--policy", "fifo")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == f"gsim: error: {trace}, line 3: not UTF-8 text (byte 0xe9); a trace must be UTF-8 (convert it: iconv -t UTF-8)\n"


def test_an_elasticflow_trace_with_a_bom_and_crlf_replays(tmp_path: Path) -> None:
    trace = tmp_path / "bom.csv"
    trace.write_bytes(b"\xef\xbb\xbfjob_id,submission_time,duration,num_gpu\r\na,0,100,1\r\nb,5,200,2\r\n")
    proc = gsim(str(trace), "--cluster", "1x8", "--policy", "fifo", "--json")
    assert proc.returncode == 0, proc.stderr
    assert '"jobs": 2' in proc.stdout


def test_a_trace_without_a_header_line_is_read_with_header(tmp_path: Path) -> None:
    """Alibaba PAI's tables have no header line (their names are in .header files): --header names the
    columns, and every line is a row; without it, the error says how."""
    trace = tmp_path / "pai_task.csv"
    trace.write_text("t1,0,100,1\nt2,5,200,2\n")
    columns = "job_id=name,arrival=submit,duration=run,gpus=gpu"
    proc = gsim(str(trace), "--cluster", "1x8", "--policy", "fifo", "--columns", columns, "--json",
                "--header", "name,submit,run,gpu")
    assert proc.returncode == 0, proc.stderr
    assert '"jobs": 2' in proc.stdout
    missing = gsim(str(trace), "--cluster", "1x8", "--policy", "fifo", "--columns", columns)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "no column 'submit' (for arrival) in the header (a file without a header line: give --header NAMES)" in \
        missing.stderr


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        ('[{"jobid": "a", "status": "Pass"}]', [], "JSON, not CSV: gsim reads a CSV of one job a row"),
        ("id,t,d,g,q\nj0,0,100,1,LS\n", ["--columns", "job_id=id,arrival=t,duration=d,gpus=g,qos=q"],
         "line 2: unknown QoS 'LS' (known: "),
        ("id,t,d,g\nj0,0,100,1\n", ["--header", "id,t,d,g"], "--header needs --columns"),
    ],
)
def test_other_formats_are_refused_in_one_line(tmp_path: Path, content: str, args: list[str], message: str) -> None:
    trace = tmp_path / "other.csv"
    trace.write_text(content)
    proc = gsim(str(trace), "--cluster", "1x8", "--policy", "fifo", *args)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_time_unit_reads_a_trace_in_milliseconds(tmp_path: Path) -> None:
    trace = tmp_path / "ms.csv"
    trace.write_text("job_id,submission_time,duration,num_gpu\n1,0,600000,1\n2,1000,1200000,1\n")
    proc = gsim(str(trace), "--cluster", "1x1", "--policy", "fifo", "--time-unit", "ms", "--json")
    assert proc.returncode == 0, proc.stderr
    [summary] = json.loads(proc.stdout)["policies"]
    assert summary["makespan_s"] == pytest.approx(1800.0)  # 600 s, then 1,200 s: read as milliseconds
    bad = gsim(str(trace), "--cluster", "1x1", "--time-unit", "days")
    assert bad.returncode == 2 and "--time-unit" in bad.stderr
