#!/usr/bin/env python3
"""One user's 100,000-task array against another user's gqueue (issue 20). A script, not a test: prints
`key: value` lines.

    sudo python tests/benchmarks/big_array.py [--tasks 100000] [--script-kb 4] [--postgres URL]

Starts a real controller (its local socket, a SQLite store in a temporary directory, or PostgreSQL with
--postgres) and two real Unix users (useradd, once): `gbench_sub` submits one array of --tasks tasks and then
cancels it, each over the controller's local socket as gsub and gcancel send them; meanwhile `gbench_view`
runs what `gqueue --me` sends, on a new connection each time as a fresh gqueue does, back to back. Both
clients are processes of their own that took their user's uid, so the controller tells them apart by the
kernel's peer credentials, as in production. Prints the submission and cancellation times, the viewer's
latency p50/p99/max during each (and how many calls it made), and the store's size per task.

The bar (docs/security.md): the viewer's p99 under 300 ms on the project's 2-core machines.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.polling import wait_until  # noqa: E402
from helpers.ports import free_port  # noqa: E402

SUBMITTER, VIEWER = "gbench_sub", "gbench_view"
HEADER = struct.Struct("!I")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def ensure_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
        return pwd.getpwnam(name)


def call(path: str, method: str, request: dict[str, Any], timeout: float = 600.0) -> tuple[int, bytes]:
    """One request on a new connection to the local socket (what one CLI call does): (status, payload)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        name = f"{method}+json".encode()
        frame = bytes([len(name)]) + name + json.dumps(request).encode()
        sock.sendall(HEADER.pack(len(frame)) + frame)
        data = b""
        while len(data) < HEADER.size:
            data += sock.recv(HEADER.size - len(data)) or b"!"
        (length,) = HEADER.unpack(data[: HEADER.size])
        body = b""
        while len(body) < length:
            chunk = sock.recv(min(1 << 20, length - len(body)))
            if not chunk:
                raise ConnectionError("the controller closed the connection")
            body += chunk
    return body[0], body[1:]


def as_user(entry: pwd.struct_passwd, work: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        os.setgroups([])
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)
        return work()
    return run


