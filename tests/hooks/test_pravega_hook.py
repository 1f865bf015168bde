"""PravegaHook with real Airflow Connection objects, read from AIRFLOW_CONN_* environment variables."""

from __future__ import annotations

import base64
import json
import os
import pickle
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from pravega_testing.net import first_controller
from hang_guard import HANG_GUARD_S

from airflow_provider_pravega.client.config import (
    ENV_AUTH_METHOD,
    ENV_AUTH_PASSWORD,
    ENV_AUTH_USERNAME,
    ENV_TLS_CERT_PATH,
    PravegaConfigError,
    PravegaConnectionConfig,
    official_client_env,
)
from airflow_provider_pravega.hooks.pravega import PravegaHook


def set_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: Any) -> None:
    """Define an Airflow connection the way deployments do: a JSON AIRFLOW_CONN_<ID> variable."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "pravega", **fields}))


def config_of(monkeypatch: pytest.MonkeyPatch, **fields: Any) -> PravegaConnectionConfig:
    set_connection(monkeypatch, "pravega_under_test", **fields)
    return PravegaHook(pravega_conn_id="pravega_under_test").get_config()


# ----------------------------------------------------------------------------- class attributes


def test_hook_identity() -> None:
    assert PravegaHook.conn_type == "pravega"
    assert PravegaHook.default_conn_name == "pravega_default"
    assert PravegaHook.hook_name == "Pravega"
    assert PravegaHook.conn_name_attr == "pravega_conn_id"
    assert PravegaHook().pravega_conn_id == "pravega_default"


def test_default_connection_id_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    set_connection(monkeypatch, "pravega_default", host="ctrl.internal")
    assert PravegaHook().get_config().controller_uri == "tcp://ctrl.internal:9090"


# ---------------------------------------------------------------------------------- URI building


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_of(monkeypatch)
    assert config.controller_uri == "tcp://localhost:9090"
    assert (config.host, config.port) == ("localhost", 9090)
    assert config.scope is None
    assert config.username is None and config.password is None and not config.auth_enabled
    assert not config.tls_enabled and config.trust_store is None and config.validate_hostname
    assert config.transaction_lease_ms == 90_000


def test_host_and_port(monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_of(monkeypatch, host="pravega.example.com", port=19090, extra={"scope": "sales"})
    assert config.controller_uri == "tcp://pravega.example.com:19090"
    assert config.scope == "sales"


def test_tls_from_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    config = config_of(
        monkeypatch,
        host="secure.example.com",
        port=443,
        extra={"tls": True, "trust_store": str(ca), "validate_hostname": False},
    )
    assert config.tls_enabled
    assert config.controller_uri == "tls://secure.example.com:443"
    assert config.trust_store == str(ca)
    assert config.validate_hostname is False
    assert config.stream_manager_kwargs() == {
        "controller_uri": "tls://secure.example.com:443",
        "auth_enabled": False,
        "tls_enabled": True,
        "disable_cert_verification": True,
    }


@pytest.mark.parametrize("value", ["true", "True", "1", "yes", "on"])
def test_tls_from_string_extra(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    # Connections written as URIs carry extras as strings.
    assert config_of(monkeypatch, host="h", extra={"tls": value}).tls_enabled


def test_tls_from_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_of(monkeypatch, host="h", schema="tls")
    assert config.tls_enabled and config.controller_uri == "tls://h:9090"


def test_tls_from_connection_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    # pravega://host:port/tls puts "tls" in the schema field.
    monkeypatch.setenv("AIRFLOW_CONN_PRAVEGA_URI", "pravega://ctrl.example.com:9443/tls?scope=sales")
    config = PravegaHook(pravega_conn_id="pravega_uri").get_config()
    assert config.controller_uri == "tls://ctrl.example.com:9443"
    assert config.scope == "sales"


def test_scheme_and_port_inside_host(monkeypatch: pytest.MonkeyPatch) -> None:
    assert config_of(monkeypatch, host="tls://ctrl:9443").controller_uri == "tls://ctrl:9443"
    assert config_of(monkeypatch, host="tcp://ctrl").controller_uri == "tcp://ctrl:9090"
    assert config_of(monkeypatch, host="ctrl:9191").controller_uri == "tcp://ctrl:9191"


def test_ipv6_host(monkeypatch: pytest.MonkeyPatch) -> None:
    assert config_of(monkeypatch, host="::1", port=9090).controller_uri == "tcp://[::1]:9090"
    assert config_of(monkeypatch, host="[::1]:9191").controller_uri == "tcp://[::1]:9191"


def test_basic_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_of(monkeypatch, host="h", login="admin", password="s3cret-pass")
    assert config.auth_enabled
    assert (config.username, config.password) == ("admin", "s3cret-pass")
    assert config.stream_manager_kwargs()["auth_enabled"] is True
    assert config.client_environment() == {
        ENV_AUTH_METHOD: "Basic",
        ENV_AUTH_USERNAME: "admin",
        ENV_AUTH_PASSWORD: "s3cret-pass",
    }


def test_transaction_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    assert config_of(monkeypatch, extra={"transaction_lease_ms": 30000}).transaction_lease_ms == 30000
    assert config_of(monkeypatch, extra={"transaction_lease_ms": "45000"}).transaction_lease_ms == 45000


def test_legacy_prefixed_extra_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_of(monkeypatch, extra={"extra__pravega__scope": "old", "extra__pravega__tls": "false"})
    assert config.scope == "old" and not config.tls_enabled


def test_empty_form_fields_mean_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_of(
        monkeypatch,
        host="h",
        extra={"scope": "", "tls": None, "trust_store": "", "transaction_lease_ms": None},
    )
    assert config.scope is None and not config.tls_enabled and config.transaction_lease_ms == 90_000


def test_repr_never_shows_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_of(monkeypatch, host="h", login="admin", password="TopSecret-42")
    for text in (repr(config), str(config), repr(PravegaHook(pravega_conn_id="pravega_under_test").get_config())):
        assert "TopSecret-42" not in text
        assert "***" in text and "admin" in text and "tcp://h:9090" in text


def test_config_pickles_for_spark_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_of(monkeypatch, host="h", login="u", password="p", extra={"scope": "s"})
    assert pickle.loads(pickle.dumps(config)) == config


def test_config_is_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_of(monkeypatch)
    with pytest.raises(AttributeError):
        config.port = 1  # type: ignore[misc]


# ------------------------------------------------------------------------------------ bad values


@pytest.mark.parametrize(
    ("fields", "field", "shown"),
    [
        ({"host": "h", "port": -1}, "port", "-1"),
        ({"host": "h", "port": 70000}, "port", "70000"),
        ({"host": "h:abc"}, "host", "h:abc"),
        ({"host": "http://ctrl:9090"}, "host", "http://ctrl:9090"),
        ({"host": "h", "schema": "http"}, "schema", "http"),
        ({"host": "h", "extra": {"tls": "maybe"}}, "tls", "maybe"),
        ({"host": "h", "extra": {"tls": 2}}, "tls", "2"),
        ({"host": "h", "extra": {"transaction_lease_ms": -5}}, "transaction_lease_ms", "-5"),
        ({"host": "h", "extra": {"transaction_lease_ms": "soon"}}, "transaction_lease_ms", "soon"),
        ({"host": "h", "extra": {"scope": "has space"}}, "scope", "has space"),
        ({"host": "h", "extra": {"tsl": True}}, "extra", "tsl"),
        ({"host": "bad host/name"}, "host", "bad host/name"),
        ({"host": "h", "extra": {"trust_store": "/ca.pem"}}, "trust_store", "/ca.pem"),
        ({"host": "tcp://h", "extra": {"tls": True}}, "tls", "True"),
        ({"host": "tls://h", "schema": "tcp"}, "schema", "tcp"),
        ({"host": "h:9091", "port": 9092}, "port", "9092"),
        ({"host": "h", "password": "p"}, "login", "None"),
    ],
)
def test_bad_values_are_rejected_naming_field_and_value(
    monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any], field: str, shown: str
) -> None:
    with pytest.raises(PravegaConfigError) as caught:
        config_of(monkeypatch, **fields)
    assert isinstance(caught.value, ValueError)
    assert caught.value.field == field
    message = str(caught.value)
    assert repr(field) in message and shown in message


def test_non_numeric_port_of_a_connection_object_is_rejected() -> None:
    # Airflow's AIRFLOW_CONN_* JSON parser drops such a connection before a hook sees it ("isn't
    # defined"); a Connection built by other means (e.g. a secrets backend) can still carry one.
    from airflow.sdk import Connection

    conn = Connection(conn_id="pravega_bad_port", conn_type="pravega", host="h", port="ninety")  # type: ignore[arg-type]
    with pytest.raises(PravegaConfigError) as caught:
        PravegaHook.config_from_connection(conn)
    assert caught.value.field == "port"
    assert str(caught.value) == (
        "Pravega connection field 'port' has bad value 'ninety': the port must be a number in 1-65535"
    )


def test_wrong_connection_type_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_NOT_PRAVEGA", json.dumps({"conn_type": "postgres", "host": "db"}))
    with pytest.raises(PravegaConfigError, match="conn_type"):
        PravegaHook(pravega_conn_id="not_pravega").get_config()


def test_direct_construction_is_validated() -> None:
    with pytest.raises(PravegaConfigError, match="'port'"):
        PravegaConnectionConfig(port=-1)
    with pytest.raises(PravegaConfigError, match="'tls_enabled'"):
        PravegaConnectionConfig(tls_enabled="yes")  # type: ignore[arg-type]
    with pytest.raises(PravegaConfigError) as caught:
        PravegaConnectionConfig(username="u", password=1234)  # type: ignore[arg-type]
    assert "1234" not in str(caught.value)


# ------------------------------------------------------------------- official client environment


def test_official_client_env_is_scoped_and_restored(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    monkeypatch.setenv(ENV_AUTH_USERNAME, "someone-else")
    monkeypatch.delenv(ENV_TLS_CERT_PATH, raising=False)
    config = PravegaConnectionConfig(host="h", username="u", password="p", tls_enabled=True, trust_store=str(ca))
    with official_client_env(config):
        assert os.environ[ENV_AUTH_USERNAME] == "u"
        assert os.environ[ENV_AUTH_PASSWORD] == "p"
        assert os.environ[ENV_TLS_CERT_PATH] == str(ca)
    assert os.environ[ENV_AUTH_USERNAME] == "someone-else"
    assert ENV_AUTH_PASSWORD not in os.environ and ENV_TLS_CERT_PATH not in os.environ

    # A connection without auth hides credentials another connection left in the process.
    with official_client_env(PravegaConnectionConfig(host="h")):
        assert ENV_AUTH_USERNAME not in os.environ


def test_tls_with_missing_trust_store_file_is_reported() -> None:
    config = PravegaConnectionConfig(host="h", tls_enabled=True, trust_store="/nonexistent/ca.pem")
    with pytest.raises(PravegaConfigError, match="no such file"):
        config.client_environment()


# ------------------------------------------------------------------------------- UI description


def test_ui_field_behaviour() -> None:
    behaviour = PravegaHook.get_ui_field_behaviour()
    assert behaviour["hidden_fields"] == ["schema"]
    assert behaviour["relabeling"]["host"] == "Controller host"
    assert behaviour["relabeling"]["port"] == "Controller port"
    assert behaviour["relabeling"]["login"] == "Username"
    assert behaviour["placeholders"]["port"] == "9090"


def test_connection_form_widgets() -> None:
    from wtforms import BooleanField, IntegerField, SelectField, StringField

    widgets = PravegaHook.get_connection_form_widgets()
    assert set(widgets) == {"scope", "tls", "trust_store", "validate_hostname", "transaction_lease_ms",
                            "auth_method", "keycloak_file"}
    assert widgets["tls"].field_class is BooleanField
    assert widgets["validate_hostname"].field_class is BooleanField
    assert widgets["validate_hostname"].kwargs["default"] is True
    assert widgets["transaction_lease_ms"].field_class is IntegerField
    assert widgets["transaction_lease_ms"].kwargs["default"] == 90000
    assert widgets["scope"].field_class is StringField
    assert widgets["trust_store"].field_class is StringField
    assert widgets["keycloak_file"].field_class is StringField
    assert widgets["auth_method"].field_class is SelectField
    assert widgets["auth_method"].kwargs["choices"] == [("", ""), ("Basic", "Basic"), ("Bearer", "Bearer")]


# ------------------------------------------------------------------------------- test_connection


@pytest.fixture
def closed_port() -> int:
    """A local port with nothing listening on it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A local TCP port that accepts connections and never sends a byte (not a gRPC server)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept_forever() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            accepted.append(conn)

    thread = threading.Thread(target=accept_forever, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(2)
    for conn in accepted:
        conn.close()
    server.close()


def test_test_connection_to_closed_port_fails_fast(monkeypatch: pytest.MonkeyPatch, closed_port: int) -> None:
    set_connection(monkeypatch, "pravega_closed", host="127.0.0.1", port=closed_port)
    started = time.monotonic()
    ok, message = PravegaHook(pravega_conn_id="pravega_closed").test_connection()
    elapsed = time.monotonic() - started
    assert ok is False
    assert f"tcp://127.0.0.1:{closed_port}" in message and "refused" in message.lower()
    assert elapsed < HANG_GUARD_S, f"took {elapsed:.1f} s"  # a hang guard: the bug it catches is a minute of retries


def test_test_connection_to_non_grpc_listener_fails_within_10s(
    monkeypatch: pytest.MonkeyPatch, silent_listener: int
) -> None:
    set_connection(monkeypatch, "pravega_silent", host="127.0.0.1", port=silent_listener)
    started = time.monotonic()
    ok, message = PravegaHook(pravega_conn_id="pravega_silent").test_connection()
    elapsed = time.monotonic() - started
    assert ok is False
    assert f"tcp://127.0.0.1:{silent_listener}" in message
    assert "controller call failed" in message and "no answer" in message
    assert elapsed < HANG_GUARD_S, f"took {elapsed:.1f} s"


def test_test_connection_reports_bad_config_without_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    set_connection(monkeypatch, "pravega_bad", host="h", port=123456)
    ok, message = PravegaHook(pravega_conn_id="pravega_bad").test_connection()
    assert ok is False
    assert "'pravega_bad'" in message and "'port'" in message and "123456" in message


def test_test_connection_reports_missing_trust_store(monkeypatch: pytest.MonkeyPatch, closed_port: int) -> None:
    set_connection(
        monkeypatch, "pravega_tls", host="127.0.0.1", port=closed_port, extra={"tls": True, "trust_store": "/no/ca.pem"}
    )
    ok, message = PravegaHook(pravega_conn_id="pravega_tls").test_connection()
    assert ok is False and "trust_store" in message and "/no/ca.pem" in message


def test_airflow_connection_test_path_reaches_the_hook(monkeypatch: pytest.MonkeyPatch, closed_port: int) -> None:
    """What the UI's "Test" button runs: Connection.test_connection -> get_hook -> hook.test_connection."""
    from airflow.models.connection import Connection

    conn = Connection(conn_id="pravega_ui", conn_type="pravega", host="127.0.0.1", port=closed_port)
    monkeypatch.setenv("AIRFLOW_CONN_PRAVEGA_UI", conn.as_json())
    ok, message = conn.test_connection()
    assert ok is False and "Cannot reach the Pravega controller" in message


# ------------------------------------------------- test_connection against real gRPC servers


def _pb_string(field: int, value: bytes) -> bytes:
    """One length-delimited protobuf field (lengths < 128 here), encoded by hand on purpose."""
    assert len(value) < 128
    return bytes([(field << 3) | 2, len(value)]) + value


class ListScopesServer:
    """A gRPC server on 127.0.0.1 that answers Pravega's listScopes from fixed pages of scope names.

    Requests and replies are raw bytes, encoded here by hand, so the hook's protobuf code is
    checked against the wire format rather than against itself.
    """

    def __init__(
        self, pages: list[list[str]], implement: bool = True, tls: tuple[bytes, bytes] | None = None
    ) -> None:
        import grpc

        self.pages = pages
        self.requests: list[bytes] = []
        self.metadata: list[dict[str, str]] = []
        self.server = grpc.server(ThreadPoolExecutor(max_workers=2))
        if implement:
            handler = grpc.unary_unary_rpc_method_handler(
                self._list_scopes, request_deserializer=None, response_serializer=None
            )
            service = grpc.method_handlers_generic_handler(
                "io.pravega.controller.stream.api.grpc.v1.ControllerService", {"listScopes": handler}
            )
            self.server.add_generic_rpc_handlers((service,))
        if tls is None:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            key_pem, cert_pem = tls
            credentials = grpc.ssl_server_credentials([(key_pem, cert_pem)])
            self.port = self.server.add_secure_port("127.0.0.1:0", credentials)
        self.server.start()

    def _list_scopes(self, request: bytes, context: Any) -> bytes:
        self.requests.append(request)
        self.metadata.append(dict(context.invocation_metadata()))
        page_index = len(self.requests) - 1
        if page_index >= len(self.pages):
            return b""  # empty page: the end of the listing
        body = b"".join(_pb_string(1, name.encode()) for name in self.pages[page_index])
        return body + _pb_string(2, _pb_string(1, f"page{page_index + 1}".encode()))

    def stop(self) -> None:
        self.server.stop(0)


def test_test_connection_to_a_controller_counts_scopes_across_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    server = ListScopesServer([["examples", "sales"], ["_system"]])
    try:
        set_connection(monkeypatch, "pravega_grpc", host="127.0.0.1", port=server.port)
        ok, message = PravegaHook(pravega_conn_id="pravega_grpc").test_connection()
    finally:
        server.stop()
    assert (ok, message) == (True, f"Connected to Pravega controller at tcp://127.0.0.1:{server.port}; 3 scopes")
    # First request carries an empty (but present) continuation token, then the server's tokens.
    assert server.requests == [b"\x0a\x00", _pb_string(1, _pb_string(1, b"page1")), _pb_string(1, _pb_string(1, b"page2"))]
    assert all("authorization" not in md for md in server.metadata)


def test_test_connection_sends_basic_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    server = ListScopesServer([])
    try:
        set_connection(monkeypatch, "pravega_auth", host="127.0.0.1", port=server.port, login="admin", password="pw-1")
        ok, message = PravegaHook(pravega_conn_id="pravega_auth").test_connection()
    finally:
        server.stop()
    assert ok is True and message.endswith("; 0 scopes")
    assert server.metadata[0]["authorization"] == "Basic " + base64.b64encode(b"admin:pw-1").decode()


def test_test_connection_to_a_grpc_server_that_is_not_pravega_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    # The official client's list_scope() would report "0 scopes" here; the hook must not.
    server = ListScopesServer([], implement=False)
    try:
        set_connection(monkeypatch, "pravega_other", host="127.0.0.1", port=server.port)
        started = time.monotonic()
        ok, message = PravegaHook(pravega_conn_id="pravega_other").test_connection()
        elapsed = time.monotonic() - started
    finally:
        server.stop()
    assert ok is False
    assert "does not implement Pravega's listScopes" in message
    assert elapsed < HANG_GUARD_S


def _self_signed(common_name: str) -> tuple[bytes, bytes]:
    """A fresh self-signed certificate for ``common_name`` (key PEM, cert PEM)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(common_name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def localhost_certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes, Path]:
    """A self-signed certificate for 'localhost' (key PEM, cert PEM, cert file)."""
    key_pem, cert_pem = _self_signed("localhost")
    cert_file = tmp_path_factory.mktemp("tls") / "ca.pem"
    cert_file.write_bytes(cert_pem)
    return key_pem, cert_pem, cert_file


def test_test_connection_over_tls_with_trust_store(
    monkeypatch: pytest.MonkeyPatch, localhost_certificate: tuple[bytes, bytes, Path]
) -> None:
    key_pem, cert_pem, cert_file = localhost_certificate
    server = ListScopesServer([["secure-scope"]], tls=(key_pem, cert_pem))
    try:
        set_connection(
            monkeypatch, "pravega_tls_ok", host="localhost", port=server.port,
            extra={"tls": True, "trust_store": str(cert_file)},
        )
        ok, message = PravegaHook(pravega_conn_id="pravega_tls_ok").test_connection()
    finally:
        server.stop()
    assert (ok, message) == (True, f"Connected to Pravega controller at tls://localhost:{server.port}; 1 scope")


def test_test_connection_over_tls_with_an_untrusted_certificate_fails(
    monkeypatch: pytest.MonkeyPatch, localhost_certificate: tuple[bytes, bytes, Path], tmp_path: Path
) -> None:
    key_pem, cert_pem, _ = localhost_certificate
    other_ca = tmp_path / "other.pem"
    other_ca.write_bytes(_self_signed("localhost")[1])  # valid, but did not sign the server's certificate
    server = ListScopesServer([["secure-scope"]], tls=(key_pem, cert_pem))
    try:
        set_connection(
            monkeypatch, "pravega_tls_bad", host="localhost", port=server.port,
            extra={"tls": True, "trust_store": str(other_ca)},
        )
        started = time.monotonic()
        ok, message = PravegaHook(pravega_conn_id="pravega_tls_bad").test_connection()
        elapsed = time.monotonic() - started
    finally:
        server.stop()
    assert ok is False and "controller call failed" in message
    assert "CERTIFICATE_VERIFY_FAILED" in message
    assert elapsed < HANG_GUARD_S


def test_test_connection_with_certificate_checks_off_does_a_tls_handshake(
    monkeypatch: pytest.MonkeyPatch, localhost_certificate: tuple[bytes, bytes, Path]
) -> None:
    key_pem, cert_pem, _ = localhost_certificate
    server = ListScopesServer([], tls=(key_pem, cert_pem))
    try:
        set_connection(
            monkeypatch, "pravega_tls_insecure", host="localhost", port=server.port,
            extra={"tls": True, "validate_hostname": False},
        )
        ok, message = PravegaHook(pravega_conn_id="pravega_tls_insecure").test_connection()
    finally:
        server.stop()
    assert ok is True
    assert message.startswith("TLS handshake (TLSv1.") and "validate_hostname=false" in message


# ----------------------------------------------------------- test_connection against real Pravega


def _load_standalone_backend() -> Any:
    """tests/backends/standalone.py (real Pravega standalone from Maven Central), loaded by path."""
    import importlib.util
    import sys

    name = "pravega_hook_tests_standalone_backend"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "backends" / "standalone.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.mark.standalone
def test_test_connection_to_real_pravega_counts_its_scopes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Positive case against the real thing: Pravega 0.13.0 standalone's controller."""
    backend = _load_standalone_backend()
    available, reason = backend.standalone_available()
    if not available:
        pytest.skip(reason)
    from airflow_provider_pravega.client import PravegaClient

    with backend.PravegaStandalone(work_dir=tmp_path / "standalone") as controller_uri:
        host_port = controller_uri.split("://", 1)[1]
        host, port = host_port.rsplit(":", 1)
        set_connection(monkeypatch, "pravega_real", host=host, port=int(port))
        hook = PravegaHook(pravega_conn_id="pravega_real")
        ok, message = hook.test_connection()
        assert ok is True, message
        before = int(message.rsplit("; ", 1)[1].split()[0])

        with PravegaClient(controller_uri) as own:
            assert own.admin.create_scope("hookcheck")
        started = time.monotonic()
        ok, message = PravegaHook(pravega_conn_id="pravega_real").test_connection()
        elapsed = time.monotonic() - started
    assert ok is True, message
    assert message == f"Connected to Pravega controller at tcp://{host}:{port}; {before + 1} scope" + (
        "" if before + 1 == 1 else "s"
    )
    assert elapsed < HANG_GUARD_S


def test_test_connection_to_the_embedded_server(monkeypatch: pytest.MonkeyPatch, pravega_controller_uri: str) -> None:
    """Positive case against the embedded Pravega-compatible server (fixture from the testing plugin)."""
    host, port = first_controller(pravega_controller_uri).rsplit(":", 1)
    set_connection(monkeypatch, "pravega_embedded", host=host, port=int(port))
    ok, message = PravegaHook(pravega_conn_id="pravega_embedded").test_connection()
    assert ok is True, message
    before = int(message.rsplit("; ", 1)[1].split()[0])

    import uuid

    from airflow_provider_pravega.client import PravegaClient

    with PravegaClient(pravega_controller_uri) as own:
        assert own.admin.create_scope(f"hookcheck{uuid.uuid4().hex[:8]}")
    started = time.monotonic()
    ok, message = PravegaHook(pravega_conn_id="pravega_embedded").test_connection()
    elapsed = time.monotonic() - started
    noun = "scope" if before + 1 == 1 else "scopes"
    assert (ok, message) == (True, f"Connected to Pravega controller at tcp://{host}:{port}; {before + 1} {noun}")
    assert elapsed < HANG_GUARD_S


# ------------------------------------------------- authentication and TLS (secure embedded server)


def _secure_connection(
    monkeypatch: pytest.MonkeyPatch, conn_id: str, server: Any, user: str | None, password: str | None = None,
    *, tls: bool | None = None,
) -> None:
    host, port = server.controller_uri.split("://", 1)[1].rsplit(":", 1)
    use_tls = server.tls if tls is None else tls
    extra: dict[str, Any] = {"tls": use_tls}
    if use_tls:
        extra["trust_store"] = str(server.ca_cert)
    fields: dict[str, Any] = {"host": host, "port": int(port), "extra": extra}
    if user is not None:
        fields["login"] = user
        fields["password"] = server.passwords[user] if password is None else password
    set_connection(monkeypatch, conn_id, **fields)


def _timed(fn: Any) -> tuple[Any, float]:
    started = time.monotonic()
    result = fn()
    return result, time.monotonic() - started


def test_test_connection_with_the_right_password(monkeypatch: pytest.MonkeyPatch, pravega_secure_embedded: Any) -> None:
    _secure_connection(monkeypatch, "pravega_sec_ok", pravega_secure_embedded, "admin")
    (ok, message), elapsed = _timed(PravegaHook("pravega_sec_ok").test_connection)
    assert ok is True, message
    assert message.startswith(f"Connected to Pravega controller at {pravega_secure_embedded.controller_uri}")
    assert elapsed < HANG_GUARD_S


def test_test_connection_with_a_wrong_password_fails_fast(
    monkeypatch: pytest.MonkeyPatch, pravega_secure_embedded: Any
) -> None:
    _secure_connection(monkeypatch, "pravega_sec_bad", pravega_secure_embedded, "admin", "wrong-Pa55word")
    (ok, message), elapsed = _timed(PravegaHook("pravega_sec_bad").test_connection)
    assert ok is False
    assert "refused to authenticate user 'admin'" in message and "login and password" in message
    assert "wrong-Pa55word" not in message and pravega_secure_embedded.passwords["admin"] not in message
    assert elapsed < HANG_GUARD_S


def test_test_connection_without_credentials_says_they_are_needed(
    monkeypatch: pytest.MonkeyPatch, pravega_secure_embedded: Any
) -> None:
    _secure_connection(monkeypatch, "pravega_sec_anon", pravega_secure_embedded, None)
    (ok, message), elapsed = _timed(PravegaHook("pravega_sec_anon").test_connection)
    assert ok is False and "without credentials" in message and elapsed < HANG_GUARD_S


def test_test_connection_plaintext_against_tls_fails_fast(
    monkeypatch: pytest.MonkeyPatch, pravega_secure_embedded: Any
) -> None:
    _secure_connection(monkeypatch, "pravega_sec_plain", pravega_secure_embedded, "admin", tls=False)
    (ok, message), elapsed = _timed(PravegaHook("pravega_sec_plain").test_connection)
    assert ok is False and "speaks TLS but the connection is plaintext" in message
    assert elapsed < HANG_GUARD_S


def test_test_connection_tls_against_plaintext_fails_fast(
    monkeypatch: pytest.MonkeyPatch, pravega_controller_uri: str, tmp_path: Path
) -> None:
    from airflow_provider_pravega.embedded.local_pki import make_test_pki

    ca = make_test_pki(tmp_path / "pki").ca_cert
    host, port = pravega_controller_uri.split("://", 1)[1].rsplit(":", 1)
    set_connection(monkeypatch, "pravega_tls_vs_plain", host=host, port=int(port),
                   extra={"tls": True, "trust_store": str(ca)})
    (ok, message), elapsed = _timed(PravegaHook("pravega_tls_vs_plain").test_connection)
    assert ok is False and "TLS" in message and "plaintext" in message
    assert elapsed < HANG_GUARD_S


@pytest.mark.official_client
def test_get_conn_with_a_wrong_password_fails_in_seconds(
    monkeypatch: pytest.MonkeyPatch, pravega_secure_embedded: Any
) -> None:
    """The official client would retry UNAUTHENTICATED for about a minute; the hook checks first."""
    from airflow_provider_pravega.client.errors import PravegaAuthenticationError

    _secure_connection(monkeypatch, "pravega_sec_conn_bad", pravega_secure_embedded, "admin", "wrong-Pa55word")
    started = time.monotonic()
    with pytest.raises(PravegaAuthenticationError) as info:
        PravegaHook("pravega_sec_conn_bad").get_conn()
    assert time.monotonic() - started < HANG_GUARD_S
    assert "'admin'" in str(info.value) and "wrong-Pa55word" not in str(info.value)
    assert not [k for k in os.environ if k.startswith("pravega_client_auth_")]


def _c_getenv(name: str) -> str | None:
    """What native code (the official client's Rust config builder) reads: the C environment."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    value = libc.getenv(name.encode())
    return value.decode() if value is not None else None


@pytest.mark.official_client
def test_official_client_credentials_never_reach_another_connection(
    monkeypatch: pytest.MonkeyPatch, pravega_secure_embedded: Any, pravega_controller_uri: str
) -> None:
    """Two connections in one process, one with credentials (auth+TLS), one without: each
    StreamManager is built seeing only its own settings, the environment is clean before and after,
    and the credentialed manager keeps working after its variables are gone (the official client
    copies them into its configuration when it is built and never reads them again)."""
    import pravega_client

    server = pravega_secure_embedded
    _secure_connection(monkeypatch, "pravega_sec_admin", server, "admin")
    host, port = pravega_controller_uri.split("://", 1)[1].rsplit(":", 1)
    set_connection(monkeypatch, "pravega_plain_anon", host=host, port=int(port))
    names = (ENV_AUTH_METHOD, ENV_AUTH_USERNAME, ENV_AUTH_PASSWORD, ENV_TLS_CERT_PATH)
    for env_name in names:
        monkeypatch.delenv(env_name, raising=False)

    seen: list[dict[str, str | None]] = []
    real = pravega_client.StreamManager

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append({n: _c_getenv(n) for n in names} | {"auth_enabled": str(kwargs.get("auth_enabled"))})
        return real(*args, **kwargs)

    monkeypatch.setattr(pravega_client, "StreamManager", spy)

    secure = PravegaHook("pravega_sec_admin").get_conn()
    assert all(_c_getenv(n) is None and n not in os.environ for n in names)
    plain = PravegaHook("pravega_plain_anon").get_conn()
    assert all(_c_getenv(n) is None and n not in os.environ for n in names)

    assert seen[0] == {
        ENV_AUTH_METHOD: "Basic", ENV_AUTH_USERNAME: "admin", ENV_AUTH_PASSWORD: server.passwords["admin"],
        ENV_TLS_CERT_PATH: str(server.ca_cert), "auth_enabled": "True",
    }
    assert seen[1] == {n: None for n in names} | {"auth_enabled": "False"}

    # Both work for real, after the environment was restored.
    scope = f"isolated{os.getpid()}x{int(time.time() * 1000) % 10**8}"
    assert secure.create_scope(scope) is True
    assert scope in secure.list_scope()
    assert plain.create_scope(scope) is True

    # Many builds at once from threads: each sees exactly its own connection's settings.
    seen.clear()
    hooks = [PravegaHook("pravega_sec_admin"), PravegaHook("pravega_plain_anon")] * 8
    for hook in hooks:
        hook.get_config()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda h: h.get_config().create_stream_manager(), hooks))
    assert len(seen) == len(hooks)
    for snapshot in seen:
        if snapshot["auth_enabled"] == "True":
            assert snapshot[ENV_AUTH_USERNAME] == "admin"
        else:
            assert snapshot == {n: None for n in names} | {"auth_enabled": "False"}
    assert all(_c_getenv(n) is None for n in names)


def test_password_is_masked_and_never_in_reprs(monkeypatch: pytest.MonkeyPatch, pravega_secure_embedded: Any) -> None:
    from airflow.sdk._shared.secrets_masker import redact

    server = pravega_secure_embedded
    _secure_connection(monkeypatch, "pravega_sec_mask", server, "admin")
    hook = PravegaHook("pravega_sec_mask")
    config = hook.get_config()
    password = server.passwords["admin"]
    basic = base64.b64encode(f"admin:{password}".encode()).decode()
    for text in (repr(config), str(config), repr(hook), repr(hook.get_client())):
        assert password not in text and basic not in text
    logged = redact(f"connecting with {password} and header Basic {basic}")
    assert password not in logged and basic not in logged


def test_test_connection_with_hostname_checks_off_asks_the_controller(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """validate_hostname=false with a trusted CA: the controller is really asked (gRPC is told the
    certificate's own name); only an untrusted chain falls back to a bare TLS handshake."""
    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess
    from airflow_provider_pravega.embedded.local_pki import make_test_pki

    pki = make_test_pki(tmp_path / "pki", hosts=("pravega.example.internal",))
    process = EmbeddedPravegaProcess(tmp_path / "data", tls_cert=pki.server_cert, tls_key=pki.server_key)
    process.start()
    try:
        port = int(process.controller_uri.rsplit(":", 1)[1])
        set_connection(monkeypatch, "pravega_noname", host="127.0.0.1", port=port,
                       extra={"tls": True, "trust_store": str(pki.ca_cert), "validate_hostname": False})
        (ok, message), elapsed = _timed(PravegaHook("pravega_noname").test_connection)
        assert ok is True and message.startswith(f"Connected to Pravega controller at tls://127.0.0.1:{port}; ")
        set_connection(monkeypatch, "pravega_named", host="127.0.0.1", port=port,
                       extra={"tls": True, "trust_store": str(pki.ca_cert)})
        (ok, message), elapsed = _timed(PravegaHook("pravega_named").test_connection)
        assert ok is False and "does not name host '127.0.0.1'" in message and elapsed < HANG_GUARD_S
    finally:
        process.stop()


@pytest.mark.official_client
def test_official_client_renews_tokens_without_the_environment(
    monkeypatch: pytest.MonkeyPatch, pravega_secure_embedded_factory: Any
) -> None:
    """The official client copies the credentials into its configuration when the StreamManager is
    built (pravega-client-rust's ClientConfigBuilder reads the variables once, in build()); it never
    reads them again - not for delegation tokens fetched later, not after they expire. Shown with a
    2-second token TTL: writes long after the variables were restored, across several expiries."""
    server = pravega_secure_embedded_factory(token_ttl_s=2, tls=True)
    _secure_connection(monkeypatch, "pravega_sec_ttl", server, "admin")
    hook = PravegaHook("pravega_sec_ttl")
    with hook.get_client() as client:
        client.admin.create_scope("ttl")
        client.admin.create_stream("ttl", "events", 1)
    manager = hook.get_conn()
    assert not [k for k in os.environ if k.startswith("pravega_client_auth_")]
    for round_no in range(3):
        writer = manager.create_writer("ttl", "events", 100)  # a new append setup: needs a valid token
        for i in range(10):
            writer.write_event(f"r{round_no}-{i}")
        writer.flush()
        time.sleep(2.5)  # the token in use expires
    with hook.get_client() as client:
        segment = "ttl/events/0.#epoch.0"
        assert client.segments.get_segment_info(segment).length == sum(8 + len(f"r{r}-{i}") for r in range(3)
                                                                      for i in range(10))


def test_get_conn_without_the_official_client_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the official client is not installed (CPython 3.12+), get_conn() names the extra and
    the hook's own client; get_client() works. (A None entry in sys.modules makes the import fail
    exactly as a missing package does, on any interpreter.)"""
    import sys

    from airflow_provider_pravega.client.errors import OfficialClientMissingError

    monkeypatch.setitem(sys.modules, "pravega_client", None)
    set_connection(monkeypatch, "pravega_plain", host="127.0.0.1", port=9090)
    hook = PravegaHook(pravega_conn_id="pravega_plain")
    with pytest.raises(OfficialClientMissingError) as err:
        hook.get_conn()
    message = str(err.value)
    assert isinstance(err.value, ImportError) and "\n" not in message
    assert 'pip install "airflow-provider-pravega[official-client]"' in message
    assert "CPython 3.10 and 3.11 only" in message and "PravegaHook.get_client()" in message
    with hook.get_client() as own:
        assert own.controller_uri == "tcp://127.0.0.1:9090"
