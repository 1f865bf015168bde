"""Keep a transaction's lease alive after the process that wrote it has ended, until its job
commits or aborts it.

Why: a Spark write task (the ``pravega`` data source) writes one transaction and ends; the driver
commits every task's transaction only when the whole job is done. Nothing of the job lives in
between to renew a finished task's lease (the PySpark data source API gives the driver no
callback per finished task), so in a job longer than the lease the early transactions would
expire and the commit fail. A task therefore hands its transaction over to a keeper: one
background process per host and connection, started by the first task that needs it, renewing
every handed-over transaction until the controller no longer reports it OPEN (committed,
aborted) or until ``keep_s`` after the hand-over (the job's driver died: the lease then runs out
and Pravega aborts the transaction, as it would have without a keeper).

The hand-over is a small file per transaction in a spool directory (``$PRAVEGA_LEASE_KEEPER_DIR``
or ``<tmp>/pravega-lease-keeper-<uid>``, one subdirectory per connection, mode 0700: it holds
the connection's settings, credentials included). The keeper holds an exclusive ``flock`` on the
directory's lock file while it runs; a task writes its file first and starts a keeper only when
that lock is free, and a keeper that found nothing to do releases the lock before its last look,
so a transaction handed over while a keeper exits is never left without one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_KEEP_S", "hand_over", "keeper_pids", "spool_root", "stop_keepers"]

#: How long after a task ended its transaction is kept open waiting for the job's commit.
DEFAULT_KEEP_S = 3600.0
ENV = "PRAVEGA_LEASE_KEEPER_DIR"
_LOCK, _PID, _CONFIG, _LOG = "keeper.lock", "keeper.pid", "config.json", "keeper.log"


def spool_root() -> Path:
    return Path(os.environ.get(ENV) or Path(tempfile.gettempdir()) / f"pravega-lease-keeper-{os.getuid()}")


def _spool_for(config: Any) -> Path:
    settings = json.dumps(dataclasses.asdict(config), sort_keys=True)
    spool = spool_root() / hashlib.sha256(settings.encode()).hexdigest()[:16]
    spool.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not (spool / _CONFIG).exists():
        _write_atomically(spool / _CONFIG, settings)
    return spool


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def hand_over(config: Any, scope: str, stream: str, txn_id: int, keep_s: float = DEFAULT_KEEP_S) -> Path:
    """Have this host's keeper renew ``txn_id``'s lease from now on (see the module doc); returns
    the spool directory."""
    spool = _spool_for(config)
    entry = {"scope": scope, "stream": stream, "txn": txn_id, "until": time.time() + keep_s}
    _write_atomically(spool / f"{txn_id:032x}.txn", json.dumps(entry))
    _ensure_keeper(spool)
    return spool


def _ensure_keeper(spool: Path) -> None:
    with open(spool / _LOCK, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a keeper runs (and looks at the spool again before it exits)
        fcntl.flock(lock, fcntl.LOCK_UN)
    # Through a shell that exits at once: the keeper is nobody's child (no zombie in a long-lived
    # Spark Python worker) and in its own session (a task's process group ending does not end it).
    started = subprocess.run(["sh", "-c", '"$0" -m airflow_provider_pravega.client.lease_handoff "$1" '
                                          '</dev/null >>"$1/keeper.log" 2>&1 &', sys.executable, str(spool)],
                             start_new_session=True, check=False)
    if started.returncode != 0:
        raise OSError(f"could not start a lease keeper for {spool} (sh exited {started.returncode})")


def _entries(spool: Path) -> list[Path]:
    return sorted(spool.glob("*.txn"))


def serve(spool: Path) -> int:
    """The keeper's loop (``python -m airflow_provider_pravega.client.lease_handoff SPOOL``)."""
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.config import PravegaConnectionConfig
    from airflow_provider_pravega.client.transactions import TxnStatus

    lock = open(spool / _LOCK, "a+")  # noqa: SIM115 - held for the keeper's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another keeper serves this spool
    (spool / _PID).write_text(str(os.getpid()))
    config = PravegaConnectionConfig(**json.loads((spool / _CONFIG).read_text()))
    interval = max(0.5, min(10.0, config.transaction_lease_ms / 3000))
    idle_since: float | None = None
    with PravegaClient(config) as client:
        while True:
            for path in _entries(spool):
                try:
                    entry = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                if time.time() > entry["until"]:
                    log.warning("transaction %032x on %s/%s was not committed within its keep time: its lease "
                                "now runs out", entry["txn"], entry["scope"], entry["stream"])
                    path.unlink(missing_ok=True)
                    continue
                try:
                    status = client.transactions.ping(entry["scope"], entry["stream"], entry["txn"])
                except Exception as exc:  # controller away, lease refused: try again next round
                    log.warning("renewing transaction %032x failed: %s", entry["txn"], exc)
                    continue
                if status != TxnStatus.OPEN:  # committed or aborted by its job (or expired)
                    path.unlink(missing_ok=True)
            if _entries(spool):
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= 2 * interval:
                with contextlib.suppress(FileNotFoundError):
                    (spool / _PID).unlink()
                fcntl.flock(lock, fcntl.LOCK_UN)
                if not _entries(spool):
                    return 0
                try:  # handed over while we were leaving: it saw our lock, so we stay
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return 0  # a new keeper took over
                (spool / _PID).write_text(str(os.getpid()))
                idle_since = None
            time.sleep(interval)


def keeper_pids(root: Path | None = None) -> list[int]:
    """The keepers running under ``root`` (default: :func:`spool_root`)."""
    pids = []
    for pid_file in (root or spool_root()).glob(f"*/{_PID}"):
        with contextlib.suppress(OSError, ValueError):
            pids.append(int(pid_file.read_text()))
    return pids


def stop_keepers(root: Path | None = None) -> None:
    """Stop every keeper under ``root`` (their transactions' leases then run out)."""
    for pid in keeper_pids(root):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s lease keeper %(process)d: %(message)s")
    sys.exit(serve(Path(sys.argv[1])))
