"""A list of controllers (``tcp://c1:9090,c2:9090``): the client and the hook fail over to the next
controller when the one in front cannot be reached, as the official clients do (issue 32).

Both backends have one controller, so the other entries of the list are a closed port (a
controller that is down) and a forwarder in front of the real controller that the test stops (a
controller that dies while in use).
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator

import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.config import PravegaConfigError, PravegaConnectionConfig
from airflow_provider_pravega.client.controller_types import Endpoint, parse_controller_uris
from airflow_provider_pravega.client.errors import ControllerUnreachableError
from airflow_provider_pravega.hooks.pravega import PravegaHook
from pravega_testing.net import first_controller

from client.readback import read_segments_direct

# ------------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("host", "port", "uri", "controllers"),
    [
        ("tcp://c1:9090,c2:9091", None, "tcp://c1:9090,c2:9091", (("c1", 9090), ("c2", 9091))),
        ("c1,c2:9093", 9092, "tcp://c1:9092,c2:9093", (("c1", 9092), ("c2", 9093))),
        ("c1, c2", None, "tcp://c1:9090,c2:9090", (("c1", 9090), ("c2", 9090))),
        ("tls://c1:9443,[::1]:9443", None, "tls://c1:9443,[::1]:9443", (("c1", 9443), ("::1", 9443))),
        ("c1:9090,tls://c2:9090", None, "tls://c1:9090,c2:9090", (("c1", 9090), ("c2", 9090))),
        ("c1:9090", None, "tcp://c1:9090", (("c1", 9090),)),
    ],
)
def test_the_host_field_lists_the_controllers_of_one_cluster(host, port, uri, controllers) -> None:
    config = PravegaConnectionConfig.from_connection_fields(host=host, port=port)
    assert config.controller_uri == uri
    assert config.controllers == controllers
    assert (config.host, config.port) == controllers[0]
    # The URI is what Spark tasks and the official client get; it reads back to the same config.
    assert PravegaConnectionConfig.from_connection_fields(host=config.controller_uri) == config
    endpoints, tls = parse_controller_uris(uri)
    assert endpoints == tuple(Endpoint(h, p) for h, p in controllers) and tls == config.tls_enabled


@pytest.mark.parametrize(
    ("host", "fragment"),
    [
        ("c1:9090,,c2:9090", "an empty entry"),
        ("c1:9090,", "an empty entry"),
        ("tcp://c1:9090,tls://c2:9090", "share one scheme"),
        ("c1:9090,c2:99999", "1-65535"),
        ("c1:9090,bad host", "neither a host name"),
    ],
)
def test_a_bad_controller_list_is_refused_naming_the_host_field(host: str, fragment: str) -> None:
    with pytest.raises(PravegaConfigError) as info:
        PravegaConnectionConfig.from_connection_fields(host=host)
    assert info.value.field == "host" and fragment in str(info.value)


@pytest.mark.parametrize("uri", ["tcp://c1:9090,", "tcp://c1:9090,c2", "tcp://c1:9090;c2:9090"])
def test_a_bad_controller_uri_is_refused(uri: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        PravegaClient(uri)


# ------------------------------------------------------------------------------- real server


@pytest.fixture
def closed_port() -> int:
    """A local port nothing listens on: a controller that is down."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Forwarder:
    """A TCP forwarder to the real controller; ``stop()`` closes it and every connection through
    it, as a controller host that dies would."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.connections: list[socket.socket] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                if self.stopped.is_set():
                    client.close()
                    upstream.close()
                    return
                self.accepted += 1
                self.connections += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        self.stopped.set()
        self.server.close()
        with self.lock:
            for sock in self.connections:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()


@pytest.fixture
def forwarder(pravega_controller_uri: str) -> Iterator[Forwarder]:
    endpoint = parse_controller_uris(pravega_controller_uri)[0][0]  # the backend's (first) controller
    proxy = Forwarder((endpoint.host, endpoint.port))
    yield proxy
    proxy.stop()


def _address(uri: str) -> str:
    return first_controller(uri)  # the backend's (first) controller: the live one of each list here


def test_with_the_first_controller_down_admin_and_transactions_go_through_the_second(
    pravega_controller_uri: str, closed_port: int
) -> None:
    live = _address(pravega_controller_uri)
    scope, stream = f"list-{uuid.uuid4().hex[:8]}", "events"
    with PravegaClient(f"tcp://127.0.0.1:{closed_port},{live}") as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, stream, 2)
        assert str(client.controller.current_controller) == live
        txn = client.transactions.begin(scope, stream)
        with client.transactions.writer(scope, stream, txn) as writer:
            writer.write_events([b"one", b"two", b"three"], routing_key="k")
            writer.flush()
        client.transactions.commit(scope, stream, txn.txn_id)
        events = [e for segment in read_segments_direct(client, scope, stream).values() for e in segment]
        assert sorted(events) == [b"one", b"three", b"two"]


def test_a_controller_that_dies_in_use_is_replaced_by_the_next_of_the_list(
    pravega_controller_uri: str, forwarder: Forwarder
) -> None:
    live = _address(pravega_controller_uri)
    scope = f"list-{uuid.uuid4().hex[:8]}"
    with PravegaClient(f"tcp://127.0.0.1:{forwarder.port},{live}") as client:
        client.admin.create_scope(scope)
        assert client.controller.current_controller == Endpoint("127.0.0.1", forwarder.port)
        assert forwarder.accepted >= 1
        forwarder.stop()  # the controller in use goes away between two calls
        client.admin.create_stream(scope, "after", 1)
        assert str(client.controller.current_controller) == live
        assert "after" in client.admin.list_streams(scope)
        txn = client.transactions.begin(scope, "after")
        client.transactions.commit(scope, "after", txn.txn_id)


def test_when_no_controller_of_the_list_answers_the_error_names_each(closed_port: int) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        other = sock.getsockname()[1]
    with PravegaClient(f"tcp://127.0.0.1:{closed_port},127.0.0.1:{other}") as client:
        with pytest.raises(ControllerUnreachableError) as info:
            client.admin.list_scopes()
    message = str(info.value)
    assert f"127.0.0.1:{closed_port}" in message and f"127.0.0.1:{other}" in message
    assert "refused" in message.lower()


def _set_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: object) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "pravega", **fields}))


def test_the_hooks_test_connection_succeeds_through_the_second_controller(
    monkeypatch: pytest.MonkeyPatch, pravega_controller_uri: str, closed_port: int
) -> None:
    live = _address(pravega_controller_uri)
    _set_connection(monkeypatch, "pravega_list", host=f"127.0.0.1:{closed_port},{live}")
    ok, message = PravegaHook(pravega_conn_id="pravega_list").test_connection()
    assert ok is True, message
    assert f"Connected to Pravega controller at tcp://{live}" in message
    assert f"127.0.0.1:{closed_port} failed" in message  # the dead one is reported, not hidden
    with PravegaHook(pravega_conn_id="pravega_list").get_client() as client:
        scope = f"list-{uuid.uuid4().hex[:8]}"
        assert client.admin.create_scope(scope)
        assert scope in client.admin.list_scopes()


def test_the_hooks_test_connection_fails_naming_every_controller(
    monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    _set_connection(monkeypatch, "pravega_dead", host=f"127.0.0.1:{closed_port},127.0.0.1:{closed_port}")
    ok, message = PravegaHook(pravega_conn_id="pravega_dead").test_connection()
    assert ok is False
    assert message.count(f"TCP connect to 127.0.0.1:{closed_port} failed") == 2
