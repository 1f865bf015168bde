"""Streaming reads with ``spark.readStream.format("pravega")``: a query with a file sink and a
checkpoint, stopped and restarted twice while a writer keeps writing (and the stream scales in the
middle), then caught up with ``availableNow``: every event exactly once in the sink, each key in
order, and no micro-batch above ``max_events_per_trigger``."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.spark.datasource import register

LIMIT = 150


@pytest.fixture(scope="module")
def registered(spark):
    register(spark)
    # one file-sink log file per micro-batch (no compaction), so the test can tell batches apart
    spark.conf.set("spark.sql.streaming.fileSink.log.compactInterval", "100000")
    yield spark
    spark.conf.unset("spark.sql.streaming.fileSink.log.compactInterval")


def _writer(client: PravegaClient, scope: str, stream: str, total: int, written: list[str],
            done: threading.Event) -> None:
    try:
        with client.event_writer(scope, stream) as writer:
            for i in range(total):
                event = f"k{i % 11}|{i:05d}"
                writer.write_event(event.encode(), routing_key=f"k{i % 11}")
                written.append(event)
                if i % 100 == 99:
                    writer.flush()
                    time.sleep(0.12)
                if i == total // 2:
                    writer.flush()
                    client.admin.split_segment(scope, stream, sorted(client.admin.tail(scope, stream))[0])
            writer.flush()
    finally:
        done.set()


def test_restarted_query_reads_every_event_once_in_bounded_batches(registered, client, pravega_controller_uri,
                                                                    unique_name, tmp_path: Path):
    scope, stream = unique_name("ds-stream"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 2)
    written: list[str] = []
    done = threading.Event()
    thread = threading.Thread(target=_writer, args=(client, scope, stream, 3000, written, done), daemon=True)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def query(**trigger):
        frame = (registered.readStream.format("pravega").option("controller", pravega_controller_uri)
                 .option("scope", scope).option("stream", stream).option("decode", "text")
                 .option("max_events_per_trigger", str(LIMIT)).load())
        return (frame.select("event", "segment_id", "offset").writeStream.format("parquet")
                .option("path", out).option("checkpointLocation", checkpoint).trigger(**trigger).start())

    sizes: list[int] = []
    thread.start()
    for _ in range(2):  # started, stopped while the writer writes, restarted from the checkpoint
        q = query(processingTime="200 milliseconds")
        deadline = time.monotonic() + 120
        while len(q.recentProgress) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        q.stop()
        sizes += [p["numInputRows"] for p in q.recentProgress]
    assert done.wait(120)
    q = query(availableNow=True)
    q.awaitTermination(300)
    sizes += [p["numInputRows"] for p in q.recentProgress]
    assert q.exception() is None

    rows = registered.read.parquet(out).collect()
    events = [r.event for r in rows]
    assert Counter(events) == Counter(written)  # every event once
    assert max(sizes) <= LIMIT and sum(sizes) == len(written)
    # The file sink's log says which micro-batch wrote each file: per key, later events never come
    # in an earlier batch (ids are zero-padded, so text order is write order).
    batch_of = {}
    for log in (Path(out) / "_spark_metadata").iterdir():
        if log.name.isdigit():
            for line in log.read_text().splitlines()[1:]:
                batch_of[Path(json.loads(line)["path"]).name] = int(log.name)
    from pyspark.sql.functions import input_file_name

    tagged = registered.read.parquet(out).select("event", input_file_name().alias("file")).collect()
    by_key: dict[str, list[tuple[str, int]]] = {}
    for r in tagged:
        by_key.setdefault(r.event.split("|")[0], []).append((r.event, batch_of[Path(r.file).name]))
    for pairs in by_key.values():
        batches = [b for _, b in sorted(pairs)]
        assert batches == sorted(batches)
    assert len({r.segment_id for r in rows}) == 4  # both segments before and the two after the split


def _events(client: PravegaClient, scope: str, stream: str) -> list[str]:
    from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_ranges
    from airflow_provider_pravega.client.streamcut import StreamCut

    ranges = plan_segment_ranges(client, StreamCut.head(client, scope, stream), StreamCut.tail(client, scope, stream))
    return [e.payload.decode() for e in read_segment_ranges(client, ranges)]


def test_streaming_write_is_exactly_once_per_micro_batch_when_spark_replays_one(
        registered, client, pravega_controller_uri, unique_name, tmp_path: Path):
    scope = unique_name("ds-stream-write")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "in", 2)
    client.admin.create_stream(scope, "out", 3)
    source = [f"k{i % 7}|{i:05d}" for i in range(1000)]
    with client.event_writer(scope, "in") as writer:
        for event in source:
            writer.write_event(event.encode(), routing_key=event.split("|")[0])
        writer.flush()
    checkpoint = tmp_path / "checkpoint"

    def run() -> list[int]:
        q = (registered.readStream.format("pravega").option("controller", pravega_controller_uri)
             .option("scope", scope).option("stream", "in").option("max_events_per_trigger", "300").load()
             .selectExpr("event", "split(cast(event AS string), '[|]')[0] AS routing_key")
             .writeStream.format("pravega").option("controller", pravega_controller_uri).option("scope", scope)
             .option("stream", "out").option("writer_id", "readings-copy")
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        q.awaitTermination(300)
        assert q.exception() is None
        return [p["batchId"] for p in q.recentProgress if p["numInputRows"]]

    batches = run()
    assert len(batches) == 4  # 300 + 300 + 300 + 100
    assert Counter(_events(client, scope, "out")) == Counter(source)
    # As if the driver died after the last batch's commit to Pravega but before Spark's commit log:
    # the restarted query replays that batch, and the replay must not be written again.
    for name in (str(batches[-1]), f".{batches[-1]}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    assert run() == [batches[-1]]
    out = _events(client, scope, "out")
    assert Counter(out) == Counter(source)
    per_key: dict[str, list[str]] = {}
    for e in out:
        per_key.setdefault(e.split("|")[0], []).append(e)
    assert all(v == sorted(v) for v in per_key.values())


def test_exactly_once_streaming_write_needs_a_writer_id(registered, client, pravega_controller_uri, unique_name,
                                                         tmp_path: Path):
    scope = unique_name("ds-stream-write-bad")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "in", 1)
    client.admin.create_stream(scope, "out", 1)
    frame = registered.readStream.format("pravega").option("controller", pravega_controller_uri) \
        .option("scope", scope).option("stream", "in").load().select("event")
    with pytest.raises(Exception, match="needs option writer_id"):
        q = (frame.writeStream.format("pravega").option("controller", pravega_controller_uri).option("scope", scope)
             .option("stream", "out").option("checkpointLocation", str(tmp_path / "cp")).start())
        try:
            q.awaitTermination(60)
            raise AssertionError(q.exception())
        finally:
            q.stop()
