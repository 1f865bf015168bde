"""The Spark export job against the embedded server: exports across scaling, recorded intervals that
tile the stream and reproduce byte for byte, ingest cuts as bounds, and every bad input (with its
time bound, and nothing left at the output path). Real PySpark in local mode; events written with
the official client."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from bad_input_doc import check_section
from export_files import by_partition
from hang_guard import HANG_GUARD_S
from pravega_clients import stream_writer

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.batch import StreamCutOrderError
from airflow_provider_pravega.client.errors import (
    StreamNotFoundError,
    TruncatedStreamCutError,
)
from airflow_provider_pravega.client.streamcut import StreamCut, StreamCutMismatchError
from airflow_provider_pravega.spark.export_job import EventDecodeError, ExportSpec, OutputPathError, main, run_export
from airflow_provider_pravega.spark.export_plan import group_ranges, interval_order
from airflow_provider_pravega.spark.export_state import open_export_state, state_location

KEYS = [f"key-{i:02d}" for i in range(16)]
DAY1 = "2026-11-20T00:00:00+00:00/2026-11-21T00:00:00+00:00"
DAY2 = "2026-11-21T00:00:00+00:00/2026-11-22T00:00:00+00:00"
DAY3 = "2026-11-22T00:00:00+00:00/2026-11-23T00:00:00+00:00"


def write(uri: str, scope: str, stream: str, phase: str, count: int) -> list[str]:
    """``count`` events ``phase|key|seq`` written with the official writer; returns them."""
    writer = stream_writer(uri, scope, stream)
    events = []
    for i in range(count):
        key = KEYS[i % len(KEYS)]
        event = f"{phase}|{key}|{i:06d}"
        writer.write_event(event, routing_key=key)
        events.append(event)
    writer.flush()
    return events


def make_stream(client: PravegaClient, scope: str, stream: str = "s", segments: int = 2) -> None:
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, segments)


def parts(path: str | Path) -> list[Path]:
    return sorted(p for p in Path(path).iterdir() if p.name.startswith("part-") and not p.name.endswith(".crc"))


def manifest(client: PravegaClient, spec: ExportSpec) -> dict:
    """What the export's state in Pravega records of its output path."""
    with open_export_state(client, spec) as sync:
        return sync.fetch().outputs[spec.output_path]


def exported_rows(path: str | Path) -> list[dict]:
    """Rows of a Parquet export, file by file in name order (the export's row order)."""
    rows: list[dict] = []
    for part in parts(path):
        rows.extend(pq.read_table(part).to_pylist())
    return rows


def exported_events(path: str | Path) -> list[str]:
    return [row["event"] for row in exported_rows(path)]


def siblings(path: str | Path) -> list[str]:
    """Hidden temporary or replaced directories an export may have left next to ``path``."""
    p = Path(path)
    return [s.name for s in p.parent.iterdir() if s.name.startswith(f".{p.name}.pravega-")]


# ------------------------------------------------------------------------------------ exports


def test_head_to_tail_across_two_scalings_holds_every_event_once(tmp_path, client, spark, pravega_controller_uri,
                                                                 unique_name):
    scope = unique_name("exp")
    make_stream(client, scope, segments=2)
    written = write(pravega_controller_uri, scope, "s", "a", 600)
    client.admin.split_segment(scope, "s", 0)
    written += write(pravega_controller_uri, scope, "s", "b", 600)
    current = sorted(s.segment_id for s in client.controller.get_current_segments(scope, "s"))
    client.admin.merge_segments(scope, "s", current[-2:])
    written += write(pravega_controller_uri, scope, "s", "c", 600)

    out = tmp_path / "out"
    result = run_export(client, spark, ExportSpec(scope, "s", str(out), start_cut="head", end_cut="tail"))
    rows = exported_rows(out)
    assert Counter(r["event"] for r in rows) == Counter(written)  # each event exactly once
    assert result.events == len(written) == len(rows)
    assert result.bytes == sum(len(e) for e in written)
    # Segments of three epochs, each read in offset order; per routing key, the write order holds.
    assert len({r["segment_id"] >> 32 for r in rows}) == 3
    # A small export is one Spark partition: one file holding every range in plan order.
    assert result.ranges >= 5 and len(result.files) == 1
    by_key: dict[str, list[str]] = {}
    for r in rows:
        by_key.setdefault(r["event"].split("|")[1], []).append(r["event"][0])
    assert all(seq == sorted(seq) for seq in by_key.values())
    for seg in {r["segment_id"] for r in rows}:
        offsets = [r["offset"] for r in rows if r["segment_id"] == seg]
        assert offsets == sorted(offsets)
    # The result names the files it wrote; the export's state records the cuts and the files.
    assert sorted(result.files) == sorted(str(p) for p in parts(out))
    assert (out / "_SUCCESS").exists()
    recorded = manifest(client, ExportSpec(scope, "s", str(out)))
    assert (recorded["start"], recorded["end"], recorded["events"], recorded["interval"]) == (
        result.start_cut, result.end_cut, len(written), None)
    assert sorted(recorded["files"]) == sorted(p.name for p in parts(out))
    assert StreamCut.from_text(result.end_cut) == StreamCut.tail(client, scope, "s")
    assert siblings(out) == []
    # Parquet layout: required columns; no min/max for the opaque payload, but for the positions.
    meta = pq.ParquetFile(parts(out)[0]).metadata
    assert [meta.schema.column(i).max_definition_level for i in range(3)] == [0, 0, 0]
    assert meta.row_group(0).column(0).statistics is None or not meta.row_group(0).column(0).statistics.has_min_max
    assert meta.row_group(0).column(2).statistics.has_min_max


