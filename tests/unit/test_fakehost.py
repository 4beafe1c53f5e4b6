"""A fake node's agent takes its node's name as its host name (nodeagent/fakehost.py)."""

from __future__ import annotations

import os
import socket

import pytest

from garrison.nodeagent.fakehost import take_node_name


@pytest.mark.skipif(os.geteuid() != 0, reason="a UTS namespace needs root")
def test_a_fake_node_names_its_processes_host_after_itself_and_leaves_the_hosts_alone() -> None:
    before = socket.gethostname()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the agent's process: its name, and its children's
        os.close(read)
        ok = take_node_name("node7")
        child = os.popen("hostname").read().strip()
        os.write(write, f"{ok} {socket.gethostname()} {child}".encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    assert answer == "True node7 node7"
    assert socket.gethostname() == before  # the host's own name is untouched


def test_without_root_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    before = socket.gethostname()
    assert take_node_name("node7") is False and socket.gethostname() == before
