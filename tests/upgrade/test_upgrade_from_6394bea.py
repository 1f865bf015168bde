"""An upgrade from the release at commit 6394bea (2026-11-26): the current code takes over its
Pravega state and its export folders, and a rerun and a backfill of every day need nobody.

The fixtures under ``fixtures/6394bea`` were made by that release itself
(``make_fixtures_6394bea.py`` beside this file says how to make them again): its ingest of days 1
and 2 as the example ingest DAG runs it, its ``from_ingest`` export of day 1 as the example export
DAG runs it (a folder marked with ``_PRAVEGA_EXPORT.json``, part files named
``part-00000.snappy.parquet``), and a second export of day 1 with recorded cuts. Pravega's side
cannot be copied from one server to another, so the fixture holds every event of every segment of
the scope (the data stream, the ingest's and the exports' state streams) and the entries of the
ingest's committed-file table, exactly as that release wrote them, and the state streams again as
that release compacts them; the test appends them to the same segments of a fresh scope of an
embedded server, so every offset, stream cut and state record is the one that release left. Only
the folder the release ran in is replaced by this test's in the recorded file paths. (The scope's
name is that release's, fixed: its stream cuts name it.)
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from bad_input_doc import check_section

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.committed_files import files_table_name
from airflow_provider_pravega.client.controller_types import ScalingPolicy
from airflow_provider_pravega.client.streamcut import segments_of
from airflow_provider_pravega.client.synchronizer import _ConditionalAppender
from airflow_provider_pravega.client.tables import UNCONDITIONAL, TableSegment
from airflow_provider_pravega.protocol import naming
from airflow_provider_pravega.spark import export_claims, export_output
from airflow_provider_pravega.spark.export_job import ExportSpec, OutputPathError, run_export
from airflow_provider_pravega.spark.export_state import ExportState, open_export_state
from airflow_provider_pravega.spark.ingest_job import run_ingest
from airflow_provider_pravega.spark.ingest_spec import IngestSpec

FIXTURES = Path(__file__).parent / "fixtures" / "6394bea"
STREAM = "readings"
INGEST_ID = "pravega_exactly_once_ingest.ingest"
EXPORT_ID = "pravega_stream_cut_export.export"
PLAIN_EXPORT_ID = "plain-export"


def day_key(day: int) -> str:
    return f"2026-11-{day:02d}T00:00:00+00:00/2026-11-{day + 1:02d}T00:00:00+00:00"


def replay(client: PravegaClient, record: dict, base: Path, *, compacted: bool = False) -> str:
    """Append the release's events and table entries to a fresh scope (with ``compacted``, its
    state streams as that release compacted them); the scope's name."""
    scope = record["scope"]
    old, new = record["base"].encode(), str(base).encode()
    assert not client.admin.scope_exists(scope), f"{scope} exists already: the replay needs a fresh scope"
    client.admin.create_scope(scope)
    segments = segments_of(client)
    states = {s["stream"]: s for s in record["compacted"]} if compacted else {}
    for stream in (states.get(s["stream"], s) for s in record["streams"]):
        if stream["stream"] == STREAM:  # a state's offsets are its own; the data's are in every cut
            assert set(stream["head"].values()) == {0}, "a truncated stream cannot be replayed at the same offsets"
        client.admin.create_stream(scope, stream["stream"], scaling=ScalingPolicy.fixed(stream["segments"]))
        for segment, events in stream["events"].items():
            if events:
                appender = _ConditionalAppender(segments, naming.qualified_segment_name(scope, stream["stream"],
                                                                                        int(segment)))
                payloads = [base64.b64decode(e).replace(old, new) for e in events]
                assert appender.append(0, payloads)
                appender.close()
    for table in record["tables"]:
        TableSegment(client, scope, table["table"]).put(
            [(base64.b64decode(k).replace(old, new), base64.b64decode(v), UNCONDITIONAL) for k, v in table["entries"]])
    return scope


def lay_out(record: dict, base: Path) -> None:
    """The release's source files (with the modification time it recorded) and export folders."""
    shutil.copytree(FIXTURES / "source", base / "source")
    for file in (base / "source").rglob("*.jsonl"):
        os.utime(file, ns=(record["source_mtime_ns"], record["source_mtime_ns"]))
    shutil.copytree(FIXTURES / "export", base / "export")


def ingest_spec(scope: str, base: Path, day: int) -> IngestSpec:
    """The example ingest DAG's run of ``day``."""
    return IngestSpec(scope=scope, stream=STREAM, source=str(base / "source" / f"2026-11-{day:02d}" / "*.jsonl"),
                      format="jsonl", routing_key_field="sensor_id", ingest_id=INGEST_ID, num_writers=2,
                      interval_key=day_key(day), on_empty="succeed")


def export_spec(scope: str, folder: Path, day: int) -> ExportSpec:
    """The example export DAG's run of ``day``."""
    return ExportSpec(scope=scope, stream=STREAM, output_path=str(folder), format="parquet", event_format="json",
                      export_id=EXPORT_ID, interval_key=day_key(day), from_ingest=INGEST_ID)


