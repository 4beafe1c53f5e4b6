"""Operations settings: environment overrides, metrics and pool keys, every key documented; and the
one-line structured log format."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import pytest

from garrison.config import ENV_OVERRIDES, ConfigError, load_config
from garrison.logs import OneLineFormatter, kv, stderr_is_journal, without_traceback

REPO = Path(__file__).resolve().parents[2]
CONFIG_SOURCE = REPO / "garrison" / "config" / "sections.py"  # where every section's keys are read
DOCS = REPO / "docs"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "garrison.toml"
    path.write_text(text)
    return path


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[controller]\ndatabase = "sqlite:////tmp/file.db"\naddress = "127.0.0.1:7000"\n'
                           '[agent]\nnode_name = "from-file"\n')
    environ = {
        "GARRISON_DATABASE": "postgresql+psycopg://garrison@db:5432/garrison",
        "GARRISON_CONTROLLER_ADDRESS": "127.0.0.1:7100",
        "GARRISON_CONTROLLER_METRICS_ADDRESS": "127.0.0.1:9817",
        "GARRISON_AGENT_CONTROLLER": "127.0.0.1:7100",
        "GARRISON_NODE_NAME": "gpu017",
        "GARRISON_AGENT_ADDRESS": "10.0.0.17",
        "GARRISON_AGENT_METRICS_ADDRESS": "0.0.0.0:9818",
    }
    config = load_config(path, environ=environ)
    assert config.controller.database == "postgresql+psycopg://garrison@db:5432/garrison"
    assert config.controller.address == "127.0.0.1:7100"
    assert config.controller.metrics_address == "127.0.0.1:9817"
    assert (config.agent.controller, config.agent.node_name, config.agent.address) == (
        "127.0.0.1:7100", "gpu017", "10.0.0.17")
    assert config.agent.metrics_address == "0.0.0.0:9818"
    # Unset or empty variables leave the file's values.
    config = load_config(path, environ={"GARRISON_DATABASE": ""})
    assert config.controller.database == "sqlite:////tmp/file.db" and config.agent.node_name == "from-file"
    # Without the section in the file at all, the override still applies.
    assert load_config(write(tmp_path, ""), environ={"GARRISON_NODE_NAME": "n9"}).agent.node_name == "n9"


def test_a_bad_override_names_the_variable(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    with pytest.raises(ConfigError) as error:
        load_config(path, environ={"GARRISON_CONTROLLER_ADDRESS": "nowhere"})
    message = str(error.value)
    assert message.startswith(f"{path}: controller.address: expected HOST:PORT")
    assert message.endswith("(set by the environment variable GARRISON_CONTROLLER_ADDRESS)")
    with pytest.raises(ConfigError, match="agent.metrics_address: expected HOST:PORT.*GARRISON_AGENT_METRICS"):
        load_config(path, environ={"GARRISON_AGENT_METRICS_ADDRESS": "9818"})


def test_operations_keys_are_validated(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[controller]\ndatabase_pool_size = 20\ndatabase_max_overflow = 0\n"
                                         "database_pool_timeout_s = 2.5\ndatabase_pool_recycle_s = 600\n"), environ={})
    assert (config.controller.database_pool_size, config.controller.database_max_overflow) == (20, 0)
    assert (config.controller.database_pool_timeout_s, config.controller.database_pool_recycle_s) == (2.5, 600.0)
    for text, message in [
        ("[controller]\ndatabase_pool_size = 0\n", "controller.database_pool_size: must be at least 1"),
        ('[controller]\ndatabase_pool_size = "5"\n', "controller.database_pool_size: expected int"),
        ('[controller]\nmetrics_address = "9817"\n', "controller.metrics_address: expected HOST:PORT"),
        ('[agent]\nmetrics_address = "host:port"\n', "agent.metrics_address: expected HOST:PORT"),
        ('[agent]\njob_devices = "all"\n', "agent.job_devices: one of 'gpus', 'allowlist' (not 'all')"),
        ('[agent]\nscratch_dir = "scratch"\n', "agent.scratch_dir: must be an absolute path (not 'scratch')"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(write(tmp_path, text), environ={})


def config_keys() -> set[str]:
    """Every key the configuration parser reads, found in its source."""
    source = CONFIG_SOURCE.read_text()
    return set(re.findall(r'(?:get_\w+|_get|_optional_int|weight)\((?:\w, )?"(\w+)"', source))


def test_every_setting_and_override_is_documented() -> None:
    documented = "\n".join(path.read_text() for path in DOCS.glob("*.md"))
    rows = set(re.findall(r"^\| `([a-z_]+)`", documented, re.MULTILINE))
    keys = config_keys()
    assert {"database", "metrics_address", "database_pool_size", "node_name"} <= keys  # the scan works
    missing = sorted(keys - rows)
    assert not missing, f"settings with no row (| `key` | default | meaning |) in docs/*.md: {missing}"
    undocumented = sorted(v for v in ENV_OVERRIDES if f"`{v}`" not in documented)
    assert not undocumented, f"environment overrides missing from docs/: {undocumented}"


# -- structured logs --------------------------------------------------------------------------------------


def record(message: str, *args: object, exc_info: object = None) -> logging.LogRecord:
    return logging.LogRecord("garrison.controller", logging.WARNING, __file__, 1, message, args,
                             exc_info)  # type: ignore[arg-type]


def test_kv_quotes_what_needs_it() -> None:
    assert kv(job=12, node="n1", reason="") == "job=12 node=n1 reason=-"
    assert kv(reason='rank 0 exited with 3: "boom"') == 'reason="rank 0 exited with 3: \\"boom\\""'
    assert kv(error="two\nlines", path="a=b") == 'error="two\\nlines" path="a=b"'


def test_every_event_is_one_line() -> None:
    formatter = OneLineFormatter("controller", journal=False)
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        line = formatter.format(record("job %s failed\nbadly", kv(job=3, node="n1"), exc_info=sys.exc_info()))
    assert "\n" not in line
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} controller\[\d+\] WARNING garrison.controller: "
                    r"job job=3 node=n1 failed\\nbadly exception=\"Traceback", line), line
    assert "ValueError: bad\\\\nthing" in line or "ValueError: bad\\nthing" in line


def test_sqlalchemys_pool_reset_failure_is_its_line_and_the_errors_last_line() -> None:
    # When PostgreSQL drops a connection mid-write, SQLAlchemy's pool logs its failed ROLLBACK with a traceback
    # the store has already dealt with (test_store_faults asserts the controller's log holds no traceback).
    formatter = OneLineFormatter("controller", journal=False)
    try:
        raise OSError("sending query failed: cannot exit pipeline mode while busy\nPQsendQuery not allowed")
    except OSError:
        pool_record = record("Exception during reset or similar", exc_info=sys.exc_info())
    assert without_traceback(pool_record)
    line = formatter.format(pool_record)
    assert "Traceback" not in line and line.endswith(
        "Exception during reset or similar: OSError: sending query failed: cannot exit pipeline mode while busy"), line


def test_journal_lines_carry_the_priority() -> None:
    formatter = OneLineFormatter("agent", journal=True)
    assert formatter.format(record("node %s down", "n1")) == "<4>WARNING garrison.controller: node n1 down"
    error = record("x")
    error.levelno, error.levelname = logging.ERROR, "ERROR"
    assert formatter.format(error).startswith("<3>ERROR ")


def test_journal_detection(tmp_path: Path) -> None:
    assert not stderr_is_journal({})
    assert not stderr_is_journal({"JOURNAL_STREAM": "garbage"})
    import os

    info = os.fstat(sys.stderr.fileno())
    assert stderr_is_journal({"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}"})
    assert not stderr_is_journal({"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino + 1}"})


# -- the command reference ------------------------------------------------------------------------------------


def console_scripts() -> dict[str, str]:
    """Every installed command -> "module:main" of the code that parses its options: pyproject's console
    scripts, and the launchers in bin/ (scripts/gen_launchers.py), by their full path's module."""
    import importlib.util
    import tomllib

    spec = importlib.util.spec_from_file_location("gen_launchers", REPO / "scripts" / "gen_launchers.py")
    assert spec is not None and spec.loader is not None
    launchers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launchers)
    scripts = dict(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
    return scripts | {name: f"{full}:main" for name, (_, _, full) in launchers.LAUNCHERS.items()}


def test_every_command_and_option_is_in_the_reference() -> None:
    reference = (DOCS / "reference.md").read_text()
    headings = set(re.findall(r"^## (.+)$", reference, re.MULTILINE))
    for script in console_scripts():
        assert any(h == script or h.startswith(f"{script} ") for h in headings), f"no section for {script}"
    # Every option of the user commands is described (others document theirs in their own pages).
    for script in ("gsub", "gqueue", "gcancel", "gjob", "ginfo", "gacct", "gcontrol", "garrison"):
        for option in command_options(script):
            assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", reference), (
                f"{script}: option {option} is not in docs/reference.md")


