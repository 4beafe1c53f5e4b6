"""A controller engine driven by hand, as the RPC layer drives it: a real SQLite store, a manual clock, and one
node whose agent link keeps what the engine sends it (as the real session would put it on the agent's stream)."""

from __future__ import annotations

from pathlib import Path

from garrison.config import ControllerConfig
from garrison.controller.clock import ManualClock
from garrison.controller.commands import Registration
from garrison.controller.engine import Engine
from garrison.controller.state import ClusterState
from garrison.controller.store import open_store
from garrison.model.domain import Gpu, NodeInventory


class KeptLink:
    """An agent link that keeps every instruction it is sent."""

    def __init__(self, node: str) -> None:
        self.node, self.address, self.closed = node, "10.0.0.1", False
        self.sent: list[object] = []

    def send(self, instruction: object) -> None:
        self.sent.append(instruction)

    def close(self) -> None:
        self.closed = True


def engine_with_node(tmp_path: Path, *, gpus: int = 2, clock: ManualClock | None = None,
                     link: KeptLink | None = None, **settings: object) -> Engine:
    """An engine on ``tmp_path``'s SQLite store with node n1 (``gpus`` A100s, 4 CPUs, 4 GiB) connected through
    ``link`` (a new KeptLink by default); ``settings`` are ControllerConfig fields."""
    config = ControllerConfig(database=f"sqlite:///{tmp_path / 'c.db'}", state_dir=str(tmp_path),
                              **settings)  # type: ignore[arg-type]
    clock = clock if clock is not None else ManualClock(1000.0)
    state = ClusterState(open_store(config.database), config.heartbeat_timeout_s)
    state.load(clock.now(), config.finished_job_retention_s)
    engine = Engine(config, state, clock)
    inventory = NodeInventory("n1", tuple(Gpu(i, f"GPU-{i}", "A100", 40960, f"0000:{i:02x}:00.0", 0, "0-3")
                                          for i in range(gpus)), (), (), cpus=4, memory_mb=4096)
    engine.agent_connected(link if link is not None else KeptLink("n1"),  # type: ignore[arg-type]
                           Registration("n1", "10.0.0.1", inventory))
    return engine
