"""Segment ranges between stream cuts, across two scalings, read straight from the segment store.

Events are written by the official client (routing keys hashed by it) to a 3-segment stream in
three phases, with a split after the first and a merge after the second. The expected content of
each interval is known from the phases, from what an official reader group consumed, and from
per-segment event lists read with the connection layer of client part 1 (an independent reader).
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import pickle
import time
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
from pravega_clients import require_official_client, stream_writer

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.batch import (
    Event,
    SegmentRange,
    SegmentRangeTruncatedError,
    StreamCutOrderError,
    plan_segment_ranges,
    read_segment_range,
    read_segment_range_batches,
    read_segment_ranges,
)
from airflow_provider_pravega.client.errors import (
    InvalidStreamCutError,
    NoSuchSegmentError,
    SegmentStoreError,
    TruncatedStreamCutError,
)
from airflow_provider_pravega.client.streamcut import (
    HEAD,
    TAIL,
    StreamCut,
    StreamCutMismatchError,
)
from airflow_provider_pravega.protocol import naming, wire

KEYS = [f"key-{i:02d}" for i in range(24)]

# The scenario's reader-group cut comes from the official client's reader group (the oracle).
pravega_client = require_official_client()


def payload(phase: int, key: str, seq: int, size: int = 0) -> bytes:
    head = f"{phase}|{key}|{seq:06d}|".encode()
    return head + b"x" * max(0, size - len(head))


def parse(data: bytes) -> tuple[int, str, int]:
    phase, key, seq, _ = data.split(b"|", 3)
    return int(phase), key.decode(), int(seq)


def write_official(uri: str, scope: str, stream: str, events: list[tuple[str, bytes]]) -> None:
    writer = stream_writer(uri, scope, stream)
    for key, data in events:
        writer.write_event_bytes(data, routing_key=key)
    writer.flush()


def segment_events_independently(client: PravegaClient, scope: str, stream: str, segment_id: int) -> list[tuple[int, bytes]]:
    """(offset, payload) of every event of a segment, via client part 1's reads and the wire codec."""
    name = naming.qualified_segment_name(scope, stream, segment_id)
    info = client.segments.get_segment_info(name)
    data = bytearray()
    offset = info.start_offset
    while offset + len(data) < info.length:
        reply = client.segments.read_segment(name, offset + len(data), info.length - offset - len(data))
        data += reply.data
    events, end = wire.split_events(bytes(data), offset)
    assert end == info.length
    return [(e.offset, e.payload) for e in events]


def read_plan(target, ranges: list[SegmentRange], **options) -> list[bytes]:
    return [e.payload for e in read_segment_ranges(target, ranges, **options)]


@dataclass
class Scenario:
    scope: str
    stream: str
    phases: dict[int, list[bytes]] = field(default_factory=dict)
    cuts: dict[str, StreamCut] = field(default_factory=dict)
    consumed_by_group: list[bytes] = field(default_factory=list)
    mid_phase2: list[bytes] = field(default_factory=list)

    @property
    def all_events(self) -> list[bytes]:
        return [p for phase in sorted(self.phases) for p in self.phases[phase]]


@pytest.fixture(scope="module")
def client(pravega_controller_uri: str):
    with PravegaClient(pravega_controller_uri) as c:
        yield c


