"""State synchronizer against the embedded server: concurrent updaters in threads and in spawned
processes (no lost update, one winner per revision), restart survival, compaction, one instance
shared by two threads and appends in doubt."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import select
import threading
from typing import Any

import pytest

from airflow_provider_pravega.client import PravegaClient, synchronizer
from airflow_provider_pravega.client.batch import SegmentRange, read_segment_range
from airflow_provider_pravega.client.connection import SegmentStoreConnection
from airflow_provider_pravega.client.errors import (
    SegmentStoreError,
    SegmentStoreUnreachableError,
    StreamNotFoundError,
)
from airflow_provider_pravega.client.synchronizer import (
    StateSynchronizer,
    SynchronizerConflictError,
    SynchronizerError,
)
from airflow_provider_pravega.protocol import naming, wire

SPAWN = mp.get_context("spawn")


# A counter and a set, as JSON: {"counter": int, "members": sorted list}.
def apply_counter(state: dict[str, Any], op: dict[str, Any]) -> dict[str, Any]:
    state["counter"] += op["add"]
    state["members"] = sorted(set(state["members"]) | {op["member"]})
    return state


def counter_sync(client: PravegaClient, scope: str, stream: str, **options: Any) -> StateSynchronizer:
    return StateSynchronizer(client, scope, stream, {"counter": 0, "members": []}, apply_counter, **options)


def add_one(sync: StateSynchronizer, member: str) -> int:
    """One conditional update; returns the revision (record offset) it was written at."""
    sync.update(lambda state: {"add": 1, "member": member})
    assert sync.last_written_revision is not None
    return sync.last_written_revision


def records_in_stream(client: PravegaClient, scope: str, stream: str) -> list[tuple[int, dict[str, Any]]]:
    """(offset, record) of every record in the state stream, read straight from the segment."""
    name = naming.qualified_segment_name(scope, stream, 0)
    info = client.segments.get_segment_info(name)
    rng = SegmentRange(scope, stream, 0, info.start_offset, info.length)
    return [(e.offset, json.loads(e.payload)) for e in read_segment_range(client, rng)]


def updater_process(uri: str, scope: str, stream: str, worker: str, count: int, start: Any) -> tuple[list[int], int]:
    with PravegaClient(uri) as client:
        sync = counter_sync(client, scope, stream, create=False)
        sync.fetch_updates()
        start.wait(60)  # all processes begin together, so they contend
        return [add_one(sync, f"{worker}-{i}") for i in range(count)], sync.conflicts


@pytest.fixture
def client(pravega_controller_uri: str):
    with PravegaClient(pravega_controller_uri) as c:
        yield c


def check_winners(client: PravegaClient, scope: str, stream: str, revisions: list[int], expected_members: set[str]) -> None:
    records = records_in_stream(client, scope, stream)
    assert len(revisions) == len(set(revisions)), "two updates claim the same revision"
    assert sorted(revisions) == [offset for offset, _ in records], "a winner's record is missing, or one has no winner"
    assert {r["op"]["member"] for _, r in records} == expected_members
    fresh = counter_sync(client, scope, stream, create=False)
    state = fresh.fetch_updates()
    assert state == {"counter": len(expected_members), "members": sorted(expected_members)}
    assert fresh.revision == client.segments.get_segment_info(naming.qualified_segment_name(scope, stream, 0)).length


# ---------------------------------------------------------------------------------- basics


def test_updates_fold_in_order_and_fresh_readers_see_them(client: PravegaClient, unique_name) -> None:
    scope, stream = unique_name("sync"), "state"
    sync = counter_sync(client, scope, stream)
    assert sync.fetch_updates() == {"counter": 0, "members": []}
    assert sync.revision == 0
    assert sync.update(lambda s: {"add": 5, "member": "a"}) == {"counter": 5, "members": ["a"]}
    # Several updates from one call land in one atomic append, each its own record.
    state = sync.update(lambda s: [{"add": 1, "member": "b"}, {"add": 2, "member": "c"}])
    assert state == {"counter": 8, "members": ["a", "b", "c"]}
    assert sync.update(lambda s: None) == state  # nothing to change: nothing written
    records = records_in_stream(client, scope, stream)
    assert [r for _, r in records] == [
        {"t": "upd", "op": {"add": 5, "member": "a"}},
        {"t": "upd", "op": {"add": 1, "member": "b"}},
        {"t": "upd", "op": {"add": 2, "member": "c"}},
    ]
    assert sync.written_revisions == [offset for offset, _ in records]
    assert sync.revision == records[-1][0] + 8 + len(json.dumps(records[-1][1], separators=(",", ":")))
    other = counter_sync(client, scope, stream)  # the stream exists: create is idempotent
    assert other.fetch_updates() == state
    # The caller's copy cannot change the synchronizer's state.
    sync.state["members"].append("zzz")
    assert sync.state == state


def test_a_stale_writer_loses_and_retries_from_the_new_state(client: PravegaClient, unique_name) -> None:
    scope, stream = unique_name("sync"), "state"
    a = counter_sync(client, scope, stream)
    b = counter_sync(client, scope, stream)
    seen: list[dict[str, Any]] = []

    def from_b(state: dict[str, Any]) -> dict[str, Any]:
        seen.append(state)
        if len(seen) == 1:  # a writes between b's read and b's conditional append
            a.update(lambda s: {"add": 1, "member": "from-a"})
        return {"add": 10, "member": "from-b"}

    assert b.update(from_b) == {"counter": 11, "members": ["from-a", "from-b"]}
    assert seen == [{"counter": 0, "members": []}, {"counter": 1, "members": ["from-a"]}]
    assert a.fetch_updates() == b.state
    records = records_in_stream(client, scope, stream)
    assert [r["op"]["member"] for _, r in records] == ["from-a", "from-b"]
    assert (a.written_revisions, b.written_revisions) == ([records[0][0]], [records[1][0]])


def test_conflicts_are_bounded(client: PravegaClient, unique_name) -> None:
    scope, stream = unique_name("sync"), "state"
    loser = counter_sync(client, scope, stream, max_attempts=3, backoff_s=0.0)
    rival = counter_sync(client, scope, stream)
    calls = 0

    def always_preempted(state: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        rival.update(lambda s: {"add": 1, "member": f"rival-{calls}"})  # someone always writes first
        return {"add": 1, "member": "loser"}

    with pytest.raises(SynchronizerConflictError, match=f"{scope}/{stream} lost 3 times"):
        loser.update(always_preempted)
    assert calls == 3
    assert "loser" not in loser.fetch_updates()["members"]


@dataclasses.dataclass
class Progress:
    done: list[str]
    position: int


def test_dataclass_state_and_typed_updates(client: PravegaClient, unique_name) -> None:
    scope, stream = unique_name("sync"), "typed"

    def apply(state: Progress, update: tuple[str, int]) -> Progress:
        return Progress(state.done + [update[0]], update[1])

    sync = StateSynchronizer(client, scope, stream, Progress([], 0), apply, decode_update=tuple)
    sync.update(lambda s: ("a.csv", 10))
    sync.update(lambda s: ("b.csv", 25))
    sync.compact()
    fresh = StateSynchronizer(client, scope, stream, Progress([], 0), apply, decode_update=tuple)
    assert fresh.fetch_updates() == Progress(["a.csv", "b.csv"], 25)
    assert fresh.fetch_updates() == sync.state


def test_stream_shape_and_missing_stream_errors(client: PravegaClient, unique_name) -> None:
    scope = unique_name("sync")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "wide", 2)
    with pytest.raises(SynchronizerError, match="has 2 segments; a state synchronizer needs a stream with exactly one"):
        counter_sync(client, scope, "wide")
    with pytest.raises(StreamNotFoundError, match=f"{scope}/absent"):
        counter_sync(client, scope, "absent", create=False)
    client.admin.create_stream(scope, "sealed")
    sync = counter_sync(client, scope, "sealed")
    sync.update(lambda s: {"add": 1, "member": "x"})
    client.admin.seal_stream(scope, "sealed")
    with pytest.raises(SynchronizerError, match="sealed"):
        sync.update(lambda s: {"add": 1, "member": "y"})


# ----------------------------------------------------------------------------- concurrency


def test_concurrent_updaters_in_threads_lose_nothing(client: PravegaClient, unique_name) -> None:
    scope, stream = unique_name("sync"), "threads"
    counter_sync(client, scope, stream)  # create the stream once
    threads, per_thread = 6, 15
    results: dict[int, list[int]] = {}
    conflicts: dict[int, int] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def work(t: int) -> None:
        try:
            sync = counter_sync(client, scope, stream, create=False)
            sync.fetch_updates()
            start.wait(60)
            results[t] = [add_one(sync, f"t{t}-{i}") for i in range(per_thread)]
            conflicts[t] = sync.conflicts
        except Exception as exc:  # noqa: BLE001 - reported by the main thread below
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(timeout=300)
    assert not errors, errors
    assert sum(conflicts.values()) > 0, "the threads never contended"
    revisions = [r for t in range(threads) for r in results[t]]
    check_winners(client, scope, stream, revisions, {f"t{t}-{i}" for t in range(threads) for i in range(per_thread)})


def test_concurrent_updaters_in_processes_lose_nothing(client: PravegaClient, pravega_controller_uri: str, unique_name) -> None:
    scope, stream = unique_name("sync"), "procs"
    counter_sync(client, scope, stream)
    workers, per_worker = 4, 20
    with SPAWN.Manager() as manager, SPAWN.Pool(workers) as pool:
        start = manager.Barrier(workers)
        results = pool.starmap(
            updater_process,
            [(pravega_controller_uri, scope, stream, f"p{w}", per_worker, start) for w in range(workers)],
        )
    revisions = [r for part, _ in results for r in part]
    assert sum(conflicts for _, conflicts in results) > 0, "the processes never contended"
    print(f"{len(revisions)} updates from {workers} processes, {sum(c for _, c in results)} lost attempts")
    check_winners(client, scope, stream, revisions, {f"p{w}-{i}" for w in range(workers) for i in range(per_worker)})


# ------------------------------------------------------------------------- restart, compaction


def test_state_survives_a_server_restart(pravega_embedded_factory, unique_name) -> None:
    server = pravega_embedded_factory()
    scope, stream = unique_name("sync"), "durable"
    with PravegaClient(server.controller_uri) as client:
        sync = counter_sync(client, scope, stream)
        for i in range(10):
            add_one(sync, f"before-{i}")
        server.stop()
        server.restart()
        # The same instance reconnects (its append connection broke) and keeps updating.
        for i in range(5):
            add_one(sync, f"after-{i}")
    with PravegaClient(server.controller_uri) as client:
        fresh = counter_sync(client, scope, stream)
        state = fresh.fetch_updates()
        members = {f"before-{i}" for i in range(10)} | {f"after-{i}" for i in range(5)}
        assert state == {"counter": 15, "members": sorted(members)}
        check_winners(client, scope, stream, sync.written_revisions, members)


def test_compaction_keeps_the_state_and_moves_the_head(client: PravegaClient, unique_name, caplog) -> None:
    scope, stream = unique_name("sync"), "compact"
    writer = counter_sync(client, scope, stream)
    behind = counter_sync(client, scope, stream)
    for i in range(5):
        add_one(writer, f"early-{i}")
    assert behind.fetch_updates()["counter"] == 5
    early_revision = behind.revision
    for i in range(40):
        add_one(writer, f"m{i}")
    name = naming.qualified_segment_name(scope, stream, 0)
    before = client.segments.get_segment_info(name)
    assert before.start_offset == 0

    head = writer.compact()
    after = client.segments.get_segment_info(name)
    assert head == before.length  # the full state was appended at the old tail...
    assert after.start_offset == head == writer.head_offset()  # ...and the stream truncated at it
    assert client.controller.get_segments_at_head(scope, stream) == {0: head}
    assert after.length - after.start_offset < before.length  # far less to read now
    records = records_in_stream(client, scope, stream)
    assert [r["t"] for _, r in records] == ["full"]
    expected = writer.state
    assert expected["counter"] == 45

    # A fresh reader starts from the full record; one whose revision is below the head restarts there.
    assert counter_sync(client, scope, stream).fetch_updates() == expected
    assert early_revision is not None and early_revision < head
    with caplog.at_level("INFO", logger="airflow_provider_pravega.client.synchronizer"):
        assert behind.fetch_updates() == expected
    assert "truncated while reading; restarting from the head" in caplog.text  # SegmentIsTruncated
    assert behind.revision == after.length

    # Updates continue after compaction, and a second compaction moves the head again.
    add_one(behind, "late")
    second = writer.compact()
    assert second > head
    final = counter_sync(client, scope, stream).fetch_updates()
    assert final["counter"] == 46 and "late" in final["members"]


def test_a_state_larger_than_one_chunk_is_compacted_in_parts(client: PravegaClient, unique_name,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction of a state bigger than one event writes it in chunk records; readers rebuild it.
    A snapshot interrupted by another writer's update is incomplete and ignored by readers."""
    monkeypatch.setattr(synchronizer, "SNAPSHOT_CHUNK_CHARS", 100)
    scope, stream = unique_name("sync"), "chunked"
    writer = counter_sync(client, scope, stream)
    for i in range(30):
        add_one(writer, f"member-{i:03d}")
    head = writer.compact()
    kinds = [r["t"] for _, r in records_in_stream(client, scope, stream)]
    assert len(kinds) > 3 and set(kinds) == {"part"}
    assert client.segments.get_segment_info(naming.qualified_segment_name(scope, stream, 0)).start_offset == head
    assert counter_sync(client, scope, stream).fetch_updates() == writer.state
    assert writer.state["counter"] == 30

    # A compactor that loses between its chunks leaves a partial snapshot: readers skip it.
    compactor = counter_sync(client, scope, stream)
    compactor.fetch_updates()
    partial = json.dumps({"t": "part", "id": "x", "i": 0, "n": 2, "data": '{"counter": 999, '}).encode()
    assert compactor._appender.append(compactor.revision, [partial])
    add_one(writer, "after-partial")
    fresh = counter_sync(client, scope, stream).fetch_updates()
    assert fresh["counter"] == 31 and "after-partial" in fresh["members"]
    # The compactor itself retries past its lost chunk and writes a complete snapshot.
    compactor.compact()
    assert counter_sync(client, scope, stream).fetch_updates() == writer.fetch_updates()


