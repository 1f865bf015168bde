"""Keycloak bearer credentials end to end: tokens from a real Keycloak (the realm of
keycloak_realm.json), sent by the hook and this provider's client, verified by the embedded server
against the realm's published keys, with the realm's permissions as the caller's ACL."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import grpc
import jwt
import pytest

from airflow_provider_pravega.client import PravegaClient, keycloak
from airflow_provider_pravega.client.config import PravegaConfigError, PravegaConnectionConfig
from airflow_provider_pravega.client.errors import KeycloakTokenError, PravegaPermissionError
from airflow_provider_pravega.embedded.auth import KeycloakVerifier, Permission, permission_in
from airflow_provider_pravega.hooks.pravega import PravegaHook
from airflow_provider_pravega.protocol import controller_pb2 as pb
from airflow_provider_pravega.protocol import controller_pb2_grpc as pb_grpc
from pravega_testing.net import first_controller
from pravega_testing.wait import wait_until

from client.readback import read_segments_direct
from hang_guard import HANG_GUARD_S as FAST_S
from security.realm import APP, APP_SECRET, READ_ONLY, REALM, WRITABLE


def events_of(client: PravegaClient, scope: str, stream: str) -> list[bytes]:
    return sorted(e for events in read_segments_direct(client, scope, stream).values() for e in events)


def write(client: PravegaClient, scope: str, stream: str, payloads: list[bytes]) -> None:
    writer = client.event_writer(scope, stream)
    try:
        for payload in payloads:
            writer.write_event(payload)
        writer.flush()
    finally:
        writer.close()


def stream_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def beta_stream(admin_config: PravegaConnectionConfig) -> str:
    """A stream of the read-only scope with one event, made by the Basic-auth admin."""
    stream = stream_name("ro")
    with PravegaClient(admin_config) as admin:
        admin.admin.create_scope(READ_ONLY)
        admin.admin.create_stream(READ_ONLY, stream)
        write(admin, READ_ONLY, stream, [b"from-admin"])
    return stream


def test_hook_with_bearer_credentials_writes_one_scope_and_only_reads_the_other(
        bearer_connection: Callable[..., str], bearer_server: Any, keycloak_json: Callable[..., str], beta_stream: str) -> None:
    # The connection as a deployment defines it: the keycloak.json (as Keycloak exports it, several
    # lines) is the password, the auth method an extra.
    bearer_connection("pravega_keycloak")
    hook = PravegaHook("pravega_keycloak")
    ok, message = hook.test_connection()
    assert ok, message
    stream = stream_name("rw")
    with hook.get_client() as client:
        assert client.controller.username == f"Keycloak client {APP!r} of realm {REALM['realm']!r}"
        client.admin.create_scope(WRITABLE)
        client.admin.create_stream(WRITABLE, stream)
        write(client, WRITABLE, stream, [b"one", b"two"])
        assert events_of(client, WRITABLE, stream) == [b"one", b"two"]

        assert events_of(client, READ_ONLY, beta_stream) == [b"from-admin"]  # READ on beta
        with pytest.raises(PravegaPermissionError, match="READ_UPDATE on prn::/scope:beta"):
            client.admin.create_stream(READ_ONLY, stream_name("refused"))
        with pytest.raises(PravegaPermissionError):
            write(client, READ_ONLY, beta_stream, [b"refused"])
    with PravegaClient(hook.get_config()) as client:
        assert events_of(client, READ_ONLY, beta_stream) == [b"from-admin"]  # nothing was written


def test_the_hook_teaches_the_masker_the_keycloak_json_and_its_secret(
        bearer_connection: Callable[..., str], keycloak_json: Callable[..., str]) -> None:
    from airflow.sdk._shared.secrets_masker import _secrets_masker

    bearer_connection("pravega_keycloak_masked", keycloak_json(**{"masking-test": "1"}), host="127.0.0.1")
    config = PravegaHook("pravega_keycloak_masked").get_config()
    line = f"keycloak.json={config.password} secret={APP_SECRET}"
    assert _secrets_masker().redact(line) == "keycloak.json=*** secret=***"


def test_a_wrong_client_secret_fails_at_once_naming_realm_and_client(
        bearer_config: Callable[..., PravegaConnectionConfig]) -> None:
    config = bearer_config(secret="not-the-secret")
    started = time.monotonic()
    with PravegaClient(config) as client, pytest.raises(KeycloakTokenError) as info:
        client.admin.list_scopes()
    assert time.monotonic() - started < FAST_S
    error = info.value
    assert (error.realm, error.client, error.status) == (REALM["realm"], APP, 401)
    assert f"realm {REALM['realm']!r}" in str(error) and f"client {APP!r}" in str(error)
    assert "not-the-secret" not in str(error)
    assert not keycloak.token_source(config.keycloak_json()).fetches


def test_the_hook_reports_a_refused_secret_as_a_failed_connection_test(
        bearer_connection: Callable[..., str], bearer_server: Any, keycloak_json: Callable[..., str]) -> None:
    bearer_connection("pravega_keycloak_bad", keycloak_json(secret="wrong"))
    ok, message = PravegaHook("pravega_keycloak_bad").test_connection()
    assert not ok
    assert f"realm {REALM['realm']!r}" in message and f"client {APP!r}" in message and "401" in message


def test_a_token_due_for_renewal_is_renewed_between_writes_without_losing_or_repeating_events(
        bearer_config: Callable[..., PravegaConnectionConfig]) -> None:
    config = bearer_config(**{"renewal-test": uuid.uuid4().hex})  # a token source of its own
    source = keycloak.token_source(config.keycloak_json())
    now = [time.monotonic()]
    source.clock = lambda: now[0]
    stream = stream_name("renew")
    with PravegaClient(config) as client:
        client.admin.create_scope(WRITABLE)
        client.admin.create_stream(WRITABLE, stream)
        writer = client.event_writer(WRITABLE, stream)
        first = source.token()
        for i in range(50):
            writer.write_event(b"%03d" % i)
        writer.flush()
        now[0] += 3600  # the token source's clock: the RPT is long past its renewal time
        assert WRITABLE in client.admin.list_scopes()  # the next controller call renews it
        assert source.token() != first
        for i in range(50, 100):
            writer.write_event(b"%03d" % i)
        writer.flush()
        writer.close()
        assert events_of(client, WRITABLE, stream) == [b"%03d" % i for i in range(100)]
    assert source.fetches >= 2


def test_a_token_that_expires_mid_run_is_refused_by_the_server_and_renewed_by_the_client(
        bearer_server: Any, bearer_config: Callable[..., PravegaConnectionConfig]) -> None:
    config = bearer_config(**{"expiry-test": uuid.uuid4().hex})
    source = keycloak.token_source(config.keycloak_json())
    stream = stream_name("expire")
    with PravegaClient(config) as client:
        client.admin.create_scope(WRITABLE)
        client.admin.create_stream(WRITABLE, stream)
        write(client, WRITABLE, stream, [b"before"])
        first = source.token()
        expires = jwt.decode(first, options={"verify_signature": False})["exp"]
        assert expires - time.time() <= REALM["accessTokenLifespan"]
        # Wait for the realm's clock to pass the token's expiry (a deadline, not a race).
        wait_until("the first RPT to expire", lambda: time.time() > expires + 1, REALM["accessTokenLifespan"] + 30,
                   poll_s=0.5)
        with grpc.insecure_channel(first_controller(bearer_server.controller_uri)) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                pb_grpc.ControllerServiceStub(channel).listScopes(
                    pb.ScopesRequest(), timeout=10, metadata=(("authorization", "Bearer " + first),))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED and "expired" in refused.value.details()
        write(client, WRITABLE, stream, [b"after"])
        assert events_of(client, WRITABLE, stream) == [b"after", b"before"]
        assert source.token() != first


def test_a_tampered_token_is_refused(bearer_server: Any, bearer_config: Callable[..., PravegaConnectionConfig]) -> None:
    config = bearer_config()
    token = keycloak.token_source(config.keycloak_json()).token()
    header, body, signature = token.split(".")
    claims = jwt.decode(token, options={"verify_signature": False})
    claims["authorization"]["permissions"].append({"rsname": "prn::/scope:beta", "scopes": ["READ_UPDATE"]})
    forged = ".".join([header, jwt.utils.base64url_encode(json.dumps(claims).encode()).decode(), signature])
    with grpc.insecure_channel(first_controller(bearer_server.controller_uri)) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.ControllerServiceStub(channel).createStream(
                pb.StreamConfig(streamInfo=pb.StreamInfo(scope=READ_ONLY, stream=stream_name("forged")),
                                scalingPolicy=pb.ScalingPolicy(minNumSegments=1)),
                timeout=10, metadata=(("authorization", "Bearer " + forged),))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "signature" in refused.value.details().lower()


# ------------------------------------------------------------------------------ connection fields


def test_bearer_connection_fields_are_checked() -> None:
    good = json.dumps({"realm": "r", "auth-server-url": "http://kc", "resource": "c", "credentials": {"secret": "s"}})
    config = PravegaConnectionConfig.from_connection_fields(host="h", password=json.dumps(json.loads(good), indent=4),
                                                            extra={"auth_method": "bearer"})
    assert config.bearer and config.auth_enabled and "\n" not in (config.password or "")
    assert "'***'" in repr(config) and '"s"' not in repr(config)
    with pytest.raises(PravegaConfigError, match="leave the login empty"):
        PravegaConnectionConfig.from_connection_fields(host="h", login="u", password=good,
                                                       extra={"auth_method": "Bearer"})
    with pytest.raises(PravegaConfigError, match="keycloak.json, a JSON object"):
        PravegaConnectionConfig.from_connection_fields(host="h", password="not json", extra={"auth_method": "Bearer"})
    with pytest.raises(PravegaConfigError, match="needs the keycloak.json"):
        PravegaConnectionConfig.from_connection_fields(host="h", extra={"auth_method": "Bearer"})
    with pytest.raises(PravegaConfigError, match="use one"):
        PravegaConnectionConfig.from_connection_fields(host="h", password=good, extra={"keycloak_file": "/k.json"})
    assert PravegaConnectionConfig.from_connection_fields(host="h", extra={"keycloak_file": "/k.json"}).bearer


def test_a_keycloak_json_without_a_secret_is_a_connection_error(bearer_server: Any) -> None:
    config = PravegaConnectionConfig.from_connection_fields(
        host=bearer_server.controller_uri, extra={"auth_method": "Bearer"},
        password=json.dumps({"realm": "r", "auth-server-url": "http://kc", "resource": "c"}))
    with pytest.raises(PravegaConfigError, match="has no credentials.secret"):
        PravegaClient(config).admin.list_scopes()


def test_rpt_permissions_map_to_an_acl_whose_highest_matching_grant_decides() -> None:
    claims = {"authorization": {"permissions": [
        {"rsname": "prn::/scope:beta/*", "scopes": ["READ"]},
        {"rsname": "prn::/scope:alpha/*", "scopes": ["READ", "READ_UPDATE"]},
        {"rsname": "prn::/scope:alpha", "scopes": ["READ"]},
        {"rsname": "prn::/scope:gamma", "scopes": ["view"]},  # no Pravega scope: grants nothing
        {"rsname": "prn::/scope:delta"},  # a resource permission without scopes: nothing either
    ]}}
    acl = KeycloakVerifier.acl(claims)
    assert [(e.resource, e.permission) for e in acl][0] == ("prn::/scope:alpha/*", Permission.READ_UPDATE)
    assert permission_in(acl, "prn::/scope:alpha/stream:s") == Permission.READ_UPDATE
    assert permission_in(acl, "prn::/scope:alpha") == Permission.READ  # the scope itself: its own permission
    assert permission_in(acl, "prn::/scope:beta/stream:s") == Permission.READ
    assert permission_in(acl, "prn::/scope:gamma/stream:s") == Permission.NONE
    assert permission_in(acl, "prn::/scope:delta") == Permission.NONE
    assert permission_in(acl, "prn::/") == Permission.NONE
    assert KeycloakVerifier.acl({}) == []


def test_a_forked_child_gets_token_sources_of_its_own(keycloak_json: Callable[..., str]) -> None:
    import os

    text = keycloak_json(**{"fork-test": uuid.uuid4().hex})
    parent = keycloak.token_source(text)
    read, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a new source, so no lock or token of the parent's
        os.close(read)
        os.write(write_end, b"1" if keycloak.token_source(text) is not parent else b"0")
        os._exit(0)
    os.close(write_end)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert keycloak.token_source(text) is parent
