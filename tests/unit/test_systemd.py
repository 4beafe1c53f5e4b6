"""The systemd units, their tmpfiles and sysusers entries, the example configuration, and the daemons
started the way the units start them: the unit's own ExecStart= command line, with readiness received on
a real $NOTIFY_SOCKET datagram socket as systemd would receive it.

PID 1 here is not systemd, so what the units ask systemd to do is reproduced by hand where it matters:
KillMode=process means that stopping the agent signals its main process only, and the test then checks
that a running job outlives the agent and finishes under the restarted one.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_helpers import NotifySocket
from helpers.polling import wait_until
from helpers.ports import free_port

from garrison import sdnotify
from garrison.config import load_config

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "systemd"
BIN = Path(sys.executable).parent
INSTALLED_BIN = "/opt/garrison/bin/"
INSTALLED_CONFIG = "/etc/garrison/garrison.toml"
SERVICES = ("garrison-controller.service", "garrison-agent.service")


def need_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is missing (.ci/run installs Debian's systemd package)")
        pytest.skip(f"{name} is not installed (apt-get install systemd)")
    return path


def unit_settings(name: str) -> dict[str, dict[str, list[str]]]:
    """section -> key -> every value given (a key may repeat), from a unit file."""
    settings: dict[str, dict[str, list[str]]] = {}
    section = ""
    for raw in (UNITS / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            settings.setdefault(section, {})
            continue
        key, _, value = line.partition("=")
        settings[section].setdefault(key.strip(), []).append(value.strip())
    return settings


def service(name: str, key: str) -> str:
    (value,) = unit_settings(name)["Service"][key]
    return value


def exec_start(name: str, config: Path) -> list[str]:
    """The unit's ExecStart= argv, with the install prefix and the config path of this test."""
    argv = shlex.split(service(name, "ExecStart"))
    assert argv[0].startswith(INSTALLED_BIN), argv
    assert INSTALLED_CONFIG in argv, argv
    argv[0] = str(BIN / argv[0].removeprefix(INSTALLED_BIN))
    return [str(config) if arg == INSTALLED_CONFIG else arg for arg in argv]


def units_for_this_machine(directory: Path) -> list[Path]:
    """Copies of the units whose ExecStart points at this environment's executables (systemd-analyze
    verify checks that they exist); nothing else is changed."""
    copies = []
    for name in SERVICES:
        text = (UNITS / name).read_text()
        assert INSTALLED_BIN in text
        copy = directory / name
        copy.write_text(text.replace(INSTALLED_BIN, f"{BIN}/"))
        copies.append(copy)
    return copies


# -- the unit files --------------------------------------------------------------------------------------


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = need_tool("systemd-analyze")
    copies = units_for_this_machine(tmp_path)
    result = subprocess.run([tool, "verify", *map(str, copies)], capture_output=True, text=True, timeout=60)
    # verify exits 0 on unknown keys and merely prints them: any output at all is a finding.
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr


