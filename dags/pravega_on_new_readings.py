"""A DAG that runs whenever new sensor readings arrive in the stream (event-driven, no schedule).

``PravegaStreamTrigger`` (through common.messaging's ``MessageQueueTrigger``) watches the tail of
``iot/readings`` in the triggerer (``pravega_examples_common.new_readings_asset``); each time it
moves past the last seen stream cut, the asset event carries the cut before and after the new data,
and this DAG exports exactly that range (the same stream-cut export as the daily DAG, but bounded by
the event's cuts instead of an interval). ``pravega_count_new_readings`` runs on the same events
without Spark.
"""

from __future__ import annotations

from airflow.sdk import DAG, task
from pravega_examples_common import SCOPE, STREAM, data_dir, new_range, new_readings_asset, spark_conn_id

from airflow_provider_pravega.hooks.pravega import PravegaHook

readings = new_readings_asset()
DATA = data_dir()

with DAG(dag_id="pravega_on_new_readings", schedule=[readings], tags=["pravega", "example"]) as dag:

    @task
    def export_new_range(**context) -> dict:
        """Export the events between the asset events' cuts (head → tail when run by hand)."""
        from airflow_provider_pravega.spark.export_job import ExportSpec, run_export
        from airflow_provider_pravega.spark.session import get_spark_session

        start, end = new_range(context.get("triggering_asset_events", {}).get(readings) or [])
        run_id = context["run_id"].replace(":", "_").replace("+", "_")
        spec = ExportSpec(scope=SCOPE, stream=STREAM, start_cut=start, end_cut=end,
                          output_path=f"{DATA}/export/on-new-readings/{run_id}", format="jsonl",
                          export_id="pravega_on_new_readings")
        with PravegaHook().get_client() as client:
            result = run_export(client, get_spark_session(spark_conn_id(), "pravega-on-new-readings"), spec)
        return result if isinstance(result, dict) else result.to_dict()

    export_new_range()
