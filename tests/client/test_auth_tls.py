"""This provider's own Pravega client against the embedded server with authentication and TLS.

Every operation the operators use works with the right credentials (auth only, TLS only, both);
wrong or missing credentials, missing permissions, a tampered token and TLS mismatches are refused
within seconds with an error that says what is wrong (never the password), and nothing is written;
an expired token is renewed without the caller noticing.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.batch import (
    plan_segment_ranges,
    read_segment_ranges,
)
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.errors import (
    AuthenticationError,
    DelegationTokenError,
    PravegaAuthenticationError,
    PravegaPermissionError,
    PravegaTLSError,
)
from airflow_provider_pravega.client.security import TokenCache, token_lifetime
from airflow_provider_pravega.client.streamcut import StreamCut
from airflow_provider_pravega.client.synchronizer import StateSynchronizer
from airflow_provider_pravega.client.transactions import TxnStatus
from airflow_provider_pravega.protocol import naming

from hang_guard import HANG_GUARD_S as FAST_S  # "within seconds": well below the official client's ~61 s of retries


def config_for(
    server: Any,
    user: str | None,
    password: str | None = None,
    *,
    tls: bool | None = None,
    trust_store: str | Path | None = None,
    scope: str | None = None,
) -> PravegaConnectionConfig:
    """A connection config for ``server`` as ``user`` (its fixture password unless one is given)."""
    host_port = server.controller_uri.split("://", 1)[1]
    host, port = host_port.rsplit(":", 1)
    use_tls = server.tls if tls is None else tls
    extra: dict[str, Any] = {"tls": use_tls}
    if use_tls:
        extra["trust_store"] = str(trust_store or server.ca_cert)
    if scope:
        extra["scope"] = scope
    return PravegaConnectionConfig.from_connection_fields(
        host=host,
        port=int(port),
        login=user,
        password=(server.passwords[user] if password is None and user else password),
        extra=extra,
    )


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def fast(fn: Callable[[], Any], error: type[BaseException]) -> BaseException:
    """Run ``fn``; it must raise ``error`` within FAST_S seconds. Returns the exception."""
    started = time.monotonic()
    with pytest.raises(error) as info:
        fn()
    elapsed = time.monotonic() - started
    assert elapsed < FAST_S, f"took {elapsed:.1f} s to fail: {info.value}"
    return info.value


def no_secret_in(text: str, server: Any) -> None:
    for password in server.passwords.values():
        assert password not in text
        assert base64.b64encode(password.encode()).decode() not in text


def tail_bytes(admin: PravegaClient, scope: str, stream: str) -> int:
    """Bytes stored in the stream's current segments (what an admin sees)."""
    return sum(admin.admin.tail(scope, stream).values())


# ----------------------------------------------------------------------------------- servers


@pytest.fixture(scope="module")
def auth_only(pravega_secure_embedded_factory_module: Callable[..., Any]) -> Any:
    return pravega_secure_embedded_factory_module(tls=False)


@pytest.fixture(scope="module")
def pravega_secure_embedded_factory_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    """Like the plugin's function-scoped factory, but the servers live for the whole module."""
    from airflow_provider_pravega.embedded import pytest_plugin

    started: list[Any] = []

    def start(**kwargs: Any) -> Any:
        server = pytest_plugin._start_secure(
            tmp_path_factory.mktemp("pravega-secure-mod"),
            token_ttl_s=kwargs.pop("token_ttl_s", None),
            tls=kwargs.pop("tls", True),
            extra_users=kwargs.pop("extra_users", None),
            **kwargs,
        )
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in reversed(started):
            server.process.stop()


@pytest.fixture(scope="module")
def tls_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """TLS without authentication: the server hands out empty tokens."""
    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess
    from airflow_provider_pravega.embedded.local_pki import make_test_pki

    base = tmp_path_factory.mktemp("pravega-tls-only")
    pki = make_test_pki(base / "pki")
    process = EmbeddedPravegaProcess(base / "data", tls_cert=pki.server_cert, tls_key=pki.server_key)
    process.start()

    class _Server:
        controller_uri = process.controller_uri
        tls = True
        ca_cert = pki.ca_cert
        passwords: dict[str, str] = {}

    try:
        yield _Server()
    finally:
        process.stop()