def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a misspelt key and a missing executable are reported."""
    tool = need_tool("systemd-analyze")
    broken = tmp_path / "broken.service"
    broken.write_text("[Service]\nType=notify\nKilMode=process\nExecStart=/nonexistent/garrison-agent\n")
    result = subprocess.run([tool, "verify", str(broken)], capture_output=True, text=True, timeout=60)
    assert "KilMode" in result.stderr and "/nonexistent/garrison-agent" in result.stderr


def test_controller_unit_is_hardened(tmp_path: Path) -> None:
    tool = need_tool("systemd-analyze")
    controller = units_for_this_machine(tmp_path)[0]
    result = subprocess.run([tool, "security", "--offline=yes", str(controller)], capture_output=True,
                            text=True, timeout=60)
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
    assert found, result.stdout + result.stderr
    # systemd rates 0 (fully confined) to 10 (unconfined); a default service scores 9.6.
    assert float(found.group(1)) <= 2.5, result.stdout
    settings = unit_settings("garrison-controller.service")["Service"]
    assert settings["User"] == ["garrison"] and settings["ProtectSystem"] == ["strict"]
    # It may write only where its state and sockets live (see garrison.tmpfiles and the example config).
    assert settings["ReadWritePaths"] == ["/var/lib/garrison/controller /run/garrison"]


def test_both_units_notify_and_restart_on_failure() -> None:
    for name in SERVICES:
        settings = unit_settings(name)["Service"]
        assert settings["Type"] == ["notify"] and settings["NotifyAccess"] == ["main"]
        assert settings["Restart"] == ["on-failure"]
        assert settings["RestartPreventExitStatus"] == ["2"]  # a configuration error
        assert unit_settings(name)["Install"]["WantedBy"] == ["multi-user.target"]


def test_agent_unit_leaves_jobs_alone() -> None:
    settings = unit_settings("garrison-agent.service")["Service"]
    assert settings["KillMode"] == ["process"]  # stop/restart signals the agent only, never the job cgroup
    assert settings["Delegate"] == ["yes"]  # the job cgroups below the unit's are the agent's to manage
    assert settings["OOMPolicy"] == ["continue"]  # a rank's OOM kill must not stop the unit
    assert settings["TasksMax"] == ["infinity"]
    assert "User" not in settings  # root: ranks start as their users
    # Ranks inherit the unit's namespaces: no sandboxing that would change what a job sees.
    assert not {"PrivateTmp", "ProtectHome", "ProtectSystem", "PrivateDevices"} & set(settings)


@pytest.mark.skipif(os.geteuid() != 0, reason="systemd-tmpfiles can only give files away as root")
def test_tmpfiles_and_sysusers_create_the_layout(tmp_path: Path) -> None:
    sysusers, tmpfiles = need_tool("systemd-sysusers"), need_tool("systemd-tmpfiles")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    subprocess.run([sysusers, f"--root={root}", str(UNITS / "garrison.sysusers")], check=True,
                   capture_output=True, timeout=60)
    passwd = {line.split(":")[0]: line.split(":") for line in (root / "etc/passwd").read_text().splitlines()}
    uid = int(passwd["garrison"][2])
    assert passwd["garrison"][6] in ("/usr/sbin/nologin", "/sbin/nologin")
    result = subprocess.run([tmpfiles, f"--root={root}", "--create", str(UNITS / "garrison.tmpfiles")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    expected = {
        "run/garrison": (0o755, uid),
        "var/lib/garrison": (0o755, 0),
        "var/lib/garrison/controller": (0o750, uid),
        "var/lib/garrison/agent": (0o711, 0),
        "var/log/garrison": (0o750, 0),
    }
    for path, (mode, owner) in expected.items():
        info = (root / path).stat()
        assert (info.st_mode & 0o7777, info.st_uid) == (mode, owner), path


def test_example_config_is_valid_and_matches_the_units() -> None:
    config = load_config(UNITS / "garrison.toml", environ={})
    writable = unit_settings("garrison-controller.service")["Service"]["ReadWritePaths"][0].split()
    controller_files = [config.controller.state_dir, config.controller.key_file, config.controller.credential_socket,
                        config.controller.local_socket]
    for path in controller_files:
        assert any(path == w or path.startswith(w + "/") for w in writable), path
    assert config.agent.state_dir == "/var/lib/garrison/agent"
    assert config.controller.metrics_address and config.agent.metrics_address
    assert config.controller.database.startswith("postgresql+psycopg://")
    # The default database lies where the hardened unit may write, too.
    default = load_config(_write(Path(tempfile.mkdtemp()) / "empty.toml", ""), environ={})
    assert default.controller.database == "sqlite:////var/lib/garrison/controller/controller.db"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- sd_notify -------------------------------------------------------------------------------------------


def is_ready(message: dict[str, str]) -> bool:
    return message.get("READY") == "1"


def test_sdnotify_sends_to_a_path_and_an_abstract_socket(tmp_path: Path) -> None:
    receiver = NotifySocket(tmp_path / "notify")
    try:
        assert sdnotify.notify({"READY": "1", "STATUS": "two\nlines"}, {"NOTIFY_SOCKET": str(receiver.path)})
        assert receiver.wait_for(is_ready, 5) == {"READY": "1", "STATUS": "two lines"}
    finally:
        receiver.close()
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"garrison-test-{os.getpid()}"
    abstract.bind("\0" + name)
    abstract.settimeout(5)
    try:
        assert sdnotify.notify({"STOPPING": "1"}, {"NOTIFY_SOCKET": "@" + name})
        assert abstract.recv(100) == b"STOPPING=1"
    finally:
        abstract.close()


def test_sdnotify_without_systemd_does_nothing(tmp_path: Path) -> None:
    assert not sdnotify.notify({"READY": "1"}, {})
    assert not sdnotify.notify({"READY": "1"}, {"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    assert not sdnotify.notify({"READY": "1"}, {"NOTIFY_SOCKET": "relative/path"})


# -- the daemons, started as the units start them ----------------------------------------------------------


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        return str(response.read().decode())


class Daemons:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.processes: list[subprocess.Popen[bytes]] = []
        self.controller_port, self.controller_metrics, self.agent_metrics = free_port(), free_port(), free_port()
        self.address = f"127.0.0.1:{self.controller_port}"
        root_jobs = "true" if os.geteuid() == 0 else "false"
        self.config = _write(base / "garrison.toml", f"""
