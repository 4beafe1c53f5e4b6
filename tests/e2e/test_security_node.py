"""Issue 20, written as the attacks: a hostile local user on a node, or on the controller host, against
another user's jobs and against the root daemons. Real Unix users (useradd, removed afterwards), a real
cluster started by `garrison up` as root.

The users here are this module's own (gsn*_alice, gsn*_mallory, named per pytest worker), so that these
tests and test_security.py's may run at once on several workers without removing each other's accounts.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.polling import wait_until

from .conftest import BIN, Cluster, start_cluster, stop_cluster
from .test_security import User, Users, run_as, submit_as, two_users

pytestmark = pytest.mark.slow

# Per pytest-xdist worker: two workers may each set up this module's fixtures at once, and one's teardown
# (userdel) must not remove the accounts the other is using.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
NODE_USERS = (f"gsn{_WORKER}_alice", f"gsn{_WORKER}_mallory")


@pytest.fixture(scope="module")
def users() -> Iterator[Users]:
    """alice is the victim, mallory (in the Users' ``bob`` slot) the attacker."""
    with two_users(NODE_USERS, "gsn-") as both:
        yield both


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = start_cluster(["dgx-a100"], ["--agents", "1"])
    try:
        yield c
    finally:
        stop_cluster(c)


def as_user(user: User, *argv: str) -> subprocess.CompletedProcess[str]:
    """A plain command (cat, ls) run by ``user`` with only their own rights."""
    return subprocess.run(list(argv), user=user.uid, group=user.gid, extra_groups=user.groups,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(user.home)}, cwd=str(user.work),
                          capture_output=True, text=True, timeout=60)


def job_dir(cluster: Cluster, job_id: str) -> Path:
    return cluster.state_dir / "agent-1" / "jobs" / f"{job_id}.0"


# ---------------------------------------------------------------------------------- launch.json


def test_another_user_cannot_read_a_jobs_environment_on_its_node(users: Users, cluster: Cluster) -> None:
    """The critical finding: launch.json (the job's whole environment) was 0644 under a predictable name,
    and gsub exported GARRISON_TOKEN into it. mallory reads alice's token there, and speaks as alice."""
    alice, mallory = users.alice, users.bob
    issued = cluster.run("gadmin", "token", "issue", "--user", alice.name, "--lifetime", "1h")
    token = issued.stdout.strip()
    job = submit_as(users, alice, cluster, "-G", "1", "-o", "/dev/null", "--wrap", "sleep 300",
                    env={"GARRISON_TOKEN": token, "ALICE_SECRET": "hunter2"})
    try:
        directory = job_dir(cluster, job)
        launch = wait_until(lambda: (directory / "launch.json").exists() and directory / "launch.json", 60,
                            what="the attempt's launch.json")
        wait_until(lambda: (directory / "status.json").exists(), 60, what="the supervisor's status")
        # The attack: mallory knows the path (job id and attempt are public).
        stolen = as_user(mallory, "cat", str(launch))
        assert stolen.returncode != 0 and "Permission denied" in stolen.stderr, stolen.stdout[:200]
        assert "hunter2" not in stolen.stdout and token not in stolen.stdout
        # Nor can she list what the agent keeps for jobs, nor read any other file it wrote for this one.
        assert as_user(mallory, "ls", str(directory.parent)).returncode != 0
        assert as_user(mallory, "ls", str(directory)).returncode != 0
        for name in ("launch.json", "status.json", "supervisor.pid", "supervisor.log", "supervisor.lock"):
            path = directory / name
            if path.exists():
                assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, f"{name} is {path.stat().st_mode:o}"
                assert as_user(mallory, "cat", str(path)).returncode != 0, name
        # And gsub never put alice's token there in the first place (root can read the file).
        environment = json.loads(launch.read_text())["ranks"][0]["env"]
        assert environment["ALICE_SECRET"] == "hunter2" and "GARRISON_TOKEN" not in environment
    finally:
        run_as(users, alice, cluster, "gcancel", job)