# ------------------------------------------------------------------- every operation works


def exercise_everything(config: PravegaConnectionConfig) -> dict[str, Any]:
    """Every client operation the operators use; returns what it saw."""
    scope, stream = name("sec"), name("events")
    seen: dict[str, Any] = {}
    with PravegaClient(config) as client:
        admin = client.admin
        assert admin.create_scope(scope)
        assert admin.create_stream(scope, stream, 1)
        assert scope in admin.list_scopes()
        assert stream in admin.list_streams(scope)

        # Transactions: begin / write / flush (pre-commit) / commit, and begin / abort.
        txns = client.transactions
        first = txns.begin(scope, stream)
        with txns.writer(scope, stream, first) as writer:
            for i in range(50):
                writer.write_event(json.dumps({"i": i}).encode(), f"k{i % 5}")
            writer.flush()
        assert txns.status(scope, stream, first.txn_id) == TxnStatus.OPEN
        assert txns.ping(scope, stream, first.txn_id) == TxnStatus.OPEN
        assert txns.commit(scope, stream, first.txn_id) == TxnStatus.COMMITTED
        second = txns.begin(scope, stream)
        with txns.writer(scope, stream, second) as writer:
            writer.write_event(b"never")
            writer.flush()
        txns.abort(scope, stream, second.txn_id)
        assert txns.wait_for(scope, stream, second.txn_id, [TxnStatus.ABORTED]) == TxnStatus.ABORTED

        # Batch read between cuts (head -> tail), straight from the segment store.
        head = StreamCut.head(client, scope, stream)
        tail = StreamCut.tail(client, scope, stream)
        ranges = plan_segment_ranges(client, head, tail)
        payloads = [e.payload for e in read_segment_ranges(client, ranges)]
        seen["events"] = sorted(json.loads(p)["i"] for p in payloads)

        # State synchronizer: conditional appends.
        sync = StateSynchronizer(
            client, scope, name("state"), {"n": 0}, lambda state, op: {"n": state["n"] + op}
        )
        try:
            sync.update(lambda state: 1)
            sync.update(lambda state: 2)
            seen["sync"] = sync.fetch_updates()["n"]
        finally:
            sync.close()

        # Scale, truncate, seal, delete.
        (segment,) = admin.controller.get_current_segments(scope, stream)
        new = admin.split_segment(scope, stream, segment.segment_id)
        seen["segments_after_split"] = len(new)
        admin.truncate_stream(scope, stream, tail.positions)
        admin.seal_stream(scope, stream)
        assert admin.delete_stream(scope, stream)
    return seen


def check_everything(seen: dict[str, Any]) -> None:
    assert seen["events"] == list(range(50))
    assert seen["sync"] == 3
    assert seen["segments_after_split"] == 2


def test_admin_does_everything_with_auth_and_tls(pravega_secure_embedded: Any) -> None:
    check_everything(exercise_everything(config_for(pravega_secure_embedded, "admin")))


def test_admin_does_everything_with_auth_only(auth_only: Any) -> None:
    assert not auth_only.tls
    check_everything(exercise_everything(config_for(auth_only, "admin")))


def test_everything_with_tls_only(tls_only: Any) -> None:
    check_everything(exercise_everything(config_for(tls_only, None)))


def test_writer_iot_works_in_its_scope(pravega_secure_embedded: Any) -> None:
    server = pravega_secure_embedded
    stream = name("readings")
    with PravegaClient(config_for(server, "admin")) as admin:
        admin.admin.create_scope("iot")
    with PravegaClient(config_for(server, "writer-iot")) as client:
        assert client.admin.create_stream("iot", stream, 1)
        info = client.transactions.begin("iot", stream)
        with client.transactions.writer("iot", stream, info) as writer:
            writer.write_event(b"hello")
            writer.flush()
        assert client.transactions.commit("iot", stream, info.txn_id) == TxnStatus.COMMITTED
    with PravegaClient(config_for(server, "admin")) as admin:
        assert tail_bytes(admin, "iot", stream) == 8 + len(b"hello")


# ------------------------------------------------------------------------------ refusals


