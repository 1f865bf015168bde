"""The embedded server as a small cluster (``--segment-stores N``): containers over the stores,
WrongHost from a store that does not own a segment, getURI naming the owner, and the test controls."""

from __future__ import annotations

import socket

import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.embedded.containers import ContainerMap, primary_segment_name
from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess
from airflow_provider_pravega.embedded.server import EmbeddedServerError
from airflow_provider_pravega.protocol import naming, wire
from pravega_testing.wire_peer import WirePeer


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def test_container_map_keeps_transaction_segments_with_their_parent():
    cmap = ContainerMap(8, 3)
    assert cmap.assignment() == {c: c % 3 for c in range(8)}
    parent = "sc/st/3.#epoch.1"
    txn = naming.transaction_segment_name(parent, 0x1234)
    assert primary_segment_name(txn) == parent
    assert cmap.container_of(txn) == cmap.container_of(parent)
    assert cmap.container_of("sc/st/0") == cmap.container_of("sc/st/0.#epoch.0")  # canonical form
    assert cmap.move(cmap.container_of(parent), 2) == cmap.container_of(parent) % 3
    assert cmap.owner(txn) == 2
    with pytest.raises(ValueError):
        cmap.move(8, 0)


def test_non_owner_answers_wrong_host_and_get_uri_names_the_owner(pravega_cluster_factory):
    cluster = pravega_cluster_factory(segment_stores=3, containers=8)
    with PravegaClient(cluster.controller_uri) as client:
        client.admin.create_scope("sc")
        client.admin.create_stream("sc", "st", 1)
        segment = naming.qualified_segment_name("sc", "st", 0)
        owner = cluster.store_of(segment)
        assert str(client.controller.get_uri("sc", "st", 0)) == cluster.segment_store_endpoints[owner]
        other = (owner + 1) % 3
        peer = WirePeer("127.0.0.1", _port(cluster.segment_store_endpoints[other]))
        try:
            for request in (wire.SetupAppend(1, 7, segment, ""), wire.ReadSegment(segment, 0, 10, "", 2),
                            wire.GetStreamSegmentInfo(3, segment, ""), wire.SealSegment(4, segment, "")):
                peer.send(request)
                reply = peer.recv()
                assert reply == wire.WrongHost(wire.request_id_of(request), segment, "", "")
            cluster.move_segment(segment, other)  # now the same connection is served
            peer.send(wire.GetStreamSegmentInfo(5, segment, ""))
            assert isinstance(peer.recv(), wire.StreamSegmentInfo)
        finally:
            peer.close()
        client.controller.invalidate_uri("sc", "st", 0)
        assert str(client.controller.get_uri("sc", "st", 0)) == cluster.segment_store_endpoints[other]


def test_stop_and_restart_a_store(pravega_cluster_factory):
    cluster = pravega_cluster_factory(segment_stores=2, containers=4)
    port = _port(cluster.segment_store_endpoints[1])
    assert cluster.stop_store(1, failover=True) == [1, 3]
    assert cluster.containers.containers_of(0) == [0, 1, 2, 3]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with pytest.raises(EmbeddedServerError):
        cluster.stop_store(0, failover=True)  # no store left to take the containers
    cluster.restart_store(1)
    assert cluster.store_running(1) and _port(cluster.segment_store_endpoints[1]) == port
    socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_cli_segment_stores(tmp_path):
    with EmbeddedPravegaProcess(tmp_path / "d", extra_args=["--segment-stores", "3", "--containers", "6",
                                                            "--no-fsync"]) as server:
        assert len(server.segment_store_endpoints) == 3
        assert server.segment_store_endpoint == server.segment_store_endpoints[0]
        with PravegaClient(server.controller_uri) as client:
            client.admin.create_scope("sc")
            client.admin.create_stream("sc", "st", 6)
            owners = {str(client.controller.get_uri("sc", "st", n)) for n in range(6)}
        assert owners <= set(server.segment_store_endpoints)
