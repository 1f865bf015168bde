"""pytest fixtures that run the embedded Pravega-compatible server on free loopback ports.

The server runs as a child process: the official ``pravega`` client holds the GIL while it waits
for replies, so it could never be answered by a server inside the test process.

- ``pravega_embedded``: one server for the whole test session (tests use unique names).
- ``pravega_controller_uri``: that server's ``tcp://127.0.0.1:PORT``.
- ``pravega_embedded_factory``: extra servers with their own settings (short transaction leases,
  a given data directory for restart and crash tests); all are stopped after the test.
- ``unique_name``: Pravega-valid unique names.
- ``pravega_secure_embedded``: one server per module with authentication and TLS on (see
  :class:`SecureServer` for its users); ``pravega_secure_embedded_factory(token_ttl_s=..., tls=...)``
  starts more, e.g. with short-lived tokens or without TLS.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from airflow_provider_pravega.embedded.auth import auth_file_line
from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess
from airflow_provider_pravega.embedded.local_pki import TestPKI, make_test_pki

# Test-only accounts of the secure server: username -> (password, Pravega ACL).
# 'admin' may do everything; 'reader' may read everything; 'writer-iot' may read and write in scope
# 'iot' only (the scope itself and everything in it). Pravega matches an ACL entry against the whole
# resource string, so 'prn::/' alone would cover only the list of scopes: hence 'prn::*'.
SECURE_USERS: dict[str, tuple[str, str]] = {
    "admin": ("admin-Pa55word", "prn::*,READ_UPDATE"),
    "reader": ("reader-Pa55word", "prn::*,READ"),
    "writer-iot": ("writer-Pa55word", "prn::/scope:iot,READ_UPDATE;prn::/scope:iot/*,READ_UPDATE"),
}


#: Why a test that needs the official client (the tests' oracle) is skipped where it is missing.
OFFICIAL_CLIENT_REASON = (
    "the official Pravega client (PyPI 'pravega' 0.3.8, module pravega_client) is not installed: it has "
    "wheels for CPython 3.10/3.11 only (pip install 'airflow-provider-pravega[official-client]')"
)


def official_client_installed() -> bool:
    """Whether the official client can be imported (without importing it)."""
    return importlib.util.find_spec("pravega_client") is not None


_Server = TypeVar("_Server")


@contextlib.contextmanager
def _stopped_after(stop: Callable[[_Server], None]) -> Iterator[list[_Server]]:
    """The list a factory fixture appends the servers it starts to; each is stopped at the end,
    the last started first."""
    started: list[_Server] = []
    try:
        yield started
    finally:
        for server in reversed(started):
            stop(server)


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
    with _stopped_after(EmbeddedPravegaProcess.stop) as started:
        def start(data_dir: Path | None = None, **settings: object) -> EmbeddedPravegaProcess:
            server = EmbeddedPravegaProcess(data_dir or tmp_path / f"pravega-{len(started)}", **settings)  # type: ignore[arg-type]
            server.start()
            started.append(server)
            return server

        yield start


@pytest.fixture
def pravega_cluster_factory(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``start(segment_stores=3, containers=8, **ServerSettings fields)``: an embedded server run as a
    small cluster *in this process* (loopback, free ports), so a test can drive its controls
    (``move_container``, ``stop_store``, ``restart_store``, ``set_hooks``); stopped after the test."""
    # import cost: the in-process server (gRPC, about 0.4 s) only for this fixture; the others run it as a child
    from airflow_provider_pravega.embedded.server import EmbeddedPravega, ServerSettings

    with _stopped_after(EmbeddedPravega.stop) as started:
        def start(segment_stores: int = 3, containers: int = 8, **settings: Any) -> EmbeddedPravega:
            settings.setdefault("fsync", False)
            settings.setdefault("tail_wait_s", 1.0)
            server = EmbeddedPravega(ServerSettings(
                data_dir=tmp_path / f"cluster-{len(started)}", host="127.0.0.1", port=0, segment_store_port=0,
                segment_stores=segment_stores, containers=containers, **settings))
            server.start()
            started.append(server)
            return server

        yield start


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    return lambda prefix: f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclass
class SecureServer:
    """A running embedded server with authentication (and TLS unless asked otherwise).

    ``passwords`` holds the plain test passwords (the server only has their hashes);
    ``client_env(user)`` is the environment the official client reads credentials and the CA from.
    """

    process: EmbeddedPravegaProcess
    auth_file: Path
    pki: TestPKI | None
    auth: bool
    passwords: dict[str, str]
    acls: dict[str, str]
    token_ttl_s: int | None
    users: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.users = list(self.passwords)

    @property
    def controller_uri(self) -> str:
        return self.process.controller_uri

    @property
    def segment_store_endpoint(self) -> str:
        return self.process.segment_store_endpoint

    @property
    def tls(self) -> bool:
        return self.pki is not None

    @property
    def ca_cert(self) -> Path | None:
        return self.pki.ca_cert if self.pki else None

    def client_env(self, user: str | None = None, password: str | None = None) -> dict[str, str]:
        """``pravega_client_*`` variables for the official client (Basic auth as ``user``)."""
        env: dict[str, str] = {}
        if user is not None:
            env.update(pravega_client_auth_method="Basic", pravega_client_auth_username=user,
                       pravega_client_auth_password=self.passwords[user] if password is None else password)
        if self.pki is not None:
            env["pravega_client_tls_cert_path"] = str(self.pki.ca_cert)
        return env


    def run_client(self, code: str, user: str | None = None, *, password: str | None = None,
                   timeout_s: float = 90.0, auth_enabled: bool | None = None, tls_enabled: bool | None = None,
                   controller_uri: str | None = None) -> ClientRun:
        """Run ``code`` in a fresh Python process with the official client as ``user``.

        The credentials are process-wide environment variables of the official client, and it holds
        the GIL while it waits, so every user gets its own process. ``code`` sees ``pravega_client``,
        ``URI`` and ``manager`` (a StreamManager for that user). A process still running after
        ``timeout_s`` is killed (``returncode`` None).
        """
        if not official_client_installed():
            pytest.skip(OFFICIAL_CLIENT_REASON)
        uri = controller_uri or self.controller_uri
        auth_enabled = self.auth if auth_enabled is None else auth_enabled
        tls_enabled = self.tls if tls_enabled is None else tls_enabled
        prelude = (
            "import asyncio, json, os, sys, time\nimport pravega_client\n"
            f"URI = {uri!r}\n"
            f"manager = pravega_client.StreamManager(URI, auth_enabled={auth_enabled!r}, tls_enabled={tls_enabled!r})\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("pravega_client_")}
        env.update(self.client_env(user, password))
        started = time.monotonic()
        try:
            # os._exit after the code: the official client's runtime threads can abort the interpreter
            # while it finalizes ("PyGILState_Release ... must be current"), after the work is done.
            epilogue = "\nsys.stdout.flush(); sys.stderr.flush(); os._exit(0)\n"
            done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code) + epilogue], env=env,
                                  check=False, capture_output=True, text=True, timeout=timeout_s)
            return ClientRun(done.returncode, done.stdout, done.stderr, time.monotonic() - started)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            return ClientRun(None, out, err, time.monotonic() - started)


