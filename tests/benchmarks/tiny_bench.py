"""Run one benchmark script on tiny sizes, as the benchmarks' smoke tests do: the repository on
PYTHONPATH, the result file read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(tmp_path: Path, script: str, *args: str) -> tuple[str, list[dict[str, Any]]]:
    """(stdout, the result file's figures) of ``benchmarks/<script> *args --json``; fails the test
    with the script's output when it exits non-zero."""
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args, "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, json.loads(out.read_text())["figures"]