def test_formats_and_event_formats(tmp_path, client, spark, pravega_controller_uri, unique_name):
    scope = unique_name("fmt")
    make_stream(client, scope, segments=2)
    writer = stream_writer(pravega_controller_uri, scope, "s")
    records = [{"sensor": f"s{i % 3}", "n": i, "value": i * 0.5, "tags": {"site": "north"}} for i in range(50)]
    for r in records:
        writer.write_event(json.dumps(r), routing_key=r["sensor"])
    writer.flush()
    cuts = {"start_cut": "head", "end_cut": StreamCut.tail(client, scope, "s").to_text()}

    run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "pq"), event_format="json", **cuts))
    got = exported_rows(tmp_path / "pq")
    assert sorted((r["sensor"], r["n"], r["value"], r["tags"]["site"]) for r in got) == sorted(
        (r["sensor"], r["n"], r["value"], "north") for r in records)
    assert {"segment_id", "offset"} <= set(got[0])

    run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "jl"), format="jsonl", **cuts))
    lines = [json.loads(line) for p in parts(tmp_path / "jl") for line in p.read_text().splitlines()]
    assert sorted(json.loads(x["event"])["n"] for x in lines) == list(range(50))

    run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "csv"), format="csv", event_format="json", **cuts))
    import csv

    csv_rows = [row for p in parts(tmp_path / "csv") for row in csv.DictReader(p.open())]
    assert sorted(int(r["n"]) for r in csv_rows) == list(range(50))
    assert json.loads(csv_rows[0]["tags"]) == {"site": "north"}  # nested values as JSON text in CSV

    run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "bin"), event_format="binary", **cuts))
    raw = [r["event"] for r in exported_rows(tmp_path / "bin")]
    assert sorted(json.loads(b)["n"] for b in raw) == list(range(50)) and isinstance(raw[0], bytes)

    fewer = run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "one"), num_partitions=1, **cuts))
    assert len(fewer.files) == 1 and fewer.events == 50

    # Another codec: the files say so in their names and in their Parquet metadata, same rows.
    zstd = run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "zstd"), compression="zstd", **cuts))
    assert all(f.endswith(".zstd.parquet") for f in zstd.files)
    assert pq.ParquetFile(parts(tmp_path / "zstd")[0]).metadata.row_group(0).column(0).compression == "ZSTD"
    assert sorted(exported_events(tmp_path / "zstd")) == sorted(exported_events(tmp_path / "one"))
    gz = run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "gz"), format="jsonl", compression="gzip",
                                              **cuts))
    assert gz.events == 50 and all(f.endswith(".json.gz") for f in gz.files)
    with pytest.raises(ValueError, match="compression for csv must be one of"):
        ExportSpec(scope, "s", str(tmp_path / "x"), format="csv", compression="lz4_raw")

    # A given JSON schema: only its fields, with its types; a bad one is refused before any task.
    run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "schema"), event_format="json",
                                         json_schema="n int, sensor string", **cuts))
    typed = exported_rows(tmp_path / "schema")
    assert set(typed[0]) == {"n", "sensor", "segment_id", "offset"} and sorted(r["n"] for r in typed) == list(range(50))
    with pytest.raises(ValueError, match="not a Spark DDL schema"):
        run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "bad-schema"), event_format="json",
                                             json_schema="n int,, oops(", **cuts))
    assert not (tmp_path / "bad-schema").exists() and siblings(tmp_path / "bad-schema") == []


