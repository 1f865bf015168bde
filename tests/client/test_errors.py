"""Every user-facing error of the client core: its type, its message, and how fast it comes."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from hang_guard import HANG_GUARD_S

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.controller import ControllerClient
from airflow_provider_pravega.client.controller_types import TxnStatus
from airflow_provider_pravega.client.errors import (
    ControllerUnreachableError,
    InvalidNameError,
    NoSuchSegmentError,
    PravegaError,
    ScopeExistsError,
    ScopeNotFoundError,
    StreamExistsError,
    StreamNotFoundError,
    StreamNotSealedError,
    TransactionNotFoundError,
)
from airflow_provider_pravega.client.transactions import TransactionalWriter
from pravega_testing.net import free_port



@pytest.fixture
def client(pravega_controller_uri):
    with PravegaClient(pravega_controller_uri) as c:
        yield c


def test_unreachable_controller_closed_port_fails_fast_naming_the_uri():
    uri = f"tcp://127.0.0.1:{free_port()}"
    client = PravegaClient(uri)
    started = time.monotonic()
    with pytest.raises(ControllerUnreachableError) as info:
        client.admin.create_scope("anything")
    elapsed = time.monotonic() - started
    assert elapsed < HANG_GUARD_S, elapsed
    assert uri in str(info.value)
    assert info.value.uri == uri
    assert "Check that the controller is running" in str(info.value)
    # Every entry point behaves the same, and the error is also a ConnectionError.
    for call in (
        lambda: client.transactions.status("s", "st", 1),
        lambda: client.admin.list_scopes(),
        lambda: client.controller.get_current_segments("s", "st"),
    ):
        started = time.monotonic()
        with pytest.raises(ConnectionError):
            call()
        assert time.monotonic() - started < HANG_GUARD_S


def test_unreachable_controller_from_a_config_names_its_uri():
    port = free_port()
    config = PravegaConnectionConfig(host="127.0.0.1", port=port)
    with pytest.raises(ControllerUnreachableError, match=f"tcp://127.0.0.1:{port}"):
        PravegaClient(config).admin.list_scopes()


def test_controller_that_accepts_but_never_answers_hits_the_deadline():
    """A hung controller (TCP accepted, no HTTP/2 answer) must not hang the caller."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                accepted.append(conn)  # keep it open, never answer
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    uri = f"tcp://127.0.0.1:{server.getsockname()[1]}"
    try:
        controller = ControllerClient(uri, timeout_s=2.0)
        controller.recovery_wait_s = 3.0  # a read is asked again while a controller recovers; bounded
        started = time.monotonic()
        with pytest.raises(ControllerUnreachableError) as info:
            controller.list_scopes()
        assert time.monotonic() - started < HANG_GUARD_S
        assert uri in str(info.value)
        # A change (not asked again) fails with the same public error, not an internal one.
        with pytest.raises(ControllerUnreachableError, match="no answer to createScope"):
            controller.create_scope("hung")
        controller.close()
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        server.close()


def test_missing_scope_and_stream(client, unique_name):
    scope = unique_name("err")
    started = time.monotonic()
    with pytest.raises(ScopeNotFoundError) as info:
        client.admin.create_stream(scope, "st", 1)
    assert (
        info.value.scope == scope
        and "does not exist" in str(info.value)
        and "create_scope" in str(info.value)
    )
    with pytest.raises(ScopeNotFoundError):
        client.controller.get_current_segments(scope, "st")
    with pytest.raises(ScopeNotFoundError):
        client.admin.list_streams(scope)
    client.admin.create_scope(scope)
    with pytest.raises(StreamNotFoundError) as info:
        client.admin.stream_info(scope, "nope")
    assert (info.value.scope, info.value.stream) == (scope, "nope")
    assert f"{scope}/nope does not exist" in str(info.value)
    with pytest.raises(StreamNotFoundError):
        client.transactions.begin(scope, "nope")
    with pytest.raises(StreamNotFoundError):
        client.admin.seal_stream(scope, "nope")
    with pytest.raises(StreamNotFoundError):
        client.admin.truncate_stream(scope, "nope", {0: 0})
    assert client.admin.delete_stream(scope, "nope") is False
    assert time.monotonic() - started < HANG_GUARD_S  # no minute-long retry loops anywhere


def test_exists_and_invalid_names(client, unique_name):
    scope = unique_name("err")
    assert client.admin.create_scope(scope) is True
    with pytest.raises(ScopeExistsError, match="fail_if_exists=False"):
        client.admin.create_scope(scope, fail_if_exists=True)
    assert client.admin.create_stream(scope, "st", 1) is True
    with pytest.raises(StreamExistsError):
        client.admin.create_stream(scope, "st", 1, fail_if_exists=True)
    with pytest.raises(InvalidNameError):
        client.admin.create_stream(scope, "bad/name", 1)
    with pytest.raises(InvalidNameError):
        client.admin.create_scope("white space")
    with pytest.raises(StreamNotSealedError, match="seal"):
        client.admin.delete_stream(scope, "st")


def test_unknown_transaction_id(client, unique_name):
    scope = unique_name("err")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "st", 2)
    real = client.transactions.begin(scope, "st")
    bogus = real.txn_id + 12345  # same epoch, never issued
    started = time.monotonic()
    assert client.transactions.status(scope, "st", bogus) == TxnStatus.UNKNOWN
    for call in (
        lambda: client.transactions.commit(scope, "st", bogus),
        lambda: client.transactions.abort(scope, "st", bogus),
        lambda: client.transactions.ping(scope, "st", bogus),
        lambda: TransactionalWriter(client.transactions, scope, "st", bogus),
    ):
        with pytest.raises(TransactionNotFoundError) as info:
            call()
        assert info.value.txn_id == bogus
        assert f"{bogus:032x}" in str(info.value) and "unknown" in str(info.value)
    assert time.monotonic() - started < HANG_GUARD_S
    client.transactions.abort(scope, "st", real.txn_id)


def test_segment_store_errors_name_the_segment(client, unique_name):
    scope = unique_name("err")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "st", 1)
    name = f"{scope}/st/7.#epoch.0"
    with pytest.raises(NoSuchSegmentError) as info:
        client.segments.get_segment_info(name)
    assert info.value.segment == name and name in str(info.value)


def test_every_error_is_a_pravega_error():
    from airflow_provider_pravega.client import errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, PravegaError), name
