"""Security end to end, with real Unix users and real daemons.

Users: created here with useradd when the tests run as root (as in CI) and removed afterwards; without root
the user tests are skipped with the reason, and under CI=true a skip is a failure.

Running the CLI as those users: the project's virtual environment points at an interpreter under /root,
which other users cannot even traverse. Rather than loosen /root, each test session builds a throwaway
virtual environment from the system's world-executable python3.11 (same minor version, so the same
compiled wheels work) in a 0755 temporary directory; a one-line .pth file in it adds this project's
site-packages (world-readable, in the work tree) with site.addsitedir, which also runs the editable
install's own .pth hook. The CLI then runs as ``python -m garrison.cli.gsub`` with the user's uid, gid and
groups; nothing outside the temporary directory changes.

Also here: a controller and an agent with mutual TLS, where an agent with a certificate from another CA,
or presenting another node's name, never registers, while the right one runs a job.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.polling import wait_until
from helpers.ports import free_port

from .conftest import BIN, Cluster, start_cluster, stop_cluster

REPOSITORY = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

# Per pytest-xdist worker: two workers may each set up this module's fixtures at once, and one's teardown
# (pkill -u, userdel) must not kill the other's jobs.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
ALICE, BOB = USERS = (f"gsec{_WORKER}_alice", f"gsec{_WORKER}_bob")
SYSTEM_PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"required under CI=true: {reason}")
    pytest.skip(reason)


@dataclass
class User:
    name: str
    uid: int
    gid: int
    groups: list[int]
    home: Path
    work: Path  # a directory only this user can write


@dataclass
class Users:
    python: Path
    alice: User
    bob: User


def _venv_for_other_users(root: Path) -> Path:
    """A virtual environment any user can run, reusing this project's installed packages (see above)."""
    if not SYSTEM_PYTHON.exists():
        _skip_or_fail(f"{SYSTEM_PYTHON} (a world-executable interpreter of this Python version) is not installed")
    venv = root / "venv"
    subprocess.run([str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site_packages = sysconfig.get_paths()["purelib"]
    target = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (target / "garrison_project.pth").write_text(f"import site; site.addsitedir({site_packages!r})\n")
    return venv / "bin" / "python"


def _create_user(name: str, base: Path) -> User:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, capture_output=True,
                       timeout=60)
        entry = pwd.getpwnam(name)
    work = base / name
    work.mkdir(mode=0o700)
    os.chown(work, entry.pw_uid, entry.pw_gid)
    groups = sorted(set(os.getgrouplist(name, entry.pw_gid)))
    return User(name, entry.pw_uid, entry.pw_gid, groups, Path(entry.pw_dir), work)


@contextlib.contextmanager
def two_users(names: tuple[str, str], prefix: str) -> Iterator[Users]:
    """Two real Unix users (created with useradd, removed afterwards, with whatever they left running) and
    an interpreter they can run the project with; skipped (a failure under CI=true) where that cannot be."""
    if os.geteuid() != 0:
        _skip_or_fail("needs root to create the test users (useradd) and to start jobs as them")
    if shutil.which("useradd") is None:
        _skip_or_fail("useradd is not installed")
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        python = _venv_for_other_users(base)
        first, second = (_create_user(name, base) for name in names)
        probe = subprocess.run([str(python), "-c", "import garrison.cli.gsub, grpc"], user=first.uid,
                               group=first.gid, capture_output=True, text=True, timeout=60)
        if probe.returncode != 0:
            _skip_or_fail(f"the project's packages are not readable by other users: {probe.stderr.strip()[-300:]}")
        yield Users(python, first, second)
    finally:
        for name in names:
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True, timeout=30)
            subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def users() -> Iterator[Users]:
    with two_users(USERS, "gsec-") as both:
        yield both


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = start_cluster(["dgx-a100"])
    try:
        yield c
    finally:
        stop_cluster(c)


