"""A sensor that waits for new data in a Pravega stream after a given stream cut."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout

from airflow_provider_pravega._streams import (
    Batching,
    PendingBatch,
    cut_text,
    find_new_data,
    parse_stream_cut,
    resolve_stream_cut,
)
from airflow_provider_pravega.sensors._base import PravegaSensorBase
from airflow_provider_pravega.triggers.stream import PravegaStreamTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_pravega.client import PravegaClient

__all__ = ["PravegaStreamSensor"]


class PravegaStreamSensor(PravegaSensorBase):
    """Wait until a stream holds data after ``after_cut``.

    :param stream: The stream to watch.
    :param after_cut: Where "new" starts (templated): Pravega stream-cut text (e.g. a previous
        run's end cut from XCom), its JSON form, ``"head"`` (any data at all) or ``"tail"``
        (data written after the sensor starts; poke and deferrable modes only, since a
        rescheduled sensor would take a new tail at every poke).
    :param scope: The stream's scope (default: the connection's default scope).
    :param pravega_conn_id: The ``pravega`` connection.
    :param deferrable: Wait in the triggerer through
        :class:`~airflow_provider_pravega.triggers.stream.PravegaStreamTrigger`.
    :param min_bytes: Wait until the new data holds this many bytes (event headers included);
        0 (the default): any new data.
    :param min_events: Wait until it holds this many events (counted by reading it); 0 (the
        default): any. With both minimums, whichever is reached first.
    :param max_wait_s: With a minimum set, succeed anyway this many seconds after new data was first
        seen. Not in reschedule mode (each poke would start the wait afresh).

    Fails at once when the stream is sealed with no new data (nothing can arrive any more), and
    succeeds with what there is when it is sealed with less than the minimums.
    XCom: ``{"previous_cut", "cut", "tail_positions", "grown_segments", "new_bytes", ...}``
    (``new_events`` too with ``min_events``); ``cut`` is the tail when the data was seen, so
    ``previous_cut``..``cut`` is the new data.
    """

    template_fields: Sequence[str] = ("scope", "stream", "after_cut")

    def __init__(
        self,
        *,
        stream: str,
        after_cut: Any = "tail",
        min_bytes: int = 0,
        min_events: int = 0,
        max_wait_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(stream=stream, **kwargs)
        self.after_cut = after_cut
        self.batching = Batching(min_bytes, min_events, max_wait_s)
        self._baseline: dict[int, int] | None = None
        self._batch = PendingBatch(self.batching)  # what came after the baseline, poke after poke
        if self.mode == "reschedule" and isinstance(after_cut, str) and after_cut.strip().lower() == "tail":
            raise ValueError(
                f"{self.task_id}: after_cut='tail' cannot be used in reschedule mode (each poke would take a new "
                f"tail); pass a stream cut (e.g. from XCom) or use poke or deferrable mode"
            )
        if self.mode == "reschedule" and max_wait_s is not None:
            raise ValueError(
                f"{self.task_id}: max_wait_s cannot be used in reschedule mode (each poke would start the wait "
                f"afresh); use poke or deferrable mode"
            )

    def _client(self) -> PravegaClient:
        return self.hook.get_client()

    def poke(self, context: Context) -> bool | PokeReturnValue:
        scope = self._scope()
        with self._client() as client:
            if self._baseline is None:
                if self.reschedule and parse_stream_cut(self.after_cut, scope, self.stream, "after_cut") == "tail":
                    raise AirflowFailException(
                        f"{self.task_id}: after_cut='tail' cannot be used in reschedule mode; pass a stream cut"
                    )
                self._baseline = resolve_stream_cut(client, scope, self.stream, self.after_cut, "after_cut")
            found = find_new_data(client, scope, self.stream, self._baseline)
            ready = self._batch.ready(client, found)
            if not ready and client.admin.stream_info(scope, self.stream).sealed:
                if not found:
                    raise AirflowFailException(
                        f"Pravega stream {scope}/{self.stream} is sealed and has no data after "
                        f"{cut_text(scope, self.stream, self._baseline)}; no new data can arrive"
                    )
                ready = True  # below the minimums, but nothing more can arrive
            if ready:
                event = self._batch.event(found)
                self.log.info("New data in %s/%s: %s", scope, self.stream, event["grown_segments"])
                return PokeReturnValue(is_done=True, xcom_value={"status": "success", **event})
        if found:
            self.log.info("New data in %s/%s, %d bytes so far: waiting for more (%s)", scope, self.stream,
                          found.new_bytes, self.batching)
        else:
            self.log.info("No new data in %s/%s yet", scope, self.stream)
        return False

    def deferred_trigger(self) -> PravegaStreamTrigger:
        assert self._baseline is not None  # set by the first poke
        scope = self._scope()
        return PravegaStreamTrigger(
            stream=self.stream,
            scope=scope,
            pravega_conn_id=self.pravega_conn_id,
            after_cut=cut_text(scope, self.stream, self._baseline),
            poll_interval=self.poke_interval,
            end_time=time.time() + self.timeout,
            min_bytes=self.batching.min_bytes,
            min_events=self.batching.min_events,
            max_wait_s=self.batching.max_wait_s,
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        if not event:
            raise AirflowFailException(f"{self.task_id}: the stream trigger ended without an event")
        if event.get("status") == "success":
            return event
        if event.get("status") == "timeout":
            raise AirflowSensorTimeout(f"{self.task_id}: {event.get('message')}")
        raise AirflowFailException(f"{self.task_id}: {event.get('message') or event}")
