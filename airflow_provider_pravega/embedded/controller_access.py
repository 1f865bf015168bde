"""Who may call which controller RPC, and the wrapper every RPC passes through to enforce it.

``rpc`` counts the call, refuses it while the controller is stopped or after its metadata log
failed, authenticates and authorizes the caller by the RPC's entry in ``ACCESS_RULES`` (when
authentication is on), fills the reply's delegation token, and turns failures into gRPC statuses.
:class:`ControllerAccess` is the authentication side: who the caller is, what they may do and
which delegation tokens they get.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from airflow_provider_pravega.embedded import auth
from airflow_provider_pravega.embedded.auth import (
    Authenticator,
    Permission,
    TokenAuthority,
)
from airflow_provider_pravega.protocol import controller_pb2 as pb

log = logging.getLogger(__name__)

T = TypeVar("T")


class RpcFailure(Exception):
    """Raised inside an RPC body to end the call with a gRPC status (never reaches grpcio)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# ---------------------------------------------------------------------------------- access rules
#
# What each RPC needs when authentication is on, in Pravega 0.13's terms (ControllerServiceImpl):
# a resource, the permission required on it, and the stream whose delegation token a reply's
# ``delegationToken`` field carries. ``None`` as resource: authentication only (the body filters
# or decides itself). The one place every RPC passes through is ``rpc`` below.


@dataclass(frozen=True, slots=True)
class _Access:
    resource: str | None
    needed: Permission
    stream: tuple[str, str] | None = None


def _stream_info(request: Any) -> pb.StreamInfo:
    return request if isinstance(request, pb.StreamInfo) else request.streamInfo


def _on_stream(needed: Permission) -> Callable[[Any], _Access]:
    def rule(request: Any) -> _Access:
        info = _stream_info(request)
        return _Access(auth.stream_auth_resource(info.scope, info.stream), needed, (info.scope, info.stream))

    return rule


def _create_stream_rule(request: pb.StreamConfig) -> _Access:
    info = request.streamInfo
    # Pravega lets a reader create its reader group's state stream (and a stream's watermark
    # stream) with READ on the scope (rgWritesWithReadPermissions, on by default).
    needed = Permission.READ if auth.is_reader_group_or_mark_stream(info.stream) else Permission.READ_UPDATE
    return _Access(auth.scope_resource(info.scope), needed, (info.scope, info.stream))


def _authenticated_only(_request: Any) -> _Access:
    return _Access(None, Permission.NONE)


_READ, _UPDATE = Permission.READ, Permission.READ_UPDATE
ACCESS_RULES: dict[str, Callable[[Any], _Access]] = {
    "getControllerServerList": _authenticated_only,
    "getDelegationToken": _authenticated_only,  # decides in its body (depends on the caller's permission)
    "getURI": _on_stream(_READ),
    "createScope": lambda r: _Access(auth.ROOT_RESOURCE, _UPDATE),
    "deleteScope": lambda r: _Access(auth.ROOT_RESOURCE, _UPDATE),
    "listScopes": _authenticated_only,  # lists only the scopes the caller may read
    "checkScopeExists": lambda r: _Access(auth.scope_resource(r.scope), _READ),
    "createStream": _create_stream_rule,
    "updateStream": _on_stream(_UPDATE),
    "getStreamConfiguration": _on_stream(_READ),
    "sealStream": _on_stream(_UPDATE),
    "deleteStream": _on_stream(_UPDATE),
    "truncateStream": _on_stream(_UPDATE),
    "listStreamsInScope": _authenticated_only,  # lists only the streams the caller may read
    "listStreamsInScopeForTag": _authenticated_only,
    "checkStreamExists": _on_stream(_READ),
    "getCurrentSegments": _on_stream(_READ),
    "getEpochSegments": _on_stream(_READ),
    "getSegments": _on_stream(_READ),
    "getSegmentsImmediatelyFollowing": _on_stream(_READ),
    "getSegmentsBetween": _on_stream(_READ),
    "isSegmentValid": _on_stream(_READ),
    "isStreamCutValid": _on_stream(_READ),
    "scale": _on_stream(_UPDATE),
    "checkScale": _on_stream(_READ),
    "createTransaction": _on_stream(_UPDATE),
    "commitTransaction": _on_stream(_UPDATE),
    "abortTransaction": _on_stream(_UPDATE),
    "pingTransaction": _on_stream(_UPDATE),
    "checkTransactionState": _on_stream(_READ),
}


