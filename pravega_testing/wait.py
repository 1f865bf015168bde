"""One bounded poll loop for scripts and tests that wait on real processes (``scripts/stack``, the
topology test): no bare ``while True`` with its own deadline arithmetic in each place."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """``wait_until`` ran out of time; the message says what was awaited (and ``details()``)."""


def wait_until(what: str, done: Callable[[], T], timeout_s: float, *, poll_s: float = 1.0,
               details: Callable[[], str] | None = None, on_poll: Callable[[], Any] | None = None) -> T:
    """Call ``done()`` every ``poll_s`` until it returns something truthy, and return that.

    ``done`` may raise to give up early (a process it waits on died). After ``timeout_s``:
    :class:`WaitTimeout` naming ``what`` and, when given, the text ``details()`` returns (logs).
    ``on_poll`` runs before each check (keeping a lease alive while waiting)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if on_poll is not None:
            on_poll()
        result = done()
        if result:
            return result
        if time.monotonic() > deadline:
            extra = details() if details is not None else ""
            raise WaitTimeout(f"waited {timeout_s:.0f} s for {what}" + (f"\n{extra}" if extra else ""))
        time.sleep(poll_s)
