"""Run every benchmark one after another, then print one table of figures, baselines and targets.

Run: ``make bench`` (full) or ``make bench-quick``, i.e.
``.venv/bin/python benchmarks/run.py [quick|full] [--only server,ingest] [--repeat N] [--events N]``
(default: server, ingest, export, txn_writer, event_writer, ingest_state, lake, per_run, watchers; ``--only batch_read`` adds the batch readers).

Each benchmark (``benchmarks/bench_<name>.py``) runs as its own subprocess with sizes from the
profile and ``--json``; its output is streamed, prefixed with its name. Then one table: figure,
median, spread (min-max), baseline median, ratio (of the medians), target and PASS/FAIL, plus the
peak memory of each process kind. Everything - every sample, the machine (CPU, cores, memory, disk,
OS, Python, Java, package versions), the git commit, the date and the command - goes to
``docs/benchmarks/<profile>.json``, the table to ``<profile>.md`` and a chart to ``<profile>.png``.

Exits non-zero only when a benchmark crashed (or wrote no result); a missed target is reported,
not an error.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import result_file as rf  # noqa: E402

# How each benchmark is asked for its sizes: (events option, repetitions option).
BENCHMARKS: dict[str, dict[str, Any]] = {
    "server": {"script": HERE / "bench_server.py", "events": "--events", "repeat": "--repeat"},
    "ingest": {"script": HERE / "bench_ingest.py", "events": "--events", "repeat": "--repeat"},
    "export": {"script": HERE / "bench_export.py", "events": "--events", "repeat": "--rounds"},
    "txn_writer": {"script": HERE / "bench_txn_writer.py", "events": "--events", "repeat": "--rounds"},
    # at_least_once's writer (ours) vs the official client's create_writer(..., 1000).
    "event_writer": {"script": HERE / "bench_event_writer.py", "events": "--events", "repeat": "--rounds"},
    # Start of an ingest run vs remembered files ("events" is the large state's file count).
    "ingest_state": {"script": HERE / "bench_ingest_state.py", "events": "--files", "repeat": "--repeat"},
    # Driver cost vs input bytes, and s3a vs local disk ("events" is the s3a/local comparison's size).
    "lake": {"script": HERE / "bench_lake.py", "events": "--events", "repeat": "--repeat"},
    # One daily ingest task as a fresh process: a day with new files in a classic local session and
    # through a warm local stock Spark Connect server (started once by the benchmark), and nothing new
    # without a JVM against the same run listed by Spark ("events" is the day's readings).
    "per_run": {"script": HERE / "bench_per_run.py", "events": "--events", "repeat": "--repeat"},
    # Controller calls per minute of 1 vs 10 AssetWatchers of one stream ("events" is the watcher count).
    "watchers": {"script": HERE / "bench_watchers.py", "events": "--watchers", "repeat": "--repeat",
                 "own_size": True},  # --events (a data size) does not set the watcher count
    # Not one of the figures (our batch readers vs the official reader): only with --only.
    "batch_read": {"script": HERE / "bench_batch_read.py", "events": "--events", "repeat": "--rounds", "default": False},
}

# Sizes per profile. quick: a few minutes on a 2-core machine; full: the issues' sizes (< 30 min).
PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "quick": {
        "server": {"events": 100_000, "repeat": 3, "extra": ["--hold-gb", "0.5"]},
        # An operator run has a fixed cost (Spark jobs, transactions, commit) that decides the ratio at
        # small sizes, so the quick ingest stays closer to the full size, with fewer repetitions: each
        # runs both input shapes.
        "ingest": {"events": 300_000, "repeat": 2, "extra": []},
        "export": {"events": 100_000, "repeat": 3, "extra": []},
        "txn_writer": {"events": 100_000, "repeat": 3, "extra": []},
        "event_writer": {"events": 100_000, "repeat": 3, "extra": []},
        "ingest_state": {"events": 100_000, "repeat": 5, "extra": []},  # samples are cheap, load is not
        "lake": {"events": 100_000, "repeat": 1, "extra": ["--small-mb", "20", "--large-mb", "200"]},
        "per_run": {"events": 10_000, "repeat": 2, "extra": ["--backfill-days", "5", "--busy", "1"]},
        "watchers": {"events": 10, "repeat": 1, "extra": ["--seconds", "15"]},
    },
    "full": {
        "server": {"events": 1_000_000, "repeat": 3, "extra": ["--hold-gb", "5"]},
        "ingest": {"events": 600_000, "repeat": 3, "extra": []},  # the size, in each input shape
        "export": {"events": 1_000_000, "repeat": 3, "extra": []},
        "txn_writer": {"events": 500_000, "repeat": 3, "extra": []},
        "event_writer": {"events": 500_000, "repeat": 3, "extra": []},
        "ingest_state": {"events": 1_000_000, "repeat": 7, "extra": []},  # ~2 s per sample; filling dominates
        "lake": {"events": 300_000, "repeat": 2, "extra": ["--small-mb", "100", "--large-mb", "2000"]},
        # the day: 10,000 readings; its backfill: 30 days
        "per_run": {"events": 10_000, "repeat": 3, "extra": ["--backfill-days", "30", "--busy", "1"]},
        "watchers": {"events": 10, "repeat": 2, "extra": ["--seconds", "30"]},
    },
}


# ------------------------------------------------------------------ the machine


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _run(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (out.stdout or out.stderr).strip()


def disk_of(path: Path) -> dict[str, Any]:
    """Device, filesystem, mount point and free space of the disk holding ``path``."""
    path = path.resolve()
    best: tuple[str, str, str] | None = None
    for line in _read("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        mount = left.split()[4]
        fstype, device = right.split()[:2]
        if (path == Path(mount) or Path(mount) in path.parents) and (best is None or len(mount) > len(best[0])):
            best = (mount, fstype, device)
    usage = shutil.disk_usage(path)
    info: dict[str, Any] = {"path": str(path), "free_gb": round(usage.free / 1e9, 1), "size_gb": round(usage.total / 1e9, 1)}
    if best:
        mount, fstype, device = best
        info.update(mount=mount, filesystem=fstype, device=device)
        name = Path(device).name.rstrip("0123456789") if device.startswith("/dev/") else ""
        rotational = _read(f"/sys/block/{name}/queue/rotational").strip() if name else ""
        if rotational:
            info["rotational"] = rotational == "1"
    return info


def machine(data_dir: Path) -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    mem_kb = next((int(line.split()[1]) for line in _read("/proc/meminfo").splitlines() if line.startswith("MemTotal")), 0)
    os_name = next((line.split("=", 1)[1].strip('"') for line in _read("/etc/os-release").splitlines()
                    if line.startswith("PRETTY_NAME=")), platform.system())
    java = _run(["java", "-version"]).splitlines()
    packages = {}
    for dist in ("pravega", "apache-airflow", "pyspark", "pyarrow", "grpcio", "matplotlib"):
        try:
            packages[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            packages[dist] = None
    return {
        "cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "disk": disk_of(data_dir), "os": f"{os_name}, kernel {platform.release()}",
        "python": sys.version.split()[0], "java": java[0] if java else None, "packages": packages,
        "git_commit": _run(["git", "rev-parse", "HEAD"]) or None,
        "git_describe": _run(["git", "describe", "--always", "--dirty"]) or None,
    }


# ------------------------------------------------------------------ running the benchmarks


def command_for(name: str, spec: dict[str, Any], sizes: dict[str, Any], json_path: Path) -> list[str]:
    return [sys.executable, str(spec["script"]), spec["events"], str(sizes["events"]), spec["repeat"],
            str(sizes["repeat"]), *sizes.get("extra", []), "--json", str(json_path)]


def run_one(name: str, cmd: list[str], json_path: Path) -> dict[str, Any]:
    """Run one benchmark, streaming its output; returns its exit code, time and result file."""
    print(f"\n=== {name}: {shlex.join(cmd)}", flush=True)
    started = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    tail: list[str] = []
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace")
    assert proc.stdout is not None
    for line in proc.stdout:
        print(f"[{name}] {line.rstrip()}", flush=True)
        tail = (tail + [line.rstrip()])[-40:]
    code = proc.wait()
    seconds = time.monotonic() - started
    result = None
    error = None
    if code == 0:
        try:
            result = json.loads(json_path.read_text())
            for fig in result["figures"]:
                rf.summarize(fig)  # a result without samples is as broken as a crash
        except (OSError, ValueError, KeyError, TypeError) as exc:
            error = f"no usable result file {json_path}: {exc}"
            result = None
    else:
        error = f"exit code {code}"
    print(f"=== {name}: {'done' if error is None else 'FAILED (' + error + ')'} in {seconds:.0f} s", flush=True)
    return {"command": shlex.join(cmd), "exit_code": code, "seconds": round(seconds, 1), "error": error,
            "output_tail": tail if error else [], "result": result}


# ------------------------------------------------------------------ the chart


def compact(value: float) -> str:
    """Axis numbers: 1.5M, 200k, 50, 0.5."""
    a = abs(value)
    if a >= 1e6:
        return f"{value / 1e6:g}M"
    if a >= 1e3:
        return f"{value / 1e3:g}k"
    return f"{value:g}"


def write_chart(results: list[dict[str, Any]], path: Path, title: str) -> None:
    """One panel per figure: the figure's median next to its baseline's, min-max error bars, the
    target as a dashed line; the ratio, target and verdict in the panel title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    panels = [(res["benchmark"], fig) for res in results for fig in res["figures"]]
    if not panels:
        raise ValueError("no figures to chart")
    cols = 3 if len(panels) > 4 else max(1, len(panels))
    rows = (len(panels) + cols - 1) // cols
    figure, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.9 * rows + 1.0), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    blue, grey, red = "#3b7dd8", "#a0a0a0", "#cf222e"
    verdict_color = {"PASS": "#1a7f37", "FAIL": red, "-": "#444444"}
    for ax, (bench, fig) in zip(axes.flat, panels):
        s = rf.summarize(fig)
        labels = [textwrap.fill(s["name"], 20)]
        meds, lows, highs, colors = [s["median"]], [s["median"] - s["min"]], [s["max"] - s["median"]], [blue]
        if fig.get("baseline"):
            b = fig["baseline"]["samples"]
            labels.append(textwrap.fill(fig["baseline"]["name"], 20))
            meds.append(s["baseline_median"])
            lows.append(s["baseline_median"] - min(b))
            highs.append(max(b) - s["baseline_median"])
            colors.append(grey)
        x = list(range(len(meds)))
        ax.bar(x, meds, color=colors, width=0.6, yerr=[lows, highs], capsize=6, ecolor="#222222")
        for xi, m, h in zip(x, meds, highs):
            ax.annotate(rf.fmt(m), (xi, m + h), textcoords="offset points", xytext=(0, 3), ha="center",
                        va="bottom", fontsize=10, fontweight="bold")
        target_value = None
        if s["target_ratio"] is not None and s["baseline_median"]:
            target_value = s["target_ratio"] * s["baseline_median"]
        elif s["target"] is not None:
            target_value = s["target"]
        top = max(m + h for m, h in zip(meds, highs))
        if target_value is not None:
            ax.axhline(target_value, color=red, linestyle="--", linewidth=1.6)
            top = max(top, target_value)
        ax.set_ylim(0, top * 1.22 or 1)
        ax.set_xticks(x, labels, fontsize=9.5)
        ax.set_xlim(-0.6, max(0.6, len(meds) - 0.4))
        ax.set_ylabel(s["unit"], fontsize=10)
        ax.tick_params(axis="y", labelsize=9.5)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: compact(v)))
        judged = (f"ratio {s['ratio']:.2f}, " if s["ratio"] is not None else "") + f"target {rf.target_text(s)}"
        if s["verdict"] == "-":
            judged = f"ratio {s['ratio']:.2f}" if s["ratio"] is not None else "no target"
        ax.set_title(f"{bench}: {textwrap.shorten(s['name'], 40, placeholder='...')}\n{judged}: {s['verdict']}",
                     fontsize=10.5, color=verdict_color[s["verdict"]])
        ax.spines[["top", "right"]].set_visible(False)
    handles = [Patch(color=blue, label="figure (median, min-max bar)"), Patch(color=grey, label="baseline, same run"),
               Line2D([], [], color=red, linestyle="--", label="target")]
    figure.legend(handles=handles, loc="upper center", ncol=3, fontsize=10, frameon=False, bbox_to_anchor=(0.5, 0.975))
    figure.suptitle(title, fontsize=12, y=0.995)
    figure.tight_layout(rect=(0, 0, 1, 0.955))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


