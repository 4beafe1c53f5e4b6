"""sbatch's output path patterns (``slurm-%j.out``, ``%x-%A_%4a.log``) expanded for one rank.

Pure; the agent expands them where the ranks start and gjob shows them expanded."""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: gjob imports this module, and typing costs ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable

_MAX_PAD_WIDTH = 32
_DIGITS = "0123456789"


def expand_output_pattern(
    pattern: str,
    *,
    job_id: int,
    rank: int,
    node_rank: int,
    array_job_id: int | None,
    array_task_id: int | None,
    user: str,
    job_name: str,
    step_id: int | None = None,
    node_name: str | None = None,
) -> str:
    """Expand sbatch's filename specifiers: %j job id, %t rank, %n node rank, %A array job id,
    %a array task id, %u user, %x job name, %% a literal percent, %J the job id (a step's: job id.step id),
    %N the node's name (given ``node_name``: sbatch's batch node, a step task's own node); and srun's %s step
    id (given ``step_id``).

    A width between % and a numeric specifier zero-pads it ("%4a" -> "0007"), as in Slurm. A job outside
    any array counts as an array of one: %A is its own id and %a is 0, so one pattern fits both kinds.
    Unknown specifiers are left as written rather than guessed at.
    """
    numbers = {
        "j": job_id,
        "t": rank,
        "n": node_rank,
        "A": array_job_id if array_job_id is not None else job_id,
        "a": array_task_id if array_task_id is not None else 0,
    }
    # sbatch expands %J (the batch step is the job id alone) and %N too: `-o out-%A_%a-%J.o` and
    # `-o %x-%j.%N.out` are common in real scripts, which found the letters left as written before.
    words = {"u": user, "x": job_name, "J": str(job_id)}
    if step_id is not None:
        numbers["s"] = step_id
        words["J"] = f"{job_id}.{step_id}"
    if node_name is not None:
        words["N"] = node_name

    def substitute(width: str, letter: str, written: str) -> str:
        if letter in numbers:
            # The width is capped so a typo like "%99999999j" cannot ask for a gigabyte of zeros.
            return str(numbers[letter]).zfill(min(int(width), _MAX_PAD_WIDTH) if width else 0)
        if letter in words:
            return words[letter]
        return written

    return _expand_specifiers(pattern, substitute)


def _expand_specifiers(pattern: str, substitute: Callable[[str, str, str], str]) -> str:
    """``pattern`` with each ``%%`` made ``%`` and each ``%`` + digits + an ASCII letter replaced by
    ``substitute(digits, letter, as written)``; any other ``%`` stays. By hand, not with re: gjob shows
    output paths, and importing re costs it ~6 ms."""
    out: list[str] = []
    i, end = 0, len(pattern)
    while i < end:
        char = pattern[i]
        if char != "%":
            out.append(char)
            i += 1
            continue
        if i + 1 < end and pattern[i + 1] == "%":
            out.append("%")
            i += 2
            continue
        letter_at = i + 1
        while letter_at < end and pattern[letter_at] in _DIGITS:
            letter_at += 1
        if letter_at < end and pattern[letter_at].isascii() and pattern[letter_at].isalpha():
            out.append(substitute(pattern[i + 1 : letter_at], pattern[letter_at], pattern[i : letter_at + 1]))
            i = letter_at + 1
        else:
            out.append("%")
            i += 1
    return "".join(out)


DEFAULT_OUTPUT = "garrison-%j.out"  # sbatch's slurm-%j.out, under our name
DEFAULT_ARRAY_OUTPUT = "garrison-%A_%a.out"


def resolve_output_path(
    pattern: str | None,
    *,
    workdir: str,
    job_id: int,
    rank: int,
    node_rank: int,
    array_job_id: int | None,
    array_task_id: int | None,
    user: str,
    job_name: str,
    node_name: str | None = None,
) -> str:
    """The file one rank writes to: ``pattern`` (or the default for a job or an array task) expanded, and a
    relative path taken from the job's working directory. The agent opens it; gjob shows it."""
    if pattern is None:
        pattern = DEFAULT_ARRAY_OUTPUT if array_job_id is not None else DEFAULT_OUTPUT
    path = expand_output_pattern(
        pattern, job_id=job_id, rank=rank, node_rank=node_rank, array_job_id=array_job_id,
        array_task_id=array_task_id, user=user, job_name=job_name, node_name=node_name,
    )
    return path if path.startswith("/") else f"{workdir.rstrip('/')}/{path}"
