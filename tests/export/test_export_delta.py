"""Stream-cut exports into a Delta Lake table, exactly once per interval whatever the order of runs:
three days exported out of order (a lagging export catching up, then a backfill of the first day),
a rerun of day 2 and a reprocess of day 1, and a ``from_ingest``-style interval whose later range
replaces it. The table is read back independently with delta-rs (``deltalake``): each day's events
exactly once, and each table version's commit metadata names its interval's cuts.

The exports run in their own process (a Spark session started with Delta's package, as the
operator starts one), through ``run_export``, one JVM for all of them.

Embedded server only: what these rely on of Pravega (stream-cut reads) runs against Pravega
standalone in the export and data-source tests; here the subject is Delta's side.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.streamcut import StreamCut

deltalake = pytest.importorskip("deltalake", reason="the test extra installs deltalake (delta-rs) to read tables")

PER_DAY = 300

EXPORTS = textwrap.dedent("""
    import json, sys
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.spark.delta_export import session_conf
    from airflow_provider_pravega.spark.export_job import ExportSpec, run_export
    from airflow_provider_pravega.spark.session import get_spark_session

    uri, scope, table, plan = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    spark = get_spark_session(None, "delta-test", **session_conf({"spark.master": "local[2]"}))
    with PravegaClient(uri) as client:
        for step in plan:
            spec = ExportSpec(scope=scope, stream="s", output_path=table, start_cut=step["start"],
                              end_cut=step["end"], format="delta", export_id="daily", interval_key=step["interval"])
            result = run_export(client, spark, spec)
            print("RESULT", json.dumps({"interval": step["interval"], "events": result.events,
                                        "version": result.table_version, "skipped": result.already_written}))
    spark.stop()
