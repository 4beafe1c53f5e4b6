"""Garrison: a Slurm-style batch system for bare-metal GPU clusters."""

import posix as _posix

# In a source checkout the programs' packages sit beside this one: controller/, nodeagent/, cli/ and protos/ are
# garrison.controller, garrison.nodeagent, ... (pyproject.toml's package-dir). Searching the checkout's root as
# part of this package's path finds them without setuptools' editable finder, whose import costs every Python
# process ~17 ms, a quarter of a CLI call (the Makefile installs in editable_mode=compat, a plain path line).
# An installed wheel has them here already, and its parent (site-packages) has no pyproject.toml.
# posix, not os: the CLI's launchers start without site and never load os (cli/fastpath.py says why).


def _is(path: str, kind: int) -> bool:
    """Whether ``path`` exists and is of ``kind`` (stat's S_IFREG or S_IFDIR, without importing stat)."""
    try:
        return _posix.stat(path).st_mode & 0o170000 == kind
    except OSError:
        return False


_here = __file__ if __file__.startswith("/") else f"{_posix.getcwd()}/{__file__}"
_checkout = _here.rsplit("/", 2)[0]  # .../garrison/__init__.py -> ...
if _is(f"{_checkout}/pyproject.toml", 0o100000) and _is(f"{_checkout}/controller", 0o040000):
    __path__.append(_checkout)
