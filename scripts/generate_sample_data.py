#!/usr/bin/env python3
"""Generate sample input for the example DAGs: sensor readings as JSON lines, one folder per day.

    python scripts/generate_sample_data.py --out data/incoming --start 2026-11-01 --days 3

writes ``data/incoming/2026-11-01/readings-00.jsonl`` … with ``--files-per-day`` files of
``--events-per-file`` readings each. Every reading has a ``sensor_id`` (the routing key), a
timestamp inside its day, a value, and a unique ``reading_id`` so duplicates are easy to spot.
The output is deterministic for given arguments (seeded), so reruns produce the same files.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from datetime import date, datetime, timedelta, timezone
from pathlib import Path


def generate(out: Path, start: date, days: int, files_per_day: int, events_per_file: int, sensors: int) -> int:
    total = 0
    for d in range(days):
        day = start + timedelta(days=d)
        folder = out / day.isoformat()
        folder.mkdir(parents=True, exist_ok=True)
        rnd = random.Random(day.toordinal())
        base = datetime(day.year, day.month, day.day, tzinfo=timezone.utc)
        for f in range(files_per_day):
            with open(folder / f"readings-{f:02d}.jsonl", "w", encoding="utf-8") as fh:
                for n in range(events_per_file):
                    sensor = rnd.randrange(sensors)
                    seconds = (f * events_per_file + n) * 86400 // (files_per_day * events_per_file)
                    fh.write(json.dumps({
                        "reading_id": f"{day.isoformat()}-{f:02d}-{n:06d}",
                        "sensor_id": f"sensor-{sensor:03d}",
                        "ts": (base + timedelta(seconds=seconds)).isoformat(),
                        "temperature_c": round(15 + 10 * rnd.random(), 2),
                        "humidity_pct": round(30 + 50 * rnd.random(), 1),
                    }) + "\n")
                    total += 1
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--start", type=date.fromisoformat, default=date(2026, 11, 1))
    ap.add_argument("--days", type=int, default=3)
    ap.add_argument("--files-per-day", type=int, default=4)
    ap.add_argument("--events-per-file", type=int, default=2500)
    ap.add_argument("--sensors", type=int, default=50)
    args = ap.parse_args(argv)
    if min(args.days, args.files_per_day, args.events_per_file, args.sensors) < 1:
        ap.error("--days, --files-per-day, --events-per-file and --sensors must be at least 1")
    total = generate(args.out, args.start, args.days, args.files_per_day, args.events_per_file, args.sensors)
    print(f"wrote {total} readings for {args.days} day(s) under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
