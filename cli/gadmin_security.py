"""gadmin token ... and gadmin cert ...: user tokens (through the controller) and the cluster CA (local files).

Token commands are RPCs: the controller checks that the caller is an admin, keeps the registry and logs
every issue and revocation. Certificate commands work on files on the host that keeps the CA key (the
controller host, as root); they never talk to the controller.
"""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path
from typing import Any

import click

from garrison.cli.client import EXIT_USAGE, Client, CliError, fail

DEFAULT_CA_DIR = "/etc/garrison/tls"


def _when(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M:%S")


def _security_call(method: str, request: Any) -> Any:
    from garrison.protos.v1 import security_pb2_grpc as spb_grpc

    with Client() as client:
        return client.service_call(spb_grpc.SecurityStub, method, request)


# ------------------------------------------------------------------------------------------- tokens


@click.group("token", context_settings={"help_option_names": ["-h", "--help"]})
def token_group() -> None:
    """Tokens for users on other hosts (admins issue and revoke; anyone lists their own)."""


@token_group.command("issue")
@click.option("-u", "--user", required=True, help="The user the token speaks for (must exist on the controller host).")
@click.option("-l", "--lifetime", default="7d", show_default=True, help="How long it is valid: 7d, 12h, 30m, 3600.")
@click.option("--install", is_flag=True, help="Write it into the user's config directory on this host (as the user).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write it to this file (mode 0600) instead of stdout.")
def token_issue(user: str, lifetime: str, install: bool, output: str | None) -> None:
    """Issue a token for USER; print it (or store it with --install / --output)."""
    from garrison.protos.v1 import security_pb2 as spb
    from garrison.tokens import TokenError, install_token_for, parse_lifetime, write_token_file

    if install and output:
        fail("gadmin", CliError("give --install or --output, not both", EXIT_USAGE))
    try:
        seconds = parse_lifetime(lifetime)
    except ValueError as exc:
        fail("gadmin", CliError(str(exc), EXIT_USAGE))
    try:
        response = _security_call("IssueToken", spb.IssueTokenRequest(user=user, lifetime_s=seconds))
    except CliError as exc:
        fail("gadmin", exc)
    info = response.info
    summary = f"token {info.token_id} for {info.user} (uid {info.uid}), valid until {_when(info.expires_at)}"
    try:
        if install:
            path = install_token_for(user, response.token)
            click.echo(f"{summary}: installed in {path}", err=True)
        elif output:
            write_token_file(Path(output), response.token)
            click.echo(f"{summary}: written to {output}", err=True)
        else:
            click.echo(f"{summary}", err=True)
            click.echo(response.token)
    except (TokenError, OSError) as exc:
        # The token exists now; revoke it so a half-delivered token does not linger.
        fail("gadmin", CliError(f"{exc}; the token was issued: revoke it with gadmin token revoke {info.token_id}"))


@token_group.command("list")
@click.option("-u", "--user", default="", help="Only this user's tokens (admins; others see their own).")
@click.option("-a", "--all", "include_inactive", is_flag=True, help="Also expired and revoked tokens on record.")
def token_list(user: str, include_inactive: bool) -> None:
    """List issued tokens (never the tokens themselves)."""
    from garrison.protos.v1 import security_pb2 as spb

    try:
        response = _security_call("ListTokens", spb.ListTokensRequest(user=user, include_inactive=include_inactive))
    except CliError as exc:
        fail("gadmin", exc)
    click.echo(f"{'TOKEN':<17} {'USER':<16} {'UID':>7}  {'ISSUED':<19}  {'EXPIRES':<19}  {'BY':<12} STATE")
    now = datetime.datetime.now().timestamp()
    for info in response.tokens:
        if info.HasField("revoked_at"):
            state = f"revoked {_when(info.revoked_at)}"
        else:
            state = "expired" if info.expires_at <= now else "active"
        click.echo(
            f"{info.token_id:<17} {info.user:<16} {info.uid:>7}  {_when(info.issued_at):<19}  "
            f"{_when(info.expires_at):<19}  {info.issued_by:<12} {state}"
        )


@token_group.command("revoke")
@click.argument("token_ids", nargs=-1)
@click.option("-u", "--user", default="", help="Revoke every token of this user.")
def token_revoke(token_ids: tuple[str, ...], user: str) -> None:
    """Revoke tokens by id (from gadmin token list), or all of a user's with --user."""
    from garrison.protos.v1 import security_pb2 as spb

    if not token_ids and not user:
        fail("gadmin", CliError("nothing to revoke: give token ids or --user", EXIT_USAGE))
    try:
        response = _security_call("RevokeTokens", spb.RevokeTokensRequest(token_ids=list(token_ids), user=user))
    except CliError as exc:
        fail("gadmin", exc)
    for info in response.revoked:
        click.echo(f"revoked token {info.token_id} of {info.user}")
    if not response.revoked:
        click.echo("gadmin: nothing to revoke (already revoked)", err=True)


@token_group.command("whoami")
def token_whoami() -> None:
    """Show who the controller takes you for, and how you were authenticated."""
    from garrison.protos.v1 import security_pb2 as spb

    try:
        response = _security_call("WhoAmI", spb.WhoAmIRequest())
    except CliError as exc:
        fail("gadmin", exc)
    groups = ",".join(str(g) for g in response.groups)
    admin = " admin" if response.admin else ""
    click.echo(f"{response.user} uid={response.uid} gid={response.gid} groups={groups} via {response.method}{admin}")


# -------------------------------------------------------------------------------------- certificates


def _default_ca_dir() -> str:
    """The directory of the configured controller.tls_ca, else /etc/garrison/tls."""
    from garrison.config import ConfigError, config_path_from_env, load_config

    try:
        ca = load_config(config_path_from_env()).controller.tls_ca
    except ConfigError:
        ca = ""
    return str(Path(ca).parent) if ca else DEFAULT_CA_DIR


def _ca_dir_option(function: Any) -> Any:
    return click.option(
        "-d", "--dir", "ca_dir", default=None,
        help=f"The CA directory (default: that of controller.tls_ca, else {DEFAULT_CA_DIR}).",
    )(function)


@click.group("cert", context_settings={"help_option_names": ["-h", "--help"]})
def cert_group() -> None:
    """The cluster CA and its certificates (run where the CA key lives, as root)."""


@cert_group.command("init")
@_ca_dir_option
@click.option("--cluster", default="garrison", show_default=True, help="A name for the cluster, in the CA's subject.")
@click.option("--days", default=3650, show_default=True, help="Validity of the CA.")
@click.option("--name", "names", multiple=True,
              help="Host names and addresses of the controller (repeatable; default: this host's names and loopback).")
def cert_init(ca_dir: str | None, cluster: str, days: int, names: tuple[str, ...]) -> None:
    """Create the cluster CA (ca.crt, ca.key 0600) and the controller's certificate."""
    from garrison.tls import TlsError, init_ca

    directory = ca_dir or _default_ca_dir()
    try:
        written = init_ca(directory, cluster=cluster, days=days, controller_names=list(names))
    except TlsError as exc:
        fail("gadmin", CliError(str(exc)))
    for path in written:
        click.echo(f"wrote {path}")
    click.echo(
        "\nin [controller]:\n"
        f'  tls_cert = "{Path(directory) / "controller.crt"}"\n'
        f'  tls_key = "{Path(directory) / "controller.key"}"\n'
        f'  tls_ca = "{Path(directory) / "ca.crt"}"\n'
        '  agent_address = "0.0.0.0:6818"\n'
        "then: gadmin cert issue-agent NODE for each node",
        err=True,
    )


@cert_group.command("issue-agent")
@click.argument("node")
@_ca_dir_option
@click.option("-o", "--out", "out_dir", default=None, help="Where to write NODE.crt and NODE.key (default: DIR/agents).")
@click.option("--days", default=365, show_default=True, help="Validity of the certificate.")
@click.option("--force", is_flag=True, help="Replace an existing certificate and key for NODE.")
def cert_issue_agent(node: str, ca_dir: str | None, out_dir: str | None, days: int, force: bool) -> None:
    """A certificate and key (0600) for the agent of NODE; it may register only as NODE."""
    from garrison.tls import TlsError, issue_agent

    try:
        cert, key = issue_agent(ca_dir or _default_ca_dir(), node, out_dir=out_dir, days=days, overwrite=force)
    except TlsError as exc:
        fail("gadmin", CliError(str(exc)))
    click.echo(f"wrote {cert}\nwrote {key}")
    click.echo(f'in [agent] on {node}: tls_cert = "{cert}", tls_key = "{key}", tls_ca = the CA certificate', err=True)


@cert_group.command("issue-controller")
@_ca_dir_option
@click.option("--name", "names", multiple=True, help="Host names and addresses of the controller (repeatable).")
@click.option("--days", default=365, show_default=True, help="Validity of the certificate.")
def cert_issue_controller(ca_dir: str | None, names: tuple[str, ...], days: int) -> None:
    """Renew the controller's certificate (controller.crt, controller.key) in the CA directory."""
    from garrison.tls import TlsError, issue_controller

    try:
        written = issue_controller(ca_dir or _default_ca_dir(), names=list(names), days=days, overwrite=True)
    except TlsError as exc:
        fail("gadmin", CliError(str(exc)))
    for path in written:
        click.echo(f"wrote {path}")


@cert_group.command("revoke")
@click.argument("certificate")
@_ca_dir_option
def cert_revoke(certificate: str, ca_dir: str | None) -> None:
    """Revoke an agent certificate: CERTIFICATE is its file or its serial (hexadecimal, as `show` prints).

    The serial goes into DIR/revoked, which the controller reads (tls_revoked_agents) whenever an agent
    connects: the node's agent is refused from its next connection on. Restart the controller to cut a link
    that is up now; issue the node a new certificate with issue-agent --force."""
    from garrison.tls import TlsError, describe, read_pem, revoke_serial

    revoked = f"revoked {_when(time.time())}"
    try:
        if os.path.exists(certificate):
            info = describe(read_pem(certificate, "certificate"))
            serial, note = info.serial, f"{info.common_name}, {revoked}"
        else:
            try:
                serial, note = int(certificate, 16), revoked
            except ValueError:
                raise TlsError(f"{certificate!r} is neither a certificate file nor a hexadecimal serial") from None
        path = revoke_serial(ca_dir or _default_ca_dir(), serial, note)
    except TlsError as exc:
        fail("gadmin", CliError(str(exc)))
    click.echo(f"revoked serial {serial:x} in {path}")


@cert_group.command("show")
@click.argument("path", type=click.Path(dir_okay=False))
def cert_show(path: str) -> None:
    """Print what a certificate says: subject, names, validity, serial, fingerprint."""
    from garrison.tls import TlsError, describe, read_pem

    try:
        info = describe(read_pem(path, "certificate"))
    except TlsError as exc:
        fail("gadmin", CliError(str(exc)))
    click.echo(f"subject:     {info.subject}")
    click.echo(f"names:       {', '.join(info.dns_names) or '-'}")
    click.echo(f"valid:       {info.not_before:%Y-%m-%d %H:%M} to {info.not_after:%Y-%m-%d %H:%M} UTC")
    click.echo(f"serial:      {info.serial:x}")
    click.echo(f"sha256:      {info.fingerprint_sha256}")
    click.echo(f"role:        {'CA' if info.is_ca else info.unit or '-'}")


def register(group: click.Group) -> None:
    """Add the token and cert command groups to gadmin."""
    group.add_command(token_group)
    group.add_command(cert_group)

