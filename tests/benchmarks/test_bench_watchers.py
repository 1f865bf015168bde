"""benchmarks/bench_watchers.py on tiny sizes, so the script `make bench` runs cannot rot: one and
three watchers on the shared poll, three on their own polls, both figures with their baseline. No
timed assertions (figures on a shared machine vary)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_bench import run_benchmark


def test_watchers_benchmark_runs_on_tiny_sizes(tmp_path: Path) -> None:
    pytest.importorskip("airflow.triggers.shared_stream", reason="shared streams need Airflow 3.3")
    stdout, figures = run_benchmark(tmp_path, "bench_watchers.py", "--watchers", "3", "--seconds", "2",
                                    "--repeat", "1")
    assert "3 shared" in stdout and "3 own polls" in stdout, stdout
    assert [f["target_ratio"] for f in figures] == [1.5, None]
    assert all(len(f["samples"]) == 1 and len(f["baseline"]["samples"]) == 1 for f in figures)
