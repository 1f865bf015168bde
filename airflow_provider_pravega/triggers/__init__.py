"""Pravega triggers: transactions committed (deferrable sensor) and new stream data (also for AssetWatcher).

Imports are lazy (PEP 562) for the reason given in ``airflow_provider_pravega.operators``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PravegaStreamTrigger": "airflow_provider_pravega.triggers.stream",
    "PravegaTransactionTrigger": "airflow_provider_pravega.triggers.transaction",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
