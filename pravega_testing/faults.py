"""Fault injection for the crash tests, from outside the provider: the provider's named steps
(``airflow_provider_pravega.fault_points``) do nothing until a hook is installed.

* A process the test starts: pass it ``fault_env(kill_at=..., delay_at=..., hold_at=...)``; the
  ``sitecustomize`` in ``fault_site/`` (first on its ``PYTHONPATH``) installs the hook there and in
  the processes it starts (Spark's JVM and Python workers inherit the environment).
* The test's own process: ``with installed(hook): ...``, or ``installed_for_test(monkeypatch, hook)``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from airflow_provider_pravega import fault_points
from pravega_testing.fault_site.sitecustomize import DELAY_AT, DELAY_RELEASE, HOLD_AT, HOLD_DIR, KILL_AT, NAMES

__all__ = ["SITE_DIR", "fault_env", "fault_spark_conf", "installed", "installed_for_test"]

#: The directory fault_env puts first on PYTHONPATH (its sitecustomize installs the hook).
SITE_DIR = Path(__file__).resolve().parent / "fault_site"


def fault_env(*, kill_at: str | None = None, delay_at: str | None = None, delay_s: float = 600,
              release: str | os.PathLike[str] | None = None, hold_at: str | None = None,
              hold_dir: str | os.PathLike[str] | None = None,
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) for a process that, at the named step, is
    SIGKILLed (``kill_at``), pauses ``delay_s`` or until ``release`` exists (``delay_at``), or
    holds until ``<hold_dir>/release`` exists (``hold_at``). Fault variables of ``base`` are dropped."""
    if hold_at is not None and hold_dir is None:
        raise ValueError(f"hold_at={hold_at!r} needs hold_dir")
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in NAMES}
    if kill_at is not None:
        env[KILL_AT] = kill_at
    if delay_at is not None:
        env[DELAY_AT] = f"{delay_at}:{delay_s:g}"
        if release is not None:
            env[DELAY_RELEASE] = os.fspath(release)
    if hold_at is not None:
        env[HOLD_AT] = hold_at
        env[HOLD_DIR] = os.fspath(hold_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE_DIR), env.get("PYTHONPATH")]))
    return env


def fault_spark_conf(prefix: str, pythonpath: str, **faults: object) -> dict[str, str]:
    """The same as Spark settings ``prefix + NAME`` (``spark.yarn.appMasterEnv.``: a cluster-mode
    driver), with ``pythonpath`` after the fault site (those settings replace the whole variable)."""
    env = fault_env(base={"PYTHONPATH": pythonpath}, **faults)  # type: ignore[arg-type]
    return {prefix + key: value for key, value in env.items()}


@contextmanager
def installed(hook: Callable[[str], None]) -> Iterator[None]:
    """Call ``hook(step)`` at every step this process reaches inside the block."""
    previous = fault_points.install(hook)
    try:
        yield
    finally:
        fault_points.install(previous)


def installed_for_test(monkeypatch: Any, hook: Callable[[str], None]) -> None:
    """Call ``hook(step)`` at every step this process reaches until the test ends (pytest's
    ``monkeypatch`` puts the previous hook back)."""
    monkeypatch.setattr(fault_points, "_hook", hook)
