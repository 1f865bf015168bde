"""pytest plugin for the subprocess that runs the official client's own tests, unedited.

Loaded with ``-p official_plugin`` by tests/backends/test_official_client_suite.py. Two things,
neither of which changes what a test does against Pravega:

- Address: the tests build ``StreamManager("tcp://127.0.0.1:9090")``. ``PRAVEGA_OFFICIAL_URI`` names
  the backend's real controller; a StreamManager for 127.0.0.1:9090 is built for that URI instead
  (same client, same calls), so the suite runs against any backend and needs no fixed port.
  ``PRAVEGA_OFFICIAL_URI=fresh-embedded`` starts a new embedded server for every test instead (on
  free loopback ports, stopped after the test): each test then sees only its own scopes, as the
  suite's authors' fresh Pravega did (test_tags lists the streams of whichever scope is listed
  first, and another test leaves an empty scope behind).
- Names: the reader tests share fixed scopes and pick stream and reader-group suffixes with
  ``random.randint(0, 100)``, so two tests can draw the same suffix and meet each other's stream or
  reader group. Each test module's ``random`` is given a ``randint`` that never repeats within the
  run (the only use those modules make of ``random``).

It also ends the process with ``os._exit`` once pytest is done: the official client's runtime
threads can abort the interpreter while it finalizes, after the results are written.
"""

from __future__ import annotations

import itertools
import os
import random
import sys

import pytest

_EXPECTED_ADDRESSES = ("tcp://127.0.0.1:9090", "127.0.0.1:9090")
FRESH_EMBEDDED = "fresh-embedded"
_exit_status = 0
_target = {"uri": os.environ.get("PRAVEGA_OFFICIAL_URI", "")}


def _redirect_stream_manager() -> None:
    if not _target["uri"]:
        return
    import pravega_client

    real = pravega_client.StreamManager

    def stream_manager(controller_uri, *args, **kwargs):
        if controller_uri in _EXPECTED_ADDRESSES:
            controller_uri = _target["uri"]
        return real(controller_uri, *args, **kwargs)

    pravega_client.StreamManager = stream_manager


@pytest.fixture(autouse=True)
def _fresh_embedded_server(tmp_path):
    if os.environ.get("PRAVEGA_OFFICIAL_URI") != FRESH_EMBEDDED:
        yield
        return
    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess

    server = EmbeddedPravegaProcess(tmp_path / "pravega")
    server.start()
    _target["uri"] = server.controller_uri
    try:
        yield
    finally:
        _target["uri"] = ""
        # SIGKILL: its data is thrown away, and a graceful stop would first wait out the reads the
        # test's readers left parked at the tail (about 5 s per test).
        server.kill()


class _UniqueRandom:
    """Stands in for the ``random`` module inside a test module: ``randint`` draws without repeats."""

    def __init__(self) -> None:
        self._counter = itertools.count(random.randrange(1000, 1_000_000, 1000))

    def randint(self, a: int, b: int) -> int:
        return next(self._counter)

    def __getattr__(self, name: str):
        return getattr(random, name)


_UNIQUE = _UniqueRandom()


def pytest_configure(config: pytest.Config) -> None:
    _redirect_stream_manager()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and getattr(module, "random", None) is random:
            module.random = _UNIQUE


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status)
