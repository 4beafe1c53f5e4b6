"""The controller's security plumbing: listeners (TLS or loopback plain text), per-user rate limits, a guard
that answers undecodable requests with INVALID_ARGUMENT, and the Security service (tokens, WhoAmI).

See docs/security.md for the threat model these pieces serve.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from garrison.auth import AuthError, load_or_create_key
from garrison.config import ConfigError, ControllerConfig
from garrison.controller.engine import Engine, NotFound, PermissionDenied
from garrison.controller.ratelimit import RateLimited, RateLimiter
from garrison.controller.rpc.services import Authenticator, MalformedStreamMessage, mapped_errors
from garrison.controller.validate import ValidationError
from garrison.protos.v1 import security_pb2 as spb
from garrison.protos.v1 import security_pb2_grpc as spb_grpc
from garrison.tls import TlsError, TlsFiles, is_loopback, server_credentials
from garrison.tokens import TokenRecord, TokenRegistry

log = logging.getLogger("garrison.controller.security")

MAX_USER_CHARS = 256
MAX_TOKEN_IDS = 1000


# ------------------------------------------------------------------------------------- listening


def listen(server: grpc.aio.Server, cfg: ControllerConfig, config_path: str) -> str:
    """Open the controller's ports; returns a one-line description for the log.

    With TLS: ``address`` for clients (server authentication; clients send a credential or a token) and
    ``agent_address`` for agents (client certificates required and verified against the cluster CA).
    Without TLS: plain text on ``address``, which must then be a loopback address.
    """
    where = f"{config_path}: controller"
    if cfg.tls_cert:
        files = TlsFiles(cfg.tls_cert, cfg.tls_key, cfg.tls_ca)
        try:
            client_credentials = server_credentials(files, require_client_cert=False)
            agent_credentials = server_credentials(files, require_client_cert=True)
        except TlsError as exc:
            raise ConfigError(f"{where}.tls: {exc}") from None
        if server.add_secure_port(cfg.address, client_credentials) == 0:
            raise ConfigError(f"{where}.address: cannot listen on {cfg.address}")
        if server.add_secure_port(cfg.agent_address, agent_credentials) == 0:
            raise ConfigError(f"{where}.agent_address: cannot listen on {cfg.agent_address}")
        return f"TLS on {cfg.address} (clients) and mutual TLS on {cfg.agent_address} (agents)"
    if not is_loopback(cfg.address):
        raise ConfigError(
            f"{where}.address: plain text is allowed only on loopback addresses, not {cfg.address}; "
            "set tls_cert, tls_key, tls_ca and agent_address (see docs/security.md)"
        )
    if server.add_insecure_port(cfg.address) == 0:
        raise ConfigError(f"{where}.address: cannot listen on {cfg.address}")
    return f"plain text on loopback {cfg.address}"


def open_token_registry(cfg: ControllerConfig, clock: Callable[[], float], config_path: str) -> TokenRegistry:
    """The registry of issued tokens (``state_dir/tokens.json``) under the key in ``token_key_file``."""
    try:
        key = load_or_create_key(Path(cfg.token_key_file or Path(cfg.state_dir) / "token.key"))
        return TokenRegistry(
            Path(cfg.state_dir) / "tokens.json", key, clock=clock, max_lifetime_s=float(cfg.token_max_lifetime_s)
        )
    except AuthError as exc:
        raise ConfigError(f"{config_path}: controller.token_key_file: {exc}") from None


# ------------------------------------------------------------------------------ request decoding


class RequestDecodeGuard(grpc.aio.ServerInterceptor):
    """Answers a request that does not parse as its message type with INVALID_ARGUMENT.

    Left to itself, gRPC answers an undecodable request with INTERNAL ("Exception deserializing
    request!"), which reads like a controller bug. Here each handler gets raw bytes and the guard decodes
    them, so a malformed message (truncated, wrong wire types, invalid UTF-8 in a string) gets a clear
    INVALID_ARGUMENT naming the RPC, and streams are ended the same way on their first bad message.
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method  # type: ignore[attr-defined]
        decode = handler.request_deserializer
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _guard_unary(handler.unary_unary, decode, method),
                request_deserializer=None,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                _guard_stream(handler.stream_stream, decode, method),
                request_deserializer=None,
                response_serializer=handler.response_serializer,
            )
        return handler


def _malformed(method: str) -> str:
    return f"malformed request: the message is not a valid {method.rsplit('/', 1)[-1]} request"


def _guard_unary(behavior: Any, decode: Callable[[bytes], Any], method: str) -> Any:
    async def guarded(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            request = decode(raw)
        except Exception:
            log.info("rejected %s from %s: undecodable message of %d bytes", method, context.peer(), len(raw))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _malformed(method))
        return await behavior(request, context)

    return guarded


