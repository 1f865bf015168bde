"""The ``pravega`` PySpark data source on the session's Spark (local mode, task retries on) against
both backends: a batch read between two stream cuts (across a scale) returns exactly what the raw
segment reader returns; a batch write puts every row in the stream once, in per-key order, even
when a task attempt dies after writing some events (Spark retries it); a failed job commits nothing;
bad options fail before anything is written; mode=at_least_once appends plainly."""

from __future__ import annotations

import json
import logging
import os
import time
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


def test_a_finished_task_transaction_outlives_its_lease_until_the_job_commits(registered, pravega_embedded_factory,
                                                                              unique_name):
    """Partition 0 ends at once, partition 1 takes several leases: partition 0's transaction is
    renewed by partition 1's task, which renews every transaction registered in the job's run while
    it writes, so the driver's commit finds it open (without that it expires and the job fails).
    Between the last task and the commit, this process (it registered the data source with
    ``renew_writes``) renews them: a 3-s lease is shorter than that gap on a loaded machine. No
    process is left behind on the executor's host, and nothing is written to its disk. A server
    granting 3-s leases (Pravega's minimum is 10 s; the embedded one shortens leases for tests)
    keeps the test short."""
    lease_ms = 3000
    controller = pravega_embedded_factory(txn_lease_cap_ms=lease_ms).controller_uri
    scope, stream = unique_name("ds-lease"), "s"
    client = PravegaClient(controller)
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 2)
    renewer = register(registered, renew_writes={"controller": controller, "scope": scope})

    def rows(batches):
        import time

        import pyarrow as pa
        from pyspark import TaskContext

        p = TaskContext.get().partitionId()
        if p == 1:
            time.sleep(3 * lease_ms / 1000)  # partition 0 has long finished
        yield pa.RecordBatch.from_pydict({"event": [f"{p}-{i}".encode() for i in range(50)]})
        for _ in batches:
            pass

    (registered.range(0, 2, 1, 2).mapInArrow(rows, "event binary").write.format("pravega").mode("append")
     .option("controller", controller).option("scope", scope).option("stream", stream)
     .option("transaction_lease_ms", str(lease_ms)).save())
    renewer.stop()
    register(registered)  # the plain data source again for the other tests of the session
    assert Counter(_stream_events(client, scope, stream)) == Counter(
        f"{p}-{i}".encode() for p in range(2) for i in range(50))
    assert len(renewer.renewed_runs) == 1

    with pytest.raises(Exception, match="unknown option 'lease_keep_s'"):  # the keeper's option went with it
        (registered.range(0, 1).selectExpr("cast(id as string) as event").write.format("pravega").mode("append")
         .option("controller", controller).option("scope", scope).option("stream", stream)
         .option("lease_keep_s", "60").save())
    client.close()


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


