"""The triggers' serialize() round trips and their run() driven directly with asyncio, against the
embedded server: the transaction trigger fires after the commit (one controller call per poll per
pending transaction, without blocking the event loop), and the stream trigger fires exactly when
new events arrive, across scaling, in batches when asked, and resumes from the cut it last
announced without losing one to a crash."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from pravega_clients import stream_writer

from pravega_testing.shared_streams import StateStore

from airflow_provider_pravega._streams import find_new_data
from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.controller import ControllerClient
from airflow_provider_pravega.protocol.naming import qualified_segment_name
from airflow_provider_pravega.protocol.streamcut import streamcut_from_text


@pytest.fixture
def stream_of(client: PravegaClient, unique_name: Callable[[str], str]) -> Callable[[int], tuple[str, str]]:
    def make(segments: int = 1) -> tuple[str, str]:
        scope, stream = unique_name("trg"), unique_name("s")
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, stream, segments)
        return scope, stream

    return make


def write_events(controller_uri: str, scope: str, stream: str, count: int, *, key: str | None = None) -> int:
    """Write ``count`` events with the official client; returns their size in the segments."""
    writer = stream_writer(controller_uri, scope, stream)
    size = 0
    for i in range(count):
        payload = f"event-{i:05d}"
        writer.write_event(payload, routing_key=key or f"k{i}")
        size += 8 + len(payload)
    writer.flush()
    return size


def round_trip(trigger: Any) -> Any:
    """Rebuild a trigger the way Airflow does: serialize, store as a Trigger row, re-create."""
    from airflow.models.trigger import Trigger
    from airflow.sdk._shared.module_loading import import_string

    classpath, kwargs = trigger.serialize()
    json.dumps(kwargs)  # plain JSON, nothing Airflow-specific
    row = Trigger.from_object(trigger)
    assert row.classpath == classpath
    return import_string(classpath)(**row.kwargs)


# ------------------------------------------------------------------------------ serialization


def test_transaction_trigger_serialize_round_trip() -> None:
    from airflow_provider_pravega.triggers import PravegaTransactionTrigger

    trigger = PravegaTransactionTrigger(
        scope="sc", stream="st", transaction_ids=[5, "ab" * 16, {"txn_id": f"{7:032x}"}], pravega_conn_id="other",
        poll_interval=0.5, end_time=1_900_000_000.25,
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_pravega.triggers.transaction.PravegaTransactionTrigger"
    assert kwargs == {
        "scope": "sc", "stream": "st",
        "transaction_ids": [f"{5:032x}", "ab" * 16, f"{7:032x}"],
        "pravega_conn_id": "other", "poll_interval": 0.5, "end_time": 1_900_000_000.25,
    }
    assert round_trip(trigger).serialize() == (classpath, kwargs)


def test_stream_trigger_serialize_round_trip_and_stable_identity() -> None:
    from airflow.triggers.base import BaseEventTrigger

    from airflow_provider_pravega.triggers import PravegaStreamTrigger

    trigger = PravegaStreamTrigger(stream="orders", scope="shop", after_cut="head", poll_interval=2,
                                   min_bytes=1 << 20, min_events=1000, max_wait_s=300)
    assert isinstance(trigger, BaseEventTrigger)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_pravega.triggers.stream.PravegaStreamTrigger"
    assert (kwargs["min_bytes"], kwargs["min_events"], kwargs["max_wait_s"]) == (1 << 20, 1000, 300.0)
    again = round_trip(trigger)
    assert again.serialize() == (classpath, kwargs)
    # AssetWatcher triggers are identified by this hash: it must not change across a round trip.
    assert BaseEventTrigger.hash(*again.serialize()) == BaseEventTrigger.hash(classpath, kwargs)


# ------------------------------------------------------------------------ transaction trigger


def test_transaction_trigger_fires_after_the_commit_polling_only_pending(
    pravega_conn: None, client: PravegaClient, stream_of: Callable[[int], tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_provider_pravega.triggers import PravegaTransactionTrigger

    scope, stream = stream_of(2)
    done_before = client.transactions.begin(scope, stream).txn_id
    client.transactions.commit(scope, stream, done_before)
    waited_for = client.transactions.begin(scope, stream).txn_id

    # Count the controller calls, and make each take 0.3 s as on a slow network: if the trigger
    # made them on the event loop's thread, the ticker below would stall.
    calls: list[int] = []
    real_check = ControllerClient.check_transaction_state

    def slow_counted_check(self: ControllerClient, scope: str, stream: str, txn_id: int) -> Any:
        calls.append(txn_id)
        time.sleep(0.3)
        return real_check(self, scope, stream, txn_id)

    monkeypatch.setattr(ControllerClient, "check_transaction_state", slow_counted_check)
    trigger = PravegaTransactionTrigger(
        scope=scope, stream=stream, transaction_ids=[done_before, waited_for], poll_interval=0.1
    )

    async def scenario() -> tuple[Any, float, float, float]:
        gaps: list[float] = []

        async def ticker() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        events = trigger.run()
        first = asyncio.create_task(anext(events))
        await asyncio.sleep(1.5)
        assert not first.done(), "fired before the commit"
        committed_at = time.monotonic()
        await asyncio.to_thread(client.transactions.commit, scope, stream, waited_for)
        event = await asyncio.wait_for(first, 10)
        fired_at = time.monotonic()
        await events.aclose()
        tick.cancel()
        return event, committed_at, fired_at, max(gaps)

    event, committed_at, fired_at, worst_gap = asyncio.run(scenario())
    assert event.payload == {
        "status": "success", "scope": scope, "stream": stream,
        "committed": [f"{done_before:032x}", f"{waited_for:032x}"],
    }
    assert fired_at >= committed_at
    assert worst_gap < 0.2, f"the event loop stalled for {worst_gap:.3f} s"
    # The committed one was asked about once; the pending one once per poll until its commit.
    assert calls.count(done_before) == 1
    polls = calls.count(waited_for)
    assert 3 <= polls <= 10, polls


def test_transaction_trigger_error_and_timeout_events(
    pravega_conn: None, client: PravegaClient, stream_of: Callable[[int], tuple[str, str]]
) -> None:
    from airflow_provider_pravega.triggers import PravegaTransactionTrigger

    scope, stream = stream_of(1)
    aborted = client.transactions.begin(scope, stream).txn_id
    client.transactions.abort(scope, stream, aborted)
    still_open = client.transactions.begin(scope, stream).txn_id
    unknown = 0xDEAD_BEEF_0000_0001

    def first_event(**kwargs: Any) -> dict[str, Any]:
        trigger = PravegaTransactionTrigger(scope=scope, poll_interval=0.1, **kwargs)

        async def go() -> Any:
            events = trigger.run()
            try:
                return await asyncio.wait_for(anext(events), 10)
            finally:
                await events.aclose()

        return asyncio.run(go()).payload

    event = first_event(stream=stream, transaction_ids=[still_open, aborted])
    assert event["status"] == "error" and event["state"] == "ABORTED" and event["txn_id"] == f"{aborted:032x}"
    assert f"{aborted:032x}" in event["message"] and "ABORTED" in event["message"]

    event = first_event(stream=stream, transaction_ids=unknown)
    assert event["status"] == "error" and event["state"] == "UNKNOWN"

    started = time.monotonic()
    event = first_event(stream=stream, transaction_ids=still_open, end_time=time.time() + 0.6)
    assert event["status"] == "timeout" and event["pending"] == {f"{still_open:032x}": "OPEN"}
    assert time.monotonic() - started >= 0.5  # at its end_time, not before (wait_for above guards a hang)

    event = first_event(stream="no-such-stream", transaction_ids=still_open)
    assert event["status"] == "error" and "no-such-stream" in event["message"]
    client.transactions.abort(scope, stream, still_open)


# ----------------------------------------------------------------------------- stream trigger


def test_stream_trigger_fires_exactly_when_new_events_arrive(
    pravega_conn: None, pravega_controller_uri: str, client: PravegaClient,
    stream_of: Callable[[int], tuple[str, str]],
) -> None:
    from airflow_provider_pravega.triggers import PravegaStreamTrigger

    scope, stream = stream_of(2)
    old = write_events(pravega_controller_uri, scope, stream, 4)  # before the trigger: not new
    trigger = PravegaStreamTrigger(stream=stream, scope=scope, poll_interval=0.1)

    def tail_of(event: Any) -> dict[int, int]:
        return {int(k): v for k, v in event.payload["tail_positions"].items()}

    async def scenario() -> list[tuple[list[Any], float, float, int]]:
        events = trigger.run()
        seen = []
        try:
            for batch in (6, 3):
                pending = asyncio.create_task(anext(events))
                await asyncio.sleep(1.0)
                assert not pending.done(), f"fired with no new data: {pending.result() if pending.done() else ''}"
                written_at = time.monotonic()
                size = await asyncio.to_thread(write_events, pravega_controller_uri, scope, stream, batch)
                tail = await asyncio.to_thread(client.admin.tail, scope, stream)
                fired = [await asyncio.wait_for(pending, 10)]
                # A batch lands segment by segment: a poll between two segments' appends sees a part
                # of it, the next poll the rest. Each of those is new data; none may repeat a byte.
                while tail_of(fired[-1]) != tail:
                    fired.append(await asyncio.wait_for(anext(events), 10))
                seen.append((fired, written_at, time.monotonic(), size))
        finally:
            await events.aclose()
        return seen

    (first, w1, f1, size1), (second, w2, f2, size2) = asyncio.run(scenario())
    assert f1 >= w1 and f2 >= w2
    payloads = [event.payload for event in first + second]
    assert all(p["status"] == "success" and (p["scope"], p["stream"]) == (scope, stream) for p in payloads)
    assert sum(e.payload["new_bytes"] for e in first) == size1
    assert sum(e.payload["new_bytes"] for e in second) == size2
    assert sum(streamcut_from_text(payloads[0]["previous_cut"]).positions.values()) == old
    for before, after in zip(payloads, payloads[1:]):
        assert after["previous_cut"] == before["cut"]  # each event starts where the previous one ended
    end = streamcut_from_text(payloads[-1]["cut"]).positions
    assert sum(end.values()) == old + size1 + size2
    assert tail_of(second[-1]) == end
    grown = [(a, b) for e in second for a, b in e.payload["grown_segments"].values()]
    assert sum(b - a for a, b in grown) == size2


def test_new_data_is_found_across_scaling(
    pravega_controller_uri: str, client: PravegaClient, stream_of: Callable[[int], tuple[str, str]]
) -> None:
    """Data a segment received just before it was sealed by a scale, and data in successors."""
    scope, stream = stream_of(2)
    write_events(pravega_controller_uri, scope, stream, 10)
    seen = client.admin.tail(scope, stream)
    assert not find_new_data(client, scope, stream, seen)

    # "a" routes to a key below 0.5 (segment 0) for the official client; check rather than assume.
    size = write_events(pravega_controller_uri, scope, stream, 3, key="a")
    grown_segment = next(s for s, n in client.admin.tail(scope, stream).items() if n > seen[s])
    client.admin.split_segment(scope, stream, grown_segment, 2)
    found = find_new_data(client, scope, stream, seen)
    assert found.grown == {grown_segment: (seen[grown_segment], seen[grown_segment] + size)}
    assert grown_segment not in found.tail  # sealed by the scale, yet its last bytes were found

    seen = found.tail
    assert not find_new_data(client, scope, stream, seen)
    size = write_events(pravega_controller_uri, scope, stream, 5, key="a")
    found = find_new_data(client, scope, stream, seen)
    assert found.new_bytes == size and all(seg in found.tail for seg in found.grown)

    # From a cut taken before the scale: everything after it, in the sealed segment and successors.
    total_after = sum(client.admin.tail(scope, stream).values())
    before_scale = {s: n for s, n in client.admin.head(scope, stream).items()}
    found = find_new_data(client, scope, stream, before_scale)
    lengths = sum(b - a for a, b in found.grown.values())
    sealed_length = client.segments.get_segment_info(qualified_segment_name(scope, stream, grown_segment)).length
    assert lengths == total_after + sealed_length


async def until(condition: Callable[[], bool], what: str, timeout: float = 20) -> None:
    """Wait (without blocking the trigger's event loop) until ``condition()`` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.02)


def test_stream_trigger_saves_its_cut_only_after_the_triggerer_took_the_event(
    pravega_conn: None, pravega_controller_uri: str, stream_of: Callable[[int], tuple[str, str]]
) -> None:
    """At least once under an AssetWatcher: a triggerer that dies holding an event (the generator
    is closed where it yielded, never resumed) has not saved that event's cut, so the restarted
    trigger announces the same range again; once the triggerer came back for the next event the
    cut is saved, and the next start announces only what came after it."""
    from airflow_provider_pravega.triggers import PravegaStreamTrigger
    from airflow_provider_pravega.triggers.stream import STATE_KEY

    scope, stream = stream_of(1)
    store = StateStore()

    def watcher() -> PravegaStreamTrigger:  # from the head, unless a saved cut says otherwise
        trigger = PravegaStreamTrigger(stream=stream, scope=scope, after_cut="head", poll_interval=0.05)
        trigger.asset_state_store = store
        return trigger

    async def first_event(resume: bool) -> Any:
        events = watcher().run()
        try:
            event = await asyncio.wait_for(anext(events), 20)
            if resume:  # the triggerer took the event and asks for the next one
                following = asyncio.create_task(anext(events))
                await until(lambda: store.values[STATE_KEY] == event.payload["cut"], "the cut saved")
                assert not following.done()
                following.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await following
            return event.payload
        finally:
            await events.aclose()

    before = write_events(pravega_controller_uri, scope, stream, 3)  # before the first start: announced
    lost = asyncio.run(first_event(resume=False))
    assert sum(streamcut_from_text(lost["previous_cut"]).positions.values()) == 0 and lost["new_bytes"] == before
    assert store.values[STATE_KEY] == lost["previous_cut"], "the cut moved before the triggerer took the event"

    again = asyncio.run(first_event(resume=True))
    assert (again["previous_cut"], again["cut"], again["new_bytes"]) == (lost["previous_cut"], lost["cut"], before)
    # Written while no triggerer ran: the next start announces exactly these bytes, from the saved cut
    # (which wins over after_cut='head').
    missed = write_events(pravega_controller_uri, scope, stream, 7)
    resumed = asyncio.run(first_event(resume=False))
    assert resumed["previous_cut"] == again["cut"] and resumed["new_bytes"] == missed


@pytest.fixture
def polls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What each poll of a stream trigger found (its real ``find_new_data``, observed)."""
    from airflow_provider_pravega.triggers import stream as stream_module

    found: list[Any] = []
    real_find = stream_module.find_new_data

    def observed(*args: Any) -> Any:
        found.append(real_find(*args))
        return found[-1]

    monkeypatch.setattr(stream_module, "find_new_data", observed)
    return found


def test_stream_trigger_batches_a_busy_stream_until_min_bytes_or_max_wait_s(
    pravega_conn: None, pravega_controller_uri: str, stream_of: Callable[[int], tuple[str, str]], polls: list[Any]
) -> None:
    """Small appends seen by many polls make one event when min_bytes is reached, not one per poll;
    a smaller batch is announced once max_wait_s has passed since it was first seen (on the
    trigger's clock, which the test moves: nothing here depends on the machine's speed)."""
    from airflow_provider_pravega.triggers import PravegaStreamTrigger

    scope, stream = stream_of(1)
    size = 8 + len("event-00000")
    now = [1000.0]
    trigger = PravegaStreamTrigger(stream=stream, scope=scope, poll_interval=0.02, min_bytes=5 * size, max_wait_s=60)
    trigger._clock = lambda: now[0]
    writer = stream_writer(pravega_controller_uri, scope, stream)

    def write(i: int) -> None:
        writer.write_event(f"event-{i:05d}", routing_key="k")
        writer.flush()

    async def append(i: int, batched: int) -> None:
        """Event ``i``, then two polls that found the ``batched`` events after the last announced
        cut (so the first poll's verdict is in)."""
        mark = len(polls)
        await asyncio.to_thread(write, i)
        await until(lambda: [f.new_bytes for f in polls[mark:]].count(batched * size) >= 2, f"polls of {batched}")

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        events = trigger.run()
        try:
            pending = asyncio.create_task(anext(events))
            await until(lambda: bool(polls), "watching from the tail")
            for i in range(4):
                await append(i, batched=i + 1)
                assert not pending.done(), f"fired with {i + 1} of 5 events' bytes"
            await asyncio.to_thread(write, 4)
            batch = (await asyncio.wait_for(pending, 20)).payload
            pending = asyncio.create_task(anext(events))
            await append(5, batched=1)
            assert not pending.done(), "a batch below min_bytes fired before max_wait_s"
            now[0] += 60
            small = (await asyncio.wait_for(pending, 20)).payload
            return batch, small
        finally:
            await events.aclose()

    batch, small = asyncio.run(scenario())
    assert len(polls) > 10  # many polls saw the stream grow ...
    assert batch["new_bytes"] == 5 * size  # ... and one event announced all of it
    assert sum(streamcut_from_text(batch["previous_cut"]).positions.values()) == 0
    assert small["previous_cut"] == batch["cut"] and small["new_bytes"] == size


def test_stream_trigger_counts_events_for_min_events(
    monkeypatch: pytest.MonkeyPatch, pravega_controller_uri: str, stream_of: Callable[[int], tuple[str, str]],
    polls: list[Any],
) -> None:
    """min_events counts the events after the last announced cut, over several segments and each
    event once across polls (3 events wait; 2 more make the 5), on every backend."""
    from airflow_provider_pravega.triggers import PravegaStreamTrigger

    host, port = pravega_controller_uri.rsplit("//", 1)[1].rsplit(":", 1)
    monkeypatch.setenv("AIRFLOW_CONN_PRAVEGA_DEFAULT", json.dumps({"conn_type": "pravega", "host": host,
                                                                   "port": int(port)}))
    scope, stream = stream_of(2)
    trigger = PravegaStreamTrigger(stream=stream, scope=scope, after_cut="head", poll_interval=0.02, min_events=5)

    async def scenario() -> tuple[Any, int]:
        events = trigger.run()
        try:
            pending = asyncio.create_task(anext(events))
            first = await asyncio.to_thread(write_events, pravega_controller_uri, scope, stream, 3)
            mark = len(polls)
            await until(lambda: [f.new_bytes for f in polls[mark:]].count(first) >= 2, "polls of 3 events")
            assert not pending.done(), "fired with 3 of 5 events"
            assert len(polls[-1].grown) == 2  # the events went to both segments
            more = await asyncio.to_thread(write_events, pravega_controller_uri, scope, stream, 2)
            return await asyncio.wait_for(pending, 20), first + more
        finally:
            await events.aclose()

    event, size = asyncio.run(scenario())
    assert event.payload["new_events"] == 5 and event.payload["new_bytes"] == size


def test_stream_trigger_in_an_asset_watcher_is_registered_by_dag_parsing(unique_name: Callable[[str], str]) -> None:
    """A DAG scheduled on an asset watched by the stream trigger parses, serializes, and its
    trigger is stored by Airflow's DAG-parsing code the way the triggerer will load it."""
    from airflow import settings
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.models.trigger import Trigger
    from airflow.sdk import DAG, Asset, AssetWatcher, task
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.db import initdb
    from airflow.utils.session import create_session
    from sqlalchemy import inspect, select

    from airflow_provider_pravega.triggers import PravegaStreamTrigger

    stream = unique_name("orders")
    trigger = PravegaStreamTrigger(scope="shop", stream=stream, poll_interval=30)
    orders = Asset(f"pravega://controller:9090/shop/{stream}", watchers=[AssetWatcher(name="orders_tail", trigger=trigger)])
    with DAG(unique_name("on-new-orders"), schedule=[orders], is_paused_upon_creation=False) as dag:

        @task
        def handle() -> None: ...

        handle()

    if not inspect(settings.engine).has_table("task_instance"):
        initdb()
    with create_session() as session:
        DagBundlesManager().sync_bundles_to_db(session=session)
    with create_session() as session:
        update_dag_parsing_results_in_db(
            "dags-folder", None, [LazyDeserializedDAG.from_dag(dag)], {}, None, set(), session=session
        )
    with create_session() as session:
        rows = session.scalars(
            select(Trigger).where(Trigger.classpath == "airflow_provider_pravega.triggers.stream.PravegaStreamTrigger")
        ).all()
        stored = [row.kwargs for row in rows if row.kwargs.get("stream") == stream]
    assert stored == [trigger.serialize()[1]]


# ------------------------------------------------------------------ stream trigger robustness


class _TriggerLog:
    """The trigger's log lines (Airflow renders them to the console; captured by pytest)."""

    def __init__(self, capfd: pytest.CaptureFixture[str]) -> None:
        self._capfd = capfd
        self._text = ""

    @property
    def lines(self) -> list[str]:
        captured = self._capfd.readouterr()
        self._text += captured.out + captured.err
        return [line for line in self._text.splitlines() if "triggers.stream" in line]

    def matching(self, text: str) -> list[str]:
        return [line for line in self.lines if text in line]


@pytest.fixture
def trigger_log(capfd: pytest.CaptureFixture[str]) -> _TriggerLog:
    capfd.readouterr()
    return _TriggerLog(capfd)


def test_stream_trigger_waits_for_a_missing_scope_and_stream_then_announces_from_the_head(
    pravega_conn: None, pravega_controller_uri: str, client: PravegaClient, unique_name: Callable[[str], str],
    trigger_log: _TriggerLog,
) -> None:
    """Started before its scope exists (an event-driven DAG unpaused early): no crash, one log line
    per condition, and with after_cut='head' the first event covers data written before the
    trigger could first read the stream."""
    from airflow_provider_pravega.triggers import PravegaStreamTrigger

    scope, stream = unique_name("late"), unique_name("s")
    trigger = PravegaStreamTrigger(stream=stream, scope=scope, after_cut="head", poll_interval=0.1,
                                   max_retry_interval=0.4)

    async def scenario() -> tuple[Any, int]:
        events = trigger.run()
        try:
            pending = asyncio.create_task(anext(events))
            await asyncio.sleep(2.0)  # several retries while the scope is missing
            assert not pending.done(), pending.exception() if pending.done() else None
            await asyncio.to_thread(client.admin.create_scope, scope)
            await asyncio.sleep(1.5)  # several retries while the stream is missing
            assert not pending.done(), pending.exception() if pending.done() else None
            await asyncio.to_thread(client.admin.create_stream, scope, stream, 2)
            size = await asyncio.to_thread(write_events, pravega_controller_uri, scope, stream, 5)
            return await asyncio.wait_for(pending, 20), size
        finally:
            await events.aclose()

    event, size = asyncio.run(scenario())
    payload = event.payload
    assert payload["status"] == "success" and payload["new_bytes"] == size
    assert sum(streamcut_from_text(payload["previous_cut"]).positions.values()) == 0  # from the head
    assert len(trigger_log.matching(f"scope {scope!r} does not exist")) == 1
    assert len(trigger_log.matching(f"stream {scope}/{stream} does not exist")) == 1
    assert len(trigger_log.matching(f"Watching {scope}/{stream}")) == 1


def test_stream_trigger_rides_out_a_server_restart(
    monkeypatch: pytest.MonkeyPatch, pravega_embedded_factory: Callable[..., Any], unique_name: Callable[[str], str],
    trigger_log: _TriggerLog,
) -> None:
    """The controller goes away while the trigger watches: it logs that once, retries with backoff,
    and when the server is back it announces exactly the data written after the restart."""
    from airflow_provider_pravega.triggers import PravegaStreamTrigger

    server = pravega_embedded_factory()
    uri = server.controller_uri
    host, port = uri.rsplit("//", 1)[1].rsplit(":", 1)
    monkeypatch.setenv("AIRFLOW_CONN_PRAVEGA_DEFAULT", json.dumps({"conn_type": "pravega", "host": host,
                                                                   "port": int(port)}))
    scope, stream = unique_name("restart"), unique_name("s")
    with PravegaClient(uri) as admin:
        admin.admin.create_scope(scope)
        admin.admin.create_stream(scope, stream, 1)
    before = write_events(uri, scope, stream, 3)
    trigger = PravegaStreamTrigger(stream=stream, scope=scope, poll_interval=0.1, max_retry_interval=0.5)

    async def scenario() -> tuple[Any, int]:
        events = trigger.run()
        try:
            pending = asyncio.create_task(anext(events))
            await asyncio.sleep(1.0)  # watching from the tail
            await asyncio.to_thread(server.stop)
            await asyncio.sleep(3.0)  # many polls against a dead server
            assert not pending.done(), pending.exception() if pending.done() else None
            await asyncio.to_thread(server.restart)
            size = await asyncio.to_thread(write_events, uri, scope, stream, 4)
            return await asyncio.wait_for(pending, 30), size
        finally:
            await events.aclose()

    event, size = asyncio.run(scenario())
    payload = event.payload
    assert payload["new_bytes"] == size
    assert sum(streamcut_from_text(payload["previous_cut"]).positions.values()) == before
    waits = trigger_log.matching("Cannot watch")
    assert 1 <= len(waits) <= 2, waits  # the controller (and perhaps the segment store) went away: once each
    assert len(trigger_log.matching(f"Watching {scope}/{stream}")) == 2  # started, then back after the restart


def test_stream_trigger_refuses_a_bad_start_when_built() -> None:
    from airflow_provider_pravega.client.errors import InvalidStreamCutError
    from airflow_provider_pravega.triggers import PravegaStreamTrigger

    with pytest.raises(InvalidStreamCutError, match="after_cut"):
        PravegaStreamTrigger(scope="iot", stream="readings", after_cut="yesterday")
    with pytest.raises(ValueError, match="poll_interval"):
        PravegaStreamTrigger(scope="iot", stream="readings", poll_interval=0)
    for bad, error, message in (
        ({"min_bytes": -1}, ValueError, "min_bytes must be 0"),
        ({"min_events": "100"}, TypeError, "min_events must be an integer.*str '100'"),
        ({"min_bytes": 1.5}, TypeError, "min_bytes must be an integer"),
        ({"min_events": True}, TypeError, "min_events must be an integer"),
        ({"min_bytes": 10, "max_wait_s": 0}, ValueError, "max_wait_s must be a positive"),
        ({"min_bytes": 10, "max_wait_s": float("nan")}, ValueError, "max_wait_s must be a positive"),
        ({"min_bytes": 10, "max_wait_s": "60"}, TypeError, "max_wait_s must be a number"),
        ({"max_wait_s": 60}, ValueError, "neither is set"),
    ):
        with pytest.raises(error, match=message):
            PravegaStreamTrigger(scope="iot", stream="readings", **bad)


def test_stream_trigger_on_an_airflow_without_shared_streams_keeps_its_own_poll() -> None:
    """Airflow 3.2 has no ``airflow.triggers.shared_stream``: the trigger imports, says so, and runs
    ``run`` (no shared_stream_key) even under an AssetWatcher; the real module blocked in a fresh
    interpreter stands for 3.2's."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys
        sys.modules["airflow.triggers.shared_stream"] = None  # ImportError, as on Airflow 3.2
        from airflow_provider_pravega.triggers import stream
        trigger = stream.PravegaStreamTrigger(stream="readings", scope="iot")
        trigger.asset_state_store = object()
        print(stream.SHARED_STREAMS, trigger.shared_stream_key(), stream._StreamPoller.__mro__[1].__name__)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "None", "object"], done.stdout
