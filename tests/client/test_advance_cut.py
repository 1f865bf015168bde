"""advance_cut: the bounded steps a streaming reader takes. Walking from the head to the tail in
steps of at most N events (or B bytes) visits every event exactly once, keeps each routing key's
order across a split, a merge and a scale that does both, and never hands out more than the budget
(except one oversized event, which is taken alone so a reader cannot stall)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.batch import advance_cut, plan_segment_ranges, read_segment_ranges
from airflow_provider_pravega.client.streamcut import StreamCut


def _write(client: PravegaClient, scope: str, stream: str, label: str, count: int, size: int = 0) -> None:
    with client.event_writer(scope, stream) as writer:
        for i in range(count):
            writer.write_event(f"{label}|k{i % 7}|{i:05d}|".encode() + b"x" * size, routing_key=f"k{i % 7}")
        writer.flush()


def _walk(client: PravegaClient, scope: str, stream: str, **limits: int) -> list[list[bytes]]:
    """Steps from the head to the tail; each step's events in plan order."""
    cut, end = StreamCut.head(client, scope, stream), StreamCut.tail(client, scope, stream)
    steps = []
    for _ in range(10_000):
        nxt = advance_cut(client, cut, end, **limits)
        ranges = plan_segment_ranges(client, cut, nxt)
        events = [e.payload for e in read_segment_ranges(client, ranges)]
        if not events:
            assert nxt == end or not plan_segment_ranges(client, nxt, end)
            return steps
        steps.append(events)
        cut = nxt
    raise AssertionError("advance_cut did not reach the tail")


def _check_exactly_once_in_key_order(steps: list[list[bytes]], expected: int) -> None:
    events = [e for step in steps for e in step]
    assert len(events) == len(set(events)) == expected
    per_key: dict[tuple[str, str], list[int]] = defaultdict(list)
    for e in events:
        label, key, seq, _ = e.decode().split("|")
        per_key[(label, key)].append(int(seq))
    assert all(seqs == sorted(seqs) for seqs in per_key.values())


def test_steps_of_n_events_across_split_merge_and_rescale(client: PravegaClient, unique_name) -> None:
    scope, stream = unique_name("adv"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 2)
    _write(client, scope, stream, "a", 300)
    first = sorted(client.admin.tail(scope, stream))
    client.admin.split_segment(scope, stream, first[0])
    _write(client, scope, stream, "b", 300)
    active = sorted(client.admin.tail(scope, stream))
    left = [s for s in active if s != first[1]]
    client.admin.merge_segments(scope, stream, left)
    _write(client, scope, stream, "c", 300)
    # a scale whose new segments straddle the old boundary: [0, .3) and [.3, 1) from [0, .5) + [.5, 1)
    client.admin.scale(scope, stream, sorted(client.admin.tail(scope, stream)), [(0.0, 0.3), (0.3, 1.0)])
    _write(client, scope, stream, "d", 300)

    steps = _walk(client, scope, stream, max_events=97)
    _check_exactly_once_in_key_order(steps, 1200)
    assert all(1 <= len(step) <= 97 for step in steps)
    assert len(steps) >= 1200 // 97


def test_steps_of_b_bytes_and_an_oversized_event(client: PravegaClient, unique_name) -> None:
    scope, stream = unique_name("adv-bytes"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 3)
    _write(client, scope, stream, "a", 400, size=100)
    _write(client, scope, stream, "big", 1, size=20_000)  # larger than the whole budget
    _write(client, scope, stream, "z", 100, size=100)

    budget = 5_000
    steps = _walk(client, scope, stream, max_bytes=budget)
    _check_exactly_once_in_key_order(steps, 501)
    for step in steps:
        size = sum(len(e) + 8 for e in step)
        assert size <= budget or len(step) == 1, (size, len(step))
    assert any(len(step) == 1 and len(step[0]) > budget for step in steps)


def test_without_limits_or_when_everything_fits_it_is_the_end(client: PravegaClient, unique_name) -> None:
    scope, stream = unique_name("adv-all"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 2)
    _write(client, scope, stream, "a", 50)
    head, tail = StreamCut.head(client, scope, stream), StreamCut.tail(client, scope, stream)
    assert advance_cut(client, head, tail) == tail
    assert advance_cut(client, head, tail, max_events=50) == tail
    assert advance_cut(client, head, tail, max_bytes=10**9) == tail
    assert advance_cut(client, tail, tail, max_events=5) == tail
    with pytest.raises(ValueError, match="max_events must be a positive integer"):
        advance_cut(client, head, tail, max_events=0)