# ------------------------------------------------------------------------------- torch error files


def _error_file_job(users: Users, cluster: Cluster, user: User, command: str) -> dict[str, object]:
    """A one-rank job that does ``command`` to its TORCHELASTIC_ERROR_FILE and fails; its final record."""
    job = submit_as(users, user, cluster, "--launch", "rank", "-G", "1", "-o", "/dev/null", "--wrap",
                    f'{command}; exit 3')
    return cluster.wait_done(job, timeout=60)


def test_a_symlinked_error_file_shows_nothing_of_a_root_file(users: Users, cluster: Cluster) -> None:
    """The root agent read the job's error file through a symlink: the content of a root-only JSON file
    appeared in the job's reason, which every user sees."""
    secret_dir = Path(tempfile.mkdtemp(prefix="gsn-root-"))
    try:
        secret = secret_dir / "secret.json"
        secret.write_text(json.dumps({"message": "ROOT-ONLY-SECRET"}))
        os.chmod(secret, 0o600)
        os.chmod(secret_dir, 0o755)
        assert as_user(users.bob, "cat", str(secret)).returncode != 0  # she cannot read it herself
        job = _error_file_job(users, cluster, users.bob, f'ln -s {secret} "$TORCHELASTIC_ERROR_FILE"')
        assert job["state"] == "FAILED"
        shown = cluster.run("gjob", str(job["job_id"])).stdout + json.dumps(job)
        assert "ROOT-ONLY-SECRET" not in shown
        # A hard link (where the kernel allows one) is not followed either: the file is not the job user's.
        # And the job's own error file is still read, so the check above is not vacuous.
        own = _error_file_job(users, cluster, users.bob,
                              'printf \'{"message": "mallory own error"}\' > "$TORCHELASTIC_ERROR_FILE"')
        assert "mallory own error" in str(own["reason"]), own
    finally:
        shutil.rmtree(secret_dir, ignore_errors=True)


def test_a_fifo_error_file_blocks_no_agent_and_no_other_users_job(users: Users, cluster: Cluster) -> None:
    """A FIFO as the error file blocked the agent's event loop on open(): the node went DOWN, alice's job
    there was requeued while its first run went on, and the node never came back."""
    alice_log = users.alice.work / "alice-run.log"
    victim = submit_as(users, users.alice, cluster, "-G", "1", "-o", str(alice_log), "--wrap",
                       "echo run $GARRISON_ATTEMPT; sleep 25; echo done")
    cluster.wait_state(victim, {"RUNNING"})
    fifo_job = _error_file_job(users, cluster, users.bob, 'mkfifo "$TORCHELASTIC_ERROR_FILE"')
    assert fifo_job["state"] == "FAILED" and "exited with 3" in str(fifo_job["reason"])
    nodes = cluster.run("ginfo").stdout
    assert "DOWN" not in nodes and "node1" in nodes, nodes
    job = cluster.wait_done(victim, timeout=90)
    assert job["state"] == "COMPLETED" and job["restart_count"] == 0, job
    assert alice_log.read_text().split() == ["run", "0", "done"]


# ------------------------------------------------------------------------------ daemons' own paths


def test_garrison_up_refuses_a_state_directory_another_user_made_first(users: Users) -> None:
    """mallory creates the state directory root is about to use, with a key of hers in it: root's
    `garrison up` accepted it, and with that key she could sign a credential for root."""
    mallory = users.bob
    planted = Path(tempfile.mkdtemp(prefix="gsn-planted-", dir="/tmp"))
    try:
        os.chown(planted, mallory.uid, mallory.gid)
        os.chmod(planted, 0o755)
        assert as_user(mallory, "mkdir", "-m", "700", str(planted / "controller")).returncode == 0
        made = as_user(mallory, "sh", "-c", f"head -c 32 /dev/urandom > {planted}/controller/credential.key && "
                                            f"chmod 600 {planted}/controller/credential.key")
        assert made.returncode == 0, made.stderr
        up = subprocess.run([str(BIN / "garrison"), "up", "--state-dir", str(planted)], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "GARRISON_CONTROLLER": ""})
        assert up.returncode != 0, up.stdout
        assert up.stderr.strip().count("\n") == 0, up.stderr
        assert f"--state-dir {planted} belongs to {mallory.name} (uid {mallory.uid})" in up.stderr
        assert not (planted / "controller.pid").exists() and not (planted / "garrison.toml").exists()
    finally:
        subprocess.run([str(BIN / "garrison"), "down", "--state-dir", str(planted)], capture_output=True, timeout=120)
        shutil.rmtree(planted, ignore_errors=True)