@pytest.fixture(scope="module")
def target(pravega_secure_embedded: Any) -> tuple[str, str]:
    """A scope/stream made by admin, for the refusal tests (which must leave it empty)."""
    scope, stream = name("guarded"), name("stream")
    with PravegaClient(config_for(pravega_secure_embedded, "admin")) as admin:
        admin.admin.create_scope(scope)
        admin.admin.create_stream(scope, stream, 1)
    return scope, stream


def assert_untouched(server: Any, scope: str, stream: str) -> None:
    with PravegaClient(config_for(server, "admin")) as admin:
        assert tail_bytes(admin, scope, stream) == 0
        assert admin.admin.list_streams(scope) == [stream]


def test_wrong_password_is_refused_fast_and_clearly(pravega_secure_embedded: Any, target: tuple[str, str]) -> None:
    server = pravega_secure_embedded
    scope, stream = target
    wrong = "not-the-Pa55word"
    with PravegaClient(config_for(server, "admin", wrong)) as client:
        err = fast(lambda: client.transactions.begin(scope, stream), PravegaAuthenticationError)
        assert isinstance(err, AuthenticationError) and isinstance(err, PermissionError)
        assert err.user == "admin" and err.rpc == "createTransaction"
        assert "'admin'" in str(err) and "login and password" in str(err)
        assert wrong not in str(err) and wrong not in repr(err)
        fast(lambda: client.admin.create_stream(scope, name("x"), 1), PravegaAuthenticationError)
        fast(lambda: client.admin.list_scopes(), PravegaAuthenticationError)
        no_secret_in(str(err), server)
    assert_untouched(server, scope, stream)


def test_missing_credentials_are_refused(pravega_secure_embedded: Any, target: tuple[str, str]) -> None:
    server = pravega_secure_embedded
    scope, stream = target
    with PravegaClient(config_for(server, None)) as client:
        err = fast(lambda: client.transactions.begin(scope, stream), PravegaAuthenticationError)
        assert err.user is None
        assert "without credentials" in str(err) and "set login and password" in str(err)
        fast(lambda: client.admin.create_scope(name("nope")), PravegaAuthenticationError)
    assert_untouched(server, scope, stream)


def test_reader_cannot_write(pravega_secure_embedded: Any, target: tuple[str, str]) -> None:
    server = pravega_secure_embedded
    scope, stream = target
    with PravegaClient(config_for(server, "reader")) as client:
        # The reader may look...
        assert stream in client.admin.list_streams(scope)
        # ...but not begin a transaction, create, seal or truncate (controller: PERMISSION_DENIED)...
        err = fast(lambda: client.transactions.begin(scope, stream), PravegaPermissionError)
        assert err.user == "reader" and f"{scope}/{stream}" in err.resource and "createTransaction" in err.action
        assert "READ_UPDATE" in str(err)
        fast(lambda: client.admin.create_stream(scope, name("x"), 1), PravegaPermissionError)
        fast(lambda: client.admin.seal_stream(scope, stream), PravegaPermissionError)
        # ...nor get a token to write (controller: PERMISSION_DENIED for a WRITE token)...
        segment = naming.qualified_segment_name(scope, stream, 0)
        err = fast(lambda: client.segments.open_append_session(segment), PravegaPermissionError)
        assert err.user == "reader" and "getDelegationToken" in err.action
        # ...nor append with the READ token it can get (segment store: AuthTokenCheckFailed, code 0).
        read_token = client.controller.get_delegation_token(scope, stream, "read")
        assert read_token and client.segments.get_segment_info(segment).length == 0  # reading is fine
        client.controller.tokens.remember(scope, stream, read_token, access=("write",))
        err = fast(lambda: client.segments.open_append_session(segment), DelegationTokenError)
        assert err.user == "reader" and "SetupAppend" in err.action and segment in err.resource
        assert "error code 0" in str(err)
        no_secret_in(str(err), server)
    assert_untouched(server, scope, stream)


def test_writer_iot_cannot_touch_another_scope(pravega_secure_embedded: Any, target: tuple[str, str]) -> None:
    server = pravega_secure_embedded
    scope, stream = target
    with PravegaClient(config_for(server, "writer-iot")) as client:
        err = fast(lambda: client.transactions.begin(scope, stream), PravegaPermissionError)
        assert err.user == "writer-iot" and scope in err.resource
        fast(lambda: client.admin.create_stream(scope, name("x"), 1), PravegaPermissionError)
        fast(lambda: client.admin.create_scope(name("other")), PravegaPermissionError)
        segment = naming.qualified_segment_name(scope, stream, 0)
        fast(lambda: client.segments.open_append_session(segment), AuthenticationError)
    assert_untouched(server, scope, stream)