def in_child(work: Callable[[], Any]) -> tuple[int, int]:
    """Fork; the child runs ``work`` and writes its JSON result to a pipe. Returns (pid, read end)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        code = 0
        try:
            result = work()
        except BaseException as exc:  # noqa: BLE001 (reported to the parent)
            result, code = {"error": repr(exc)}, 1
        with os.fdopen(write_end, "w") as out:
            json.dump(result, out)
        os._exit(code)
    os.close(write_end)
    return pid, read_end


def collect(pid: int, read_end: int) -> Any:
    with os.fdopen(read_end) as source:
        text = source.read()
    os.waitpid(pid, 0)
    result = json.loads(text)
    if isinstance(result, dict) and "error" in result:
        raise SystemExit(f"a client failed: {result['error']}")
    return result


def viewer_loop(path: str, stop_file: str) -> Callable[[], Any]:
    def run() -> list[tuple[float, float]]:
        samples: list[tuple[float, float]] = []  # (when it was sent, seconds to the answer)
        while not os.path.exists(stop_file):
            started = time.monotonic()
            status, payload = call(path, "ListJobs", {"users": [VIEWER]}, timeout=120)
            if status != 0:
                raise RuntimeError(f"gqueue failed: {payload[:200]!r}")
            samples.append((started, time.monotonic() - started))
        return samples
    return run


def submitter(path: str, tasks: int, script: str) -> Callable[[], Any]:
    def run() -> dict[str, float]:
        spec = {"name": "sweep", "command": [], "script": script, "workdir": "/tmp"}
        started = time.monotonic()
        status, payload = call(path, "SubmitJob", {"spec": spec, "array_indices": list(range(tasks))})
        submitted = time.monotonic()
        if status != 0:
            raise RuntimeError(f"submission failed: {payload[:300]!r}")
        job_id = json.loads(payload)["job_id"]
        time.sleep(2.0)  # a quiet moment between the two phases (the viewer keeps going)
        cancel_started = time.monotonic()
        status, payload = call(path, "CancelJobs", {"job_ids": [str(job_id)]})
        cancelled = time.monotonic()
        if status != 0:
            raise RuntimeError(f"cancel failed: {payload[:300]!r}")
        count = len(json.loads(payload).get("cancelled", []))
        return {"submit_start": started, "submit_end": submitted, "cancel_start": cancel_started,
                "cancel_end": cancelled, "cancelled": count, "job_id": job_id}
    return run


def phase(samples: list[tuple[float, float]], start: float, end: float) -> list[float]:
    """The latencies of the calls that overlapped [start, end]."""
    return [latency * 1000 for sent, latency in samples if sent <= end and sent + latency >= start]


def report(name: str, latencies: list[float]) -> None:
    if not latencies:
        print(f"gqueue_{name}_calls: 0")
        return
    print(f"gqueue_{name}_calls: {len(latencies)}")
    print(f"gqueue_{name}_p50_ms: {percentile(latencies, 50):.1f}")
    print(f"gqueue_{name}_p99_ms: {percentile(latencies, 99):.1f}")
    print(f"gqueue_{name}_max_ms: {max(latencies):.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--script-kb", type=int, default=4, help="the size of the array's batch script")
    parser.add_argument("--postgres", default="", help="a PostgreSQL URL (a fresh database) instead of SQLite")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (the controller's log)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the clients take two test users' uids (useradd gbench_sub gbench_view)")
    submit_user, view_user = ensure_user(SUBMITTER), ensure_user(VIEWER)

    root = Path(tempfile.mkdtemp(prefix="gbench-"))
    root.chmod(0o755)  # the users reach the socket inside
    sock_path = str(root / "controller.sock")
    database = args.postgres or f"sqlite:///{root / 'controller.db'}"
    config = root / "garrison.toml"
    config.write_text("\n".join([
        "[controller]",
        f'address = "127.0.0.1:{free_port()}"',
        f'database = "{database}"',
        f'state_dir = "{root / "state"}"',
        f'credential_socket = "{root / "auth.sock"}"',
        f'local_socket = "{sock_path}"',
        f'key_file = "{root / "state" / "credential.key"}"',
        f"max_array_size = {max(args.tasks, 1)}",
        "request_rate_per_s = 0",  # the viewer calls back to back: measure the controller, not the limiter
    ]) + "\n")
    log = open(root / "controller.log", "wb")  # noqa: SIM115 (closed at the end)
    controller = subprocess.Popen([sys.executable, "-m", "garrison.controller.main", "--config", str(config)],
                                  stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: os.path.exists(sock_path) and call(sock_path, "Hello", {})[0] == 0, 60,
                   what="the controller's local socket")
        script = "#!/bin/bash\n" + "#" * max(0, args.script_kb * 1024 - 40) + "\necho $SLURM_ARRAY_TASK_ID\n"
        # The viewer's own few jobs, so that its gqueue has something to show.
        for _ in range(3):
            collect(*in_child(as_user(view_user, lambda: call(
                sock_path, "SubmitJob", {"spec": {"name": "mine", "command": ["true"], "workdir": "/tmp"}})[0])))
        stop_file = str(root / "stop")
        viewer = in_child(as_user(view_user, viewer_loop(sock_path, stop_file)))
        time.sleep(1.0)  # the viewer's baseline, before the array
        times = collect(*in_child(as_user(submit_user, submitter(sock_path, args.tasks, script))))
        time.sleep(1.0)
        Path(stop_file).touch()
        samples = collect(*viewer)
        rss_kb = int(next(line.split()[1] for line in Path(f"/proc/{controller.pid}/status").read_text().splitlines()
                          if line.startswith("VmRSS:")))
    finally:
        controller.send_signal(signal.SIGTERM)
        controller.wait(timeout=60)
        log.close()

    print(f"tasks: {args.tasks}")
    print(f"script_bytes: {len(script)}")
    print(f"store: {'postgresql' if args.postgres else 'sqlite'}")
    print(f"submit_s: {times['submit_end'] - times['submit_start']:.2f}")
    print(f"cancel_s: {times['cancel_end'] - times['cancel_start']:.2f}")
    print(f"cancelled: {times['cancelled']}")
    report("before", phase(samples, samples[0][0], times["submit_start"]))
    report("during_submit", phase(samples, times["submit_start"], times["submit_end"]))
    report("during_cancel", phase(samples, times["cancel_start"], times["cancel_end"]))
    print(f"controller_rss_mb_at_end: {rss_kb / 1024:.0f}")
    if not args.postgres:
        db = root / "controller.db"
        size = db.stat().st_size + (db.with_name("controller.db-wal").stat().st_size
                                    if db.with_name("controller.db-wal").exists() else 0)
        print(f"sqlite_bytes_per_task: {size / max(args.tasks, 1):.0f}")
    if args.keep:
        print(f"kept: {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
