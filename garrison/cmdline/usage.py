"""The one-line complaint about how a command was called, in a module of its own: the commands that only
report it (squeue's and scontrol's value parsers, cli/slurm/fields.py) need not import argparse to catch it."""


class UsageError(Exception):
    """A mistake in how a command was called. The message is one line; the CLI exits with ``exit_status``."""

    exit_status = 2