def test_tampered_token_is_refused_with_a_clear_error(pravega_secure_embedded: Any, target: tuple[str, str]) -> None:
    server = pravega_secure_embedded
    scope, stream = target
    segment = naming.qualified_segment_name(scope, stream, 0)
    with PravegaClient(config_for(server, "admin")) as client:
        token = client.controller.get_delegation_token(scope, stream)
        assert token.count(".") == 2, "the server hands out JWTs"
        head, body, signature = token.split(".")
        flipped = signature[:-2] + ("A" if signature[-2] != "A" else "B") + signature[-1]
        client.controller.tokens.remember(scope, stream, f"{head}.{body}.{flipped}")
        err = fast(lambda: client.segments.get_segment_info(segment), DelegationTokenError)
        assert "refused" in str(err) and "error code 0" in str(err) and err.user == "admin"
        fast(lambda: client.segments.open_append_session(segment), DelegationTokenError)
        # A body that claims more (another stream) with the old signature: refused as well.
        claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        forged = base64.urlsafe_b64encode(json.dumps({**claims, "sub": "root"}).encode()).rstrip(b"=").decode()
        client.controller.tokens.remember(scope, stream, f"{head}.{forged}.{signature}")
        fast(lambda: client.segments.get_segment_info(segment), DelegationTokenError)
        # The real token still works.
        client.controller.tokens.clear()
        assert client.segments.get_segment_info(segment).length == 0
    assert_untouched(server, scope, stream)


def test_expired_tokens_are_renewed(
    pravega_secure_embedded_factory: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    server = pravega_secure_embedded_factory(token_ttl_s=2, tls=True)
    scope, stream = name("ttl"), name("stream")
    with PravegaClient(config_for(server, "admin")) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, stream, 1)
        segment = naming.qualified_segment_name(scope, stream, 0)
        first = client.controller.get_delegation_token(scope, stream)
        exp, iat = token_lifetime(first)
        assert exp is not None and iat is not None and exp - iat == pytest.approx(2, abs=1)

        # Refreshed before expiry: an operation long after the TTL just works.
        info = client.transactions.begin(scope, stream)
        with client.transactions.writer(scope, stream, info) as writer:
            writer.write_event(b"one")
            writer.flush()
        time.sleep(3.0)
        assert client.segments.get_segment_info(segment).length == 0
        assert client.controller.get_delegation_token(scope, stream) != first

        # The segment store says "expired" (code 1): renewed once, transparently, for a read...
        time.sleep(2.5)
        stale = client.controller.tokens.get(scope, stream)
        time.sleep(2.5)
        client.controller.tokens.remember(scope, stream, stale)  # pretend it is still fresh
        fetches = client.controller.tokens.fetches
        with caplog.at_level(logging.INFO, logger="airflow_provider_pravega.client.connection"):
            assert client.segments.get_segment_info(segment).length == 0
        assert client.controller.tokens.fetches == fetches + 1
        assert client.controller.tokens.get(scope, stream) != stale
        assert "expired; retrying with a fresh one" in caplog.text

        # ...and for an append setup (the transaction's segments use the stream's token).
        client.controller.tokens.remember(scope, stream, stale)
        with client.transactions.writer(scope, stream, info) as writer:
            writer.write_event(b"two")
            writer.flush()
        assert client.controller.tokens.fetches == fetches + 2
        sync = StateSynchronizer(client, scope, name("state"), {"n": 0}, lambda s, op: {"n": s["n"] + op})
        try:
            sync.update(lambda s: 5)
            assert sync.fetch_updates()["n"] == 5
        finally:
            sync.close()
        assert client.transactions.commit(scope, stream, info.txn_id) == TxnStatus.COMMITTED
        assert client.segments.get_segment_info(segment).length == 2 * (8 + 3)


# ------------------------------------------------------------------------------------ TLS


def test_plaintext_client_against_tls_server_fails_fast(pravega_secure_embedded: Any) -> None:
    with PravegaClient(config_for(pravega_secure_embedded, "admin", tls=False)) as client:
        err = fast(lambda: client.admin.list_scopes(), PravegaTLSError)
    assert "speaks TLS" in str(err) and "tls://" in str(err)


