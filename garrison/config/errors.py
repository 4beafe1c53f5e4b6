"""What a configuration problem looks like when it is reported: one line naming the file and the key."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem, with the file and key in its one-line message."""
