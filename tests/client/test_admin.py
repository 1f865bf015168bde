"""StreamAdmin against the embedded server, cross-checked with the official client where it can see."""

from __future__ import annotations

import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.controller_types import RetentionPolicy, ScalingPolicy
from airflow_provider_pravega.client.streamcut import StreamCut
from airflow_provider_pravega.client.errors import (
    InvalidStreamCutError,
    ScaleError,
    SegmentSealedError,
    TruncatedStreamCutError,
)
from airflow_provider_pravega.protocol import naming, routing

from .test_transactions import official_manager, read_all_official, read_segments_direct


@pytest.fixture
def client(pravega_controller_uri):
    with PravegaClient(pravega_controller_uri) as c:
        yield c


@pytest.fixture
def scope(client, unique_name):
    name = unique_name("adm")
    assert client.admin.create_scope(name) is True
    return name


def test_idempotent_create_list_and_delete(client, scope, pravega_controller_uri):
    assert client.admin.create_scope(scope) is False  # exists: success, not created
    assert scope in client.admin.list_scopes()
    assert client.admin.create_stream(scope, "a", 3) is True
    assert client.admin.create_stream(scope, "a", 3) is False
    assert (
        client.admin.create_stream(
            scope, "b", scaling=ScalingPolicy.by_event_rate(100, 2, 2)
        )
        is True
    )
    assert sorted(client.admin.list_streams(scope)) == ["a", "b"]
    # The official client sees the same.
    manager = official_manager(pravega_controller_uri)
    assert sorted(manager.list_stream(scope)) == ["_MARKa", "_MARKb", "a", "b"]  # with Pravega's watermark streams
    assert client.admin.stream_exists(scope, "a") and not client.admin.stream_exists(
        scope, "zz"
    )
    config = client.admin.get_stream_config(scope, "b")
    assert config.scaling == ScalingPolicy.by_event_rate(100, 2, 2)
    assert client.admin.delete_stream(scope, "a", seal=True) is True
    assert client.admin.delete_stream(scope, "a", seal=True) is False
    assert client.admin.list_streams(scope) == ["b"]
    client.admin.delete_stream(scope, "b", seal=True)
    assert client.admin.delete_scope(scope) is True
    assert client.admin.delete_scope(scope) is False
    assert not client.admin.scope_exists(scope)


def test_policies_and_tags(client, scope, pravega_controller_uri):
    client.admin.create_stream(
        scope, "st", 2, retention=RetentionPolicy.by_time(3_600_000), tags=["raw", "eu"]
    )
    config = client.admin.get_stream_config(scope, "st")
    assert config.scaling == ScalingPolicy.fixed(2)
    assert config.retention == RetentionPolicy.by_time(3_600_000)
    # Tags are a set in Pravega (its controller answers them in its own order): compare as sets,
    # with no duplicates.
    assert sorted(config.tags) == ["eu", "raw"]
    manager = official_manager(pravega_controller_uri)
    assert sorted(manager.get_stream_tags(scope, "st")) == ["eu", "raw"]

    updated = client.admin.update_stream(
        scope, "st", retention=RetentionPolicy.by_size(10 * 2**20)
    )
    assert updated.retention == RetentionPolicy.by_size(10 * 2**20) and sorted(updated.tags) == ["eu", "raw"]
    assert sorted(client.admin.add_tags(scope, "st", "gold", "raw")) == ["eu", "gold", "raw"]
    assert sorted(client.admin.remove_tags(scope, "st", "eu")) == ["gold", "raw"]
    updated = client.admin.update_stream(scope, "st", retention=None, tags=None)
    assert updated.retention is None and not updated.tags


def _write(uri: str, scope: str, stream: str, events: list[tuple[str, bytes]]) -> None:
    writer = official_manager(uri).create_writer(
        scope, stream, max_inflight_events=1000
    )
    for key, payload in events:
        writer.write_event_bytes(payload, key)
    writer.flush()


