"""A stock Spark Connect server restarted between two daily ingest tasks: the second task's
process joins the shared session the first one opened (its id is the same for the whole window),
which the new server does not know, and its day still lands once. Each task is the ingest job's
own process, as an Airflow task runs it, written through Spark whatever its size."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from pravega_testing import spark_connect


def _ingest(controller_uri: str, scope: str, source: Path, remote: str, day: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "airflow_provider_pravega.spark.ingest_job", "--controller-uri", controller_uri,
         "--scope", scope, "--stream", "readings", "--source", str(source / day / "*.jsonl"), "--routing-key-field",
         "sensor_id", "--create-stream", "--segments", "2", "--ingest-id", "daily", "--in-process-max-bytes", "0",
         "--interval", f"{day}T00:00:00+00:00/{day}T23:59:59+00:00", "--conf", f"spark.remote={remote}"],
        capture_output=True, text=True, timeout=600)


def test_a_connect_server_restarted_between_two_tasks_serves_the_next_day(
        tmp_path: Path, pravega_embedded: Any, unique_name: Any, read_stream: Any) -> None:
    scope = unique_name("restarted")
    lines = {}
    for day in ("2026-11-01", "2026-11-02"):
        (tmp_path / day).mkdir()
        lines[day] = [json.dumps({"sensor_id": f"s{n % 3}", "day": day, "n": n}) for n in range(200)]
        (tmp_path / day / "part-0.jsonl").write_text("\n".join(lines[day]) + "\n")
    uri = pravega_embedded.controller_uri
    with spark_connect.running_server(tmp_path / "first.log") as first:
        port = first.port
        done = _ingest(uri, scope, tmp_path, first.url, "2026-11-01")
        assert done.returncode == 0, done.stderr[-3000:]
    with spark_connect.running_server(tmp_path / "second.log", port=port) as second:  # the same address
        done = _ingest(uri, scope, tmp_path, second.url, "2026-11-02")
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"connecting to Spark Connect server {second.url}" in done.stderr, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["events"] == 200
    got = Counter(e.decode() for e in read_stream(uri, scope, "readings", expected=400))
    assert got == Counter(lines["2026-11-01"] + lines["2026-11-02"])
