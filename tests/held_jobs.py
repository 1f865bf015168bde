"""Driving a job (a user's PySpark script run as its own process) to one of the data source's hold
points (``PRAVEGA_WRITE_HOLD_AT``): the tests wait for the hold file, act, then release or kill."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def wait_until_held(job: subprocess.Popen, held: Path, what: str, bound_s: float = 600.0) -> None:
    """Return once ``job`` waits at its hold point (a file appeared in ``held``); fail with its
    stderr if it ended first. ``bound_s`` is a bound for a loaded machine, not a timing assertion."""
    deadline = time.monotonic() + bound_s
    while not list(held.iterdir()):
        assert job.poll() is None, job.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"the job never reached {what}"
        time.sleep(0.2)


def release(job: subprocess.Popen, held: Path, bound_s: float = 600.0) -> tuple[str, str]:
    """Let ``job`` go on from its hold point; its (stdout, stderr) once it ended."""
    (held / "release").touch()
    return job.communicate(timeout=bound_s)


def kill_if_running(job: subprocess.Popen) -> None:
    """SIGKILL the job's process group (its driver JVM and Python workers) if it still runs."""
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