def _authorization_header(context: grpc.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


class ControllerAccess:
    """The authentication side of the controller: who is calling, what they may do, and which
    delegation tokens they get. The controller has none when authentication is off."""

    def __init__(self, authenticator: Authenticator, tokens: TokenAuthority, *, pravega_token_rules: bool) -> None:
        self._authenticator = authenticator
        self._tokens = tokens
        self._pravega_token_rules = pravega_token_rules
        self._caller = threading.local()  # the authenticated account of the RPC this thread serves

    def admit(self, rpc_name: str, access: _Access, context: grpc.ServicerContext) -> auth.Account:
        """Authenticate the caller (UNAUTHENTICATED) and check the rule's permission (PERMISSION_DENIED)."""
        try:
            account = self._authenticator.authenticate(_authorization_header(context))
        except auth.AuthenticationFailed as exc:
            log.warning("controller %s refused: %s", rpc_name, exc)
            raise RpcFailure(grpc.StatusCode.UNAUTHENTICATED, f"authentication failed: {exc}") from None
        if access.resource is not None and account.permission(access.resource) < access.needed:
            log.warning("controller %s refused: user %s lacks %s on %s", rpc_name, account.username,
                        access.needed.name, access.resource)
            raise RpcFailure(grpc.StatusCode.PERMISSION_DENIED,
                             f"user {account.username!r} is not allowed {access.needed.name} on {access.resource}")
        return account

    @contextmanager
    def serving(self, account: auth.Account) -> Iterator[None]:
        """Make ``account`` the caller of the RPC this thread serves, for the duration of the block."""
        self._caller.account = account
        try:
            yield
        finally:
            self._caller.account = None

    @property
    def caller(self) -> auth.Account | None:
        """The authenticated account of the RPC this thread serves."""
        return getattr(self._caller, "account", None)

    def may(self, resource: str, needed: Permission) -> bool:
        """Whether the caller of the current RPC has ``needed`` on ``resource``."""
        account = self.caller
        return account is not None and account.permission(resource) >= needed

    def token_permission(self, account: auth.Account, scope: str, stream: str,
                         requested: int = pb.StreamInfo.UNSPECIFIED) -> Permission:
        """What a delegation token for ``scope/stream`` grants ``account`` (NONE: refuse).

        Pravega 0.13 grants what was asked; the official Rust client always asks UNSPECIFIED, which
        Pravega treats as READ_UPDATE and refuses to a read-only user. Here UNSPECIFIED/ANY grant the
        caller's own permission, so a read-only user can read with the official client.
        Reader-group and watermark streams are writable with READ (Pravega's default).
        """
        if self._pravega_token_rules:
            return self._pravega_token_permission(account, scope, stream, requested)
        have = account.permission(auth.stream_auth_resource(scope, stream))
        if have == Permission.NONE:
            return Permission.NONE
        internal = auth.is_reader_group_or_mark_stream(stream)
        if requested in (pb.StreamInfo.WRITE, pb.StreamInfo.READ_WRITE):
            return Permission.READ_UPDATE if internal or have >= Permission.READ_UPDATE else Permission.NONE
        if requested in (pb.StreamInfo.READ, pb.StreamInfo.NONE):
            return Permission.READ
        return Permission.READ_UPDATE if internal else have

    @staticmethod
    def _pravega_token_permission(account: auth.Account, scope: str, stream: str, requested: int) -> Permission:
        """Pravega 0.13's delegationTokenSupplier: UNSPECIFIED (what the official client sends)
        needs and grants READ_UPDATE; READ needs READ; WRITE/READ_WRITE need READ_UPDATE, except on
        ``_RG``/``_MARK`` streams (READ). The client's ``<group>_kvtable`` is an ordinary stream there."""
        resource = auth.stream_auth_resource(scope, stream, kvtable_is_reader_group=False)
        have = account.permission(resource)
        internal = stream.startswith(("_RG", "_MARK"))
        if requested in (pb.StreamInfo.READ, pb.StreamInfo.NONE):
            needed, granted = Permission.READ, Permission.READ
        elif requested in (pb.StreamInfo.WRITE, pb.StreamInfo.READ_WRITE):
            needed, granted = (Permission.READ if internal else Permission.READ_UPDATE), Permission.READ_UPDATE
        else:
            needed, granted = Permission.READ_UPDATE, Permission.READ_UPDATE
        return granted if have >= needed else Permission.NONE

    def issue(self, account: auth.Account, scope: str, stream: str, permission: Permission) -> str:
        """A delegation token for ``account`` naming ``scope/stream`` with ``permission``."""
        return self._tokens.issue(account.username, auth.stream_resource(scope, stream), permission)

    def token_for(self, account: auth.Account, scope: str, stream: str,
                  requested: int = pb.StreamInfo.UNSPECIFIED) -> str:
        """A delegation token naming ``scope/stream`` ("" when the caller may not have one)."""
        permission = self.token_permission(account, scope, stream, requested)
        if permission == Permission.NONE:
            return ""
        return self.issue(account, scope, stream, permission)

def rpc(method: Callable[..., T]) -> Callable[..., T]:
    """Turn failures into gRPC statuses: definite ones as raised, anything else as INTERNAL.

    With authentication on, every call is first authenticated and authorized here (never data for a
    refused caller) and a reply's ``delegationToken`` is filled for the caller.
    """
    name = method.__name__
    if name not in ACCESS_RULES:
        raise AssertionError(f"controller RPC {name} has no access rule")  # fail closed, at import
    rule = ACCESS_RULES[name]

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> T:  # self: the EmbeddedController
        with self._rpc_lock:
            self.rpc_calls[name] += 1
        try:
            if self._stopped:
                raise RpcFailure(grpc.StatusCode.UNAVAILABLE, "the embedded controller is stopped")
            if self._log_failure is not None:
                raise RpcFailure(grpc.StatusCode.UNAVAILABLE,
                                 f"the embedded controller's metadata log failed ({self._log_failure}); restart it")
            checker: ControllerAccess | None = self._access
            if checker is None:
                return method(self, request, context)
            access = rule(request)
            account = checker.admit(name, access, context)
            with checker.serving(account):
                reply = method(self, request, context)
            if access.stream is not None and "delegationToken" in type(reply).DESCRIPTOR.fields_by_name:
                reply.delegationToken = checker.token_for(account, *access.stream)
            return reply
        except RpcFailure as exc:
            failure = exc
        except Exception as exc:  # a backend or state error: report it, let the client retry
            log.exception("controller RPC %s failed", method.__name__)
            failure = RpcFailure(grpc.StatusCode.INTERNAL, f"{method.__name__} failed: {type(exc).__name__}: {exc}")
        context.abort(failure.code, failure.message)
        raise AssertionError("context.abort returned")  # pragma: no cover

    return wrapper
