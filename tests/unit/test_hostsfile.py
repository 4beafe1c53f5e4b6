"""garrison up's block in /etc/hosts, edited on a temporary file."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from garrison.cli.hostsfile import edit_block, node_address, update_hosts

BASE = "127.0.0.1 localhost\n::1 localhost ip6-localhost\n"
A, B = Path("/tmp/gc-a"), Path("/tmp/gc-b")


def test_a_block_is_added_replaced_and_removed_leaving_the_rest_alone() -> None:
    one = edit_block(BASE, A, [("127.0.1.1", "node1")])
    assert one == BASE + "# BEGIN garrison local cluster /tmp/gc-a\n127.0.1.1 node1\n# END garrison local cluster /tmp/gc-a\n"
    two = edit_block(one, A, [("127.0.1.1", "node1"), ("127.0.1.2", "node2")])
    assert two.count("BEGIN") == 1 and "127.0.1.2 node2\n" in two
    assert edit_block(two, A, []) == BASE


def test_clusters_keep_their_own_blocks() -> None:
    both = edit_block(edit_block(BASE, A, [("127.0.1.1", "node1")]), B, [("127.0.1.1", "node1")])
    assert both.count("BEGIN") == 2
    without_a = edit_block(both, A, [])
    assert "/tmp/gc-a" not in without_a and "BEGIN garrison local cluster /tmp/gc-b\n" in without_a
    # A cluster whose state dir is a prefix of another's is another cluster.
    assert edit_block(edit_block(BASE, Path("/tmp/gc"), [("127.0.1.1", "node1")]), A, []).count("BEGIN") == 1


def test_a_name_resolves_to_one_line_however_many_clusters_list_it() -> None:
    """Two clusters up at once both name node1: one live line, so `hostname -i` prints one address; when the
    cluster with the live line goes, the other's copy is live again."""
    both = edit_block(edit_block(BASE, A, [("127.0.1.1", "node1")]), B, [("127.0.1.1", "node1"), ("127.0.1.2", "node2")])
    live = [line for line in both.splitlines() if line and not line.startswith("#")]
    assert live == ["127.0.0.1 localhost", "::1 localhost ip6-localhost", "127.0.1.1 node1", "127.0.1.2 node2"]
    assert "#also 127.0.1.1 node1" in both.splitlines()
    only_b = edit_block(both, A, [])
    assert [line for line in only_b.splitlines() if "node" in line and not line.startswith("#")] == [
        "127.0.1.1 node1", "127.0.1.2 node2"]
    assert edit_block(only_b, B, []) == BASE


def test_a_file_without_a_final_newline_stays_valid() -> None:
    assert edit_block("127.0.0.1 localhost", A, [("127.0.1.1", "node1")]).startswith("127.0.0.1 localhost\n# BEGIN")


def test_node_addresses_are_distinct_loopback_addresses() -> None:
    assert [node_address(i) for i in (1, 2, 64)] == ["127.0.1.1", "127.0.1.2", "127.0.1.64"]
    with pytest.raises(ValueError):
        node_address(0)


def test_update_replaces_the_file_atomically_and_keeps_its_mode(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(BASE)
    hosts.chmod(0o644)
    inode = hosts.stat().st_ino
    assert update_hosts(A, [("127.0.1.1", "node1")], hosts)
    assert hosts.stat().st_ino != inode and hosts.stat().st_mode & 0o777 == 0o644  # a new file, renamed over
    assert not update_hosts(A, [("127.0.1.1", "node1")], hosts)  # unchanged: not rewritten
    assert update_hosts(A, [], hosts) and hosts.read_text() == BASE
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hosts.garrison.lock", "hosts"]


def test_concurrent_clusters_lose_no_block(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(BASE)
    dirs = [Path(f"/tmp/gc-{i}") for i in range(8)]
    threads = [threading.Thread(target=update_hosts, args=(d, [("127.0.1.1", "node1")], hosts)) for d in dirs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    text = hosts.read_text()
    assert all(f"BEGIN garrison local cluster {d}\n" in text for d in dirs)
