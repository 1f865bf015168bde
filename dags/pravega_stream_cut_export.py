"""Daily export of what the exactly-once ingest committed for each day, to Parquet.

The pair with ``pravega_exactly_once_ingest``: each ingest run records, in the ingest's state, the
stream cuts around what it committed for its data interval; this DAG waits for the ingest of the
same day (its commit sensor) and exports exactly that range (``from_ingest``). So each day's folder
holds that day's records, also when days run late, out of order, in a catchup or a backfill; events
another writer appended to the stream while the ingest committed are exported with that day.
Re-running a day rewrites the same rows. Output: ``<data>/export/readings/{{ ds }}/``
(``$PRAVEGA_EXAMPLES_DATA``, default ``/data``), with the JSON events as columns. The DAG itself is
built by ``pravega_examples_common.stream_cut_export_dag`` (shared with the Delta variant,
``pravega_stream_cut_export_delta``).
"""

from __future__ import annotations

from airflow.sdk import DAG
from pravega_examples_common import data_dir, stream_cut_export_dag

dag: DAG = stream_cut_export_dag("pravega_stream_cut_export", output_path=data_dir() + "/export/readings/{{ ds }}",
                            format="parquet")
