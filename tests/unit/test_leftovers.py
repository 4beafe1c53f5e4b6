"""The agent's leftover-job killer that `garrison down` runs as a program (the e2e test test_down.py runs
it over a real cluster): what it says about a bad configuration, and a state dir with no jobs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from garrison.nodeagent.leftovers import kill_leftover_jobs


def test_an_agent_that_never_ran_a_job_leaves_nothing(tmp_path: Path) -> None:
    assert kill_leftover_jobs(tmp_path / "agent-1") == 0


def test_an_unreadable_config_is_one_line_and_exit_status_2(tmp_path: Path) -> None:
    missing = tmp_path / "agent-1.toml"
    done = subprocess.run([sys.executable, "-m", "garrison.nodeagent.leftovers", str(missing)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("garrison.nodeagent.leftovers: ") and str(missing) in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
