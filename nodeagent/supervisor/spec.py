"""The two files the agent and a supervisor share in a job directory.

``launch.json`` (agent -> supervisor) is a LaunchSpec, the supervisor's own file format,
built from the controller's launch description in one place (``nodeagent.jobs.supervisor_spec``);
``status.json`` (supervisor -> agent) is a SupervisorStatus. Standard library only. The supervisor process itself
does not import this module (dataclasses costs ~10 ms of start-up); core.py reads the
same launch schema into plain classes, and the tests check that the two agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar

SupervisorState = Literal["starting", "running", "finished"]
SUPERVISOR_STATES: tuple[SupervisorState, ...] = ("starting", "running", "finished")

_T = TypeVar("_T")


def _field(document: dict[str, Any], key: str, kind: type[_T]) -> _T:
    if key not in document:
        raise ValueError(f"missing field {key!r}")
    value = document[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    # bool is an int subclass; a true/false where a number belongs is a writer's bug.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ValueError(f"field {key!r} must be {kind.__name__}, not {type(value).__name__}")
    return value


def _optional_field(document: dict[str, Any], key: str, kind: type[_T]) -> _T | None:
    if document.get(key) is None:
        return None
    return _field(document, key, kind)


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object")
    return value


def _string_map(value: dict[str, Any] | None) -> dict[str, str] | None:
    if value is None:
        return None
    if not all(isinstance(key, str) and isinstance(item, str) for key, item in value.items()):
        raise ValueError("cgroup must map controller names to directories")
    return dict(value)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _shallow_dict(spec: Any) -> dict[str, Any]:
    """A dataclass's fields by name, the values themselves (JSON-ready: lists, dicts, str, int...)."""
    names = _FIELD_NAMES.get(type(spec))
    if names is None:
        names = _FIELD_NAMES[type(spec)] = tuple(f.name for f in fields(spec))
    return {name: getattr(spec, name) for name in names}


@dataclass(frozen=True)
class RankSpec:
    """One process of the job on this node.

    stdout and stderr are paths opened for appending (created if missing) with the
    job user's rights; they may be the same file. Relative paths resolve against cwd.
    truncate lists those of them this rank empties first (--open-mode: a job's first attempt).
    env is the rank's entire environment: nothing is inherited from the agent.
    """

    rank: int
    argv: list[str]
    env: dict[str, str]
    cwd: str
    stdout: str
    stderr: str
    truncate: list[str] = field(default_factory=list)
    cpus: list[int] | None = None  # this rank's own CPU affinity (a step's --cpu-bind), over the launch's

    def __post_init__(self) -> None:
        if not self.argv or not all(isinstance(arg, str) for arg in self.argv):
            raise ValueError(f"rank {self.rank}: argv must be a non-empty list of strings")
        if not all(isinstance(key, str) and isinstance(value, str) for key, value in self.env.items()):
            raise ValueError(f"rank {self.rank}: env must map strings to strings")

    @classmethod
    def from_dict(cls, document: dict[str, Any]) -> RankSpec:
        return cls(
            rank=_field(document, "rank", int),
            argv=list(_field(document, "argv", list)),
            env=dict(_field(document, "env", dict)),
            cwd=_field(document, "cwd", str),
            stdout=_field(document, "stdout", str),
            stderr=_field(document, "stderr", str),
            truncate=[str(path) for path in _optional_field(document, "truncate", list) or []],
            cpus=_optional_field(document, "cpus", list),
        )


