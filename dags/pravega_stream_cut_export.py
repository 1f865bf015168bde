"""Daily export of what the exactly-once ingest committed for each day, to Parquet.

The pair with ``pravega_exactly_once_ingest``: each ingest run records, in the ingest's state, the
stream cuts around what it committed for its data interval; this DAG waits for the ingest of the
same day (its commit sensor) and exports exactly that range (``from_ingest``). So each day's folder
holds that day's records, also when days run late, out of order, in a catchup or a backfill; events
another writer appended to the stream while the ingest committed are exported with that day.
Re-running a day rewrites the same rows. Output: ``<data>/export/readings/{{ ds }}/``
(``$PRAVEGA_EXAMPLES_DATA``, default ``/data``), with the JSON events as columns.
"""

from __future__ import annotations

from airflow.providers.standard.sensors.external_task import ExternalTaskSensor
from airflow.sdk import DAG
from pravega_examples_common import SCOPE, STREAM, daily, data_dir, spark_conn_id

from airflow_provider_pravega.operators import PravegaStreamCutExportOperator

DATA = data_dir()
INGEST_DAG = "pravega_exactly_once_ingest"

with DAG(dag_id="pravega_stream_cut_export", **daily()) as dag:
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
        output_path=DATA + "/export/readings/{{ ds }}",
        format="parquet",
        event_format="json",
        spark_conn_id=spark_conn_id(),
    )
    ingested >> export
