"""benchmarks/bench_ingest_state.py on tiny sizes, so the script `make bench` runs cannot rot: it
fills two committed-file tables, starts runs in spawned processes and writes both figures with
their baselines. No timed assertions (figures on a shared machine vary)."""

from __future__ import annotations

from tiny_bench import run_benchmark


def test_ingest_state_benchmark_runs_on_tiny_sizes(tmp_path):
    stdout, figures = run_benchmark(tmp_path, "bench_ingest_state.py", "--files", "300", "--small", "100",
                                    "--repeat", "1")
    assert "ratio 300 vs 100 files: start_run latency" in stdout
    assert [f["target_ratio"] for f in figures] == [1.5, 1.5]
    assert all(len(f["samples"]) == 1 and len(f["baseline"]["samples"]) == 1 for f in figures)
