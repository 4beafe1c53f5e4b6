"""squeue's view of job arrays: the pending tasks of one array that wait for the same reason share one row,
``5_[11-100%10]``. One rule for the controller, which folds a listing before sending it (gqueue: 50,000
pending tasks are one row, not 50,000 messages), and for the CLI, which folds what it has sorted itself
(squeue -S). Imports nothing: gqueue's fast path uses it."""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: importing typing costs a CLI call ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterable, Sequence
    from typing import TypeVar

    T = TypeVar("T")


def index_ranges(indices: Iterable[int]) -> str:
    """``[1, 2, 3, 5, 7, 8]`` -> ``"1-3,5,7-8"``: array task ids as squeue writes them."""
    runs: list[list[int]] = []
    for index in sorted(set(indices)):
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def folded_id(array_job_id: int, task_ids: Iterable[int], max_running: int | None) -> str:
    """The row's id: ``5_[11-100%10]`` (``%10``: at most ten of the array's tasks run at once)."""
    return f"{array_job_id}_[{index_ranges(task_ids)}{f'%{max_running}' if max_running else ''}]"


def fold(items: Iterable[T], group_of: Callable[[T], Hashable | None]) -> list[T | Sequence[T]]:
    """``items`` in order, those with the same group (``group_of``: None for an item that is never folded,
    such as a running task) gathered at the place of the first of them: a list where there are several, the
    item itself where it is alone."""
    groups: dict[Hashable, list[T]] = {}
    order: list[T | list[T]] = []
    for item in items:
        key = group_of(item)
        if key is None:
            order.append(item)
            continue
        group = groups.get(key)
        if group is None:
            groups[key] = group = []
            order.append(group)
        group.append(item)
    return [entry[0] if isinstance(entry, list) and len(entry) == 1 else entry for entry in order]
