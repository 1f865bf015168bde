"""Run the embedded server as a child process.

The official ``pravega`` client holds the GIL while it waits for the network, so a server running
in the same Python process as that client can never answer it. Tests, the demo and DAG authors
therefore run the server as its own process; this module starts it, waits for its ready line, and
stops (or, for crash tests, kills) it.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

_READY = re.compile(r"ready: controller (\S+) segment-store (\S+)")


class EmbeddedProcessError(RuntimeError):
    """The server process did not start (its own error output is included)."""


class EmbeddedPravegaProcess:
    """``python -m airflow_provider_pravega.embedded`` as a managed child process."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        segment_store_port: int = 0,
        txn_lease_cap_ms: int | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout_s: float = 60.0,
        auth_file: str | os.PathLike[str] | None = None,
        keycloak_realm_url: str | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        token_ttl_s: int | None = None,
        token_signing_key_file: str | os.PathLike[str] | None = None,
        pravega_token_rules: bool = False,
        new_session: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port
        self.segment_store_port = segment_store_port
        self.txn_lease_cap_ms = txn_lease_cap_ms
        self.extra_args = list(extra_args)
        self.auth_file = Path(auth_file) if auth_file is not None else None
        self.keycloak_realm_url = keycloak_realm_url
        self.tls_cert = Path(tls_cert) if tls_cert is not None else None
        self.tls_key = Path(tls_key) if tls_key is not None else None
        self.token_ttl_s = token_ttl_s
        self.token_signing_key_file = Path(token_signing_key_file) if token_signing_key_file is not None else None
        self.pravega_token_rules = pravega_token_rules
        self.startup_timeout_s = startup_timeout_s
        # In its own session (process group): it outlives its starter (scripts/stack) and is stopped by group.
        self.new_session = new_session
        self.proc: subprocess.Popen[str] | None = None
        self.controller_uri = ""
        self.segment_store_endpoint = ""
        self.segment_store_endpoints: list[str] = []
        self._log_path = self.data_dir / "server.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "airflow_provider_pravega.embedded", "--data-dir", str(self.data_dir),
            "--host", self.host, "--port", str(self.port), "--segment-store-port", str(self.segment_store_port),
        ]
        if self.txn_lease_cap_ms is not None:
            cmd += ["--txn-lease-cap-ms", str(self.txn_lease_cap_ms)]
        if self.auth_file is not None:
            cmd += ["--auth-file", str(self.auth_file)]
        if self.keycloak_realm_url is not None:
            cmd += ["--keycloak-realm-url", self.keycloak_realm_url]
        if self.token_ttl_s is not None:
            cmd += ["--token-ttl-s", str(self.token_ttl_s)]
        if self.token_signing_key_file is not None:
            cmd += ["--token-signing-key-file", str(self.token_signing_key_file)]
        if self.pravega_token_rules:
            cmd.append("--pravega-token-rules")
        if self.tls_cert is not None:
            cmd += ["--tls-cert", str(self.tls_cert)]
        if self.tls_key is not None:
            cmd += ["--tls-key", str(self.tls_key)]
        return cmd + self.extra_args

    def start(self) -> EmbeddedPravegaProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self._log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=log, text=True,
                                         start_new_session=self.new_session)
        finally:
            log.close()
        assert self.proc.stdout is not None
        deadline = time.monotonic() + self.startup_timeout_s
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.kill()
                    raise EmbeddedProcessError(f"embedded server did not report ready within {self.startup_timeout_s:.0f} s"
                                               f"{self._log_tail()}")
                if not sel.select(remaining):
                    continue
                line = self.proc.stdout.readline()
                if not line:
                    code = self.proc.wait()
                    raise EmbeddedProcessError(f"embedded server exited with code {code}{self._log_tail()}")
                m = _READY.search(line)
                if m:
                    self.controller_uri = m.group(1)
                    self.segment_store_endpoints = m.group(2).split(",")  # several with --segment-stores
                    self.segment_store_endpoint = self.segment_store_endpoints[0]
                    return self
        finally:
            sel.close()

    def _log_tail(self) -> str:
        try:
            text = self._log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""
        return f"; its log ({self._log_path}):\n{text}" if text.strip() else ""

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM and wait (the server flushes and checkpoints); SIGKILL if it hangs."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: the crash that durability tests simulate."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def restart(self) -> EmbeddedPravegaProcess:
        """Start again on the same data directory and the same ports."""
        if self.controller_uri:
            self.port = int(self.controller_uri.rsplit(":", 1)[1])
            self.segment_store_port = int(self.segment_store_endpoint.rsplit(":", 1)[1])
        return self.start()

    def __enter__(self) -> EmbeddedPravegaProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def embedded_pravega_process(data_dir: str | os.PathLike[str] | None = None, **kwargs: object) -> Iterator[EmbeddedPravegaProcess]:
    """An embedded server process on free loopback ports (temporary data unless ``data_dir``)."""
    if data_dir is None:
        with tempfile.TemporaryDirectory(prefix="pravega-embedded-") as tmp:
            with EmbeddedPravegaProcess(tmp, **kwargs) as server:  # type: ignore[arg-type]
                yield server
    else:
        with EmbeddedPravegaProcess(data_dir, **kwargs) as server:  # type: ignore[arg-type]
            yield server
