"""User tokens: issue, verify, expiry, forgery, revocation (persisted), the CLI's token file, rate limits,
and the Security service of a real controller over gRPC."""

from __future__ import annotations

import base64
import json
import os
import pwd
import stat
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from helpers.polling import wait_until
from security_helpers import running_controller

from garrison.auth import AuthError, issue_credential, verify_credential
from garrison.controller.ratelimit import (
    AuthFailureLimiter,
    AuthFailuresLimited,
    RateLimited,
    RateLimiter,
    peer_host,
)
from garrison.model.domain import Principal
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc
from garrison.protos.v1 import security_pb2 as spb
from garrison.protos.v1 import security_pb2_grpc as spb_grpc
from garrison.tokens import (
    TokenClaims,
    TokenError,
    TokenRecord,
    TokenRegistry,
    issue_token,
    parse_lifetime,
    peek_token,
    read_token_file,
    user_token,
    write_token_file,
)

KEY = b"k" * 32
OTHER_KEY = b"o" * 32
ROOT = pwd.getpwuid(0).pw_name


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _registry(tmp_path: Path, clock: Clock, **kwargs: float) -> TokenRegistry:
    return TokenRegistry(tmp_path / "tokens.json", KEY, clock=clock, **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------- format


@pytest.mark.parametrize(("text", "seconds"), [("7d", 604800), ("12h", 43200), ("30m", 1800), ("90s", 90),
                                                ("2w", 1209600), ("3600", 3600), ("1.5h", 5400)])
def test_lifetimes(text: str, seconds: float) -> None:
    assert parse_lifetime(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-1d", "7y", "d", "1e9", "7 days"])
def test_bad_lifetimes(text: str) -> None:
    with pytest.raises(ValueError):
        parse_lifetime(text)


def test_issued_token_verifies_and_names_the_user(tmp_path: Path) -> None:
    clock = Clock()
    registry = _registry(tmp_path, clock)
    token, record = registry.issue(ROOT, 3600, issued_by="admin")
    assert token.startswith("t1.")
    principal = registry.verify(token)
    assert (principal.user, principal.uid) == (ROOT, 0)
    assert principal.groups  # read from the user database at each use, not from the token
    assert peek_token(token).token_id == record.token_id
    assert record.expires_at == clock.now + 3600


def test_expired_token_is_refused(tmp_path: Path) -> None:
    clock = Clock()
    registry = _registry(tmp_path, clock)
    token, _ = registry.issue(ROOT, 60, issued_by="admin")
    clock.now += 60
    with pytest.raises(TokenError, match="expired 0s ago"):
        registry.verify(token)


def test_forged_and_altered_tokens_are_refused(tmp_path: Path) -> None:
    clock = Clock()
    registry = _registry(tmp_path, clock)
    token, record = registry.issue(ROOT, 3600, issued_by="admin")
    # Same claims, signed with another key.
    forged = issue_token(OTHER_KEY, TokenClaims(ROOT, 0, record.token_id, clock.now, clock.now + 3600))
    with pytest.raises(TokenError, match="signature does not match"):
        registry.verify(forged)
    # Claims edited to another uid, signature kept.
    version, claims, signature = token.split(".")
    body = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    body["uid"] = 1
    edited = base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()
    with pytest.raises(TokenError, match="signature does not match"):
        registry.verify(f"{version}.{edited}.{signature}")
    # A flipped character in the signature.
    flipped = token[:-1] + ("A" if token[-1] != "A" else "B")
    with pytest.raises(TokenError, match="signature does not match"):
        registry.verify(flipped)
    for junk in ["", "t1", "t1..", "x" * 5000, "t2.a.b", "t1.!!!.sig", "t1.e30.sig"]:
        with pytest.raises(TokenError):
            registry.verify(junk)


def test_tokens_and_local_credentials_cannot_stand_for_each_other(tmp_path: Path) -> None:
    clock = Clock()
    registry = _registry(tmp_path, clock)
    token, _ = registry.issue(ROOT, 3600, issued_by="admin")
    credential = issue_credential(KEY, Principal(ROOT, 0, 0, (0,)), clock.now, 60)
    with pytest.raises(TokenError, match="unsupported token version 'v1'"):
        registry.verify(credential)
    with pytest.raises(AuthError, match="unsupported credential version 't1'"):
        verify_credential(KEY, token, clock.now)


def test_revoked_tokens_stay_revoked_across_restarts(tmp_path: Path) -> None:
    clock = Clock()
    registry = _registry(tmp_path, clock)
    first, first_record = registry.issue(ROOT, 3600, issued_by="admin")
    second, _ = registry.issue(ROOT, 3600, issued_by="admin")
    other, _ = registry.issue("nobody", 3600, issued_by="admin")
    assert [r.token_id for r in registry.revoke([first_record.token_id])] == [first_record.token_id]
    assert registry.revoke([first_record.token_id]) == []  # already revoked: nothing changes
    restarted = _registry(tmp_path, clock)  # a new controller process reads the registry file
    with pytest.raises(TokenError, match="was revoked"):
        restarted.verify(first)
    assert restarted.verify(second).uid == 0
    revoked = restarted.revoke([], user=ROOT)
    assert len(revoked) == 1
    with pytest.raises(TokenError, match="was revoked"):
        _registry(tmp_path, clock).verify(second)
    assert _registry(tmp_path, clock).verify(other).user == "nobody"
    assert stat.S_IMODE((tmp_path / "tokens.json").stat().st_mode) == 0o600
    assert first not in (tmp_path / "tokens.json").read_text()  # the registry never holds tokens


def test_a_token_unknown_to_the_registry_is_refused(tmp_path: Path) -> None:
    """A lost or replaced registry fails closed: a well-signed token it does not list is not accepted."""
    clock = Clock()
    token, _ = _registry(tmp_path / "a", clock).issue(ROOT, 3600, issued_by="admin")
    with pytest.raises(TokenError, match="not known to this controller"):
        _registry(tmp_path / "b", clock).verify(token)


def test_a_token_whose_user_changed_is_refused(tmp_path: Path) -> None:
    clock = Clock()
    registry = _registry(tmp_path, clock)
    # "nobody" as uid 0 (say: renamed accounts): the user database disagrees, so the token is void.
    claims = TokenClaims("nobody", 0, "0123456789abcdef", clock.now, clock.now + 60)
    registry._records[claims.token_id] = TokenRecord(claims.token_id, "nobody", 0, clock.now, claims.expires_at, "x")
    with pytest.raises(TokenError, match="uid 0 is now"):
        registry.verify(issue_token(KEY, claims))


def test_lifetime_and_user_are_checked_at_issue(tmp_path: Path) -> None:
    registry = _registry(tmp_path, Clock(), max_lifetime_s=86400)
    with pytest.raises(ValueError, match="exceeds the maximum"):
        registry.issue(ROOT, 86401, issued_by="admin")
    with pytest.raises(ValueError, match="no user"):
        registry.issue("no-such-user-garrison", 60, issued_by="admin")
    with pytest.raises(ValueError, match="positive"):
        registry.issue(ROOT, float("nan"), issued_by="admin")


def test_a_corrupt_or_exposed_registry_stops_the_controller(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text("{not json")
    os.chmod(path, 0o600)
    with pytest.raises(AuthError, match="corrupt"):
        _registry(tmp_path, Clock())
    path.write_text(json.dumps({"version": 1, "tokens": {}}))
    os.chmod(path, 0o644)
    with pytest.raises(AuthError, match="readable by others"):
        _registry(tmp_path, Clock())


# ------------------------------------------------------------------------------------- client side


def test_token_file_round_trip_and_permissions(tmp_path: Path) -> None:
    clock = Clock(now=time.time())
    token, _ = _registry(tmp_path, clock).issue(ROOT, 3600, issued_by="admin")
    path = tmp_path / "cfg" / "garrison" / "token"
    write_token_file(path, token)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert read_token_file(path) == token
    assert user_token({"GARRISON_TOKEN_FILE": str(path)}) == token
    assert user_token({"XDG_CONFIG_HOME": str(tmp_path / "cfg")}) == token
    assert user_token({"GARRISON_TOKEN": token}) == token
    os.chmod(path, 0o640)
    with pytest.raises(TokenError, match="readable by others"):
        read_token_file(path)
    with pytest.raises(TokenError, match="no token file"):
        read_token_file(tmp_path / "missing")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file to another user")
def test_token_file_of_another_user_is_refused(tmp_path: Path) -> None:
    clock = Clock(now=time.time())
    token, _ = _registry(tmp_path, clock).issue(ROOT, 3600, issued_by="admin")
    path = tmp_path / "token"
    write_token_file(path, token)
    os.chown(path, 65534, 65534)
    with pytest.raises(TokenError, match="belongs to uid 65534"):
        read_token_file(path)


def test_the_cli_says_when_its_token_expired(tmp_path: Path) -> None:
    clock = Clock()
    token, _ = _registry(tmp_path, clock).issue(ROOT, 60, issued_by="admin")
    with pytest.raises(TokenError, match="expired at .* ask an admin for a new one"):
        user_token({"GARRISON_TOKEN": token}, now=clock.now + 61)


# -------------------------------------------------------------------------------------- rate limits


def test_rate_limit_allows_a_burst_then_the_sustained_rate() -> None:
    clock = Clock(0.0)
    limiter = RateLimiter(rate_per_s=2.0, burst=3, clock=clock)
    alice, bob = Principal("alice", 1001, 1001, ()), Principal("bob", 1002, 1002, ())
    for _ in range(3):
        limiter.check(alice)
    with pytest.raises(RateLimited, match="too many requests from alice: the limit is 2/s"):
        limiter.check(alice)
    limiter.check(bob)  # per user: bob is not held back by alice
    clock.now += 0.5  # one more request's worth
    limiter.check(alice)
    with pytest.raises(RateLimited):
        limiter.check(alice)
    RateLimiter(0, 1, clock=clock).check(alice)  # 0: unlimited


def test_failed_authentications_are_limited_per_host_and_logged_once_per_period() -> None:
    clock = Clock(0.0)
    warnings: list[str] = []
    limiter = AuthFailureLimiter(rate_per_s=1.0, burst=3, clock=clock, warn=warnings.append)
    for _ in range(3):
        limiter.admit("10.0.0.5")
        limiter.failed("10.0.0.5")
    for _ in range(5):
        with pytest.raises(AuthFailuresLimited, match="too many failed authentications from 10.0.0.5: the limit "
                                                      "is 1/s \\(bursts of 3\\); retry in 1.0s"):
            limiter.admit("10.0.0.5")
    assert warnings == ["refusing requests from 10.0.0.5 for a while: more than 3 failed authentications at "
                        "over 1/s"]
    limiter.admit("10.0.0.6")  # per host: another host is not held back
    clock.now += 1.0  # one failure's worth of refill
    limiter.admit("10.0.0.5")
    AuthFailureLimiter(0, 1, clock=clock).admit("10.0.0.5")  # 0: unlimited
    assert [peer_host(p) for p in ("ipv4:10.0.0.5:51234", "ipv6:[::1]:5", "unix:/run/g.sock")] == [
        "10.0.0.5", "::1", "unix:/run/g.sock"]


def test_a_host_that_keeps_failing_authentication_is_refused_before_the_check(tmp_path: Path) -> None:
    extra = "request_rate_per_s = 0\nauth_failure_rate_per_s = 0.01\nauth_failure_burst = 3\n"
    with running_controller(tmp_path, extra=extra) as controller:
        forged = (("x-garrison-token", "gt1.forged.token"),)
        valid = (("x-garrison-credential", controller.credential()),)
        with controller.client_channel() as channel:
            security = _security(channel)
            assert security.WhoAmI(spb.WhoAmIRequest(), metadata=valid).user == ROOT  # successes cost nothing
            codes = []
            for _ in range(5):
                with pytest.raises(grpc.RpcError) as refused:
                    security.WhoAmI(spb.WhoAmIRequest(), metadata=forged)
                codes.append(refused.value.code())
            assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 3 + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
            # Refused before it is checked: even a valid credential from that host waits its turn.
            with pytest.raises(grpc.RpcError) as refused:
                security.WhoAmI(spb.WhoAmIRequest(), metadata=valid)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert refused.value.details().startswith("too many failed authentications from 127.0.0.1")
        log = controller.log_text()
        assert log.count("refusing requests from 127.0.0.1") == 1 and log.count("refused WhoAmI") == 3


# ---------------------------------------------------------------- the Security service, for real


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with running_controller(tmp_path_factory.mktemp("tokens"), extra="request_rate_per_s = 0\n") as process:
        yield process


def _security(channel: grpc.Channel) -> spb_grpc.SecurityStub:
    return spb_grpc.SecurityStub(channel)


def test_admin_issues_and_the_token_speaks_for_its_user_only(controller) -> None:  # type: ignore[no-untyped-def]
    admin = (("x-garrison-credential", controller.credential()),)
    with controller.client_channel() as channel:
        issued = _security(channel).IssueToken(spb.IssueTokenRequest(user="nobody", lifetime_s=600), metadata=admin)
        as_nobody = (("x-garrison-token", issued.token),)
        me = _security(channel).WhoAmI(spb.WhoAmIRequest(), metadata=as_nobody)
        assert (me.user, me.uid, me.admin, me.method) == ("nobody", 65534, False, "token")
        # A token holder who is not an admin cannot issue tokens (an admin-only action).
        with pytest.raises(grpc.RpcError) as refused:
            _security(channel).IssueToken(spb.IssueTokenRequest(user=ROOT, lifetime_s=600), metadata=as_nobody)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.details() == "only admins may issue tokens (nobody is not an admin)"
        # ... nor list or revoke the tokens of others, but may see and revoke their own.
        with pytest.raises(grpc.RpcError) as refused:
            _security(channel).ListTokens(spb.ListTokensRequest(user=ROOT), metadata=as_nobody)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        own = _security(channel).ListTokens(spb.ListTokensRequest(), metadata=as_nobody)
        assert [t.token_id for t in own.tokens] == [issued.info.token_id]
        # The job it submits belongs to nobody, whatever the request says.
        submitted = pb_grpc.ControllerStub(channel).SubmitJob(
            pb.SubmitJobRequest(spec=pb.JobSpec(name="t", command=["true"], workdir="/tmp")), metadata=as_nobody
        )
        job = pb_grpc.ControllerStub(channel).GetJob(pb.GetJobRequest(job_id=str(submitted.job_id)), metadata=admin)
        assert (job.user, job.uid) == ("nobody", 65534)
        revoked = _security(channel).RevokeTokens(
            spb.RevokeTokensRequest(token_ids=[issued.info.token_id]), metadata=as_nobody
        )
        assert [t.token_id for t in revoked.revoked] == [issued.info.token_id]
        with pytest.raises(grpc.RpcError) as refused:
            _security(channel).WhoAmI(spb.WhoAmIRequest(), metadata=as_nobody)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "was revoked" in refused.value.details()
    log = controller.log_text()
    assert "refused IssueToken" in log and "only admins may issue tokens" in log
    assert "refused WhoAmI" in log and "was revoked" in log


def test_forged_and_expired_tokens_are_refused_by_the_controller(controller) -> None:  # type: ignore[no-untyped-def]
    admin = (("x-garrison-credential", controller.credential()),)
    with controller.client_channel() as channel:
        issued = _security(channel).IssueToken(spb.IssueTokenRequest(user="nobody", lifetime_s=0.3), metadata=admin)
        claims = peek_token(issued.token)
        forged = issue_token(OTHER_KEY, claims)
        for token, reason in [(forged, "signature does not match"), (issued.token[:-2] + "xx", "signature does not match")]:
            with pytest.raises(grpc.RpcError) as refused:
                _security(channel).WhoAmI(spb.WhoAmIRequest(), metadata=(("x-garrison-token", token),))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert reason in refused.value.details()
        # Expiry: the controller's own clock passes the token's expiry; poll until it refuses.
        def refusal() -> grpc.RpcError | None:
            try:
                _security(channel).WhoAmI(spb.WhoAmIRequest(), metadata=(("x-garrison-token", issued.token),))
            except grpc.RpcError as refused:
                return refused
            return None

        expired = wait_until(refusal, claims.expires_at + 10 - time.time(), what="the token to expire",
                             interval_s=0.1, max_interval_s=0.1)
        assert expired.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "expired" in (expired.details() or "")


def test_gadmin_token_commands_through_the_cli(controller, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = dict(os.environ, GARRISON_CONTROLLER=controller.address, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("GARRISON_TOKEN", None)
    env.pop("GARRISON_TOKEN_FILE", None)

    def gadmin(*args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "garrison.cli.gadmin", *args], capture_output=True, text=True,
                              env={**env, **(extra or {})}, timeout=60)

    out = tmp_path / "nobody.token"
    issued = gadmin("token", "issue", "--user", "nobody", "--lifetime", "1h", "--output", str(out))
    assert issued.returncode == 0, issued.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    who = gadmin("token", "whoami", extra={"GARRISON_TOKEN_FILE": str(out)})
    assert who.stdout.startswith("nobody uid=65534"), who.stderr
    denied = gadmin("token", "issue", "--user", "nobody", extra={"GARRISON_TOKEN_FILE": str(out)})
    assert denied.returncode == 1
    assert denied.stderr == "gadmin: error: permission denied: only admins may issue tokens (nobody is not an admin)\n"
    listed = gadmin("token", "list", "--user", "nobody")
    token_id = peek_token(out.read_text().strip()).token_id
    assert token_id in listed.stdout and "active" in listed.stdout
    assert gadmin("token", "revoke", token_id).stdout == f"revoked token {token_id} of nobody\n"
    refused = gadmin("token", "whoami", extra={"GARRISON_TOKEN_FILE": str(out)})
    assert refused.returncode == 1 and "was revoked" in refused.stderr
    bad = gadmin("token", "issue", "--user", "nobody", "--lifetime", "forever")
    assert bad.returncode == 2 and "cannot parse lifetime" in bad.stderr