def test_intervals_tile_the_stream_and_reruns_are_byte_identical(tmp_path, client, spark, pravega_controller_uri,
                                                                 unique_name):
    scope = unique_name("tile")
    make_stream(client, scope, segments=3)

    def export(interval: str, day: str):
        return run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / day), export_id="daily",
                                                    interval_key=interval))

    first = write(pravega_controller_uri, scope, "s", "d1", 400)
    r1 = export(DAY1, "d1")
    second = write(pravega_controller_uri, scope, "s", "d2", 300)
    client.admin.split_segment(scope, "s", 1)
    second += write(pravega_controller_uri, scope, "s", "d2b", 300)
    r2 = export(DAY2, "d2")
    third = write(pravega_controller_uri, scope, "s", "d3", 200)
    r3 = export(DAY3, "d3")
    assert Counter(exported_events(tmp_path / "d1")) == Counter(first)
    assert Counter(exported_events(tmp_path / "d2")) == Counter(second)
    assert Counter(exported_events(tmp_path / "d3")) == Counter(third)
    assert (r1.end_cut, r2.end_cut) == (r2.start_cut, r3.start_cut)  # no gap, no overlap
    assert not any(r.reused_record for r in (r1, r2, r3))

    # More data arrives; re-running day 2 reproduces its files byte for byte from the recorded cuts.
    write(pravega_controller_uri, scope, "s", "late", 100)
    before = by_partition(tmp_path / "d2")
    again = export(DAY2, "d2")
    assert again.reused_record and again.replaced_output
    assert (again.start_cut, again.end_cut, again.events) == (r2.start_cut, r2.end_cut, r2.events)
    assert by_partition(tmp_path / "d2") == before  # no stale file of the first run left
    assert siblings(tmp_path / "d2") == []
    # A run that died in its job commit left part of its files and no _SUCCESS: the directory is
    # this export's (its claim is in the state), so the next run replaces what is there.
    (tmp_path / "d2" / "_SUCCESS").unlink()
    (tmp_path / "d2" / "part-00007-0b1e4c7a-5f0c-4c51-9d7e-3d1f0e2a9b11-c000.snappy.parquet").write_bytes(b"partial")
    healed = export(DAY2, "d2")
    assert healed.replaced_output and by_partition(tmp_path / "d2") == before
    assert (tmp_path / "d2" / "_SUCCESS").exists()

    # Other formats reproduce too (parquet was checked above).
    for fmt in ("jsonl", "csv"):
        run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / f"{fmt}-a"), export_id=f"f-{fmt}",
                                                 interval_key=DAY1, format=fmt))
        write(pravega_controller_uri, scope, "s", f"more-{fmt}", 10)
        b = run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / f"{fmt}-b"), export_id=f"f-{fmt}",
                                                 interval_key=DAY1, format=fmt))
        assert b.reused_record and by_partition(tmp_path / f"{fmt}-a") == by_partition(tmp_path / f"{fmt}-b")


def test_backfill_of_an_old_interval_reuses_its_record_and_gaps_fill_exactly(tmp_path, client, spark,
                                                                             pravega_controller_uri, unique_name):
    scope = unique_name("backfill")
    make_stream(client, scope, segments=2)

    def export(interval: str, name: str):
        return run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / name), export_id="bf",
                                                    interval_key=interval))

    written = write(pravega_controller_uri, scope, "s", "one", 200)
    r1 = export(DAY1, "d1")
    written += write(pravega_controller_uri, scope, "s", "three", 200)
    r3 = export(DAY3, "d3")  # day 2 was skipped: day 3 starts where day 1 ended
    assert r3.start_cut == r1.end_cut
    written += write(pravega_controller_uri, scope, "s", "four", 50)

    # A backfill of day 2 lies between two recorded intervals: it gets exactly the gap (nothing).
    r2 = export(DAY2, "d2")
    assert (r2.start_cut, r2.end_cut, r2.events) == (r1.end_cut, r3.start_cut, 0)
    # A backfill of day 1 after newer intervals exist reuses its own record.
    again = export(DAY1, "d1")
    assert again.reused_record and (again.start_cut, again.end_cut) == (r1.start_cut, r1.end_cut)
    union = exported_events(tmp_path / "d1") + exported_events(tmp_path / "d2") + exported_events(tmp_path / "d3")
    assert Counter(union) == Counter(written[:400])
    assert [p for p in (tmp_path / "d2").iterdir() if p.name.startswith("part-")]  # an empty, valid dataset
    assert pq.read_table(tmp_path / "d2").num_rows == 0

    assert interval_order(DAY1) < interval_order(DAY2) < interval_order(DAY3) < interval_order("not-a-date")


