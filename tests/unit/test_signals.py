"""Signal names as users write them: gsub --signal SIG@SECS and gcancel --signal SIG."""

from __future__ import annotations

import signal

import pytest

from garrison.controller.signals import SignalRequest, parse_signal_name, parse_signal_request


@pytest.mark.parametrize(("text", "number"), [("USR1", 10), ("sigusr2", 12), (" TERM ", 15), ("9", 9), ("STOP", 19)])
def test_signal_names_and_numbers(text: str, number: int) -> None:
    assert parse_signal_name(text, "--signal") == number


@pytest.mark.parametrize(("text", "message"), [
    ("BOGUS", "--signal: unknown signal 'BOGUS'"),
    ("", "--signal: unknown signal ''"),
    ("0", "--signal: no signal 0"),
    (str(signal.NSIG), f"--signal: no signal {signal.NSIG}"),
    ("-1", "--signal: unknown signal '-1'"),
])
def test_bad_signals_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_signal_name(text, "--signal")
    assert str(caught.value) == message


@pytest.mark.parametrize(("text", "request_"), [
    ("USR1@90", SignalRequest(10, 90)),
    ("B:SIGUSR2@30", SignalRequest(12, 30, batch_only=True)),
    ("b:usr1@30", SignalRequest(10, 30, batch_only=True)),
    ("R:USR1@30", SignalRequest(10, 30)),  # R: changes nothing here: every rank's process group
    ("10", SignalRequest(10, 60)),  # Slurm's default lead time
])
def test_warning_requests(text: str, request_: SignalRequest) -> None:
    assert parse_signal_request(text) == request_


@pytest.mark.parametrize(("text", "message"), [
    ("KILL@10", "--signal: signal 9 cannot be used as a warning"),
    ("USR1@0", "--signal: lead time must be 1-65535 seconds, got 'USR1@0'"),
    ("NOPE@5", "--signal: unknown signal 'NOPE'"),
])
def test_bad_warning_requests_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_signal_request(text)
    assert str(caught.value) == message
