"""Both Prometheus endpoints, scraped over real HTTP and parsed with prometheus-client's own parser.

The controller's: a ClusterState on a real SQLite store, driven through submissions, starts and ends, with
its gauges sampled on the event loop that owns the state. The agent's: the fake NVML library reporting
load on some GPUs, and real job attempts under real supervisors in a state directory.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.polling import wait_until
from prometheus_client.parser import text_string_to_metric_families

from garrison.controller import metrics
from garrison.controller.clock import ManualClock
from garrison.controller.state import ClusterState
from garrison.controller.store import open_store
from garrison.machines.description import fake_gpu_uuid, load_description, resolve_topology
from garrison.metrics_server import serve_metrics, split_address
from garrison.model.domain import (
    Allocation,
    Gpu,
    Job,
    JobSpec,
    JobState,
    NodeAllocation,
    NodeInventory,
    NodeResult,
    RankOutcome,
)
from garrison.model.launch import LaunchDescription
from garrison.nodeagent.gpu import fake_nvml
from garrison.nodeagent.jobs import JobManager
from garrison.nodeagent.metrics import node_registry, running_jobs


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} from one GET /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], metric: str, /,
          **labels: str) -> float | None:
    return samples.get((metric, tuple(sorted(labels.items()))))


def test_split_address() -> None:
    assert split_address("0.0.0.0:9817") == ("0.0.0.0", 9817)
    assert split_address("[::1]:0") == ("::1", 0)
    for bad in ("9817", ":9817", "host:", "host:99999", "host:port"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            split_address(bad)


# -- controller ------------------------------------------------------------------------------------------


def inventory(name: str, gpus: int) -> NodeInventory:
    return NodeInventory(
        hostname=name,
        gpus=tuple(Gpu(i, f"GPU-{name}-{i}", "NVIDIA H100", 81559, f"0000:{i:02x}:00.0", 0, "0-7") for i in range(gpus)),
        nvlink=tuple(tuple(0 if i == j else 18 for j in range(gpus)) for i in range(gpus)),
        topo=(),
        cpus=8,
        memory_mb=1024,
    )


def job(job_id: int, gpus: int, partition: str = "main") -> Job:
    return Job(job_id=job_id, spec=JobSpec(name="t", command=("true",), gpus=gpus), user="ada", uid=1000,
               gid=1000, account="default", partition=partition, time_limit_s=600, submit_time=0.0)


class Counts:
    """Event counters before a test, so that assertions are about this test's events only (the registry
    is the process's, shared by every test)."""

    names = (
        ("garrison_job_submissions_total", {"partition": "main"}),
        ("garrison_job_starts_total", {"partition": "main"}),
        ("garrison_job_ends_total", {"partition": "main", "state": "COMPLETED"}),
        ("garrison_job_ends_total", {"partition": "main", "state": "CANCELLED"}),
        ("garrison_job_requeues_total", {"partition": "main"}),
        ("garrison_preemptions_total", {}),
        ("garrison_scheduling_cycle_seconds_count", {}),
    )

    def __init__(self) -> None:
        self.before = self.now()

    def now(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            self.key(name, labels): metrics.registry().get_sample_value(name, labels) or 0.0
            for name, labels in self.names
        }

    @staticmethod
    def key(name: str, labels: dict[str, str]) -> tuple[str, tuple[tuple[str, str], ...]]:
        return name, tuple(sorted(labels.items()))

    def delta(self, samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
        key = self.key(name, labels)
        return (samples.get(key) or 0.0) - self.before[key]


@pytest.fixture
def state(tmp_path: Path) -> Iterator[ClusterState]:
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    cluster = ClusterState(store, heartbeat_timeout_s=30.0)
    cluster.load(1000.0, retention_s=1e9)
    cluster.job_observers.append(metrics.job_changed)
    yield cluster
    store.close()


def test_controller_endpoint(state: ClusterState) -> None:
    clock = ManualClock(1000.0)
    counts = Counts()
    state.register_node("n1", inventory("n1", 8), frozenset({"main"}), [], [], now=1000.0)
    state.register_node("n2", inventory("n2", 4), frozenset({"main"}), [], [], now=990.0)
    state.add_jobs([job(1, 2), job(2, 4), job(3, 16), job(4, 1), job(5, 1)])
    state.start_attempts([(1, Allocation((NodeAllocation("n1", (0, 1)),))),
                          (2, Allocation((NodeAllocation("n2", (0, 1, 2, 3)),))),
                          (4, Allocation((NodeAllocation("n1", (2,)),)))], now=1000.0)
    state.node_started("n1", 1, 0)
    state.node_finished("n1", NodeResult(4, 0, (RankOutcome(0, 0),)), now=1001.0)  # job 4 completed
    state.wait_reasons[3] = "Resources"
    state.cancel([5], now=1001.0)
    metrics.observe_scheduling_cycle(0.003)
    metrics.record_preemption(2)
    clock.advance(15.0)

    async def scrape_from_another_thread() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        loop = asyncio.get_running_loop()
        unregister = metrics.install_cluster_collector(state, clock, loop)
        endpoint = serve_metrics("127.0.0.1:0", metrics.registry())
        try:
            # The scrape runs in another thread; the cluster sample is taken here, on the loop.
            return await loop.run_in_executor(None, scrape, endpoint.port)
        finally:
            endpoint.stop()
            unregister()

    samples = asyncio.run(scrape_from_another_thread())
    assert value(samples, "garrison_jobs", state="PENDING", reason="Resources") == 1
    assert value(samples, "garrison_jobs", state="RUNNING", reason="") == 1
    assert value(samples, "garrison_jobs", state="CONFIGURING", reason="") == 1
    assert value(samples, "garrison_jobs", state="COMPLETED", reason="") == 1
    assert value(samples, "garrison_jobs", state="CANCELLED", reason="") == 1
    assert value(samples, "garrison_jobs", state="FAILED", reason="") == 0  # empty states are 0, not absent
    assert value(samples, "garrison_node_gpus", node="n1") == 8
    assert value(samples, "garrison_node_gpus_allocated", node="n1") == 2
    assert value(samples, "garrison_node_gpus_allocated", node="n2") == 4
    assert value(samples, "garrison_gpus") == 12 and value(samples, "garrison_gpus_allocated") == 6
    assert value(samples, "garrison_node_heartbeat_age_seconds", node="n1") == 15.0
    assert value(samples, "garrison_node_heartbeat_age_seconds", node="n2") == 25.0
    assert value(samples, "garrison_node_state", node="n1", state="UP") == 1
    assert value(samples, "garrison_node_state", node="n1", state="DRAIN") == 0
    assert value(samples, "garrison_agents_connected") == 2
    assert counts.delta(samples, "garrison_job_submissions_total", partition="main") == 5
    assert counts.delta(samples, "garrison_job_starts_total", partition="main") == 3
    assert counts.delta(samples, "garrison_job_ends_total", partition="main", state="COMPLETED") == 1
    assert counts.delta(samples, "garrison_job_ends_total", partition="main", state="CANCELLED") == 1
    assert counts.delta(samples, "garrison_preemptions_total") == 2
    assert counts.delta(samples, "garrison_scheduling_cycle_seconds_count") == 1
    assert value(samples, "garrison_scheduling_cycle_seconds_bucket", le="0.005") is not None
    assert value(samples, "process_resident_memory_bytes") is not None


def test_a_controller_whose_metrics_address_is_taken_exits_with_the_config_error(tmp_path: Path) -> None:
    """The endpoint starts after the controller serves (its imports off the event loop), yet an address it
    cannot listen on still stops the controller with the configuration's error, as before it served."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    os.chmod(tmp_path, 0o700)
    (tmp_path / "state").mkdir(mode=0o700)
    config = tmp_path / "garrison.toml"
    config.write_text(f"""[controller]
address = "127.0.0.1:0"
database = "sqlite:///{tmp_path}/controller.db"
state_dir = "{tmp_path}/state"
credential_socket = "{tmp_path}/auth.sock"
local_socket = "{tmp_path}/controller.sock"
key_file = "{tmp_path}/state/credential.key"
agent_uids = [0]
metrics_address = "127.0.0.1:{port}"
""")
    try:
        controller = subprocess.run([sys.executable, "-m", "garrison.controller.main", "--config", str(config)],
                                    capture_output=True, text=True, timeout=120)
    finally:
        taken.close()
    assert controller.returncode == 2, controller.stderr
    assert f"controller.metrics_address: cannot listen on 127.0.0.1:{port}" in controller.stderr


def test_requeue_is_counted(state: ClusterState) -> None:
    counts = Counts()
    state.register_node("n1", inventory("n1", 2), frozenset({"main"}), [], [], now=1000.0)
    state.add_jobs([job(1, 2)])
    state.start_attempts([(1, Allocation((NodeAllocation("n1", (0, 1)),)))], now=1000.0)
    state.expire_heartbeats(now=2000.0)  # the node is lost: the job goes back to the queue
    assert state.jobs[1].state == JobState.PENDING
    assert counts.delta(counts.now(), "garrison_job_requeues_total", partition="main") == 1


def test_pending_reasons_are_few_label_values(state: ClusterState) -> None:
    state.add_jobs([job(1, 1), job(2, 1), job(3, 1)])
    state.jobs[1] = replace(state.jobs[1], reason="Requeued: node n7 not responding")
    state.wait_reasons[2] = "Priority"
    sample = metrics.sample_cluster(state, 1000.0)
    assert sample.jobs == {("PENDING", "Requeued"): 1, ("PENDING", "Priority"): 1, ("PENDING", "None"): 1}


def test_a_busy_loop_does_not_fail_the_scrape(state: ClusterState, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "SAMPLE_TIMEOUT_S", 0.2)
    loop = asyncio.new_event_loop()
    blocked, release = threading.Event(), threading.Event()

    def block() -> None:
        blocked.set()
        release.wait(10)

    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        collector = loop_call(loop, lambda: metrics.ClusterCollector(state, ManualClock(0.0), loop))
        loop.call_soon_threadsafe(block)
        assert blocked.wait(5)
        families = {family.name for family in collector.collect()}
        assert families == {"garrison_metrics_sample_failures"}
        assert collector.failed_samples == 1
    finally:
        release.set()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def loop_call(loop: asyncio.AbstractEventLoop, function):  # type: ignore[no-untyped-def]
    """Run ``function`` on the loop's thread and return its result."""
    async def run():  # type: ignore[no-untyped-def]
        return function()

    return asyncio.run_coroutine_threadsafe(run(), loop).result(10)


# -- agent -----------------------------------------------------------------------------------------------


@pytest.fixture
def fake_node() -> Iterator[fake_nvml.FakeNvmlLibrary]:
    description = load_description(resolve_topology("pcie4"))
    fake_nvml.install_fake_nvml(description, "m-node")
    import pynvml

    library = pynvml.nvmlLib
    assert isinstance(library, fake_nvml.FakeNvmlLibrary)
    yield library
    fake_nvml.uninstall_fake_nvml()


def launch(manager: JobManager, job_id: int, gpus: tuple[int, ...], command: tuple[str, ...]) -> None:
    uid, gid = os.getuid(), os.getgid()
    import pwd

    manager.launch(
        LaunchDescription(
            job_id=job_id, attempt=0, user=pwd.getpwuid(uid).pw_name, uid=uid, gid=gid,
            spec=JobSpec(name="m", command=command, gpus_per_node=len(gpus), workdir="/tmp"),
            allocation=Allocation((NodeAllocation("m-node", gpus),)), node_rank=0, master_addr="127.0.0.1",
            master_port=29500, restart_count=0, kill_wait_s=1.0, time_limit_s=600,
        )
    )


def test_agent_endpoint(fake_node: fake_nvml.FakeNvmlLibrary, tmp_path: Path) -> None:
    manager = JobManager(tmp_path / "agent", str(tmp_path / "notify.sock"), allow_root_jobs=True)
    launch(manager, 7, (1, 2), ("sleep", "30"))  # 2 ranks, one per GPU
    launch(manager, 8, (3,), ("true",))
    try:
        wait_until(lambda: manager.result(8, 0), 20, what="job 8 to end")
        fake_node.set_usage(1, gpu_percent=87, memory_percent=40, memory_used_mib=30_000)
        fake_node.set_usage(2, gpu_percent=91, memory_percent=42, memory_used_mib=31_000)
        assert [j.job_id for j in running_jobs(manager.jobs_dir)] == [7]

        endpoint = serve_metrics("127.0.0.1:0", node_registry("m-node", manager.jobs_dir))
        try:
            samples = scrape(endpoint.port)
        finally:
            endpoint.stop()
    finally:
        manager.signal(7, 0, "kill")
        wait_until(lambda: manager.result(7, 0), 20, what="job 7 to end")

    uuid1 = fake_gpu_uuid("m-node", 1)
    gpu1 = {"node": "m-node", "gpu": "1", "uuid": uuid1, "name": fake_node.machine.gpus[1].name}
    assert value(samples, "garrison_gpu_utilization_percent", **gpu1) == 87
    assert value(samples, "garrison_gpu_memory_utilization_percent", **gpu1) == 40
    assert value(samples, "garrison_gpu_memory_used_bytes", **gpu1) == 30_000 * 1024 * 1024
    total = fake_node.machine.gpus[1].memory_mib * 1024 * 1024
    assert value(samples, "garrison_gpu_memory_total_bytes", **gpu1) == total
    idle = {**gpu1, "gpu": "0", "uuid": fake_gpu_uuid("m-node", 0)}
    assert value(samples, "garrison_gpu_utilization_percent", **idle) == 0

    job7 = {"node": "m-node", "job": "7", "attempt": "0"}
    (job_gpus,) = [v for (name, labels), v in samples.items()
                   if name == "garrison_job_gpus" and dict(labels).items() >= job7.items()]
    assert job_gpus == 2
    per_gpu = {dict(labels)["gpu"]: v for (name, labels), v in samples.items()
               if name == "garrison_job_gpu_utilization_percent" and dict(labels)["job"] == "7"}
    assert per_gpu == {"1": 87, "2": 91}
    memory = {dict(labels)["gpu"]: v for (name, labels), v in samples.items()
              if name == "garrison_job_gpu_memory_used_bytes" and dict(labels)["job"] == "7"}
    assert memory == {"1": 30_000 * 1024 * 1024, "2": 31_000 * 1024 * 1024}
    assert not any(dict(labels).get("job") == "8" for (_, labels) in samples)  # finished: not reported
    assert value(samples, "garrison_node_jobs_running", node="m-node") == 1
    assert value(samples, "garrison_nvml_up", node="m-node") == 1


def test_agent_endpoint_without_nvml(tmp_path: Path) -> None:
    fake_nvml.install_missing_nvml()
    try:
        endpoint = serve_metrics("127.0.0.1:0", node_registry("bare", tmp_path / "jobs"))
        try:
            samples = scrape(endpoint.port)
        finally:
            endpoint.stop()
    finally:
        fake_nvml.uninstall_fake_nvml()
    assert value(samples, "garrison_nvml_up", node="bare") == 0
    assert not any(name.startswith("garrison_gpu_") for name, _ in samples)
    assert value(samples, "garrison_node_jobs_running", node="bare") == 0


def test_fake_usage_is_validated(fake_node: fake_nvml.FakeNvmlLibrary) -> None:
    with pytest.raises(ValueError, match="no GPU 9"):
        fake_node.set_usage(9, gpu_percent=1, memory_percent=1, memory_used_mib=1)
    with pytest.raises(ValueError, match="out of range"):
        fake_node.set_usage(0, gpu_percent=101, memory_percent=1, memory_used_mib=1)


def test_a_scrape_during_a_plan_samples_once_the_plan_is_done(state: ClusterState) -> None:
    """The cluster sample waits for ``between_plans`` (Engine.between_plans: no plan on the planning thread),
    so it never takes the GIL from a plan: what it shows is the state when the plan was done."""
    clock = ManualClock(1000.0)
    state.add_jobs([job(1, 2)])
    state.wait_reasons[1] = "Resources"

    async def scrape_during_a_plan() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        loop = asyncio.get_running_loop()
        asked, plan_done = asyncio.Event(), asyncio.Event()

        async def between_plans() -> None:
            asked.set()
            await plan_done.wait()

        unregister = metrics.install_cluster_collector(state, clock, loop, between_plans)
        endpoint = serve_metrics("127.0.0.1:0", metrics.registry())
        try:
            scraping = loop.run_in_executor(None, scrape, endpoint.port)
            await asked.wait()  # the scrape asked for its sample while the "plan" is in flight
            state.wait_reasons[1] = "Priority"  # what the plan decided
            plan_done.set()
            return await scraping
        finally:
            endpoint.stop()
            unregister()

    samples = asyncio.run(scrape_during_a_plan())
    assert value(samples, "garrison_jobs", state="PENDING", reason="Priority") == 1
    assert value(samples, "garrison_jobs", state="PENDING", reason="Resources") is None