def test_plain_previous_continues_and_a_failed_run_is_redone_with_its_cuts(tmp_path, client, spark,
                                                                          pravega_controller_uri, unique_name):
    scope = unique_name("prev")
    make_stream(client, scope, segments=2)
    first = write(pravega_controller_uri, scope, "s", "p1", 120)
    r1 = run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "r1"), export_id="plain"))
    assert Counter(exported_events(tmp_path / "r1")) == Counter(first)

    second = write(pravega_controller_uri, scope, "s", "p2", 80)
    # This run claims (end of r1 .. tail) and then fails: its events are not JSON.
    with pytest.raises(EventDecodeError, match="is not JSON"):
        run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "r2"), export_id="plain",
                                             event_format="json"))
    assert not (tmp_path / "r2").exists() and siblings(tmp_path / "r2") == []
    third = write(pravega_controller_uri, scope, "s", "p3", 60)
    # The next "previous" run exports exactly the failed run's cuts (not up to the new tail) ...
    r2 = run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "r2"), export_id="plain"))
    assert r2.reused_record and r2.start_cut == r1.end_cut
    assert Counter(exported_events(tmp_path / "r2")) == Counter(second)
    # ... and the one after continues from there.
    r3 = run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "r3"), export_id="plain"))
    assert r3.start_cut == r2.end_cut and Counter(exported_events(tmp_path / "r3")) == Counter(third)
    assert state_location(ExportSpec(scope, "s", "x", export_id="plain"))[1].startswith("export-state-")


def test_cuts_from_an_ingest_bound_the_export(tmp_path, client, spark, pravega_controller_uri, unique_name):
    from airflow_provider_pravega.spark.ingest_job import run_ingest
    from airflow_provider_pravega.spark.ingest_spec import IngestSpec

    scope = unique_name("ingcut")
    batches = []
    for n in range(3):
        src = tmp_path / f"in{n}"
        src.mkdir()
        lines = [json.dumps({"sensor_id": f"s{i % 4}", "batch": n, "i": i}) for i in range(70)]
        (src / "data.jsonl").write_text("\n".join(lines) + "\n")
        batches.append(lines)
    cuts = []
    for n in range(3):
        result = run_ingest(client, spark, IngestSpec(scope=scope, stream="s", source=str(tmp_path / f"in{n}"),
                                                      routing_key_field="sensor_id", create_stream=True,
                                                      stream_segments=2, ingest_id=f"ing-{n}"))
        cuts.append(result.tail_cut)
    out = tmp_path / "between"
    result = run_export(client, spark, ExportSpec(scope, "s", str(out), start_cut=cuts[0], end_cut=cuts[1]))
    assert Counter(exported_events(out)) == Counter(batches[1])
    assert (result.start_cut, result.end_cut) == (cuts[0], cuts[1])
    # The JSON form of a cut (what StreamCut.to_json puts in XCom) works the same.
    as_json = StreamCut.from_text(cuts[1]).to_json()
    tail_part = run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "rest"), start_cut=as_json,
                                                     end_cut="tail"))
    assert Counter(exported_events(tmp_path / "rest")) == Counter(batches[2]) and tail_part.start_cut == cuts[1]