""")


def _run_exports(tmp_path, uri: str, scope: str, table: str, plan: list[dict]) -> list[dict]:
    script = tmp_path / "exports.py"
    script.write_text(EXPORTS)
    done = subprocess.run([sys.executable, str(script), uri, scope, table, json.dumps(plan)], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]


def test_days_exported_out_of_order_rerun_and_backfilled_are_each_in_the_table_once(
        tmp_path, pravega_embedded, unique_name):
    pravega_controller_uri = pravega_embedded.controller_uri
    scope = unique_name("delta-export")
    days = ["2026-11-20", "2026-11-21", "2026-11-22"]
    cuts, events = [], {}
    with PravegaClient(pravega_controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 2)
        cuts.append(StreamCut.head(client, scope, "s").to_text())
        with client.event_writer(scope, "s") as writer:
            for day in days:
                events[day] = [f"{day}|{i:04d}" for i in range(PER_DAY)]
                for i, event in enumerate(events[day]):
                    writer.write_event(event.encode(), routing_key=f"k{i % 7}")
                writer.flush()
                cuts.append(StreamCut.tail(client, scope, "s").to_text())
    span = {day: {"interval": day, "start": cuts[i], "end": cuts[i + 1]} for i, day in enumerate(days)}
    table = str(tmp_path / "table")
    # Day 3 first (a lagging export catching up newest first), then day 1 (a backfill), day 2; then
    # a rerun of day 2 and a reprocess of day 1: both no-ops decided by Delta's transaction ids.
    results = _run_exports(tmp_path, pravega_controller_uri, scope, table,
                           [span[days[2]], span[days[0]], span[days[1]], span[days[1]], span[days[0]]])
    assert [(r["interval"], r["events"], r["skipped"]) for r in results] == [
        (days[2], PER_DAY, False), (days[0], PER_DAY, False), (days[1], PER_DAY, False),
        (days[1], 0, True), (days[0], 0, True)]
    assert results[3]["version"] == results[2]["version"] and results[4]["version"] == results[1]["version"]

    dt = deltalake.DeltaTable(table)
    rows = dt.to_pyarrow_table().to_pylist()
    assert Counter((r["interval_key"], r["event"]) for r in rows) == Counter(
        (day, e) for day in days for e in events[day])
    assert {r["scope"] for r in rows} == {scope} and {r["stream"] for r in rows} == {"s"}
    assert all(r["segment_id"] is not None and r["offset"] is not None for r in rows)
    history = {h["version"]: json.loads(h["userMetadata"]) for h in dt.history() if h.get("userMetadata")}
    assert sorted(history) == [0, 1, 2]  # three writes, no more: the rerun and reprocess wrote nothing
    for meta in history.values():
        day = meta["interval"]
        assert (meta["start_cut"], meta["end_cut"]) == (span[day]["start"], span[day]["end"])
        assert meta["export_id"] == "daily" and meta["scope"] == scope


def test_a_delta_export_needs_an_interval_and_takes_no_compression():
    from airflow_provider_pravega.spark.export_job import ExportSpec

    with pytest.raises(ValueError, match="format='delta' writes each interval as a partition"):
        ExportSpec(scope="s", stream="t", output_path="/tmp/table", format="delta")
    with pytest.raises(ValueError, match="compression does not apply to format='delta'"):
        ExportSpec(scope="s", stream="t", output_path="/tmp/table", format="delta", interval_key="d",
                   compression="zstd")


def test_the_session_gets_deltas_package_beside_the_users_and_keeps_their_settings():
    from airflow_provider_pravega.spark.delta_export import DELTA_SQL_CONF, delta_package, session_conf

    conf = session_conf({"spark.jars.packages": "org.apache.hadoop:hadoop-aws:3.5.0",
                         "spark.sql.extensions": "my.Extension"})
    assert conf["spark.jars.packages"].split(",") == ["org.apache.hadoop:hadoop-aws:3.5.0", delta_package()]
    assert conf["spark.sql.extensions"] == "my.Extension"  # the user's choice stands
    assert conf["spark.sql.catalog.spark_catalog"] == DELTA_SQL_CONF["spark.sql.catalog.spark_catalog"]
    connect = {"spark.remote": "sc://127.0.0.1:15002"}
    assert session_conf(connect) == connect  # a Connect server has its own packages
    mine = "io.delta:delta-spark_4.2_2.13:4.3.0"
    assert session_conf({"spark.jars.packages": mine})["spark.jars.packages"] == mine


FROM_INGEST = textwrap.dedent("""
    import json, pathlib, sys
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.spark.delta_export import session_conf
    from airflow_provider_pravega.spark.export_job import ExportSpec, run_export
    from airflow_provider_pravega.spark.ingest_job import run_ingest
    from airflow_provider_pravega.spark.ingest_spec import IngestSpec
    from airflow_provider_pravega.spark.session import get_spark_session

    uri, scope, table, source = sys.argv[1], sys.argv[2], sys.argv[3], pathlib.Path(sys.argv[4])
    interval = "2026-11-20T00:00:00+00:00/2026-11-21T00:00:00+00:00"
    spark = get_spark_session(None, "delta-test", **session_conf({"spark.master": "local[2]"}))
    with PravegaClient(uri) as client:
        def ingest():
            run_ingest(client, spark, IngestSpec(scope=scope, stream="s", source=str(source), ingest_id="daily",
                                                 create_stream=True, interval_key=interval))

        def export():
            result = run_export(client, spark, ExportSpec(scope=scope, stream="s", output_path=table, format="delta",
                                                          export_id="daily-table", interval_key=interval,
                                                          from_ingest="daily"))
            print("RESULT", json.dumps({"events": result.events, "version": result.table_version,
                                        "skipped": result.already_written}), flush=True)

        ingest()
        export()
        (source / "late.jsonl").write_text("\\n".join(f'{{"late": {n}}}' for n in range(50)) + "\\n")
        ingest()  # the day gets a second committed range
        export()  # its partition is replaced once, with both ranges
        export()  # and then it is a no-op
    spark.stop()
