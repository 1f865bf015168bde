"""An event trigger that fires when new data arrives in a Pravega stream.

Usable two ways:

* with ``AssetWatcher``, so that a DAG runs whenever the stream's tail moves (event-driven
  scheduling; the trigger keeps running and fires once per poll that finds enough new data);
* by :class:`~airflow_provider_pravega.sensors.stream.PravegaStreamSensor` in deferrable mode
  (the first event resumes the sensor).

"New data" is judged segment by segment against the last announced cut, across scaling (see
``find_new_data``): a segment's larger offset, data in a successor segment, or data a sealed
predecessor received before the scale. ``min_bytes`` / ``min_events`` / ``max_wait_s`` gather it
into batches (``Batching``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.fault_points import reached as crash_point
from airflow_provider_pravega._streams import (
    Batching,
    NewData,
    PendingBatch,
    cut_text,
    find_new_data,
    new_data_at,
    parse_stream_cut,
    resolve_scope,
)
from airflow_provider_pravega.client.errors import (
    ControllerUnreachableError,
    PravegaTLSError,
    ScopeNotFoundError,
    SegmentStoreUnreachableError,
    StreamNotFoundError,
)

try:  # Airflow 3.3: one poll per stream for all its watchers, the cut saved once the event is persisted
    from airflow.triggers.shared_stream import SharedStreamProducer
except ImportError:  # Airflow 3.2: each watcher polls on its own (run())
    SharedStreamProducer = None  # type: ignore[assignment,misc]

__all__ = ["SHARED_STREAMS", "PravegaStreamTrigger", "StreamPoll"]

#: Whether this Airflow runs the watchers of one stream on one shared poll in ack mode.
SHARED_STREAMS = SharedStreamProducer is not None

#: Key under which an AssetWatcher's trigger keeps its last seen cut in Airflow's asset state store.
STATE_KEY = "pravega_last_seen_cut"
#: Conditions that may end by themselves (the stream is created, the server comes back): waited out.
_RETRIED = (
    ControllerUnreachableError,
    SegmentStoreUnreachableError,
    ScopeNotFoundError,
    StreamNotFoundError,
    ConnectionError,
    TimeoutError,
)


class PravegaStreamTrigger(BaseEventTrigger):
    """Fires ``{"status": "success", "previous_cut", "cut", ...}`` each time enough new data follows
    the last cut it announced.

    :param stream: The stream to watch.
    :param scope: Its scope (default: the connection's default scope).
    :param pravega_conn_id: The ``pravega`` connection.
    :param after_cut: Where the watch starts when it has no saved cut: ``"tail"`` (the default:
        only data written after the first successful start), ``"head"`` (everything in the stream,
        including what was written before the trigger first started) or a stream-cut text. When
        run by an AssetWatcher, the last cut it announced is kept in Airflow's asset state store and
        wins over ``after_cut``, so a restarted triggerer carries on from there.
    :param poll_interval: Seconds between polls (one controller call plus one segment-store call
        per segment each).
    :param end_time: Epoch seconds after which the trigger gives up with one ``timeout`` event
        (for a deferring sensor). None (the default, for AssetWatcher): watch forever.
    :param max_retry_interval: Longest wait, in seconds, between retries while the scope or stream
        does not exist or the controller or segment store cannot be reached. Retries start at
        ``min(poll_interval, 1)`` seconds and double; each change of condition is logged once.
    :param controller: ``host:port`` of the controller, instead of the connection's (credentials
        and TLS still come from the connection); set from a ``pravega://`` queue URI.
    :param sample_events: Put up to this many of the new events (UTF-8 text) in each event's
        ``sample``; 0 (the default) reads no event data.
    :param min_bytes: Fire only once the data after the last announced cut holds this many bytes
        (segment bytes, event headers included); 0 (the default): no minimum.
    :param min_events: Fire only once it holds this many events (counted by reading the new data
        once); 0 (the default): no minimum. With both minimums, whichever is reached first.
    :param max_wait_s: With a minimum set, fire anyway this many seconds after new data was first
        seen, if the minimums are not reached by then. None (the default): wait for the minimums.

    Each event carries ``previous_cut`` and ``cut`` (Pravega texts: export exactly the new data
    between them), ``tail_positions``, ``grown_segments`` ({segment: [from, to]}), ``new_bytes``
    and, with ``min_events``, ``new_events``.

    Delivery (docs/sensors-triggers.md has the diagram): no range is ever skipped, and the ranges of
    one watcher's consecutive events are contiguous (each ``previous_cut`` is the last ``cut``).

    * Airflow 3.3 (``SHARED_STREAMS``), under an AssetWatcher: the watchers of one stream (same
      connection, controller, scope, stream, poll and retry intervals: ``shared_stream_key``) share
      one poll per interval, each judging the tail against its own last cut with its own batching.
      A watcher's cut is saved only once the triggerer confirmed its asset event persisted in the
      metadata database (ack mode): a range is announced again only when the triggerer died before
      that save, and was persisted only if it died between persisting and saving.
    * Airflow 3.2 (and a deferring sensor): the trigger polls on its own (``run``). Airflow 3.2 has
      no asset state store: the cut is kept in memory and a restarted triggerer starts at
      ``after_cut`` again (``"head"``: every range again; ``"tail"``: what was written while it was
      down is not announced). With a store but no shared stream (``shared_stream_key`` failed),
      ``run`` saves the cut once the triggerer has taken the event and a poll interval has passed:
      a guess at when the event is persisted.

    A DAG that runs when new events arrive::

        from airflow.sdk import DAG, Asset, AssetWatcher, task
        from airflow_provider_pravega.triggers import PravegaStreamTrigger

        orders = Asset(
            "pravega://controller:9090/shop/orders",
            watchers=[AssetWatcher(name="orders_tail",
                                   trigger=PravegaStreamTrigger(scope="shop", stream="orders", after_cut="head",
                                                                poll_interval=30))],
        )

        with DAG("on_new_orders", schedule=[orders]):

            @task
            def new_range(**context):
                events = context["triggering_asset_events"][orders]  # in order; one run may get several
                return events[0].extra["payload"]["previous_cut"], events[-1].extra["payload"]["cut"]

            new_range()
    """

    def __init__(
        self,
        *,
        stream: str,
        scope: str | None = None,
        pravega_conn_id: str = "pravega_default",
        after_cut: str | None = "tail",
        poll_interval: float = 10.0,
        end_time: float | None = None,
        max_retry_interval: float = 60.0,
        controller: str | None = None,
        sample_events: int = 0,
        min_bytes: int = 0,
        min_events: int = 0,
        max_wait_s: float | None = None,
    ) -> None:
        super().__init__()
        self.stream = stream
        self.scope = scope
        self.pravega_conn_id = pravega_conn_id
        self.after_cut = "tail" if after_cut is None else after_cut
        self.poll_interval = float(poll_interval)
        self.end_time = None if end_time is None else float(end_time)
        self.max_retry_interval = float(max_retry_interval)
        self.controller = controller or None
        self.sample_events = int(sample_events)
        if self.sample_events < 0:
            raise ValueError(f"sample_events must be 0 or more, got {sample_events}")
        if self.poll_interval <= 0 or self.max_retry_interval <= 0:
            raise ValueError(
                f"poll_interval ({poll_interval}) and max_retry_interval ({max_retry_interval}) must be positive"
            )
        self.batching = Batching(min_bytes, min_events, max_wait_s)
        if scope:  # a bad start is a DAG author's mistake: say so when the DAG is parsed
            parse_stream_cut(self.after_cut, scope, stream, "after_cut")
        self._condition: str | None = None
        self._clock = time.monotonic  # times max_wait_s; tests drive their own

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "stream": self.stream,
                "scope": self.scope,
                "pravega_conn_id": self.pravega_conn_id,
                "after_cut": self.after_cut,
                "poll_interval": self.poll_interval,
                "end_time": self.end_time,
                "max_retry_interval": self.max_retry_interval,
                "controller": self.controller,
                "sample_events": self.sample_events,
                "min_bytes": self.batching.min_bytes,
                "min_events": self.batching.min_events,
                "max_wait_s": self.batching.max_wait_s,
            },
        )

    # ------------------------------------------------------------------------------- state

    async def _stored_cut(self) -> str | None:
        """The last reported cut from the asset state store (only when run by an AssetWatcher)."""
        store = getattr(self, "asset_state_store", None)
        if store is None:
            return None
        try:
            value = await store.aget(STATE_KEY)
        except Exception as exc:  # noqa: BLE001 - a store error must not stop the watch; kwargs still give a start
            self.log.warning("Cannot read the last seen cut from the asset state store (starting at after_cut=%r): %s",
                             self.after_cut, exc)
            return None
        return value if isinstance(value, str) and value else None

    async def _store_cut(self, text: str) -> bool:
        """Save ``text`` as the last announced cut (only when run by an AssetWatcher); False if that failed."""
        store = getattr(self, "asset_state_store", None)
        return True if store is None else await _save_cut(store, text, self.log)

    def _enter(self, condition: str, level: int, message: str, *args: Any) -> None:
        """Log ``message`` only when the watch's condition changes (not on every retry)."""
        if condition != self._condition:
            self._condition = condition
            self.log.log(level, message, *args)

    def _retry_delay(self, failures: int) -> float:
        return min(self.max_retry_interval, min(self.poll_interval, 1.0) * 2 ** min(failures - 1, 30))

    # --------------------------------------------------------------------------------- run

    async def _connection(self) -> tuple[Any, str]:
        """(client settings, scope) from the connection, the ``controller`` override and ``scope``."""
        # import cost: the hook brings gRPC; DAG files import this trigger (messaging's AssetWatcher)
        from airflow_provider_pravega.hooks.pravega import PravegaHook

        conn = await PravegaHook.aget_connection(self.pravega_conn_id)
        config = PravegaHook.config_from_connection(conn)
        if self.controller:
            config = _with_controller(config, self.controller)
        scope = resolve_scope(self.scope, config, self.pravega_conn_id)
        parse_stream_cut(self.after_cut, scope, self.stream, "after_cut")
        return config, scope

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Airflow 3.2's path (and a deferring sensor's): this trigger's own poll loop."""
        config, scope = await self._connection()
        where = f"{scope}/{self.stream}"
        client = PravegaClient(config)
        previous: dict[int, int] | None = None  # the last announced cut
        unsaved: str | None = None  # ... as text, when the triggerer has taken its event but it is not saved yet
        batch = PendingBatch(self.batching, self._clock)
        failures = 0
        try:
            while True:
                try:
                    if previous is None:  # not started yet: the saved cut, else after_cut
                        start = await self._stored_cut() or self.after_cut
                        previous = await self._start_positions(client, scope, start)
                        await self._store_cut(cut_text(scope, self.stream, previous))
                    elif unsaved is not None and await self._store_cut(unsaved):
                        unsaved = None
                    found: NewData = await asyncio.to_thread(find_new_data, client, scope, self.stream, previous)
                    ready = await asyncio.to_thread(batch.ready, client, found)
                except PravegaTLSError:
                    raise  # a TLS mismatch does not heal by waiting
                except _RETRIED as exc:
                    failures += 1
                    condition, reason = _describe(exc, scope, self.stream, config.controller_uri)
                    self._enter(condition, logging.WARNING, "Cannot watch %s yet: %s; retrying (at most every %g s) "
                                "until it works", where, reason, self.max_retry_interval)
                    delay = self._retry_delay(failures)
                else:
                    failures = 0
                    self._enter("watching", logging.INFO, "Watching %s for data after %s", where,
                                cut_text(scope, self.stream, previous))
                    if ready:
                        event = batch.event(found)
                        if self.sample_events:
                            event["sample"] = await asyncio.to_thread(_sample, client, found, self.sample_events)
                        self.log.info("New data in %s: %s", where, event["grown_segments"])
                        yield TriggerEvent({"status": "success", **event})
                        # Only reached when the triggerer asks for the next event, having taken this one.
                        # Saving the cut before the yield lost the range to a crash in between; now a
                        # crash repeats it. The save itself waits for the next poll (see the docstring).
                        previous, unsaved = found.tail, event["cut"]
                        batch.reset()
                    delay = self.poll_interval
                    left = batch.wait_left()
                    if left is not None:  # wake up when max_wait_s ends, not up to a poll later
                        delay = min(delay, left)
                if self.end_time is not None and time.time() >= self.end_time:
                    after = "its start" if previous is None else cut_text(scope, self.stream, previous)
                    yield TriggerEvent(
                        {
                            "status": "timeout",
                            "scope": scope,
                            "stream": self.stream,
                            "previous_cut": None if previous is None else after,
                            "message": f"no new data in Pravega stream {where} after {after} before the timeout",
                        }
                    )
                    return
                if self.end_time is not None:
                    delay = max(0.0, min(delay, self.end_time - time.time()))
                await asyncio.sleep(delay)
        finally:
            await asyncio.to_thread(client.close)

    async def _start_positions(self, client: Any, scope: str, start: str,
                               tail: dict[int, int] | None = None) -> dict[int, int]:
        """Where ``start`` is: the head, the tail (``tail`` when a shared poll just read it) or a cut."""
        cut = parse_stream_cut(start, scope, self.stream, "after_cut")
        if cut == "head":
            return dict(await asyncio.to_thread(client.admin.head, scope, self.stream))
        if cut == "tail":
            return dict(tail) if tail is not None else dict(await asyncio.to_thread(client.admin.tail, scope,
                                                                                    self.stream))
        return dict(cut)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ shared stream (Airflow 3.3)

    def shared_stream_key(self) -> Hashable | None:
        """One poll loop for every watcher of the same stream, on Airflow 3.3 under an AssetWatcher.

        What the shared poll depends on; each watcher's start, batching and samples are its own. A
        deferring sensor (``end_time``) and Airflow 3.2 keep ``run``.
        """
        if not SHARED_STREAMS or self.end_time is not None or getattr(self, "asset_state_store", None) is None:
            return None
        return ("pravega-stream", self.pravega_conn_id, self.controller, self.scope, self.stream,
                self.poll_interval, self.max_retry_interval)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> Any:
        """Ack mode: the triggerer saves a watcher's cut (``advance``) once its event is persisted."""
        return _StreamPoller(cls(**kwargs))

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """This watcher's events from the shared polls: the data after its own last cut, batched by
        its own ``min_bytes`` / ``min_events`` / ``max_wait_s`` (``max_wait_s`` is looked at each
        poll). Each event's cut is put on its poll, which the producer saves once it is persisted."""
        config, scope = await self._connection()
        where = f"{scope}/{self.stream}"
        client = PravegaClient(config)
        store = self.asset_state_store
        previous: dict[int, int] | None = None  # the last announced cut
        batch = PendingBatch(self.batching, self._clock)
        try:
            saved = await self._stored_cut()
            async for poll in shared_stream:
                event: dict[str, Any] | None = None
                try:
                    if previous is None:  # not started yet: the saved cut, else after_cut
                        previous = await self._start_positions(client, scope, saved or self.after_cut, poll.tail)
                        if saved is None:  # pinned, so a restart does not skip what is written meanwhile
                            await self._store_cut(cut_text(scope, self.stream, previous))
                    found = await asyncio.to_thread(new_data_at, client, scope, self.stream, previous, poll.tail)
                    if await asyncio.to_thread(batch.ready, client, found):
                        event = batch.event(found)
                        if self.sample_events:
                            event["sample"] = await asyncio.to_thread(_sample, client, found, self.sample_events)
                except PravegaTLSError:
                    raise
                except _RETRIED as exc:  # judged again at the next poll, from the same cut
                    condition, reason = _describe(exc, scope, self.stream, config.controller_uri)
                    self._enter(condition, logging.WARNING, "Cannot judge the new data in %s yet: %s; trying at "
                                "the next poll", where, reason)
                    continue
                self._enter("watching", logging.INFO, "Watching %s (shared poll) for data after %s", where,
                            cut_text(scope, self.stream, previous))
                if event is None:
                    continue
                self.log.info("New data in %s: %s", where, event["grown_segments"])
                poll.announced.append((store, event["cut"]))
                yield TriggerEvent({"status": "success", **event})
                crash_point("stream_trigger_yielded")
                previous = found.tail
                batch.reset()
        finally:
            await asyncio.to_thread(client.close)