def test_the_database_its_wal_and_the_logs_are_not_readable_by_other_users(users: Users, cluster: Cluster) -> None:
    submit_as(users, users.alice, cluster, "-G", "1", "-o", "/dev/null", "--wrap", "echo alice-private-script")
    database = cluster.state_dir / "controller.db"
    wal = cluster.state_dir / "controller.db-wal"
    wait_until(lambda: wal.exists(), 30, what="SQLite's write-ahead log")
    for path in (database, wal, cluster.state_dir / "controller.log", cluster.state_dir / "agent-1.log"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, f"{path.name} is {stat.S_IMODE(path.stat().st_mode):o}"
        assert as_user(users.bob, "cat", str(path)).returncode != 0, path.name


# ---------------------------------------------------------------------------------- MASTER_PORT


def _squat(user: User, ports: list[int]) -> subprocess.Popen[str]:
    """``user`` binds and listens on ``ports`` (as torch's TCPStore would need them) until killed."""
    code = ("import socket, sys, time\n"
            "held = []\n"
            f"for port in {ports!r}:\n"
            "    s = socket.socket()\n"
            "    try:\n"
            "        s.bind(('0.0.0.0', port))\n"
            "    except OSError:\n"  # held already (another process's port, or a connection's): not free either
            "        s.close(); continue\n"
            "    s.listen(); held.append(s)\n"
            "print('ready', flush=True)\n"
            "time.sleep(600)\n")
    squatter = subprocess.Popen(["/usr/bin/python3", "-c", code], user=user.uid, group=user.gid,
                                stdout=subprocess.PIPE, text=True, cwd=str(user.work))
    assert squatter.stdout is not None and squatter.stdout.readline().strip() == "ready"
    return squatter


def test_another_user_cannot_predict_and_squat_a_jobs_master_port(users: Users, cluster: Cluster) -> None:
    """MASTER_PORT was 20000 + (job * 7919 + attempt * 104729) % 20000: mallory bound the ports of the next
    jobs' attempts, and their launches failed again and again."""
    probe = cluster.submit("-G", "1", "-o", "/dev/null", "--wrap", "true")
    cluster.wait_done(probe)
    upcoming = range(int(probe) + 1, int(probe) + 4)
    predicted = sorted({20000 + (job * 7919 + attempt * 104729) % 20000 for job in upcoming for attempt in range(3)})
    squatter = _squat(users.bob, predicted)
    try:
        job = submit_as(users, users.alice, cluster, "--launch", "rank", "-G", "2", "-o", "/dev/null", "--wrap",
                        'test "$MASTER_PORT" -ge 20000 && test "$MASTER_PORT" -le 32767')
        assert int(job) in upcoming
        done = cluster.wait_done(job, timeout=60)
        assert (done["state"], done["restart_count"]) == ("COMPLETED", 0), done
    finally:
        squatter.kill()
        squatter.wait()


def _free_rendezvous_port() -> int:
    import socket

    for port in range(31500, 32767):
        with socket.socket() as probe:
            try:
                probe.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port in 31500-32766")


def test_a_squatted_master_port_backs_off_and_fails_the_job_after_the_cap(users: Users, tmp_path: Path) -> None:
    """The worst case: every port of the range is taken (a range of one, here). The gang's launches back
    off (1 s, 2 s) and the third failure in a row ends the job FAILED saying why, instead of retrying it
    at once for ever; a one-rank job, which has nobody to rendezvous with, starts all the same."""
    port = _free_rendezvous_port()
    extra = tmp_path / "ports.toml"
    extra.write_text(f'rendezvous_ports = "{port}-{port}"\nmax_launch_failures = 3\n')
    narrow = start_cluster(["dgx-a100"], ["--agents", "1", "--extra-config", str(extra)])
    squatter = _squat(users.bob, [port])
    try:
        gang = submit_as(users, users.alice, narrow, "--launch", "rank", "-G", "2", "-o", "/dev/null",
                         "--wrap", "true")
        single = submit_as(users, users.alice, narrow, "-G", "1", "-o", "/dev/null", "--wrap", "echo $MASTER_PORT")
        assert narrow.wait_done(single, timeout=60)["state"] == "COMPLETED"
        failed = narrow.wait_done(gang, timeout=90)
        assert failed["state"] == "FAILED", failed
        assert failed["reason"] == (f"3 launches failed in a row, the last: launch failed: MASTER_PORT {port} "
                                    "is in use on this node"), failed["reason"]
        detail = narrow.run("gjob", gang).stdout
        assert detail.count("is in use") >= 3, detail
    finally:
        squatter.kill()
        squatter.wait()
        stop_cluster(narrow)


# ------------------------------------------------------------------ a listener in the controller's place

_FAKE_CONTROLLER = '''
import sys, grpc
from concurrent import futures
port, record = int(sys.argv[1]), sys.argv[2]

class Everything(grpc.GenericRpcHandler):
    def service(self, details):
        with open(record, "a") as out:
            out.write(repr((details.method, tuple(details.invocation_metadata))) + "\\n")
        def refuse(request, context):
            context.abort(grpc.StatusCode.UNAVAILABLE, "down for maintenance")
        return grpc.unary_unary_rpc_method_handler(refuse)

server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[Everything()])
server.add_insecure_port(f"127.0.0.1:{port}")
server.start()
print("ready", flush=True)
server.wait_for_termination()
'''


def test_a_fake_listener_on_the_controllers_port_receives_no_credential(users: Users) -> None:
    """With the controller down, mallory listens on its loopback port: the CLI sent her alice's cached
    bearer credential (and the agents their root one), which she replayed once the controller was back."""
    alice, mallory = users.alice, users.bob
    own = start_cluster(["dgx-a100"], ["--agents", "1"])
    fake: subprocess.Popen[str] | None = None
    record = mallory.work / "received.txt"
    try:
        grpc_only = {"GARRISON_TRANSPORT": "grpc"}
        # alice uses the cluster over TCP: her endpoints and her credential are cached in her home.
        assert run_as(users, alice, own, "gqueue", env=grpc_only).returncode == 0
        os.kill(own.pid("controller"), 15)
        wait_until(lambda: not Path(f"/proc/{own.pid('controller')}").exists(), 30, what="the controller to stop")
        port = own.env["GARRISON_CONTROLLER"].rpartition(":")[2]
        fake = subprocess.Popen([str(users.python), "-c", _FAKE_CONTROLLER, port, str(record)], user=mallory.uid,
                                group=mallory.gid, stdout=subprocess.PIPE, text=True, cwd=str(mallory.work))
        assert fake.stdout is not None and fake.stdout.readline().strip() == "ready"
        refused = run_as(users, alice, own, "gqueue", env=grpc_only)
        assert refused.returncode == 1
        assert refused.stderr.strip() == (
            f"gqueue: error: not sending a credential or token to {own.env['GARRISON_CONTROLLER']}: port {port} is "
            f"held by uid {mallory.uid}, not by root or you (the controller down and someone else listening in its "
            "place?)"), refused.stderr
        # The agent, retrying its link meanwhile, refuses too.
        agent_log = own.state_dir / "agent-1.log"
        wait_until(lambda: "not sending the agent's credential" in agent_log.read_text(), 30,
                   what="the agent to refuse the fake controller")
        received = record.read_text() if record.exists() else ""
        assert "x-garrison-credential" not in received and "x-garrison-token" not in received, received
    finally:
        if fake is not None:
            fake.kill()
            fake.wait()
        stop_cluster(own)


# --------------------------------------------------------------------- usage, Hello (the low findings)


def test_gacct_usage_shows_a_user_only_their_own(users: Users, cluster: Cluster) -> None:
    """`gacct --usage` showed every user's GPU-hours while `gadmin usage` was admin-only."""
    alice, mallory = users.alice, users.bob
    done = submit_as(users, alice, cluster, "-G", "1", "-o", "/dev/null", "--wrap", "true")
    cluster.wait_done(done)
    period = ("-S", "now-1days", "-E", "now+1days")
    mine = run_as(users, mallory, cluster, "gacct", "--usage", "--json", *period)
    assert mine.returncode == 0, mine.stderr
    assert {row["user"] for row in json.loads(mine.stdout)["usage"]} <= {mallory.name}
    theirs = run_as(users, mallory, cluster, "gacct", "--usage", "-u", alice.name, *period)
    assert theirs.returncode == 1
    assert theirs.stderr.strip() == (f"gacct: error: permission denied: the usage of {alice.name} is shown to admins "
                                     "only (gadmin usage); without -u you see your own")
    everyone = json.loads(cluster.run("gacct", "--usage", "--json", *period).stdout)  # root: an admin
    assert alice.name in {row["user"] for row in everyone["usage"]}


def test_hello_still_tells_callers_on_the_controller_host_where_the_sockets_are(cluster: Cluster) -> None:
    """Hello answers without authentication, so it names the local sockets only to callers on this host
    (a remote caller, which one host cannot play, is tests/unit/test_same_host.py)."""
    import grpc

    from garrison.protos.v1 import garrison_pb2 as pb
    from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc

    with grpc.insecure_channel(cluster.env["GARRISON_CONTROLLER"]) as channel:
        hello = pb_grpc.ControllerStub(channel).Hello(pb.HelloRequest(), timeout=10)
    assert hello.credential_socket.endswith("auth.sock") and hello.local_socket.endswith("controller.sock")


# ------------------------------------------------------------- a node given up for while its link stayed


def test_a_node_declared_down_on_an_open_stream_comes_back_with_its_heartbeats(users: Users) -> None:
    """An agent stalled past the heartbeat timeout (a job's FIFO once blocked it): its node went DOWN and
    its job was requeued, and once the agent went on, its heartbeats on the same stream never brought the
    node back. Now they make it register again: the node is UP, the left-behind first run is killed, and
    the job runs again there."""
    own = start_cluster(["dgx-a100"], ["--agents", "1"])
    agent = own.pid("agent-1")
    try:
        job = submit_as(users, users.alice, own, "-G", "1", "-o", str(users.alice.work / "stall-%j.out"),
                        "--wrap", "echo run $GARRISON_ATTEMPT; sleep 20")
        own.wait_state(job, {"RUNNING"})
        os.kill(agent, 19)  # SIGSTOP: the agent stalls, its TCP stream stays open
        try:
            wait_until(lambda: "DOWN" in own.run("ginfo").stdout, 60, what="the stalled node to be DOWN")
        finally:
            os.kill(agent, 18)  # SIGCONT
        wait_until(lambda: "DOWN" not in own.run("ginfo").stdout, 30, what="the node to come back UP")
        assert own.pid("agent-1") == agent  # the same agent process, not a restart
        # The controller closed the silent node's stream when it declared it DOWN (fencing, issue 19), or the
        # heartbeats on the open stream asked it to register again: either way the same agent is back. Its
        # attempt was kept (back within the node lease) or requeued after being fenced: it completes.
        done = own.wait_done(job, timeout=90)
        assert done["state"] == "COMPLETED" and done["restart_count"] <= 1, done
    finally:
        stop_cluster(own)
