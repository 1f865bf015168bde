"""A DAG that runs whenever new sensor readings arrive in the stream (event-driven, no schedule).

``PravegaStreamTrigger`` (through common.messaging's ``MessageQueueTrigger``) watches the tail of
``iot/readings`` in the triggerer; each time it moves past the last seen stream cut, the asset event
carries the cut before and after the new data, and this DAG exports exactly that range (the same stream-cut export as the daily DAG, but bounded by
the event's cuts instead of an interval).
"""

from __future__ import annotations

from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher, task
from pravega_examples_common import SCOPE, STREAM, data_dir, spark_conn_id

from airflow_provider_pravega.hooks.pravega import PravegaHook

# The asset's URI names the controller of the `pravega_default` connection. The watcher is Airflow's
# MessageQueueTrigger with this provider's `pravega` scheme (a PravegaStreamTrigger underneath). It
# starts at the stream's head, so readings written before the triggerer first saw the stream (or
# before the stream existed: it waits for it) are announced too; then it resumes from the last cut
# it reported. On Airflow 3.3 it runs on the triggerer's shared stream: every watcher of iot/readings
# shares one poll, and the cut is saved only once the asset event is stored (a range is repeated
# only if the triggerer dies in between, never skipped; docs/sensors-triggers.md, "Delivery").
# Needs apache-airflow-providers-common-messaging (the provider's `messaging` extra).
readings = Asset(
    PravegaHook.asset_uri(SCOPE, STREAM),
    watchers=[AssetWatcher(name="iot_readings_tail",
                           trigger=MessageQueueTrigger(scheme="pravega", scope=SCOPE, stream=STREAM,
                                                       after_cut="head", poll_interval=30))],
)

DATA = data_dir()

with DAG(dag_id="pravega_on_new_readings", schedule=[readings], tags=["pravega", "example"]) as dag:

    @task
    def export_new_range(**context) -> dict:
        """Export the events between the asset events' cuts (head → tail when run by hand)."""
        from airflow_provider_pravega.spark.export_job import ExportSpec, run_export
        from airflow_provider_pravega.spark.session import get_spark_session

        # One run gets every event since the previous run, in order: from the first one's start to
        # the last one's end (reading only the last would skip the ranges before it).
        events = context.get("triggering_asset_events", {}).get(readings) or []
        first = events[0].extra.get("payload", {}) if events else {}
        last = events[-1].extra.get("payload", {}) if events else {}
        start, end = first.get("previous_cut", "head"), last.get("cut", "tail")
        run_id = context["run_id"].replace(":", "_").replace("+", "_")
        spec = ExportSpec(scope=SCOPE, stream=STREAM, start_cut=start, end_cut=end,
                          output_path=f"{DATA}/export/on-new-readings/{run_id}", format="jsonl",
                          export_id="pravega_on_new_readings")
        with PravegaHook().get_client() as client:
            result = run_export(client, get_spark_session(spark_conn_id(), "pravega-on-new-readings"), spec)
        return result if isinstance(result, dict) else result.to_dict()

    export_new_range()
