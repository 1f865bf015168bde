"""The provider's own plain event writer (what at_least_once ingest writes through): routing by key
as the official client does, a bounded window, and scaling (split, merge) and sealing under it."""

from __future__ import annotations

from collections import defaultdict

import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.errors import StreamSealedError
from airflow_provider_pravega.protocol import routing

from client.readback import read_segments_direct

KEYS = [f"sensor-{i}" for i in range(24)]


def _stream(client: PravegaClient, unique_name, segments: int) -> tuple[str, str]:
    scope = unique_name("ew")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "st", segments)
    return scope, "st"


def _write(writer, first: int, last: int) -> None:
    for i in range(first, last):
        for key in KEYS:
            writer.write_event(f"{key}:{i}".encode(), key)


def _per_key_chains(client: PravegaClient, scope: str, stream: str) -> dict[str, list[int]]:
    """Each key's sequence numbers as a reader sees them: a segment before its successors."""
    segments = read_segments_direct(client, scope, stream)
    by_key: dict[str, list[int]] = defaultdict(list)
    for segment_id in sorted(segments):  # successors have higher ids (later epochs)
        for payload in segments[segment_id]:
            key, _, seq = payload.decode().rpartition(":")
            by_key[key].append(int(seq))
    return by_key


def test_keys_land_in_their_segment_in_order_with_a_bounded_window(pravega_controller_uri, unique_name):
    with PravegaClient(pravega_controller_uri) as client:
        scope, stream = _stream(client, unique_name, 3)
        with client.event_writer(scope, stream, max_inflight_events=40) as writer:
            _write(writer, 0, 50)
            sessions = [s for s in writer._sessions if s is not None]
            assert sessions and all(s.window_events == 40 and s.block_events == 10 for s in sessions)
        ranges = {s.segment_id: s for s in client.controller.get_current_segments(scope, stream)}
        segments = read_segments_direct(client, scope, stream)
        for segment_id, events in segments.items():
            for payload in events:
                point = routing.hash_routing_key(payload.decode().rpartition(":")[0])
                assert ranges[segment_id].min_key <= point < ranges[segment_id].max_key
        assert _per_key_chains(client, scope, stream) == {k: list(range(50)) for k in KEYS}
        assert writer.events_written == 50 * len(KEYS)


@pytest.mark.parametrize("how", ["split", "merge"])
def test_scaling_under_the_writer_moves_unacknowledged_events_to_the_successors(
    pravega_controller_uri, unique_name, how
):
    with PravegaClient(pravega_controller_uri) as client:
        scope, stream = _stream(client, unique_name, 1 if how == "split" else 2)
        if how == "merge":  # three segments, two of which are merged below (the policy keeps >= 2)
            first = client.controller.get_current_segments(scope, stream)[0]
            middle = (first.min_key + first.max_key) / 2
            client.controller.scale(scope, stream, [first.segment_id],
                                    [(first.min_key, middle), (middle, first.max_key)])
        writer = client.event_writer(scope, stream)
        _write(writer, 0, 10)
        writer.flush()
        _write(writer, 10, 20)  # buffered, not yet sent: the segment is sealed under them
        current = client.controller.get_current_segments(scope, stream)
        if how == "split":
            client.controller.scale(scope, stream, [current[0].segment_id], [(0.0, 0.5), (0.5, 1.0)])
        else:
            client.controller.scale(scope, stream, [s.segment_id for s in current[:2]],
                                    [(current[0].min_key, current[1].max_key)])
        _write(writer, 20, 30)
        writer.flush()
        writer.close()
        assert writer.segments_replaced >= 1
        after = {s.segment_id for s in client.controller.get_current_segments(scope, stream)}
        assert {s.segment_id for s in writer.segments} == after
        assert _per_key_chains(client, scope, stream) == {k: list(range(30)) for k in KEYS}
        assert writer.events_written == 30 * len(KEYS)


def test_a_sealed_stream_is_a_clear_error(pravega_controller_uri, unique_name):
    with PravegaClient(pravega_controller_uri) as client:
        scope, stream = _stream(client, unique_name, 2)
        writer = client.event_writer(scope, stream)
        _write(writer, 0, 2)
        writer.flush()
        client.admin.seal_stream(scope, stream)
        _write(writer, 2, 3)
        with pytest.raises(StreamSealedError, match=f"{scope}/{stream} is sealed"):
            writer.flush()
        writer.close()
        with pytest.raises(StreamSealedError, match=f"{scope}/{stream} is sealed"):
            client.event_writer(scope, stream)
