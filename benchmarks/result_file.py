"""The benchmark result file (``--json PATH``), the table every benchmark and the harness print, and
the readings of /proc (CPU and memory of processes) the benchmarks share.

One schema for every ``benchmarks/bench_*.py`` so that ``benchmarks/run.py`` can gather them::

    {"benchmark": "server", "params": {...},
     "figures": [{"name", "unit", "higher_is_better", "samples": [...],
                  "baseline": {"name", "unit", "samples": [...]} | null,
                  "target_ratio": float | null,      # figure/baseline must reach it
                  "target": float | null}],          # absolute target when there is no baseline
     "peak_rss_mb": {"server": 115.0, ...}, "notes": ["..."]}

``target`` extends the shared schema for figures judged against a fixed number (100,000 events/s,
300 MB of RSS) instead of a baseline measured in the same run. Ratios and verdicts are computed
here, from medians, so every consumer computes them the same way.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def require_official_client() -> None:
    """Exit with a clear message when the official client, a benchmark's baseline, is missing."""
    import importlib.util
    import sys

    if importlib.util.find_spec("pravega_client") is None:
        sys.exit(f"{sys.argv[0]}: its baseline is the official Pravega client, which is not installed "
                 f"(wheels for CPython 3.10/3.11 only: pip install 'airflow-provider-pravega[official-client]')")


def figure(
    name: str,
    unit: str,
    samples: Iterable[float],
    *,
    higher_is_better: bool = True,
    baseline: tuple[str, Iterable[float]] | None = None,
    baseline_unit: str | None = None,
    target_ratio: float | None = None,
    target: float | None = None,
) -> dict[str, Any]:
    """One figure of the result file; ``baseline`` is ``(name, samples)`` in the same unit unless told."""
    return {
        "name": name,
        "unit": unit,
        "higher_is_better": higher_is_better,
        "samples": [float(s) for s in samples],
        "baseline": None if baseline is None else {
            "name": baseline[0], "unit": baseline_unit or unit, "samples": [float(s) for s in baseline[1]],
        },
        "target_ratio": target_ratio,
        "target": target,
    }


def result(
    benchmark: str,
    params: dict[str, Any],
    figures: list[dict[str, Any]],
    peak_rss_mb: dict[str, float] | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "benchmark": benchmark,
        "params": params,
        "figures": figures,
        "peak_rss_mb": {k: round(float(v), 1) for k, v in (peak_rss_mb or {}).items()},
        "notes": list(notes or []),
    }


