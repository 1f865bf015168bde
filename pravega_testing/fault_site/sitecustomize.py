"""The fault hook of the processes a crash test starts: :func:`pravega_testing.faults.fault_env`
puts this directory first on their ``PYTHONPATH``, so Python imports this module at start-up in
the process itself and in every process that inherits its environment (Spark's driver JVM, and
the Python workers that JVM starts). It installs a hook into
``airflow_provider_pravega.fault_points`` that acts at the step the variables below name; without
them it installs nothing. Only this harness reads these variables, never the provider.

It shadows any other ``sitecustomize`` (the venv has none; Debian's only enables apport).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

#: SIGKILL the process at this step (in a Spark task: its first attempt only, so the retry completes).
KILL_AT = "PRAVEGA_INGEST_CRASH_AT"
#: ``step:seconds``: pause at the step that long, or until the file ``DELAY_RELEASE`` names exists.
DELAY_AT = "PRAVEGA_INGEST_DELAY_AT"
DELAY_RELEASE = "PRAVEGA_INGEST_DELAY_RELEASE"
#: Hold at this step: create ``<HOLD_DIR>/<step>.<pid>``, wait until ``<HOLD_DIR>/release`` exists.
HOLD_AT = "PRAVEGA_WRITE_HOLD_AT"
HOLD_DIR = "PRAVEGA_WRITE_HOLD_DIR"
NAMES = (KILL_AT, DELAY_AT, DELAY_RELEASE, HOLD_AT, HOLD_DIR)

log = logging.getLogger("pravega_testing.faults")


def _first_attempt() -> bool:
    pyspark = sys.modules.get("pyspark")
    tc = pyspark.TaskContext.get() if pyspark is not None else None
    return tc is None or tc.attemptNumber() == 0


def act(step: str, env: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """What the variables in ``env`` ask for at ``step``: kill, pause, hold or nothing."""
    if env.get(KILL_AT) == step and _first_attempt():
        log.warning("fault injection: SIGKILL at %s", step)
        os.kill(os.getpid(), signal.SIGKILL)
    delay_step, _, seconds = env.get(DELAY_AT, "").partition(":")
    if delay_step == step:
        log.warning("fault injection: pausing %s s at %s", seconds, step)
        release = env.get(DELAY_RELEASE)
        deadline = time.monotonic() + float(seconds)
        while time.monotonic() < deadline and not (release and os.path.exists(release)):
            time.sleep(0.2)
    hold = env.get(HOLD_DIR)
    if env.get(HOLD_AT) == step and hold:
        log.warning("fault injection: holding at %s", step)
        open(os.path.join(hold, f"{step}.{os.getpid()}"), "a").close()
        while not os.path.exists(os.path.join(hold, "release")):
            time.sleep(0.2)


def _install() -> None:
    if any(os.environ.get(name) for name in NAMES):
        from airflow_provider_pravega import fault_points

        fault_points.install(act)


_install()
