"""Our client following segments across the stores of a cluster (issue 32, items 3 and 4).

The embedded server runs in this process with 3 segment stores and 8 containers
(``pravega_cluster_factory``). Races are driven by the server's hooks, which run on a store's loop
thread at an exact point (a request arriving, an append made durable): a container moves there, so
what is in flight is answered WrongHost or loses its connection, always at the same event. No sleeps.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.batch import SegmentRange, read_segment_range_batches
from airflow_provider_pravega.client.errors import SegmentUnavailableError
from airflow_provider_pravega.client.synchronizer import StateSynchronizer
from airflow_provider_pravega.protocol import naming, wire
from client.readback import read_segments_direct

STORES = 3


@pytest.fixture
def cluster(pravega_cluster_factory):
    return pravega_cluster_factory(segment_stores=STORES, containers=8)


@pytest.fixture
def client(cluster):
    c = PravegaClient(cluster.controller_uri)
    yield c
    c.close()


def _stream(client: PravegaClient, unique_name, segments: int = 1) -> tuple[str, str]:
    scope = unique_name("fo")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "st", segments)
    return scope, "st"


def _other_store(cluster, segment: str) -> int:
    return (cluster.store_of(segment) + 1) % STORES


class MoveAt:
    """A hook that moves ``segment``'s container to the next store at the ``nth`` matching event on
    the store owning it: ``phase`` "request" (the request then gets WrongHost) or "appended" (the
    append is durable but its acknowledgement is dropped with the connection)."""

    def __init__(self, cluster, segment: str, nth: int, phase: str, kinds: tuple[type, ...] = ()) -> None:
        self.cluster, self.segment, self.nth, self.phase, self.kinds = cluster, segment, nth, phase, kinds
        self.owner = cluster.store_of(segment)
        self.target = _other_store(cluster, segment)
        self.seen = 0
        self.fired = False
        if phase == "request":
            cluster.set_hooks(on_request=self.on_request)
        else:
            cluster.set_hooks(on_appended=self.on_appended)

    def _hit(self) -> bool:
        self.seen += 1
        if self.seen == self.nth and not self.fired:
            self.fired = True
            self.cluster.move_segment(self.segment, self.target)
            return True
        return False

    def on_request(self, store: int, cmd: object) -> None:
        if store == self.owner and isinstance(cmd, self.kinds):
            self._hit()

    def on_appended(self, store: int, segment: str, writer_id: int, event_number: int) -> str | None:
        if store == self.owner and naming.parse_qualified_segment_name(segment) == \
                naming.parse_qualified_segment_name(self.segment):
            return "drop" if self._hit() else None
        return None


@pytest.mark.parametrize("phase", ["request", "appended"])
def test_writer_appending_while_its_container_moves(cluster, client, unique_name, phase):
    scope, stream = _stream(client, unique_name)
    segment = naming.qualified_segment_name(scope, stream, 0)
    hook = MoveAt(cluster, segment, 5, phase, (wire.AppendBlockEnd,))
    expected = [f"event-{i:05d}".encode() for i in range(2000)]
    with client.event_writer(scope, stream, block_events=10) as writer:
        for payload in expected:
            writer.write_event(payload, "key")
        writer.flush()
        assert hook.fired and writer.reconnects >= 1
    assert cluster.store_of(segment) == hook.target
    assert read_segments_direct(client, scope, stream) == {0: expected}  # exactly once, in order


def test_transaction_written_across_a_move_then_committed(cluster, client, unique_name):
    scope, stream = _stream(client, unique_name, segments=2)
    segment = naming.qualified_segment_name(scope, stream, 0)
    hook = MoveAt(cluster, segment, 3, "request", (wire.AppendBlockEnd,))
    txn = client.transactions.begin(scope, stream)
    sent: dict[str, list[bytes]] = defaultdict(list)
    with client.transactions.writer(scope, stream, txn, block_events=5) as writer:
        for i in range(600):
            key = f"k{i % 6}"
            payload = f"{key}-{i:04d}".encode()
            writer.write_event(payload, key)
            sent[key].append(payload)
    assert hook.fired
    client.transactions.commit(scope, stream, txn.txn_id, wait=True)
    got: dict[str, list[bytes]] = defaultdict(list)
    for events in read_segments_direct(client, scope, stream).values():
        for payload in events:
            got[payload.split(b"-")[0].decode()].append(payload)
    assert got == sent  # every event once, per-key order kept


def test_segment_read_resumes_after_its_store_stops_and_its_container_moves(cluster, client, unique_name):
    scope, stream = _stream(client, unique_name)
    segment = naming.qualified_segment_name(scope, stream, 0)
    expected = [f"{i:06d}".encode() * 10 for i in range(3000)]
    with client.event_writer(scope, stream) as writer:
        writer.write_events(expected, "key")
    owner = cluster.store_of(segment)
    batches = read_segment_range_batches(client, SegmentRange(scope, stream, 0, 0, None), chunk=16 * 1024)
    got = list(next(batches).payloads)
    assert 0 < len(got) < len(expected)
    cluster.stop_store(owner)  # the reader's connection drops; its cached endpoint now refuses
    cluster.move_segment(segment, _other_store(cluster, segment))
    for batch in batches:
        got.extend(batch.payloads)
    assert got == expected
    cluster.restart_store(owner)  # and back: the container moves home, the restarted store serves it
    cluster.move_segment(segment, owner)
    assert [bytes(p) for b in read_segment_range_batches(client, SegmentRange(scope, stream, 0, 0, None))
            for p in b.payloads] == expected


@pytest.mark.parametrize("phase", ["request", "appended"])
def test_synchronizer_update_across_a_move(cluster, client, unique_name, phase):
    scope = unique_name("sync")
    sync = StateSynchronizer(client, scope, "state", 0, lambda state, add: state + add)
    try:
        sync.update(lambda state: 1)
        segment = naming.qualified_segment_name(scope, "state", 0)
        # "appended": the append lands, its ack is lost with the connection: in doubt, and resolved
        # from the writer id's last event number on the new owner, not guessed (or written twice).
        hook = MoveAt(cluster, segment, 1, phase, (wire.ConditionalAppend, wire.ConditionalBlockEnd))
        assert sync.update(lambda state: 10) == 11
        assert hook.fired
        assert sync.update(lambda state: 100) == 111
    finally:
        sync.close()
    fresh = StateSynchronizer(client, scope, "state", 0, lambda state, add: state + add)
    try:
        assert fresh.fetch() == 111  # each update exactly once
    finally:
        fresh.close()


def test_stopped_store_without_another_owner_fails_bounded_naming_segment_and_stores(cluster, client, unique_name):
    scope, stream = _stream(client, unique_name)
    segment = naming.qualified_segment_name(scope, stream, 0)
    with client.event_writer(scope, stream) as writer:
        writer.write_event(b"x", "key")
    owner = cluster.store_of(segment)
    endpoint = cluster.segment_store_endpoints[owner]
    cluster.stop_store(owner)
    client.segments.failover_timeout_s = 0.5
    client.segments.failover_attempts = 4
    with pytest.raises(SegmentUnavailableError) as info:
        client.segments.get_segment_info(segment)
    message = str(info.value)
    assert segment in message and endpoint in message and info.value.endpoints == [endpoint]
    assert info.value.attempts <= 4
    with pytest.raises(SegmentUnavailableError) as info:
        list(read_segment_range_batches(client, SegmentRange(scope, stream, 0, 0, 9)))
    assert segment in str(info.value) and info.value.endpoints == [endpoint]
    with pytest.raises(SegmentUnavailableError) as info:
        client.segments.open_append_session(segment, reconnect_timeout_s=0.5)
    assert segment in str(info.value) and endpoint in str(info.value)
    cluster.restart_store(owner)
    assert client.segments.get_segment_info(segment).length == 9