def test_tls_client_against_plaintext_server_fails_fast(auth_only: Any, tmp_path: Path) -> None:
    from airflow_provider_pravega.embedded.local_pki import make_test_pki

    ca = make_test_pki(tmp_path / "pki").ca_cert
    with PravegaClient(config_for(auth_only, "admin", tls=True, trust_store=ca)) as client:
        err = fast(lambda: client.admin.list_scopes(), PravegaTLSError)
    assert "may not speak TLS" in str(err)


def test_untrusted_certificate_fails_fast(pravega_secure_embedded: Any, tmp_path: Path) -> None:
    from airflow_provider_pravega.embedded.local_pki import make_test_pki

    other_ca = make_test_pki(tmp_path / "other").ca_cert
    with PravegaClient(config_for(pravega_secure_embedded, "admin", trust_store=other_ca)) as client:
        err = fast(lambda: client.admin.list_scopes(), PravegaTLSError)
    assert "CERTIFICATE_VERIFY_FAILED" in str(err) and "trust_store" in str(err)


# -------------------------------------------------------------------------- no server needed


def test_token_cache_refreshes_before_expiry_and_renews_once() -> None:
    import jwt

    now = [1000.0]
    issued: list[str] = []

    def fetch(scope: str, stream: str, access: str) -> str:
        wall = time.time()
        token = jwt.encode({"sub": "u", "iat": int(wall), "exp": int(wall) + 100, "n": len(issued)}, "k" * 64,
                           algorithm="HS512")
        issued.append(token)
        return token

    cache = TokenCache(fetch, clock=lambda: now[0])
    first = cache.get("s", "t")
    assert cache.get("s", "t") == first and cache.fetches == 1
    now[0] += 79  # 80 % of the lifetime: still fresh
    assert cache.get("s", "t") == first
    now[0] += 2  # past 80 %: fetched again before it expires
    second = cache.get("s", "t")
    assert second != first and cache.fetches == 2
    # Two threads both saw `second` expire: only one fetch.
    third = cache.renew("s", "t", second)
    assert cache.renew("s", "t", second) == third and cache.fetches == 3
    # Read and write tokens are separate.
    assert cache.get("s", "t", "write") not in (first, second, third) and cache.fetches == 4
    with pytest.raises(ValueError, match="access"):
        cache.get("s", "t", "admin")
    # A token without exp (not a JWT) is kept until the server calls it expired.
    opaque = TokenCache(lambda s, t, a: "opaque-token", clock=lambda: now[0])
    opaque.get("s", "t")
    now[0] += 10**6
    opaque.get("s", "t")
    assert opaque.fetches == 1


def test_errors_never_carry_the_password() -> None:
    err = PravegaAuthenticationError("tls://h:9090", "alice", "listScopes", "authentication failed")
    assert "alice" in str(err) and "listScopes" in str(err)
    err2 = PravegaPermissionError("controller", "bob", "createTransaction", "stream a/b", "no READ_UPDATE")
    assert "bob" in str(err2) and "stream a/b" in str(err2)
    config = PravegaConnectionConfig(host="h", username="alice", password="s3cret-Pa55")
    with PravegaClient(config) as client:
        for text in (repr(client), str(client), repr(client.controller), repr(config), str(config)):
            assert "s3cret-Pa55" not in text
            assert base64.b64encode(b"alice:s3cret-Pa55").decode() not in text