@dataclass(frozen=True)
class ClientRun:
    """What an official-client subprocess did (``returncode`` None: killed after its timeout)."""

    returncode: int | None
    stdout: str
    stderr: str
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe(self) -> str:
        return (f"exit {self.returncode} after {self.elapsed_s:.1f} s\n--- stdout\n{self.stdout[-3000:]}"
                f"\n--- stderr\n{self.stderr[-3000:]}")


def _start_secure(base: Path, *, token_ttl_s: int | None, tls: bool, extra_users: dict[str, tuple[str, str]] | None,
                  auth: bool = True, **settings: object) -> SecureServer:
    base.mkdir(parents=True, exist_ok=True)
    users = dict(SECURE_USERS)
    users.update(extra_users or {})
    auth_file = base / "passwd"
    auth_file.write_text("".join(auth_file_line(u, pw, acl) + "\n" for u, (pw, acl) in users.items()))
    pki = make_test_pki(base / "pki") if tls else None
    process = EmbeddedPravegaProcess(
        base / "data", auth_file=auth_file if auth else None, token_ttl_s=token_ttl_s,
        tls_cert=pki.server_cert if pki else None, tls_key=pki.server_key if pki else None,
        **settings,  # type: ignore[arg-type]
    )
    process.start()
    return SecureServer(process, auth_file, pki, auth, {u: pw for u, (pw, _a) in users.items()},
                        {u: acl for u, (_p, acl) in users.items()}, token_ttl_s)


@pytest.fixture(scope="module")
def pravega_secure_embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureServer]:
    server = _start_secure(tmp_path_factory.mktemp("pravega-secure"), token_ttl_s=None, tls=True, extra_users=None)
    try:
        yield server
    finally:
        server.process.stop()


@pytest.fixture
def pravega_secure_embedded_factory(tmp_path: Path) -> Iterator[Callable[..., SecureServer]]:
    """``start(token_ttl_s=None, tls=True, auth=True, extra_users=None, **EmbeddedPravegaProcess kwargs)``;
    ``auth=False`` starts the server without an auth file (the users are then meaningless)."""
    with _stopped_after(lambda server: server.process.stop()) as started:
        def start(*, token_ttl_s: int | None = None, tls: bool = True, auth: bool = True,
                  extra_users: dict[str, tuple[str, str]] | None = None, **settings: object) -> SecureServer:
            server = _start_secure(tmp_path / f"pravega-secure-{len(started)}", token_ttl_s=token_ttl_s, tls=tls,
                                   extra_users=extra_users, auth=auth, **settings)
            started.append(server)
            return server

        yield start
