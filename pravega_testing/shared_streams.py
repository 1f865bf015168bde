"""The triggerer's shared-stream side without its supervisor, for the stream trigger's tests and
the watcher benchmark: Airflow's own ``SharedStreamManager``, each watcher's filter driven as
``TriggerRunner.run_trigger`` drives it, and an asset state store kept in a dict.

What the supervisor does is left to the caller: ``persist`` confirms a watcher's events stored
(as the supervisor does once they are in the metadata database); ``crash`` stops everything
without confirming more.
"""

from __future__ import annotations

import asyncio
from typing import Any


class StateStore:
    """An asset's state store as the triggerer injects it into an AssetWatcher's trigger (the real
    one talks to the triggerer's supervisor): the same async ``aget``/``aset``, values in a dict."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    async def aget(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    async def aset(self, key: str, value: Any) -> None:
        self.values[key] = value


class SharedStreamTriggerer:
    """Watchers on Airflow's ``SharedStreamManager`` (Airflow 3.3), in the running event loop."""

    def __init__(self, **manager: Any) -> None:
        """``manager``: ``SharedStreamManager`` settings (``ack_timeout=`` ...)."""
        from airflow.triggers.shared_stream import SharedStreamManager

        self.manager = SharedStreamManager(**manager)
        self.events: list[tuple[int, dict[str, Any], int | None]] = []  # (watcher, payload, persist seq)
        self._tasks: list[asyncio.Task] = []

    def watch(self, watcher: int, trigger: Any) -> None:
        """Run ``trigger`` as watcher number ``watcher`` (its ``shared_stream_key`` must be set)."""
        key = trigger.shared_stream_key()
        assert key is not None, f"{trigger!r} has no shared_stream_key"

        async def run() -> None:
            shared = self.manager.subscribe(trigger_id=watcher, trigger=trigger, key=key)
            try:
                async for event in trigger.filter_shared_stream(shared):
                    seq = self.manager.bind_pending_event(trigger_id=watcher, key=key)
                    self.events.append((watcher, event.payload, seq))
            finally:
                await self.manager.unsubscribe(watcher, key)

        self._tasks.append(asyncio.create_task(run()))

    def failed(self, watcher: int) -> BaseException | None:
        """What ended ``watcher``'s run (None while it runs or if it was cancelled)."""
        task = self._tasks[watcher]
        if task.done() and not task.cancelled():
            return task.exception()
        return None

    def of(self, watcher: int) -> list[dict[str, Any]]:
        """The payloads ``watcher`` fired, in order."""
        return [payload for w, payload, _ in self.events if w == watcher]

    def persist(self, watcher: int) -> None:
        """Confirm every event of ``watcher`` taken so far as stored."""
        self.manager.confirm_persisted([seq for w, _, seq in self.events if w == watcher and seq is not None])

    async def crash(self) -> None:
        """Stop without confirming anything more (what survives is what the stores hold)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.manager.stop_all()

    def polls(self) -> int:
        """Polls fanned out so far by the (single) shared stream."""
        (group,) = self.manager._groups.values()
        return group._next_event_id
