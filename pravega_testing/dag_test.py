"""Run a DAG defined in a test with Airflow's own ``dag.test()``.

Airflow 3.3's ``dag.test()`` needs the DAG serialized in the metadata DB (normally the DAG
processor's job); a DAG defined in a test module belongs to no DAG bundle, so it is written there
directly. The metadata DB (e.g. SQLite in a temporary AIRFLOW_HOME) is created on first use.
"""

from __future__ import annotations

from typing import Any


def ensure_airflow_db() -> None:
    """Create the metadata DB that AIRFLOW_HOME / the SQL Alchemy URL point at, once."""
    from airflow import settings
    from airflow.utils.db import initdb
    from sqlalchemy import inspect

    if not inspect(settings.engine).has_table("task_instance"):
        initdb()


def run_dag(dag: Any, **test_kwargs: Any) -> Any:
    """Register ``dag`` as parsed, then ``dag.test(**test_kwargs)`` in this process; returns the DagRun."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    ensure_airflow_db()
    with create_session() as session:
        DagBundlesManager().sync_bundles_to_db(session=session)
    with create_session() as session:
        update_dag_parsing_results_in_db(
            "dags-folder", None, [LazyDeserializedDAG.from_dag(dag)], {}, None, set(), session=session
        )
    return dag.test(**test_kwargs)
