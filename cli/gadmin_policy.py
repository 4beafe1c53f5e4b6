"""gadmin account|user|quota|qos|partition|usage|node: the scheduling policy's admin commands.

Like sacctmgr and scontrol: changes are for admins (the controller checks and says why it refuses); the
list and show commands are for anyone. Every change prints nothing on success; errors are one line on
stderr with a non-zero exit (2 for a bad value, 1 for a refusal or an unreachable controller).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import click

from garrison.cli.client import EXIT_USAGE, Client, CliError, fail
from garrison.cli.render import format_duration, plain_table, rich_table
from garrison.cmdline.parsing import UsageError, parse_time_limit

CONTEXT = {"help_option_names": ["-h", "--help"]}


def _call(method: str, request: Any) -> Any:
    from garrison.protos.v1 import admin_pb2_grpc

    try:
        with Client() as client:
            return client.service_call(admin_pb2_grpc.AdminStub, method, request)
    except CliError as exc:
        fail("gadmin", exc)


def _usage_error(message: str) -> None:
    fail("gadmin", CliError(message, EXIT_USAGE))


def _names(text: str | None) -> list[str] | None:
    """"a,b" -> ["a", "b"]; "" -> [] (clear the list); None -> None (leave it as it is)."""
    if text is None:
        return None
    return [v.strip() for v in text.split(",") if v.strip()]


def _time(text: str | None, option: str) -> int | None:
    if text is None:
        return None
    try:
        return parse_time_limit(text)
    except UsageError as exc:
        _usage_error(f"{option}: {exc}")
    return None


def _limit(text: str | None, option: str, number: type = int) -> int | float | None:
    """A limit option: a number, or "none" to remove the limit (sent as -1). None: not given."""
    if text is None:
        return None
    if text.strip().lower() in ("none", "unlimited", "-1"):
        return -1
    try:
        value = number(text)
    except ValueError:
        _usage_error(f"{option}: expected a number or 'none', got {text!r}")
        raise AssertionError("unreachable") from None
    if value < 0:
        _usage_error(f"{option}: must not be negative (use 'none' to remove the limit)")
    return value


def _print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    if sys.stdout.isatty():
        from rich.console import Console

        Console().print(rich_table(headers, rows))
    else:
        click.echo(plain_table(headers, rows))


def _dash(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


# -- pure views (tested as text) --------------------------------------------------------------------------


def account_rows(policy: Any) -> list[tuple[str, ...]]:
    """Accounts as a tree (children indented under their parent), with shares, QoS and quota."""
    quotas = {q.name: q.limits for q in policy.quotas if q.kind == "account"}
    children: dict[str, list[Any]] = {}
    for account in policy.accounts:
        children.setdefault(account.parent, []).append(account)
    rows: list[tuple[str, ...]] = []

    def walk(parent: str, depth: int) -> None:
        for account in sorted(children.get(parent, []), key=lambda a: a.name):
            limits = quotas.get(account.name)
            rows.append((
                "  " * depth + account.name,
                str(account.shares),
                ",".join(account.allowed_qos) or "-",
                limits_text(limits) if limits is not None else "-",
                account.description,
            ))
            walk(account.name, depth + 1)

    walk("", 0)
    return rows


def limits_text(limits: Any) -> str:
    parts = []
    if limits.HasField("max_gpus"):
        parts.append(f"gpus={limits.max_gpus}")
    if limits.HasField("max_jobs"):
        parts.append(f"jobs={limits.max_jobs}")
    if limits.HasField("max_gpu_hours"):
        parts.append(f"gpu_hours={limits.max_gpu_hours:g}")
    return " ".join(parts) or "-"


def user_rows(policy: Any) -> list[tuple[str, ...]]:
    quotas = {q.name: q.limits for q in policy.quotas if q.kind == "user"}
    return [
        (
            u.name,
            u.default_account,
            ",".join(f"{m.account}:{m.shares}" for m in u.accounts),
            ",".join(u.coordinator_of) or "-",
            limits_text(quotas[u.name]) if u.name in quotas else "-",
        )
        for u in policy.users
    ]


def qos_rows(policy: Any) -> list[tuple[str, ...]]:
    return [
        (
            q.name + (" (default)" if q.name == policy.default_qos else ""),
            str(q.priority),
            ",".join(q.preempts) or "-",
            _dash(q.max_gpus_per_user if q.HasField("max_gpus_per_user") else None),
            _dash(q.max_jobs_per_user if q.HasField("max_jobs_per_user") else None),
            format_duration(q.max_time_s) if q.HasField("max_time_s") else "-",
            format_duration(q.grace_s),
        )
        for q in policy.qos
    ]


def partition_rows(policy: Any) -> list[tuple[str, ...]]:
    return [
        (
            p.name + ("*" if p.default else ""),
            ",".join(p.nodes) or "ALL",
            format_duration(p.default_time_s),
            format_duration(p.max_time_s),
            ",".join(p.allowed_accounts) or "ALL",
            ",".join(p.allowed_qos) or "ALL",
            str(p.priority),
        )
        for p in policy.partitions
    ]


def quota_rows(policy: Any, kind: str | None, name: str | None) -> list[tuple[str, ...]]:
    return [
        (q.kind, q.name, limits_text(q.limits))
        for q in policy.quotas
        if (kind is None or q.kind == kind) and (name is None or q.name == name)
    ]


def usage_rows(response: Any) -> list[tuple[str, ...]]:
    return [
        (
            e.account,
            e.user,
            f"{e.normalised_shares:.4f}",
            f"{e.decayed_gpu_s / 3600:.2f}",
            f"{e.period_gpu_s / 3600:.2f}",
            f"{e.total_gpu_s / 3600:.2f}",
            f"{e.fair_share:.4f}",
        )
        for e in response.entries
    ]


ACCOUNT_COLUMNS = ("ACCOUNT", "SHARES", "QOS", "QUOTA", "DESCRIPTION")
USER_COLUMNS = ("USER", "DEFAULT", "ACCOUNTS(SHARES)", "COORDINATES", "QUOTA")
QOS_COLUMNS = ("QOS", "PRIORITY", "PREEMPTS", "MAXGPUS/USER", "MAXJOBS/USER", "MAXTIME", "GRACE")
PARTITION_COLUMNS = ("PARTITION", "NODES", "DEFAULTTIME", "MAXTIME", "ACCOUNTS", "QOS", "PRIORITY")
QUOTA_COLUMNS = ("KIND", "NAME", "LIMITS")
USAGE_COLUMNS = ("ACCOUNT", "USER", "NORMSHARES", "DECAYED_GPU_H", "PERIOD_GPU_H", "RAW_GPU_H", "FAIRSHARE")


def _policy() -> Any:
    from garrison.protos.v1 import admin_pb2 as adminpb

    return _call("GetPolicy", adminpb.GetPolicyRequest())


def _json_out(message: Any) -> None:
    from google.protobuf.json_format import MessageToDict

    click.echo(json.dumps(MessageToDict(message, preserving_proto_field_name=True), indent=2))


# -- account ----------------------------------------------------------------------------------------------


@click.group("account", context_settings=CONTEXT)
def account_group() -> None:
    """Accounts: a tree (organisation > team) with fair-share shares."""


@account_group.command("add")
@click.argument("name")
@click.option("--parent", default="", help="The account above this one (default: none, a top-level account).")
@click.option("--shares", type=click.IntRange(1), default=1, show_default=True, help="Fair-share shares.")
@click.option("--allowed-qos", default=None, metavar="LIST", help="QoS its jobs may use (default: the parent's).")
@click.option("--description", default="", help="Free text.")
def account_add(name: str, parent: str, shares: int, allowed_qos: str | None, description: str) -> None:
    """Add an account."""
    from garrison.protos.v1 import admin_pb2 as adminpb

    request = adminpb.AccountChange(action=adminpb.ADD, name=name, parent=parent, shares=shares,
                                    description=description)
    if allowed_qos is not None:
        request.allowed_qos.values.extend(_names(allowed_qos) or [])
    _call("ChangeAccount", request)


@account_group.command("modify")
@click.argument("name")
@click.option("--parent", default=None, help="Move it under this account ('' : to the top level).")
@click.option("--shares", type=click.IntRange(1), default=None, help="Fair-share shares.")
@click.option("--allowed-qos", default=None, metavar="LIST", help="QoS its jobs may use ('' : the parent's).")
@click.option("--description", default=None, help="Free text.")
def account_modify(name: str, parent: str | None, shares: int | None, allowed_qos: str | None,
                   description: str | None) -> None:
    """Change an account; what is not given stays as it is."""
    from garrison.protos.v1 import admin_pb2 as adminpb

    request = adminpb.AccountChange(action=adminpb.MODIFY, name=name)
    if parent is not None:
        request.parent = parent
    if shares is not None:
        request.shares = shares
    if allowed_qos is not None:
        request.allowed_qos.SetInParent()
        request.allowed_qos.values.extend(_names(allowed_qos) or [])
    if description is not None:
        request.description = description
    _call("ChangeAccount", request)


@account_group.command("delete")
@click.argument("name")
def account_delete(name: str) -> None:
    """Delete an account without sub-accounts, users or unfinished jobs."""
    from garrison.protos.v1 import admin_pb2 as adminpb

    _call("ChangeAccount", adminpb.AccountChange(action=adminpb.DELETE, name=name))


@account_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the whole accounting data as JSON.")
def account_list(as_json: bool) -> None:
    """Show the account tree with shares, allowed QoS and quotas."""
    policy = _policy()
    if as_json:
        _json_out(policy)
        return
    _print_table(ACCOUNT_COLUMNS, account_rows(policy))


# -- user -------------------------------------------------------------------------------------------------


@click.group("user", context_settings=CONTEXT)
def user_group() -> None:
    """Users: their accounts (with shares), default account, and the accounts they coordinate."""


@user_group.command("add")
@click.argument("name")
@click.option("-A", "--account", "accounts", multiple=True, required=True, help="An account (repeatable).")
@click.option("--default-account", default="", help="Default account (default: the first given).")
@click.option("--shares", type=click.IntRange(1), default=None, help="Shares in each of its accounts (1).")
@click.option("--coordinator-of", "coordinator_of", multiple=True, help="An account it coordinates (repeatable).")
def user_add(name: str, accounts: tuple[str, ...], default_account: str, shares: int | None,
             coordinator_of: tuple[str, ...]) -> None:
    """Register a user in one or more accounts."""
    from garrison.protos.v1 import admin_pb2 as adminpb

    request = adminpb.UserChange(action=adminpb.ADD, name=name, add_accounts=list(accounts),
                                 default_account=default_account, add_coordinator=list(coordinator_of))
    if shares is not None:
        request.shares = shares
    _call("ChangeUser", request)


@user_group.command("modify")
@click.argument("name")
@click.option("--add-account", "add_accounts", multiple=True, help="Add it to an account (repeatable).")
@click.option("--remove-account", "remove_accounts", multiple=True, help="Remove it from an account.")
@click.option("--default-account", default=None, help="Its default account.")
@click.option("--shares", type=click.IntRange(1), default=None, help="Its shares in every one of its accounts.")
@click.option("--add-coordinator", "add_coordinator", multiple=True, help="Make it coordinate an account.")
@click.option("--remove-coordinator", "remove_coordinator", multiple=True, help="Stop it coordinating one.")
def user_modify(name: str, add_accounts: tuple[str, ...], remove_accounts: tuple[str, ...],
                default_account: str | None, shares: int | None, add_coordinator: tuple[str, ...],
                remove_coordinator: tuple[str, ...]) -> None:
    """Change a user; what is not given stays as it is."""
    from garrison.protos.v1 import admin_pb2 as adminpb

    request = adminpb.UserChange(action=adminpb.MODIFY, name=name, add_accounts=list(add_accounts),
                                 remove_accounts=list(remove_accounts), add_coordinator=list(add_coordinator),
                                 remove_coordinator=list(remove_coordinator))
    if default_account is not None:
        request.default_account = default_account
    if shares is not None:
        request.shares = shares
    _call("ChangeUser", request)


@user_group.command("delete")
@click.argument("name")
def user_delete(name: str) -> None:
    """Unregister a user (and its quota)."""
    from garrison.protos.v1 import admin_pb2 as adminpb

    _call("ChangeUser", adminpb.UserChange(action=adminpb.DELETE, name=name))


@user_group.command("list")
def user_list() -> None:
    """Show registered users."""
    _print_table(USER_COLUMNS, user_rows(_policy()))


# -- quota ------------------------------------------------------------------------------------------------


@click.group("quota", context_settings=CONTEXT)
def quota_group() -> None:
    """Hard limits per account (with everything under it) or per user: never exceeded."""


@quota_group.command("set")
@click.option("-A", "--account", default=None, help="The account to limit.")
@click.option("-u", "--user", default=None, help="The user to limit (across its accounts).")
@click.option("--max-gpus", default=None, metavar="N|none", help="GPUs allocated at once.")
@click.option("--max-jobs", default=None, metavar="N|none", help="Jobs running at once.")
@click.option("--max-gpu-hours", default=None, metavar="X|none",
              help="GPU-hours per quota period, counting running jobs up to their time limits.")
def quota_set(account: str | None, user: str | None, max_gpus: str | None, max_jobs: str | None,
              max_gpu_hours: str | None) -> None:
    """Set limits (the ones given; 'none' removes one)."""
    from garrison.protos.v1 import admin_pb2 as adminpb

    if (account is None) == (user is None):
        _usage_error("give exactly one of --account and --user")
    if max_gpus is None and max_jobs is None and max_gpu_hours is None:
        _usage_error("give at least one of --max-gpus, --max-jobs, --max-gpu-hours")
    request = adminpb.QuotaChange(kind="account" if account is not None else "user", name=account or user or "")
    for field, text, number in (("max_gpus", max_gpus, int), ("max_jobs", max_jobs, int),
                                ("max_gpu_hours", max_gpu_hours, float)):
        value = _limit(text, "--" + field.replace("_", "-"), number)
        if value is not None:
            setattr(request, field, value)
    _call("SetQuota", request)


@quota_group.command("show")
@click.option("-A", "--account", default=None, help="Only this account.")
@click.option("-u", "--user", default=None, help="Only this user.")
def quota_show(account: str | None, user: str | None) -> None:
    """Show quotas."""
    kind = "account" if account is not None else ("user" if user is not None else None)
    _print_table(QUOTA_COLUMNS, quota_rows(_policy(), kind, account or user))


# -- qos --------------------------------------------------------------------------------------------------


def _qos_options(func: Any) -> Any:
    for option in reversed([
        click.option("--priority", type=int, default=None, help="Priority (its factor is scaled to the highest)."),
        click.option("--preempts", default=None, metavar="LIST", help="QoS whose jobs it may preempt."),
        click.option("--max-gpus-per-user", default=None, metavar="N|none", help="GPUs per user at once."),
        click.option("--max-jobs-per-user", default=None, metavar="N|none", help="Running jobs per user."),
        click.option("--max-time", default=None, metavar="TIME|none", help="Longest time limit a job may ask."),
        click.option("--grace", default=None, metavar="TIME", help="Warning time a preempted job gets (60s)."),
        click.option("--description", default=None, help="Free text."),
        click.option("--default", "make_default", is_flag=True, help="Make it the default QoS."),
    ]):
        func = option(func)
    return func


def _qos_request(action: Any, name: str, priority: int | None, preempts: str | None, max_gpus_per_user: str | None,
                 max_jobs_per_user: str | None, max_time: str | None, grace: str | None,
                 description: str | None, make_default: bool) -> Any:
    from garrison.protos.v1 import admin_pb2 as adminpb

    request = adminpb.QosChange(action=action, name=name, make_default=make_default)
    if priority is not None:
        request.priority = priority
    if preempts is not None:
        request.preempts.SetInParent()
        request.preempts.values.extend(_names(preempts) or [])
    for field, text in (("max_gpus_per_user", max_gpus_per_user), ("max_jobs_per_user", max_jobs_per_user)):
        value = _limit(text, "--" + field.replace("_", "-"))
        if value is not None:
            setattr(request, field, int(value))
    if max_time is not None:
        request.max_time_s = -1 if max_time.strip().lower() == "none" else (_time(max_time, "--max-time") or 0)
    if grace is not None:
        request.grace_s = _time(grace, "--grace") or 0
    if description is not None:
        request.description = description
    return request


@click.group("qos", context_settings=CONTEXT)
def qos_group() -> None:
    """Quality of service: priority, per-user limits, and which QoS may preempt which."""


@qos_group.command("add")
@click.argument("name")
@_qos_options
def qos_add(name: str, **options: Any) -> None:
    """Add a QoS."""
    from garrison.protos.v1 import admin_pb2 as adminpb

    _call("ChangeQos", _qos_request(adminpb.ADD, name, **options))


@qos_group.command("modify")
@click.argument("name")
@_qos_options
def qos_modify(name: str, **options: Any) -> None:
    """Change a QoS; what is not given stays as it is."""
    from garrison.protos.v1 import admin_pb2 as adminpb

    _call("ChangeQos", _qos_request(adminpb.MODIFY, name, **options))


@qos_group.command("delete")
@click.argument("name")
def qos_delete(name: str) -> None:
    """Delete a QoS no job, account, partition or other QoS uses."""
    from garrison.protos.v1 import admin_pb2 as adminpb

    _call("ChangeQos", adminpb.QosChange(action=adminpb.DELETE, name=name))


@qos_group.command("list")
def qos_list() -> None:
    """Show the QoS table."""
    _print_table(QOS_COLUMNS, qos_rows(_policy()))


# -- partition --------------------------------------------------------------------------------------------


def _partition_options(func: Any) -> Any:
    for option in reversed([
        click.option("--nodes", default=None, metavar="LIST", help="Its nodes ('' : every node)."),
        click.option("--default-time", default=None, metavar="TIME", help="Time limit of jobs that give none."),
        click.option("--max-time", default=None, metavar="TIME", help="Longest time limit a job may ask."),
        click.option("--default/--no-default", "is_default", default=None, help="The partition of jobs that name none."),
        click.option("--allowed-accounts", default=None, metavar="LIST", help="Accounts it admits ('' : any)."),
        click.option("--allowed-qos", default=None, metavar="LIST", help="QoS it admits ('' : any)."),
        click.option("--priority", type=int, default=None, help="Partition priority factor."),
    ]):
        func = option(func)
    return func


def _partition_request(action: Any, name: str, nodes: str | None, default_time: str | None, max_time: str | None,
                       is_default: bool | None, allowed_accounts: str | None, allowed_qos: str | None,
                       priority: int | None) -> Any:
    from garrison.protos.v1 import admin_pb2 as adminpb

    request = adminpb.PartitionChange(action=action, name=name)
    for field, text in (("nodes", nodes), ("allowed_accounts", allowed_accounts), ("allowed_qos", allowed_qos)):
        if text is not None:
            values = getattr(request, field)
            values.SetInParent()
            values.values.extend(_names(text) or [])
    if default_time is not None:
        request.default_time_s = _time(default_time, "--default-time") or 0
    if max_time is not None:
        request.max_time_s = _time(max_time, "--max-time") or 0
    if is_default is not None:
        request.default = is_default
    if priority is not None:
        request.priority = priority
    return request


@click.group("partition", context_settings=CONTEXT)
def partition_group() -> None:
    """Partitions: sets of nodes with time limits and the accounts and QoS they admit."""


@partition_group.command("add")
@click.argument("name")
@_partition_options
def partition_add(name: str, **options: Any) -> None:
    """Add a partition."""
    from garrison.protos.v1 import admin_pb2 as adminpb

    _call("ChangePartition", _partition_request(adminpb.ADD, name, **options))


@partition_group.command("modify")
@click.argument("name")
@_partition_options
def partition_modify(name: str, **options: Any) -> None:
    """Change a partition; what is not given stays as it is."""
    from garrison.protos.v1 import admin_pb2 as adminpb

    _call("ChangePartition", _partition_request(adminpb.MODIFY, name, **options))


@partition_group.command("delete")
@click.argument("name")
def partition_delete(name: str) -> None:
    """Delete a partition without unfinished jobs."""
    from garrison.protos.v1 import admin_pb2 as adminpb

    _call("ChangePartition", adminpb.PartitionChange(action=adminpb.DELETE, name=name))


@partition_group.command("list")
def partition_list() -> None:
    """Show partitions (* marks the default)."""
    _print_table(PARTITION_COLUMNS, partition_rows(_policy()))


# -- usage ------------------------------------------------------------------------------------------------


@click.command("usage", context_settings=CONTEXT)
@click.option("-A", "--account", "accounts", multiple=True, help="Only this account and those under it.")
@click.option("-u", "--user", "users", multiple=True, help="Only this user.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (GPU-seconds).")
def usage_command(accounts: tuple[str, ...], users: tuple[str, ...], as_json: bool) -> None:
    """GPU usage per (account, user): decayed (fair share) and raw (this quota period, and ever)."""
    from garrison.protos.v1 import admin_pb2 as adminpb

    response = _call("GetFairShare", adminpb.FairShareRequest(accounts=list(accounts), users=list(users)))
    if as_json:
        _json_out(response)
        return
    period = time.strftime("%Y-%m-%d %H:%M", time.localtime(response.period_start))
    click.echo(f"half-life {format_duration(response.half_life_s)}; quota period since {period}")
    _print_table(USAGE_COLUMNS, usage_rows(response))


# -- node -------------------------------------------------------------------------------------------------


@click.group("node", context_settings=CONTEXT)
def node_group() -> None:
    """Drain a node (no new jobs; running ones go on) or resume it."""


@node_group.command("drain")
@click.argument("node")
@click.option("--reason", required=True, help="Why (shown by ginfo).")
def node_drain(node: str, reason: str) -> None:
    """Stop new jobs from starting on NODE."""
    from garrison.protos.v1 import admin_pb2 as adminpb

    _call("SetNodeState", adminpb.NodeStateChange(node=node, drain=True, reason=reason))


@node_group.command("resume")
@click.argument("node")
@click.option("--reason", default="", help="Ignored; accepted for symmetry with drain.")
def node_resume(node: str, reason: str) -> None:
    """Let NODE take new jobs again."""
    from garrison.protos.v1 import admin_pb2 as adminpb

    _call("SetNodeState", adminpb.NodeStateChange(node=node, drain=False, reason=""))


def register(group: click.Group) -> None:
    """Add the scheduling policy's command groups to gadmin."""
    for command in (account_group, user_group, quota_group, qos_group, partition_group, usage_command, node_group):
        group.add_command(command)
