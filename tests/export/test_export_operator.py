"""PravegaStreamCutExportOperator in real Airflow (``dag.test()``): three consecutive daily runs with
writes in between tile the stream; re-running a day reproduces its files byte for byte; an ingest's
XCom cut bounds an export; bad input fails the task with a clear message; OpenLineage datasets."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pravega_testing.net import first_controller
from export_files import by_partition
from pravega_clients import stream_writer

from airflow_provider_pravega.client import PravegaClient
from pravega_testing.net import free_port
from airflow_provider_pravega.client.streamcut import StreamCut, StreamCutMismatchError

DAYS = ["2026-11-20", "2026-11-21", "2026-11-22"]


def write(uri: str, scope: str, stream: str, prefix: str, count: int) -> list[str]:
    writer = stream_writer(uri, scope, stream)
    events = [f"{prefix}-{i:05d}" for i in range(count)]
    for i, event in enumerate(events):
        writer.write_event(event, routing_key=f"k{i % 9}")
    writer.flush()
    return events


def parts(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.name.startswith("part-") and not p.name.endswith(".crc"))


def events_in(path: Path) -> list[str]:
    return [e for p in parts(path) for e in pq.read_table(p).column("event").to_pylist()]


def day(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_daily_runs_tile_the_stream_and_a_rerun_reproduces_its_day(tmp_path, spark, run_dag, pravega_default_conn,
                                                                    unique_name):
    from airflow.sdk import DAG, task

    from airflow_provider_pravega.operators import PravegaStreamCutExportOperator

    uri = pravega_default_conn
    scope = unique_name("daily")
    with PravegaClient(uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "readings", 3)
    results: list[dict] = []
    with DAG(dag_id=f"export_{scope.replace('-', '_')}", schedule="@daily", start_date=day(DAYS[0]),
             catchup=False) as dag:
        export = PravegaStreamCutExportOperator(
            task_id="export", scope="{{ params.scope }}", stream="readings",
            output_path=str(tmp_path / "lake" / "{{ ds }}") + "/", spark_conn_id=None, params={"scope": scope},
        )

        @task
        def keep(summary: dict) -> None:
            results.append(summary)

        keep(export.output)

    written: dict[str, list[str]] = {}
    intervals: list[str] = []
    for n, d in enumerate(DAYS):
        written[d] = write(uri, scope, "readings", f"day{n}", 300 + 100 * n)
        if n == 1:
            with PravegaClient(uri) as client:  # scaling between runs changes nothing for the exports
                client.admin.split_segment(scope, "readings", 0)
            written[d] += write(uri, scope, "readings", f"day{n}b", 50)
        run = run_dag(dag, logical_date=day(d))
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
        assert states == {"export": "success", "keep": "success"}, states
        # The run's data interval is the key of the recorded cuts (Airflow 3's @daily timetable
        # makes it the point [logical date, logical date]; either way one key per scheduled run).
        intervals.append(f"{run.data_interval_start.isoformat()}/{run.data_interval_end.isoformat()}")

    for d, interval, summary in zip(DAYS, intervals, results, strict=True):
        out = tmp_path / "lake" / d
        assert Counter(events_in(out)) == Counter(written[d]), d
        assert summary["interval"] == interval and interval.startswith(f"{d}T00:00:00+00:00/")
        assert summary["export_id"] == f"{dag.dag_id}.export" and summary["events"] == len(written[d])
        assert summary["files"] == [str(p) for p in parts(out)]
    assert [r["start_cut"] for r in results[1:]] == [r["end_cut"] for r in results[:-1]]
    everything = [e for d in DAYS for e in events_in(tmp_path / "lake" / d)]
    assert len(everything) == len(set(everything)) == sum(map(len, written.values()))

    # Late data, then a re-run of the middle day: same cuts, the same files (but for Spark's write
    # UUID in their names), the same bytes.
    write(uri, scope, "readings", "late", 40)
    before = by_partition(tmp_path / "lake" / DAYS[1])
    run = run_dag(dag, logical_date=day(DAYS[1]))
    assert {ti.task_id: str(ti.state) for ti in run.get_task_instances()}["export"] == "success"
    rerun = results[-1]
    assert rerun["reused_record"] and (rerun["start_cut"], rerun["end_cut"]) == (results[1]["start_cut"],
                                                                                  results[1]["end_cut"])
    assert by_partition(tmp_path / "lake" / DAYS[1]) == before  # and nothing stale


def test_ingest_xcom_cuts_bound_the_export(tmp_path, spark, run_dag, pravega_default_conn, unique_name):
    from airflow.sdk import DAG

    from airflow_provider_pravega.operators import (
        PravegaStreamCutExportOperator,
        PravegaTransactionalIngestOperator,
    )

    scope = unique_name("xcomcut")
    batches = []
    for n in range(2):
        (tmp_path / f"in{n}").mkdir()
        lines = [json.dumps({"sensor_id": f"s{i % 3}", "batch": n, "i": i}) for i in range(60)]
        (tmp_path / f"in{n}" / "a.jsonl").write_text("\n".join(lines) + "\n")
        batches.append(lines)
    with DAG(dag_id=f"ingest_export_{scope.replace('-', '_')}", schedule=None, start_date=day(DAYS[0])) as dag:
        first = PravegaTransactionalIngestOperator(
            task_id="ingest_first", scope=scope, stream="s", source=str(tmp_path / "in0"),
            routing_key_field="sensor_id", create_stream=True, stream_segments=2, spark_conn_id=None,
        )
        second = PravegaTransactionalIngestOperator(
            task_id="ingest_second", scope=scope, stream="s", source=str(tmp_path / "in1"),
            routing_key_field="sensor_id", spark_conn_id=None,
        )
        export = PravegaStreamCutExportOperator(
            task_id="export", scope=scope, stream="s", output_path=str(tmp_path / "out"),
            start_cut="{{ ti.xcom_pull(task_ids='ingest_first')['tail_cut'] }}",
            end_cut="{{ ti.xcom_pull(task_ids='ingest_second')['tail_cut'] }}",
            event_format="json", spark_conn_id=None,
        )
        first >> second >> export
    run = run_dag(dag)
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert states == dict.fromkeys(("ingest_first", "ingest_second", "export"), "success"), states
    summary = run.get_task_instance("export").xcom_pull(task_ids="export")
    second_cut = run.get_task_instance("ingest_second").xcom_pull(task_ids="ingest_second")["tail_cut"]
    assert summary["end_cut"] == second_cut and summary["events"] == 60
    rows = [r for p in parts(tmp_path / "out") for r in pq.read_table(p).to_pylist()]
    assert sorted((r["batch"], r["i"], r["sensor_id"]) for r in rows) == sorted(
        (1, i, f"s{i % 3}") for i in range(60))


def test_bad_input_fails_the_task_with_a_clear_message(tmp_path, spark, run_dag, pravega_default_conn,
                                                       unique_name, task_errors):
    from airflow.sdk import DAG

    from airflow_provider_pravega.operators import PravegaStreamCutExportOperator

    scope = unique_name("opbad")
    with PravegaClient(pravega_default_conn) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 1)
        client.admin.create_stream(scope, "other", 1)
        other = StreamCut.tail(client, scope, "other").to_text()
    (tmp_path / "a-file").write_text("x")
    with DAG(dag_id=f"bad_{scope.replace('-', '_')}", schedule=None, start_date=day(DAYS[0]),
             default_args={"retries": 0}) as dag:
        # Said before any Spark is asked for: the session this task would get cannot even be reached.
        nowhere = {"spark.remote": f"sc://127.0.0.1:{free_port()}"}
        PravegaStreamCutExportOperator(task_id="missing_stream", scope=scope, stream="nope",
                                       output_path=str(tmp_path / "o1"), spark_conn_id=None, spark_conf=nowhere)
        with pytest.raises(StreamCutMismatchError, match=f"the start_cut belongs to stream {scope}/other"):
            PravegaStreamCutExportOperator(task_id="foreign_cut", scope=scope, stream="s", start_cut=other,
                                           output_path=str(tmp_path / "o2"), spark_conn_id=None)  # at parse
        PravegaStreamCutExportOperator(task_id="foreign_cut", scope=scope, stream="s", start_cut="{{ params.cut }}",
                                       params={"cut": other}, output_path=str(tmp_path / "o2"), spark_conn_id=None,
                                       spark_conf=nowhere)
        PravegaStreamCutExportOperator(task_id="unwritable", scope=scope, stream="s",
                                       output_path=str(tmp_path / "a-file" / "out"), spark_conn_id=None)
    run = run_dag(dag)
    errors = {task_id: f"{type(exc).__name__}: {exc}" for task_id, exc in task_errors.items()}
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert states == dict.fromkeys(("missing_stream", "foreign_cut", "unwritable"), "failed"), states
    assert "StreamNotFoundError" in errors["missing_stream"] and f"{scope}/nope" in errors["missing_stream"]
    assert "StreamCutMismatchError" in errors["foreign_cut"] and f"{scope}/other" in errors["foreign_cut"]
    assert "OutputPathError" in errors["unwritable"] and "not writable" in errors["unwritable"]
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_openlineage_names_the_stream_and_the_output(tmp_path, pravega_default_conn):
    pytest.importorskip("airflow.providers.openlineage.extractors",
                        reason="apache-airflow-providers-openlineage is not installed")
    from airflow_provider_pravega.operators import PravegaStreamCutExportOperator

    op = PravegaStreamCutExportOperator(task_id="lineage", scope="iot", stream="readings",
                                        output_path=str(tmp_path / "lake") + "/")
    lineage = op.get_openlineage_facets_on_complete(task_instance=None)
    host_port = first_controller(pravega_default_conn)  # a cluster is named by its first controller
    assert [(d.namespace, d.name) for d in lineage.inputs] == [(f"pravega://{host_port}", "iot/readings")]
    assert [(d.namespace, d.name) for d in lineage.outputs] == [("file", str(tmp_path / "lake"))]
    assert set(PravegaStreamCutExportOperator.template_fields) >= {"scope", "stream", "start_cut", "end_cut",
                                                                     "output_path"}


def test_a_delta_table_is_the_tasks_outlet_and_its_lineage_output(tmp_path, pravega_default_conn):
    """The table is an asset a downstream DAG can be scheduled on (the same ``table_asset`` call),
    and the OpenLineage output names it as a Delta table, with the version the run wrote."""
    pytest.importorskip("airflow.providers.openlineage.extractors",
                        reason="apache-airflow-providers-openlineage is not installed")
    from airflow.sdk import DAG, Asset

    from airflow_provider_pravega.assets import table_asset
    from airflow_provider_pravega.operators import PravegaStreamCutExportOperator

    table = str(tmp_path / "lake" / "readings")
    other = Asset(uri="s3://elsewhere/x")
    op = PravegaStreamCutExportOperator(task_id="to_delta", stream="readings", scope="iot", format="delta",
                                        output_path=table + "/", outlets=[other])
    assert [o.uri for o in op.outlets] == [other.uri, f"file://{table}"]
    assert table_asset(table) in op.outlets  # what a downstream DAG schedules on
    with DAG("downstream", schedule=[table_asset(table)]) as downstream:
        pass
    assert list(downstream.timetable.asset_condition.objects) == [table_asset(table)]
    templated = PravegaStreamCutExportOperator(task_id="templated", stream="readings", format="delta",
                                               output_path="{{ var.value.table }}")
    assert templated.outlets == []  # a templated location is known at run time only: no outlet
    s3 = PravegaStreamCutExportOperator(task_id="s3", stream="readings", format="delta",
                                        output_path="s3a://bucket/lake/readings/")
    assert [o.uri for o in s3.outlets] == ["s3a://bucket/lake/readings"]

    def output(result):
        op._result = result
        [dataset] = op.get_openlineage_facets_on_complete(task_instance=None).outputs
        return dataset

    before = output(None)
    assert (before.namespace, before.name) == ("file", table)
    assert before.facets["storage"].storageLayer == "delta" and "version" not in before.facets
    written = output({"output_path": table + "/", "table_version": 3})
    assert written.facets["version"].datasetVersion == "3"
    parquet = PravegaStreamCutExportOperator(task_id="files", stream="readings", output_path=str(tmp_path / "out"))
    assert parquet.outlets == []
    [files] = parquet.get_openlineage_facets_on_complete(task_instance=None).outputs
    assert "storage" not in files.facets
