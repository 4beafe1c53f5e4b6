"""Agent faults on a real local cluster (controller + two agents, `garrison up`): an agent frozen past the
heartbeat timeout, an agent down while its gang ends, a controller outage shorter than the node lease.

Every job writes its own lines (start, a tick every 0.2 s, term on SIGTERM, end), so runs are counted from
the jobs' side, not the controller's: no two attempts of a job may overlap in time, and every job ends
exactly once. `garrison up` sets heartbeat_timeout_s = 10, node_lease_s = 15 and kill_wait_s = 5, so a
silent node's jobs move on 15 + 1 + 5 + 2 = 23 s after it was last heard from.
"""

from __future__ import annotations

import os
import shlex
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
from helpers.polling import WaitTimeout, wait_until

from .conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

LEASE_S = 15.0  # `garrison up`'s node_lease_s
FENCE_DELAY_S = 23.0  # garrison.model.lease.fence_delay_s(15, 5)


def job_body(log: Path, first_ticks: int, later_ticks: int) -> str:
    """A job that records itself: start, ticks, term (on SIGTERM), end. Attempt 0 runs first_ticks ticks.

    Timestamps come from bash's $EPOCHREALTIME, not a `date` child: the SIGTERM that stops a rank reaches its
    whole process group, and a `date` killed mid-command left a line without its time.
    """
    body = (
        f'L={log}; A=$GARRISON_ATTEMPT; N=$GARRISON_NODENAME; '
        'echo "start $A $N $EPOCHREALTIME" >> $L; '
        'trap \'echo "term $A $N $EPOCHREALTIME" >> $L; exit 143\' TERM; '
        f'if [ "$A" = 0 ]; then T={first_ticks}; else T={later_ticks}; fi; '
        'i=0; while [ $i -lt $T ]; do echo "tick $A $N $EPOCHREALTIME" >> $L; sleep 0.2; i=$((i+1)); done; '
        'echo "end $A $N $EPOCHREALTIME" >> $L'
    )
    return "exec /bin/bash -c " + shlex.quote(body)


@dataclass
class Run:
    """What one attempt of a job wrote, on every node it ran on."""

    first: float = float("inf")
    last: float = 0.0
    events: dict[str, set[str]] = field(default_factory=dict)  # "start" | "term" | "end" -> nodes

    def add(self, kind: str, node: str, when: float) -> None:
        self.first, self.last = min(self.first, when), max(self.last, when)
        if kind != "tick":
            self.events.setdefault(kind, set()).add(node)


def runs(log: Path) -> dict[int, Run]:
    found: dict[int, Run] = {}
    if not log.exists():
        return found
    for line in log.read_text().splitlines():
        kind, attempt, node, when = line.split()
        found.setdefault(int(attempt), Run()).add(kind, node, float(when))
    return found


def assert_no_overlap(found: dict[int, Run]) -> None:
    ordered = [found[a] for a in sorted(found)]
    for earlier, later in zip(ordered, ordered[1:], strict=False):
        assert earlier.last < later.first, f"two attempts ran at the same time: {found}"


def node_states(c: Cluster) -> dict[str, str]:
    return {line.split()[0]: line.split()[1] for line in c.run("ginfo").stdout.splitlines()[1:]}


def agent_of(node: str) -> str:
    return "agent-" + node.removeprefix("node")


def agent_log_errors(c: Cluster) -> list[str]:
    """asyncio's complaints about tasks and generators left behind by a reconnect, in every agent's log."""
    bad = ("Task was destroyed", "aclose()", "Traceback")
    return [line for path in sorted(c.state_dir.glob("agent-*.log")) for line in path.read_text().splitlines()
            if any(b in line for b in bad)]


def registered_after_restart_s(c: Cluster) -> float:
    """Seconds from the restarted controller's "listening" line to the last agent's registration after it."""
    def stamp(line: str) -> float:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()

    lines = (c.state_dir / "controller.log").read_text().splitlines()
    start = max(i for i, line in enumerate(lines) if "controller listening" in line)
    registered = [stamp(line) for line in lines[start:] if " registered: " in line]
    assert len(registered) == 2, lines[start:]
    return max(registered) - stamp(lines[start])