def test_json_events_read_into_the_columns_of_a_given_schema(registered, client, pravega_controller_uri,
                                                            unique_name):
    from pyspark.errors import PySparkException

    scope, stream = unique_name("ds-json"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 2)
    with client.event_writer(scope, stream) as writer:
        for i in range(600):  # compact, pretty-printed, extra and missing fields, nested values
            doc = {"sensor": f"s{i % 7}", "reading": i / 4, "tags": [i, i + 1], "unused": "x"}
            if i % 5 == 0:
                del doc["reading"]
            text = json.dumps(doc, indent=2 if i % 3 == 0 else None)
            writer.write_event(text.encode(), routing_key=doc["sensor"])
        writer.flush()

    def read(schema: str | None, **options):
        reader = registered.read.format("pravega")
        if schema:
            reader = reader.schema(schema)
        for k, v in {"controller": pravega_controller_uri, "scope": scope, "stream": stream, "decode": "json",
                     **options}.items():
            reader = reader.option(k, v)
        return reader.load()

    frame = read("sensor string, reading double, tags array<bigint>, segment_id bigint, offset bigint")
    rows = frame.collect()
    assert len(rows) == 600 and frame.columns == ["sensor", "reading", "tags", "segment_id", "offset"]
    by_first_tag = {r.tags[0]: r for r in rows}
    assert sorted(by_first_tag) == list(range(600))
    for i, row in by_first_tag.items():
        assert (row.sensor, row.reading, row.tags) == (f"s{i % 7}", None if i % 5 == 0 else i / 4, [i, i + 1])
    raw = {(e.segment_id, e.offset) for e in
           read_segment_ranges(client, plan_segment_ranges(client, StreamCut.head(client, scope, stream),
                                                           StreamCut.tail(client, scope, stream)))}
    assert {(r.segment_id, r.offset) for r in rows} == raw  # each row names its event's position

    with client.event_writer(scope, stream) as writer:
        writer.write_event(b'{"sensor": "s1", "reading": "warm"}', routing_key="bad")
        writer.flush()
    bad = next(e.offset for e in read_segment_ranges(client, plan_segment_ranges(
        client, StreamCut.head(client, scope, stream), StreamCut.tail(client, scope, stream))) if b"warm" in e.payload)
    with pytest.raises(PySparkException, match=rf"the event at offset {bad} of segment .* cannot be read as JSON"):
        read("sensor string, reading double").collect()
    assert read("sensor string, tags array<bigint>").count() == 601  # 'reading' not asked for: fine

    cases = [
        (None, {}, "decode=json needs the events' fields as a schema"),
        ("sensor string, offset string", {}, "offset string: columns named"),
        ("offset bigint", {}, "needs at least one column read from the events' JSON"),
        ("event string", {"decode": "binary"}, "with decode=binary the schema is fixed"),
        (None, {"decode": "yaml"}, "option decode must be one of binary, text, json"),
    ]
    for schema, options, message in cases:
        with pytest.raises(PySparkException, match=message):
            read(schema, **options).collect()


def test_write_and_read_through_a_controller_list_whose_first_controller_is_down(
        registered, client, pravega_controller_uri, unique_name):
    """Spark's driver and executors take the whole list (issue 32) and use the controller that answers."""
    import socket

    with socket.socket() as sock:  # a port nothing listens on: a controller that is down
        sock.bind(("127.0.0.1", 0))
        down = sock.getsockname()[1]
    controllers = f"tcp://127.0.0.1:{down},{pravega_controller_uri.split('://', 1)[1]}"
    scope, stream = unique_name("ds-list"), "s"
    frame = registered.range(0, 120, 1, 3).selectExpr("cast(id as string) as event")
    (frame.write.format("pravega").mode("append").option("controller", controllers).option("scope", scope)
     .option("stream", stream).option("create_stream", "true").option("segments", "2").save())
    assert Counter(_stream_events(client, scope, stream)) == Counter(str(i).encode() for i in range(120))
    back = (registered.read.format("pravega").option("controller", controllers).option("scope", scope)
            .option("stream", stream).option("decode", "text").load())
    assert sorted(int(r.event) for r in back.collect()) == list(range(120))


def test_write_creates_the_scope_and_stream_when_asked(registered, client, pravega_controller_uri, unique_name):
    from pyspark.errors import PySparkException

    scope = unique_name("ds-create")
    frame = registered.range(0, 90, 1, 3).selectExpr("cast(id as string) as event")

    def save(stream: str, **options):
        writer = frame.write.format("pravega").mode("append")
        for k, v in {"controller": pravega_controller_uri, "scope": scope, "stream": stream, **options}.items():
            writer = writer.option(k, v)
        writer.save()

    with pytest.raises(PySparkException, match=f"stream {scope}/fixed does not exist"):
        save("fixed")  # create_stream defaults to false
    for options, message in [({"create_stream": "yes"}, "option create_stream must be true or false"),
                             ({"create_stream": "true", "segments": "0"}, "segments must be at least 1"),
                             ({"create_stream": "true", "scaling_policy": "by_event_rate"},
                              "needs target_rate and scale_factor")]:
        with pytest.raises(PySparkException, match=message):
            save("fixed", **options)
    assert not client.admin.scope_exists(scope)  # bad options create nothing

    save("fixed", create_stream="true", segments="3", retention_time_ms="86400000")
    save("fixed", create_stream="true", segments="5")  # exists: left as it is, rows appended
    assert len(client.admin.tail(scope, "fixed")) == 3
    assert Counter(_stream_events(client, scope, "fixed")) == Counter(str(i).encode() for i in list(range(90)) * 2)
    save("rated", create_stream="true", scaling_policy="by_event_rate", target_rate="1000", scale_factor="2",
         min_segments="2")
    info = client.admin.stream_info(scope, "rated")
    assert (info.config.scaling.kind, info.config.scaling.min_segments) == ("by_rate_in_events_per_sec", 2)


