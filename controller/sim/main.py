"""gsim: replay a job trace through the production scheduler with a virtual clock and compare policies.

The simulator's own program (not a CLI command of the cluster: it talks to no controller), so it lives
beside the scheduling core it drives.

    gsim TRACE --cluster SPEC [--policy fifo|fifo-easy|garrison|all] [--config FILE] [--json] [--out DIR]

See docs/gsim.md for the trace formats, the cluster spec, the policies and the metrics.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from garrison.controller.sim.cluster import ClusterError
from garrison.controller.sim.policies import POLICY_NAMES, PolicyError
from garrison.controller.sim.replay import ReplayOptions
from garrison.controller.sim.trace import CompletionModel, TraceError

PROG = "gsim"


def _fail(message: str) -> None:
    click.echo(f"{PROG}: error: {message}", err=True)
    sys.exit(2)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("trace", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--cluster", "cluster_spec", required=True, metavar="SPEC",
              help="NODESxGPUS[:TOPOLOGY][/NODES_PER_SWITCH] (e.g. 12x8:dgx-a100/4) or a cluster file.")
@click.option("--policy", "policies", multiple=True, default=("all",), show_default=True,
              type=click.Choice([*POLICY_NAMES, "all"]), help="Policy to replay; repeat to compare several.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A garrison.toml whose controller settings the policies use (default: the shipped ones).")
@click.option("--columns", default=None, metavar="MAPPING",
              help="Column mapping for non-ElasticFlow CSVs (a sacct -P dump too): arrival=COL,"
                   "duration=COL (or start=COL,end=COL),gpus=COL (a count or a TRES list)"
                   "[,job_id=COL,user=COL,account=COL,qos=COL,time_limit=COL].")
@click.option("--header", "header", default=None, metavar="NAMES",
              help="Comma-separated column names of a trace without a header line (every line is then a row; "
                   "e.g. Alibaba PAI's tables, whose names are in .header files); needs --columns.")
@click.option("--time-unit", default="s", show_default=True, type=click.Choice(["us", "ms", "s", "min", "h"]),
              help="Unit of the trace's plain numbers of time (arrival, duration, start, end, time limit): "
                   "microseconds, milliseconds, seconds, minutes or hours. Dates are read as dates.")
@click.option("--seed", default=0, show_default=True, help="Seed for drawn accounts and time limits.")
@click.option("--accounts", default=4, show_default=True, type=click.IntRange(min=1),
              help="Accounts to draw for jobs the trace gives none.")
@click.option("--gang-slowdown", default=0.0, show_default=True, type=click.FloatRange(min=0.0),
              help="Extra run time factor for a gang spread over more nodes (and again: switches) than needed.")
@click.option("--preemption/--no-preemption", default=False, show_default=True,
              help="Let every policy preempt where the QoS table allows (the trace needs a QoS column).")
@click.option("--checkpoint-interval", default=3600.0, show_default=True, type=click.FloatRange(min=0.0),
              help="Seconds of progress between checkpoints (a preempted job resumes from the last one; "
                   "0: jobs checkpoint when warned).")
@click.option("--restart-cost", default=300.0, show_default=True, type=click.FloatRange(min=0.0),
              help="Seconds a preempted job spends restarting.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write PNG plots (queue length, utilisation, JCT CDF), results.json and jobs.csv into DIR.")
def gsim(
    trace: Path,
    cluster_spec: str,
    policies: tuple[str, ...],
    config_file: Path | None,
    columns: str | None,
    header: str | None,
    time_unit: str,
    seed: int,
    accounts: int,
    gang_slowdown: float,
    preemption: bool,
    checkpoint_interval: float,
    restart_cost: float,
    as_json: bool,
    out_dir: Path | None,
) -> None:
    """Replay TRACE (a CSV of jobs) on a simulated cluster under one or more scheduling policies."""
    from garrison.controller.sim.metrics import summarize
    from garrison.controller.sim.report import plain_table, rich_table, to_json, write_jobs_csv, write_plots
    from garrison.controller.sim.study import prepare

    try:
        study = prepare(
            trace,
            cluster_spec,
            policies,
            config_file=config_file,
            columns=columns,
            model=CompletionModel(seed=seed, accounts=accounts),
            options=ReplayOptions(
                gang_slowdown=gang_slowdown,
                checkpoint_interval_s=checkpoint_interval,
                restart_cost_s=restart_cost,
            ),
            preemption=preemption,
            header=header.split(",") if header is not None else None,
            time_unit=time_unit,
        )
    except (TraceError, ClusterError, PolicyError) as err:
        _fail(str(err))
    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        _fail(f"--out {out_dir}: not a directory")

    results = study.run()
    summaries = [summarize(r) for r in results]
    context: dict[str, object] = {"trace": str(trace), "cluster": study.cluster.describe(), "jobs": len(study.jobs)}
    if study.left_out:
        context["left_out"] = study.left_out.removeprefix("left out: ")
    if out_dir is not None:
        try:
            write_plots(results, out_dir)
            (out_dir / "results.json").write_text(to_json(summaries, context) + "\n")
            write_jobs_csv(results, out_dir / "jobs.csv")
        except OSError as err:
            _fail(f"--out {out_dir}: {err.strerror or err}")
    if as_json:
        click.echo(to_json(summaries, context))
        return
    title = f"{trace.name}: {len(study.jobs)} jobs on {study.cluster.describe()}"
    if study.left_out:
        title += f" ({study.left_out})"
    if sys.stdout.isatty():
        from rich.console import Console

        Console().print(rich_table(summaries, title))
    else:
        click.echo(title)
        click.echo(plain_table(summaries))


def main() -> None:
    gsim(prog_name=PROG)


if __name__ == "__main__":
    main()
