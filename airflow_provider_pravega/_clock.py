"""The provider's wall clock in milliseconds, the unit Pravega and the provider's records stamp
time in: one reading rule for every layer (imports nothing of the project)."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Now, in whole milliseconds since the epoch."""
    return int(time.time() * 1000)
