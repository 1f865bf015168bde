"""The named steps of the exactly-once protocol where a test harness may act on the process.

Production code calls :func:`reached` at each step (``after_commit_record``, ``task_mid_write``,
``job_commit`` ...); it does nothing unless a test harness installed a hook with :func:`install`
(``pravega_testing/faults.py`` does, in every process a crash test starts). Nothing here reads the
environment or ends a process: a deployment cannot turn a variable into a crash.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["install", "reached"]

_hook: Callable[[str], None] | None = None


def install(hook: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """Call ``hook(step)`` at every step from now on (None: nothing again); returns the hook it replaces."""
    global _hook
    previous, _hook = _hook, hook
    return previous


def reached(step: str) -> None:
    """This process is at ``step``: the installed hook's turn, if any."""
    hook = _hook
    if hook is not None:
        hook(step)
