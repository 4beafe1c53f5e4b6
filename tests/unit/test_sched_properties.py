"""Properties of every plan, over random clusters, running jobs, queues, quotas and policies (hypothesis).

- no GPU is allocated twice, and only free GPUs of ready nodes in the job's partition are;
- every gang is whole or absent;
- no quota is exceeded;
- backfill never delays a reservation, reservations never overlap, and the first blocked job has one;
- with CPUs and host memory asked for and held: every start gets exactly the CPUs it asks for, from free
  ones, and fits in the free memory; no later start takes a reserved CPU past the reservation's start, and
  at each reservation's start the memory of what still runs then and of the reservations then fits the node;
- the same inputs give the same plan, whatever order the snapshot lists nodes, jobs and running jobs in.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from sched_helpers import NOW, node, pending, running

from garrison.controller.sched.cycle import Plan, schedule
from garrison.controller.sched.presets import preset
from garrison.controller.sched.snapshot import RunningJob, Snapshot
from garrison.model.accounts import Account, Accounting, Limits, PartitionDef, Qos

ACCOUNTING = Accounting(
    accounts=(Account("org"), Account("a", "org"), Account("b", "org"), Account("c")),
    qos=(Qos("low", 0), Qos("normal", 10), Qos("high", 20, preempts=("low",))),
    partitions=(PartitionDef("main", default=True), PartitionDef("small", nodes=("n0", "n1"))),
    default_qos="normal",
)
SWITCHES = [("x", "s1"), ("x", "s2"), ("y", "s3")]
LIMITS = [60, 600, 3600, 7200]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Snapshot, str, bool]:
    nodes = []
    runs: list[RunningJob] = []
    job_id = 1000
    for i in range(draw(st.integers(1, 6))):
        gpus = draw(st.sampled_from([2, 4, 8]))
        # Mostly busy clusters: that is where reservations, backfill and preemption happen.
        count = draw(st.sampled_from([0, gpus // 2, gpus - 1, gpus, gpus]))
        busy = set(draw(st.permutations(range(gpus)))[:count])
        name = f"n{i}"
        # Split the busy GPUs among up to three running jobs with staggered ends.
        owners = sorted(busy)
        while owners:
            take = draw(st.integers(1, len(owners)))
            job_id += 1
            runs.append(running(job_id, {name: tuple(owners[:take])},
                                start=NOW - draw(st.integers(0, 3000)), limit=draw(st.sampled_from(LIMITS + [9000])),
                                account=draw(st.sampled_from(["a", "b", "c"])), qos=draw(st.sampled_from(["low", "normal"])),
                                stopping=draw(st.booleans()) and draw(st.booleans())))
            owners = owners[take:]
        drained = draw(st.integers(0, 9)) == 0
        nodes.append(node(name, gpus=gpus, free=set(range(gpus)) - busy, switches=draw(st.sampled_from(SWITCHES)),
                          partitions=frozenset({"main", "small"} if i < 2 else {"main"}), drained=drained))
    jobs = []
    for j in range(draw(st.integers(1, 14))):
        shape = draw(st.one_of(
            st.builds(lambda g: {"gpus": g}, st.integers(1, 16)),
            st.builds(lambda n, g: {"nodes": n, "gpus_per_node": g}, st.integers(1, 3), st.integers(1, 8)),
            st.builds(lambda n, g: {"nodes": n, "gpus": n * g}, st.integers(1, 3), st.integers(1, 4)),
        ))
        jobs.append(pending(j + 1, submit=NOW - draw(st.integers(0, 5000)), account=draw(st.sampled_from(["a", "b", "c"])),
                            user=draw(st.sampled_from(["u", "v"])), qos=draw(st.sampled_from(["", "low", "high"])),
                            limit=draw(st.sampled_from(LIMITS)), partition=draw(st.sampled_from(["main", "main", "small"])),
                            held=draw(st.integers(0, 9)) == 0, **shape))
    limits = []
    if draw(st.booleans()):
        limits.append(("org", Limits(max_gpus=draw(st.integers(1, 24)))))
    if draw(st.booleans()):
        limits.append(("c", Limits(max_jobs=draw(st.integers(1, 4)), max_gpus=draw(st.integers(1, 12)))))
    user_limits = (("v", Limits(max_gpus=draw(st.integers(1, 8)))),) if draw(st.booleans()) else ()
    accounting = replace(ACCOUNTING, account_limits=tuple(limits), user_limits=user_limits)
    snapshot = Snapshot(nodes=tuple(nodes), pending=tuple(jobs), running=tuple(runs), accounting=accounting)
    return snapshot, draw(st.sampled_from(["fifo", "fifo-easy", "garrison"])), draw(st.booleans())


def check_plan(snapshot: Snapshot, plan: Plan, preemption: bool, policy_backfills: bool) -> None:
    views = {n.name: n for n in snapshot.nodes}
    jobs = {j.job_id: j for j in snapshot.pending}
    started = {s.job_id for s in plan.starts}

    # Every pending job either starts or waits with a reason.
    assert started | set(plan.waiting) == set(jobs) and not started & set(plan.waiting)

    # No GPU twice, only free GPUs of ready nodes in the partition; gangs whole.
    used: set[tuple[str, int]] = set()
    for start in plan.starts:
        spec = jobs[start.job_id].spec
        alloc = start.allocation
        assert alloc.gpu_count() == spec.total_gpus()
        assert len(set(alloc.node_names)) == len(alloc.node_names)
        if spec.nodes is not None:
            assert len(alloc.nodes) == spec.nodes
        if spec.gpus_per_node is not None:
            assert all(len(n.gpus) == spec.gpus_per_node for n in alloc.nodes)
        for n in alloc.nodes:
            view = views[n.node]
            assert view.schedulable and not view.drained and jobs[start.job_id].partition in view.partitions
            for gpu in n.gpus:
                assert gpu in view.free_gpus and (n.node, gpu) not in used
                used.add((n.node, gpu))

    # No quota exceeded by what starts.
    accounting = snapshot.accounting
    for name, limits in accounting.account_limits:
        def under(account: str, name: str = name) -> bool:
            return name in accounting.ancestors(account)
        new = [jobs[s.job_id] for s in plan.starts if under(jobs[s.job_id].account_name)]
        if not new:
            continue
        now_gpus = sum(r.gpu_count() for r in snapshot.running if under(r.account))
        now_jobs = sum(1 for r in snapshot.running if under(r.account))
        if limits.max_gpus is not None:
            assert now_gpus + sum(j.spec.total_gpus() for j in new) <= limits.max_gpus
        if limits.max_jobs is not None:
            assert now_jobs + len(new) <= limits.max_jobs
    for user, limits in accounting.user_limits:
        new = [jobs[s.job_id] for s in plan.starts if jobs[s.job_id].user == user]
        if new and limits.max_gpus is not None:
            held = sum(r.gpu_count() for r in snapshot.running if r.user == user)
            assert held + sum(j.spec.total_gpus() for j in new) <= limits.max_gpus

    # Backfill never delays a reservation: a later job on a reserved GPU ends before the reservation starts,
    # no running job holds a reserved GPU past the start, and reservations do not overlap.
    position = {job_id: i for i, job_id in enumerate(plan.order)}
    for reservation in plan.reservations:
        reserved = {(n.node, g) for n in reservation.allocation.nodes for g in n.gpus}
        assert reservation.start >= NOW
        for start in plan.starts:
            if position[start.job_id] < position[reservation.job_id]:
                continue
            taken = {(n.node, g) for n in start.allocation.nodes for g in n.gpus}
            if taken & reserved:
                assert NOW + (jobs[start.job_id].time_limit_s or 0) <= reservation.start
        for run in snapshot.running:
            taken = {(n.node, g) for n in run.allocation.nodes for g in n.gpus}
            if taken & reserved and not run.stopping:
                assert max(NOW, run.expected_end) <= reservation.start
        for other in plan.reservations:
            if other is reservation:
                continue
            both = reserved & {(n.node, g) for n in other.allocation.nodes for g in n.gpus}
            if both:
                assert other.end <= reservation.start or reservation.end <= other.start

    # With backfill, the first job blocked for resources always has a reservation (every busy GPU here
    # belongs to a listed running job whose limit ends within the window).
    if policy_backfills:
        first_blocked = next((j for j in plan.order if plan.waiting.get(j) == "Resources"), None)
        if first_blocked is not None:
            assert first_blocked in {r.job_id for r in plan.reservations}

    # Preemption only when enabled, only of QoS the job's QoS may preempt.
    if not preemption:
        assert plan.preempts == ()
    victims = {p.job_id for p in plan.preempts}
    for run in snapshot.running:
        if run.job_id in victims:
            assert run.qos == "low" and not run.stopping


@st.composite
def with_cpus_and_memory(draw: st.DrawFn) -> tuple[Snapshot, str, bool]:
    """A scenario whose nodes have 4 CPUs and 1,000 MB per GPU, whose running jobs hold some of them (and a
    few hold only CPUs and memory), and whose pending jobs ask for CPUs per GPU and memory."""
    snapshot, policy, preemption = draw(scenarios())
    cpus_left = {n.name: list(range(4 * len(n.gpu_names))) for n in snapshot.nodes}
    memory_left = {n.name: 1000 * len(n.gpu_names) for n in snapshot.nodes}
    runs = list(snapshot.running)
    for i in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(sorted(cpus_left)))
        runs.append(running(5000 + i, {name: ()}, limit=draw(st.sampled_from(LIMITS + [9000]))))
    held_runs = []
    for run in runs:
        node_allocs = []
        for n in run.allocation.nodes:
            count = draw(st.integers(0, min(len(cpus_left[n.node]), 4 * max(1, len(n.gpus)))))
            cpus = tuple(cpus_left[n.node][:count])
            cpus_left[n.node] = cpus_left[n.node][count:]
            mem = draw(st.integers(0, min(memory_left[n.node], 1000 * max(1, len(n.gpus)))))
            memory_left[n.node] -= mem
            node_allocs.append(replace(n, cpus=cpus, mem_mb=mem))
        held_runs.append(replace(run, allocation=replace(run.allocation, nodes=tuple(node_allocs))))
    nodes = tuple(
        replace(n, cpus=4 * len(n.gpu_names), free_cpus=frozenset(cpus_left[n.name]),
                memory_mb=1000 * len(n.gpu_names), free_memory_mb=memory_left[n.name])
        for n in snapshot.nodes
    )
    jobs = tuple(
        replace(j, spec=replace(j.spec, cpus_per_gpu=draw(st.sampled_from([0, 1, 2, 4])),
                                mem_mb=draw(st.sampled_from([0, 0, 300, 900]))))
        for j in snapshot.pending
    )
    return replace(snapshot, nodes=nodes, pending=jobs, running=tuple(held_runs)), policy, preemption


def check_cpus_and_memory(snapshot: Snapshot, plan: Plan) -> None:
    views = {n.name: n for n in snapshot.nodes}
    jobs = {j.job_id: j for j in snapshot.pending}
    position = {job_id: i for i, job_id in enumerate(plan.order)}
    end_of = {s.job_id: NOW + (jobs[s.job_id].time_limit_s or 0) for s in plan.starts}
    used_cpus: set[tuple[str, int]] = set()
    used_memory: dict[str, int] = {}
    for start in plan.starts:
        spec = jobs[start.job_id].spec
        for n in start.allocation.nodes:
            assert len(n.cpus) == spec.cpus_per_gpu * len(n.gpus)
            assert n.mem_mb == spec.mem_mb
            for cpu in n.cpus:
                assert cpu in views[n.node].free_cpus and (n.node, cpu) not in used_cpus
                used_cpus.add((n.node, cpu))
            used_memory[n.node] = used_memory.get(n.node, 0) + n.mem_mb
    for name, mem in used_memory.items():
        assert mem <= views[name].free_memory_mb
    for reservation in plan.reservations:
        at = reservation.start
        for n in reservation.allocation.nodes:
            reserved = set(n.cpus)
            for start in plan.starts:
                if position[start.job_id] > position[reservation.job_id] and end_of[start.job_id] > at:
                    assert not reserved & {c for m in start.allocation.nodes if m.node == n.node for c in m.cpus}
            for run in snapshot.running:
                end = NOW if run.stopping else max(NOW, run.expected_end)
                if end > at:
                    assert not reserved & {c for m in run.allocation.nodes if m.node == n.node for c in m.cpus}
            memory = sum(m.mem_mb for run in snapshot.running if (NOW if run.stopping else max(NOW, run.expected_end)) > at
                         for m in run.allocation.nodes if m.node == n.node)
            memory += sum(m.mem_mb for s in plan.starts if end_of[s.job_id] > at
                          for m in s.allocation.nodes if m.node == n.node)
            memory += sum(m.mem_mb for r in plan.reservations if r.start <= at < r.end
                          for m in r.allocation.nodes if m.node == n.node)
            assert memory <= views[n.node].memory_mb


@settings(max_examples=250, deadline=None)
@given(scenario=with_cpus_and_memory())
def test_plans_respect_cpus_and_memory(scenario: tuple[Snapshot, str, bool]) -> None:
    snapshot, policy, preemption = scenario
    config = replace(preset(policy), preemption=preemption, resolution_s=60)
    plan = schedule(snapshot, NOW, config)
    check_plan(snapshot, plan, preemption, config.backfill and config.reservations > 0)
    check_cpus_and_memory(snapshot, plan)


@settings(max_examples=250, deadline=None)
@given(scenario=scenarios(), seed=st.integers(0, 2**32 - 1))
def test_plans_are_valid_and_deterministic(scenario: tuple[Snapshot, str, bool], seed: int) -> None:
    snapshot, policy, preemption = scenario
    config = replace(preset(policy), preemption=preemption, resolution_s=60)
    plan = schedule(snapshot, NOW, config)
    check_plan(snapshot, plan, preemption, config.backfill and config.reservations > 0)
    assert schedule(snapshot, NOW, config) == plan
    rng = random.Random(seed)
    shuffled = replace(
        snapshot,
        nodes=tuple(rng.sample(snapshot.nodes, len(snapshot.nodes))),
        pending=tuple(rng.sample(snapshot.pending, len(snapshot.pending))),
        running=tuple(rng.sample(snapshot.running, len(snapshot.running))),
    )
    assert schedule(shuffled, NOW, config) == plan
