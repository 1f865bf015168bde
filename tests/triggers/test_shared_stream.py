"""The stream trigger on Airflow 3.3's shared streams, driven by Airflow's own ``SharedStreamManager``
(the triggerer's part that fans one poll out and gates the producer's ``advance`` on persisted
events, ``pravega_testing/shared_streams.py``) against an in-process embedded server whose
controller counts the calls it serves. The test confirms events stored when it says so, as the
triggerer's supervisor does; a crash is the manager stopped without that confirmation.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("airflow.triggers.shared_stream", reason="shared streams need Airflow 3.3")

from pravega_testing.shared_streams import SharedStreamTriggerer, StateStore  # noqa: E402

from airflow_provider_pravega.client import PravegaClient  # noqa: E402
from airflow_provider_pravega.protocol.streamcut import streamcut_from_text  # noqa: E402
from airflow_provider_pravega.triggers import PravegaStreamTrigger  # noqa: E402
from airflow_provider_pravega.triggers.stream import STATE_KEY  # noqa: E402


@pytest.fixture
def stream(counted_server: Any, monkeypatch: pytest.MonkeyPatch, unique_name: Callable[[str], str]
           ) -> Iterator[tuple[str, str, PravegaClient]]:
    """A new one-segment stream, ``pravega_default`` pointed at the server, and a client to write."""
    host, port = counted_server.controller_uri.rsplit("//", 1)[1].rsplit(":", 1)
    monkeypatch.setenv("AIRFLOW_CONN_PRAVEGA_DEFAULT", json.dumps({"conn_type": "pravega", "host": host,
                                                                   "port": int(port)}))
    scope, name = unique_name("shr"), unique_name("s")
    with PravegaClient(counted_server.controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, name, 1)
        yield scope, name, client


def write(client: PravegaClient, scope: str, stream: str, count: int) -> int:
    """Write ``count`` events; returns their size in the segment."""
    payloads = [f"event-{i:05d}".encode() for i in range(count)]
    with client.event_writer(scope, stream) as writer:
        writer.write_events(payloads)
        writer.flush()
    return sum(8 + len(p) for p in payloads)


def watcher(scope: str, stream: str, store: StateStore, **kwargs: Any) -> PravegaStreamTrigger:
    trigger = PravegaStreamTrigger(stream=stream, scope=scope, after_cut="head", poll_interval=0.05, **kwargs)
    trigger.asset_state_store = store
    return trigger


async def until(condition: Callable[[], Any], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.02)


def offset(cut: str) -> int:
    return sum(streamcut_from_text(cut).positions.values())


def test_watchers_of_one_stream_share_one_poll_and_save_cuts_only_once_their_events_are_persisted(
    stream: tuple[str, str, PravegaClient], counted_server: Any
) -> None:
    scope, name, client = stream
    stores = [StateStore() for _ in range(3)]
    calls = counted_server.controller.rpc_calls

    async def scenario() -> None:
        triggerer = SharedStreamTriggerer()
        for n, store in enumerate(stores):
            triggerer.watch(n, watcher(scope, name, store))
        await until(lambda: all(STATE_KEY in s.values for s in stores), "every watcher pinned its start")
        head = stores[0].values[STATE_KEY]
        assert len(triggerer.manager._groups) == 1
        # Steady state: the controller serves one call per poll, for all three watchers.
        polls, served = triggerer.polls(), sum(calls.values())
        await until(lambda: triggerer.polls() >= polls + 20, "20 more polls")
        assert sum(calls.values()) - served <= triggerer.polls() - polls + 1, dict(calls)

        size = write(client, scope, name, 3)
        await until(lambda: all(triggerer.of(n) for n in range(3)), "an event for every watcher")
        for n in range(3):
            (event,) = triggerer.of(n)
            assert (event["previous_cut"], event["new_bytes"]) == (head, size)
        cut = triggerer.of(0)[0]["cut"]
        # Taken by the triggerer, not persisted: polls go on, no cut moves.
        polls = triggerer.polls()
        await until(lambda: triggerer.polls() >= polls + 5, "5 more polls")
        assert [s.values[STATE_KEY] for s in stores] == [head] * 3
        # Persisted for two watchers: still nothing saved (the poll waits for all three).
        triggerer.persist(0)
        triggerer.persist(1)
        polls = triggerer.polls()
        await until(lambda: triggerer.polls() >= polls + 5, "5 more polls")
        assert [s.values[STATE_KEY] for s in stores] == [head] * 3
        triggerer.persist(2)
        await until(lambda: all(s.values[STATE_KEY] == cut for s in stores), "every cut saved")
        assert all(len(triggerer.of(n)) == 1 for n in range(3))  # announced once
        await triggerer.crash()

    asyncio.run(scenario())


def test_a_range_whose_event_was_not_persisted_is_announced_again_and_the_next_is_contiguous(
    stream: tuple[str, str, PravegaClient],
) -> None:
    scope, name, client = stream
    store = StateStore()

    async def life(persist: bool) -> dict[str, Any]:
        triggerer = SharedStreamTriggerer()
        triggerer.watch(0, watcher(scope, name, store))
        await until(lambda: triggerer.of(0), "an event")
        (event,) = triggerer.of(0)
        if persist:
            triggerer.persist(0)
            await until(lambda: store.values[STATE_KEY] == event["cut"], "the cut saved")
        await triggerer.crash()
        return event

    first = write(client, scope, name, 2)
    lost = asyncio.run(life(persist=False))  # killed before the persist: nothing saved
    assert lost["new_bytes"] == first and offset(store.values[STATE_KEY]) == 0
    more = write(client, scope, name, 4)
    again = asyncio.run(life(persist=True))  # the range again, with what came meanwhile
    assert again["previous_cut"] == lost["previous_cut"] and again["new_bytes"] == first + more
    later = write(client, scope, name, 1)
    following = asyncio.run(life(persist=True))
    assert following["previous_cut"] == again["cut"] and following["new_bytes"] == later


def test_watchers_with_different_batching_share_one_poll(stream: tuple[str, str, PravegaClient]) -> None:
    """Any data, min_events=5, and min_bytes out of reach with max_wait_s (on a clock the test
    moves): each watcher batches from its own cut, on one poll."""
    scope, name, client = stream
    stores = [StateStore() for _ in range(3)]
    now = [0.0]
    waiting = watcher(scope, name, stores[2], min_bytes=10**9, max_wait_s=60)
    waiting._clock = lambda: now[0]

    async def scenario() -> None:
        triggerer = SharedStreamTriggerer()
        triggerer.watch(0, watcher(scope, name, stores[0]))
        triggerer.watch(1, watcher(scope, name, stores[1], min_events=5))
        triggerer.watch(2, waiting)
        await until(lambda: all(STATE_KEY in s.values for s in stores), "every watcher pinned its start")
        head = stores[0].values[STATE_KEY]
        assert len(triggerer.manager._groups) == 1
        three = write(client, scope, name, 3)
        await until(lambda: triggerer.of(0), "the any-data watcher's event")
        triggerer.persist(0)
        await until(lambda: stores[0].values[STATE_KEY] == triggerer.of(0)[0]["cut"], "its cut saved")
        assert not triggerer.of(1) and not triggerer.of(2)
        assert stores[1].values[STATE_KEY] == stores[2].values[STATE_KEY] == head
        two = write(client, scope, name, 2)
        await until(lambda: len(triggerer.of(0)) == 2 and triggerer.of(1), "the second and the min_events event")
        (batched,) = triggerer.of(1)
        assert (batched["previous_cut"], batched["new_events"], batched["new_bytes"]) == (head, 5, three + two)
        assert triggerer.of(0)[1]["previous_cut"] == triggerer.of(0)[0]["cut"]  # contiguous
        assert not triggerer.of(2)
        now[0] += 61  # max_wait_s over: the next poll announces what waited
        await until(lambda: triggerer.of(2), "the max_wait_s event")
        (waited,) = triggerer.of(2)
        assert (waited["previous_cut"], waited["new_bytes"]) == (head, three + two)
        for n in range(3):
            triggerer.persist(n)
        await until(lambda: all(s.values[STATE_KEY] == triggerer.of(n)[-1]["cut"] for n, s in enumerate(stores)),
                    "every last cut saved")
        await triggerer.crash()

    asyncio.run(scenario())


def test_airflow_3_2_a_deferring_sensor_and_a_trigger_outside_a_watcher_keep_their_own_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_provider_pravega.triggers import stream as stream_module

    shared = watcher("iot", "readings", StateStore())
    assert shared.shared_stream_key() == ("pravega-stream", "pravega_default", None, "iot", "readings", 0.05, 60.0)
    assert PravegaStreamTrigger(stream="readings", scope="iot").shared_stream_key() is None  # no asset store
    sensor = watcher("iot", "readings", StateStore(), end_time=time.time() + 60)
    assert sensor.shared_stream_key() is None
    monkeypatch.setattr(stream_module, "SHARED_STREAMS", False)  # what Airflow 3.2 imports to
    assert shared.shared_stream_key() is None


def test_the_pravega_message_queue_trigger_runs_as_the_shared_stream_trigger() -> None:
    pytest.importorskip("airflow.providers.common.messaging")
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
    from airflow.sdk._shared.module_loading import import_string

    queue = MessageQueueTrigger(scheme="pravega", scope="iot", stream="readings", poll_interval=0.05)
    classpath, kwargs = queue.serialize()  # what the triggerer runs: the stream trigger itself
    assert classpath == "airflow_provider_pravega.triggers.stream.PravegaStreamTrigger"
    stored = import_string(classpath)(**kwargs)
    stored.asset_state_store = StateStore()
    assert stored.shared_stream_key() == watcher("iot", "readings", StateStore()).shared_stream_key()
    assert "create_shared_stream_producer" in vars(type(stored))  # ack mode


def test_a_trigger_queue_name_is_no_pravega_queue_uri() -> None:
    """common.messaging 2.2 reads ``queue=`` beside ``scheme=`` as a trigger queue unless a
    provider's ``queue_matches`` claims it as its broker URI: only a ``pravega://`` URI is ours."""
    pytest.importorskip("airflow.providers.common.messaging")
    from airflow_provider_pravega.messaging import PravegaMessageQueueProvider

    provider = PravegaMessageQueueProvider()
    assert provider.queue_matches("pravega://ctrl:9090/iot/readings")
    assert provider.queue_matches("PRAVEGA://ctrl/iot/readings")
    for name in ("default", "pravega", "pravega-watchers", "kafka://broker/topic"):
        assert not provider.queue_matches(name), name


