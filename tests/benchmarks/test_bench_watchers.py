"""benchmarks/bench_watchers.py on tiny sizes, so the script `make bench` runs cannot rot: one and
three watchers on the shared poll, three on their own polls, both figures with their baseline. No
timed assertions (figures on a shared machine vary)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_watchers_benchmark_runs_on_tiny_sizes(tmp_path: Path) -> None:
    pytest.importorskip("airflow.triggers.shared_stream", reason="shared streams need Airflow 3.3")
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_watchers.py"), "--watchers", "3", "--seconds", "2",
         "--repeat", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 shared" in proc.stdout and "3 own polls" in proc.stdout, proc.stdout
    figures = json.loads(out.read_text())["figures"]
    assert [f["target_ratio"] for f in figures] == [1.5, None]
    assert all(len(f["samples"]) == 1 and len(f["baseline"]["samples"]) == 1 for f in figures)
