"""ginfo: nodes, their GPUs, CPUs and memory (sinfo's counterpart); --topology NODE shows the GPU interconnect."""

from __future__ import annotations

import sys

import click

from garrison.cli.client import Client, CliError, fail
from garrison.cli.render import (
    NODE_COLUMNS,
    PARTITION_COLUMNS,
    node_row,
    partition_rows,
    plain_table,
    rich_table,
)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--topology", "topology_node", default=None, metavar="NODE",
              help="Print NODE's GPU topology matrix like `nvidia-smi topo -m`.")
@click.option("-s", "--summarize", is_flag=True,
              help="One line per partition: time limit, nodes and GPUs allocated/idle/other/total (sinfo -s).")
def ginfo(topology_node: str | None, summarize: bool) -> None:
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
        from garrison.cli.topo import render_topo_matrix
        from garrison.wire.convert import inventory_from_pb

        click.echo(render_topo_matrix(inventory_from_pb(node.inventory)))
        return
    columns: tuple[str, ...] = NODE_COLUMNS
    if summarize:
        from garrison.model.hostlist import compress_hostlist

        columns, rows = PARTITION_COLUMNS, partition_rows(response, compress_hostlist)
    else:
        rows = [node_row(n) for n in response.nodes]
    if sys.stdout.isatty():
        from rich.console import Console

        Console().print(rich_table(columns, rows))
    else:
        click.echo(plain_table(columns, rows))


def main() -> None:
    ginfo(prog_name="ginfo")


if __name__ == "__main__":
    main()
