"""Daily export of what the exactly-once ingest committed for each day, into one Delta Lake table.

The Delta variant of ``pravega_stream_cut_export``: the same wait for the ingest of the same day
and the same range (``from_ingest``), built by the same ``pravega_examples_common`` function. Each
day is one partition of the table at ``<data>/export/readings_delta`` (``$PRAVEGA_EXAMPLES_DATA``,
default ``/data``): column ``interval_key``, the run's data interval, beside the JSON events as
columns and ``scope``, ``stream``, ``segment_id``, ``offset``. A day is written as one idempotent
Delta commit, so a retry, a rerun or a backfill (``--reprocess-behavior completed`` or ``failed``)
of a day already exported commits nothing, and days exported late or out of order are each in the
table once; a day whose ingest committed more later is replaced once. Each table version's commit
metadata (``userMetadata``, JSON) names the day and its stream cuts (``start_cut``, ``end_cut``).
The table is the export task's outlet asset, so downstream DAGs can be scheduled on it.

Delta must be in the Spark session: the operator adds Delta's package (``spark.jars.packages``,
fetched from Maven Central the first time) to a local or classic session it starts; a Spark
Connect server must have Delta already (``scripts/stack``'s does not: start the stack with
``--no-spark-connect`` to run this DAG there).
"""

from __future__ import annotations

from airflow.sdk import DAG
from pravega_examples_common import data_dir, stream_cut_export_dag

dag: DAG = stream_cut_export_dag(
    "pravega_stream_cut_export_delta", output_path=data_dir() + "/export/readings_delta", format="delta"
)