def run_as(users: Users, user: User, cluster: Cluster, command: str, *args: str,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A CLI command (gsub, gcancel, gadmin, ...) run by ``user`` with only their own rights."""
    environment = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(user.home),
        "USER": user.name,
        "LOGNAME": user.name,
        "GARRISON_CONTROLLER": cluster.env["GARRISON_CONTROLLER"],
        **(env or {}),
    }
    return subprocess.run(
        [str(users.python), "-m", f"garrison.cli.{command}", *args],
        user=user.uid, group=user.gid, extra_groups=user.groups, env=environment, cwd=str(user.work),
        capture_output=True, text=True, timeout=120,
    )


def submit_as(users: Users, user: User, cluster: Cluster, *args: str, env: dict[str, str] | None = None) -> str:
    proc = run_as(users, user, cluster, "gsub", "--parsable", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


# ------------------------------------------------------------------------------------ authorisation


def test_a_user_cannot_cancel_another_users_job(users: Users, cluster: Cluster) -> None:
    job = submit_as(users, users.alice, cluster, "-G", "1", "--wrap", "sleep 300")
    refused = run_as(users, users.bob, cluster, "gcancel", job)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"gcancel: error: permission denied: job {job} belongs to {ALICE}; only its owner may cancel it"
    )
    # Filters select only the caller's own jobs: bob asking for all of alice's cancels nothing.
    run_as(users, users.bob, cluster, "gcancel", "-u", ALICE)
    assert cluster.job(job)["state"] in ("PENDING", "CONFIGURING", "RUNNING")
    assert "refused CancelJobs" in (cluster.state_dir / "controller.log").read_text()
    allowed = run_as(users, users.alice, cluster, "gcancel", job)
    assert allowed.returncode == 0, allowed.stderr
    assert cluster.wait_done(job)["state"] == "CANCELLED"


def test_a_job_runs_as_its_user_and_its_output_belongs_to_them(users: Users, cluster: Cluster) -> None:
    alice = users.alice
    job = submit_as(users, alice, cluster, "-G", "1", "-o", "out-%j.txt", "--wrap",
                    'echo "uid=$(id -u) gid=$(id -g) groups=$(id -G) proc=$(ps -o user= -p $$)"')
    assert cluster.wait_done(job)["state"] == "COMPLETED"
    out = alice.work / f"out-{job}.txt"
    info = out.stat()
    assert (info.st_uid, info.st_gid) == (alice.uid, alice.gid)
    text = out.read_text()
    assert f"uid={alice.uid} gid={alice.gid}" in text
    assert set(text.split("groups=")[1].split(" proc=")[0].split()) == {str(g) for g in alice.groups}
    assert text.strip().endswith(f"proc={ALICE}")


def test_a_jobs_scratch_directory_is_its_users_alone_and_goes_with_it(users: Users, cluster: Cluster) -> None:
    """SLURM_TMPDIR: a directory of the job's own on its node that its user may write (a virtualenv goes
    there on the Alliance's clusters), that no other user may read, and that is gone once the job has ended."""
    alice = users.alice
    job = submit_as(users, alice, cluster, "-G", "1", "-o", "tmp-%j.txt", "--wrap",
                    'echo "tmp=$SLURM_TMPDIR"; stat -c "%U %a" "$SLURM_TMPDIR"; '
                    'echo data > "$SLURM_TMPDIR/x" && /usr/bin/python3 -m venv --without-pip "$SLURM_TMPDIR/env" '
                    '&& echo venv-ok; sleep 30')
    out = alice.work / f"tmp-{job}.txt"
    wait_until(lambda: out.exists() and "venv-ok" in out.read_text(), 60, what="the job to fill its scratch")
    lines = out.read_text().splitlines()
    scratch = Path(lines[0].removeprefix("tmp="))
    assert lines[1] == f"{ALICE} 700"
    peek = subprocess.run(["ls", str(scratch)], user=users.bob.uid, group=users.bob.gid, capture_output=True,
                          text=True, timeout=30)
    assert peek.returncode != 0 and "Permission denied" in peek.stderr
    cluster.run("gcancel", job)
    cluster.wait_done(job)
    wait_until(lambda: not scratch.exists() or None, 30, what="the scratch directory to be removed")


def test_a_job_cannot_write_where_its_user_cannot(users: Users, cluster: Cluster) -> None:
    target = users.bob.work / "stolen.txt"  # bob's private directory
    job = submit_as(users, users.alice, cluster, "-G", "1", "-o", str(target), "--wrap", "echo hi")
    assert cluster.wait_done(job)["state"] == "FAILED"
    assert not target.exists()
    # Nor inside root's directories, though the agent that starts it is root.
    job = submit_as(users, users.alice, cluster, "-G", "1", "-D", "/root", "--wrap", "touch /root/garrison-was-here")
    assert cluster.wait_done(job)["state"] == "FAILED"
    assert not Path("/root/garrison-was-here").exists()


def test_a_non_admin_cannot_run_admin_commands(users: Users, cluster: Cluster) -> None:
    refused = run_as(users, users.alice, cluster, "gadmin", "token", "issue", "--user", ALICE)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"gadmin: error: permission denied: only admins may issue tokens ({ALICE} is not an admin)"
    )
    refused = run_as(users, users.alice, cluster, "gadmin", "token", "revoke", "--user", BOB)
    assert refused.returncode == 1 and "only admins may revoke the tokens of others" in refused.stderr


