"""Pravega sensors for Airflow DAGs: ``from airflow_provider_pravega.sensors import ...``.

Imports are lazy (PEP 562) for the reason given in ``airflow_provider_pravega.operators``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PravegaStreamSensor": "airflow_provider_pravega.sensors.stream",
    "PravegaTransactionFailedError": "airflow_provider_pravega.sensors.transaction",
    "PravegaTransactionSensor": "airflow_provider_pravega.sensors.transaction",
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