@pytest.fixture(scope="module")
def scenario(client: PravegaClient, pravega_controller_uri: str) -> Scenario:
    uri = pravega_controller_uri
    sc = Scenario(f"batch-{time.monotonic_ns() % 10**9}", "scaled")
    client.admin.create_scope(sc.scope)
    client.admin.create_stream(sc.scope, sc.stream, 3)
    seq: dict[str, int] = defaultdict(int)

    def phase_events(phase: int, count: int, big_every: int = 0) -> list[tuple[str, bytes]]:
        out = []
        for i in range(count):
            key = KEYS[(i * 7 + phase) % len(KEYS)]
            seq[key] += 1
            size = 300_000 if big_every and i % big_every == 0 else 40 + i % 50
            out.append((key, payload(phase, key, seq[key], size)))
        return out

    sc.cuts["head"] = StreamCut.head(client, sc.scope, sc.stream)
    phase1 = phase_events(1, 900, big_every=150)
    write_official(uri, sc.scope, sc.stream, phase1)
    sc.phases[1] = [p for _, p in phase1]
    sc.cuts["T1"] = StreamCut.tail(client, sc.scope, sc.stream)

    # An official reader group consumes part of phase 1; its position is a cut.
    manager = pravega_client.StreamManager(uri)
    group = manager.create_reader_group(f"rg{time.monotonic_ns() % 10**9}", sc.scope, sc.stream)
    reader = group.create_reader("r0")

    async def consume(n: int) -> list[bytes]:
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            sl = await asyncio.wait_for(reader.get_segment_slice_async(), 10)
            for event in sl:
                got.append(event.data())
                if len(got) >= n:
                    break
            reader.release_segment(sl)
        return got

    sc.consumed_by_group = asyncio.run(consume(250))
    reader.reader_offline()
    sc.cuts["RG"] = StreamCut.from_reader_group(group.get_streamcut(), sc.scope, sc.stream)

    # Scale 1: split segment 1 ([1/3, 2/3)) in two.
    client.admin.split_segment(sc.scope, sc.stream, 1)
    phase2 = phase_events(2, 800)
    write_official(uri, sc.scope, sc.stream, phase2[:300])
    sc.cuts["M2"] = StreamCut.tail(client, sc.scope, sc.stream)  # positions recorded mid-phase
    write_official(uri, sc.scope, sc.stream, phase2[300:])
    sc.phases[2] = [p for _, p in phase2]
    sc.mid_phase2 = sc.phases[2][:300]
    sc.cuts["T2"] = StreamCut.tail(client, sc.scope, sc.stream)

    # Scale 2: merge segment 0 ([0, 1/3)) with its new neighbour ([1/3, 1/2)).
    current = client.controller.get_current_segments(sc.scope, sc.stream)
    neighbour = next(s.segment_id for s in current if s.min_key == current[0].max_key)
    client.admin.merge_segments(sc.scope, sc.stream, [0, neighbour])
    phase3 = phase_events(3, 700, big_every=100)
    write_official(uri, sc.scope, sc.stream, phase3)
    sc.phases[3] = [p for _, p in phase3]
    sc.cuts["T3"] = StreamCut.tail(client, sc.scope, sc.stream)
    return sc


# ------------------------------------------------------------------------------ the plans


def test_scenario_has_three_epochs(client: PravegaClient, scenario: Scenario) -> None:
    cuts = scenario.cuts
    assert set(cuts["T1"].positions) == {0, 1, 2}
    assert {s >> 32 for s in cuts["T2"].positions} == {0, 1}
    assert {s >> 32 for s in cuts["T3"].positions} == {0, 1, 2}
    assert set(cuts["RG"].positions) == {0, 1, 2}
    assert 0 < sum(cuts["RG"].positions.values()) < sum(cuts["T1"].positions.values())


@pytest.mark.parametrize(
    "start,end,expected",
    [
        ("head", "T3", lambda sc: sc.all_events),
        ("head", "T1", lambda sc: sc.phases[1]),
        ("T1", "T2", lambda sc: sc.phases[2]),
        ("T2", "T3", lambda sc: sc.phases[3]),
        ("T1", "T3", lambda sc: sc.phases[2] + sc.phases[3]),
        ("T1", "M2", lambda sc: sc.mid_phase2),
        ("M2", "T3", lambda sc: sc.phases[2][300:] + sc.phases[3]),
        ("head", "RG", lambda sc: sc.consumed_by_group),
        ("RG", "T3", lambda sc: sorted(set(sc.all_events) - set(sc.consumed_by_group))),
        ("T3", "T3", lambda sc: []),
    ],
)
def test_ranges_between_cuts_hold_exactly_the_events_between_them(
    client: PravegaClient, scenario: Scenario, start: str, end: str, expected
) -> None:
    start_cut, end_cut = scenario.cuts[start], scenario.cuts[end]
    ranges = plan_segment_ranges(client, start_cut, end_cut)
    got = read_plan(client, ranges)
    want = expected(scenario)
    assert len(got) == len(set(got)), "an event was read twice"
    assert sorted(got) == sorted(want)
    # Deterministic, and the segments are the controller's segments between the cuts.
    assert plan_segment_ranges(client, start_cut, end_cut) == ranges
    with_empty = plan_segment_ranges(client, start_cut, end_cut, include_empty=True)
    assert {r.segment_id for r in with_empty} == client.controller.get_segments_between(
        scenario.scope, scenario.stream, start_cut.positions, end_cut.positions
    )
    # Predecessors first: creation epochs never decrease along the plan.
    epochs = [r.segment_id >> 32 for r in with_empty]
    assert epochs == sorted(epochs)


