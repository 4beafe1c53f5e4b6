"""What a certificate or key problem looks like when it is reported."""

from __future__ import annotations


class TlsError(Exception):
    """A certificate or key problem, with the file and the reason in one line."""
