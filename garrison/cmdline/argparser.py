"""argparse for the commands that must start fast (gsub, gqueue), instead of click like the others:
click's import alone costs ~20 ms of a call that should take well under 100 ms.

``UsageError`` is the one-line complaint about how a command was called (also raised by the value
parsers in parsing.py). ``Parser`` raises it with argparse's one-line message instead of printing usage
and exiting, so the command decides how to report it; and its help formatter does not import shutil
(~4 ms, which argparse pays on every ``add_argument``) just to learn the terminal's width.

An option that takes a value takes the next word, whatever it looks like, as click and sbatch do
(``--wrap -x``, ``-J -dash-``); argparse alone would read a value that begins with ``-`` as an option.
A unique prefix of a long option stands for it (``--depend`` for ``--dependency``), as with getopt_long.
An option listed in ``bare_values`` takes its value only attached (``--nice=50``); alone it stands for
its listed value, as sbatch's ``--nice`` alone means 100.

Options in ``ignored_values`` (with a value) and ``ignored_flags`` (without, or with a value only attached, as
Slurm's ``--no-kill[=off]``) are accepted and dropped before argparse sees them, and their long names collected in ``ignored``: sbatch options a Slurm script carries that
gsub does not act on. Dropped, not declared: 50 more ``add_argument`` calls would cost every gsub ~2 ms.
``aliases`` are other names of declared options (Slurm's deprecated ``--tasks-per-node`` for
``--ntasks-per-node``), read as the option they name.
"""

from __future__ import annotations

import argparse
import os
import sys

from garrison.cmdline.usage import UsageError as UsageError  # re-exported: raised by Parser

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, NoReturn


def _formatter(prog: str) -> argparse.HelpFormatter:
    try:
        width = os.get_terminal_size().columns
    except OSError:
        width = int(os.environ.get("COLUMNS", "80") or 80)
    return argparse.HelpFormatter(prog, width=max(width - 2, 40))  # argparse's own margin of 2


class Parser(argparse.ArgumentParser):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(formatter_class=_formatter, allow_abbrev=False, **kwargs)  # type: ignore[arg-type]
        # Options whose value is optional and must be attached (sbatch's --nice[=N]): alone, they mean this.
        self.bare_values: dict[str, str] = {}
        self.ignored_values: dict[str, str] = {}  # flag -> its long name
        self.ignored_flags: dict[str, str] = {}
        self.aliases: dict[str, str] = {}  # another long name -> the declared option it stands for
        # The command's Slurm counterpart's long names ("--gres", ...; garrison/cmdline/slurm_names.py): a prefix
        # is resolved over these too, so a word never stands for another option than it does to Slurm.
        self.slurm_names: frozenset[str] = frozenset()
        self.slurm_command = "Slurm"  # the counterpart's name, for the error about an option of it we lack
        self.ignored: list[str] = []  # what the last parse_args dropped, in order, each once

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def parse_args(self, args: Sequence[str] | None = None, namespace: None = None) -> argparse.Namespace:  # type: ignore[override]
        words = list(sys.argv[1:] if args is None else args)
        self.ignored = []
        return super().parse_args(self._values_attached(words), namespace)

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # argparse drops a "--" among an option's values as its end-of-options marker, so `--time=--` or
        # `-o --` left the option an empty list; getopt, as Slurm's commands read it, takes "--" as the value.
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            return self._get_value(action, "--")
        return super()._get_values(action, arg_strings)

    def _ignore(self, word: str, index: int, words: list[str]) -> int:
        """How many words an ignored option at ``words[index]`` spans (0: ``word`` is not one)."""
        name, attached, _ = word.partition("=")
        long_name = self.ignored_flags.get(word) or self.ignored_values.get(name)
        if long_name is None and attached and name.startswith("--"):
            long_name = self.ignored_flags.get(name)  # a flag's optional value, attached: --no-kill=off
        if long_name is None and not word.startswith("--") and len(word) > 2:
            long_name = self.ignored_values.get(word[:2])  # a short option's value attached: -Lscratch
            attached = "attached"
        if long_name is None:
            return 0
        if long_name not in self.ignored:
            self.ignored.append(long_name)
        if word in self.ignored_flags or attached:
            return 1
        if index + 1 >= len(words):
            self.error(f"argument {word}: expected one argument")
        return 2

    def _unabbreviated(self, word: str) -> str:
        """``word`` with a long option's unique prefix made whole (``--depend=afterok:1`` is ``--dependency=...``),
        as getopt_long, which Slurm's commands use, reads it; an exact name always wins (``--gpus`` is not
        ``--gpus-per-node``), and a prefix of several names is an error that names them."""
        if not word.startswith("--") or word == "--":
            return word
        name, equals, value = word.partition("=")
        known = {flag for action in self._actions for flag in action.option_strings if flag.startswith("--")}
        known |= {flag for flag in (*self.ignored_values, *self.ignored_flags, *self.bare_values, *self.aliases)
                  if flag.startswith("--")}
        if name not in known and name not in self.slurm_names:
            # An alias and the option it names are one option, as getopt_long counts them (the same val).
            matches = sorted({self.aliases.get(flag, flag) for flag in known | self.slurm_names if flag.startswith(name)})
            if len(matches) > 1:
                self.error(f"option {name} is ambiguous: {', '.join(matches)}")
            if matches:
                name = matches[0]
        if name in self.slurm_names and name not in known:
            # Said as such, not as argparse's "unrecognized arguments": the script is right for Slurm.
            self.error(f"{name}: {self.slurm_command}'s option is not supported by {self.prog}")
        return f"{self.aliases.get(name, name)}{equals}{value}"

    def _values_attached(self, words: list[str]) -> list[str]:
        """``words`` with each value-taking option joined to the word after it (``--wrap=-x``), up to the first
        positional argument or ``--``: after a script's name, the words are the script's own."""
        takes_value = {
            flag for action in self._actions if action.option_strings and action.nargs != 0 for flag in action.option_strings
        }
        joined: list[str] = []
        index = 0
        while index < len(words):
            word = self._unabbreviated(words[index])
            if word == "--" or not word.startswith("-") or word == "-":
                return joined + words[index:]
            skipped = self._ignore(word, index, words)
            if skipped:
                index += skipped
            elif word in self.bare_values:
                joined.append(f"{word}={self.bare_values[word]}")
                index += 1
            elif word in takes_value and index + 1 < len(words):
                joined.append(f"{word}={words[index + 1]}")
                index += 2
            else:
                joined.append(word)
                index += 1
        return joined