@dataclass
class StreamPoll:
    """One shared poll: the stream's tail, and the cuts its watchers announced from it (saved by
    the producer's ``advance`` once their events are persisted)."""

    scope: str
    stream: str
    tail: dict[int, int]
    announced: list[tuple[Any, str]] = field(default_factory=list)  # (asset state store, cut text)


class _StreamPoller(SharedStreamProducer or object):  # type: ignore[misc]
    """The shared poll of one stream (ack mode): reads the tail once per ``poll_interval`` and yields
    it to every watcher; ``advance`` saves the cuts announced from a poll once all its watchers are
    done with it and their events are persisted."""

    def __init__(self, trigger: PravegaStreamTrigger) -> None:
        self._trigger = trigger
        self.log = trigger.log

    async def open_stream(self) -> AsyncIterator[tuple[StreamPoll, StreamPoll]]:
        trigger = self._trigger
        config, scope = await trigger._connection()
        where = f"{scope}/{trigger.stream}"
        client = PravegaClient(config)
        failures = 0
        try:
            while True:
                try:
                    tail = await asyncio.to_thread(client.admin.tail, scope, trigger.stream)
                except PravegaTLSError:
                    raise  # a TLS mismatch does not heal by waiting: every watcher of the stream fails
                except _RETRIED as exc:
                    failures += 1
                    condition, reason = _describe(exc, scope, trigger.stream, config.controller_uri)
                    trigger._enter(condition, logging.WARNING, "Cannot poll %s yet: %s; retrying (at most every "
                                   "%g s) until it works", where, reason, trigger.max_retry_interval)
                    await asyncio.sleep(trigger._retry_delay(failures))
                    continue
                failures = 0
                trigger._enter("polling", logging.INFO, "Polling %s for its watchers", where)
                crash_point("stream_trigger_polled")
                poll = StreamPoll(scope, trigger.stream, dict(tail))
                yield poll, poll
                await asyncio.sleep(trigger.poll_interval)
        finally:
            await asyncio.to_thread(client.close)

    async def advance(self, batch: Sequence[Any]) -> None:
        """Save the cuts announced from these polls, in poll order. A poll a watcher failed on (its
        event not confirmed persisted in time, or it left before taking the poll) saves nothing: the
        failed watcher starts again from its saved cut, the others save a later cut with their next
        event (a restart before that announces their range again)."""
        for item in batch:
            poll: StreamPoll = item.broker_payload
            if not poll.announced:
                continue
            if item.outcome.failed or item.outcome.rejected:
                self.log.warning("Not saving the cuts announced from a poll of %s/%s: %d of its watchers failed "
                                 "on it; their ranges are announced again", poll.scope, poll.stream,
                                 item.outcome.failed + item.outcome.rejected)
                continue
            crash_point("stream_trigger_persisted")
            for store, cut in poll.announced:
                await _save_cut(store, cut, self.log)
            crash_point("stream_trigger_advanced")


