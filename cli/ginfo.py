"""ginfo: nodes, their GPUs, CPUs and memory (sinfo's counterpart); --topology NODE shows the GPU interconnect."""

from __future__ import annotations

import sys

import click

from garrison.cli.client import Client, CliError, fail
from garrison.cli.render import NODE_COLUMNS, node_row, plain_table, rich_table


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--topology", "topology_node", default=None, metavar="NODE",
              help="Print NODE's GPU topology matrix like `nvidia-smi topo -m`.")
def ginfo(topology_node: str | None) -> None:
    """Show nodes: state (IDLE/MIXED/ALLOCATED/DRAIN/DOWN), GPUs, CPUs and memory allocated/total, and model."""
    from garrison.protos.v1 import garrison_pb2 as pb

    try:
        with Client() as client:
            response = client.call("ListNodes", pb.ListNodesRequest())
    except CliError as exc:
        fail("ginfo", exc)
    if topology_node is not None:
        node = next((n for n in response.nodes if n.name == topology_node), None)
        if node is None:
            fail("ginfo", CliError(f"no such node {topology_node!r}"))
        from garrison.controller.rpc.convert import inventory_from_pb
        from garrison.nodeagent.gpu.topo import render_topo_matrix

        click.echo(render_topo_matrix(inventory_from_pb(node.inventory)))
        return
    rows = [node_row(n) for n in response.nodes]
    if sys.stdout.isatty():
        from rich.console import Console

        Console().print(rich_table(NODE_COLUMNS, rows))
    else:
        click.echo(plain_table(NODE_COLUMNS, rows))


def main() -> None:
    ginfo(prog_name="ginfo")


if __name__ == "__main__":
    main()
