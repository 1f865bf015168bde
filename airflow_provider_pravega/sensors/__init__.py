"""Pravega sensors for Airflow DAGs: ``from airflow_provider_pravega.sensors import ...``.

Imports are lazy (PEP 562) for the reason given in ``airflow_provider_pravega.operators``.
"""

from __future__ import annotations

from airflow_provider_pravega._lazy import lazy_exports

_EXPORTS = {
    "PravegaStreamSensor": "airflow_provider_pravega.sensors.stream",
    "PravegaTransactionFailedError": "airflow_provider_pravega.sensors.transaction",
    "PravegaTransactionSensor": "airflow_provider_pravega.sensors.transaction",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