def test_per_key_order_holds_across_both_scalings(client: PravegaClient, scenario: Scenario) -> None:
    ranges = plan_segment_ranges(
        client, StreamCut.symbolic(scenario.scope, scenario.stream, HEAD), scenario.cuts["T3"]
    )
    per_key: dict[str, list[int]] = defaultdict(list)
    for data in read_plan(client, ranges):
        _, key, seq = parse(data)
        per_key[key].append(seq)
    assert set(per_key) == set(KEYS)
    for key, seqs in per_key.items():
        assert seqs == list(range(1, len(seqs) + 1)), f"key {key} out of order"
    assert sum(map(len, per_key.values())) == len(scenario.all_events)


def test_union_of_consecutive_intervals_is_everything_once(client: PravegaClient, scenario: Scenario) -> None:
    chain = ["head", "RG", "T1", "M2", "T2", "T3"]
    seen: list[bytes] = []
    for a, b in itertools.pairwise(chain):
        seen += read_plan(client, plan_segment_ranges(client, scenario.cuts[a], scenario.cuts[b]))
    assert len(seen) == len(set(seen))
    assert sorted(seen) == sorted(scenario.all_events)


def test_a_cut_built_from_recorded_event_offsets(client: PravegaClient, scenario: Scenario) -> None:
    """A cut placed after the k-th event of each current segment (offsets read independently)."""
    sc = scenario
    current = [s.segment_id for s in client.controller.get_current_segments(sc.scope, sc.stream)]
    per_segment = {s: segment_events_independently(client, sc.scope, sc.stream, s) for s in current}
    positions, before = {}, []
    for i, (segment_id, events) in enumerate(sorted(per_segment.items())):
        k = min(len(events), 5 + 17 * i)
        positions[segment_id] = events[k][0] if k < len(events) else events[-1][0] + 8 + len(events[-1][1])
        before += [p for _, p in events[:k]]
    cut = StreamCut(sc.scope, sc.stream, positions)
    head_to_cut = read_plan(client, plan_segment_ranges(client, sc.cuts["head"], cut))
    cut_to_tail = read_plan(client, plan_segment_ranges(client, cut, sc.cuts["T3"]))
    # Before the cut: every event of the segments sealed by the scalings, and the first events
    # of each current segment.
    between = client.controller.get_segments_between(sc.scope, sc.stream, sc.cuts["head"].positions, {})
    sealed = [p for s in between - set(current) for _, p in segment_events_independently(client, sc.scope, sc.stream, s)]
    assert sorted(head_to_cut) == sorted(sealed + before)
    assert len(head_to_cut) + len(cut_to_tail) == len(sc.all_events)
    assert sorted(head_to_cut + cut_to_tail) == sorted(sc.all_events)


def test_reads_with_tiny_chunks_split_events_across_replies(client: PravegaClient, scenario: Scenario) -> None:
    ranges = plan_segment_ranges(client, scenario.cuts["head"], scenario.cuts["T1"])
    expected = read_plan(client, ranges)
    for chunk in (1000, 65536, 300_001):  # events of 300 kB span many replies
        assert read_plan(client, ranges, chunk=chunk) == expected
    events = list(read_segment_range(client, ranges[0]))
    small = [SegmentRange(r.scope, r.stream, r.segment_id, r.start_offset,
                          next(e.offset for e in read_segment_range(client, r) if e.offset >= r.start_offset + 2000))
             for r in ranges if r.length > 4000]
    assert read_plan(client, small, chunk=7) == read_plan(client, small)
    assert all(isinstance(e, Event) and e.segment_id == ranges[0].segment_id for e in events)
    assert events[0].offset == ranges[0].start_offset
    assert [b.offset for b in events[1:]] == [a.offset + 8 + len(a.payload) for a in events[:-1]]
    assert events[-1].offset + 8 + len(events[-1].payload) == ranges[0].end_offset
    # The batch form (one list per reply) holds the same events.
    for chunk in (1000, 4 * 1024 * 1024):
        batches = list(read_segment_range_batches(client, ranges[0], chunk=chunk))
        assert all(b.segment_id == ranges[0].segment_id for b in batches)
        assert [p for b in batches for p in b.payloads] == [e.payload for e in events]
        assert [o for b in batches for o in b.offsets] == [e.offset for e in events]


def test_ranges_are_picklable_and_json_able(client: PravegaClient, scenario: Scenario) -> None:
    ranges = plan_segment_ranges(client, scenario.cuts["head"], scenario.cuts["T3"])
    assert pickle.loads(pickle.dumps(ranges)) == ranges
    assert [SegmentRange.from_json(r.to_json()) for r in ranges] == ranges
    assert all(r.end_offset is not None for r in ranges)


def _read_in_child(target, ranges: list[SegmentRange]) -> list[bytes]:
    return [e.payload for r in ranges for e in read_segment_range(target, r)]


