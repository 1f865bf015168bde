"""Fixtures of the trigger tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def counted_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An in-process embedded server: its controller's ``rpc_calls`` counts every call served, so a
    test sees what the triggers cost the controller (a triggerer in another process included)."""
    from airflow_provider_pravega.embedded.server import EmbeddedPravega, ServerSettings

    server = EmbeddedPravega(ServerSettings(data_dir=tmp_path_factory.mktemp("counted"), port=0,
                                            segment_store_port=0, fsync=False))
    server.start()
    try:
        yield server
    finally:
        server.stop()
