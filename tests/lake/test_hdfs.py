"""Ingest from and export to a real HDFS (Hadoop's MiniDFSCluster: a NameNode and a DataNode on
loopback, see pravega_testing.hdfs) with the session's local Spark and the shared
Pravega server: ``hdfs://`` sources listed and identified without reading data, a rerun skips
everything, a same-size rewrite is detected (HDFS's modification time), a bad record is named by
its hdfs:// URI and line with nothing written, a missing path is a clear error; the export
publishes by HDFS's atomic rename, every record once, a rerun rewrites the same bytes and nothing
temporary is left. A Delta table at an hdfs:// location: an interval once, its rerun a
no-op, a second interval appended, each commit naming its cuts."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.ingest_errors import ChangedFileError
from airflow_provider_pravega.client.streamcut import StreamCut
from airflow_provider_pravega.spark.export_job import ExportSpec, run_export
from airflow_provider_pravega.spark.ingest_job import run_ingest
from airflow_provider_pravega.spark.ingest_spec import BadRecordError, IngestSpec, SourceError
from pravega_testing.hdfs import Hdfs, HdfsUnavailable, hdfs_minicluster

from export_files import stable_name

from .test_object_store import parquet_pages


@pytest.fixture(scope="module")
def hdfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hdfs]:
    try:
        with hdfs_minicluster(tmp_path_factory.mktemp("hdfs")) as cluster:
            yield cluster
    except HdfsUnavailable as exc:
        pytest.skip(str(exc))


class HadoopFiles:
    """Files on any Hadoop filesystem through the session's JVM (what a user's cluster sees)."""

    def __init__(self, spark: Any) -> None:
        self.jvm, self.conf = spark._jvm, spark._jsc.hadoopConfiguration()

    def _fs(self, uri: str) -> tuple[Any, Any]:
        path = self.jvm.org.apache.hadoop.fs.Path(uri)
        return path.getFileSystem(self.conf), path

    def write(self, uri: str, data: bytes) -> None:
        fs, path = self._fs(uri)
        out = fs.create(path, True)
        out.write(bytearray(data))
        out.close()

    def read(self, uri: str) -> bytes:
        fs, path = self._fs(uri)
        out = self.jvm.java.io.ByteArrayOutputStream()
        self.jvm.org.apache.hadoop.io.IOUtils.copyBytes(fs.open(path), out, 65536, True)  # closes both
        return bytes(out.toByteArray())

    def files(self, uri: str) -> list[str]:
        """Every file under ``uri``, relative to it."""
        fs, path = self._fs(uri)
        found, listing = [], fs.listFiles(path, True)
        prefix = fs.getFileStatus(path).getPath().toUri().getPath().rstrip("/") + "/"
        while listing.hasNext():
            found.append(listing.next().getPath().toUri().getPath()[len(prefix):])
        return sorted(found)


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


@pytest.fixture
def client(pravega_embedded: Any) -> Iterator[PravegaClient]:
    """The embedded backend only: what is tested here is HDFS, not Pravega."""
    with PravegaClient(pravega_embedded.controller_uri) as client:
        yield client


def test_ingest_from_and_export_to_hdfs(hdfs: Hdfs, spark: Any, client: PravegaClient, unique_name: Any) -> None:
    files = HadoopFiles(spark)
    scope = unique_name("hdfs")
    day = f"{hdfs.uri}/{scope}/in/2026-11-01"
    sent = []
    for part, count in ((0, 600), (1, 400)):
        rows = [{"sensor_id": f"s{i % 5}", "part": part, "n": i} for i in range(count)]
        sent += rows
        files.write(f"{day}/part-{part}.jsonl", jsonl(rows))
    files.write(f"{day}/_SUCCESS", b"")  # hidden: skipped

    spec = IngestSpec(scope=scope, stream="readings", source=f"{day}/*.jsonl", routing_key_field="sensor_id",
                      create_stream=True)
    result = run_ingest(client, spark, spec)
    assert (result.events, sorted(result.files_ingested)) == (1000, [f"{day}/part-0.jsonl", f"{day}/part-1.jsonl"])
    assert run_ingest(client, spark, spec).run_id is None  # all remembered: nothing to do
    tail = StreamCut.tail(client, scope, "readings")

    time.sleep(0.01)  # a later modification time, same size, new bytes
    changed = jsonl([{"sensor_id": f"s{i % 5}", "part": 9, "n": i} for i in range(600)])
    assert len(changed) == len(jsonl([r for r in sent if r["part"] == 0]))
    files.write(f"{day}/part-0.jsonl", changed)
    with pytest.raises(ChangedFileError, match=f"{day}/part-0.jsonl"):
        run_ingest(client, spark, spec)

    bad = f"{hdfs.uri}/{scope}/in/bad"
    files.write(f"{bad}/data.jsonl", b'{"sensor_id": "s1"}\n{"sensor_id": oops}\n')
    with pytest.raises(BadRecordError, match=rf"{bad}/data\.jsonl, line 2: not valid JSON"):
        run_ingest(client, spark, IngestSpec(scope=scope, stream="readings", source=bad,
                                             routing_key_field="sensor_id"))
    with pytest.raises(SourceError, match=f"{hdfs.uri}/{scope}/in/missing"):
        run_ingest(client, spark, IngestSpec(scope=scope, stream="readings", source=f"{hdfs.uri}/{scope}/in/missing"))
    assert StreamCut.tail(client, scope, "readings") == tail  # nothing written by the refused runs

    out = f"{hdfs.uri}/{scope}/out/2026-11-01"
    export = ExportSpec(scope, "readings", out, start_cut="head", end_cut=tail.to_text())
    first = run_export(client, spark, export)
    names = [uri.removeprefix(f"{out}/") for uri in first.files] + ["_SUCCESS"]
    written = files.files(f"{hdfs.uri}/{scope}/out")
    assert written == sorted(f"2026-11-01/{name}" for name in names)  # the export's files and _SUCCESS only
    first_bytes = {stable_name(name): files.read(f"{out}/{name}") for name in names}
    exported = [json.loads(e) for name, data in first_bytes.items() if name.endswith(".parquet")
                for e in pq.read_table(io.BytesIO(data)).column("event").to_pylist()]
    key = lambda row: (row["part"], row["n"])  # noqa: E731
    assert sorted(exported, key=key) == sorted(sent, key=key)  # every record once

    again = run_export(client, spark, export)  # a rerun of the same interval: the same bytes
    rewritten = files.files(f"{hdfs.uri}/{scope}/out")
    assert sorted(map(stable_name, rewritten)) == sorted(map(stable_name, written))  # nothing stale or temporary
    assert sorted(map(stable_name, again.files)) == sorted(map(stable_name, first.files))
    assert {stable_name(n.removeprefix("2026-11-01/")): parquet_pages(files.read(f"{out}/{n.removeprefix('2026-11-01/')}"))
            for n in rewritten} == {
        n: parquet_pages(data) for n, data in first_bytes.items()}


DELTA_ON_HDFS = """
import json, sys
from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.spark.delta_export import session_conf
from airflow_provider_pravega.spark.export_job import ExportSpec, run_export
from airflow_provider_pravega.spark.session import get_spark_session