# ------------------------------------------------------------------ main


def report(results: list[dict[str, Any]]) -> str:
    return rf.format_table(results) + "\n" + rf.format_peaks(results)


def main(argv: list[str] | None = None, registry: dict[str, dict[str, Any]] | None = None) -> int:
    registry = registry if registry is not None else BENCHMARKS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", nargs="?", default="quick", choices=sorted(PROFILES))
    ap.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(registry)}")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions of every figure (overrides the profile)")
    ap.add_argument("--events", type=int, default=None, help="events per run for every benchmark (overrides the profile)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "benchmarks")
    ap.add_argument("--name", default=None, help="file name of the results (default: the profile)")
    args = ap.parse_args(argv)
    names = ([n.strip() for n in args.only.split(",")] if args.only
             else [n for n, spec in registry.items() if spec.get("default", True)])
    unknown = [n for n in names if n not in registry]
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(registry)}")
    name = args.name or args.profile
    started_at = datetime.now(timezone.utc)
    started = time.monotonic()
    load_before = os.getloadavg()
    command = shlex.join(["python", "benchmarks/run.py", *(sys.argv[1:] if argv is None else argv)])
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-results-") as tmp:
        for bench in names:
            sizes = dict(PROFILES[args.profile].get(bench, {"events": 100_000, "repeat": 3, "extra": []}))
            if args.events and not registry[bench].get("own_size"):
                sizes["events"] = args.events
            if args.repeat:
                sizes["repeat"] = args.repeat
            json_path = Path(tmp) / f"{bench}.json"
            runs[bench] = run_one(bench, command_for(bench, registry[bench], sizes, json_path), json_path)
    results = [r["result"] for r in runs.values() if r["result"] is not None]
    crashed = [b for b, r in runs.items() if r["error"] is not None]
    total_s = time.monotonic() - started
    data = {
        "profile": args.profile, "command": command, "date": started_at.isoformat(timespec="seconds"),
        "duration_s": round(total_s, 1),
        "load_average_1m": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
        "machine": machine(ROOT),
        "benchmarks": {b: {k: v for k, v in r.items() if k != "result"} for b, r in runs.items()},
        "summary": [dict(rf.summarize(f), benchmark=res["benchmark"]) for res in results for f in res["figures"]],
        "results": results,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    json_out, md_out, png_out = (args.out_dir / f"{name}.{ext}" for ext in ("json", "md", "png"))
    json_out.write_text(json.dumps(data, indent=2) + "\n")
    m = data["machine"]
    machine_line = (f"{m['cpu']}, {m['cores']} cores, {m['memory_gb']} GiB; disk {m['disk'].get('device', '?')} "
                    f"({m['disk'].get('filesystem', '?')}, {m['disk']['free_gb']} GB free); {m['os']}; Python {m['python']}")
    md = [f"# Benchmarks: {name}", "", f"`{command}` - {data['date']}, {total_s / 60:.1f} min, commit "
          f"{m['git_describe']}, load average {data['load_average_1m']['before']} -> {data['load_average_1m']['after']}",
          "", machine_line, "", rf.format_table(results, markdown=True) if results else "(no results)", "",
          rf.format_peaks(results)]
    md += [f"- {res['benchmark']}: {note}" for res in results for note in res.get("notes", [])]
    if crashed:
        md.append("CRASHED: " + ", ".join(f"{b} ({runs[b]['error']})" for b in crashed))
    md_out.write_text("\n".join(md) + "\n")
    if results:
        load = data["load_average_1m"]
        write_chart(results, png_out, f"{name}: {m['cores']} cores, load average {load['before']:.1f} -> {load['after']:.1f}, "
                                      f"{data['date'][:16]}Z, commit {(m['git_commit'] or '?')[:8]}")
    print("\n" + "=" * 100)
    print(f"{name} profile, {total_s / 60:.1f} min on {machine_line}; load average (1 min) "
          f"{data['load_average_1m']['before']} -> {data['load_average_1m']['after']}")
    print(report(results) if results else "no results")
    for res in results:
        for note in res.get("notes", []):
            print(f"  {res['benchmark']}: {note}")
    for b in crashed:
        print(f"CRASHED: {b}: {runs[b]['error']}; last output:\n  " + "\n  ".join(runs[b]["output_tail"][-15:]))
    print(f"results: {json_out}, {md_out}" + (f", {png_out}" if results else ""))
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
