"""Per-user caps on what sits in the queue: Slurm's MaxSubmitJobs (issue 20).

Without one, a single user could fill the controller's memory and every scheduling cycle with pending jobs.
``max_submit_jobs`` bounds each user's jobs that have not ended (pending, running, being stopped), counting
every task of an array, as Slurm counts them; a submission that would pass it is refused whole, with one
line saying why. (The size of one array is bounded by ``max_array_size``, checked in validate.py.)
"""

from __future__ import annotations

from garrison.controller.userjobs import UserJobs


class SubmitLimitExceeded(Exception):
    """A submission would take a user past a queue cap (gRPC RESOURCE_EXHAUSTED)."""


def check_submit_cap(counts: UserJobs, user: str, adding: int, cap: int) -> None:
    """Refuse ``adding`` more jobs for ``user`` if that passes ``cap`` (0: no cap)."""
    if cap <= 0:
        return
    active = counts.active(user)
    if active + adding > cap:
        raise SubmitLimitExceeded(
            f"job submit limit: {user} has {active} jobs pending or running and this submission adds {adding}; "
            f"at most {cap} (max_submit_jobs)"
        )
