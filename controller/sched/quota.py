"""Hard limits: account and user quotas, QoS per-user limits. Never exceeded by a start.

Counted at the start of a cycle from the running jobs, then kept up to date as the cycle starts more:

- GPUs allocated and jobs running, per account (with everything under it), per user, per (QoS, user);
- GPU-hours per quota period, per account subtree and per user: what was used since the period began
  (the usage ledger's raw count) plus what running jobs may still use until their time limits. A job
  starts only if its own GPUs times its time limit fit in what remains, so the quota holds even if every
  job runs to its limit.

A job held back by a limit does not block the jobs behind it (Slurm does the same): its reason names the
limit.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from garrison.controller.sched.snapshot import PendingJob, RunningJob, UsageView
from garrison.model.accounts import Accounting


@dataclass(frozen=True, slots=True)
class QuotaBlock:
    """A limit a job's start would break: e.g. account physics, GPUs, 16 used of 16."""

    reason: str  # the reason code (Reason below)
    scope: str  # "account", "user" or "qos"
    name: str
    resource: str  # "GPUs", "jobs", "GPU-hours", "GPUs per user", "jobs per user"
    used: float
    limit: float


class Reason:
    QUOTA_GPUS = "QuotaGPUs"
    QUOTA_JOBS = "QuotaJobs"
    QUOTA_GPU_HOURS = "QuotaGPUHours"
    QOS_GPUS_PER_USER = "QOSMaxGPUsPerUser"
    QOS_JOBS_PER_USER = "QOSMaxJobsPerUser"


class QuotaTally:
    def __init__(
        self,
        accounting: Accounting,
        running: Iterable[RunningJob],
        usage: Mapping[tuple[str, str], UsageView],
        now: float,
        default_qos: str = "",
    ) -> None:
        self.accounting = accounting
        self.default_qos = default_qos
        self.enabled = bool(accounting.account_limits or accounting.user_limits or any(
            q.max_gpus_per_user is not None or q.max_jobs_per_user is not None for q in accounting.qos
        ))
        self.account_gpus: defaultdict[str, int] = defaultdict(int)
        self.account_jobs: defaultdict[str, int] = defaultdict(int)
        self.account_seconds: defaultdict[str, float] = defaultdict(float)
        self.user_gpus: defaultdict[str, int] = defaultdict(int)
        self.user_jobs: defaultdict[str, int] = defaultdict(int)
        self.user_seconds: defaultdict[str, float] = defaultdict(float)
        self.qos_user_gpus: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.qos_user_jobs: defaultdict[tuple[str, str], int] = defaultdict(int)
        if not self.enabled:
            return
        for (account, user), used in usage.items():
            for name in accounting.ancestors(account):
                self.account_seconds[name] += used.period_gpu_s
            self.user_seconds[user] += used.period_gpu_s
        for job in running:
            gpus = job.gpu_count()
            remaining = gpus * max(0.0, job.expected_end - now) if not job.stopping else 0.0
            self._add(job.account, job.user, job.qos or default_qos, gpus, remaining)

    def _add(self, account: str, user: str, qos: str, gpus: int, seconds: float) -> None:
        for name in self.accounting.ancestors(account):
            self.account_gpus[name] += gpus
            self.account_jobs[name] += 1
            self.account_seconds[name] += seconds
        self.user_gpus[user] += gpus
        self.user_jobs[user] += 1
        self.user_seconds[user] += seconds
        self.qos_user_gpus[(qos, user)] += gpus
        self.qos_user_jobs[(qos, user)] += 1

    def blocked_by(self, job: PendingJob, gpus: int, duration_s: float) -> str | None:
        """The limit that starting ``job`` now would break (its reason code), or None."""
        found = self.blocking_limit(job, gpus, duration_s)
        return found.reason if found is not None else None

    def blocking_limit(self, job: PendingJob, gpus: int, duration_s: float) -> QuotaBlock | None:
        """The limit that starting ``job`` now would break, with what is used and allowed, or None."""
        if not self.enabled:
            return None
        accounting = self.accounting
        seconds = gpus * duration_s
        limits = accounting.account_limit_map
        for name in accounting.ancestors(job.account_name):
            found = limits.get(name)
            if found is None:
                continue
            if found.max_gpus is not None and self.account_gpus[name] + gpus > found.max_gpus:
                return QuotaBlock(Reason.QUOTA_GPUS, "account", name, "GPUs", self.account_gpus[name], found.max_gpus)
            if found.max_jobs is not None and self.account_jobs[name] + 1 > found.max_jobs:
                return QuotaBlock(Reason.QUOTA_JOBS, "account", name, "jobs", self.account_jobs[name], found.max_jobs)
            if found.max_gpu_hours is not None and self.account_seconds[name] + seconds > found.max_gpu_hours * 3600:
                return QuotaBlock(Reason.QUOTA_GPU_HOURS, "account", name, "GPU-hours",
                                  round(self.account_seconds[name] / 3600), found.max_gpu_hours)
        user_limit = accounting.user_limit_map.get(job.user)
        if user_limit is not None:
            if user_limit.max_gpus is not None and self.user_gpus[job.user] + gpus > user_limit.max_gpus:
                return QuotaBlock(Reason.QUOTA_GPUS, "user", job.user, "GPUs", self.user_gpus[job.user],
                                  user_limit.max_gpus)
            if user_limit.max_jobs is not None and self.user_jobs[job.user] + 1 > user_limit.max_jobs:
                return QuotaBlock(Reason.QUOTA_JOBS, "user", job.user, "jobs", self.user_jobs[job.user],
                                  user_limit.max_jobs)
            if (user_limit.max_gpu_hours is not None
                    and self.user_seconds[job.user] + seconds > user_limit.max_gpu_hours * 3600):
                return QuotaBlock(Reason.QUOTA_GPU_HOURS, "user", job.user, "GPU-hours",
                                  round(self.user_seconds[job.user] / 3600), user_limit.max_gpu_hours)
        qos_name = job.qos_name or self.default_qos
        qos = accounting.qos_map.get(qos_name)
        if qos is not None:
            key = (qos_name, job.user)
            if qos.max_gpus_per_user is not None and self.qos_user_gpus[key] + gpus > qos.max_gpus_per_user:
                return QuotaBlock(Reason.QOS_GPUS_PER_USER, "qos", qos_name, "GPUs per user", self.qos_user_gpus[key],
                                  qos.max_gpus_per_user)
            if qos.max_jobs_per_user is not None and self.qos_user_jobs[key] + 1 > qos.max_jobs_per_user:
                return QuotaBlock(Reason.QOS_JOBS_PER_USER, "qos", qos_name, "jobs per user", self.qos_user_jobs[key],
                                  qos.max_jobs_per_user)
        return None

    def started(self, job: PendingJob, gpus: int, duration_s: float) -> None:
        if self.enabled:
            self._add(job.account_name, job.user, job.qos_name or self.default_qos, gpus, gpus * duration_s)