def test_truncated_start_fails_unless_head_is_asked_for(tmp_path, client, spark, pravega_controller_uri,
                                                        unique_name):
    scope = unique_name("trunc")
    make_stream(client, scope, segments=2)
    old_head = StreamCut.head(client, scope, "s").to_text()
    write(pravega_controller_uri, scope, "s", "gone", 100)
    middle = StreamCut.tail(client, scope, "s")
    kept = write(pravega_controller_uri, scope, "s", "kept", 100)
    client.admin.truncate_stream(scope, "s", middle.positions)
    out = tmp_path / "out"
    started = time.monotonic()
    with pytest.raises(TruncatedStreamCutError, match="truncated data"):
        run_export(client, spark, ExportSpec(scope, "s", str(out), start_cut=old_head))
    assert time.monotonic() - started < HANG_GUARD_S
    assert not out.exists() and siblings(out) == []
    result = run_export(client, spark, ExportSpec(scope, "s", str(out), start_cut=old_head, on_truncated="head"))
    assert Counter(exported_events(out)) == Counter(kept) and result.events == 100

    # A recorded interval whose data was truncated away afterwards: a clear error on re-run.
    rec = ExportSpec(scope, "s", str(tmp_path / "rec"), export_id="rec", interval_key=DAY1, start_cut="head")
    run_export(client, spark, rec)
    write(pravega_controller_uri, scope, "s", "later", 20)
    client.admin.truncate_stream(scope, "s", StreamCut.tail(client, scope, "s").positions)
    with pytest.raises(TruncatedStreamCutError, match=re.escape(f"interval {DAY1} was recorded")):
        run_export(client, spark, rec)


def test_bad_inputs_fail_fast_and_leave_nothing(tmp_path, client, spark, pravega_controller_uri, unique_name):
    scope = unique_name("bad")
    make_stream(client, scope, segments=2)
    make_stream(client, scope, "other", segments=1)
    write(pravega_controller_uri, scope, "s", "x", 50)
    out = tmp_path / "out"

    def fails(error, match, **spec):
        started = time.monotonic()
        with pytest.raises(error, match=match):
            run_export(client, spark, ExportSpec(scope, spec.pop("stream", "s"), str(spec.pop("path", out)), **spec))
        elapsed = time.monotonic() - started
        assert elapsed < HANG_GUARD_S, f"{error.__name__} took {elapsed:.1f} s"
        assert not out.exists() and siblings(out) == []

    fails(StreamNotFoundError, f"{scope}/missing does not exist", stream="missing")
    other_cut = StreamCut.tail(client, scope, "other").to_text()
    fails(StreamCutMismatchError, f"belongs to stream {scope}/other", start_cut=other_cut)
    fails(StreamCutMismatchError, f"belongs to stream {scope}/other", start_cut="head", end_cut=other_cut)
    tail = StreamCut.tail(client, scope, "s").to_text()
    fails(StreamCutOrderError, "start cut .* is after the end cut", start_cut=tail, end_cut="head")
    fails(ValueError, "invalid stream cut text", start_cut="not-a-cut")
    (tmp_path / "file").write_text("a file, not a directory")
    fails(OutputPathError, "is not writable", path=tmp_path / "file" / "out")
    fails(OutputPathError, "is a file", path=tmp_path / "file")
    fails(OutputPathError, "output path 'nosuchfs://bucket/out' is not usable", path="nosuchfs://bucket/out")

    # Files that no export wrote are never replaced.
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    with pytest.raises(OutputPathError, match="already holds files that no export wrote as '.*/s' .*keep.txt"):
        run_export(client, spark, ExportSpec(scope, "s", str(foreign), start_cut="head"))
    assert [p.name for p in foreign.iterdir()] == ["keep.txt"]
    # Nor is the export of other cuts.
    run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "mine"), start_cut="head", export_id="e1"))
    write(pravega_controller_uri, scope, "s", "y", 5)
    with pytest.raises(OutputPathError, match="holds an export of other cuts"):
        run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "mine"), start_cut="head", export_id="e1"))
    with pytest.raises(OutputPathError, match="already holds files that no export wrote as 'e2'"):
        run_export(client, spark, ExportSpec(scope, "s", str(tmp_path / "mine"), start_cut="head", export_id="e2"))

    # An event that is not UTF-8 fails in the Spark task; the error names it, nothing is published.
    writer = stream_writer(pravega_controller_uri, scope, "other")
    writer.write_event_bytes(b"ok")
    writer.write_event_bytes(b"\xff\xfe not text")
    writer.flush()
    started = time.monotonic()
    with pytest.raises(EventDecodeError, match="is not UTF-8 text.*event_format='binary'"):
        run_export(client, spark, ExportSpec(scope, "other", str(out), start_cut="head"))
    assert time.monotonic() - started < HANG_GUARD_S
    assert list(out.iterdir()) == [] and siblings(out) == []  # the aborted job's committer removed its files
    binary = run_export(client, spark, ExportSpec(scope, "other", str(out), start_cut="head", event_format="binary"))
    assert binary.events == 2

    for kwargs, match in [
        ({"format": "xml"}, "format must be one of"),
        ({"event_format": "avro"}, "event_format must be one of"),
        ({"on_truncated": "skip"}, "on_truncated must be"),
        ({"format": "csv", "event_format": "binary"}, "CSV files cannot hold binary"),
        ({"end_cut": "previous"}, "end_cut cannot be 'previous'"),
        ({"num_partitions": 0}, "num_partitions must be at least 1"),
    ]:
        with pytest.raises(ValueError, match=match):
            ExportSpec(scope, "s", "/tmp/x", **kwargs)


