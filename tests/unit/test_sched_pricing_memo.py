"""The pricing context's memos (priority.py _AccountingFacts, fairshare.py _shares_of): what one accounting
object decides (QoS and partition factors, default limits, the static parts' memo) and the normalised
shares of the last associations are remembered across cycles. A context must price every job as one
computed with the memos empty does, whichever accounting objects and associations came before."""

from __future__ import annotations

import random

from sched_helpers import NOW, node, pending
from test_sched_queue import ACCOUNTS, accounting

from garrison.controller.sched import fairshare, priority
from garrison.controller.sched.presets import GARRISON_WEIGHTS
from garrison.controller.sched.priority import PriorityContext
from garrison.controller.sched.snapshot import PendingJob, Snapshot, UsageView
from garrison.model.accounts import Accounting, Qos


def _fresh(snapshot: Snapshot, now: float, jobs: list[PendingJob]) -> dict[int, int]:
    """The priorities with every memo empty (and the memos left as they were)."""
    kept = (list(priority._FACTS), dict(priority._STATIC_PARTS), list(fairshare._LAST_SHARES))
    priority._FACTS.clear()
    priority._STATIC_PARTS.clear()
    fairshare._LAST_SHARES.clear()
    try:
        return PriorityContext(snapshot, now, GARRISON_WEIGHTS).priorities(jobs, whole_queue=False)
    finally:
        priority._FACTS[:] = kept[0]
        priority._STATIC_PARTS.clear()
        priority._STATIC_PARTS.update(kept[1])
        fairshare._LAST_SHARES[:] = kept[2]


def test_remembered_facts_and_shares_price_as_fresh_ones() -> None:
    rng = random.Random(3)
    plain = accounting(quotas=False)
    # Two more accounting objects: another QoS priority, and one equal to the first but a distinct object.
    raised = plain.with_qos(Qos("high", 40))
    twin = Accounting(accounts=plain.accounts, qos=plain.qos, partitions=plain.partitions,
                      default_qos=plain.default_qos)
    nodes = (node("n0"), node("n1"))
    jobs: list[PendingJob] = []
    now = NOW
    for step in range(200):
        now += rng.choice((0.0, 30.0, 3600.0))
        if rng.random() < 0.4 or not jobs:
            jobs.append(pending(1 + step, submit=now - rng.uniform(0, 5 * 86400), gpus=rng.choice((1, 2, 8)),
                                account=rng.choice(ACCOUNTS), user=f"u{rng.randrange(4)}",
                                qos=rng.choice(("", "high")), limit=rng.choice((600, 3600, 7200))))
        elif rng.random() < 0.5:
            jobs.pop(rng.randrange(len(jobs)))
        usage = {(account, f"u{user}"): UsageView(decayed_gpu_s=rng.uniform(0, 1e5))
                 for account in ACCOUNTS for user in range(4) if rng.random() < 0.5}
        snapshot = Snapshot(nodes=nodes, running=(), pending=tuple(jobs), accounting=rng.choice((plain, raised, twin)),
                            usage=usage)
        kept = PriorityContext(snapshot, now, GARRISON_WEIGHTS).priorities(jobs, whole_queue=False)
        assert kept == _fresh(snapshot, now, jobs)
