"""The benchmark harness (benchmarks/run.py): ratios and verdicts from canned result files, the
table/JSON/Markdown/PNG it writes after a real tiny benchmark run, and a crash turning into a
non-zero exit. No timed assertions: figures on a shared machine vary."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import result_file as rf  # noqa: E402
import run  # noqa: E402


def canned() -> list[dict]:
    return [
        rf.result("server", {"events": 10}, [
            rf.figure("1 writer, 100 B events", "events/s", [120_000, 90_000, 150_000], target=100_000.0),
            rf.figure("1 writer, 10 KiB events", "MB/s", [300, 280, 320],
                      baseline=("raw disk", [700, 600, 650]), target_ratio=0.5),
            rf.figure("server RSS", "MB", [310, 290, 305], higher_is_better=False, target=300.0),
        ], {"server": 120.0}),
        rf.result("ingest", {"events": 10}, [
            rf.figure("exactly-once", "events/s", [50, 40, 60], baseline=("official", [100, 90, 110]), target_ratio=0.6),
            rf.figure("driver RSS", "MB", [150, 151], higher_is_better=False, baseline=("quarter", [140]), target_ratio=1.2),
            rf.figure("no target", "s", [1, 2, 3], baseline=("other", [2, 2, 2])),
        ], {"driver": 152.0}, ["a note"]),
    ]


def test_ratios_and_verdicts_come_from_the_medians():
    summaries = [rf.summarize(f) for res in canned() for f in res["figures"]]
    by_name = {s["name"]: s for s in summaries}
    assert by_name["1 writer, 100 B events"]["median"] == 120_000
    assert by_name["1 writer, 100 B events"]["verdict"] == "PASS"  # absolute target, higher is better
    s = by_name["1 writer, 10 KiB events"]
    assert (s["median"], s["min"], s["max"], s["baseline_median"]) == (300, 280, 320, 650)
    assert s["ratio"] == pytest.approx(300 / 650)
    assert s["verdict"] == "FAIL"  # 0.46 < 0.5
    assert by_name["server RSS"]["verdict"] == "FAIL"  # median 305 MB > 300 MB, lower is better
    assert by_name["exactly-once"]["ratio"] == pytest.approx(0.5) and by_name["exactly-once"]["verdict"] == "FAIL"
    assert by_name["driver RSS"]["ratio"] == pytest.approx(150.5 / 140)
    assert by_name["driver RSS"]["verdict"] == "PASS"  # 1.075 <= 1.2, lower is better
    assert by_name["no target"]["verdict"] == "-" and by_name["no target"]["ratio"] == pytest.approx(1.0)


def test_table_and_chart_from_canned_results(tmp_path):
    results = canned()
    table = rf.format_table(results)
    lines = table.splitlines()
    assert len(lines) == 2 + 6  # header, rule, one row per figure
    row = next(line for line in lines if "10 KiB" in line)
    assert "300 MB/s" in row and "280-320" in row and "650 MB/s" in row and "0.46" in row and "FAIL" in row
    assert "ratio >= 0.5" in row
    assert "<= 300 MB" in next(line for line in lines if "server RSS" in line)
    md = rf.format_table(results, markdown=True)
    assert md.splitlines()[1].startswith("|---|") and md.count("\n") == 7
    assert "server: server 120 MB" in rf.format_peaks(results)
    png = tmp_path / "chart.png"
    run.write_chart(results, png, "canned")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    with pytest.raises(ValueError, match="no samples"):
        rf.summarize(rf.figure("empty", "s", []))


@pytest.mark.official_client  # bench_txn_writer's baseline is the official client
def test_harness_runs_a_real_benchmark_and_writes_json_table_and_png(tmp_path, capsys):
    """bench_txn_writer.py on tiny sizes: embedded server and client processes, a few seconds."""
    code = run.main(["quick", "--only", "txn_writer", "--events", "2000", "--repeat", "2", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "[txn_writer] " in out  # the benchmark's own output is streamed, prefixed
    data = json.loads((tmp_path / "quick.json").read_text())
    assert data["profile"] == "quick" and "--only txn_writer" in data["command"]
    m = data["machine"]
    assert m["cores"] >= 1 and m["memory_gb"] > 0 and m["disk"]["free_gb"] > 0 and m["python"]
    assert m["packages"]["pravega"] and m["git_commit"]
    assert data["benchmarks"]["txn_writer"]["exit_code"] == 0
    (res,) = data["results"]
    fig = res["figures"][0]
    assert len(fig["samples"]) == 2 and len(fig["baseline"]["samples"]) == 2 and fig["target_ratio"] == 0.7
    (summary,) = data["summary"]
    assert summary["ratio"] == pytest.approx(rf.summarize(fig)["median"] / rf.summarize(fig)["baseline_median"])
    assert summary["verdict"] in ("PASS", "FAIL")
    assert "our transactional writer" in out.split("=" * 100)[-1]  # the final table
    assert "| txn_writer |" in (tmp_path / "quick.md").read_text()
    assert (tmp_path / "quick.png").read_bytes()[:4] == b"\x89PNG"


def test_a_crashing_benchmark_makes_the_harness_fail_but_the_others_are_reported(tmp_path, capsys):
    crash = tmp_path / "bench_crash.py"
    crash.write_text("import sys\nprint('about to fail')\nsys.exit(3)\n")
    canned_bench = tmp_path / "bench_canned.py"
    canned_bench.write_text(
        "import json, sys\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        "import result_file as rf\n"
        "path = sys.argv[sys.argv.index('--json') + 1]\n"
        "rf.write(path, rf.result('canned', {}, [rf.figure('f', 'events/s', [1, 2, 3], baseline=('b', [2, 2, 2]), target_ratio=0.4)]))\n"
    )
    registry = {
        "crash": {"script": crash, "events": "--events", "repeat": "--repeat"},
        "canned": {"script": canned_bench, "events": "--events", "repeat": "--repeat"},
    }
    code = run.main(["quick", "--out-dir", str(tmp_path / "out")], registry=registry)
    out = capsys.readouterr().out
    assert code == 1
    assert "CRASHED: crash: exit code 3" in out and "about to fail" in out
    data = json.loads((tmp_path / "out" / "quick.json").read_text())
    assert data["benchmarks"]["crash"]["error"] == "exit code 3"
    assert [s["verdict"] for s in data["summary"]] == ["PASS"] and data["summary"][0]["ratio"] == 1.0


def test_memory_of_an_exited_unreaped_process_is_zero_and_its_cpu_time_is_kept():
    """The lake benchmark reads the ingest driver's CPU time after it exits, before it is reaped
    (/proc keeps the times of a zombie but no memory fields)."""
    import os
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "sum(range(3_000_000))"])
    try:
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        assert rf.rss_mb(proc.pid) == (0.0, 0.0)
        assert rf.proc_cpu_seconds(proc.pid) > 0
    finally:
        proc.wait()
    assert rf.rss_mb(proc.pid) == (0.0, 0.0)  # reaped: gone


def test_the_export_bench_prints_parquet_and_delta_cpu_side_by_side_with_the_breakdown():
    """bench_export.py's table of CPU-s per export: the JVM split by its threads (the rest of the
    JVM's CPU is "Other JVM"), the other processes by kind, medians over the rounds, one column per
    format."""
    import bench_export

    def meters(runs, threads):
        cpu, jvm = bench_export.CpuMeter(), bench_export.JvmThreads(0)
        cpu.runs, jvm.runs = runs, threads
        return cpu, jvm

    parquet = bench_export.breakdown(*meters(
        [{"spark jvm": 1.0, "spark python workers": 0.3, "pravega server": 0.05, "driver": 0.05}] * 3,
        [{"task threads": 0.4, "JIT compiler": 0.3, "GC": 0.1, "other": 0.2}] * 3))
    assert parquet == pytest.approx({"JVM task threads": 0.4, "JIT": 0.3, "GC": 0.1, "Other JVM": 0.2,
                                     "Python workers": 0.3, "Server": 0.05, "Driver": 0.05, "Total": 1.4})
    delta = bench_export.breakdown(*meters(
        [{"spark jvm": 2.0, "spark python workers": 0.3}, {"spark jvm": 2.4, "spark python workers": 0.3},
         {"spark jvm": 2.2, "spark python workers": 0.4}],
        [{"task threads": 0.8, "JIT compiler": 1.0}] * 3))
    assert delta["Other JVM"] == pytest.approx(0.4) and delta["Total"] == pytest.approx(2.6)  # median of totals
    lines = bench_export.breakdown_table({"parquet": parquet, "delta": delta})
    assert lines[0] == "CPU-s per export (median): part | parquet | delta"
    assert "  JIT: 0.30 | 1.00" in lines and lines[-1] == "  Total: 1.40 | 2.60"


def test_the_export_bench_refuses_a_setting_that_is_not_key_equals_value() -> None:
    """``--conf`` (A/B runs of a Spark setting) is checked before any server or JVM starts."""
    import subprocess

    done = subprocess.run([sys.executable, str(BENCH / "bench_export.py"), "--conf", "spark.buffer.size"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--conf takes KEY=VALUE, not 'spark.buffer.size'" in done.stderr


def test_the_process_tree_cpu_keeps_a_child_that_ended_and_was_reaped():
    """The ingest bench's CPU figures sum a process tree whose Python workers and spawned writers
    end during a run: a reaped child's CPU stays in the tree, through its parent's waited-for time."""
    import os
    import subprocess

    def tree() -> float:
        return sum(rf.tree_cpu_seconds(os.getpid(), lambda _pid: "all").values())

    before = tree()
    proc = subprocess.Popen([sys.executable, "-c", "sum(range(30_000_000))"])
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped above
    child = usage.ru_utime + usage.ru_stime
    assert child > 0.1
    assert tree() - before >= child - 0.05  # clock ticks vs microseconds


def test_the_ingest_bench_judges_each_shape_by_either_exactly_once_ratio():
    """Issue 49: on each shape exactly-once >= 2.0 x the official client or >= 0.8 x the server's
    single-writer append; at-least-once >= exactly-once on every shape."""
    import bench_ingest

    def s(figure: float, baseline: float) -> dict:
        return rf.summarize(rf.figure("f", "events/s", [figure], baseline=("b", [baseline])))

    shapes = ["2 big files", "400 small files"]
    lines = bench_ingest.target_lines(shapes, [s(210, 100), s(150, 100)], [s(210, 1000), s(150, 180)],
                                      [s(100, 100), s(99, 100)])
    assert lines[0].startswith("target exactly-once >= 2 x the official client alone (2 big files 2.10, "
                               "400 small files 1.50) or >= 0.8 x the server's single-writer append")
    assert lines[0].endswith("on each shape: met")  # big files by the client, small files by the server
    assert lines[1] == "target at-least-once >= 1 x exactly-once (2 big files 1.00, 400 small files 0.99): missed"
    lines = bench_ingest.target_lines(shapes, [s(210, 100), s(150, 100)], [s(210, 1000), s(150, 1000)],
                                      [s(100, 100), s(100, 100)])
    assert lines[0].endswith("missed") and lines[1].endswith("met")