def test_reads_in_forked_and_spawned_workers(client: PravegaClient, scenario: Scenario, pravega_embedded) -> None:
    """As in Spark: ranges planned by a driver, read in worker processes by endpoint or by URI.
    Forked workers come from a fork server, as Spark's come from its single-threaded
    ``pyspark.daemon``: forking this process itself (gRPC channels and their threads open) can
    deadlock the child in gRPC's fork handlers, which is not what Spark does (forking a process
    that holds the client's pooled connections is tests/client/test_fork_safety.py's case)."""
    ranges = plan_segment_ranges(client, scenario.cuts["T1"], scenario.cuts["T3"])
    expected = read_plan(client, ranges)
    endpoint = pravega_embedded.segment_store_endpoint
    assert read_plan(endpoint, ranges) == expected  # the parent now holds pooled connections
    with mp.get_context("forkserver").Pool(2) as pool:
        assert pool.apply(_read_in_child, (endpoint, ranges)) == expected
    with mp.get_context("spawn").Pool(2) as pool:
        parts = pool.starmap(_read_in_child, [(pravega_embedded.controller_uri, [r]) for r in ranges])
    assert [p for part in parts for p in part] == expected
    assert read_plan(endpoint, ranges) == expected  # and the parent's pool still works


# ------------------------------------------------------------------------------ the errors


def test_start_after_end_is_refused(client: PravegaClient, scenario: Scenario) -> None:
    cuts = scenario.cuts
    with pytest.raises(StreamCutOrderError, match="start cut .* is after the end cut: segment .*: end cut offset \\d+ < start cut offset"):
        plan_segment_ranges(client, cuts["T1"], cuts["RG"])
    with pytest.raises(StreamCutOrderError, match="of the end cut precedes segment .* of the start cut"):
        plan_segment_ranges(client, cuts["T3"], cuts["T1"])  # start segments are successors of end ones
    with pytest.raises(StreamCutOrderError):
        plan_segment_ranges(client, cuts["T2"], cuts["M2"])


def test_cuts_of_other_streams_and_incomplete_cuts(client: PravegaClient, scenario: Scenario, unique_name) -> None:
    sc = scenario
    other = StreamCut(sc.scope, "another", {0: 0})
    with pytest.raises(StreamCutMismatchError, match=f"end cut belongs to stream {sc.scope}/another, but stream {sc.scope}/scaled"):
        plan_segment_ranges(client, sc.cuts["head"], other)
    with pytest.raises(InvalidStreamCutError, match="does not belong"):
        plan_segment_ranges(client, sc.cuts["head"], StreamCut(sc.scope, sc.stream, {(9 << 32) | 40: 0}))
    with pytest.raises(InvalidStreamCutError, match="not a complete stream cut"):
        plan_segment_ranges(client, StreamCut(sc.scope, sc.stream, {0: 0, 2: 0}), sc.cuts["T3"])


def test_reading_a_range_that_does_not_match_the_segment(client: PravegaClient, scenario: Scenario) -> None:
    sc = scenario
    ranges = plan_segment_ranges(client, sc.cuts["head"], sc.cuts["T1"])
    rng = next(r for r in ranges if r.length and r.length > 100)
    first = next(read_segment_range(client, rng))
    inside = SegmentRange(sc.scope, sc.stream, rng.segment_id, rng.start_offset + 3, rng.end_offset)
    with pytest.raises(SegmentStoreError, match="event boundary"):
        list(read_segment_range(client, inside))
    cut_short = SegmentRange(sc.scope, sc.stream, rng.segment_id, rng.start_offset, first.offset + 9)
    with pytest.raises(SegmentStoreError, match="ends inside an event"):
        list(read_segment_range(client, cut_short))
    # Segment 1 was sealed by the first scale: a range past its end is refused, not waited for.
    length = client.segments.get_segment_info(naming.qualified_segment_name(sc.scope, sc.stream, 1)).length
    with pytest.raises(SegmentStoreError, match="before the end of the range"):
        list(read_segment_range(client, SegmentRange(sc.scope, sc.stream, 1, 0, length + 100)))
    # An open end reads a sealed segment to its end.
    whole = list(read_segment_range(client, SegmentRange(sc.scope, sc.stream, 1, 0, None)))
    assert whole[-1].offset + 8 + len(whole[-1].payload) == length
    with pytest.raises(NoSuchSegmentError, match="truncated away or its stream"):
        list(read_segment_range(client, SegmentRange(sc.scope, "no-such-stream-here", 0, 0, 10)))


