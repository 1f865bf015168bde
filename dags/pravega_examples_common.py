"""What the example pipelines share: where their data lives, the stream they use, the daily
schedule with retries, and the daily export DAG (to files or to a Delta table). Not a pipeline
itself (listed in .airflowignore); the folder of these files is on the import path when they are
parsed, as every DAG folder is."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from typing import Any

SCOPE = "iot"
STREAM = "readings"
INGEST_DAG = "pravega_exactly_once_ingest"


def data_dir() -> str:
    """Input and output files: ``$PRAVEGA_EXAMPLES_DATA``, default ``/data`` (as in docker-compose.yaml);
    read when a pipeline file is parsed."""
    return os.environ.get("PRAVEGA_EXAMPLES_DATA", "/data")


def start_date() -> datetime:
    """The first daily interval: ``$PRAVEGA_EXAMPLES_START`` (an ISO date; ``scripts/stack`` and the
    topology test set it to limit catchup to a few days), default 2026-11-01."""
    text = os.environ.get("PRAVEGA_EXAMPLES_START", "2026-11-01")
    try:
        day = datetime.strptime(text, "%Y-%m-%d")
    except ValueError:
        raise ValueError(f"PRAVEGA_EXAMPLES_START must be a date like 2026-11-01, not {text!r}") from None
    return day.replace(tzinfo=timezone.utc)


def spark_conn_id() -> str:
    """The Spark connection of the examples' ingest and export tasks: ``$PRAVEGA_EXAMPLES_SPARK_CONN``,
    default ``spark_default`` (local mode on this worker when that connection does not exist).
    ``scripts/stack`` and ``scripts/demo`` point it at their warm local Spark Connect server
    (``spark_connect_default``); read when a pipeline file is parsed."""
    return os.environ.get("PRAVEGA_EXAMPLES_SPARK_CONN") or "spark_default"


#: Seconds between the event-driven examples' polls of the stream, unless ``$PRAVEGA_EXAMPLES_POLL_S`` says.
POLL_S = 30.0


def poll_interval() -> float:
    """Seconds between the event-driven examples' polls of the stream: ``$PRAVEGA_EXAMPLES_POLL_S``,
    default :data:`POLL_S` (tests poll often); read when a pipeline file is parsed."""
    return float(os.environ.get("PRAVEGA_EXAMPLES_POLL_S") or POLL_S)


def new_readings_asset() -> Any:
    """The asset of :data:`SCOPE`/:data:`STREAM` with its watcher, for the event-driven examples.

    One definition, so every DAG scheduled on it has the same watcher: Airflow keeps one trigger
    for it and each asset event starts a run of each of those DAGs. The watcher is
    common.messaging's ``MessageQueueTrigger`` with this provider's ``pravega`` scheme (a ``PravegaStreamTrigger``
    underneath); its asset URI names the controller of the ``pravega_default`` connection. It
    starts at the stream's head, so readings written before the triggerer first saw the stream (or
    before the stream existed: it waits for it) are announced too; then it resumes from the last
    cut it reported. On Airflow 3.3 it runs on the triggerer's shared stream: the cut is saved only
    once the asset event is stored (a range is repeated only if the triggerer dies in between,
    never skipped; docs/sensors-triggers.md, "Delivery"). Needs
    apache-airflow-providers-common-messaging (the provider's ``messaging`` extra).
    """
    # Here, not at the top: common.messaging is an optional extra that only these examples need.
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
    from airflow.sdk import Asset, AssetWatcher

    from airflow_provider_pravega.hooks.pravega import PravegaHook

    return Asset(
        PravegaHook.asset_uri(SCOPE, STREAM),
        watchers=[AssetWatcher(name="iot_readings_tail",
                               trigger=MessageQueueTrigger(scheme="pravega", scope=SCOPE, stream=STREAM,
                                                           after_cut="head", poll_interval=poll_interval()))],
    )


def new_range(events: list[Any]) -> tuple[str, str]:
    """(start, end) cuts of the new data a run of an event-driven example was started for.

    Airflow hands one run every asset event since the previous run, in order: the new data runs
    from the first event's ``previous_cut`` to the last one's ``cut`` (reading only the last would
    skip the ranges before it). Run by hand (no event): the whole stream, head to tail.
    """
    first = events[0].extra.get("payload", {}) if events else {}
    last = events[-1].extra.get("payload", {}) if events else {}
    return first.get("previous_cut", "head"), last.get("cut", "tail")


def daily(**overrides: Any) -> dict[str, Any]:
    """Keyword arguments of a daily example pipeline from :func:`start_date` with catchup, one run
    at a time, and two retries 5 s apart (a retry resumes or recovers a killed ingest: soon, while
    the killed try's transactions are still leased; docs/ingest.md, "What a retry does")."""
    return {
        "schedule": "@daily",
        "start_date": start_date(),
        "catchup": True,
        "max_active_runs": 1,
        "default_args": {"retries": 2, "retry_delay": timedelta(seconds=5)},
        "tags": ["pravega", "example"],
        **overrides,
    }


def stream_cut_export_dag(dag_id: str, *, output_path: str, format: str) -> Any:
    """The daily export of what the exactly-once ingest (:data:`INGEST_DAG`) committed for each day.

    Waits for the ingest of the same day (its commit sensor) and exports exactly that day's range
    (``from_ingest``), whatever order the days run in; ``output_path`` and ``format`` are the
    export operator's (a folder per day for the file formats, one table for ``delta``)."""
    from airflow.providers.standard.sensors.external_task import ExternalTaskSensor
    from airflow.sdk import DAG

    from airflow_provider_pravega.operators import PravegaStreamCutExportOperator

    with DAG(dag_id=dag_id, **daily()) as dag:
        ingested = ExternalTaskSensor(
            task_id="wait_for_ingest",
            external_dag_id=INGEST_DAG,
            external_task_id="wait_for_commit",  # the day's commits are complete and recorded
            allowed_states=["success"],
            failed_states=["failed", "upstream_failed"],
            mode="reschedule",
            poke_interval=30,
            timeout=6 * 3600,
        )
        export = PravegaStreamCutExportOperator(
            task_id="export",
            scope=SCOPE,
            stream=STREAM,
            from_ingest=f"{INGEST_DAG}.ingest",  # the ingest operator's default ingest id: <dag_id>.<task_id>
            output_path=output_path,
            format=format,
            event_format="json",
            spark_conn_id=spark_conn_id(),
        )
        ingested >> export
    return dag