@dataclass(frozen=True)
class LaunchSpec:
    """launch.json: what one supervisor runs, as whom, and whom it tells when done.

    If uid differs from the supervisor's own (the agent runs as root in production),
    each rank switches to uid/gid/groups before it touches any of its files.
    kill_wait_s is the grace period between SIGTERM and SIGKILL on terminate.
    notify_socket, if set, is the agent's AF_UNIX datagram socket: once status.json is
    final the supervisor sends it {"job_id": ..., "attempt": ...}, best effort.
    """

    job_id: int
    attempt: int
    uid: int
    gid: int
    groups: list[int]
    user: str
    ranks: list[RankSpec]
    kill_wait_s: float
    notify_socket: str | None = None
    umask: int | None = None  # the submitter's umask, applied after dropping privileges
    cpus: list[int] | None = None  # CPU ids every rank is bound to (sched_setaffinity); None: not bound
    batch_signal: int = 0  # --signal=B:SIG: forwarded SIG reaches each rank's own process, not its group
    # The node's lease file (fencing): once the lease it holds has run out, the ranks are stopped. None: no lease.
    lease_file: str | None = None
    start_barrier: bool = False  # a gang's: start no rank before the agent creates core.RELEASE_FILE
    # The attempt's cgroup directory per v1 controller (nodeagent/containment/); None: unconfined. Every rank
    # joins them before exec, and the supervisor empties and removes them when the attempt ends.
    cgroup: dict[str, str] | None = None
    gpus: list[int] = field(default_factory=list)  # the allocated GPU indices (for NVML's accounting at the end)

    def __post_init__(self) -> None:
        if not self.ranks:
            raise ValueError("a launch needs at least one rank")
        numbers = [rank.rank for rank in self.ranks]
        if len(set(numbers)) != len(numbers):
            raise ValueError(f"duplicate rank numbers: {numbers}")
        if self.kill_wait_s < 0:
            raise ValueError("kill_wait_s must not be negative")

    def to_json(self) -> str:
        # By hand rather than with dataclasses.asdict, and without an indent: asdict deep-copies every value
        # (each rank's whole environment, string by string), and an indent makes json use its pure-Python
        # encoder instead of its C one. Together they were a fifth of the agent's Python time per job.
        document = _shallow_dict(self)
        document["ranks"] = [_shallow_dict(rank) for rank in self.ranks]
        return json.dumps(document, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> LaunchSpec:
        document = _object(json.loads(text), "launch")
        groups = _field(document, "groups", list)
        if not all(isinstance(group, int) and not isinstance(group, bool) for group in groups):
            raise ValueError("groups must be a list of integers")
        return cls(
            job_id=_field(document, "job_id", int),
            attempt=_field(document, "attempt", int),
            uid=_field(document, "uid", int),
            gid=_field(document, "gid", int),
            groups=list(groups),
            user=_field(document, "user", str),
            ranks=[RankSpec.from_dict(_object(rank, "rank")) for rank in _field(document, "ranks", list)],
            kill_wait_s=_field(document, "kill_wait_s", float),
            notify_socket=_optional_field(document, "notify_socket", str),
            umask=_optional_field(document, "umask", int),
            cpus=_optional_field(document, "cpus", list),
            batch_signal=_optional_field(document, "batch_signal", int) or 0,
            lease_file=_optional_field(document, "lease_file", str),
            start_barrier=_optional_field(document, "start_barrier", bool) or False,
            cgroup=_string_map(_optional_field(document, "cgroup", dict)),
            gpus=[int(gpu) for gpu in _optional_field(document, "gpus", list) or []],
        )


@dataclass(frozen=True)
class RankStatus:
    """One rank in status.json.

    pid is the rank's leader; the rank runs in its own session, so pgid == pid. A rank
    has ended when its whole process group is gone, not merely its leader; exit_code is
    the leader's (128+N for death by signal N) and is null until the rank has ended, or
    if it never started. error is a one-line reason if the rank could not be started.
    """

    rank: int
    pid: int | None
    pgid: int | None
    exit_code: int | None
    ended: bool
    error: str | None
    # The leader's start time in clock ticks since boot (/proc/PID/stat field 22), so
    # that a reused process group number is not mistaken for the rank's.
    leader_start_ticks: int | None = None
    # The signal the leader died of (exit_code is then 128+signal), null if it exited; absent from the
    # status of a supervisor older than this field, which is read as having exited.
    signal: int | None = None

    @classmethod
    def from_dict(cls, document: dict[str, Any]) -> RankStatus:
        return cls(
            rank=_field(document, "rank", int),
            pid=_optional_field(document, "pid", int),
            pgid=_optional_field(document, "pgid", int),
            exit_code=_optional_field(document, "exit_code", int),
            ended=_field(document, "ended", bool),
            error=_optional_field(document, "error", str),
            leader_start_ticks=_optional_field(document, "leader_start_ticks", int),
            signal=_optional_field(document, "signal", int),
        )


@dataclass(frozen=True)
class SupervisorStatus:
    """status.json, rewritten atomically by the supervisor as the attempt progresses.

    terminated_by is null for a job that ended on its own, "SIGTERM" after terminate()
    (whether or not the grace period ran out and SIGKILL followed) and "SIGKILL" after
    kill_now(). error is set only if the supervisor itself failed (e.g. an unreadable
    launch.json, in which case job_id and attempt are null).
    """

    job_id: int | None
    attempt: int | None
    supervisor_pid: int
    state: SupervisorState
    started_at: float | None
    finished_at: float | None
    ranks: list[RankStatus] = field(default_factory=list)
    terminated_by: str | None = None
    error: str | None = None
    lease_expired: bool = False  # the node's lease ran out: the supervisor stopped the ranks itself
    # From the attempt's cgroup once it is empty (cgroup_runtime.usage): max_rss_bytes, cpu_time_ns,
    # oom_kills, memory_failcnt. None for an unconfined attempt.
    usage: dict[str, int] | None = None
    out_of_memory: bool = False  # the kernel's OOM killer killed a process of the attempt (its memory limit)

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    def to_json(self) -> str:
        document = _shallow_dict(self)  # as LaunchSpec.to_json: no deep copy
        document["ranks"] = [_shallow_dict(rank) for rank in self.ranks]
        return json.dumps(document)

    @classmethod
    def from_json(cls, text: str | bytes) -> SupervisorStatus:
        document = _object(json.loads(text), "status")
        state = _field(document, "state", str)
        if state not in SUPERVISOR_STATES:
            raise ValueError(f"unknown supervisor state {state!r}")
        return cls(
            job_id=_optional_field(document, "job_id", int),
            attempt=_optional_field(document, "attempt", int),
            supervisor_pid=_field(document, "supervisor_pid", int),
            state=state,  # type: ignore[arg-type]  # checked against SUPERVISOR_STATES above
            started_at=_optional_field(document, "started_at", float),
            finished_at=_optional_field(document, "finished_at", float),
            ranks=[RankStatus.from_dict(_object(rank, "rank")) for rank in _field(document, "ranks", list)],
            terminated_by=_optional_field(document, "terminated_by", str),
            error=_optional_field(document, "error", str),
            lease_expired=_optional_field(document, "lease_expired", bool) or False,
            usage=_usage_map(_optional_field(document, "usage", dict)),
            out_of_memory=_optional_field(document, "out_of_memory", bool) or False,
        )


def _usage_map(value: dict[str, Any] | None) -> dict[str, int] | None:
    if value is None:
        return None
    if not all(isinstance(item, int) and not isinstance(item, bool) for item in value.values()):
        raise ValueError("usage must map names to integers")
    return {str(key): item for key, item in value.items()}
