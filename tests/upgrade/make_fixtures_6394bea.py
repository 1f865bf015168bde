"""Make the upgrade test's fixtures with the release at commit 6394bea (2026-11-26).

Run from a checkout of that commit, with its code first on the path::

    git worktree add /tmp/old-6394bea 6394bea
    cd /tmp/old-6394bea && PYTHONPATH=/tmp/old-6394bea python <this repo>/tests/upgrade/make_fixtures_6394bea.py \\
        <this repo>/tests/upgrade/fixtures/6394bea
    git worktree remove /tmp/old-6394bea

It starts that release's embedded server, ingests two daily files of sensor readings as the example
ingest DAG does (ingest id ``pravega_exactly_once_ingest.ingest``, one interval per day), exports
day 1 as the example export DAG does (``from_ingest``, JSON events as Parquet columns, export id
``pravega_stream_cut_export.export``) and day 1 again with recorded cuts (export id
``plain-export``). It saves what that release left behind:

* ``pravega.json``: every event of every segment of every stream in the scope (the data stream
  and the ingest's and the exports' state streams), base64, in offset order per segment; the
  entries of the ingest's committed-file table; the ingest's and the exports' state streams again
  once that release compacted them (``compacted``: one full record each); the folder the run used (``base``: the state
  records name the source files under it) and the source files' modification time;
* ``source/``: the ingested files;
* ``export/``: the export folders as written, ``_PRAVEGA_EXPORT.json`` and part files included.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SCOPE = "upgrade-from-6394bea"
STREAM = "readings"
INGEST_ID = "pravega_exactly_once_ingest.ingest"
EXPORT_ID = "pravega_stream_cut_export.export"
PLAIN_EXPORT_ID = "plain-export"
#: The source files' modification time (the ingest records it with each file): 2026-11-01T12:00:00Z.
MTIME_NS = 1_793_534_400_000_000_000


def day_key(day: int) -> str:
    return f"2026-11-{day:02d}T00:00:00+00:00/2026-11-{day + 1:02d}T00:00:00+00:00"


def day_lines(day: int, files: int = 2, per_file: int = 6) -> dict[str, list[str]]:
    return {f"readings-{f}.jsonl": [json.dumps({"sensor_id": f"s{n % 3}", "day": day, "rec": f"d{day}-f{f}-{n}"})
                                    for n in range(per_file)] for f in range(files)}


def main(out: Path) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert commit == "6394bea", f"run from a checkout of 6394bea, not {commit}"
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.batch import SegmentRange, read_segment_range
    from airflow_provider_pravega.client.committed_files import CommittedFiles, files_table_name
    from airflow_provider_pravega.client.ingest import open_state_store
    from airflow_provider_pravega.client.synchronizer import StateSynchronizer
    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess
    from airflow_provider_pravega.spark.export_job import ExportSpec, ExportState, apply_update, run_export
    from airflow_provider_pravega.spark.ingest_job import IngestSpec, run_ingest
    from airflow_provider_pravega.spark.session import get_spark_session

    base = Path(tempfile.mkdtemp(prefix="pravega-upgrade-6394bea-"))
    server = EmbeddedPravegaProcess(base / "server")
    server.start()
    spark = get_spark_session(None, "pravega-upgrade-fixtures", **{"spark.sql.shuffle.partitions": "2"})
    try:
        with PravegaClient(server.controller_uri) as client:
            client.admin.create_scope(SCOPE)
            for day in (1, 2):
                folder = base / "source" / f"2026-11-{day:02d}"
                folder.mkdir(parents=True)
                for name, lines in day_lines(day).items():
                    (folder / name).write_text("\n".join(lines) + "\n")
                    os.utime(folder / name, ns=(MTIME_NS, MTIME_NS))
                run_ingest(client, spark, IngestSpec(
                    scope=SCOPE, stream=STREAM, source=str(folder / "*.jsonl"), format="jsonl",
                    routing_key_field="sensor_id", ingest_id=INGEST_ID, create_stream=True, stream_segments=4,
                    num_writers=2, interval_key=day_key(day)))
            run_export(client, spark, ExportSpec(
                scope=SCOPE, stream=STREAM, output_path=str(base / "export" / "readings" / "2026-11-01"),
                format="parquet", event_format="json", export_id=EXPORT_ID, interval_key=day_key(1),
                from_ingest=INGEST_ID))
            run_export(client, spark, ExportSpec(
                scope=SCOPE, stream=STREAM, output_path=str(base / "export" / "plain" / "2026-11-01"),
                format="parquet", event_format="text", export_id=PLAIN_EXPORT_ID, interval_key=day_key(1)))

            def dump(stream: str) -> dict:
                head, tail = client.admin.head(SCOPE, stream), client.admin.tail(SCOPE, stream)
                assert set(head) == set(range(len(head))), f"{stream} was scaled: {sorted(head)}"
                events = {}
                for segment in sorted(head):
                    rng = SegmentRange(SCOPE, stream, segment, head[segment], tail[segment])
                    events[str(segment)] = [base64.b64encode(e.payload).decode()
                                            for e in read_segment_range(client, rng)]
                return {"stream": stream, "segments": len(head), "head": {str(k): v for k, v in head.items()},
                        "events": events}

            streams, tables, compacted = [], [], []
            for stream in sorted(client.admin.list_streams(SCOPE)):
                streams.append(dump(stream))
                if stream.startswith("ingest-state-"):  # its committed-file table (client/committed_files.py)
                    table = CommittedFiles(client, SCOPE, stream).table
                    entries = sorted([base64.b64encode(k).decode(), base64.b64encode(v).decode()]
                                     for k, _ver, v in table.entries())
                    tables.append({"table": files_table_name(stream), "entries": entries})
            # The same states as that release compacts them (the ingest's every 16 runs, an export's
            # past 1 MiB): one full record at the stream's new head.
            for stream in sorted(client.admin.list_streams(SCOPE)):
                if stream.startswith("ingest-state-"):
                    store = open_state_store(client, SCOPE, stream, create=False)
                elif stream.startswith("export-state-"):
                    store = StateSynchronizer(client, SCOPE, stream, ExportState(), apply_update)
                else:
                    continue
                with store:
                    store.fetch_updates()
                    store.compact()
                compacted.append(dump(stream))
    finally:
        spark.stop()
        server.stop()

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copytree(base / "source", out / "source")
    shutil.copytree(base / "export", out / "export")
    record = {"made_by": commit, "base": str(base), "scope": SCOPE, "source_mtime_ns": MTIME_NS,
              "streams": streams, "tables": tables,
              "compacted": compacted}
    (out / "pravega.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(base)
    print(f"fixtures of {commit} in {out}: {len(streams)} stream(s)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
