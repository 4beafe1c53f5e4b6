"""controller/rendezvous.py: MASTER_PORT unpredictable, stable per attempt, in range, no collision on a node."""

from __future__ import annotations

from pathlib import Path

import pytest

from garrison.config import ConfigError, load_config
from garrison.controller.rendezvous import RendezvousPorts, ephemeral_range, port_secret, warn_if_ephemeral


def test_ports_are_stable_per_attempt_in_range_and_depend_on_the_secret() -> None:
    ports = RendezvousPorts(port_secret(b"k" * 32))
    again = RendezvousPorts(port_secret(b"k" * 32))  # a restarted controller, same key
    other = RendezvousPorts(port_secret(b"x" * 32))  # another cluster on the same host
    chosen = [ports.port_for(job, attempt) for job in range(1, 200) for attempt in range(3)]
    assert chosen == [again.port_for(job, attempt) for job in range(1, 200) for attempt in range(3)]
    assert all(20000 <= port <= 32767 for port in chosen)
    assert len(set(chosen)) > 500  # spread, not a handful of values
    # The old formula (20000 + (job * 7919 + attempt * 104729) % 20000) no longer tells anyone the port.
    old = [20000 + (job * 7919 + attempt * 104729) % 20000 for job in range(1, 200) for attempt in range(3)]
    assert sum(a == b for a, b in zip(chosen, old, strict=True)) < 3
    assert sum(a == b for a, b in zip(chosen, [other.port_for(j, a) for j in range(1, 200) for a in range(3)],
                                      strict=True)) < 3


def test_a_port_taken_by_another_live_attempt_on_the_head_node_is_skipped() -> None:
    ports = RendezvousPorts(b"s" * 32, (31000, 31003))
    first = ports.port_for(7, 0)
    second = ports.port_for(7, 0, taken={first})
    assert second != first and 31000 <= second <= 31003
    assert ports.port_for(7, 0, taken={31000, 31001, 31002, 31003}) == first  # all taken: it will fail, then retry


def test_the_range_is_configured_and_checked_against_the_ephemeral_ports(tmp_path: Path) -> None:
    config = tmp_path / "g.toml"
    config.write_text('[controller]\nrendezvous_ports = "40000-40100"\n')
    assert load_config(config).controller.rendezvous_ports == (40000, 40100)
    assert load_config(config).controller.max_launch_failures == 5
    for bad in ("80-90", "30000-20000", "20000", "a-b", "20000-70000"):
        config.write_text(f'[controller]\nrendezvous_ports = "{bad}"\n')
        with pytest.raises(ConfigError, match="rendezvous_ports: expected LOW-HIGH"):
            load_config(config)
    assert warn_if_ephemeral((20000, 32767), (32768, 60999)) is None
    assert "overlaps this host's ephemeral ports 32768-60999" in str(warn_if_ephemeral((20000, 39999), (32768, 60999)))
    local = ephemeral_range()
    assert local is None or local[0] <= local[1]
