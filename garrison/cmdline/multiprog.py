"""srun --multi-prog: a different program per task, from a configuration file. Pure: text in, a command out.

The file, as srun reads it: one line per set of tasks, ``RANKS PROGRAM [ARGS...]``, where RANKS is a comma
list of task numbers and ranges (``0``, ``1-3``, ``0,4-7``) or ``*`` for every task no other line names;
``%t`` in the program or its arguments is the task's number and ``%o`` its offset within its line's ranks
(task 5 of ``4-7`` has offset 1); a line whose first character is ``#`` is a comment, and quotes group words
as in a shell. A task named twice is refused, as srun refuses it.

Every task of a step runs the same command in Garrison, so the file becomes one small (bash) program that
picks the task's line by its ``SLURM_PROCID`` and ``exec``s it: no change to how steps are launched, and
the tasks' programs run as their own processes, with their signals and exit codes, exactly as srun's do.
"""

from __future__ import annotations

import shlex

from garrison.cmdline.usage import UsageError

MAX_TASK = 1 << 20  # a rank list past this is a typo, not a step
TASK_VARIABLE = "SLURM_PROCID"


def _ranks(text: str, where: str) -> list[tuple[int, int]]:
    """``0,2-4`` -> [(0, 0), (2, 4)]: inclusive ranges, as written."""
    ranges: list[tuple[int, int]] = []
    for part in text.split(","):
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise UsageError(f"{where}: invalid task ranks {text!r} (expected e.g. 0, 1-3, 0,4-7 or *)")
        low, high = int(first), int(last) if dash else int(first)
        if low > high or high > MAX_TASK:
            raise UsageError(f"{where}: invalid task range {part!r}")
        ranges.append((low, high))
    return ranges


def _word(text: str) -> str:
    """One argument for sh, with %t and %o standing for the task's number and offset."""
    pieces: list[str] = []
    literal = ""
    index = 0
    while index < len(text):
        if text.startswith(("%t", "%o"), index):
            if literal:
                pieces.append(shlex.quote(literal))
                literal = ""
            pieces.append(f'"${TASK_VARIABLE}"' if text[index + 1] == "t" else '"$o"')
            index += 2
        else:
            literal += text[index]
            index += 1
    if literal or not pieces:
        pieces.append(shlex.quote(literal))
    return "".join(pieces)


def dispatcher(config_text: str, source: str, ntasks: int | None = None) -> list[str]:
    """The argv every task runs: ``sh -c PROGRAM``, where PROGRAM execs the task's own line of the file."""
    branches: list[str] = []
    fallback: str | None = None
    claimed: list[tuple[int, int]] = []
    for number, line in enumerate(config_text.splitlines(), 1):
        where = f"--multi-prog {source}, line {number}"
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            words = shlex.split(line, comments=False)
        except ValueError as error:
            raise UsageError(f"{where}: {error}") from None
        if len(words) < 2:
            raise UsageError(f"{where}: expected task ranks and a program")
        command = "exec " + " ".join(_word(word) for word in words[1:])
        if words[0] == "*":
            if fallback is not None:
                raise UsageError(f"{where}: a second '*' line")
            fallback = f"o=${TASK_VARIABLE}; {command}"
            continue
        offset = 0
        for low, high in _ranks(words[0], where):
            for other_low, other_high in claimed:
                if low <= other_high and other_low <= high:
                    task = max(low, other_low)
                    raise UsageError(f"{where}: task {task} is named twice")
            claimed.append((low, high))
            test = (f'[ "${TASK_VARIABLE}" -eq {low} ]' if low == high
                    else f'[ "${TASK_VARIABLE}" -ge {low} ] && [ "${TASK_VARIABLE}" -le {high} ]')
            branches.append(f"if {test}; then o=$((${TASK_VARIABLE} - {low} + {offset})); {command}; fi")
            offset += high - low + 1
    if not branches and fallback is None:
        raise UsageError(f"--multi-prog {source}: no task has a program")
    if ntasks is not None and fallback is None:
        covered = {task for low, high in claimed for task in range(low, min(high, ntasks - 1) + 1)}
        missing = [task for task in range(ntasks) if task not in covered]
        if missing:
            raise UsageError(f"--multi-prog {source}: no program for task {missing[0]} of {ntasks}")
    complaint = shlex.quote(f"srun: error: --multi-prog {source}: no program for task ") + f'"${TASK_VARIABLE}"'
    last = fallback or f"printf '%s\\n' {complaint} >&2; exit 1"
    # bash -p, not sh: dash would drop the exported shell functions (Lmod's `module`) and other variables whose
    # names are no identifiers before exec'ing the task's program, which srun's tasks get (bin/'s launchers too).
    return ["/bin/bash", "-p", "-c", "\n".join([*branches, last]), "srun-multi-prog"]
