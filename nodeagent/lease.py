"""The agent's side of the node lease (fencing; the arithmetic is garrison/model/lease.py).

Each Register and heartbeat carries a numbered lease request; the controller answers with a grant for
that number. The lease runs from when the agent *sent* the request, so it can only end earlier than the
controller thinks, never later. The agent writes the lease's end (CLOCK_BOOTTIME seconds, one clock for
every process on the host) to the lease file, which every supervisor reads on its own timer: a frozen or
dead agent renews nothing, and its supervisors stop their ranks when the lease runs out.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from garrison.nodeagent.supervisor.core import boottime, read_lease_end

LEASE_FILE = "lease"
MAX_OUTSTANDING_REQUESTS = 64  # requests never answered (a lost link) are forgotten beyond this many


class NodeLease:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._numbers = itertools.count(1)
        self._sent_at: dict[int, float] = {}
        # A restarted agent inherits the lease its predecessor held: its supervisors still count on it.
        self.end: float | None = read_lease_end(str(path))
        self.duration_s: float | None = None  # the last grant's length

    def request(self) -> int:
        """A new lease request's number, remembering when it was sent."""
        number = next(self._numbers)
        self._sent_at[number] = boottime()
        while len(self._sent_at) > MAX_OUTSTANDING_REQUESTS:
            del self._sent_at[min(self._sent_at)]
        return number

    def granted(self, request: int, duration_s: float) -> bool:
        """The controller granted request ``request`` for ``duration_s``: extend the lease (never shorten it:
        grants may arrive out of order). Returns whether the lease file changed."""
        sent_at = self._sent_at.pop(request, None)
        if sent_at is None or not duration_s > 0:
            return False
        for older in [n for n in self._sent_at if n < request]:
            del self._sent_at[older]  # answered out of order or lost: a later grant covers them
        self.duration_s = duration_s
        end = sent_at + duration_s
        if self.end is not None and end <= self.end:
            return False
        self._write(end)
        self.end = end
        return True

    def extend_while_no_controller(self, refused_at: float) -> bool:
        """No controller process listened at the controller's address at ``refused_at`` (boottime when the
        connection that was refused was begun: its host answers, its port is closed). Nothing can requeue this
        node's jobs then, and a controller that starts later waits the fence delay (longer than the lease) from
        when it begins to listen before requeuing: so a lease that has not run out may be extended to its length
        from ``refused_at``. A controller restart or outage of any length kills nothing. Returns whether the
        lease was extended (never an expired one: its ranks have been stopped and the controller may have
        moved on).

        Counted from the refusal, not from now: an agent stalled between the two (a long GC pause, a starved
        CPU, SIGSTOP) would otherwise extend the lease from a moment when a controller may have listened for
        a while already, counting the node's silence, and a lease running past its fence delay."""
        if self.end is None or self.duration_s is None or self.expired():
            return False
        end = refused_at + self.duration_s
        if end <= self.end:
            return False
        self._write(end)
        self.end = end
        return True

    def ran_out_since(self, since: float) -> bool:
        """Whether a lease renewed after ``since`` (boottime) has run out since: a link that was granted a
        lease and then stopped renewing it (the agent froze, or no grant came back for the lease's length)."""
        return self.end is not None and self.end > since and self.expired()

    def expired(self) -> bool:
        """Whether a lease was held and has run out (the supervisors have stopped, or are stopping, their ranks)."""
        return self.end is not None and boottime() >= self.end

    def remaining_s(self) -> float | None:
        return None if self.end is None else self.end - boottime()

    def _write(self, end: float) -> None:
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, f"{end:.6f}\n".encode())
        finally:
            os.close(fd)
        os.chmod(temporary, 0o644)  # supervisors may run as another user than the agent in tests
        os.replace(temporary, self.path)