# ------------------------------------------------------------------- one instance, two threads


class _ReportingRLock:
    """An RLock that reports (``waiting``) when a thread has to wait for it."""

    def __init__(self, waiting: threading.Event) -> None:
        self._inner = threading.RLock()
        self._waiting = waiting

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._inner.acquire(blocking=False):
            return True
        if not blocking:
            return False
        self._waiting.set()
        return self._inner.acquire(timeout=timeout)

    def release(self) -> None:
        self._inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_one_instance_shared_by_two_threads_updates_in_turn(client: PravegaClient, unique_name,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """An ingest's driver and its heartbeat thread share one synchronizer (and so its append
    connection and writer id). The interleaving that once broke it, crafted with hooks: thread A's
    conditional append is sent and answered but A has not read the answer yet when thread B
    updates. B must wait for A: before the fix B folded A's record, sent its own append on the same
    connection, took A's reply (an older request id) as its own answer and dropped the connection;
    A's append was then "in doubt", counted as written because B's later event number had landed,
    and A folded its update a second time and moved the revision backwards (in CI, into the middle
    of a record: "no valid event header")."""
    scope, stream = unique_name("sync"), "shared"
    sync = counter_sync(client, scope, stream)
    add_one(sync, "before")  # the append connection is set up
    a_answered, release_a, b_waits_or_done = threading.Event(), threading.Event(), threading.Event()
    sync._lock = _ReportingRLock(b_waits_or_done)  # reports B waiting for it (the fixed code's turn-taking)
    real_send = SegmentStoreConnection.send

    def send(conn: SegmentStoreConnection, cmd: wire.Command) -> None:
        real_send(conn, cmd)
        conditional = isinstance(cmd, (wire.ConditionalAppend, wire.ConditionalBlockEnd))
        if conditional and threading.current_thread().name == "A" and not a_answered.is_set():
            # The segment store has decided A's append (its reply is on the socket), unread yet.
            assert select.select([conn.sock], [], [], 60)[0], "A's conditional append was not answered"
            a_answered.set()
            assert release_a.wait(60)

    monkeypatch.setattr(SegmentStoreConnection, "send", send)
    errors: list[BaseException] = []

    def update(member: str, done: threading.Event | None = None) -> None:
        try:
            add_one(sync, member)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread below
            errors.append(exc)
        finally:
            if done is not None:
                done.set()

    a = threading.Thread(target=update, args=("a",), name="A")
    b = threading.Thread(target=update, args=("b", b_waits_or_done), name="B")
    a.start()
    assert a_answered.wait(60)
    b.start()
    assert b_waits_or_done.wait(60)  # B either waits for A (fixed) or already went through (not)
    release_a.set()
    a.join(60)
    b.join(60)
    assert not a.is_alive() and not b.is_alive()
    assert not errors, errors

    members = {"before", "a", "b"}
    assert sync.state == {"counter": 3, "members": sorted(members)}
    length = client.segments.get_segment_info(sync.segment).length
    assert sync.revision == length
    check_winners(client, scope, stream, sync.written_revisions, members)
    assert sync.fetch_updates() == counter_sync(client, scope, stream, create=False).fetch_updates()


def test_an_append_in_doubt_is_not_taken_as_written_when_a_later_event_number_landed(
        client: PravegaClient, unique_name, monkeypatch: pytest.MonkeyPatch) -> None:
    """An append whose reply was lost is resolved by its writer id's last event number after
    reconnecting. A later event number of the same writer id having landed says nothing about this
    one (that is how the unanswered append of one thread was once counted as written): an error,
    not a success."""
    scope, stream = unique_name("sync"), "doubt"
    sync = counter_sync(client, scope, stream)
    sync.fetch_updates()
    appender = sync._appender
    other = synchronizer._ConditionalAppender(client.segments, sync.segment)
    other.writer_id = appender.writer_id  # another user of the same writer id
    record = json.dumps({"t": "upd", "op": {"add": 1, "member": "mine"}}).encode()
    theirs = json.dumps({"t": "upd", "op": {"add": 1, "member": "theirs"}}).encode()
    real_call = SegmentStoreConnection.call
    lost: list[wire.Request] = []

    def call(conn: SegmentStoreConnection, request: wire.Request) -> wire.Reply:
        if isinstance(request, wire.ConditionalAppend) and request.writer_id == appender.writer_id and not lost:
            lost.append(request)  # never sent: the connection "breaks" first ...
            other._event_number = request.event_number  # ... while the same writer id's next event lands
            assert other.append(0, [theirs])
            raise SegmentStoreUnreachableError("connection lost (test)")
        return real_call(conn, request)

    monkeypatch.setattr(SegmentStoreConnection, "call", call)
    with pytest.raises(SegmentStoreError, match="cannot tell whether the conditional append"):
        appender.append(0, [record])
    assert lost and lost[0].event_number == 1
    assert [r["op"]["member"] for _, r in records_in_stream(client, scope, stream)] == ["theirs"]
    other.close()
