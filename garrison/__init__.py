"""Garrison: a Slurm-style batch system for bare-metal GPU clusters."""

import os as _os

# In a source checkout the programs' packages sit beside this one: controller/, nodeagent/, cli/ and protos/ are
# garrison.controller, garrison.nodeagent, ... (pyproject.toml's package-dir). Searching the checkout's root as
# part of this package's path finds them without setuptools' editable finder, whose import costs every Python
# process ~17 ms, a quarter of a CLI call (the Makefile installs in editable_mode=compat, a plain path line).
# An installed wheel has them here already, and its parent (site-packages) has no pyproject.toml.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_checkout, "pyproject.toml")) and _os.path.isdir(_os.path.join(_checkout, "controller")):
    __path__.append(_checkout)
