"""gadmin: cluster administration (sacctmgr's and scontrol's admin side).

Each area keeps its commands in its own module and registers them here with one line, so the engineers of
different areas do not edit the same code: security (tokens, certificates) in gadmin_security.py.
"""

from __future__ import annotations

import click

from garrison.cli import gadmin_policy, gadmin_security


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def gadmin() -> None:
    """Administer a Garrison cluster. Most commands are for admins; the controller checks."""


gadmin_security.register(gadmin)
gadmin_policy.register(gadmin)


def main() -> None:
    gadmin(prog_name="gadmin")


if __name__ == "__main__":
    main()
