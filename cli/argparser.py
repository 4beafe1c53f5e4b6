"""argparse for the commands that must start fast (gsub, gqueue), instead of click like the others:
click's import alone costs ~20 ms of a call that should take well under 100 ms.

``UsageError`` is the one-line complaint about how a command was called (also raised by the value
parsers in parsing.py). ``Parser`` raises it with argparse's one-line message instead of printing usage
and exiting, so the command decides how to report it; and its help formatter does not import shutil
(~4 ms, which argparse pays on every ``add_argument``) just to learn the terminal's width.
"""

from __future__ import annotations

import argparse
import os

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms
if TYPE_CHECKING:
    from typing import NoReturn


class UsageError(Exception):
    """A mistake in how a command was called. The message is one line; the CLI exits with ``exit_status``."""

    exit_status = 2


def _formatter(prog: str) -> argparse.HelpFormatter:
    try:
        width = os.get_terminal_size().columns
    except OSError:
        width = int(os.environ.get("COLUMNS", "80") or 80)
    return argparse.HelpFormatter(prog, width=max(width - 2, 40))  # argparse's own margin of 2


class Parser(argparse.ArgumentParser):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(formatter_class=_formatter, allow_abbrev=False, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)