def test_a_non_admin_cannot_set_a_quota(users: Users, cluster: Cluster) -> None:
    refused = run_as(users, users.alice, cluster, "gadmin", "quota", "set", "--account", "default", "--max-gpus", "1")
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith("gadmin: error: permission denied:"), refused.stderr
    assert "refused SetQuota" in (cluster.state_dir / "controller.log").read_text()


def test_the_fast_path_submits_as_whoever_runs_it_and_reads_only_what_they_may(users: Users,
                                                                                 cluster: Cluster) -> None:
    """The launchers (bin/gsub, bin/gqueue: cli/fastpath.py on the local socket) as a user without rights of
    their own: the controller takes the submitter from the socket's peer credentials, and the script is read
    by the client, so a script only root or another user can read is refused as gsub refuses it."""
    alice, bob = users.alice, users.bob
    bin_dir = users.python.parent
    for name in ("gsub", "gqueue"):
        shutil.copy(REPOSITORY / "bin" / name, bin_dir / name)
    environment = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "HOME": str(alice.home), "USER": alice.name,
        "LOGNAME": alice.name, "GARRISON_CONTROLLER": cluster.env["GARRISON_CONTROLLER"],
    }

    def as_alice(*argv: str, profile: bool = False) -> subprocess.CompletedProcess[str]:
        env = dict(environment, PYTHONPROFILEIMPORTTIME="1") if profile else environment
        return subprocess.run([str(bin_dir / argv[0]), *argv[1:]], user=alice.uid, group=alice.gid,
                              extra_groups=alice.groups, env=env, cwd=str(alice.work), capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)

    warm = as_alice("gsub", "--parsable", "-G", "1", "-o", "/dev/null", "--wrap", "true")  # learns the socket
    assert warm.returncode == 0, warm.stderr
    (alice.work / "mine.sh").write_text("#!/bin/sh\n#SBATCH -J alices-own\n#SBATCH -o /dev/null\ntrue\n")
    own = as_alice("gsub", "--parsable", "-G", "1", "mine.sh", profile=True)
    assert own.returncode == 0, own.stderr
    imported = {line.split("|")[-1].strip() for line in own.stderr.splitlines() if line.startswith("import time:")}
    assert "garrison.cli.fastpath" in imported and "grpc" not in imported, sorted(imported)
    job = cluster.job(own.stdout.strip())
    assert (job["user"], job["name"]) == (ALICE, "alices-own"), job

    secret = bob.work / "secret.sh"  # in bob's 0700 directory
    secret.write_text("#!/bin/sh\n#SBATCH -J bobs-secret\ntrue\n")
    os.chown(secret, bob.uid, bob.gid)
    secret.chmod(0o600)
    before = len(cluster.jobs())
    stolen = as_alice("gsub", "-G", "1", str(secret), profile=True)
    assert stolen.returncode == 2, stolen.stderr
    refusal = [line for line in stolen.stderr.splitlines() if not line.startswith("import time:")]
    assert refusal == [f"gsub: error: cannot read script {secret}: Permission denied"], stolen.stderr
    assert "garrison.cli.fastpath" in stolen.stderr  # refused by the fast path itself, not after a fallback
    assert len(cluster.jobs()) == before and all(j["name"] != "bobs-secret" for j in cluster.jobs())

    listed = as_alice("gqueue", "-u", ALICE, "-t", "all", profile=True)
    assert listed.returncode == 0, listed.stderr
    assert "grpc" not in listed.stderr and own.stdout.strip() in listed.stdout, listed.stdout