def wait_for(c: Cluster, job_id: str, predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    """wait_until, saying on failure where the job and the daemons stood."""
    try:
        wait_until(predicate, timeout_s, what=what)
    except WaitTimeout as exc:
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(c.state_dir.glob("*.log")))
        raise AssertionError(f"{exc}\n{c.run('gjob', job_id, check=False).stdout}\n{logs}") from None


def gang_started(log: Path) -> bool:
    return len(runs(log).get(0, Run()).events.get("start", ())) == 2


@pytest.fixture
def twin() -> Iterator[Cluster]:
    c = start_cluster(["dgx-a100", "dgx-a100"])
    try:
        yield c
    finally:
        stop_cluster(c)


def test_frozen_agent_is_fenced_its_job_moves_on_without_overlap_and_the_node_comes_back(twin: Cluster) -> None:
    c = twin
    log = c.work / "frozen.log"
    job_id = c.submit("-N", "1", "--gpus-per-node", "8", "--launch", "node", "-o", "/dev/null",
                      "--wrap", job_body(log, first_ticks=400, later_ticks=10))
    wait_until(lambda: 0 in runs(log), 60, what="attempt 0 to start")
    (node,) = runs(log)[0].events["start"]
    agent = c.pid(agent_of(node))
    frozen_at = time.time()
    os.kill(agent, signal.SIGSTOP)
    try:
        # The requeued copy starts on the other node only once the frozen node's lease has run out and its
        # supervisor (which the freeze does not stop) has stopped the ranks.
        wait_until(lambda: 1 in runs(log), 90, what="the requeued attempt to start")
        moved_at = runs(log)[1].first
        assert moved_at - frozen_at >= FENCE_DELAY_S - 2.5, (moved_at - frozen_at)
        stale = runs(log)[0]
        assert stale.events.get("term") == {node}, "the fenced ranks did not get SIGTERM"
        assert stale.last - frozen_at < LEASE_S + 1 + 1.5, "the fenced ranks ran past the lease"
    finally:
        os.kill(agent, signal.SIGCONT)
    # Woken, the agent finds its lease run out, registers again, and the node is back.
    wait_until(lambda: node_states(c)[node] in ("IDLE", "MIXED", "ALLOCATED"), 30, what=f"{node} to come back")
    job = c.wait_done(job_id, timeout=60)
    assert job["state"] == "COMPLETED"
    found = runs(log)
    assert sorted(found) == [0, 1] and found[1].events.get("end") and "end" not in found[0].events
    assert_no_overlap(found)
    assert "Attempt 0: NODE_FAIL" in c.run("gjob", job_id).stdout
    assert any("node lease expired" in line for line in (c.state_dir / f"{agent_of(node)}.log").read_text()
               .splitlines())


def test_gang_that_ends_while_an_agent_is_down_is_honoured_not_rerun(twin: Cluster) -> None:
    c = twin
    log = c.work / "honoured.log"
    job_id = c.submit("-N", "2", "--gpus-per-node", "1", "--launch", "node", "-o", "/dev/null",
                      "--wrap", job_body(log, first_ticks=15, later_ticks=5))
    wait_for(c, job_id, lambda: gang_started(log), 60, "the gang to start")
    os.kill(c.pid("agent-2"), signal.SIGKILL)
    # Both nodes' ranks end (3 s) while node2 has no agent; it is DOWN after the heartbeat timeout.
    wait_until(lambda: node_states(c)["node2"].startswith("DOWN"), 30, what="node2 to be DOWN")
    assert runs(log)[0].events.get("end") == {"node1", "node2"}
    c.up()  # back before the fence delay: its result is delivered and counts
    job = c.wait_done(job_id, timeout=60)
    assert job["state"] == "COMPLETED" and job["restart_count"] == 0, job
    assert sorted(runs(log)) == [0]


