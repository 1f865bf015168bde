"""Interval-true exports: five daily intervals ingested out of order (days 3, 1, 5, 2, 4, each its
own files), then each day's export with ``from_ingest`` holds exactly that day's records; a late
file of day 2 ingested later adds a second range to day 2 (a re-run of the export replaces its
directory); an interval the ingest never recorded
is a clear error naming it. Embedded server, the session's Spark."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.spark.export_job import ExportSpec, IntervalNotIngestedError, open_export_state, run_export
from airflow_provider_pravega.spark.ingest_job import run_ingest
from airflow_provider_pravega.spark.ingest_spec import IngestSpec


def day_key(day: int) -> str:
    return f"2026-11-{day:02d}T00:00:00+00:00/2026-11-{day + 1:02d}T00:00:00+00:00"


def write_day(root: Path, day: int, tag: str = "", files: int = 2, per_file: int = 20) -> list[str]:
    folder = root / f"day{day}"
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for f in range(files):
        rows = [json.dumps({"sensor_id": f"s{n % 3}", "day": day, "rec": f"d{day}{tag}-f{f}-{n}"})
                for n in range(per_file)]
        (folder / f"part{tag}-{f}.jsonl").write_text("\n".join(rows) + "\n")
        lines += rows
    return lines


def exported(path: Path) -> list[str]:
    return [row["event"] for part in sorted(path.glob("part-*")) if not part.name.endswith(".crc")
            for row in pq.read_table(part).to_pylist()]


def test_each_days_export_holds_exactly_that_days_records(tmp_path, pravega_embedded, spark, unique_name):
    scope = unique_name("interval")
    source = tmp_path / "in"
    lines = {day: write_day(source, day) for day in range(1, 6)}
    with PravegaClient(pravega_embedded.controller_uri) as client:

        def ingest(day: int) -> None:
            run_ingest(client, spark, IngestSpec(
                scope=scope, stream="readings", source=str(source / f"day{day}"), ingest_id="daily",
                create_stream=True, stream_segments=2, num_writers=2,
                interval_key=day_key(day)))

        def export(day: int) -> tuple[Path, dict]:
            out = tmp_path / "out" / f"day{day}"
            result = run_export(client, spark, ExportSpec(
                scope=scope, stream="readings", output_path=str(out), export_id="daily-export",
                interval_key=day_key(day), from_ingest="daily"))
            return out, result.to_dict()

        for day in (3, 1, 5, 2, 4):
            ingest(day)
        for day in (2, 5, 1, 4, 3):
            out, result = export(day)
            assert Counter(exported(out)) == Counter(lines[day]), day
            assert result["events"] == len(lines[day]) and len(result["ingest_runs"]) == 1
        with open_export_state(client, ExportSpec(scope, "readings", "/unused", export_id="daily-export")) as sync:
            recorded = sync.fetch().outputs[str(tmp_path / "out" / "day3")]  # the manifest, in Pravega
        assert recorded["from_ingest"] == "daily" and len(recorded["pieces"]) == 1 and recorded["interval"] == day_key(3)

        # A file of day 2 arrives late and day 2 is ingested again: its export gains that range.
        late = write_day(source, 2, tag="late", files=1)
        ingest(2)
        out, result = export(2)
        assert Counter(exported(out)) == Counter(lines[2] + late) and len(result["ingest_runs"]) == 2

        with pytest.raises(IntervalNotIngestedError, match=r"interval 2026-11-06T00:00:00\+00:00/.* was not ingested"):
            export(6)
        assert not (tmp_path / "out" / "day6").exists()
        with pytest.raises(IntervalNotIngestedError, match="has no state"):
            run_export(client, spark, ExportSpec(scope=scope, stream="readings", output_path=str(tmp_path / "x"),
                                                 interval_key=day_key(1), from_ingest="no-such-ingest"))


def test_from_ingest_needs_an_interval_and_no_explicit_cuts():
    with pytest.raises(ValueError, match="needs an interval_key"):
        ExportSpec(scope="a", stream="b", output_path="/tmp/x", from_ingest="daily")
    with pytest.raises(ValueError, match="leave start_cut and end_cut"):
        ExportSpec(scope="a", stream="b", output_path="/tmp/x", from_ingest="daily", interval_key=day_key(1),
                   start_cut="head")
