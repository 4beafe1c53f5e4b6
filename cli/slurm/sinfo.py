"""sinfo under its own name: partitions and their nodes in Slurm's layout, from ginfo's ListNodes.

As in sinfo, the nodes of a partition that print the same (same state, same GRES, ...) share a line, their
names folded into a host list; ``-N`` gives each node (in each of its partitions) a line of its own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from garrison.cli.client import EXIT_FAILURE, Client, CliError, fail, run_command
from garrison.cli.render import format_duration as duration
from garrison.cli.slurm import answer_version
from garrison.cli.slurm.fields import PercentFormat, parse_long_format, split_list
from garrison.cmdline.argparser import Parser, UsageError

PROG = "sinfo"
DEFAULT_FORMAT = "%9P %.5a %.10l %.6D %.6t %N"
LONG_FORMAT = "%9P %.5a %.10l %.10s %.4r %.8h %.10g %.6D %.11T %N"
SUMMARY_FORMAT = "%9P %.5a %.10l %.16F %N"
NODE_FORMAT = "%N %.6D %.9P %6t"
NODE_LONG_FORMAT = "%N %.6D %.9P %.11T %.4c %.8z %.6m %.8f %20E"
HEADERS = {
    "a": "AVAIL", "A": "NODES(A/I)", "b": "ACTIVE_FEATURES", "c": "CPUS", "C": "CPUS(A/I/O/T)",
    "D": "NODES", "e": "FREE_MEM", "E": "REASON", "f": "AVAIL_FEATURES", "F": "NODES(A/I/O/T)",
    "g": "GROUPS", "G": "GRES", "h": "OVERSUBSCRIBE", "l": "TIMELIMIT", "L": "DEFAULTTIME", "m": "MEMORY",
    "n": "HOSTNAMES", "N": "NODELIST", "o": "NODE_ADDR", "P": "PARTITION", "r": "ROOT", "R": "PARTITION",
    "s": "JOB_SIZE", "t": "STATE", "T": "STATE", "z": "S:C:T",
}
# sinfo -O names -> keys: the letters of -o, and two fields -O alone has (GRES_USED, ALLOCMEM).
GRES_USED, ALLOC_MEM = "GresUsed", "AllocMem"
HEADERS.update({GRES_USED: "GRES_USED", ALLOC_MEM: "ALLOCMEM"})
LONG_NAMES = {
    "allocmem": ALLOC_MEM, "available": "a", "cpus": "c", "cpusstate": "C", "defaulttime": "L", "features": "f",
    "featuresact": "b", "freemem": "e", "gres": "G", "gresused": GRES_USED, "groups": "g", "memory": "m",
    "nodeaddr": "o", "nodeai": "A", "nodeaiot": "F", "nodehost": "n", "nodelist": "N", "nodes": "D",
    "oversubscribe": "h", "partition": "P", "partitionname": "R", "reason": "E", "root": "r", "size": "s",
    "socketcorethread": "z", "statecompact": "t", "statelong": "T", "time": "l",
}
# Fields whose value sums or folds the nodes of a line; the others decide which nodes share one.
AGGREGATE_KEYS = {"A", "C", "D", "F", "N", "n", "o", "e"}
COMPACT = {"idle": "idle", "mixed": "mix", "allocated": "alloc", "drained": "drain", "draining": "drng",
           "down*": "down*", "unknown": "unk"}


def parser() -> Parser:
    p = Parser(prog=PROG, add_help=False,
               description="Partitions and nodes, as Slurm's sinfo shows them (options: docs/reference.md, garrison-sinfo).")
    p.add_argument("--help", action="help", help="Show this message and exit.")
    p.add_argument("-N", "--Node", dest="by_node", action="store_true")
    p.add_argument("-l", "--long", action="store_true")
    p.add_argument("-s", "--summarize", action="store_true")
    p.add_argument("-o", "--format", dest="format", default=None)
    p.add_argument("-O", "--Format", dest="long_format", default=None)
    p.add_argument("-h", "--noheader", action="store_true")
    p.add_argument("-p", "--partition", dest="partitions", action="append", default=[])
    p.add_argument("-n", "--nodes", dest="nodes", action="append", default=[])
    p.add_argument("-t", "--states", dest="states", action="append", default=[])
    p.add_argument("-e", "--exact", action="store_true")  # lines are exact already
    p.add_argument("-a", "--all", action="store_true")  # every partition: Garrison hides none
    p.add_argument("-r", "--responding", action="store_true")
    p.add_argument("-d", "--dead", action="store_true")
    p.add_argument("-R", "--list-reasons", dest="reasons", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--json", action="store_true")
    return p


def node_state(node: Any) -> str:
    """sinfo's long state of a node: idle, mixed, allocated, drained, draining or down* (not responding)."""
    gpus, cpus = len(node.inventory.gpus), node.inventory.cpus
    used_gpus, used_cpus = len(node.allocated_gpus), node.allocated_cpus
    busy = bool(used_gpus or used_cpus)
    if node.state == "DOWN":
        return "down*"
    if node.state == "DRAIN":
        return "draining" if busy else "drained"
    if node.state != "UP":
        return "unknown"
    if not busy:
        return "idle"
    full = (used_gpus >= gpus) if gpus else (used_cpus >= cpus > 0)
    return "allocated" if full else "mixed"


