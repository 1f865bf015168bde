"""Bounded coverage-guided fuzz runs of fuzz/*.py, as part of the suite.

Each target runs in its own process (atheris instruments the code it imports, which would slow
every other test in this process) with a fixed seed and a fixed number of runs, starting from the
committed seed corpus; new inputs and any crash file go to the test's temporary directory, never
into the repository. A crash, a timeout (a hang) or an out-of-memory exit fails the test, naming
the saved input and how to replay it. Longer runs: see fuzz/README.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")

REPO = Path(__file__).resolve().parents[2]
FUZZ = REPO / "fuzz"


def run_target(target: str, runs: int, tmp_path: Path, *, per_input_timeout_s: int = 20) -> str:
    """Runs fuzz/<target>.py for ``runs`` inputs; returns its output, fails the test on a finding."""
    work = tmp_path / "corpus"
    work.mkdir()
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the dispatcher's storage directories land here
    cmd = [
        sys.executable, str(FUZZ / f"{target}.py"),
        f"-runs={runs}", "-seed=1", f"-timeout={per_input_timeout_s}", "-rss_limit_mb=2048",
        "-max_len=4096", f"-artifact_prefix={artifacts}/", str(work), str(FUZZ / "corpus" / target),
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    found = sorted(p for p in artifacts.iterdir())
    if proc.returncode != 0 or found:
        tail = "\n".join(output.splitlines()[-60:])
        saved = "\n".join(f"  {p}" for p in found) or "  (none)"
        pytest.fail(
            f"fuzz target {target} failed (exit {proc.returncode}). Saved inputs:\n{saved}\n"
            f"Replay one with: {sys.executable} fuzz/{target}.py <file>\n--- last output ---\n{tail}",
            pytrace=False,
        )
    assert re.search(rf"Done {runs} runs", output), f"{target} did not complete {runs} runs:\n{output[-2000:]}"
    return output


def coverage(output: str) -> int:
    """The final ``cov:`` figure libFuzzer printed (instrumented edges reached)."""
    values = re.findall(r"cov: (\d+)", output)
    return int(values[-1]) if values else 0


def test_wire_decoder_bounded(tmp_path):
    output = run_target("wire_decoder", 20000, tmp_path)
    # The seeds alone reach every command's decoder; a collapse means instrumentation or seeds broke.
    assert coverage(output) > 150, output[-2000:]


def test_segment_store_dispatch_bounded(tmp_path):
    output = run_target("segment_store_dispatch", 12000, tmp_path)
    assert coverage(output) > 400, output[-2000:]


def test_a_crash_is_reported(tmp_path):
    """The harness above must be able to fail: a decoder that lets a stray exception out is caught."""
    script = tmp_path / "broken_target.py"
    script.write_text(
        "import sys, atheris\n"
        "def one(data):\n"
        "    if data[:2] == b'\\x00\\x00':\n"
        "        raise IndexError('stray exception from the decoder')\n"
        "atheris.Setup(sys.argv, one)\n"
        "atheris.Fuzz()\n"
    )
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "seed").write_bytes(b"\x00\x01")
    proc = subprocess.run(
        [sys.executable, str(script), "-runs=100000", "-seed=1", f"-artifact_prefix={tmp_path}/", str(corpus)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    assert "IndexError" in proc.stdout + proc.stderr
    assert list(tmp_path.glob("crash-*")), "no crash input was saved"
