"""sbatch -p a,b: a job may name several partitions and starts in whichever can run it first.

While such a job is pending its partition is the comma list (what squeue shows, ``PARTITION`` ``a,b``), in
the order the scheduler tries them; once it starts, the one it started in. Its spec keeps the list, so a
requeued job waits in every partition again, as Slurm's does.
"""

from __future__ import annotations

SEPARATOR = ","


def partition_names(text: str) -> tuple[str, ...]:
    """The partitions a partition field names, in order, each once: ``"a,b"`` -> ``("a", "b")``; a single
    name -> that name alone. Empty items (``"a,,b"``, a trailing comma) are dropped, as sbatch drops them."""
    if SEPARATOR not in text:
        return (text,)
    names: list[str] = []
    for item in text.split(SEPARATOR):
        name = item.strip()
        if name and name not in names:
            names.append(name)
    return tuple(names)


def first_partition(text: str) -> str:
    """The partition a job is tried in first (the only one when it names one)."""
    return text.split(SEPARATOR, 1)[0] if SEPARATOR in text else text


def in_partition(field: str, name: str) -> bool:
    """Whether a job whose partition field is ``field`` waits (or runs) in partition ``name``."""
    return field == name or (SEPARATOR in field and name in partition_names(field))


def joined(names: tuple[str, ...] | list[str]) -> str:
    return SEPARATOR.join(names)