[controller]
address = "{self.address}"
database = "sqlite:///{base}/controller/controller.db"
state_dir = "{base}/controller"
key_file = "{base}/controller/credential.key"
credential_socket = "{base}/auth.sock"
local_socket = "{base}/controller.sock"
metrics_address = "127.0.0.1:{self.controller_metrics}"
heartbeat_interval_s = 0.5
heartbeat_timeout_s = 10
schedule_interval_s = 0.2
allow_root_jobs = {root_jobs}
agent_uids = [{", ".join(str(u) for u in sorted({0, os.getuid()}))}]

[agent]
controller = "{self.address}"
node_name = "sd-node"
address = "127.0.0.1"
state_dir = "{base}/agent"
credential_socket = "{base}/auth.sock"
fake_topology = "pcie4"
metrics_address = "127.0.0.1:{self.agent_metrics}"
cgroup_root = "garrison-test-{base.name}"
allow_unconfined = true
""")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GARRISON_")}
        self.env.update(GARRISON_CONTROLLER=self.address, XDG_CACHE_HOME=str(base / "cache"),
                        PATH=f"{BIN}:{os.environ.get('PATH', '')}")

    def start(self, unit: str, notify: NotifySocket) -> subprocess.Popen[bytes]:
        env = dict(self.env, NOTIFY_SOCKET=str(notify.path))
        log = open(self.base / f"{unit}.log", "ab")  # noqa: SIM115 - the daemon writes it after we return
        with log:
            process = subprocess.Popen(exec_start(unit, self.config), env=env, stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=log, start_new_session=True)
        self.processes.append(process)
        return process

    def cli(self, *args: str) -> str:
        result = subprocess.run([str(BIN / args[0]), *args[1:]], env=self.env, capture_output=True, text=True,
                                timeout=60, cwd=self.base / "work")
        assert result.returncode == 0, f"{args}: {result.stderr}"
        return result.stdout

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in self.base.glob("*.log"))

    def stop_all(self) -> None:
        from garrison.nodeagent.containment.cgroup_v1 import remove_subtree
        from garrison.nodeagent.leftovers import kill_leftover_jobs

        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        kill_leftover_jobs(self.base / "agent")  # supervisors, ranks and their cgroups
        remove_subtree(f"garrison-test-{self.base.name}")


@pytest.fixture
def daemons() -> Iterator[Daemons]:
    base = Path(tempfile.mkdtemp(prefix="gsd-", dir="/tmp"))  # short: Unix socket paths are limited
    (base / "work").mkdir()
    os.chmod(base, 0o755)
    os.chmod(base / "work", 0o777)
    running = Daemons(base)
    try:
        yield running
    finally:
        running.stop_all()
        shutil.rmtree(base, ignore_errors=True)


def test_daemons_start_like_their_units_and_jobs_outlive_an_agent_restart(daemons: Daemons) -> None:
    base = daemons.base
    agent_notify = NotifySocket(base / "agent.notify")
    controller_notify = NotifySocket(base / "controller.notify")
    try:
        # The agent first, with no controller yet: it says why it is not ready, and is not.
        agent = daemons.start("garrison-agent.service", agent_notify)
        waiting = agent_notify.wait_for(lambda m: "STATUS" in m, 20)
        assert "no link to the controller" in waiting["STATUS"] and not is_ready(waiting)

        controller = daemons.start("garrison-controller.service", controller_notify)
        ready = controller_notify.wait_for(is_ready, 60)
        # Ready means serving: the very first request, over gRPC and over HTTP, is answered.
        assert ready["STATUS"].startswith(f"serving on {daemons.address}")
        daemons.cli("ginfo")
        assert "garrison_jobs" in scrape(daemons.controller_metrics)

        # The agent becomes ready once registered, and the node is then part of the cluster.
        assert "registered" in agent_notify.wait_for(is_ready, 30)["STATUS"]
        assert re.search(r"^sd-node\s+IDLE\s+0/4", daemons.cli("ginfo"), re.MULTILINE), daemons.cli("ginfo")

        job_id = daemons.cli("gsub", "--parsable", "-G", "2", "--wrap",
                             "touch started; sleep 3; touch finished").strip()
        wait_until(lambda: (base / "work" / "started").exists(), 30, what="the job's rank to start")
        job_metrics = wait_until(
            lambda: [
                line for line in scrape(daemons.agent_metrics).splitlines()
                if line.startswith("garrison_job_gpus{") and f'job="{job_id}"' in line
            ],
            30, what="the agent to show the job",
        )
        assert job_metrics[0].endswith(" 2.0"), job_metrics
        assert 'garrison_node_gpus_allocated{node="sd-node"} 2.0' in scrape(daemons.controller_metrics)

        # `systemctl restart garrison-agent` under KillMode=process: SIGTERM to the main process only.
        from garrison.nodeagent.supervisor import client as supervisor

        # The running attempt (a launch can fail and be retried as attempt 1, e.g. when its port is busy).
        job_dir = wait_until(
            lambda: next(
                (d for d in (base / "agent" / "jobs").glob(f"{job_id}.*") if supervisor.is_alive(d)), None),
            30, what="the job's supervisor",
        )
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0
        assert supervisor.is_alive(job_dir)  # the job's supervisor (and its rank) outlived the agent
        assert not (base / "work" / "finished").exists()
        restarted_notify = NotifySocket(base / "agent2.notify")
        try:
            daemons.start("garrison-agent.service", restarted_notify)
            restarted_notify.wait_for(is_ready, 30)
        finally:
            restarted_notify.close()
        assert daemons.cli("gjob", job_id, "--wait", "--timeout", "60").strip() == "COMPLETED"
        assert (base / "work" / "finished").exists()

        # Stopping: STOPPING=1, then a clean exit.
        controller.send_signal(signal.SIGTERM)
        controller_notify.wait_for(lambda m: m.get("STOPPING") == "1", 30)
        assert controller.wait(timeout=30) == 0
    except AssertionError as failure:
        raise AssertionError(f"{failure}\n--- daemon logs ---\n{daemons.logs()}") from None
    finally:
        agent_notify.close()
        controller_notify.close()
