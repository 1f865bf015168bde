"""Exactly-once ingestion of each day's sensor files into a Pravega stream.

create scope → create stream → transactional Spark ingest of ``<data>/incoming/{{ ds }}/*.jsonl``
(commits requested, not awaited) → wait for every transaction with the deferrable sensor → log the
stream's head and tail cuts. Daily; ``catchup`` makes backfills re-run old intervals, which ingest
nothing twice (files already ingested are skipped, crashed runs are recovered). Each run records
the stream cuts around what it committed under its data interval (the ingest's interval index):
``pravega_stream_cut_export`` exports exactly that range for the same day.

Data directory: ``$PRAVEGA_EXAMPLES_DATA`` (default ``/data``, as in docker-compose.yaml); sample
input: ``python scripts/generate_sample_data.py --out $PRAVEGA_EXAMPLES_DATA/incoming``.
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, task
from pravega_examples_common import SCOPE, STREAM, daily, data_dir, spark_conn_id

from airflow_provider_pravega.operators import (
    PravegaCreateScopeOperator,
    PravegaCreateStreamOperator,
    PravegaTransactionalIngestOperator,
)
from airflow_provider_pravega.sensors import PravegaTransactionSensor

DATA = data_dir()

with DAG(dag_id="pravega_exactly_once_ingest", **daily()) as dag:
    create_scope = PravegaCreateScopeOperator(task_id="create_scope", scope=SCOPE)
    create_stream = PravegaCreateStreamOperator(
        task_id="create_stream", scope=SCOPE, stream=STREAM, scaling_policy="fixed", segments=4,
        tags=["sensors"],
    )
    ingest = PravegaTransactionalIngestOperator(
        task_id="ingest",
        scope=SCOPE,
        stream=STREAM,
        source=DATA + "/incoming/{{ ds }}/*.jsonl",
        format="jsonl",
        routing_key_field="sensor_id",
        wait_for_commit=False,
        on_empty="succeed",
        spark_conn_id=spark_conn_id(),  # scripts/stack and scripts/demo: their Spark Connect server
        # How long a silent run of another copy (another day's run, a backfill) counts as alive; a
        # retry of this task takes its killed try's run over at once (the demo shortens it).
        stale_after_s=float(os.environ.get("PRAVEGA_EXAMPLES_STALE_AFTER_S", "60")),
    )
    committed = PravegaTransactionSensor(
        task_id="wait_for_commit",
        scope=SCOPE,
        stream=STREAM,
        transaction_ids="{{ ti.xcom_pull(task_ids='ingest')['transaction_ids'] or [] }}",
        # Records the ingest run done once committed (and accepts commits the controller forgot).
        ingest_run="{{ ti.xcom_pull(task_ids='ingest') }}",
        deferrable=True,
        poke_interval=1,
        timeout=600,
    )

    @task
    def stream_info(summary: dict) -> dict:
        """Log what this interval added and where the stream stands now."""
        from airflow_provider_pravega.client.streamcut import StreamCut
        from airflow_provider_pravega.hooks.pravega import PravegaHook

        with PravegaHook().get_client() as client:
            info = client.admin.stream_info(SCOPE, STREAM)
            tail = StreamCut.tail(client, SCOPE, STREAM).to_text()
        report = {
            "files_ingested": len(summary["files_ingested"]),
            "files_skipped": len(summary["files_skipped"]),
            "events": summary["events"],
            "transactions": summary["transaction_ids"],
            "segments": info.segment_count,
            "tail_cut": tail,
        }
        print(f"interval ingested: {report}")
        return report

    create_scope >> create_stream >> ingest >> committed
    committed >> stream_info(ingest.output)
