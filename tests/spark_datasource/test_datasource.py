"""The ``pravega`` PySpark data source on the session's Spark (local mode, task retries on) against
both backends: a batch read between two stream cuts (across a scale) returns exactly what the raw
segment reader returns; a batch write puts every row in the stream once, in per-key order, even
when a task attempt dies after writing some events (Spark retries it); a failed job commits nothing;
bad options fail before anything is written; mode=at_least_once appends plainly."""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_ranges
from airflow_provider_pravega.client.streamcut import StreamCut
from airflow_provider_pravega.spark.datasource import register


@pytest.fixture(scope="module")
def registered(spark):
    register(spark)
    return spark


def _write(client: PravegaClient, scope: str, stream: str, label: str, count: int) -> list[bytes]:
    events = []
    with client.event_writer(scope, stream) as writer:
        for i in range(count):
            event = f"{label}|k{i % 16}|{i:05d}".encode()
            writer.write_event(event, routing_key=f"k{i % 16}")
            events.append(event)
        writer.flush()
    return events


def _stream_events(client: PravegaClient, scope: str, stream: str) -> list[bytes]:
    ranges = plan_segment_ranges(client, StreamCut.head(client, scope, stream), StreamCut.tail(client, scope, stream))
    return [e.payload for e in read_segment_ranges(client, ranges)]


def test_read_between_two_cuts_equals_the_raw_reader(registered, client, pravega_controller_uri, unique_name):
    scope, stream = unique_name("ds-read"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 2)
    _write(client, scope, stream, "before", 300)
    start = StreamCut.tail(client, scope, stream)
    between = _write(client, scope, stream, "between", 500)
    segment = sorted(client.admin.tail(scope, stream))[0]
    client.admin.split_segment(scope, stream, segment)  # the range plan must follow the scale
    between += _write(client, scope, stream, "after-scale", 400)
    end = StreamCut.tail(client, scope, stream)
    _write(client, scope, stream, "later", 200)

    frame = (registered.read.format("pravega").option("controller", pravega_controller_uri)
             .option("scope", scope).option("stream", stream)
             .option("start_stream_cut", start.to_text()).option("end_stream_cut", end.to_text()).load())
    rows = frame.collect()
    ranges = plan_segment_ranges(client, start, end)
    raw = [(e.payload, e.segment_id, e.offset) for e in read_segment_ranges(client, ranges)]
    assert sorted((bytes(r.event), r.segment_id, r.offset) for r in rows) == sorted(raw)
    assert Counter(bytes(r.event) for r in rows) == Counter(between)
    assert {(r.scope, r.stream) for r in rows} == {(scope, stream)}
    assert frame.rdd.getNumPartitions() == len([r for r in ranges if r.length])
    assert len({r.segment_id for r in rows}) == 4  # both old segments, the two successors

    text = (registered.read.format("pravega").option("controller", pravega_controller_uri).option("scope", scope)
            .option("stream", stream).option("decode", "text").load())  # head to tail by default
    assert text.schema["event"].dataType.simpleString() == "string"
    assert text.count() == 1400
    assert text.filter(text.event.startswith("later|")).count() == 200


def test_write_is_exactly_once_when_a_task_attempt_dies(registered, client, pravega_controller_uri, unique_name,
                                                        tmp_path: Path):
    scope, stream = unique_name("ds-write"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 3)
    marker = str(tmp_path / "died-once")

    def rows(batches):  # partition p: keys p-0..p-4, seq per key ascending; partition 1 dies once mid-way
        import pyarrow as pa
        from pyspark import TaskContext

        p = TaskContext.get().partitionId()
        for chunk in range(4):
            events = [f"p{p}-{i % 5}|{chunk * 100 + i:04d}" for i in range(100)]
            if p == 1 and chunk == 2:
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
                    os._exit(3)  # the Python worker dies after the writer got two chunks
                except FileExistsError:
                    pass
            yield pa.RecordBatch.from_pydict({"event": events, "routing_key": [e.split("|")[0] for e in events]})
        for _ in batches:
            pass

    frame = registered.range(0, 3, 1, 3).mapInArrow(rows, "event string, routing_key string")
    (frame.write.format("pravega").mode("append").option("controller", pravega_controller_uri)
     .option("scope", scope).option("stream", stream).save())

    assert os.path.exists(marker)  # an attempt really died
    events = [e.decode() for e in _stream_events(client, scope, stream)]
    expected = [f"p{p}-{i % 5}|{c * 100 + i:04d}" for p in range(3) for c in range(4) for i in range(100)]
    assert Counter(events) == Counter(expected)  # every row once: the dead attempt's events are not there
    per_key: dict[str, list[str]] = defaultdict(list)
    for e in events:
        key, seq = e.split("|")
        per_key[key].append(seq)
    assert all(seqs == sorted(seqs) for seqs in per_key.values())


def test_a_failed_job_commits_nothing_and_bad_options_fail_first(registered, client, pravega_controller_uri,
                                                                 unique_name):
    from pyspark.errors import PySparkException

    scope, stream = unique_name("ds-fail"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 2)

    def rows(batches):  # every attempt of partition 1 fails after a first batch: the job fails
        import pyarrow as pa
        from pyspark import TaskContext

        p = TaskContext.get().partitionId()
        yield pa.RecordBatch.from_pydict({"event": [f"{p}-{i}".encode() for i in range(50)]})
        if p == 1:
            raise RuntimeError("row 50 of partition 1 is bad")
        for _ in batches:
            pass

    def save(frame, **options):
        writer = frame.write.format("pravega").mode("append")
        for k, v in {"controller": pravega_controller_uri, "scope": scope, "stream": stream, **options}.items():
            writer = writer.option(k, v)
        writer.save()

    failing = registered.range(0, 2, 1, 2).mapInArrow(rows, "event binary")
    with pytest.raises(Exception, match="row 50 of partition 1 is bad"):
        save(failing)
    assert _stream_events(client, scope, stream) == []  # partition 0's transaction was aborted, not committed

    good = registered.createDataFrame([("a", 1)], "event string, n int")
    cases = [
        (good, {}, "columns the pravega data source does not write: n"),
        (good.select("n"), {}, "needs a column 'event'"),
        (good.selectExpr("n as event"), {}, "column 'event' must be binary or string, got int"),
        (good.select("event"), {"stream": "missing"}, f"stream {scope}/missing does not exist"),
        (good.select("event"), {"controller": ""}, "needs option 'controller'"),
        (good.select("event"), {"mode": "twice"}, "option mode must be one of"),
    ]
    for frame, options, message in cases:
        with pytest.raises(PySparkException, match=message):
            save(frame, **options)
    assert _stream_events(client, scope, stream) == []

    plain = registered.range(0, 120, 1, 2).selectExpr("cast(id as string) as event",
                                                     "cast(id % 3 as string) as routing_key")
    save(plain, mode="at_least_once")  # plain appends, no transaction
    assert Counter(_stream_events(client, scope, stream)) == Counter(str(i).encode() for i in range(120))