def gres(node: Any) -> str:
    """``gpu:a100:8`` (Slurm's short type name), ``gpu:a100:4,gpu:v100:4`` for mixed GPUs, ``(null)`` for none."""
    from garrison.model.gputype import slurm_gpu_type

    counts: dict[str, int] = {}
    for gpu in node.inventory.gpus:
        kind = slurm_gpu_type(gpu.name) or "gpu"
        counts[kind] = counts.get(kind, 0) + 1
    return ",".join(f"gpu:{kind}:{count}" for kind, count in counts.items()) or "(null)"


def gres_used(node: Any) -> str:
    """sinfo -O GresUsed: ``gpu:a100:2(IDX:0-1)``, the GPUs jobs hold and their indices (``IDX:N/A``: none),
    one entry per GPU type as ``gres`` names them."""
    from garrison.model.arrayfold import index_ranges
    from garrison.model.gputype import slurm_gpu_type

    held = set(node.allocated_gpus)
    by_kind: dict[str, list[int]] = {}
    for gpu in node.inventory.gpus:
        by_kind.setdefault(slurm_gpu_type(gpu.name) or "gpu", [])
        if gpu.index in held:
            by_kind[slurm_gpu_type(gpu.name) or "gpu"].append(gpu.index)
    entries = [f"gpu:{kind}:{len(indices)}(IDX:{index_ranges(indices) or 'N/A'})"
               for kind, indices in by_kind.items()]
    return ",".join(entries) or "(null)"


def _limit(partition: Any) -> str:
    return duration(partition.max_time_s) if partition.max_time_s else "infinite"


def _node_value(node: Any, partition: Any, key: str) -> str:
    """A field of one node in one partition (``node`` None: a field of the partition alone)."""
    state = node_state(node) if node is not None else "n/a"
    values: dict[str, Callable[[], str]] = {
        "a": lambda: "up", "b": lambda: ",".join(node.inventory.features) or "(null)",
        "c": lambda: str(node.inventory.cpus), "E": lambda: node.reason or "none",
        "f": lambda: ",".join(node.inventory.features) or "(null)", "g": lambda: "all", "G": lambda: gres(node),
        "h": lambda: "NO", "l": lambda: _limit(partition),
        "L": lambda: duration(partition.default_time_s) if partition.default_time_s else "n/a",
        "m": lambda: str(node.inventory.memory_mb), "P": lambda: partition.name + ("*" if partition.default else ""),
        "r": lambda: "no", "R": lambda: partition.name, "s": lambda: "1-infinite",
        "t": lambda: COMPACT.get(state, state), "T": lambda: state, "z": lambda: f"1:{node.inventory.cpus}:1",
        GRES_USED: lambda: gres_used(node), ALLOC_MEM: lambda: str(node.allocated_memory_mb),
    }
    return values[key]()


def _aggregate(nodes: Sequence[Any], key: str) -> str:
    from garrison.model.hostlist import compress_hostlist

    if key in ("N", "n", "o"):
        return compress_hostlist([n.name for n in nodes])
    if key == "D":
        return str(len(nodes))
    if key == "e":
        return str(sum(max(n.inventory.memory_mb - n.allocated_memory_mb, 0) for n in nodes))
    states = [node_state(n) for n in nodes]
    allocated = sum(s in ("allocated", "mixed", "draining") for s in states)
    idle = sum(s == "idle" for s in states)
    if key == "A":
        return f"{allocated}/{idle}"
    if key == "F":
        return f"{allocated}/{idle}/{len(nodes) - allocated - idle}/{len(nodes)}"
    # C: CPUs allocated/idle/other/total
    cpu_alloc = sum(n.allocated_cpus for n in nodes if n.state == "UP" or n.state == "DRAIN")
    cpu_other = sum(n.inventory.cpus for n in nodes if n.state not in ("UP",) and not n.allocated_cpus)
    total = sum(n.inventory.cpus for n in nodes)
    return f"{cpu_alloc}/{max(total - cpu_alloc - cpu_other, 0)}/{cpu_other}/{total}"


def _state_matches(state: str, wanted: set[str]) -> bool:
    if not wanted:
        return True
    names = {state, COMPACT.get(state, state), state.rstrip("*")}
    if state in ("drained", "draining"):
        names.add("drain")
    if state == "mixed":
        names.add("mix")
    if state == "allocated":
        names.add("alloc")
    return bool(names & wanted)


