"""Slurm's host lists, both ways: ``"gpu[01-03],node3"`` <-> ``["gpu01", "gpu02", "gpu03", "node3"]``.

Pure. Used by gsub -x/-w, ginfo -s, the controller's SLURM_JOB_NODELIST and anything else that reads or
writes node names the way Slurm users do."""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: scontrol, squeue and srun read host lists, and start lean
if TYPE_CHECKING:
    from collections.abc import Iterable


class HostListError(ValueError):
    """A host list that cannot be read; the message is one line."""


MAX_HOSTLIST_NAMES = 10_000


def compress_hostlist(names: Iterable[str]) -> str:
    """The other way: ``["gpu01", "gpu02", "gpu03", "node3", "node4", "login"]`` ->
    ``"gpu[01-03],login,node[3-4]"``. Names that end in a number share brackets with the names of the same
    prefix and the same zero padding; the groups come in name order."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in dict.fromkeys(names):
        split = trailing_number(name)
        if split is None:
            plain.append(name)
            continue
        prefix, digits = split
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups.setdefault((prefix, width), []).append(int(digits))
    out = []
    for (prefix, width), numbers in groups.items():
        numbers.sort()
        runs: list[list[int]] = []
        for number in numbers:
            if runs and number == runs[-1][1] + 1:
                runs[-1][1] = number
            else:
                runs.append([number, number])
        parts = [str(a).zfill(width) if a == b else f"{str(a).zfill(width)}-{str(b).zfill(width)}" for a, b in runs]
        single_name = len(parts) == 1 and "-" not in parts[0]
        out.append(f"{prefix}{parts[0]}" if single_name else f"{prefix}[{','.join(parts)}]")
    return ",".join(sorted(out + plain))


def trailing_number(name: str) -> tuple[str, str] | None:
    """``name`` split before the decimal digits it ends in (``"gpu01"`` -> ``("gpu", "01")``), as
    ``re.fullmatch(r"(.*?)(\\d+)", name)`` splits it; None where it ends in none. Without re: importing it
    is ~10 M instructions of a `scontrol show job`."""
    start = len(name)
    while start and name[start - 1].isdecimal():  # \\d in a str pattern: Unicode decimal digits
        start -= 1
    return (name[:start], name[start:]) if start < len(name) else None


def _ascii_digits(text: str) -> bool:
    """``re.fullmatch("[0-9]+", text)``: ASCII digits only (str.isdigit() alone would take "\u00b2" too)."""
    return text.isascii() and text.isdigit()


def expand_hostlist(text: str) -> list[str]:
    """Slurm's host lists: ``"node3,gpu[01-03,7]"`` -> ``["node3", "gpu01", "gpu02", "gpu03", "gpu7"]``.

    A range keeps the zero padding of its first number; names are kept in the order given, each once.
    """

    def bad(reason: str) -> HostListError:
        return HostListError(f"invalid host list {text!r}: {reason}")

    items: list[str] = []
    depth = start = 0
    for index, char in enumerate(text):  # split at the commas outside brackets
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise bad("unmatched or nested brackets")
        if char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    if depth:
        raise bad("unmatched or nested brackets")
    items.append(text[start:])
    names: dict[str, None] = {}
    for item in (item.strip() for item in items):
        if not item:
            continue
        import re  # here: a host list with brackets to expand is the rarer case

        match = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\]([^\[\]]*)", item)
        if match is None:
            if "[" in item or "]" in item:
                raise bad(f"{item!r} has more than one bracket")
            names[item] = None
            continue
        prefix, ranges, suffix = match.groups()
        for part in ranges.split(","):
            low, dash, high = part.strip().partition("-")
            if not _ascii_digits(low) or (dash and not _ascii_digits(high)):
                raise bad(f"{part.strip()!r} is not a number or a range of numbers")
            last = int(high) if dash else int(low)
            if last < int(low):
                raise bad(f"{part.strip()!r} counts down")
            if len(names) + last - int(low) >= MAX_HOSTLIST_NAMES:
                raise bad(f"more than {MAX_HOSTLIST_NAMES} names")
            for number in range(int(low), last + 1):
                names[f"{prefix}{number:0{len(low)}d}{suffix}"] = None
    return list(names)
