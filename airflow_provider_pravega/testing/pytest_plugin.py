"""pytest fixtures that run the embedded Pravega-compatible server on free loopback ports.

The server runs as a child process: the official ``pravega`` client holds the GIL while it waits
for replies, so it could never be answered by a server inside the test process.

- ``pravega_embedded``: one server for the whole test session (tests use unique names).
- ``pravega_controller_uri``: that server's ``tcp://127.0.0.1:PORT``.
- ``pravega_embedded_factory``: extra servers with their own settings (short transaction leases,
  a given data directory for restart and crash tests); all are stopped after the test.
- ``unique_name``: Pravega-valid unique names.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess


@pytest.fixture(scope="session")
def pravega_embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPravegaProcess]:
    server = EmbeddedPravegaProcess(tmp_path_factory.mktemp("pravega"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pravega_controller_uri(pravega_embedded: EmbeddedPravegaProcess) -> str:
    return pravega_embedded.controller_uri


@pytest.fixture
def pravega_embedded_factory(tmp_path: Path) -> Iterator[Callable[..., EmbeddedPravegaProcess]]:
    started: list[EmbeddedPravegaProcess] = []

    def start(data_dir: Path | None = None, **settings: object) -> EmbeddedPravegaProcess:
        server = EmbeddedPravegaProcess(data_dir or tmp_path / f"pravega-{len(started)}", **settings)  # type: ignore[arg-type]
        server.start()
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in reversed(started):
            server.stop()


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    return lambda prefix: f"{prefix}-{uuid.uuid4().hex[:10]}"