def test_validate_hostname_off_drops_only_the_name_check(tmp_path: Path) -> None:
    """A certificate for another name: refused with validate_hostname on (naming the host), accepted
    with it off - the chain is still verified (an unknown CA stays refused)."""
    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess
    from airflow_provider_pravega.embedded.local_pki import make_test_pki

    pki = make_test_pki(tmp_path / "pki", hosts=("pravega.example.internal",))
    process = EmbeddedPravegaProcess(tmp_path / "data", tls_cert=pki.server_cert, tls_key=pki.server_key)
    process.start()
    try:
        port = int(process.controller_uri.rsplit(":", 1)[1])

        def config(validate: bool, ca: Path) -> PravegaConnectionConfig:
            return PravegaConnectionConfig(host="127.0.0.1", port=port, tls_enabled=True, trust_store=str(ca),
                                           validate_hostname=validate)

        with PravegaClient(config(True, pki.ca_cert)) as client:
            err = fast(lambda: client.admin.list_scopes(), PravegaTLSError)
        assert "does not name host '127.0.0.1'" in str(err) and "validate_hostname" in str(err)

        scope, stream = name("noname"), name("s")
        with PravegaClient(config(False, pki.ca_cert)) as client:
            client.admin.create_scope(scope)
            client.admin.create_stream(scope, stream, 1)
            info = client.transactions.begin(scope, stream)
            with client.transactions.writer(scope, stream, info) as writer:  # segment store over TLS too
                writer.write_event(b"x")
                writer.flush()
            assert client.transactions.commit(scope, stream, info.txn_id) == TxnStatus.COMMITTED
            segment = naming.qualified_segment_name(scope, stream, 0)
            assert client.segments.get_segment_info(segment).length == 9

        other = make_test_pki(tmp_path / "other", hosts=("pravega.example.internal",)).ca_cert
        with PravegaClient(config(False, other)) as client:
            err = fast(lambda: client.admin.list_scopes(), PravegaTLSError)
        assert "not signed by a CA in the trust store" in str(err)
    finally:
        process.stop()


def test_with_pravega_token_rules_a_reader_reads_and_admin_does_everything(
    pravega_secure_embedded_factory: Callable[..., Any],
) -> None:
    """Pravega 0.13 grants a delegation token only for what is asked (a read-only user gets READ,
    never WRITE or the UNSPECIFIED the official client asks for): this client asks READ for reads
    and WRITE for writes, so a read-only user can read and an admin can do everything there."""
    server = pravega_secure_embedded_factory(tls=True, pravega_token_rules=True)
    check_everything(exercise_everything(config_for(server, "admin")))
    scope, stream = name("rules"), name("s")
    with PravegaClient(config_for(server, "admin")) as admin:
        admin.admin.create_scope(scope)
        admin.admin.create_stream(scope, stream, 1)
        info = admin.transactions.begin(scope, stream)
        with admin.transactions.writer(scope, stream, info) as writer:
            writer.write_events([b"a", b"b", b"c"])
            writer.flush()
        admin.transactions.commit(scope, stream, info.txn_id)
    with PravegaClient(config_for(server, "reader")) as client:
        ranges = plan_segment_ranges(client, StreamCut.head(client, scope, stream), StreamCut.tail(client, scope, stream))
        assert [e.payload for e in read_segment_ranges(client, ranges)] == [b"a", b"b", b"c"]
        segment = naming.qualified_segment_name(scope, stream, 0)
        fast(lambda: client.segments.open_append_session(segment), PravegaPermissionError)


# ----------------------------------------------------- the same against real Pravega 0.13 standalone


