"""The shared polling helper: returns the predicate's value, fails naming what it waited for."""

from __future__ import annotations

import pytest
from helpers.polling import WaitTimeout, wait_until


def test_returns_the_first_truthy_value() -> None:
    values = iter([None, 0, "", ["ready"]])
    assert wait_until(lambda: next(values), 5, what="the list") == ["ready"]


def test_a_timeout_names_what_it_waited_for_and_the_last_value_seen() -> None:
    calls: list[int] = []

    def never() -> list[int]:
        calls.append(len(calls))
        return []

    with pytest.raises(WaitTimeout, match=r"timed out after 0.05s waiting for the impossible; the last value seen was \[\]"):
        wait_until(never, 0.05, what="the impossible")
    assert len(calls) >= 2, "the predicate is asked again at the deadline, not only at the start"


def test_the_predicate_is_asked_once_even_with_no_time_left() -> None:
    assert wait_until(lambda: 7, 0, what="seven") == 7


def test_a_timeout_is_an_assertion_failure() -> None:
    assert issubclass(WaitTimeout, AssertionError)
