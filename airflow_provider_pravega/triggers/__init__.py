"""Pravega triggers: transactions committed (deferrable sensor) and new stream data (also for AssetWatcher).

Imports are lazy (PEP 562) for the reason given in ``airflow_provider_pravega.operators``.
"""

from __future__ import annotations

from airflow_provider_pravega._lazy import lazy_exports

_EXPORTS = {
    "PravegaStreamTrigger": "airflow_provider_pravega.triggers.stream",
    "PravegaTransactionTrigger": "airflow_provider_pravega.triggers.transaction",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
