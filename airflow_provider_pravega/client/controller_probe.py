"""Ask a Pravega controller for its scopes over gRPC, failing loudly and within a deadline.

Why not the official client's ``StreamManager.list_scope()``: it returns an empty list when the
controller answers with an error (seen: any HTTP/2 server answering 404 "passes" as a controller
with 0 scopes), retries an unreachable controller for about 61 s, and holds the GIL while it
waits, so no Python thread can bound it. A direct ``listScopes`` call with grpcio has a real
deadline and a real error status.

The two messages needed are declared here from their field numbers (Pravega's Controller.proto:
ScopesRequest{1: ContinuationToken}, ScopesResponse{1: repeated string, 2: ContinuationToken},
ContinuationToken{1: string}); the names are private, the wire format is Pravega's.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.errors import PravegaTLSError
from airflow_provider_pravega.client.security import (
    CallCredentials,
    certificate_name,
    grpc_channel_credentials,
    speaks_tls,
    tls_handshake,
)

LIST_SCOPES_METHOD = "/io.pravega.controller.stream.api.grpc.v1.ControllerService/listScopes"
_MAX_PAGES = 10_000


class ControllerProbeError(RuntimeError):
    """The controller could not be asked, or it answered with an error."""


class ControllerProbeTimeout(ControllerProbeError):
    """The controller did not answer within the deadline."""


class ControllerProbeAuthError(ControllerProbeError):
    """The controller refused the credentials (UNAUTHENTICATED) or the permission (PERMISSION_DENIED)."""


class ControllerProbePermissionError(ControllerProbeAuthError):
    """The credentials were accepted, but the user may not list scopes."""


class ControllerProbeTLSError(ControllerProbeError):
    """TLS settings and server do not match (plaintext vs TLS, untrusted certificate, host name)."""


def _scope_messages() -> tuple[type[Any], type[Any], type[Any]]:
    fdp = descriptor_pb2.FileDescriptorProto(
        name="airflow_provider_pravega/controller_probe.proto",
        package="airflow_provider_pravega.controller_probe",
        syntax="proto3",
    )
    field = descriptor_pb2.FieldDescriptorProto
    token = fdp.message_type.add(name="ContinuationToken")
    token.field.add(name="token", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    token_type = f".{fdp.package}.ContinuationToken"
    request = fdp.message_type.add(name="ScopesRequest")
    request.field.add(
        name="continuationToken", number=1, type=field.TYPE_MESSAGE, type_name=token_type,
        label=field.LABEL_OPTIONAL,
    )
    response = fdp.message_type.add(name="ScopesResponse")
    response.field.add(name="scopes", number=1, type=field.TYPE_STRING, label=field.LABEL_REPEATED)
    response.field.add(
        name="continuationToken", number=2, type=field.TYPE_MESSAGE, type_name=token_type,
        label=field.LABEL_OPTIONAL,
    )
    classes = message_factory.GetMessages([fdp], pool=descriptor_pool.DescriptorPool())
    prefix = fdp.package
    return (
        classes[f"{prefix}.ContinuationToken"],
        classes[f"{prefix}.ScopesRequest"],
        classes[f"{prefix}.ScopesResponse"],
    )


_ContinuationToken, _ScopesRequest, _ScopesResponse = _scope_messages()


def _open_channel(config: PravegaConnectionConfig, timeout: float) -> grpc.Channel:
    """A gRPC channel as the connection says. With TLS, a handshake is made first, so a mismatch
    or an untrusted certificate is reported with its reason instead of gRPC's generic UNAVAILABLE."""
    target = config.controller_uri.split("://", 1)[1]
    if not config.tls_enabled:
        return grpc.insecure_channel(target)
    try:
        cert = tls_handshake(config, config.host, config.port, timeout, where=f"controller {config.controller_uri}")
    except PravegaTLSError as err:
        raise ControllerProbeTLSError(str(err)) from None
    except OSError as err:
        raise ControllerProbeError(f"cannot connect to {config.controller_uri}: {err.strerror or err}") from None
    options: list[tuple[str, Any]] = []
    if not config.validate_hostname:
        name = certificate_name(cert)
        if name:  # the chain was verified; only the host-name match is given up
            options.append(("grpc.ssl_target_name_override", name))
    return grpc.secure_channel(target, grpc_channel_credentials(config), options=options)


def _metadata(config: PravegaConnectionConfig) -> list[tuple[str, str]]:
    """The authorization header the official client sends (Basic, or a Keycloak bearer token)."""
    return list(CallCredentials(config).headers())


def list_scopes(config: PravegaConnectionConfig, timeout: float) -> list[str]:
    """All scope names of the controller, following continuation tokens, within ``timeout`` seconds.

    :raises ControllerProbeTimeout: no complete answer before the deadline.
    :raises ControllerProbeError: the server answered with an error status (or is not a controller).
    """
    deadline = time.monotonic() + timeout
    scopes: list[str] = []
    channel = _open_channel(config, timeout)
    try:
        call = channel.unary_unary(
            LIST_SCOPES_METHOD,
            request_serializer=_ScopesRequest.SerializeToString,
            response_deserializer=_ScopesResponse.FromString,
        )
        token = ""
        for _ in range(_MAX_PAGES):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ControllerProbeTimeout(_timeout_message(config, timeout))
            request = _ScopesRequest(continuationToken=_ContinuationToken(token=token))
            try:
                page = call(request, timeout=remaining, metadata=_metadata(config))
            except grpc.RpcError as err:
                raise _error_from_status(config, timeout, err) from None
            if not page.scopes:
                return scopes
            scopes.extend(page.scopes)
            token = page.continuationToken.token
        raise ControllerProbeError(f"listScopes returned more than {_MAX_PAGES} pages; giving up")
    finally:
        channel.close()


def _timeout_message(config: PravegaConnectionConfig, timeout: float) -> str:
    return f"no answer from the Pravega controller at {config.controller_uri} within {timeout:.1f} s"


def _error_from_status(config: PravegaConnectionConfig, timeout: float, err: grpc.RpcError) -> ControllerProbeError:
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else str(err)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ControllerProbeTimeout(_timeout_message(config, timeout))
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return ControllerProbeError(f"the server does not implement Pravega's listScopes ({details})")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        who = f"user {config.username!r}" if config.username else "a client without credentials (no login set)"
        return ControllerProbeAuthError(
            f"the controller refused to authenticate {who} ({details}); check the connection's login and password"
        )
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return ControllerProbePermissionError(
            f"user {config.username!r} may not list scopes ({details}); the credentials are valid but the user "
            f"needs READ permission on the cluster (prn::/) for this check"
        )
    if code == grpc.StatusCode.UNAVAILABLE and not config.tls_enabled:
        if speaks_tls(config.host, config.port, min(2.0, timeout)):
            return ControllerProbeTLSError(
                f"the controller at {config.host}:{config.port} speaks TLS but the connection is plaintext; use "
                f"tls:// (turn the connection's 'tls' on) and set 'trust_store' to the CA certificate"
            )
    name = code.name if code is not None else "error"
    return ControllerProbeError(f"listScopes failed with {name} ({details})")


__all__ = [
    "ControllerProbeAuthError",
    "ControllerProbeError",
    "ControllerProbePermissionError",
    "ControllerProbeTLSError",
    "ControllerProbeTimeout",
    "LIST_SCOPES_METHOD",
    "list_scopes",
]