""")


def test_an_interval_the_ingest_added_a_range_to_is_replaced_once(tmp_path, pravega_embedded, unique_name):
    """``from_ingest``: the Delta version is the number of the ingest's committed pieces of the
    interval, so a late file ingested into an exported day replaces that day's rows once."""
    scope = unique_name("delta-from-ingest")
    source = tmp_path / "in"
    source.mkdir()
    early = [json.dumps({"early": n}) for n in range(120)]
    (source / "early.jsonl").write_text("\n".join(early) + "\n")
    with PravegaClient(pravega_embedded.controller_uri) as client:
        client.admin.create_scope(scope)
    table = str(tmp_path / "table")
    script = tmp_path / "from_ingest.py"
    script.write_text(FROM_INGEST)
    done = subprocess.run([sys.executable, str(script), pravega_embedded.controller_uri, scope, table, str(source)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    results = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert [(r["events"], r["skipped"]) for r in results] == [(120, False), (170, False), (0, True)]
    assert results[2]["version"] == results[1]["version"] == results[0]["version"] + 1
    dt = deltalake.DeltaTable(table)
    late = [json.dumps({"late": n}) for n in range(50)]
    assert Counter(dt.to_pyarrow_table().column("event").to_pylist()) == Counter(early + late)
    versions = [json.loads(h["userMetadata"]) for h in dt.history() if h.get("userMetadata")]
    assert sorted(len(v["pieces"]) for v in versions) == [1, 2]


def test_a_session_without_delta_is_told_which_settings_to_add(spark, pravega_embedded, unique_name, tmp_path):
    """Bad input: a Delta export in a session started without Delta fails at once, naming the
    settings, and leaves nothing at the table's location."""
    from airflow_provider_pravega.spark.delta_export import delta_package
    from airflow_provider_pravega.spark.export_job import ExportError, ExportSpec, run_export

    scope = unique_name("delta-missing")
    with PravegaClient(pravega_embedded.controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 1)
        with client.event_writer(scope, "s") as writer:
            writer.write_event(b"one")
            writer.flush()
        with pytest.raises(ExportError, match="needs Delta Lake in the Spark session") as caught:
            run_export(client, spark, ExportSpec(scope=scope, stream="s", output_path=str(tmp_path / "table"),
                                                 format="delta", interval_key="2026-11-20", start_cut="head"))
    assert f"spark.jars.packages={delta_package()}" in str(caught.value)
    assert not (tmp_path / "table").exists()



TABLE_EXPORTS = textwrap.dedent("""
    import json, sys
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.spark.delta_export import session_conf
    from airflow_provider_pravega.spark.export_job import ExportSpec, run_export
    from airflow_provider_pravega.spark.session import get_spark_session

    uri, scope, warehouse, plan = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    spark = get_spark_session(None, "delta-table-test", **session_conf(
        {"spark.master": "local[2]", "spark.sql.warehouse.dir": warehouse}))
    spark.sql("CREATE DATABASE IF NOT EXISTS lake")
    with PravegaClient(uri) as client:
        for step in plan:
            result = run_export(client, spark, ExportSpec(
                scope=scope, stream="s", table="lake.readings", start_cut=step["start"], end_cut=step["end"],
                format="delta", export_id="daily", interval_key=step["interval"]))
            print("RESULT", json.dumps({"interval": step["interval"], "events": result.events,
                                        "version": result.table_version, "skipped": result.already_written,
                                        "location": result.output_path, "table": result.table}), flush=True)
    spark.stop()
""")


def test_a_catalog_table_gets_each_interval_once(tmp_path, pravega_embedded, unique_name):
    """``table="lake.readings"``: a table of the session's catalog (Delta's DeltaCatalog, a local
    warehouse), created by the first export; days out of order, a rerun a no-op, each day once.
    Read back with delta-rs from the location the catalog reports."""
    scope = unique_name("delta-table")
    days = ["2026-11-20", "2026-11-21"]
    cuts, events = [], {}
    with PravegaClient(pravega_embedded.controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 2)
        cuts.append(StreamCut.head(client, scope, "s").to_text())
        with client.event_writer(scope, "s") as writer:
            for day in days:
                events[day] = [f"{day}|{i:04d}" for i in range(150)]
                for i, event in enumerate(events[day]):
                    writer.write_event(event.encode(), routing_key=f"k{i % 7}")
                writer.flush()
                cuts.append(StreamCut.tail(client, scope, "s").to_text())
    span = {day: {"interval": day, "start": cuts[i], "end": cuts[i + 1]} for i, day in enumerate(days)}
    warehouse = tmp_path / "warehouse"
    script = tmp_path / "table_exports.py"
    script.write_text(TABLE_EXPORTS)
    plan = [span[days[1]], span[days[0]], span[days[1]]]
    done = subprocess.run([sys.executable, str(script), pravega_embedded.controller_uri, scope, str(warehouse),
                           json.dumps(plan)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    results = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert [(r["events"], r["skipped"]) for r in results] == [(150, False), (150, False), (0, True)]
    assert results[2]["version"] == results[0]["version"] == 0 and results[1]["version"] == 1
    location = results[0]["location"]
    assert {r["table"] for r in results} == {"lake.readings"}
    assert location.rstrip("/").endswith("warehouse/lake.db/readings"), location
    dt = deltalake.DeltaTable(location)
    assert Counter((r["interval_key"], r["event"]) for r in dt.to_pyarrow_table().to_pylist()) == Counter(
        (day, e) for day in days for e in events[day])
    history = sorted((json.loads(h["userMetadata"]) for h in dt.history() if h.get("userMetadata")),
                     key=lambda m: m["interval"])
    assert [(m["interval"], m["start_cut"], m["end_cut"]) for m in history] == [
        (day, span[day]["start"], span[day]["end"]) for day in days]


def test_output_path_or_table_exactly_one_and_table_only_for_delta():
    """Bad input, said when the spec (or the operator, when the DAG is parsed) is made, naming the
    options."""
    from airflow_provider_pravega.operators import PravegaStreamCutExportOperator
    from airflow_provider_pravega.spark.export_job import ExportSpec, main

    delta = {"format": "delta", "interval_key": "d"}
    with pytest.raises(ValueError, match="exactly one of output_path .* and table .*got both"):
        ExportSpec(scope="s", stream="t", output_path="/tmp/x", table="lake.t", **delta)
    with pytest.raises(ValueError, match="exactly one of output_path .* and table .*got neither"):
        ExportSpec(scope="s", stream="t", **delta)
    with pytest.raises(ValueError, match="table='lake.t' is a catalog table, written only with format='delta' "
                                         r"\(got format='parquet'\)"):
        ExportSpec(scope="s", stream="t", table="lake.t")
    for bad in ("readings", "a.b.c.d", "lake.", "lake.read ings", ""):
        with pytest.raises(ValueError, match="table must be a qualified catalog table name"):
            ExportSpec(scope="s", stream="t", table=bad, **delta)
    assert ExportSpec(scope="s", stream="t", table="spark_catalog.lake.`read-ings`", **delta).target == (
        "spark_catalog.lake.`read-ings`")
    with pytest.raises(ValueError, match="exactly one of output_path .* and table"):
        PravegaStreamCutExportOperator(task_id="both", stream="t", format="delta", output_path="/x", table="lake.t")
    with pytest.raises(ValueError, match="written only with format='delta'"):
        PravegaStreamCutExportOperator(task_id="csv", stream="t", format="csv", table="lake.t")
    assert main(["--controller-uri", "tcp://127.0.0.1:1", "--scope", "s", "--stream", "t", "--table", "lake.t"]) == 2


def test_a_catalog_table_is_the_tasks_outlet_and_its_location_the_lineage_output(pravega_default_conn):
    """``table=``: the outlet is the name-based asset (the location is not known when the DAG is
    parsed); the OpenLineage output is the location the catalog reported, else the name."""
    from airflow_provider_pravega.assets import catalog_table_asset, catalog_table_uri
    from airflow_provider_pravega.operators import PravegaStreamCutExportOperator

    assert catalog_table_uri("lake.readings") == "spark-catalog://spark_catalog/lake.readings"
    assert catalog_table_uri("hive.lake.`read-ings`") == "spark-catalog://hive/lake.read-ings"
    op = PravegaStreamCutExportOperator(task_id="t", stream="readings", scope="iot", format="delta",
                                        table="lake.readings")
    assert [o.uri for o in op.outlets] == ["spark-catalog://spark_catalog/lake.readings"]
    assert catalog_table_asset("lake.readings") in op.outlets
    templated = PravegaStreamCutExportOperator(task_id="t2", stream="readings", format="delta",
                                               table="{{ var.value.table }}")
    assert templated.outlets == [] and "table" in PravegaStreamCutExportOperator.template_fields
    pytest.importorskip("airflow.providers.openlineage.extractors",
                        reason="apache-airflow-providers-openlineage is not installed")

    def output(result):
        op._result = result
        [dataset] = op.get_openlineage_facets_on_complete(task_instance=None).outputs
        return dataset

    named = output({"output_path": "lake.readings", "table": "lake.readings", "table_version": 2})
    assert (named.namespace, named.name) == ("spark-catalog://spark_catalog", "lake.readings")
    assert named.facets["version"].datasetVersion == "2" and named.facets["storage"].storageLayer == "delta"
    located = output({"output_path": "file:/wh/lake.db/readings", "table": "lake.readings", "table_version": 0})
    assert (located.namespace, located.name) == ("file", "/wh/lake.db/readings")


def test_iceberg_is_refused_naming_the_missing_spark_runtime():
    """No iceberg-spark-runtime exists for Spark 4.2: format='iceberg' says so (spec, operator at
    parse time, command line), instead of 'not one of the formats'."""
    from airflow_provider_pravega.operators import PravegaStreamCutExportOperator
    from airflow_provider_pravega.spark.export_job import ExportSpec, main

    why = r"format='iceberg' is not available yet: .*iceberg-spark-runtime for Spark 4\.2"
    with pytest.raises(ValueError, match=why):
        ExportSpec(scope="s", stream="t", table="lake.t", format="iceberg", interval_key="d")
    with pytest.raises(ValueError, match=why):
        PravegaStreamCutExportOperator(task_id="ice", stream="t", format="iceberg", output_path="/lake/t")
    assert main(["--controller-uri", "tcp://127.0.0.1:1", "--scope", "s", "--stream", "t", "--output-path", "/x",
                 "--format", "iceberg", "--interval", "d"]) == 2
