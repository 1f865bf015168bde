"""Pravega operators for Airflow DAGs: ``from airflow_provider_pravega.operators import ...``.

Imports are lazy (PEP 562): Airflow's ProvidersManager imports this package while it reads
``get_provider_info()`` during its own configuration start-up, when importing ``airflow.sdk``
would be circular. To add an operator, add one line to ``_EXPORTS`` (class name -> module).
"""

from __future__ import annotations

from airflow_provider_pravega._lazy import lazy_exports

_EXPORTS = {
    "PravegaCreateScopeOperator": "airflow_provider_pravega.operators.admin",
    "PravegaCreateStreamOperator": "airflow_provider_pravega.operators.admin",
    "PravegaDeleteScopeOperator": "airflow_provider_pravega.operators.admin",
    "PravegaDeleteStreamOperator": "airflow_provider_pravega.operators.admin",
    "PravegaScaleStreamOperator": "airflow_provider_pravega.operators.admin",
    "PravegaSealStreamOperator": "airflow_provider_pravega.operators.admin",
    "PravegaStreamCutExportOperator": "airflow_provider_pravega.operators.export",
    "PravegaTransactionalIngestOperator": "airflow_provider_pravega.operators.ingest",
    "PravegaTruncateStreamOperator": "airflow_provider_pravega.operators.admin",
    "PravegaUpdateStreamOperator": "airflow_provider_pravega.operators.admin",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
