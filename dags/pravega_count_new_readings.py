"""A DAG that counts each batch of new sensor readings as it arrives (event-driven, no Spark).

Scheduled on the same watched asset as ``pravega_on_new_readings``
(``pravega_examples_common.new_readings_asset``: one watcher, one trigger for both DAGs). Each run
reads the events between its asset events' cuts straight from the segment store and returns the
range with how many readings it holds: the run's share of the stream, once.
"""

from __future__ import annotations

from airflow.sdk import DAG, task
from pravega_examples_common import SCOPE, STREAM, new_range, new_readings_asset

from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_ranges
from airflow_provider_pravega.client.streamcut import StreamCut
from airflow_provider_pravega.hooks.pravega import PravegaHook

readings = new_readings_asset()

with DAG(dag_id="pravega_count_new_readings", schedule=[readings], tags=["pravega", "example"]) as dag:

    @task
    def count_new_readings(**context) -> dict:
        """The new range (head → tail when run by hand) and the number of readings in it."""
        events = context.get("triggering_asset_events", {}).get(readings) or []
        start, end = new_range(events)
        with PravegaHook().get_client() as client:
            ranges = plan_segment_ranges(client, StreamCut.coerce(start, SCOPE, STREAM, unbounded="head"),
                                         StreamCut.coerce(end, SCOPE, STREAM, unbounded="tail"))
            count = sum(1 for _ in read_segment_ranges(client, ranges))
        return {"previous_cut": start, "cut": end, "asset_events": len(events), "readings": count}

    count_new_readings()