def test_scale_split_and_merge(client, scope, pravega_controller_uri):
    uri = pravega_controller_uri
    client.admin.create_stream(scope, "st", 2)
    keys = [f"k{i}" for i in range(20)]
    _write(uri, scope, "st", [(k, f"{k}:0".encode()) for k in keys])

    # Split segment 1 ([0.5, 1)) into two.
    new = client.admin.split_segment(scope, "st", 1)
    assert [(s.min_key, s.max_key) for s in new] == [(0.5, 0.75), (0.75, 1.0)]
    assert [s.epoch for s in new] == [1, 1] and [s.number for s in new] == [2, 3]
    info = client.admin.stream_info(scope, "st")
    assert info.segment_count == 3 and not info.sealed
    assert [s.segment_id for s in info.active_segments] == [
        0,
        naming.segment_id(1, 2),
        naming.segment_id(1, 3),
    ]
    succ = client.controller.get_successors(scope, "st", 1)
    assert [s.segment.segment_id for s in succ] == [
        naming.segment_id(1, 2),
        naming.segment_id(1, 3),
    ]
    assert all(s.predecessors == (1,) for s in succ)
    assert client.admin.stream_info(scope, "st").head == {0: 0, 1: 0}

    # Merge the two new ones back into one.
    merged = client.admin.merge_segments(
        scope, "st", [naming.segment_id(1, 2), naming.segment_id(1, 3)]
    )
    assert (merged.min_key, merged.max_key, merged.epoch, merged.number) == (
        0.5,
        1.0,
        2,
        4,
    )
    assert client.admin.stream_info(scope, "st").segment_count == 2

    # The official client writes into the new layout; every event is readable, keys stay in order.
    _write(uri, scope, "st", [(k, f"{k}:1".encode()) for k in keys])
    events = read_all_official(uri, scope, "st", f"rg-{scope}", 40)
    assert sorted(events) == sorted([f"{k}:{i}".encode() for k in keys for i in (0, 1)])
    # Each event sits in a segment whose key range holds its key's hash, in every epoch.
    ranges = {
        s.segment_id: s
        for e in range(3)
        for s in client.controller.get_epoch_segments(scope, "st", e)
    }
    by_segment = read_segments_direct(client, scope, "st")
    assert sorted(by_segment) == [
        0,
        1,
        naming.segment_id(1, 2),
        naming.segment_id(1, 3),
        naming.segment_id(2, 4),
    ]
    assert sum(map(len, by_segment.values())) == 40
    for segment_id, payloads in by_segment.items():
        for payload in payloads:
            k = routing.hash_routing_key(payload.decode().split(":")[0])
            assert ranges[segment_id].min_key <= k < ranges[segment_id].max_key
    assert (
        by_segment[naming.segment_id(1, 2)] == by_segment[naming.segment_id(1, 3)] == []
    )  # no writes in epoch 1

    with pytest.raises(ScaleError, match="not adjacent|not active"):
        client.admin.merge_segments(scope, "st", [0, 1])
    with pytest.raises(ScaleError, match=r"new key ranges \[\(0\.0, 0\.4\)\] must exactly cover"):
        client.admin.scale(scope, "st", [0], [(0.0, 0.4)])  # does not cover [0, 0.5)


def test_truncate_and_stream_info(client, scope, pravega_controller_uri):
    uri = pravega_controller_uri
    client.admin.create_stream(scope, "st", 1)
    _write(uri, scope, "st", [("k", f"e{i}".encode()) for i in range(10)])
    info = client.admin.stream_info(scope, "st")
    assert info.head == {0: 0}
    assert info.tail == {0: 10 * (8 + 2)}  # 10 framed events of 2 bytes
    cut = {0: 5 * 10}
    client.admin.truncate_stream(scope, "st", cut)
    info = client.admin.stream_info(scope, "st")
    assert info.head == cut and info.tail == {0: 100}
    assert read_all_official(uri, scope, "st", f"rg-{scope}", 5) == [
        f"e{i}".encode() for i in range(5, 10)
    ]
    assert read_segments_direct(client, scope, "st") == {
        0: [f"e{i}".encode() for i in range(5, 10)]
    }
    with pytest.raises(TruncatedStreamCutError, match="already truncated"):
        client.admin.truncate_stream(scope, "st", {0: 10})
    with pytest.raises(InvalidStreamCutError):
        client.admin.truncate_stream(scope, "st", {})
    with pytest.raises(InvalidStreamCutError):
        client.admin.truncate_stream(
            scope, "st", {0: 10_000}
        )  # beyond the end of the data


def test_seal(client, scope, pravega_controller_uri):
    client.admin.create_stream(scope, "st", 2)
    _write(pravega_controller_uri, scope, "st", [("k", b"x")])
    client.admin.seal_stream(scope, "st")
    client.admin.seal_stream(scope, "st")  # idempotent
    info = client.admin.stream_info(scope, "st")
    assert info.sealed
    # Pravega reports no current segments for a sealed stream: the tail is its last epoch's
    # segments at their final lengths.
    assert set(info.tail) == {0, 1} and sum(info.tail.values()) == 9
    assert client.admin.tail(scope, "st") == info.tail
    assert StreamCut.tail(client, scope, "st").positions == info.tail
    # Appends to a sealed segment are refused, naming the segment.
    name = naming.qualified_segment_name(scope, "st", 0)
    with pytest.raises(SegmentSealedError) as err:
        session = client.segments.open_append_session(name)
        try:
            session.write_event(b"late")
            session.flush()
        finally:
            session.close()
    assert err.value.segment == name and name in str(err.value)
