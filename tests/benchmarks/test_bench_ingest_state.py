"""benchmarks/bench_ingest_state.py on tiny sizes, so the script `make bench` runs cannot rot: it
fills two committed-file tables, starts runs in spawned processes and writes both figures with
their baselines. No timed assertions (figures on a shared machine vary)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ingest_state_benchmark_runs_on_tiny_sizes(tmp_path):
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_ingest_state.py"), "--files", "300", "--small", "100",
         "--repeat", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ratio 300 vs 100 files: start_run latency" in proc.stdout
    figures = json.loads(out.read_text())["figures"]
    assert [f["target_ratio"] for f in figures] == [1.5, 1.5]
    assert all(len(f["samples"]) == 1 and len(f["baseline"]["samples"]) == 1 for f in figures)
