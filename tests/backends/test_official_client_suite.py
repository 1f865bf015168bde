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


import pytest
from pravega_clients import require_official_client

from .official_suite import OfficialSuiteError, client_version, fetch, run_suite

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
# The real cluster (--pravega-backend cluster) is Pravega 0.13 too, shared by the run as standalone is.
EXPECTED_FAILURES.update({("cluster", test): why for (backend, test), why in list(EXPECTED_FAILURES.items())
                          if backend == "standalone"})


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
    # Embedded: a fresh server per official test (the plugin starts it), so each test sees only its
    # own scopes, as on the suite authors' fresh Pravega. Standalone: the shared instance.
    target = "fresh-embedded" if pravega_backend == "embedded" else pravega_controller_uri
    try:
        return run_suite(suite, target, tmp_path_factory.mktemp("official-suite"))
    except OfficialSuiteError as exc:
        pytest.fail(str(exc))


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