@pytest.fixture(scope="module")
def standalone_secure(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Pravega 0.13 standalone with auth and TLS and the fixture's password file (skipped unless the
    standalone backend is selected and available)."""
    if "standalone" not in request.config._pravega_backends:  # type: ignore[attr-defined]
        pytest.skip("Pravega standalone not selected (--pravega-backend standalone/both/auto)")
    from backends.standalone import PravegaStandalone, script

    from airflow_provider_pravega.embedded import pytest_plugin
    from airflow_provider_pravega.embedded.local_pki import make_java_stores, make_test_pki

    base = tmp_path_factory.mktemp("standalone-secure")
    users = dict(pytest_plugin.SECURE_USERS)
    auth_file = base / "passwd"
    auth_file.write_text("".join(pytest_plugin.auth_file_line(u, pw, acl) + "\n" for u, (pw, acl) in users.items()))
    pki = make_test_pki(base / "pki", client_auth=True)
    key_store, trust_store, pwd_file = make_java_stores(pki, base, script.find_java(17)[0])
    admin_password = users["admin"][0]
    original = script.write_config

    def write_config(work_dir: Path, ports: Any, cache_mb: int, storage: str = "filesystem") -> Path:
        path = original(work_dir, ports, cache_mb, storage)
        text = path.read_text()
        text = text.replace("singlenode.security.auth.enable=false", "singlenode.security.auth.enable=true")
        text = text.replace("singlenode.security.tls.enable=false", "singlenode.security.tls.enable=true")
        text = text.replace("published.host.nameOrIp=127.0.0.1", "published.host.nameOrIp=localhost")
        text += ("singlenode.security.auth.credentials.username=admin\n"
                 f"singlenode.security.auth.credentials.pwd={admin_password}\n"
                 f"singlenode.security.auth.pwdAuthHandler.accountsDb.location={auth_file}\n"
                 f"singlenode.security.tls.certificate.location={pki.server_cert}\n"
                 f"singlenode.security.tls.privateKey.location={pki.server_key}\n"
                 f"singlenode.security.tls.keyStore.location={key_store}\n"
                 f"singlenode.security.tls.keyStore.pwd.location={pwd_file}\n"
                 f"singlenode.security.tls.trustStore.location={trust_store}\n")
        path.write_text(text)
        return path

    class _Server:
        tls = True
        ca_cert = pki.ca_cert
        passwords = {u: pw for u, (pw, _acl) in users.items()}
        controller_uri = ""

    def ready_probe(port: int, timeout: float = 5.0) -> list[str]:  # readiness, through our own client
        config = PravegaConnectionConfig(host="localhost", port=port, username="admin", password=admin_password,
                                         tls_enabled=True, trust_store=str(pki.ca_cert))
        with PravegaClient(config, timeout_s=timeout) as client:
            return client.admin.list_scopes()

    def tls_hello(port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> tuple[int, int]:
        from airflow_provider_pravega.client.connection import SegmentStoreConnection
        from airflow_provider_pravega.client.controller_types import Endpoint
        from airflow_provider_pravega.client.security import client_ssl_context

        config = PravegaConnectionConfig(host="localhost", tls_enabled=True, trust_store=str(pki.ca_cert))
        conn = SegmentStoreConnection(Endpoint("localhost", port), connect_timeout_s=timeout,
                                      tls=(config, client_ssl_context(config)))
        conn.close()
        return 15, 5

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(script, "write_config", write_config)
        patch.setattr(script, "controller_list_scopes", ready_probe)
        patch.setattr(script, "segment_store_hello", tls_hello)
        real = PravegaStandalone(work_dir=base / "standalone")
        uri = real.start()
    try:
        _Server.controller_uri = uri.replace("tcp://127.0.0.1", "tls://localhost")
        yield _Server()
    finally:
        real.stop()


def test_on_pravega_standalone_with_auth_and_tls(standalone_secure: Any) -> None:
    """Real Pravega 0.13 (auth + TLS, the same password file): our client does everything as admin;
    a read-only user reads segment data with a READ token and is refused writes; a wrong password is
    refused fast."""
    server = standalone_secure
    check_everything(exercise_everything(config_for(server, "admin")))
    scope, stream = name("real"), name("s")
    with PravegaClient(config_for(server, "admin")) as admin:
        admin.admin.create_scope(scope)
        admin.admin.create_stream(scope, stream, 1)
        info = admin.transactions.begin(scope, stream)
        with admin.transactions.writer(scope, stream, info) as writer:
            writer.write_events([b"a", b"b"])
            writer.flush()
        admin.transactions.commit(scope, stream, info.txn_id)
    with PravegaClient(config_for(server, "reader")) as client:
        # Pravega 0.13 asks READ_UPDATE for getSegments/getCurrentSegments (they hand out tokens), so
        # a read-only user cannot even find a stream's head there; refused clearly, not retried.
        err = fast(lambda: StreamCut.head(client, scope, stream), PravegaPermissionError)
        assert "getSegments" in str(err) and "'reader'" in str(err)
        # What READ does allow: a READ token, and reading with it.
        segment = naming.qualified_segment_name(scope, stream, 0)
        assert client.segments.get_segment_info(segment).length == 2 * 9
        fast(lambda: client.transactions.begin(scope, stream), PravegaPermissionError)
        fast(lambda: client.segments.open_append_session(segment), PravegaPermissionError)
    with PravegaClient(config_for(server, "admin", "wrong-Pa55word")) as client:
        fast(lambda: client.admin.list_scopes(), PravegaAuthenticationError)
    with PravegaClient(config_for(server, "admin")) as admin:
        assert tail_bytes(admin, scope, stream) == 2 * 9