def test_agent_down_past_the_lease_survivors_get_sigterm_and_no_attempt_overlaps(twin: Cluster) -> None:
    c = twin
    log = c.work / "survivors.log"
    job_id = c.submit("-N", "2", "--gpus-per-node", "1", "--launch", "node", "-o", "/dev/null",
                      "--wrap", job_body(log, first_ticks=600, later_ticks=5))
    wait_for(c, job_id, lambda: gang_started(log), 60, "the gang to start")
    os.kill(c.pid("agent-2"), signal.SIGKILL)
    # node2's supervisor stops its ranks when the lease runs out; then the controller stops node1's, with
    # SIGTERM first (the trap writes "term"), and requeues the gang.
    wait_until(lambda: runs(log)[0].events.get("term") == {"node1", "node2"}, 60, what="both ranks to get SIGTERM")
    job = c.wait_state(job_id, {"PENDING"}, timeout=30)
    assert "node2 not responding" in job["reason"], job
    c.up()
    job = c.wait_done(job_id, timeout=60)
    assert job["state"] == "COMPLETED" and job["restart_count"] == 1
    found = runs(log)
    assert sorted(found) == [0, 1] and found[1].events.get("end") == {"node1", "node2"}
    assert_no_overlap(found)


def test_controller_outage_shorter_than_the_lease_kills_nothing(twin: Cluster) -> None:
    c = twin
    log = c.work / "outage.log"
    job_id = c.submit("-N", "2", "--gpus-per-node", "1", "--launch", "node", "-o", "/dev/null",
                      "--wrap", job_body(log, first_ticks=60, later_ticks=5))
    wait_for(c, job_id, lambda: gang_started(log), 60, "the gang to start")
    os.kill(c.pid("controller"), signal.SIGKILL)
    down_at = time.time()
    time.sleep(3)  # the outage itself: the fault being injected, not a wait for something to happen
    c.up()  # restarts the controller and returns once both agents have registered again
    outage_s = time.time() - down_at
    assert outage_s < LEASE_S - 1, f"the outage ({outage_s:.1f}s, a slow restart) was not shorter than the lease"
    job = c.wait_done(job_id, timeout=60)
    assert job["state"] == "COMPLETED" and job["restart_count"] == 0, job
    found = runs(log)
    assert sorted(found) == [0] and found[0].events.get("end") == {"node1", "node2"}
    assert "term" not in found[0].events
    # The agents were retrying all along (their backoff never exceeds 2 s) and are back at once.
    assert registered_after_restart_s(c) < 3.0
    assert agent_log_errors(c) == []


def test_controller_outage_longer_than_the_lease_kills_nothing_either(twin: Cluster) -> None:
    """The controller's port refuses connections while it is down: no controller runs that could requeue the
    nodes' jobs, so the agents extend their leases (nodeagent/lease.py) and the gang runs on through an outage
    twice the lease; the restarted controller waits the fence delay from its own start, and they are back."""
    c = twin
    log = c.work / "long-outage.log"
    job_id = c.submit("-N", "2", "--gpus-per-node", "1", "--launch", "node", "-o", "/dev/null",
                      "--wrap", job_body(log, first_ticks=250, later_ticks=5))
    wait_for(c, job_id, lambda: gang_started(log), 60, "the gang to start")
    os.kill(c.pid("controller"), signal.SIGKILL)
    time.sleep(2 * LEASE_S)  # the outage itself: the fault being injected, not a wait for something to happen
    c.up()
    job = c.wait_done(job_id, timeout=90)
    assert job["state"] == "COMPLETED" and job["restart_count"] == 0, job
    found = runs(log)
    assert sorted(found) == [0] and found[0].events.get("end") == {"node1", "node2"}
    assert "term" not in found[0].events
    assert any("node lease extended" in line for line in (c.state_dir / "agent-1.log").read_text().splitlines())


