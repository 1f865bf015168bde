"""Daily export of what the readings stream received, between two stream cuts, to Parquet.

Each interval exports from where the previous one ended (``start_cut="previous"``) to the stream's
tail at its first run; the cuts are recorded per interval, so re-running or backfilling an
interval writes exactly the same rows again, and consecutive intervals tile the stream with no gap
and no overlap. Output: ``<data>/export/readings/{{ ds }}/`` (``$PRAVEGA_EXAMPLES_DATA``, default
``/data``), with the JSON events as columns.
"""

from __future__ import annotations

from airflow.sdk import DAG
from pravega_examples_common import SCOPE, STREAM, daily, data_dir

from airflow_provider_pravega.operators import PravegaStreamCutExportOperator

DATA = data_dir()

with DAG(dag_id="pravega_stream_cut_export", **daily()) as dag:
    PravegaStreamCutExportOperator(
        task_id="export",
        scope=SCOPE,
        stream=STREAM,
        start_cut="previous",
        end_cut="tail",
        output_path=DATA + "/export/readings/{{ ds }}",
        format="parquet",
        event_format="json",
    )