def _guard_stream(behavior: Any, decode: Callable[[bytes], Any], method: str) -> Any:
    async def guarded(raw_messages: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async def decoded() -> AsyncIterator[Any]:
            async for raw in raw_messages:
                try:
                    message = decode(raw)
                except Exception:
                    log.info("rejected %s stream from %s: undecodable message", method, context.peer())
                    # Not context.abort() here: this runs in the servicer's reader task while its other half
                    # may be sending, and gRPC refuses a second operation at once. The servicer ends the call.
                    raise MalformedStreamMessage(_malformed(method)) from None
                yield message

        async for response in behavior(decoded(), context):
            yield response

    return guarded


# ------------------------------------------------------------------------------ Security service


def _token_info(record: TokenRecord) -> spb.TokenInfo:
    info = spb.TokenInfo(
        token_id=record.token_id,
        user=record.user,
        uid=record.uid,
        issued_at=record.issued_at,
        expires_at=record.expires_at,
        issued_by=record.issued_by,
    )
    if record.revoked_at is not None:
        info.revoked_at = record.revoked_at
    return info


def _check_user_field(user: str) -> None:
    if len(user) > MAX_USER_CHARS or any(not ch.isprintable() for ch in user):
        raise ValidationError("invalid user name")


class SecurityService(spb_grpc.SecurityServicer):
    def __init__(self, engine: Engine, auth: Authenticator, tokens: TokenRegistry) -> None:
        self.engine = engine
        self.auth = auth
        self.tokens = tokens

    @mapped_errors
    async def WhoAmI(self, request: spb.WhoAmIRequest, context: grpc.aio.ServicerContext) -> spb.WhoAmIResponse:
        principal, method = self.auth.identify(context)
        self.auth.check_rate(principal)
        return spb.WhoAmIResponse(
            user=principal.user,
            uid=principal.uid,
            gid=principal.gid,
            groups=list(principal.groups),
            admin=self.engine.is_admin(principal),
            method=method,
        )

    @mapped_errors
    async def IssueToken(
        self, request: spb.IssueTokenRequest, context: grpc.aio.ServicerContext
    ) -> spb.IssueTokenResponse:
        principal = self.auth.principal(context)
        if not self.engine.is_admin(principal):
            raise PermissionDenied(f"only admins may issue tokens ({principal.user} is not an admin)")
        _check_user_field(request.user)
        if not request.user:
            raise ValidationError("give the user to issue a token for")
        if not math.isfinite(request.lifetime_s) or request.lifetime_s <= 0:
            raise ValidationError("token lifetime must be a positive number of seconds")
        try:
            token, record = self.tokens.issue(request.user, request.lifetime_s, issued_by=principal.user)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
        log.info(
            "token %s issued for %s (uid %d) by %s, valid %.0fs",
            record.token_id, record.user, record.uid, principal.user, record.expires_at - record.issued_at,
        )
        return spb.IssueTokenResponse(token=token, info=_token_info(record))

    @mapped_errors
    async def ListTokens(
        self, request: spb.ListTokensRequest, context: grpc.aio.ServicerContext
    ) -> spb.ListTokensResponse:
        principal = self.auth.principal(context)
        _check_user_field(request.user)
        user = request.user
        if not self.engine.is_admin(principal):
            if user and user != principal.user:
                raise PermissionDenied(f"only admins may list the tokens of others ({principal.user} asked for {user!r})")
            user = principal.user
        records = self.tokens.records(user=user, include_inactive=request.include_inactive)
        return spb.ListTokensResponse(tokens=[_token_info(r) for r in records])

    @mapped_errors
    async def RevokeTokens(
        self, request: spb.RevokeTokensRequest, context: grpc.aio.ServicerContext
    ) -> spb.RevokeTokensResponse:
        principal = self.auth.principal(context)
        _check_user_field(request.user)
        if len(request.token_ids) > MAX_TOKEN_IDS:
            raise ValidationError(f"at most {MAX_TOKEN_IDS} token ids at once")
        if not request.token_ids and not request.user:
            raise ValidationError("nothing to revoke: give token ids or a user")
        if not self.engine.is_admin(principal):
            # Anyone may revoke their own tokens (a leaked one, say); only admins those of others.
            own = {r.token_id for r in self.tokens.records(user=principal.user, include_inactive=True)}
            foreign = [tid for tid in request.token_ids if tid not in own]
            if (request.user and request.user != principal.user) or foreign:
                raise PermissionDenied(f"only admins may revoke the tokens of others ({principal.user} is not an admin)")
        try:
            revoked = self.tokens.revoke(list(request.token_ids), request.user)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
        except KeyError as exc:
            raise NotFound(str(exc.args[0])) from None
        for record in revoked:
            log.info("token %s of %s revoked by %s", record.token_id, record.user, principal.user)
        return spb.RevokeTokensResponse(revoked=[_token_info(r) for r in revoked])


__all__ = [
    "AuthError",
    "RateLimited",
    "RateLimiter",
    "RequestDecodeGuard",
    "SecurityService",
    "listen",
    "open_token_registry",
]
