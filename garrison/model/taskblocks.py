"""How a step's tasks are spread over its nodes: here alone, with nothing imported, because gsrun needs it
for its output file names (%t, %n) and every import is paid by each srun line of a batch script."""

from __future__ import annotations


def block_counts(ntasks: int, nodes: int, per_node: int | None) -> list[int]:
    """srun's block distribution: --ntasks-per-node fills each node in turn, else the tasks are shared out
    evenly, the first nodes taking one more when they do not divide."""
    if per_node is not None:
        counts = []
        left = ntasks
        for _ in range(nodes):
            counts.append(min(per_node, left))
            left -= counts[-1]
        return counts
    share, extra = divmod(ntasks, nodes)
    return [share + (1 if i < extra else 0) for i in range(nodes)]