def write(path: Path | str | None, data: dict[str, Any]) -> None:
    """Write the result file (nothing when ``path`` is None), creating its directory."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


# ------------------------------------------------------------------ summaries and the table


def summarize(fig: dict[str, Any]) -> dict[str, Any]:
    """Median, spread, baseline median, ratio and verdict (PASS / FAIL / "-" without a target).

    The ratio is median(samples) / median(baseline samples). A ratio target is met when the ratio
    is >= target_ratio (<= when lower is better); an absolute target compares the median itself.
    """
    samples = fig["samples"]
    if not samples:
        raise ValueError(f"figure {fig.get('name')!r} has no samples")
    med = statistics.median(samples)
    base = fig.get("baseline")
    base_med = statistics.median(base["samples"]) if base and base.get("samples") else None
    ratio = med / base_med if base_med else None
    higher = fig.get("higher_is_better", True)
    target_ratio, target = fig.get("target_ratio"), fig.get("target")
    verdict = "-"
    if target_ratio is not None and ratio is not None:
        verdict = "PASS" if (ratio >= target_ratio if higher else ratio <= target_ratio) else "FAIL"
    elif target is not None:
        verdict = "PASS" if (med >= target if higher else med <= target) else "FAIL"
    return {
        "name": fig["name"], "unit": fig["unit"], "median": med, "min": min(samples), "max": max(samples),
        "n": len(samples), "baseline_name": base["name"] if base else None,
        "baseline_unit": base.get("unit", fig["unit"]) if base else None, "baseline_median": base_med,
        "ratio": ratio, "target_ratio": target_ratio, "target": target, "higher_is_better": higher,
        "verdict": verdict,
    }


def fmt(value: float | None, unit: str = "") -> str:
    """A number at a precision that suits its size, with its unit."""
    if value is None:
        return "-"
    a = abs(value)
    text = f"{value:,.0f}" if a >= 100 else f"{value:,.1f}" if a >= 10 else f"{value:,.2f}"
    return f"{text} {unit}".rstrip()


def target_text(s: dict[str, Any]) -> str:
    cmp = ">=" if s["higher_is_better"] else "<="
    if s["target_ratio"] is not None:
        return f"ratio {cmp} {s['target_ratio']:g}"
    if s["target"] is not None:
        return f"{cmp} {fmt(s['target'], s['unit'])}"
    return "-"


def table_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = [["benchmark", "figure", "median", "spread (min-max)", "baseline", "baseline median", "ratio",
             "target", "result"]]
    for res in results:
        for fig in res["figures"]:
            s = summarize(fig)
            spread = f"{fmt(s['min'])}-{fmt(s['max'])}" + (f" (n={s['n']})" if s["n"] != 3 else "")
            rows.append([
                res["benchmark"], s["name"], fmt(s["median"], s["unit"]), spread, s["baseline_name"] or "-",
                fmt(s["baseline_median"], s["baseline_unit"] or ""), "-" if s["ratio"] is None else f"{s['ratio']:.2f}",
                target_text(s), s["verdict"],
            ])
    return rows


def format_table(results: list[dict[str, Any]], markdown: bool = False) -> str:
    """The figures of one or more result files as one table (plain text or Markdown)."""
    rows = table_rows(results)
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right = {2, 3, 5, 6}
    out = []
    for n, r in enumerate(rows):
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def format_peaks(results: list[dict[str, Any]]) -> str:
    parts = []
    for res in results:
        peaks = res.get("peak_rss_mb") or {}
        if peaks:
            parts.append(f"{res['benchmark']}: " + ", ".join(f"{k} {v:,.0f} MB" for k, v in peaks.items()))
    return "peak RSS per process kind - " + "; ".join(parts) if parts else "peak RSS: not reported"


# ------------------------------------------------------------------ CPU of processes and of the machine


def proc_cpu_seconds(pid: int, waited_children: bool = False) -> float:
    """user + system CPU-seconds of ``pid`` itself, from /proc/<pid>/stat; with ``waited_children``
    also those of its children that ended and that it waited for (they leave /proc then)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if waited_children else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int, kind: Callable[[int], str | None]) -> dict[str, float]:
    """CPU-seconds of ``root`` and every descendant, summed by ``kind`` (None: "other").

    Each process counts with the children it waited for, so the difference of two readings keeps
    what a process that ended in between used (a Spark Python worker, a spawned client) as long as
    a process of the tree reaped it; its time then moves to the kind of the process that reaped it.
    """
    out: dict[str, float] = {}
    for pid in [root, *children(root)]:
        try:
            seconds = proc_cpu_seconds(pid, waited_children=True)
        except (FileNotFoundError, ProcessLookupError):  # reaped in between: its parent holds its time now
            continue
        name = kind(pid) or "other"
        out[name] = out.get(name, 0.0) + seconds
    return out


def machine_busy_cpu_s() -> float:
    """CPU-seconds the whole machine has spent busy since boot (``/proc/stat``: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ memory of processes


def rss_mb(pid: int | str = "self") -> tuple[float, float]:
    """(current RSS, lifetime peak RSS) of a process in MB, from /proc; (0, 0) once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0, 0.0
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    if "VmRSS" not in fields:  # exited, not yet reaped: no memory left
        return 0.0, 0.0
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc/<pid>/task/*/children)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue
            found += kids
            todo += kids
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


class PeakSampler(threading.Thread):
    """Samples the RSS of process kinds every ``interval`` s; ``peaks`` holds each kind's maximum.

    ``kinds`` maps a pid to its kind, or None to ignore it; several pids of one kind are summed
    (e.g. Spark's Python workers), since together they are what the machine must hold.
    """

    def __init__(self, pids: Callable[[], Iterable[int]], kind: Callable[[int], str | None], interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self._pids, self._kind, self.interval = pids, kind, interval
        self.peaks: dict[str, float] = {}
        self._stop_event = threading.Event()

    def sample(self) -> None:
        total: dict[str, float] = {}
        for pid in self._pids():
            kind = self._kind(pid)
            if kind is not None:
                total[kind] = total.get(kind, 0.0) + rss_mb(pid)[0]
        for kind, mb in total.items():
            self.peaks[kind] = max(self.peaks.get(kind, 0.0), mb)

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            time.sleep(self.interval)

    def __enter__(self) -> PeakSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_event.set()
        self.join()
        self.sample()
