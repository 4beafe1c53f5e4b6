"""How one TOML table is read into typed values: each key checked for its type and bounds, the keys left
over reported as unknown settings, and Slurm-style durations parsed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from garrison.config.errors import ConfigError


def parse_duration(text: str | int | float, where: str) -> int:
    """Seconds from a number or a Slurm time string (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S)."""
    if isinstance(text, bool):
        raise ConfigError(f"{where}: expected a duration, got {text!r}")
    if isinstance(text, int | float):
        if text < 0:
            raise ConfigError(f"{where}: duration must not be negative")
        return int(text)
    try:
        days = 0
        rest = text.strip()
        if "-" in rest:
            day_text, rest = rest.split("-", 1)
            days = int(day_text)
            parts = [int(p) for p in rest.split(":")]
            if len(parts) > 3:
                raise ValueError
            hours, minutes, seconds = (parts + [0, 0, 0])[:3]
        else:
            parts = [int(p) for p in rest.split(":")]
            if len(parts) == 1:
                hours, minutes, seconds = 0, parts[0], 0
            elif len(parts) == 2:
                hours, minutes, seconds = 0, parts[0], parts[1]
            elif len(parts) == 3:
                hours, minutes, seconds = parts
            else:
                raise ValueError
        if min(days, hours, minutes, seconds) < 0:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{where}: cannot parse duration {text!r}") from None
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


class TableReader:
    """Reads typed keys out of one TOML table, remembering which were used (``finish`` reports the rest)."""

    def __init__(self, table: Mapping[str, Any], where: str) -> None:
        self.table = table
        self.where = where
        self.used: set[str] = set()

    def get_typed(self, key: str, kinds: tuple[type, ...], default: Any) -> Any:
        self.used.add(key)
        if key not in self.table:
            return default
        value = self.table[key]
        if isinstance(value, bool) and bool not in kinds:
            raise ConfigError(f"{self.where}.{key}: expected {kinds[0].__name__}, got {value!r}")
        if not isinstance(value, kinds):
            raise ConfigError(f"{self.where}.{key}: expected {kinds[0].__name__}, got {value!r}")
        return value

    def get_str(self, key: str, default: str) -> str:
        return str(self.get_typed(key, (str,), default))

    def get_bool(self, key: str, default: bool) -> bool:
        return bool(self.get_typed(key, (bool,), default))

    def get_number(self, key: str, default: float, minimum: float = 0.0) -> float:
        value = float(self.get_typed(key, (int, float), default))
        if value < minimum:
            raise ConfigError(f"{self.where}.{key}: must be at least {minimum}")
        return value

    def get_int(self, key: str, default: int, minimum: int = 0) -> int:
        value = int(self.get_typed(key, (int,), default))
        if value < minimum:
            raise ConfigError(f"{self.where}.{key}: must be at least {minimum}")
        return value

    def get_duration(self, key: str, default: int) -> int:
        self.used.add(key)
        if key not in self.table:
            return default
        return parse_duration(self.table[key], f"{self.where}.{key}")

    def get_str_list(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self.get_typed(key, (list,), None)
        if value is None:
            return default
        if not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{self.where}.{key}: expected a list of strings")
        return tuple(value)

    def get_int_list(self, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
        value = self.get_typed(key, (list,), None)
        if value is None:
            return default
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{self.where}.{key}: expected a list of integers")
        return tuple(value)

    def get_optional_int(self, key: str) -> int | None:
        """The integer at ``key``, or None when the key is absent (for limits where absent means unlimited)."""
        return self.get_int(key, 0) if key in self.table else None

    def finish(self) -> None:
        unknown = sorted(set(self.table) - self.used)
        if unknown:
            raise ConfigError(f"{self.where}.{unknown[0]}: unknown setting")


def read_tables(value: Any, where: str) -> list[tuple[TableReader, str]]:
    """A reader, and its place for messages, for each table of an array of tables (``[[controller.users]]``)."""
    if value is None:
        return []
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ConfigError(f"{where}[{i}]: expected a table")
        out.append((TableReader(item, f"{where}[{i}]"), f"{where}[{i}]"))
    return out