def command_options(script: str) -> list[str]:
    """Every option of a console script but --help: gsub's and gqueue's argparse parsers, the others' click
    commands (and their subcommands)."""
    import importlib

    import click

    if script == "gsub":
        from garrison.cmdline.submission import option_strings

        return [o for o in option_strings() if o not in ("-h", "--help")]
    if script == "gqueue":
        from garrison.cli.gqueue import parser

        return [o for action in parser()._actions for o in action.option_strings if o not in ("-h", "--help")]
    module = importlib.import_module(console_scripts()[script].partition(":")[0])
    commands = [v for v in vars(module).values() if isinstance(v, click.Command)]
    assert commands, script
    options: list[str] = []
    stack = list(commands)
    while stack:
        command = stack.pop()
        if isinstance(command, click.Group):
            stack.extend(command.commands.values())
        for param in command.params:
            if isinstance(param, click.Option) and "--help" not in param.opts:
                options += [*param.opts, *param.secondary_opts]
    return options


def test_migrate_says_what_it_did(tmp_path: Path) -> None:
    import subprocess

    controller = str(Path(sys.executable).parent / "garrison-controller")
    config = write(tmp_path, f'[controller]\ndatabase = "sqlite:///{tmp_path}/db/controller.db"\n')

    def migrate(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([controller, "--config", str(path), "migrate"], capture_output=True, text=True,
                              timeout=60, env={"PATH": "/usr/bin:/bin"})

    first, second = migrate(config), migrate(config)
    assert first.returncode == 0 and re.fullmatch(r"database sqlite migrated from empty to (\w+) \(latest: \1\)\n",
                                                  first.stdout), first.stdout + first.stderr
    assert second.returncode == 0 and "is at the latest schema" in second.stdout and "nothing to do" in second.stdout
    assert "setup plugin" not in first.stderr and "Running upgrade" in first.stderr
    bad = migrate(write(tmp_path, '[controller]\ndatabase = "mysql://root@db/garrison"\n'))
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and bad.stderr.strip() == (
        f"garrison-controller: {tmp_path}/garrison.toml: controller.database: unsupported database URL "
        "'mysql://root@db/garrison': expected sqlite:///path/to/file.db or postgresql+psycopg://user@host:port/database")


def test_fake_cpus_is_read_and_written_by_garrison_up(tmp_path: Path) -> None:
    from garrison.cli.up import _write_configs

    config = load_config(write(tmp_path, '[agent]\nfake_topology = "dgx1v"\nfake_cpus = 80\n'), environ={})
    assert config.agent.fake_cpus == 80
    assert load_config(write(tmp_path, "[agent]\n"), environ={}).agent.fake_cpus == 0  # the host's CPUs
    with pytest.raises(ConfigError, match="agent.fake_cpus"):
        load_config(write(tmp_path, "[agent]\nfake_cpus = -1\n"), environ={})
    state = tmp_path / "state"
    state.mkdir()
    _write_configs(state, ["dgx1v"], fake_cpus=64)
    assert load_config(state / "agent-1.toml", environ={}).agent.fake_cpus == 64


def test_garrison_ups_extra_config_may_replace_a_key_it_sets_itself(tmp_path: Path) -> None:
    from garrison.cli.up import _write_configs

    state = tmp_path / "state"
    state.mkdir()
    extra = "heartbeat_interval_s = 5.0\nrequest_rate_per_s = 0\n\n[controller.scheduler]\npreemption = true\n"
    _write_configs(state, ["dgx1v"], extra=extra)
    config = load_config(state / "garrison.toml", environ={})
    assert config.controller.heartbeat_interval_s == 5.0  # garrison up's own is 1 s: the extra file's wins
    assert config.controller.heartbeat_timeout_s == 10.0 and config.controller.scheduler.preemption
