"""An export with nothing to read into this machine's files starts no Spark (issue 28, item 4): it
writes what Spark writes for no rows (a schema-only Parquet file, an empty JSON-lines file, a CSV
header) with Python's own file functions, and publishes it with the same marker.

The runs under test get a "Spark" that fails the test when it is asked for, so a start is seen
whatever the timing; the same exports through a real local session are the reference. The embedded
server only: what is written does not depend on the Pravega backend."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pravega_clients import stream_writer

from airflow_provider_pravega.spark.export_job import MARKER, ExportSpec, run_export
from airflow_provider_pravega.spark.session import starts_local_session

SPARK_ROW_METADATA = b"org.apache.spark.sql.parquet.row.metadata"


@pytest.fixture
def embedded_client(pravega_embedded):
    from airflow_provider_pravega.client import PravegaClient

    with PravegaClient(pravega_embedded.controller_uri) as client:
        yield client


def _no_spark() -> None:
    raise AssertionError("the export asked for a SparkSession")


def _visible(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if not p.name.startswith(".")}


@pytest.mark.parametrize(("fmt", "event_format"), [("parquet", "text"), ("parquet", "binary"), ("jsonl", "text"),
                                                   ("csv", "text")])
def test_an_export_with_nothing_to_read_writes_what_spark_writes_without_spark(
        tmp_path: Path, embedded_client, spark, unique_name, fmt: str, event_format: str) -> None:
    client = embedded_client
    scope = unique_name("emptyexport")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "s", segments=2)
    cuts = {"format": fmt, "event_format": event_format, "interval_key": "2026-11-01"}
    reference = run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "spark"), export_id="by-spark", **cuts))
    result = run_export(client, _no_spark, ExportSpec(scope, "s", str(tmp_path / "nojvm"), export_id="no-jvm", **cuts),
                        local_files=True)

    assert (result.events, result.bytes, result.ranges) == (reference.events, reference.bytes, reference.ranges) == (
        0, 0, 0)
    assert [Path(f).name for f in result.files] == [Path(f).name for f in reference.files]
    by_spark, without = _visible(tmp_path / "spark"), _visible(tmp_path / "nojvm")
    assert sorted(without) == sorted(by_spark)
    markers = [json.loads(files.pop(MARKER)) for files in (by_spark, without)]
    assert [{k: v for k, v in m.items() if k != "export_id"} for m in markers] == [
        {k: v for k, v in markers[0].items() if k != "export_id"}] * 2  # the same cuts, counts and files
    (name,) = without
    if fmt == "parquet":
        written = pq.read_schema(tmp_path / "nojvm" / name)
        expected = pq.read_schema(tmp_path / "spark" / name)
        assert written.remove_metadata() == expected.remove_metadata()
        assert written.metadata[SPARK_ROW_METADATA] == expected.metadata[SPARK_ROW_METADATA]
        assert pq.read_metadata(tmp_path / "nojvm" / name).num_rows == 0
        back = spark.read.parquet(str(tmp_path / "nojvm"))
        assert back.schema == spark.read.parquet(str(tmp_path / "spark")).schema and back.count() == 0
    else:
        assert without[name] == by_spark[name]  # an empty file; a header

    again = run_export(client, _no_spark, ExportSpec(scope, "s", str(tmp_path / "nojvm"), export_id="no-jvm", **cuts),
                       local_files=True)
    assert again.reused_record and again.replaced_output and _visible(tmp_path / "nojvm").keys() == without.keys() | {
        MARKER}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # nothing temporary left


def test_an_export_with_something_to_read_asks_for_spark(tmp_path: Path, embedded_client, pravega_embedded,
                                                         unique_name) -> None:
    """The guard above is live: a range with events reaches for Spark (and nothing is published)."""
    client = embedded_client
    scope = unique_name("emptyexport")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "s", segments=1)
    writer = stream_writer(pravega_embedded.controller_uri, scope, "s")
    writer.write_event("one", routing_key="k")
    writer.flush()
    with pytest.raises(AssertionError, match="asked for a SparkSession"):
        run_export(client, _no_spark, ExportSpec(scope, "s", str(tmp_path / "out"), start_cut="head"), local_files=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_only_a_local_session_writes_this_machines_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_NOJVM", json.dumps({"conn_type": "spark_connect",
                                                                       "host": "127.0.0.1", "port": 15002}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER_NOJVM", json.dumps({"conn_type": "spark",
                                                                       "host": "spark://127.0.0.1", "port": 7077}))
    assert starts_local_session(None)
    assert starts_local_session(None, **{"spark.master": "local[2]"})
    assert not starts_local_session(None, **{"spark.remote": "sc://127.0.0.1:15002"})
    assert not starts_local_session("spark_connect_nojvm")
    assert not starts_local_session("spark_cluster_nojvm")
    assert starts_local_session("spark_cluster_nojvm", **{"spark.master": "local[1]"})
