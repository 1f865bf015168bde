"""An event trigger that fires when new data arrives in a Pravega stream.

Usable two ways:

* with ``AssetWatcher``, so that a DAG runs whenever the stream's tail moves (event-driven
  scheduling; the trigger keeps running and fires once per poll that finds new data);
* by :class:`~airflow_provider_pravega.sensors.stream.PravegaStreamSensor` in deferrable mode
  (the first event resumes the sensor).

"New data" is judged segment by segment against the last seen cut, across scaling (see
``find_new_data``): a segment's larger offset, data in a successor segment, or data a sealed
predecessor received before the scale.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_provider_pravega._streams import (
    NewData,
    cut_text,
    find_new_data,
    parse_stream_cut,
    resolve_scope,
)
from airflow_provider_pravega.client.errors import ControllerUnreachableError, SegmentStoreUnreachableError

__all__ = ["PravegaStreamTrigger"]

#: Key under which an AssetWatcher's trigger keeps its last seen cut in Airflow's asset state store.
STATE_KEY = "pravega_last_seen_cut"
_TRANSIENT = (ControllerUnreachableError, SegmentStoreUnreachableError)


class PravegaStreamTrigger(BaseEventTrigger):
    """Fires ``{"status": "success", "previous_cut", "cut", ...}`` each time the stream's tail moves.

    :param stream: The stream to watch.
    :param scope: Its scope (default: the connection's default scope).
    :param pravega_conn_id: The ``pravega`` connection.
    :param after_cut: Stream-cut text (or ``"head"``/``"tail"``) after which data counts as new.
        Default: the stream's tail when the trigger starts. When run by an AssetWatcher, the last
        cut it reported is kept in Airflow's asset state store and takes precedence, so a restarted
        triggerer neither repeats nor misses data.
    :param poll_interval: Seconds between polls (one controller call plus one segment-store call
        per segment each).
    :param end_time: Epoch seconds after which the trigger gives up with one ``timeout`` event
        (for a deferring sensor). None (the default, for AssetWatcher): watch forever.

    Each event carries ``previous_cut`` and ``cut`` (Pravega texts: export exactly the new data
    between them), ``tail_positions``, ``grown_segments`` ({segment: [from, to]}) and ``new_bytes``.

    A DAG that runs when new events arrive::

        from airflow.sdk import DAG, Asset, AssetWatcher, task
        from airflow_provider_pravega.triggers import PravegaStreamTrigger

        orders = Asset(
            "pravega://controller:9090/shop/orders",
            watchers=[AssetWatcher(name="orders_tail",
                                   trigger=PravegaStreamTrigger(scope="shop", stream="orders", poll_interval=30))],
        )

        with DAG("on_new_orders", schedule=[orders]):

            @task
            def new_range(**context):
                event = context["triggering_asset_events"][orders][-1]
                return event.extra["payload"]["previous_cut"], event.extra["payload"]["cut"]

            new_range()
    """

    def __init__(
        self,
        *,
        stream: str,
        scope: str | None = None,
        pravega_conn_id: str = "pravega_default",
        after_cut: str | None = None,
        poll_interval: float = 10.0,
        end_time: float | None = None,
    ) -> None:
        super().__init__()
        self.stream = stream
        self.scope = scope
        self.pravega_conn_id = pravega_conn_id
        self.after_cut = after_cut
        self.poll_interval = float(poll_interval)
        self.end_time = None if end_time is None else float(end_time)

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
            self.log.warning("Cannot read the last seen cut from the asset state store: %s", exc)
            return None
        return value if isinstance(value, str) and value else None

    async def _store_cut(self, text: str) -> None:
        store = getattr(self, "asset_state_store", None)
        if store is None:
            return
        try:
            await store.aset(STATE_KEY, text)
        except Exception as exc:  # noqa: BLE001 - losing the mark repeats an event later; stopping loses all
            self.log.warning("Cannot save the last seen cut to the asset state store: %s", exc)

    # --------------------------------------------------------------------------------- run

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_provider_pravega.client import PravegaClient
        from airflow_provider_pravega.hooks.pravega import PravegaHook

        conn = await PravegaHook.aget_connection(self.pravega_conn_id)
        config = PravegaHook.config_from_connection(conn)
        scope = resolve_scope(self.scope, config, self.pravega_conn_id)
        client = PravegaClient(config)
        try:
            start = await self._stored_cut() or self.after_cut or "tail"
            previous = await self._start_positions(client, scope, start)
            await self._store_cut(cut_text(scope, self.stream, previous))
            self.log.info("Watching %s/%s for data after %s", scope, self.stream, previous)
            while True:
                try:
                    found: NewData = await asyncio.to_thread(find_new_data, client, scope, self.stream, previous)
                except _TRANSIENT as exc:
                    self.log.warning("Cannot read the tail of %s/%s yet (will retry): %s", scope, self.stream, exc)
                else:
                    if found:
                        event = found.to_event()
                        self.log.info("New data in %s/%s: %s", scope, self.stream, event["grown_segments"])
                        previous = found.tail
                        await self._store_cut(event["cut"])
                        yield TriggerEvent({"status": "success", **event})
                if self.end_time is not None and time.time() >= self.end_time:
                    yield TriggerEvent(
                        {
                            "status": "timeout",
                            "scope": scope,
                            "stream": self.stream,
                            "previous_cut": cut_text(scope, self.stream, previous),
                            "message": f"no new data in Pravega stream {scope}/{self.stream} after "
                            f"{cut_text(scope, self.stream, previous)} before the timeout",
                        }
                    )
                    return
                delay = self.poll_interval
                if self.end_time is not None:
                    delay = max(0.0, min(delay, self.end_time - time.time()))
                await asyncio.sleep(delay)
        finally:
            await asyncio.to_thread(client.close)

    async def _start_positions(self, client: Any, scope: str, start: str) -> dict[int, int]:
        cut = parse_stream_cut(start, scope, self.stream, "after_cut")
        if cut == "head":
            return dict(await asyncio.to_thread(client.admin.head, scope, self.stream))
        if cut == "tail":
            return dict(await asyncio.to_thread(client.admin.tail, scope, self.stream))
        return dict(cut)  # type: ignore[arg-type]