def test_truncated_start_cut(client: PravegaClient, pravega_controller_uri: str, unique_name) -> None:
    scope, stream = unique_name("trunc"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 2)
    old_head = StreamCut.head(client, scope, stream)
    first = [(KEYS[i % 5], payload(1, KEYS[i % 5], i)) for i in range(200)]
    write_official(pravega_controller_uri, scope, stream, first)
    middle = StreamCut.tail(client, scope, stream)
    client.admin.split_segment(scope, stream, 0)
    second = [(KEYS[i % 5], payload(2, KEYS[i % 5], i)) for i in range(200)]
    write_official(pravega_controller_uri, scope, stream, second)
    before_truncation = plan_segment_ranges(client, old_head, StreamCut.symbolic(scope, stream, TAIL))

    client.admin.truncate_stream(scope, stream, middle.positions)
    with pytest.raises(TruncatedStreamCutError, match=f"{scope}/{stream}.*truncated data.*start cut offset 0 < head offset"):
        plan_segment_ranges(client, old_head, StreamCut.symbolic(scope, stream, TAIL))
    clamped = plan_segment_ranges(client, old_head, StreamCut.symbolic(scope, stream, TAIL), on_truncated="head")
    assert sorted(read_plan(client, clamped)) == sorted(p for _, p in second)
    # Ranges planned before the truncation now fail with a clear error when read.
    stale = next(r for r in before_truncation if r.segment_id == 1 and r.start_offset == 0)
    with pytest.raises(SegmentRangeTruncatedError, match="now starts at offset") as info:
        list(read_segment_range(client, stale))
    assert info.value.start_offset == middle.positions[1]

    # Truncating at a cut of the successors deletes segment 0: a cut naming it lies before the head.
    tail = StreamCut.tail(client, scope, stream)
    client.admin.truncate_stream(scope, stream, tail.positions)
    with pytest.raises(TruncatedStreamCutError, match="0.#epoch.0 of the start cut precedes segment"):
        plan_segment_ranges(client, middle, tail)
    assert plan_segment_ranges(client, middle, tail, on_truncated="head") == []


def test_a_cut_mixing_epochs_gets_the_controllers_segments(client: PravegaClient, unique_name) -> None:
    """Split, merge, split: the cut {low.#epoch.3, b.#epoch.1} tiles the key space but segment b
    precedes the merged segment on its keys, so nothing after the merge is between the start cut
    on epoch 1 and that cut. (The stream starts with one segment: Pravega refuses a merge that
    leaves fewer segments than the scaling policy's minimum.)"""
    scope, stream = unique_name("mixed"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 1)
    a, b = client.admin.split_segment(scope, stream, 0)
    merged = client.admin.merge_segments(scope, stream, [a.segment_id, b.segment_id])
    low, high = client.admin.split_segment(scope, stream, merged.segment_id)
    length_b = client.segments.get_segment_info(naming.qualified_segment_name(scope, stream, b.segment_id)).length
    start = StreamCut(scope, stream, {a.segment_id: 0, b.segment_id: 0})
    mixed = StreamCut(scope, stream, {low.segment_id: 0, b.segment_id: length_b})
    planned = plan_segment_ranges(client, start, mixed, include_empty=True)
    assert {r.segment_id for r in planned} == {a.segment_id, b.segment_id}
    # Pravega's answer also names the 'to' cut's own segments (here ``low``, which the planner
    # leaves out: nothing between the cuts lies in it).
    assert {r.segment_id for r in planned} | set(mixed.positions) == client.controller.get_segments_between(
        scope, stream, start.positions, mixed.positions
    )
    everything = plan_segment_ranges(client, start, StreamCut.tail(client, scope, stream), include_empty=True)
    assert [r.segment_id for r in everything] == [a.segment_id, b.segment_id, merged.segment_id, low.segment_id,
                                                  high.segment_id]


def test_per_process_clients_are_kept_per_config_not_per_repr() -> None:
    """Configs whose repr hides different passwords must not share a worker's client."""
    from airflow_provider_pravega.client import batch
    from airflow_provider_pravega.client.config import PravegaConnectionConfig

    one = PravegaConnectionConfig.from_connection_fields(host="127.0.0.1", port=1, login="u", password="one")
    two = PravegaConnectionConfig.from_connection_fields(host="127.0.0.1", port=1, login="u", password="two")
    assert repr(one) == repr(two) and one != two
    local = batch._ProcessLocal()
    first, second = local.get_client(one, one), local.get_client(two, two)
    try:
        assert first is not second
        assert local.get_client(one, one) is first
    finally:
        first.close()
        second.close()
