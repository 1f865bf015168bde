"""Run a DAG defined in a test with Airflow's own ``dag.test()``, or backfill it in this process.

Airflow 3.3's ``dag.test()`` needs the DAG serialized in the metadata DB (normally the DAG
processor's job); a DAG defined in a test module belongs to no DAG bundle, so it is written there
directly. The metadata DB (e.g. SQLite in a temporary AIRFLOW_HOME) is created on first use.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any


def share_the_in_process_api() -> None:
    """Build Airflow's in-process execution API once per process, as Airflow 3.3 does.

    Airflow 3.2 builds a new one (its FastAPI app and versioned routes) for every task that
    ``dag.test()`` runs, which costs seconds per task on a loaded machine: enough for a DAG of a
    dozen tasks to outlive the leases its test holds. 3.3 caches it with ``lru_cache``.
    """
    from airflow.sdk.execution_time import supervisor

    if not hasattr(supervisor.in_process_api_server, "cache_info"):
        supervisor.in_process_api_server = functools.lru_cache(maxsize=1)(supervisor.in_process_api_server)


def ensure_airflow_db() -> None:
    """Create the metadata DB that AIRFLOW_HOME / the SQL Alchemy URL point at, once."""
    from airflow import settings
    from airflow.utils.db import initdb
    from sqlalchemy import inspect

    if not inspect(settings.engine).has_table("task_instance"):
        initdb()


def register_dag(dag: Any) -> None:
    """Write ``dag`` to the metadata DB as the DAG processor would (serialized, in the DAG folder's bundle)."""
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


def run_dag(dag: Any, **test_kwargs: Any) -> Any:
    """Register ``dag`` as parsed, then ``dag.test(**test_kwargs)`` in this process; returns the DagRun."""
    register_dag(dag)
    share_the_in_process_api()
    return dag.test(**test_kwargs)


def run_backfill(dag: Any, from_date: datetime, to_date: datetime, reprocess_behavior: str) -> list[Any]:
    """``airflow backfill create --dag-id <dag> --from-date … --to-date … --reprocess-behavior …``,
    run in this process without a scheduler; returns the DagRuns the backfill ran.

    ``dag.test()`` cannot express a backfill (it replaces the logical date's run with a manual one).
    Here Airflow's own backfill creation (``_create_backfill``, what the CLI command and the REST API
    call) decides which runs to create and which finished runs to clear for the reprocess behaviour
    (``none``, ``failed``, ``completed``); then each of its runs is started and its tasks run the way
    ``dag.test()`` runs them (Airflow's ``_run_task``, in this process), and the backfill is marked
    complete once they finished, as the scheduler does."""
    from airflow.models.backfill import Backfill, BackfillDagRun, ReprocessBehavior, _create_backfill
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    register_dag(dag)
    backfill = _create_backfill(dag_id=dag.dag_id, from_date=from_date, to_date=to_date, max_active_runs=1,
                                reverse=False, dag_run_conf=None, triggering_user_name="test",
                                reprocess_behavior=ReprocessBehavior(reprocess_behavior))
    with create_session() as session:
        run_ids = session.scalars(
            select(DagRun.id).join(BackfillDagRun, BackfillDagRun.dag_run_id == DagRun.id)
            .where(BackfillDagRun.backfill_id == backfill.id).order_by(BackfillDagRun.sort_ordinal)).all()
    runs = [_run_queued(dag, run_id) for run_id in run_ids]
    with create_session() as session:
        from airflow.sdk import timezone

        session.get(Backfill, backfill.id).completed_at = timezone.utcnow()
    return runs


def _run_queued(dag: Any, dag_run_id: int) -> Any:
    """Start a queued DagRun and run its tasks in this process until it finishes (``dag.test()``'s loop)."""
    import time

    from airflow import settings
    from airflow.models.dagrun import DagRun
    from airflow.sdk import timezone
    from airflow.sdk.definitions.dag import _run_task
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.utils.state import DagRunState, State, TaskInstanceState

    share_the_in_process_api()
    session = settings.Session()
    dr = session.get(DagRun, dag_run_id)
    dr.dag = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    dr.state = DagRunState.RUNNING  # what the scheduler does to a queued run it starts
    dr.start_date = timezone.utcnow()
    session.commit()
    while dr.state == DagRunState.RUNNING:
        session.expire_all()
        schedulable, _ = dr.update_state(session=session)
        for ti in schedulable:
            if ti.state != TaskInstanceState.UP_FOR_RESCHEDULE:
                ti.try_number += 1
            ti.state = TaskInstanceState.SCHEDULED
            ti.scheduled_dttm = timezone.utcnow()
        session.commit()
        tis = set(dr.get_task_instances(session=session))
        scheduled = [ti for ti in tis if ti.state == TaskInstanceState.SCHEDULED]
        if not scheduled and any(ti.state not in State.finished for ti in tis):
            time.sleep(1)  # e.g. a sensor waiting for its reschedule date
        for ti in scheduled:
            try:
                _run_task(ti=ti, task=dag.task_dict[ti.task_id], run_triggerer=True)
            except Exception:  # noqa: BLE001 - as dag.test(): the task's state says it
                pass
    session.close()
    return dr


def mark_run_failed(dag: Any, logical_date: datetime) -> None:
    """Mark the logical date's run of ``dag`` failed, as the UI or ``PATCH …/dagRuns/<id>`` with
    ``{"state": "failed"}`` does (Airflow's ``set_dag_run_state_to_failed``)."""
    from airflow.api.common.mark_tasks import set_dag_run_state_to_failed
    from airflow.models.dagrun import DagRun
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == dag.dag_id, DagRun.logical_date == logical_date))
        scheduler_dag = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
        set_dag_run_state_to_failed(dag=scheduler_dag, run_id=run.run_id, commit=True, session=session)
