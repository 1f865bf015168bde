"""Reading a stream back straight from the segment store, for tests of the writers (no official
client needed)."""

from __future__ import annotations

from collections import defaultdict

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.protocol import naming, wire


def read_segments_direct(
    client: PravegaClient, scope: str, stream: str
) -> dict[int, list[bytes]]:
    """Every event of every segment from the head, straight from the segment store."""
    out: dict[int, list[bytes]] = {}
    todo = list(client.controller.get_segments_at_head(scope, stream).items())
    seen: set[int] = set()
    while todo:
        segment_id, offset = todo.pop()
        if segment_id in seen:
            continue
        seen.add(segment_id)
        name = naming.qualified_segment_name(scope, stream, segment_id)
        info = client.segments.get_segment_info(name)
        data = bytearray()
        while offset + len(data) < info.length:
            reply = client.segments.read_segment(
                name, offset + len(data), min(1 << 20, info.length - offset - len(data))
            )
            data += reply.data
        events, end = wire.split_events(bytes(data), offset)
        assert end == info.length, f"{name} ends inside an event"
        out[segment_id] = [e.payload for e in events]
        if info.sealed:
            todo.extend(
                (s.segment.segment_id, 0)
                for s in client.controller.get_successors(scope, stream, segment_id)
            )
    return out


def assert_per_key_order(events: list[bytes], keys: list[str], per_key: int) -> None:
    by_key: dict[str, list[int]] = defaultdict(list)
    for payload in events:
        key, _, seq = payload.decode().rpartition(":")
        by_key[key].append(int(seq))
    assert sorted(by_key) == sorted(keys)
    for key in keys:
        assert by_key[key] == list(range(per_key)), f"key {key}: {by_key[key][:20]}..."