def test_group_ranges_keeps_plan_order_and_balances_bytes():
    from airflow_provider_pravega.client.batch import SegmentRange

    ranges = [SegmentRange("a", "b", i, 0, size) for i, size in enumerate([100, 10, 10, 10, 100, 10, 50, 10])]
    assert group_ranges(ranges, None) == [[i] for i in range(8)]
    assert group_ranges(ranges, 20) == [[i] for i in range(8)]
    for n in range(1, 8):
        groups = group_ranges(ranges, n)
        assert len(groups) == n and [i for g in groups for i in g] == list(range(8)), groups
    assert group_ranges(ranges, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert group_ranges([], 3) == []


def test_partitions_follow_the_planned_bytes_unless_given():
    from airflow_provider_pravega.client.batch import SegmentRange
    from airflow_provider_pravega.spark.export_plan import BYTES_PER_PARTITION, partitions_of

    def ranges(*sizes):
        return [SegmentRange("sc", "s", i, 0, size) for i, size in enumerate(sizes)]

    spec = ExportSpec("sc", "s", "/tmp/x")
    assert partitions_of(spec, []) == 1
    assert partitions_of(spec, ranges(10, 20, 30)) == 1  # a small interval: one task, one file
    assert partitions_of(spec, ranges(*[BYTES_PER_PARTITION // 2] * 4)) == 2
    assert partitions_of(spec, ranges(BYTES_PER_PARTITION, 1)) == 2
    big = ranges(*[BYTES_PER_PARTITION * 3] * 4)
    assert partitions_of(spec, big) == 12 and len(group_ranges(big, partitions_of(spec, big))) == 4
    assert partitions_of(ExportSpec("sc", "s", "/tmp/x", num_partitions=3), ranges(10, 20)) == 3


def test_command_line(tmp_path, client, spark, pravega_controller_uri, unique_name, capsys):
    scope = unique_name("cli")
    make_stream(client, scope, segments=1)
    written = write(pravega_controller_uri, scope, "s", "cli", 30)
    code = main(["--controller-uri", pravega_controller_uri, "--scope", scope, "--stream", "s",
                 "--output-path", str(tmp_path / "out"), "--format", "jsonl", "--interval", DAY1])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["events"] == 30 and summary["interval"] == DAY1 and summary["files"]
    lines = [json.loads(line)["event"] for f in summary["files"] for line in Path(f).read_text().splitlines()]
    assert Counter(lines) == Counter(written)
    assert main(["--controller-uri", pravega_controller_uri, "--scope", scope, "--stream", "nope",
                 "--output-path", str(tmp_path / "x")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "x")
    assert main(["--controller-uri", pravega_controller_uri, "--scope", scope, "--stream", "s", "--format", "csv",
                 "--compression", "lz4_raw", "--output-path", str(tmp_path / "x")]) == 2
    assert "compression for csv must be one of" in capsys.readouterr().err


def test_arrow_reader_matches_the_event_reader_at_any_chunk_size(client, pravega_controller_uri, unique_name):
    """The export's reader (Arrow slices of each reply, read-ahead thread) against the client's
    event reader: same events and offsets, also when events straddle replies or exceed a reply."""
    import threading

    from airflow_provider_pravega.client.batch import (
        SegmentRange,
        SegmentRangeTruncatedError,
        plan_segment_ranges,
        read_segment_range,
        read_segment_range_arrow,
    )
    from airflow_provider_pravega.client.errors import SegmentStoreError

    scope = unique_name("arrow")
    make_stream(client, scope, segments=1)
    writer = stream_writer(pravega_controller_uri, scope, "s")
    sizes = [0, 1, 7, 8, 9, 100, 3000, 5, 70_000, 2, 300]
    for i, size in enumerate(sizes * 3):
        writer.write_event_bytes(bytes([65 + i % 26]) * size)
    writer.flush()
    (rng,) = plan_segment_ranges(client, StreamCut.head(client, scope, "s"), StreamCut.tail(client, scope, "s"))
    expected = [(e.payload, e.offset) for e in read_segment_range(client, rng)]
    assert len(expected) == len(sizes) * 3
    for chunk in (64, 1000, 4096, 65_536, 8 * 1024 * 1024):
        got = []
        total = 0
        for segment_id, events, offsets, payload_bytes in read_segment_range_arrow(client, rng, chunk=chunk):
            assert segment_id == rng.segment_id
            got.extend(zip(events.to_pylist(), offsets.tolist(), strict=True))
            total += payload_bytes
        assert got == expected, chunk
        assert total == sum(len(p) for p, _ in expected)

    def drain(r, **kw):
        return [e for batch in read_segment_range_arrow(client.segments, r, **kw) for e in batch.payloads.to_pylist()]

    assert drain(SegmentRange(scope, "s", rng.segment_id, 5, 5)) == []
    third = expected[2][1]
    with pytest.raises(SegmentStoreError, match="ends inside an event"):
        drain(SegmentRange(scope, "s", rng.segment_id, 0, third + 3))
    with pytest.raises(SegmentStoreError, match="no valid event header"):
        drain(SegmentRange(scope, "s", rng.segment_id, third + 1, rng.end_offset))
    # Stopping early stops the read-ahead thread.
    before = threading.active_count()
    batches = read_segment_range_arrow(client, rng, chunk=64)
    next(batches)
    batches.close()
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before
    # Data truncated away after planning: the same error as the client's reader.
    client.admin.truncate_stream(scope, "s", {rng.segment_id: expected[5][1]})
    with pytest.raises(SegmentRangeTruncatedError, match="now starts at offset"):
        drain(rng)


def test_a_rerun_of_a_recorded_interval_exports_its_cuts_and_names_a_different_cut_given(
        tmp_path, client, spark, pravega_controller_uri, unique_name, caplog):
    """Exactly once: a recorded interval's rerun exports its recorded cuts again, whatever cut it
    is given; a concrete end_cut that differs is named in a warning beside the recorded one (not
    refused: a retry given a cut that moved must still succeed)."""
    import logging

    scope = unique_name("rerun-cut")
    make_stream(client, scope, segments=1)
    out = tmp_path / "out"
    first = run_export(client, spark, ExportSpec(scope, "s", str(out), export_id="e", interval_key=DAY1))
    other = StreamCut(scope, "s", {0: 30})
    with caplog.at_level(logging.WARNING, logger="airflow_provider_pravega.spark.export_plan"):
        again = run_export(client, spark, ExportSpec(scope, "s", str(out), export_id="e", interval_key=DAY1,
                                                     end_cut=other.to_text()))
    assert (again.start_cut, again.end_cut) == (first.start_cut, first.end_cut)
    warning = next(r.getMessage() for r in caplog.records if "is not used" in r.getMessage())
    assert warning.startswith(f"export e: interval {DAY1} was recorded with end_cut {first.end_cut}, which this rerun "
                              f"exports again; the end_cut given, {other.to_text()}, is not used")
    shown = warning.replace(first.end_cut, "<recorded cut>").replace(other.to_text(), "<given cut>")
    check_section("export-reruns", "Export reruns of a recorded interval", "tests/export/test_export_job.py",
                  [("export rerun of a recorded interval (`interval_key`) given another concrete `end_cut` or "
                    "`start_cut`", f"no error: the recorded cuts are exported again; warning: {shown}")],
                  "Exactly once: once an interval's cuts are recorded its output is fixed, so a retry or a cleared "
                  "run writes the same events. A cut given that differs is named, not refused: a refusal would fail "
                  "every rerun given a cut that moves (`tail`, a template of the latest ingest's tail cut). `head` "
                  "and `tail` are not named (they move by nature).")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="airflow_provider_pravega.spark.export_plan"):
        run_export(client, spark, ExportSpec(scope, "s", str(out), export_id="e", interval_key=DAY1,
                                             end_cut=first.end_cut))  # the recorded cut itself: nothing to say
    assert "is not used" not in caplog.text
