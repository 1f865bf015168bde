"""The Spark ingest job against the embedded server: formats, exactly-once reruns, per-key order,
and every bad input with its message (real PySpark in local mode, official client to read back)."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict

import pytest
from hang_guard import HANG_GUARD_S

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.errors import ControllerUnreachableError, StreamNotFoundError
from airflow_provider_pravega.client.ingest_errors import ChangedFileError
from airflow_provider_pravega.spark.ingest_job import run_ingest
from airflow_provider_pravega.spark.ingest_spec import BadRecordError, IngestSpec, SourceError


def write_jsonl(directory, files=3, per_file=500, keys=11):
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(files):
        with open(directory / f"part-{i}.jsonl", "w") as fh:
            for n in range(per_file):
                line = json.dumps({"sensor_id": f"s{n % keys}", "file": i, "n": n, "value": n * 0.5})
                fh.write(line + "\n")
                lines.append(line)
    return lines


def test_jsonl_exactly_once_in_key_order_and_rerun_skips(tmp_path, client, spark, read_stream, unique_name,
                                                          pravega_controller_uri):
    scope = unique_name("ing")
    lines = write_jsonl(tmp_path / "in")
    spec = IngestSpec(scope=scope, stream="readings", source=str(tmp_path / "in" / "*.jsonl"),
                      routing_key_field="sensor_id", create_stream=True, stream_segments=3)
    result = run_ingest(client, spark, spec)
    assert result.events == len(lines) and len(result.files_ingested) == 3
    assert result.transactions and all(t["status"] == "COMMITTED" for t in result.transactions)
    assert result.tail_cut
    events = read_stream(pravega_controller_uri, scope, "readings", expected=len(lines))
    assert Counter(e.decode() for e in events) == Counter(lines)
    per_key = defaultdict(list)
    for e in events:
        rec = json.loads(e)
        per_key[rec["sensor_id"]].append((rec["file"], rec["n"]))
    assert all(v == sorted(v) for v in per_key.values()), "a key's events are out of source order"

    again = run_ingest(client, spark, spec)
    assert again.run_id is None and sorted(again.files_skipped) == sorted(result.files_ingested)
    # A new file next to the old ones: only it is ingested.
    with open(tmp_path / "in" / "part-9.jsonl", "w") as fh:
        fh.write(json.dumps({"sensor_id": "s1", "file": 9, "n": 0}) + "\n")
    third = run_ingest(client, spark, spec)
    assert third.events == 1 and len(third.files_skipped) == 3
    assert len(read_stream(pravega_controller_uri, scope, "readings", expected=len(lines) + 1)) == len(lines) + 1


def test_changed_file_is_refused_unless_allowed(tmp_path, client, spark, unique_name):
    scope = unique_name("chg")
    write_jsonl(tmp_path / "in", files=1, per_file=10)
    spec = IngestSpec(scope=scope, stream="s", source=str(tmp_path / "in"), create_stream=True)
    run_ingest(client, spark, spec)
    path = tmp_path / "in" / "part-0.jsonl"
    with open(path, "a") as fh:  # appended: only the new line is ingested
        fh.write('{"sensor_id": "late"}\n')
    tailed = run_ingest(client, spark, spec)
    assert tailed.events == 1
    path.write_text('{"sensor_id": "early"}\n' + path.read_text())  # rewritten in place: refused
    started = time.monotonic()
    with pytest.raises(ChangedFileError, match=r"its first \d+ bytes differ from the bytes committed\. Committed so "
                                               rf"far: lines 1-11 \(the last of them by run {tailed.run_id}; .*"
                                               r"allow_changed_files=True would ingest the whole file again from its "
                                               r"first line, writing lines 1-11 a second time"):
        run_ingest(client, spark, spec)
    assert time.monotonic() - started < HANG_GUARD_S
    allowed = IngestSpec(scope=scope, stream="s", source=str(tmp_path / "in"), allow_changed_files=True)
    assert run_ingest(client, spark, allowed).events == 12


def test_malformed_record_names_file_and_line_and_nothing_is_visible(tmp_path, client, spark, read_stream,
                                                                     unique_name, pravega_controller_uri):
    scope = unique_name("bad")
    write_jsonl(tmp_path / "in", files=2, per_file=50)
    with open(tmp_path / "in" / "part-1.jsonl", "a") as fh:
        fh.write('{"sensor_id": "ok", "n": 1}\n{"sensor_id": broken\n')
    spec = IngestSpec(scope=scope, stream="s", source=str(tmp_path / "in" / "*.jsonl"),
                      routing_key_field="sensor_id", create_stream=True, stream_segments=2)
    with pytest.raises(BadRecordError, match=r"part-1\.jsonl, line 52: not valid JSON"):
        run_ingest(client, spark, spec)
    assert read_stream(pravega_controller_uri, scope, "s", timeout=8) == []
    # The failed run left nothing behind: after fixing the file everything lands once.
    lines = (tmp_path / "in" / "part-1.jsonl").read_text().splitlines()[:-1]
    (tmp_path / "in" / "part-1.jsonl").write_text("\n".join(lines) + "\n")
    assert run_ingest(client, spark, spec).events == 101


def test_missing_routing_key_is_a_bad_record(tmp_path, client, spark, unique_name):
    scope = unique_name("nokey")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"sensor_id": "a"}\n{"other": 1}\n')
    spec = IngestSpec(scope=scope, stream="s", source=str(tmp_path / "in"), routing_key_field="sensor_id",
                      create_stream=True)
    with pytest.raises(BadRecordError, match=r"a\.jsonl, line 2: no routing key field 'sensor_id'"):
        run_ingest(client, spark, spec)


def test_csv_parquet_and_text_formats(tmp_path, client, spark, read_stream, unique_name, pravega_controller_uri):
    scope = unique_name("fmt")
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "a.csv").write_text("sensor_id,value\ns1,1.5\ns2,2.5\n")
    r = run_ingest(client, spark, IngestSpec(scope=scope, stream="csv", source=str(tmp_path / "csv"), format="csv",
                                             routing_key_field="sensor_id", create_stream=True))
    assert r.events == 2
    got = [json.loads(e) for e in read_stream(pravega_controller_uri, scope, "csv", expected=2)]
    assert sorted(got, key=lambda d: d["sensor_id"]) == [{"sensor_id": "s1", "value": "1.5"},
                                                         {"sensor_id": "s2", "value": "2.5"}]

    spark.createDataFrame([("k1", 1), ("k2", 2), ("k3", 3)], "key string, v long").coalesce(1) \
        .write.parquet(str(tmp_path / "pq"))
    r = run_ingest(client, spark, IngestSpec(scope=scope, stream="pq", source=str(tmp_path / "pq" / "*.parquet"),
                                             format="parquet", routing_key_field="key", payload_field="v",
                                             create_stream=True))
    assert r.events == 3
    assert sorted(read_stream(pravega_controller_uri, scope, "pq", expected=3)) == [b"1", b"2", b"3"]

    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "log.txt").write_text("first line\nsecond line\n\nthird line\n")
    r = run_ingest(client, spark, IngestSpec(scope=scope, stream="txt", source=str(tmp_path / "txt"), format="text",
                                             create_stream=True))
    assert r.events == 3
    assert read_stream(pravega_controller_uri, scope, "txt", expected=3) == [b"first line", b"second line",
                                                                             b"third line"]


def test_at_least_once_mode_writes_everything(tmp_path, client, spark, read_stream, unique_name,
                                             pravega_controller_uri):
    """At least once is the exactly-once data path without the commit point: no Spark job of its own
    (it used to validate every record in a pass before writing), its transactions committed at the
    end, so nothing is visible before every record passed."""
    scope = unique_name("alo")
    lines = write_jsonl(tmp_path / "in", files=2, per_file=100)
    write_jsonl(tmp_path / "again", files=2, per_file=100)
    jobs = {}
    for mode, source, stream in (("at_least_once", "in", "alo"), ("exactly_once", "again", "exo")):
        spark.sparkContext.setJobGroup(f"{scope}-{mode}", mode)
        try:
            r = run_ingest(client, spark, IngestSpec(scope=scope, stream=stream, source=str(tmp_path / source),
                                                     routing_key_field="sensor_id", mode=mode,
                                                     create_stream=True, stream_segments=2))
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        jobs[mode] = len(spark.sparkContext.statusTracker().getJobIdsForGroup(f"{scope}-{mode}"))
        assert r.events == 200 and r.transactions and {t["status"] for t in r.transactions} == {"COMMITTED"}
    assert 0 < jobs["at_least_once"] <= jobs["exactly_once"], jobs
    got = read_stream(pravega_controller_uri, scope, "alo", expected=200)
    assert Counter(e.decode() for e in got) == Counter(lines)


def test_bad_inputs_fail_fast_with_clear_messages(tmp_path, client, spark, unique_name):
    scope = unique_name("errs")
    client.admin.create_scope(scope)
    started = time.monotonic()
    with pytest.raises(SourceError, match="does not exist"):
        run_ingest(client, spark, IngestSpec(scope=scope, stream="s", source=str(tmp_path / "nope.jsonl")))
    with pytest.raises(SourceError, match="matches no file"):
        run_ingest(client, spark, IngestSpec(scope=scope, stream="s", source=str(tmp_path / "*.jsonl")))
    empty = run_ingest(client, spark, IngestSpec(scope=scope, stream="s", source=str(tmp_path / "*.jsonl"),
                                                 on_empty="succeed"))
    assert empty.run_id is None and empty.events == 0
    write_jsonl(tmp_path / "in", files=1, per_file=1)
    with pytest.raises(StreamNotFoundError):
        run_ingest(client, spark, IngestSpec(scope=scope, stream="missing", source=str(tmp_path / "in")))
    assert time.monotonic() - started < HANG_GUARD_S
    with pytest.raises(ValueError, match="format must be one of"):
        IngestSpec(scope=scope, stream="s", source="x", format="xml")
    with pytest.raises(ValueError, match="mode must be one of"):
        IngestSpec(scope=scope, stream="s", source="x", mode="maybe")


def test_unreachable_controller_fails_within_seconds(tmp_path, spark):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    write_jsonl(tmp_path / "in", files=1, per_file=1)
    started = time.monotonic()
    with PravegaClient(f"tcp://127.0.0.1:{port}") as c:
        with pytest.raises(ControllerUnreachableError, match=f"127.0.0.1:{port}"):
            run_ingest(c, spark, IngestSpec(scope="x", stream="y", source=str(tmp_path / "in")))
    assert time.monotonic() - started < HANG_GUARD_S


def test_a_small_run_is_one_write_task_and_a_large_one_spreads_over_the_cores(tmp_path, client, spark, unique_name):
    """A write task per 16 MiB planned, up to Spark's parallelism (each task of a scheduled run
    starts a new Python worker); num_writers overrides it."""
    from airflow_provider_pravega.spark.ingest_partitions import BYTES_PER_WRITER, writers_of

    cores = spark.sparkContext.defaultParallelism
    assert cores >= 2
    spec = IngestSpec(scope="s", stream="t", source="/in/*.jsonl")
    mib = 1024 * 1024
    assert writers_of(spark, spec, {"a": {"size": 10}, "b": {"start": 0, "end": 3 * mib}}) == 1
    assert writers_of(spark, spec, {}) == 1
    assert writers_of(spark, spec, {"a": {"size": BYTES_PER_WRITER + 1}}) == 2
    assert writers_of(spark, spec, {f"f{i}": {"size": BYTES_PER_WRITER} for i in range(64)}) == cores
    assert writers_of(spark, IngestSpec(scope="s", stream="t", source="/in/*.jsonl", num_writers=5),
                      {"a": {"size": 10}}) == 5

    scope = unique_name("ing-small")
    lines = write_jsonl(tmp_path / "in", files=4, per_file=200)
    spec = IngestSpec(scope=scope, stream="readings", source=str(tmp_path / "in" / "*.jsonl"),
                      routing_key_field="sensor_id", create_stream=True)
    result = run_ingest(client, spark, spec)
    assert result.events == len(lines) and len(result.transactions) == 1


def test_ten_thousand_small_files_cost_a_few_spark_tasks(tmp_path, pravega_embedded, spark, read_stream, unique_name,
                                                        monkeypatch):
    """A folder of 10,000 small files read by Spark's reader (past the size read in this process, on
    a filesystem other than the local one) costs the write job's tasks and nothing per file: Spark
    lists the files each write group names in a job of a task per file unless told otherwise
    (spark/ingest_partitions.write_job_settings)."""
    from airflow_provider_pravega.spark import ingest_frames

    monkeypatch.setattr(ingest_frames, "LOCAL_LINES_MAX_BYTES", 0)  # not sent in the query
    monkeypatch.setattr(ingest_frames, "is_local_key", lambda key: False)  # read by binaryFile, as s3a:// files are
    source = tmp_path / "day"
    source.mkdir()
    lines = []
    for i in range(10_000):
        line = json.dumps({"sensor_id": f"s{i % 7}", "n": i})
        (source / f"part-{i:05d}.jsonl").write_text(line + "\n")
        lines.append(line)
    scope, uri = unique_name("small"), pravega_embedded.controller_uri  # listing is the backend's no matter
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup(scope, "10,000 small files")
    try:
        with PravegaClient(uri) as client:
            result = run_ingest(client, spark, IngestSpec(scope=scope, stream="s", source=str(source),
                                                          routing_key_field="sensor_id", create_stream=True,
                                                          stream_segments=2, num_writers=2))
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    tasks = sum(tracker.getStageInfo(stage).numTasks for job in tracker.getJobIdsForGroup(scope)
                for stage in tracker.getJobInfo(job).stageIds)
    assert result.events == 10_000 and len(result.files_ingested) == 10_000
    assert tasks <= 2 * 2, f"{tasks} Spark tasks for 2 writers"  # the writes, and at most one task more each
    assert Counter(e.decode() for e in read_stream(uri, scope, "s", expected=10_000)) == Counter(lines)