def node_reasons(c: Cluster) -> dict[str, str]:
    """Each node's reason, as `sinfo -N -o %N|%E` gives it ("none": no reason)."""
    sinfo = Path(c.run("garrison", "slurm-path").stdout.strip()) / "sinfo"
    rows = (line.split("|", 1) for line in c.run(str(sinfo), "-N", "-h", "-o", "%N|%E").stdout.splitlines())
    return {name: "" if reason == "none" else reason for name, reason in rows}


def test_a_full_agent_disk_drains_the_node_requeues_its_job_and_the_node_resumes_when_freed(twin: Cluster) -> None:
    """An agent whose state directory fills up (a real tmpfs filled to the last byte) keeps its link, says so in
    its heartbeats and is drained: new jobs go elsewhere, the job it ran (stopped at the lease's end, which it
    could not renew) is requeued, not failed, and once space is freed the node resumes and runs it again."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    c = twin
    agent_dir = c.state_dir / "agent-2"
    os.kill(c.pid("agent-2"), signal.SIGTERM)
    wait_until(lambda: "node2" not in node_states(c) or node_states(c)["node2"] != "IDLE", 30,
               what="agent-2 to stop")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(agent_dir)], check=True)
    try:
        c.up()
        wait_until(lambda: node_states(c)["node2"] == "IDLE", 30, what="node2 to register on its new disk")
        log = c.work / "disk.log"
        held = c.submit("-w", "node2", "-G", "1", "-o", "/dev/null", "--wrap", job_body(log, 2000, 2))
        wait_for(c, held, lambda: 0 in runs(log), 60, "the job to start on node2")
        filler = agent_dir / "filler"
        with filler.open("wb", buffering=0) as f, pytest.raises(OSError):
            while True:
                f.write(b"\0" * (1 << 16))
        wait_until(lambda: "No space left on device" in node_reasons(c)["node2"], 30, what="node2 to be drained")
        assert node_states(c)["node2"].startswith("DRAIN")
        elsewhere = c.submit("-G", "1", "-o", "/dev/null", "--wrap", "true")
        assert c.wait_done(elsewhere)["state"] == "COMPLETED"
        assert "node1" in c.run("gjob", elsewhere).stdout
        # The lease cannot be renewed: its supervisor stops the job at the lease's end; the node's failure.
        wait_for(c, held, lambda: "term" in runs(log).get(0, Run()).events, LEASE_S + 30, "the job to be stopped")
        job = c.wait_state(held, {"PENDING", "FAILED", "NODE_FAIL"}, 60)
        assert job["state"] == "PENDING", job
        filler.unlink()
        wait_until(lambda: node_states(c)["node2"] in ("IDLE", "MIXED", "ALLOCATED"), 30, what="node2 to resume")
        job = c.wait_done(held, 90)
        assert job["state"] == "COMPLETED" and job["restart_count"] == 1, job
        assert_no_overlap(runs(log))
        assert node_reasons(c)["node2"] == ""
    finally:
        c.run("garrison", "down", "--state-dir", str(c.state_dir), check=False)  # before its disk goes
        subprocess.run(["umount", "-l", str(agent_dir)], check=False)


def test_a_controller_slow_to_start_counts_the_fence_delay_from_when_it_listens() -> None:
    """A restarted controller refuses connections until it listens, so while it loads its database the agents
    extend their leases (nodeagent/lease.py): a node that falls silent just as it begins to listen still runs
    its ranks for a whole lease. The fence delay must count from when the controller listens, not from when
    it began loading, or that node's job is requeued and runs twice at once. The start is made slow by a lock
    on the jobs table of a private PostgreSQL instance, which the restarted controller's load waits for."""
    import subprocess

    import psycopg
    from helpers.private_postgres import PrivatePostgres, postgres_bin

    from .conftest import BIN

    if postgres_bin() is None:
        pytest.skip("no PostgreSQL server binaries to start a private instance with")
    pg = PrivatePostgres()
    pg.start()
    url = pg.url.replace("postgresql+psycopg://", "postgresql://")
    c = start_cluster(["dgx-a100", "dgx-a100"], ["--database", pg.url])
    up: subprocess.Popen[bytes] | None = None
    try:
        log = c.work / "slow-start.log"
        job_id = c.submit("-N", "1", "--gpus-per-node", "8", "--launch", "node", "-o", "/dev/null",
                          "--wrap", job_body(log, first_ticks=600, later_ticks=5))
        wait_for(c, job_id, lambda: 0 in runs(log), 60, "attempt 0 to start")
        (node,) = runs(log)[0].events["start"]
        agent = c.pid(agent_of(node))
        agent_log = c.state_dir / f"{agent_of(node)}.log"

        def extensions() -> int:
            return agent_log.read_text().count("node lease extended")

        with psycopg.connect(url) as lock, psycopg.connect(url, autocommit=True) as watch:
            lock.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
            os.kill(c.pid("controller"), signal.SIGKILL)
            up = subprocess.Popen([str(BIN / "garrison"), "up", "--state-dir", str(c.state_dir)], env=c.env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_until(lambda: watch.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
                       .fetchone() == (1,), 60, what="the restarted controller to wait for the jobs table")
            time.sleep(LEASE_S)  # the slow start itself: the fault being injected, not a wait for something
            before = extensions()
            wait_until(lambda: extensions() > before, 10, what="the agent to extend its lease again")
            os.kill(agent, signal.SIGSTOP)  # silent from the moment the controller can hear it
            lock.commit()  # the controller loads its jobs and listens
        try:
            wait_for(c, job_id, lambda: 1 in runs(log), 90, "the requeued attempt to start")
            assert_no_overlap(runs(log))
        finally:
            os.kill(agent, signal.SIGCONT)
        job = c.wait_done(job_id, timeout=90)
        assert job["state"] == "COMPLETED" and job["restart_count"] == 1, job
        assert_no_overlap(runs(log))
    finally:
        if up is not None:
            up.wait(timeout=120)
        stop_cluster(c)
        pg.destroy()


def test_a_gang_node_that_ended_first_is_not_lost_to_a_controller_restart(twin: Cluster) -> None:
    """One node of a gang ends its ranks while the other's still run: nothing in the store changes then, so
    the controller must not acknowledge that node's result (its agent would forget it) until the attempt's
    fate is durable. A controller restarted meanwhile is told the result again when the agent registers,
    and the gang goes on; acknowledged early, the restarted controller found that node running nothing and
    holding no result, and requeued as "ranks lost" a job whose ranks there had ended 0 (chaos.py)."""
    c = twin
    log = c.work / "early-node.log"
    body = (
        f'L={log}; A=$GARRISON_ATTEMPT; N=$GARRISON_NODENAME; echo "start $A $N $EPOCHREALTIME" >> $L; '
        'if [ "$N" = node1 ]; then T=1; else T=75; fi; '
        'i=0; while [ $i -lt $T ]; do echo "tick $A $N $EPOCHREALTIME" >> $L; sleep 0.2; i=$((i+1)); done; '
        'echo "end $A $N $EPOCHREALTIME" >> $L'
    )
    job_id = c.submit("-N", "2", "--gpus-per-node", "8", "--launch", "node", "-o", "/dev/null",
                      "--wrap", "exec /bin/bash -c " + shlex.quote(body))
    wait_for(c, job_id, lambda: runs(log).get(0, Run()).events.get("end") == {"node1"}, 60, "node1's ranks to end")
    # The controller has node1's result once node1's GPUs are free again.
    wait_until(lambda: node_states(c)["node1"] == "IDLE", 30, what="node1's GPUs to be released")
    assert runs(log)[0].events["end"] == {"node1"}, "node2's ranks ended before the controller's restart"
    os.kill(c.pid("controller"), signal.SIGKILL)
    c.up()
    job = c.wait_done(job_id, timeout=90)
    assert job["state"] == "COMPLETED" and job["restart_count"] == 0, c.run("gjob", job_id).stdout
    assert sorted(runs(log)) == [0] and runs(log)[0].events["end"] == {"node1", "node2"}