# ------------------------------------------------------------------------------------------- tokens


def _issue(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return cluster.run("gadmin", "token", "issue", *args, check=False)


def test_token_installed_for_a_user_speaks_for_them_until_revoked(users: Users, cluster: Cluster) -> None:
    bob = users.bob
    token_file = bob.home / ".config" / "garrison" / "token"
    # A link planted where the token goes must not make root write through it.
    bait = Path(tempfile.mkdtemp(prefix="gsec-bait-")) / "root-owned"
    bait.write_text("untouched\n")
    token_file.parent.mkdir(parents=True, exist_ok=True)
    for path in (bob.home / ".config", token_file.parent):
        os.chown(path, bob.uid, bob.gid)
    token_file.unlink(missing_ok=True)
    token_file.symlink_to(bait)
    os.lchown(token_file, bob.uid, bob.gid)

    issued = _issue(cluster, "--user", BOB, "--lifetime", "1h", "--install")
    assert issued.returncode == 0, issued.stderr
    assert bait.read_text() == "untouched\n"
    info = token_file.lstat()
    assert not token_file.is_symlink() and (info.st_uid, oct(info.st_mode & 0o777)) == (bob.uid, "0o600")

    as_token = {"GARRISON_TOKEN_FILE": str(token_file)}  # as from a login node: the token, not the kernel
    who = run_as(users, bob, cluster, "gadmin", "token", "whoami", env=as_token)
    assert who.stdout.startswith(f"{BOB} uid={bob.uid}") and "via token" in who.stdout, who.stderr
    job = submit_as(users, bob, cluster, "-G", "1", "--wrap", "id -u", env=as_token)
    assert cluster.job(job)["user"] == BOB

    token_id = next(line.split()[0] for line in cluster.run("gadmin", "token", "list", "-u", BOB).stdout
                    .splitlines()[1:] if "active" in line)
    cluster.run("gadmin", "token", "revoke", token_id)
    refused = run_as(users, bob, cluster, "gqueue", env=as_token)
    assert refused.returncode == 1
    assert refused.stderr.strip() == f"gqueue: error: not authenticated: token {token_id} of {BOB} was revoked"
    shutil.rmtree(bait.parent, ignore_errors=True)


def test_expired_and_forged_tokens_are_refused(users: Users, cluster: Cluster) -> None:
    bob = users.bob
    # The token to forge lives an hour: forged from a short-lived one, it could expire before the check and
    # be refused for that instead (the CLI reads the expiry before anything else).
    lasting = _issue(cluster, "--user", BOB, "--lifetime", "1h")
    assert lasting.returncode == 0, lasting.stderr
    genuine = lasting.stdout.strip()
    forged = genuine[:-4] + ("AAAA" if not genuine.endswith("AAAA") else "BBBB")
    refused = run_as(users, bob, cluster, "gqueue", env={"GARRISON_TOKEN": forged})
    assert refused.returncode == 1 and "signature does not match" in refused.stderr
    issued = _issue(cluster, "--user", BOB, "--lifetime", "1s")
    assert issued.returncode == 0, issued.stderr
    token = issued.stdout.strip()
    # Expiry is a matter of the clock: poll until the CLI reports it, which it does before any RPC. (A call
    # made just before the expiry may still pass the CLI's check and be refused by the controller instead,
    # "expired 0s ago": a refusal too, but not the one this test is about.)
    expired = wait_until(
        lambda: (p := run_as(users, bob, cluster, "gqueue", env={"GARRISON_TOKEN": token})).returncode == 1
            and "expired" in p.stderr and p,
        30, what="the token to expire",
    )
    if "expired at" not in expired.stderr:
        expired = run_as(users, bob, cluster, "gqueue", env={"GARRISON_TOKEN": token})
    assert "expired at" in expired.stderr and "ask an admin for a new one" in expired.stderr


# ------------------------------------------------------------------------------------ mutual TLS


@dataclass
class TlsCluster:
    root: Path
    env: dict[str, str]
    controller: subprocess.Popen[bytes]
    agents: list[subprocess.Popen[bytes]]

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def start_agent(self, name: str, node: str, cert: Path, key: Path) -> subprocess.Popen[bytes]:
        config = self.root / f"{name}.toml"
        config.write_text(
            (self.root / "garrison.toml").read_text()
            + f'\n[agent]\ncontroller = "{self.env["AGENT_ADDRESS"]}"\nnode_name = "{node}"\naddress = "127.0.0.1"\n'
            f'state_dir = "{self.root / name}"\nfake_topology = "pcie4"\n'
            f'cgroup_root = "garrison-test-{self.root.name}/{name}"\nallow_unconfined = true\n'
            f'tls_cert = "{cert}"\ntls_key = "{key}"\ntls_ca = "{self.root / "ca" / "ca.crt"}"\n'
        )
        with open(self.root / f"{name}.log", "wb") as log:
            agent = subprocess.Popen([str(BIN / "garrison-agent"), "--config", str(config)], stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.agents.append(agent)
        return agent


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[TlsCluster]:
    root = Path(tempfile.mkdtemp(prefix="gsec-tls-", dir="/tmp"))
    os.chmod(root, 0o755)
    (root / "work").mkdir(mode=0o777)
    os.chmod(root / "work", 0o777)
    gadmin = str(BIN / "gadmin")
    subprocess.run([gadmin, "cert", "init", "--dir", str(root / "ca"), "--name", "127.0.0.1"], check=True,
                   capture_output=True, timeout=60)
    for node in ("node1", "node2"):
        subprocess.run([gadmin, "cert", "issue-agent", node, "--dir", str(root / "ca")], check=True,
                       capture_output=True, timeout=60)
    subprocess.run([gadmin, "cert", "init", "--dir", str(root / "other-ca")], check=True, capture_output=True,
                   timeout=60)
    subprocess.run([gadmin, "cert", "issue-agent", "node1", "--dir", str(root / "other-ca")], check=True,
                   capture_output=True, timeout=60)
    address, agent_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    (root / "garrison.toml").write_text(
        f'[controller]\naddress = "{address}"\nagent_address = "{agent_address}"\n'
        f'database = "sqlite:///{root / "controller.db"}"\nstate_dir = "{root / "controller"}"\n'
        f'credential_socket = "{root / "auth.sock"}"\nlocal_socket = ""\n'
        f'key_file = "{root / "controller" / "credential.key"}"\n'
        f'tls_cert = "{root / "ca" / "controller.crt"}"\ntls_key = "{root / "ca" / "controller.key"}"\n'
        f'tls_ca = "{root / "ca" / "ca.crt"}"\nallow_root_jobs = true\nheartbeat_interval_s = 1.0\n'
        "heartbeat_timeout_s = 10.0\nschedule_interval_s = 0.2\n"
    )
    env = dict(os.environ, GARRISON_CONFIG=str(root / "garrison.toml"), XDG_CACHE_HOME=str(root / "cache"),
               AGENT_ADDRESS=agent_address, CLIENT_ADDRESS=address)
    env.pop("GARRISON_CONTROLLER", None)
    with open(root / "controller.log", "wb") as log:
        controller = subprocess.Popen([str(BIN / "garrison-controller"), "--config", str(root / "garrison.toml")],
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    cluster = TlsCluster(root, env, controller, [])
    try:
        wait_until(
            lambda: subprocess.run([str(BIN / "ginfo")], env=env, capture_output=True).returncode == 0
                or controller.poll() is not None,
            30, what="the TLS controller to serve",
        )
        assert controller.poll() is None, cluster.log("controller")
        yield cluster
    finally:
        for process in [*cluster.agents, controller]:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
        # Jobs outlive their agents: end them, and remove their cgroups and the agents' subtrees.
        configs = [str(path) for path in root.glob("*.toml") if path.name != "garrison.toml"]
        if configs:
            subprocess.run([sys.executable, "-m", "garrison.nodeagent.leftovers", *configs], capture_output=True,
                           timeout=120)
        shutil.rmtree(root, ignore_errors=True)


def _nodes(cluster: TlsCluster) -> list[str]:
    out = subprocess.run([str(BIN / "ginfo")], env=cluster.env, capture_output=True, text=True, timeout=60).stdout
    return [line.split()[0] for line in out.splitlines()[1:] if line.strip()]


def test_agents_without_the_right_certificate_never_register(tls_cluster: TlsCluster) -> None:
    root = tls_cluster.root
    tls_cluster.start_agent("impostor", "node1", root / "other-ca" / "agents" / "node1.crt",
                            root / "other-ca" / "agents" / "node1.key")
    tls_cluster.start_agent("wrong-name", "node1", root / "ca" / "agents" / "node2.crt",
                            root / "ca" / "agents" / "node2.key")
    wait_until(
        lambda: "the certificate of node 'node2' may not register as 'node1'" in tls_cluster.log("controller"),
        30, what="the controller to refuse the agent with node2's certificate",
    )
    wait_until(
        lambda: tls_cluster.log("impostor").count("link to controller") >= 2,
        30, what="the agent with another CA's certificate to fail its handshake",
    )
    assert _nodes(tls_cluster) == []


def test_the_certified_agent_registers_and_runs_a_job_over_mutual_tls(tls_cluster: TlsCluster) -> None:
    root = tls_cluster.root
    tls_cluster.start_agent("agent1", "node1", root / "ca" / "agents" / "node1.crt", root / "ca" / "agents" / "node1.key")
    wait_until(lambda: _nodes(tls_cluster) == ["node1"], 30, what="node1 to register over mutual TLS")
    env = tls_cluster.env
    submitted = subprocess.run([str(BIN / "gsub"), "--parsable", "-G", "1", "-o", "tls-%j.out", "--wrap", "echo over-tls"],
                               env=env, capture_output=True, text=True, cwd=str(root / "work"), timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()

    def state() -> str:
        out = subprocess.run([str(BIN / "gqueue"), "--json", "-j", job], env=env, capture_output=True, text=True,
                             timeout=60).stdout
        jobs = json.loads(out)["jobs"]
        return str(jobs[0]["state"]) if jobs and jobs[0]["state"] in ("COMPLETED", "FAILED", "CANCELLED") else ""

    assert wait_until(state, 60, what=f"job {job} to finish") == "COMPLETED"
    assert (root / "work" / f"tls-{job}.out").read_text() == "over-tls\n"
    # A plain-text client on the TLS port is refused with one clear line.
    plain = dict(env, GARRISON_CONTROLLER=env["CLIENT_ADDRESS"])
    refused = subprocess.run([str(BIN / "gqueue")], env=plain, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "set GARRISON_TLS_CA" in refused.stderr
