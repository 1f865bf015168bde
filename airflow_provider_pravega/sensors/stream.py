"""A sensor that waits for new data in a Pravega stream after a given stream cut."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout

from airflow_provider_pravega._streams import (
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

    Fails at once when the stream is sealed with no new data (nothing can arrive any more).
    XCom: ``{"previous_cut", "cut", "tail_positions", "grown_segments", "new_bytes", ...}``;
    ``cut`` is the tail when the data was seen, so ``previous_cut``..``cut`` is the new data.
    """

    template_fields: Sequence[str] = ("scope", "stream", "after_cut")

    def __init__(self, *, stream: str, after_cut: Any = "tail", **kwargs: Any) -> None:
        super().__init__(stream=stream, **kwargs)
        self.after_cut = after_cut
        self._baseline: dict[int, int] | None = None
        if self.mode == "reschedule" and isinstance(after_cut, str) and after_cut.strip().lower() == "tail":
            raise ValueError(
                f"{self.task_id}: after_cut='tail' cannot be used in reschedule mode (each poke would take a new "
                f"tail); pass a stream cut (e.g. from XCom) or use poke or deferrable mode"
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
            if found:
                self.log.info("New data in %s/%s: %s", scope, self.stream, found.to_event()["grown_segments"])
                return PokeReturnValue(is_done=True, xcom_value={"status": "success", **found.to_event()})
            if client.admin.stream_info(scope, self.stream).sealed:
                raise AirflowFailException(
                    f"Pravega stream {scope}/{self.stream} is sealed and has no data after "
                    f"{cut_text(scope, self.stream, self._baseline)}; no new data can arrive"
                )
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
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        if not event:
            raise AirflowFailException(f"{self.task_id}: the stream trigger ended without an event")
        if event.get("status") == "success":
            return event
        if event.get("status") == "timeout":
            raise AirflowSensorTimeout(f"{self.task_id}: {event.get('message')}")
        raise AirflowFailException(f"{self.task_id}: {event.get('message') or event}")
