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

import base64
import time
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from airflow_provider_pravega.client.config import PravegaConnectionConfig

LIST_SCOPES_METHOD = "/io.pravega.controller.stream.api.grpc.v1.ControllerService/listScopes"
_MAX_PAGES = 10_000


class ControllerProbeError(RuntimeError):
    """The controller could not be asked, or it answered with an error."""


class ControllerProbeTimeout(ControllerProbeError):
    """The controller did not answer within the deadline."""


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


def _read_trust_store(path: str) -> bytes:
    """PEM bytes of a CA file, or of every file in a CA directory (as the official client reads it)."""
    target = Path(path)
    if target.is_dir():
        return b"".join(p.read_bytes() for p in sorted(target.iterdir()) if p.is_file())
    return target.read_bytes()


def _open_channel(config: PravegaConnectionConfig) -> grpc.Channel:
    target = config.controller_uri.split("://", 1)[1]
    if not config.tls_enabled:
        return grpc.insecure_channel(target)
    trust_store = config.effective_trust_store()
    roots = _read_trust_store(trust_store) if trust_store else None
    return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=roots))


def _metadata(config: PravegaConnectionConfig) -> list[tuple[str, str]]:
    """The authorization header the official client sends with Basic credentials."""
    if not config.auth_enabled:
        return []
    token = base64.b64encode(f"{config.username}:{config.password or ''}".encode()).decode()
    return [("authorization", f"Basic {token}")]


def list_scopes(config: PravegaConnectionConfig, timeout: float) -> list[str]:
    """All scope names of the controller, following continuation tokens, within ``timeout`` seconds.

    :raises ControllerProbeTimeout: no complete answer before the deadline.
    :raises ControllerProbeError: the server answered with an error status (or is not a controller).
    """
    deadline = time.monotonic() + timeout
    scopes: list[str] = []
    channel = _open_channel(config)
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
        return ControllerProbeError(f"the controller rejected the credentials ({details})")
    name = code.name if code is not None else "error"
    return ControllerProbeError(f"listScopes failed with {name} ({details})")


__all__ = ["ControllerProbeError", "ControllerProbeTimeout", "LIST_SCOPES_METHOD", "list_scopes"]