def test_a_poll_a_watcher_failed_on_saves_no_cut_and_the_others_save_with_their_next_event(
    stream: tuple[str, str, PravegaClient],
) -> None:
    """Watcher 1's event is never confirmed stored: Airflow's ack timeout fails it, and the poll
    both announced from saves neither cut; watcher 0's next event (contiguous with its first)
    saves its cut, watcher 1's store still holds its start, where a restart of it begins."""
    from airflow.triggers.shared_stream import AckTimeout

    scope, name, client = stream
    stores = [StateStore(), StateStore()]

    async def scenario() -> None:
        triggerer = SharedStreamTriggerer(ack_timeout=1.0)
        triggerer.watch(0, watcher(scope, name, stores[0]))
        triggerer.watch(1, watcher(scope, name, stores[1], sample_events=1))
        await until(lambda: all(STATE_KEY in s.values for s in stores), "both watchers pinned their start")
        head = stores[0].values[STATE_KEY]
        write(client, scope, name, 2)
        await until(lambda: triggerer.of(0) and triggerer.of(1), "both events")
        triggerer.persist(0)
        await until(lambda: triggerer.failed(1) is not None, "watcher 1 failed by the ack timeout")
        assert isinstance(triggerer.failed(1), AckTimeout)
        assert [s.values[STATE_KEY] for s in stores] == [head, head]
        write(client, scope, name, 1)
        await until(lambda: len(triggerer.of(0)) == 2, "watcher 0's next event")
        first, second = triggerer.of(0)
        assert second["previous_cut"] == first["cut"]
        triggerer.persist(0)
        await until(lambda: stores[0].values[STATE_KEY] == second["cut"], "watcher 0's cut saved")
        assert stores[1].values[STATE_KEY] == head
        await triggerer.crash()

    asyncio.run(scenario())