def sinfo_lines(response: Any, layout: PercentFormat, by_node: bool = False, header: bool = True,
                partitions: Sequence[str] = (), nodes: set[str] | None = None, states: Sequence[str] = (),
                summarize: bool = False) -> list[str]:
    """The lines of sinfo for a ListNodes answer: per partition (in the configured order), the nodes that
    print alike on one line, or each node on its own (``by_node``, sorted by name); -s folds every state."""
    wanted_states = {s.lower() for s in states}
    rows: list[Callable[[str], str]] = []
    node_rows: list[tuple[str, Callable[[str], str]]] = []
    for partition in response.partitions:
        if partitions and partition.name not in partitions:
            continue
        members = [n for n in response.nodes if partition.name in n.partitions
                   and (nodes is None or n.name in nodes) and _state_matches(node_state(n), wanted_states)]
        if by_node:
            for node in members:
                node_rows.append((node.name, _row([node], partition)))
            continue
        if summarize:
            if members or not (nodes or wanted_states):
                rows.append(_row(members, partition))
            continue
        groups: dict[tuple[str, ...], list[Any]] = {}
        keys = sorted(layout.field_keys() - AGGREGATE_KEYS)
        for node in members:
            groups.setdefault(tuple(_node_value(node, partition, k) for k in keys), []).append(node)
        if not groups and not (nodes or wanted_states):
            rows.append(_row([], partition))  # a partition without nodes still has its line, as in sinfo
        rows.extend(_row(group, partition) for group in groups.values())
    if by_node:
        rows = [row for _, row in sorted(node_rows, key=lambda item: item[0])]
    return layout.render(rows, header)


PARTITION_KEYS = {"a", "g", "h", "l", "L", "P", "r", "R", "s"}
EMPTY_VALUES = {"t": "n/a", "T": "n/a", "G": "(null)", GRES_USED: "(null)", ALLOC_MEM: "0", "c": "0", "m": "0", "E": "none", "b": "(null)",
                "f": "(null)", "z": "0:0:0"}


def _row(nodes: Sequence[Any], partition: Any) -> Callable[[str], str]:
    def value(key: str) -> str:
        if key in AGGREGATE_KEYS:
            return _aggregate(nodes, key)
        if not nodes and key not in PARTITION_KEYS:
            return EMPTY_VALUES.get(key, "")
        return _node_value(nodes[0] if nodes else None, partition, key)

    return value


def _layout(args: Any) -> PercentFormat:
    if args.long_format is not None:
        return parse_long_format(args.long_format, {name: (key, HEADERS[key]) for name, key in LONG_NAMES.items()})
    if args.format is not None:
        return PercentFormat(args.format, HEADERS)
    if args.reasons:
        return PercentFormat("%20E %N", HEADERS)
    if args.summarize:
        return PercentFormat(SUMMARY_FORMAT, HEADERS)
    if args.by_node:
        return PercentFormat(NODE_LONG_FORMAT.replace("%.8z ", "") if args.long else NODE_FORMAT, HEADERS)
    return PercentFormat(LONG_FORMAT if args.long else DEFAULT_FORMAT, HEADERS)


def sinfo(argv: list[str]) -> None:
    try:
        args = parser().parse_args(argv)
        layout = _layout(args)
        nodes = None
        if args.nodes:
            from garrison.model.hostlist import expand_hostlist

            nodes = {name for value in args.nodes for name in expand_hostlist(value)}
    except (UsageError, ValueError) as exc:
        fail(PROG, CliError(str(exc), EXIT_FAILURE))
    from garrison.protos.v1 import garrison_pb2 as pb

    try:
        with Client() as client:
            response = client.call("ListNodes", pb.ListNodesRequest())
    except CliError as exc:
        fail(PROG, exc)
    if args.json:
        import json

        from garrison.cli.slurm.json_views import node_document, sinfo_document

        wanted = nodes
        documents = [node_document(node, node_state(node), gres(node), gres_used(node))
                     for node in sorted(response.nodes, key=lambda n: n.name) if wanted is None or node.name in wanted]
        print(json.dumps(sinfo_document(documents), indent=2))
        return
    states = split_list(args.states)
    if args.dead:
        states.append("down")
    if args.reasons:
        states += ["drain", "down"]
    if args.responding:
        states += ["idle", "mixed", "allocated", "drain"]
    lines = sinfo_lines(response, layout, by_node=args.by_node, header=not args.noheader,
                        partitions=split_list(args.partitions), nodes=nodes, states=states,
                        summarize=args.summarize)
    if args.long:
        import time

        print(time.strftime("%a %b %d %H:%M:%S %Y"))  # sinfo -l's first line
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    answer_version(argv)
    run_command(sinfo, argv)


if __name__ == "__main__":
    main()