async def _save_cut(store: Any, text: str, log: Any) -> bool:
    """Save ``text`` as a watcher's last announced cut; False (logged) if the store refused."""
    try:
        await store.aset(STATE_KEY, text)
    except Exception as exc:  # noqa: BLE001 - an unsaved mark repeats an event later; stopping loses all
        log.warning("Cannot save the last seen cut to the asset state store (tried again with the next save): %s", exc)
        return False
    return True


def _describe(exc: BaseException, scope: str, stream: str, controller_uri: str) -> tuple[str, str]:
    """(condition, reason) of a retried failure: the condition changes only when the cause does."""
    if isinstance(exc, ScopeNotFoundError):
        return "no-scope", f"scope {scope!r} does not exist"
    if isinstance(exc, StreamNotFoundError):
        return "no-stream", f"stream {scope}/{stream} does not exist"
    if isinstance(exc, ControllerUnreachableError):
        return "no-controller", f"the controller at {controller_uri} cannot be reached ({exc})"
    if isinstance(exc, SegmentStoreUnreachableError):
        return "no-segment-store", f"the segment store cannot be reached ({exc})"
    return "unreachable", f"{type(exc).__name__}: {exc}"


def _with_controller(config: Any, controller: str) -> Any:
    """The connection's settings aimed at other controllers (``host:port[,host:port...]``)."""
    other = PravegaConnectionConfig.from_connection_fields(host=controller)
    return dataclasses.replace(
        config, host=other.host, port=other.port, more_controllers=other.more_controllers
    )


def _sample(client: Any, found: NewData, limit: int) -> list[str]:
    """Up to ``limit`` of the new events, segment by segment, as text (undecodable bytes replaced)."""
    # import cost: client.batch brings gRPC (see _connection)
    from airflow_provider_pravega.client.batch import SegmentRange, read_segment_ranges

    ranges = [SegmentRange(found.scope, found.stream, segment, start, end)
              for segment, (start, end) in sorted(found.grown.items())]
    return [e.payload.decode("utf-8", "replace") for e in islice(read_segment_ranges(client, ranges), limit)]
