"""Which Pravega clients the tests can use: the official one (the oracle) only where it installs.

The official client (PyPI ``pravega`` 0.3.8, module ``pravega_client``) has wheels for CPython
3.10/3.11 only. Tests that check behaviour *against* it call :func:`require_official_client`
(module level: the whole module is skipped with the reason) or carry the ``official_client``
marker (tests/conftest.py skips them with the same reason). Tests that only need events in a
stream use :func:`stream_writer`, the provider's own EventWriter behind the official writer's
methods, so they run on every interpreter.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_pravega.embedded.pytest_plugin import OFFICIAL_CLIENT_REASON, official_client_installed

__all__ = ["OFFICIAL_CLIENT_REASON", "official_client_installed", "require_official_client", "stream_writer"]


def require_official_client() -> Any:
    """The ``pravega_client`` module, or skip (at module level: the whole module) with the reason."""
    return pytest.importorskip("pravega_client", reason=OFFICIAL_CLIENT_REASON)


class _OwnWriter:
    """``write_event(str, routing_key)`` / ``write_event_bytes(bytes, routing_key)`` / ``flush()`` as
    the official writer has them, over the provider's EventWriter; closed when dropped."""

    def __init__(self, uri: str, scope: str, stream: str, max_inflight_events: int) -> None:
        import time

        from airflow_provider_pravega.client import PravegaClient
        from airflow_provider_pravega.client.errors import ControllerUnreachableError

        self._client = PravegaClient(uri)
        # Like the official client, ride out a controller that is (re)starting: gRPC keeps a
        # just-refused address in backoff for a moment, for every channel of the process.
        deadline = time.monotonic() + 30
        while True:
            try:
                self._writer = self._client.event_writer(scope, stream, max_inflight_events=max_inflight_events)
                return
            except ControllerUnreachableError:
                if time.monotonic() > deadline:
                    self._client.close()
                    raise
                time.sleep(0.2)

    def write_event(self, event: str, routing_key: str | None = None) -> None:
        self._writer.write_event(event.encode(), routing_key)

    def write_event_bytes(self, event: bytes, routing_key: str | None = None) -> None:
        self._writer.write_event(event, routing_key)

    def flush(self) -> None:
        self._writer.flush()

    def __del__(self) -> None:
        if hasattr(self, "_writer"):
            self._writer.close()
        self._client.close()


def stream_writer(uri: str, scope: str, stream: str, max_inflight_events: int = 1000) -> _OwnWriter:
    """A writer of plain events (the provider's own), used like ``create_writer(scope, stream)``."""
    return _OwnWriter(uri, scope, stream, max_inflight_events)