uri, scope, table, plan = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
spark = get_spark_session(None, "delta-hdfs-test", **session_conf({"spark.master": "local[2]"}))
with PravegaClient(uri) as client:
    for step in plan:
        result = run_export(client, spark, ExportSpec(scope=scope, stream="s", output_path=table, format="delta",
                                                       start_cut=step["start"], end_cut=step["end"],
                                                       export_id="daily", interval_key=step["interval"]))
        print("RESULT", json.dumps({"events": result.events, "version": result.table_version,
                                    "skipped": result.already_written}), flush=True)
rows = [[r["interval_key"], r["event"]] for r in spark.read.format("delta").load(table).collect()]
history = [r["userMetadata"] for r in spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect() if r["userMetadata"]]
print("TABLE", json.dumps({"rows": rows, "metadata": [json.loads(m) for m in history]}), flush=True)
spark.stop()
"""


def test_export_into_a_delta_table_on_hdfs(hdfs: Hdfs, client: PravegaClient, unique_name: Any,
                                           tmp_path: Any) -> None:
    """format='delta' at an hdfs:// location (a Spark session with Delta's package in its own
    process): one interval exported, its rerun a no-op decided by Delta, a second interval appended;
    read back through Spark (delta-rs has no HDFS client here): each event once, and each commit's
    metadata names its interval's cuts."""
    import subprocess
    import sys
    from collections import Counter

    scope = unique_name("hdfs-delta")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "s", 2)
    cuts, events = [StreamCut.head(client, scope, "s").to_text()], {}
    with client.event_writer(scope, "s") as writer:
        for day in ("2026-11-01", "2026-11-02"):
            events[day] = [f"{day}|{i:03d}" for i in range(200)]
            for i, event in enumerate(events[day]):
                writer.write_event(event.encode(), routing_key=f"k{i % 5}")
            writer.flush()
            cuts.append(StreamCut.tail(client, scope, "s").to_text())
    span = {day: {"interval": day, "start": cuts[n], "end": cuts[n + 1]} for n, day in enumerate(events)}
    table = f"{hdfs.uri}/{scope}/tables/readings"
    script = tmp_path / "delta_on_hdfs.py"
    script.write_text(DELTA_ON_HDFS)
    plan = [span["2026-11-01"], span["2026-11-01"], span["2026-11-02"]]
    done = subprocess.run([sys.executable, str(script), client.controller_uri, scope, table, json.dumps(plan)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    results = [json.loads(line[len("RESULT "):]) for line in lines if line.startswith("RESULT ")]
    assert [(r["events"], r["skipped"]) for r in results] == [(200, False), (0, True), (200, False)]
    assert results[1]["version"] == results[0]["version"] and results[2]["version"] == results[0]["version"] + 1
    read = next(json.loads(line[len("TABLE "):]) for line in lines if line.startswith("TABLE "))
    assert Counter(map(tuple, read["rows"])) == Counter((day, e) for day in events for e in events[day])
    assert sorted((m["interval"], m["start_cut"], m["end_cut"]) for m in read["metadata"]) == [
        (day, span[day]["start"], span[day]["end"]) for day in events]  # two commits: the rerun wrote none