def rows(folder: Path) -> list[tuple]:
    return [tuple(row.get(c) for c in ("rec", "event"))
            for part in sorted(folder.glob("part-*")) if not part.name.endswith(".crc")
            for row in pq.read_table(part).to_pylist()]


def day_lines(source: Path, day: int) -> list[str]:
    return [line for f in sorted((source / f"2026-11-{day:02d}").glob("*.jsonl"))
            for line in f.read_text().splitlines()]


def test_a_rerun_and_a_backfill_after_the_upgrade_need_nobody(tmp_path, pravega_embedded, spark):
    record = json.loads((FIXTURES / "pravega.json").read_text())
    assert record["made_by"] == "6394bea"
    base = tmp_path / "data"
    lay_out(record, base)
    day3 = base / "source" / "2026-11-03"
    day3.mkdir()
    (day3 / "readings-0.jsonl").write_text("".join(
        json.dumps({"sensor_id": f"s{n % 3}", "day": 3, "rec": f"d3-f0-{n}"}) + "\n" for n in range(6)))
    lines = {day: day_lines(base / "source", day) for day in (1, 2, 3)}
    recs = {day: Counter(json.loads(line)["rec"] for line in lines[day]) for day in lines}
    readings = base / "export" / "readings"
    before = rows(readings / "2026-11-01")
    assert (readings / "2026-11-01" / "_PRAVEGA_EXPORT.json").exists() and Counter(r for r, _ in before) == recs[1]
    plain_before = rows(base / "export" / "plain" / "2026-11-01")
    # Where the session's files are not this machine's, the marker is read through Hadoop's filesystem.
    marker_file = readings / "2026-11-01" / "_PRAVEGA_EXPORT.json"
    assert export_output.hadoop_file_text(spark, marker_file.as_uri()) == marker_file.read_text()
    assert export_output.hadoop_file_text(spark, (readings / "nothing").as_uri()) is None
    foreign, other_day = base / "export" / "foreign", base / "export" / "readings-copy"
    shutil.copytree(readings / "2026-11-01", foreign)
    marker = json.loads((foreign / "_PRAVEGA_EXPORT.json").read_text())
    (foreign / "_PRAVEGA_EXPORT.json").write_text(json.dumps({**marker, "export_id": "someone-else"}))
    shutil.copytree(readings / "2026-11-01", other_day)

    with PravegaClient(pravega_embedded.controller_uri) as client:
        scope = replay(client, record, base)

        def ingest(day: int):
            return run_ingest(client, spark, ingest_spec(scope, base, day))

        def export(day: int, folder: Path | None = None):
            return run_export(client, spark, export_spec(scope, folder or readings / f"2026-11-{day:02d}", day))

        # The ingest: a backfill of days 1 and 2 ingests nothing twice; day 3 is new.
        for day in (1, 2):
            again = ingest(day)
            assert again.events == 0 and len(again.files_skipped) == 2, (day, again)
        assert ingest(3).events == 6

        # The export: day 1's rerun (a retry, then a backfill) replaces the release's folder with the
        # same rows; days 2 and 3 are exported for the first time.
        first = export(1)
        assert first.replaced_output and first.events == 12
        assert not (readings / "2026-11-01" / "_PRAVEGA_EXPORT.json").exists()
        assert (readings / "2026-11-01" / "_SUCCESS").exists()
        assert sorted(rows(readings / "2026-11-01")) == sorted(before)
        assert export(1).replaced_output and sorted(rows(readings / "2026-11-01")) == sorted(before)
        for day in (2, 3):
            assert not export(day).replaced_output
        exported = Counter(r for day in (1, 2, 3) for r, _ in rows(readings / f"2026-11-{day:02d}"))
        assert exported == recs[1] + recs[2] + recs[3]  # every record exactly once

        # A folder of that release that is not this export's is still refused: another export id, or
        # this export's folder of another interval.
        with pytest.raises(OutputPathError, match="holds export 'someone-else' .*written by an earlier release"):
            export(1, foreign)
        with pytest.raises(OutputPathError, match=r"of interval '2026-11-01T00:00:00\+00:00/2026-11-02"):
            export(2, other_day)
        assert rows(foreign) == before and rows(other_day) == before

        # An export with recorded cuts: the release's record of day 1 is reused, its folder replaced;
        # day 2 starts where that record ends.
        plain = base / "export" / "plain"
        again = run_export(client, spark, ExportSpec(
            scope=scope, stream=STREAM, output_path=str(plain / "2026-11-01"), export_id=PLAIN_EXPORT_ID,
            interval_key=day_key(1)))
        assert again.reused_record and again.replaced_output
        assert sorted(rows(plain / "2026-11-01")) == sorted(plain_before)
        run_export(client, spark, ExportSpec(scope=scope, stream=STREAM, output_path=str(plain / "2026-11-02"),
                                             export_id=PLAIN_EXPORT_ID, interval_key=day_key(2)))
        events = Counter(event for day in (1, 2) for _, event in rows(plain / f"2026-11-{day:02d}"))
        assert events == Counter(lines[1] + lines[2] + lines[3])


