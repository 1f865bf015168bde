"""The official ``pravega`` client's own test suite, run unedited against every backend.

Why: the official client (PyPI ``pravega``, the one Airflow users call) ships tests written by its
authors against real Pravega; the embedded server must pass all of them, and running them on
Pravega standalone too shows which expectations Pravega 0.13 itself does not meet. The tests come
from the sdist of the installed client's version, fetched at test time into the user cache
(tests/backends/official_suite.py; never committed). They run once per backend in a subprocess
pytest (the client holds the GIL while it waits, and the tests build their own StreamManager);
tests/backends/official_plugin.py points their fixed controller address at the backend and keeps
their random reader-group suffixes from colliding. Each official test is one test here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from pravega_clients import require_official_client

from .official_suite import OfficialSuiteError, client_version, fetch

HERE = Path(__file__).resolve().parent

# Everything the two test modules of pravega 0.3.8 hold (checked against what the subprocess ran).
OFFICIAL_TESTS = [
    f"pravega_client_test.py::PravegaTest::{t}"
    for t in ("test_tags", "test_writeEvent", "test_deleteScope", "test_seal_deleteStream", "test_byteStream",
              "test_writeTxn", "test_TxnError")
] + [
    f"pravega_reader_test.py::PravegaReaderTest::{t}"
    for t in ("test_writeEventAndRead", "test_ReadfromTail", "test_asyncEventwriteAndRead",
              "test_writeEventWithInflightAndRead", "test_multipleReader", "test_multipleReaderPartialRead",
              "test_largeEvents")
]

# (backend, official test) -> why it fails there, and whether it must fail (strict) or only may.
_FLAKY_ON_PRAVEGA_TAIL = (
    "Pravega 0.13 itself: the test writes two events after creating a reader at the tail and reads one "
    "slice without flushing, so the slice often holds only the first event (3 of 5 runs on 0.13 standalone)"
)
EXPECTED_FAILURES: dict[tuple[str, str], tuple[str, bool]] = {
    ("standalone", "pravega_client_test.py::PravegaTest::test_tags"): (
        "Pravega 0.13 lists scopes in hash order and the test asserts that the first listed scope has "
        "streams; on the shared standalone that scope may be one another test emptied (e.g. "
        "test_seal_deleteStream's): 'The stream list is empty'",
        False,
    ),
    ("standalone", "pravega_reader_test.py::PravegaReaderTest::test_ReadfromTail"): (_FLAKY_ON_PRAVEGA_TAIL, False),
}

SUBPROCESS_TIMEOUT_S = 600


def _test_id(official: str) -> str:
    module, _cls, name = official.split("::")
    return f"{module.split('_')[1]}-{name}"


@pytest.fixture(scope="module")
def official_results(pravega_controller_uri: str, pravega_backend: str,
                     tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Run both official test modules once against this backend: {official test: (outcome, details)}."""
    require_official_client()
    pytest.importorskip("aiounittest", reason="the official reader tests need aiounittest (the 'test' extra)")
    try:
        suite = fetch()
    except OfficialSuiteError as exc:
        pytest.skip(f"official pravega {client_version()} tests not available: {exc}")
    work = tmp_path_factory.mktemp("official-suite")
    (work / "pytest.ini").write_text("[pytest]\n")
    junit = work / "results.xml"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    # Embedded: a fresh server per official test (the plugin starts it), so each test sees only its
    # own scopes, as on the suite authors' fresh Pravega. Standalone: the shared instance.
    env["PRAVEGA_OFFICIAL_URI"] = "fresh-embedded" if pravega_backend == "embedded" else pravega_controller_uri
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-c", str(work / "pytest.ini"), "--rootdir", str(suite),
           "-p", "official_plugin", "-p", "no:cacheprovider", f"--junitxml={junit}", "-q", "-rA",
           *(str(suite / name) for name in ("pravega_client_test.py", "pravega_reader_test.py"))]
    try:
        done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"official suite still running after {SUBPROCESS_TIMEOUT_S} s against {pravega_controller_uri}; "
                    f"output so far:\n{out[-4000:]}")
    if not junit.exists():
        pytest.fail(f"official suite wrote no results (exit {done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
    results: dict[str, tuple[str, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module, cls = case.get("classname", "").rsplit(".", 1)
        key = f"{module.rsplit('.', 1)[-1]}.py::{cls}::{case.get('name')}"
        outcome, details = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                details = f"{child.get('message', '')}\n{child.text or ''}"
                break
        out = "".join(f"\n--- {c.tag}\n{c.text}" for c in case if c.tag in ("system-out", "system-err") and c.text)
        results[key] = (outcome, details + out)
    return results


def test_official_suite_is_what_we_expect(official_results: dict) -> None:
    """The subprocess ran exactly the official tests listed here (a new client version shows up)."""
    assert sorted(official_results) == sorted(OFFICIAL_TESTS)


@pytest.mark.parametrize("official", OFFICIAL_TESTS, ids=_test_id)
def test_official_client_test(official: str, official_results: dict, pravega_backend: str,
                              request: pytest.FixtureRequest) -> None:
    outcome, details = official_results.get(official, ("missing", "the subprocess did not run it"))
    expected = EXPECTED_FAILURES.get((pravega_backend, official))
    if expected is not None:
        reason, strict = expected
        request.applymarker(pytest.mark.xfail(reason=reason, strict=strict))
    assert outcome == "passed", f"{official} {outcome} on {pravega_backend}:\n{details[-6000:]}"
