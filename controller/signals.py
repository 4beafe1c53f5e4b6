"""`--signal [R:|B:]SIG@SECS`, as in Slurm: which signal a job wants before its time limit (and before
preemption), and how many seconds ahead. Pure parsing, shared by the controller and its tests."""

from __future__ import annotations

import signal
from dataclasses import dataclass

MAX_WARNING_S = 65535  # Slurm's limit for the lead time
DEFAULT_WARNING_SIGNAL = signal.SIGUSR1


@dataclass(frozen=True, slots=True)
class SignalRequest:
    signum: int
    seconds: int
    batch_only: bool = False  # B:: the batch shell only (each rank's own process), not its process group


def parse_signal_request(text: str) -> SignalRequest:
    """"USR1@90", "SIGUSR2@60", "B:USR1@30", "10@5" -> SignalRequest. ValueError with one line otherwise.

    As in Slurm, B: signals only the batch shell: each rank's own process, not the rest of its process
    group (the shell's children). R: (reservation) is accepted and changes nothing: like no prefix, the
    signal reaches every rank's whole process group.
    """
    spec = text.strip()
    batch_only = False
    for prefix in ("RB:", "BR:", "R:", "B:"):
        if spec.upper().startswith(prefix):
            spec = spec[len(prefix) :]
            batch_only = "B" in prefix
            break
    name, at, secs = spec.partition("@")
    if not at:
        secs = "60"  # Slurm's default lead time
    if not secs.isdigit() or not 0 < int(secs) <= MAX_WARNING_S:
        raise ValueError(f"--signal: lead time must be 1-{MAX_WARNING_S} seconds, got {text!r}")
    number = parse_signal_name(name, "--signal")
    if number in (signal.SIGKILL, signal.SIGSTOP):
        raise ValueError(f"--signal: signal {number} cannot be used as a warning")
    return SignalRequest(number, int(secs), batch_only)


def parse_signal_name(text: str, option: str) -> int:
    """"USR1", "sigusr1", "10" -> 10: a signal this machine has. ValueError naming ``option`` otherwise."""
    name = text.strip().upper()
    if name.isdigit():
        number = int(name)
        if not 0 < number < signal.NSIG:
            raise ValueError(f"{option}: no signal {number}")
        return number
    try:
        return int(signal.Signals[name if name.startswith("SIG") else "SIG" + name])
    except KeyError:
        raise ValueError(f"{option}: unknown signal {name!r}") from None
