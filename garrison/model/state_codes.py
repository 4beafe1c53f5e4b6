"""Slurm's compact job state codes (squeue's %t: PD, R, CG, ...), both ways. One table for every program:
squeue and sacct print them, and gcancel, gqueue and the controller's state filters read them as Slurm's
commands do (``scancel -t PD``). Pure, and imports nothing: the CLI's lean commands use it."""

# The long name (a JobState's value) -> its code.
STATE_CODES = {
    "PENDING": "PD", "CONFIGURING": "CF", "RUNNING": "R", "COMPLETING": "CG", "COMPLETED": "CD",
    "FAILED": "F", "CANCELLED": "CA", "TIMEOUT": "TO", "NODE_FAIL": "NF", "PREEMPTED": "PR",
    "OUT_OF_MEMORY": "OOM", "REQUEUED": "RQ", "SUSPENDED": "S", "BOOT_FAIL": "BF", "DEADLINE": "DL",
}
STATE_NAMES = {code: name for name, code in STATE_CODES.items()}  # code -> long name


def long_state_name(text: str) -> str:
    """``text`` (a code or a long name, any case) as the long name; anything else upper-cased, as it came."""
    upper = text.strip().upper()
    return STATE_NAMES.get(upper, upper)
