"""An export with nothing to read into this machine's files starts no Spark (issue 28, item 4): it
writes what Spark writes for no rows (a schema-only Parquet file, an empty JSON-lines file, a CSV
header, and ``_SUCCESS``) with Python's own file functions, and records the same manifest.

The runs under test get a "Spark" that fails the test when it is asked for, so a start is seen
whatever the timing; the same exports through a real local session are the reference. The embedded
server only: what is written does not depend on the Pravega backend."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from export_files import stable_name
from pravega_clients import stream_writer

from airflow_provider_pravega.spark.export_job import ExportSpec, OutputPathError, open_export_state, run_export
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
    """The files at ``path`` but Hadoop's hidden checksums, by name without Spark's per-write UUID."""
    return {stable_name(p.name): p.read_bytes() for p in sorted(path.iterdir()) if not p.name.startswith(".")}


def _manifest(client, spec: ExportSpec) -> dict:
    with open_export_state(client, spec) as sync:
        recorded = dict(sync.fetch().outputs[spec.output_path])
    return {k: v for k, v in recorded.items() if k not in ("at", "written_at", "files")} | {
        "files": [stable_name(f) for f in recorded["files"]]}


@pytest.mark.parametrize(("fmt", "event_format"), [("parquet", "text"), ("parquet", "binary"), ("jsonl", "text"),
                                                   ("csv", "text")])
def test_an_export_with_nothing_to_read_writes_what_spark_writes_without_spark(
        tmp_path: Path, embedded_client, spark, unique_name, fmt: str, event_format: str) -> None:
    client = embedded_client
    scope = unique_name("emptyexport")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "s", segments=2)
    cuts = {"format": fmt, "event_format": event_format, "interval_key": "2026-11-01"}
    by_spark = ExportSpec(scope, "s", str(tmp_path / "spark"), export_id="by-spark", **cuts)
    no_jvm = ExportSpec(scope, "s", str(tmp_path / "nojvm"), export_id="no-jvm", **cuts)
    reference = run_export(client, spark, by_spark)
    result = run_export(client, _no_spark, no_jvm, local_files=True)

    assert (result.events, result.bytes, result.ranges) == (reference.events, reference.bytes, reference.ranges) == (
        0, 0, 0)
    written, expected = _visible(tmp_path / "nojvm"), _visible(tmp_path / "spark")
    assert sorted(written) == sorted(expected) and written.pop("_SUCCESS") == expected.pop("_SUCCESS") == b""
    assert _manifest(client, no_jvm) == _manifest(client, by_spark)  # the same cuts, counts and files
    (name,) = written
    (found,) = (tmp_path / "nojvm").glob("part-*")
    assert [Path(f).name for f in result.files] == [found.name]
    if fmt == "parquet":
        (reference_file,) = (tmp_path / "spark").glob("part-*.parquet")
        written_schema, expected_schema = pq.read_schema(found), pq.read_schema(reference_file)
        assert written_schema.remove_metadata() == expected_schema.remove_metadata()
        assert written_schema.metadata[SPARK_ROW_METADATA] == expected_schema.metadata[SPARK_ROW_METADATA]
        assert pq.read_metadata(found).num_rows == 0
        back = spark.read.parquet(str(tmp_path / "nojvm"))
        assert back.schema == spark.read.parquet(str(tmp_path / "spark")).schema and back.count() == 0
    else:
        assert written[name] == expected[name]  # an empty file; a header

    again = run_export(client, _no_spark, no_jvm, local_files=True)
    assert again.reused_record and again.replaced_output
    assert _visible(tmp_path / "nojvm").keys() == written.keys() | {"_SUCCESS"}  # replaced, nothing stale
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # nothing temporary left

    # Files no export wrote are refused there too, without Spark.
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "keep.csv").write_text("mine")
    with pytest.raises(OutputPathError, match="already holds files that no export wrote as 'no-jvm'.*keep.csv"):
        run_export(client, _no_spark, ExportSpec(scope, "s", str(tmp_path / "foreign"), export_id="no-jvm", **cuts),
                   local_files=True)


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
