"""Node features and sbatch's ``-C/--constraint`` expressions: ``a100``, ``a100&ib``, ``a100|h100``.

Pure. A node's features come from its agent's configuration (``features = ["a100", "ib"]``); a job's
constraint is a Slurm feature expression: names joined by ``&`` (and) and ``|`` (or), ``&`` binding tighter,
as in Slurm (``a|b&c`` is ``a`` or (``b`` and ``c``)). Matching is case-sensitive, as Slurm's is.

Slurm's matching OR, the whole expression in brackets (``[a5000|a6000|a100]``, common in real scripts), asks
that every node of the job have the same one of the alternatives: for a one-node job it is the plain OR, and
placement tries a job of several nodes on one alternative at a time (``is_matching_or``). Slurm's rarer forms
(brackets around part of an expression, ``*count``, ``,`` for and) are refused with a one-line error rather
than misread.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence

_NAME = re.compile(r"[A-Za-z0-9_.:+-]{1,64}")
MAX_CONSTRAINT_LEN = 1024


class ConstraintError(ValueError):
    """A constraint that cannot be read; the message is one line."""


def _shown(text: str) -> str:
    return repr(text if len(text) <= 100 else text[:100] + "...")


def parse_constraint(text: str) -> tuple[frozenset[str], ...]:
    """The expression in disjunctive form: a node matches if it has every feature of any one of the sets.
    ``"a100&ib|h100"`` -> ``(frozenset({"a100", "ib"}), frozenset({"h100"}))``."""
    if len(text) > MAX_CONSTRAINT_LEN:
        raise ConstraintError(f"--constraint is longer than {MAX_CONSTRAINT_LEN} characters")
    inside = text[1:-1] if is_matching_or(text) else text
    if "[" in inside or "]" in inside:
        raise ConstraintError(f"invalid --constraint {_shown(text)}: brackets only around the whole expression "
                              "([a|b]: every node has the same one of a and b)")
    terms = []
    for alternative in inside.split("|"):
        names = [name.strip() for name in alternative.split("&")]
        for name in names:
            if not _NAME.fullmatch(name):
                what = "an empty feature name" if not name else f"feature name {_shown(name)}"
                raise ConstraintError(
                    f"invalid --constraint {_shown(text)}: {what} (give names joined by & and |, e.g. a100&ib)"
                )
        terms.append(frozenset(names))
    return tuple(terms)


def is_matching_or(text: str) -> bool:
    """Whether a constraint is Slurm's matching OR, ``[a|b]``: all the job's nodes share one alternative."""
    return len(text) >= 2 and text[0] == "[" and text[-1] == "]"


def constraint_features(terms: Iterable[frozenset[str]]) -> set[str]:
    """Every feature name an expression mentions."""
    return {name for term in terms for name in term}


def satisfies(features: Collection[str], terms: Sequence[frozenset[str]]) -> bool:
    """Whether a node with ``features`` matches the parsed expression (an empty expression matches all)."""
    have = features if isinstance(features, (set, frozenset)) else frozenset(features)
    return not terms or any(term <= have for term in terms)


def check_feature_names(features: Iterable[str], where: str) -> tuple[str, ...]:
    """A node's configured feature list, checked: each a valid name, each once, in the order given."""
    out: dict[str, None] = {}
    for name in features:
        if not _NAME.fullmatch(name):
            raise ConstraintError(f"{where}: invalid feature name {_shown(name)} (letters, digits and _.:+-)")
        out[name] = None
    return tuple(out)
