"""What an export finds at its output path: a local session's local files are listed with Python's
own functions (no round trip through the JVM), and the result is what Spark's own file index lists.
Real PySpark in local mode; the embedded server for the export."""

from __future__ import annotations

from pathlib import Path

import pytest
from pravega_clients import stream_writer

from airflow_provider_pravega.spark import export_write
from airflow_provider_pravega.spark.export_job import ExportSpec, OutputPathError, run_export
from airflow_provider_pravega.spark.export_output import (
    local_path,
    local_visible_files,
    session_local_path,
    visible_files,
)


def _flat(root: Path) -> None:
    """Names Spark's file index keeps and hides in one directory: data files, Parquet summary
    files, markers, checksums, hidden and in-copy files, and Spark's temporary directory."""
    root.mkdir()
    for name in ("part-0.parquet", "notes.txt", "_metadata", "_common_metadata", "_SUCCESS", ".part-0.parquet.crc",
                 "copy.parquet._COPYING_"):
        (root / name).write_bytes(b"x")
    for folder in ("_temporary", ".hidden"):
        (root / folder).mkdir()
        (root / folder / "part-1.parquet").write_bytes(b"y")


def _partitioned(root: Path) -> None:
    """Partition directories whose column name starts with ``_`` (kept), beside hidden ones."""
    root.mkdir()
    (root / "_SUCCESS").write_bytes(b"")
    for folder in ("_day=1", "_day=2", "_temporary", ".hidden"):
        (root / folder).mkdir()
        (root / folder / "part-1.parquet").write_bytes(b"y")
        (root / folder / ".part-1.parquet.crc").write_bytes(b"")


@pytest.mark.parametrize(("make", "expected"), [
    (_flat, {"part-0.parquet", "notes.txt", "_metadata", "_common_metadata"}),
    (_partitioned, {"_day=1/part-1.parquet", "_day=2/part-1.parquet"}),
], ids=["flat", "partitioned"])
def test_a_local_listing_finds_what_sparks_file_index_finds(tmp_path: Path, spark, make, expected) -> None:
    root = tmp_path / "out"
    make(root)
    by_spark = sorted(local_path(uri) for uri in visible_files(spark, str(root)))
    assert local_visible_files(str(root)) == by_spark
    assert {Path(p).relative_to(root).as_posix() for p in by_spark} == expected
    assert local_visible_files(str(tmp_path / "missing")) is None
    assert visible_files(spark, str(tmp_path / "missing")) is None


def test_which_paths_a_session_lists_on_this_machine(tmp_path: Path, spark) -> None:
    assert session_local_path(spark, str(tmp_path / "out")) == str(tmp_path / "out")
    assert session_local_path(spark, f"file://{tmp_path}/out") == str(tmp_path / "out")
    assert session_local_path(spark, "s3a://bucket/out") is None
    assert session_local_path(spark, "hdfs://127.0.0.1:9000/out") is None
    assert session_local_path(None, str(tmp_path)) is None
    # Under a cluster's default filesystem a plain path is not this machine's; a file: URI still is.
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    before = conf.get("fs.defaultFS")
    conf.set("fs.defaultFS", "hdfs://127.0.0.1:9000")
    try:
        assert session_local_path(spark, str(tmp_path / "out")) is None
        assert session_local_path(spark, f"file:{tmp_path}/out") == str(tmp_path / "out")
    finally:
        conf.set("fs.defaultFS", before)


def test_an_export_to_a_local_path_lists_it_without_the_jvm(tmp_path: Path, spark, client, monkeypatch,
                                                            pravega_controller_uri, unique_name) -> None:
    """Before and after the write, the output path is listed here; what is there is still checked."""
    def through_spark(*_args):
        raise AssertionError("the export listed a local path through the session")

    monkeypatch.setattr(export_write, "visible_files", through_spark)
    scope = unique_name("locallist")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "s", 2)
    writer = stream_writer(pravega_controller_uri, scope, "s")
    for i in range(20):
        writer.write_event(f"event-{i}", routing_key=f"k{i % 4}")
    writer.flush()

    done = run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "out"), start_cut="head"))
    assert done.events == 20
    assert sorted(Path(f).name for f in done.files) == sorted(
        p.name for p in (tmp_path / "out").iterdir() if p.name.startswith("part-"))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "_day=1").mkdir()
    (foreign / "_day=1" / "keep.parquet").write_bytes(b"mine")
    with pytest.raises(OutputPathError, match="already holds files that no export wrote .*keep.parquet"):
        run_export(client, spark, ExportSpec(scope, "s", str(foreign), start_cut="head"))
    assert (foreign / "_day=1" / "keep.parquet").read_bytes() == b"mine"
