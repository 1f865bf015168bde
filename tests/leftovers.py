"""What the suite must leave behind: nothing. Checked when each pytest process ends
(``pytest_sessionfinish`` in conftest.py), after every fixture was torn down:

* **no process** started during the session is still alive — found by a marker in the environment
  every child inherits (``PRAVEGA_TEST_SESSION``), so a process that detached itself (a new
  session, reparented to init) is found too; a process still exiting gets a grace period;
* **no secret on disk**: no file under the temporary directory written during the session holds a
  test password in plain text, outside the directories tests create themselves (pytest's
  ``tmp_path``s, the test Airflow home) and the checkout. Spark's scratch directories and anything
  the provider writes there are scanned.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

ENV = "PRAVEGA_TEST_SESSION"
# Helpers the standard library starts beside this very process and ends when it exits (their pipe
# to it closes): not something a test left behind.
OWN_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
GRACE_S = float(os.environ.get("PRAVEGA_LEFTOVER_GRACE_S", "60"))  # processes still shutting down (a JVM after stop()) on a loaded machine
MAX_SCANNED_BYTES = 16 * 1024 * 1024


def mark_session() -> str:
    mark = os.environ.setdefault(ENV, uuid.uuid4().hex)
    return mark


def leftover_processes(mark: str, grace_s: float = GRACE_S) -> list[str]:
    """Processes (other than this one) carrying ``mark`` still alive after ``grace_s``; they are
    killed after being reported."""
    import psutil

    def find() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if proc.pid == os.getpid():
                continue
            try:
                if proc.ppid() == os.getpid() and any(h in " ".join(proc.cmdline()) for h in OWN_HELPERS):
                    continue
                if proc.environ().get(ENV) == mark and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    deadline = time.monotonic() + grace_s
    left = find()
    while left and time.monotonic() < deadline:
        time.sleep(1.0)
        left = find()
    report = []
    for proc in left:
        try:
            report.append(f"pid {proc.pid} (parent {proc.ppid()}): {' '.join(proc.cmdline())[:300]}")
            proc.kill()
        except psutil.Error:
            continue
    return report


def secrets_on_disk(secrets: Iterable[str], since: float, root: Path | None = None,
                    exclude: Iterable[Path] = ()) -> list[str]:
    """Files under ``root`` (the temporary directory) written since ``since`` (epoch seconds: the
    session's start) holding any of ``secrets`` in plain text."""
    root = Path(root or tempfile.gettempdir())
    needles = [s.encode() for s in secrets if s]
    skip = {Path(p).resolve() for p in exclude}
    hits = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=lambda _e: None):
        here = Path(dirpath).resolve()
        dirnames[:] = [d for d in dirnames if (here / d).resolve() not in skip and not d.startswith("pytest-of-")]
        for name in filenames:
            path = here / name
            try:
                info = path.lstat()
                if not path.is_file() or path.is_symlink() or info.st_mtime < since or info.st_size > MAX_SCANNED_BYTES:
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            if any(n in data for n in needles):
                hits.append(str(path))
    return hits