def test_the_markers_of_that_release_are_read_as_it_wrote_them(tmp_path):
    """Without Spark or Pravega: the marker of an object-store publish that release left half done
    is its claim too; a marker that does not parse, or names another export, stream or interval, is
    refused by name (the rows of docs/bad-input.md's section)."""
    folder = tmp_path / "2026-11-01"
    shutil.copytree(FIXTURES / "export" / "readings" / "2026-11-01", folder)
    marker = json.loads((folder / "_PRAVEGA_EXPORT.json").read_text())
    scope = marker["scope"]
    visible = [str(p) for p in sorted(folder.glob("part-*"))]

    def check(day: int = 1, **kw: str) -> bool:
        spec = ExportSpec(**{"scope": scope, "stream": STREAM, "output_path": str(folder), "export_id": EXPORT_ID,
                             "interval_key": day_key(day), "from_ingest": INGEST_ID, **kw})
        return export_claims.check_output(spec, ExportState(), visible, "", "",
                                       lambda: export_claims.earlier_release_claim(spec, None))

    assert export_claims.earlier_release_claim(ExportSpec(scope=scope, stream=STREAM, output_path=str(folder),
                                                       export_id=EXPORT_ID), None) == {
        "interval": day_key(1), "start": marker["start_cut"], "end": marker["end_cut"],
        "marker": "_PRAVEGA_EXPORT.json"}
    assert check() is True
    (folder / "_PRAVEGA_EXPORT.json").rename(folder / "_PRAVEGA_EXPORT.pending.json")
    assert check() is True
    (folder / "_PRAVEGA_EXPORT.pending.json").rename(folder / "_PRAVEGA_EXPORT.json")

    rows: list[tuple[str, str]] = []

    def refused(what: str, pattern: str, day: int = 1, **kw: str) -> None:
        with pytest.raises(OutputPathError, match=pattern) as info:
            check(day, **kw)
        rows.append((what, f"`OutputPathError`: {str(info.value).replace(str(tmp_path), '/data')}"))

    refused("an earlier release's export folder (`_PRAVEGA_EXPORT.json`) written by another export id",
            r"holds export 'pravega_stream_cut_export.export' of upgrade-from-6394bea/readings \(its "
            r"_PRAVEGA_EXPORT.json, written by an earlier release\), not 'someone-else'", export_id="someone-else")
    refused("an earlier release's export folder of another stream, same export id",
            r"of upgrade-from-6394bea/readings .* not .* of upgrade-from-6394bea/other", stream="other")
    refused("an earlier release's export folder of this export, another interval",
            r"holds export .* of interval '2026-11-01T00:00:00\+00:00/2026-11-02T00:00:00\+00:00', not of "
            r"'2026-11-02", day=2)
    (folder / "_PRAVEGA_EXPORT.json").write_text("{not json")
    refused("an earlier release's `_PRAVEGA_EXPORT.json` that does not parse",
            r"has an unreadable _PRAVEGA_EXPORT.json")
    (folder / "_PRAVEGA_EXPORT.json").unlink()
    refused("files with neither a claim nor an earlier release's marker", r"already holds files that no export wrote")
    check_section("upgrade-markers", "Export folders of earlier releases", "tests/upgrade/test_upgrade_from_6394bea.py",
                  rows, "A folder an export wrote before 2026-11-27 is marked with `_PRAVEGA_EXPORT.json` "
                  "(or `_PRAVEGA_EXPORT.pending.json`): it is that export's own when the marker names the same export "
                  "id, scope, stream, interval and (without `from_ingest`) cuts, and the rerun replaces it.")


def test_the_states_that_release_compacted_are_read(tmp_path, pravega_embedded_factory, spark):
    """The same states as one full record each (the release compacts an ingest's state every 16
    runs): the ingest skips what it committed, the interval index and the recorded cuts are read."""
    record = json.loads((FIXTURES / "pravega.json").read_text())
    base = tmp_path / "data"
    lay_out(record, base)
    raw = next(s for s in record["streams"] if s["stream"].startswith("export-state-"))
    recorded = json.loads(base64.b64decode(raw["events"]["0"][0]))["op"]
    with PravegaClient(pravega_embedded_factory().controller_uri) as client:
        scope = replay(client, record, base, compacted=True)
        again = run_ingest(client, spark, ingest_spec(scope, base, 2))
        assert again.events == 0 and len(again.files_skipped) == 2
        with open_export_state(client, ExportSpec(scope, STREAM, "/unused", export_id=PLAIN_EXPORT_ID)) as sync:
            assert sync.fetch().intervals == {day_key(1): {k: recorded[k] for k in ("start", "end", "at")}}
        folder = base / "export" / "readings" / "2026-11-01"
        before = sorted(rows(folder))
        assert run_export(client, spark, export_spec(scope, folder, 1)).replaced_output
        assert sorted(rows(folder)) == before