def test_a_read_of_the_callers_plan_keeps_its_partitions_order_and_columns(registered, client,
                                                                          pravega_controller_uri, unique_name):
    """segment_ranges: partition i reads the i-th list, its ranges in the given order (the export
    names its files by this); columns: only those, in that order."""
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    from airflow_provider_pravega.spark.datasource import segment_ranges_option

    scope, stream = unique_name("ds-plan"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 2)
    _write(client, scope, stream, "e", 200)
    r0, r1 = sorted(plan_segment_ranges(client, StreamCut.head(client, scope, stream),
                                        StreamCut.tail(client, scope, stream)), key=lambda r: r.segment_id)
    events0 = list(read_segment_ranges(client, [r0]))
    middle = events0[len(events0) // 2].offset  # an event boundary: r0 read in two pieces
    first, second = (type(r0)(scope, stream, r0.segment_id, r0.start_offset, middle),
                     type(r0)(scope, stream, r0.segment_id, middle, r0.end_offset))
    plan = [[r1, second], [], [first]]

    def read(**options):
        reader = registered.read.format("pravega")
        for k, v in {"controller": pravega_controller_uri, "scope": scope, "stream": stream, **options}.items():
            reader = reader.option(k, v)
        return reader.load()

    frame = read(segment_ranges=segment_ranges_option(plan), columns="offset,segment_id,event", decode="text")
    assert frame.columns == ["offset", "segment_id", "event"]
    assert frame.rdd.getNumPartitions() == 3
    rows = frame.select(F.spark_partition_id().alias("p"), "*").collect()
    expected = [(p, e.offset, e.segment_id, e.payload.decode()) for p, part in enumerate(plan)
                for e in read_segment_ranges(client, part)]
    assert [(r.p, r.offset, r.segment_id, r.event) for r in rows] == expected
    assert len(rows) == 200
    assert read(segment_ranges="[]").count() == 0  # an empty plan: one empty partition

    cases = [
        ({"segment_ranges": "[]", "start_stream_cut": "head"}, "leave out start_stream_cut"),
        ({"segment_ranges": '[[["a", "b", 0]]]'}, "must be a JSON list of partitions"),
        ({"segment_ranges": "{"}, "must be a JSON list of partitions"),
        ({"segment_ranges": '[[["a", "b", 0, 9, 3]]]'}, "ends .3. before it starts"),
        ({"segment_ranges": segment_ranges_option([[type(r0)(scope, "other", 0, 0, None)]])},
         f"has ranges of {scope}/other"),
        ({"columns": "event,sequence"}, "option columns must name distinct columns"),
        ({"columns": "event,event"}, "option columns must name distinct columns"),
    ]
    for options, message in cases:
        with pytest.raises(PySparkException, match=message):
            read(**options).collect()
    with pytest.raises(PySparkException, match="option columns is for decode=binary or text"):
        (registered.read.format("pravega").schema("sensor string").option("controller", pravega_controller_uri)
         .option("scope", scope).option("stream", stream).option("decode", "json").option("columns", "offset")
         .load().collect())


@pytest.mark.parametrize("module", ["datasource", "datasource_options", "datasource_read", "datasource_write"])
def test_a_worker_interpreter_without_the_providers_dependencies_is_told_what_to_install(module):
    """Spark imports the data source's modules in its Python workers (each reader or writer from
    its own module): one whose interpreter lacks grpc (a cluster host without the provider) gets
    the remedy, not just "No module named 'grpc'"."""
    import subprocess
    import sys

    probe = ("import sys; sys.modules['grpc'] = None\n"
             f"import airflow_provider_pravega.spark.{module}")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: the pravega Spark data source cannot import grpc"), proc.stderr
    assert "PYSPARK_PYTHON" in last and sys.executable in last


def test_a_write_keeps_its_record_in_the_state_scope(registered, client, pravega_controller_uri, unique_name):
    """Option state_scope: the write's record (by write_id) lives there, none in the stream's scope,
    and a rerun with the same write_id finds it (nothing written twice); a bad one is refused."""
    from pyspark.errors import PySparkException

    from airflow_provider_pravega.client.ingest_location import state_location

    scope, state_scope = unique_name("ds-user"), unique_name("ds-state")
    frame = registered.range(0, 60, 1, 3).selectExpr("cast(id as string) as event")

    def save(**options: str) -> None:
        writer = frame.write.format("pravega").mode("append")
        for k, v in {"controller": pravega_controller_uri, "scope": scope, "stream": "s", "create_stream": "true",
                     "write_id": "daily", **options}.items():
            writer = writer.option(k, v)
        writer.save()

    with pytest.raises(PySparkException, match="state_scope='no spaces'"):
        save(state_scope="no spaces")
    for _ in range(2):
        save(state_scope=state_scope)
    assert Counter(_stream_events(client, scope, "s")) == Counter(str(i).encode() for i in range(60))
    assert [n for n in client.admin.list_streams(scope) if n.startswith("ingest-state-")] == []
    assert state_location(scope, "s", "spark-write:daily", state_scope)[1] in client.admin.list_streams(state_scope)


def test_a_used_write_id_skips_a_retry_of_its_rows_and_refuses_new_ones(registered, client, pravega_controller_uri,
                                                                        unique_name, caplog):
    """A write_id names one write: a rerun with the rows it committed writes nothing (and the driver
    says so); new rows under it are refused, naming the id and the partition, with nothing written
    (they used to be dropped, silently, for every input partition an earlier job committed)."""
    from pyspark.errors import PySparkException

    scope = unique_name("ds-reuse")

    def save(frame, **options: str) -> None:
        writer = frame.write.format("pravega").mode("append")
        for k, v in {"controller": pravega_controller_uri, "scope": scope, "stream": "s", "create_stream": "true",
                     "write_id": "daily", **options}.items():
            writer = writer.option(k, v)
        writer.save()

    first = registered.range(0, 40, 1, 4).selectExpr("cast(id as string) as event", "'k' as routing_key")
    save(first)
    with caplog.at_level(logging.INFO):
        save(first)
    assert "4 input partition(s) hold the rows an earlier job committed under this write_id" in caplog.text
    committed = Counter(str(i).encode() for i in range(40))
    for new in (registered.range(100, 110, 1, 1), registered.range(100, 140, 1, 4),
                registered.range(0, 40, 1, 4).selectExpr("id", "id % 3 as k")):  # same events, other keys
        frame = new.selectExpr("cast(id as string) as event", "cast(k as string) as routing_key"
                               if "k" in new.columns else "'k' as routing_key")
        with pytest.raises(PySparkException, match=r"write_id 'daily': input partition partition-0000\d holds other "
                                                   r"rows than the job that committed it"):
            save(frame)
        assert Counter(_stream_events(client, scope, "s")) == committed
    save(registered.range(100, 110, 1, 1).selectExpr("cast(id as string) as event"), write_id="daily-2")
    assert len(_stream_events(client, scope, "s")) == 50
