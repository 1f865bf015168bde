"""Base fixtures shared by every test.

Airflow reads AIRFLOW_HOME and its database URL when it is first imported, so both are set here,
at collection time, before any test module imports Airflow: tests never touch a real Airflow
installation's home or metadata database.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="pravega-test-airflow-home-"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from leftovers import leftover_processes, mark_session, secrets_on_disk  # noqa: E402

_SESSION_MARK = mark_session()  # inherited by every process the tests start (tests/leftovers.py)
_SESSION_START = time.time()

os.environ["AIRFLOW_HOME"] = str(_AIRFLOW_HOME)
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_AIRFLOW_HOME / 'airflow.db'}"
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
# The suite's ingests are small: by default each would be written by the task's own process, without
# Spark. The tests of Spark's write path (most of them, and every process they start) write through
# Spark; the tests of the in-process path ask for it (in_process_max_bytes).
from airflow_provider_pravega.spark.ingest_spec import IN_PROCESS_MAX_BYTES_VARIABLE  # noqa: E402

os.environ.setdefault(IN_PROCESS_MAX_BYTES_VARIABLE, "0")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(_AIRFLOW_HOME / "dags")
os.environ.pop("AIRFLOW_CONFIG", None)
# Every Spark driver the tests start (in-process sessions, the job subprocesses, Connect servers:
# all launched through spark-submit, which adds SPARK_SUBMIT_OPTS to the JVM's options) lives
# seconds to minutes and handles little data: C1 only and the serial GC start it sooner and spend
# much less CPU on compiling, which two suite parts on 2 cores feel. Not a product default: long
# exports lose by it (docs/benchmarks.md). They also map Spark's classes from the class archive
# of this Spark installation (airflow_provider_pravega/spark/class_archive.py, made here once per
# installation: about 4.5 CPU-s less per JVM; PRAVEGA_TEST_CLASS_ARCHIVE=0 turns it off). Set
# SPARK_SUBMIT_OPTS yourself to run with other options. No session the tests start makes an archive
# in the background (a JVM for a minute beside the suite's, for tests that point the archive
# directory at an empty one): tests of that making set PRAVEGA_SPARK_CLASS_ARCHIVE=auto themselves.
os.environ.setdefault("PRAVEGA_SPARK_CLASS_ARCHIVE", "manual")
if "SPARK_SUBMIT_OPTS" not in os.environ:
    _QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    if os.environ.get("PRAVEGA_TEST_CLASS_ARCHIVE", "1") != "0":
        from airflow_provider_pravega.spark import class_archive

        try:
            _QUICK_JVM = f"{_QUICK_JVM} {class_archive.java_options(class_archive.build(_QUICK_JVM))}"
        except class_archive.ClassArchiveError as _exc:
            print(f"tests/conftest.py: Spark JVMs start without a class archive: {_exc}", file=sys.stderr)
    os.environ["SPARK_SUBMIT_OPTS"] = _QUICK_JVM

if "airflow" in sys.modules:  # pragma: no cover - guards the ordering this module relies on
    raise RuntimeError("tests/conftest.py must run before anything imports airflow")

REPO_ROOT = Path(__file__).resolve().parents[1]

# Fixtures running the embedded Pravega-compatible server (pravega_controller_uri, ...). pytest only
# accepts pytest_plugins in this top-level conftest, and it is imported after the Airflow
# environment above is set.
pytest_plugins = ["airflow_provider_pravega.embedded.pytest_plugin"]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Nothing left behind (tests/leftovers.py): no process the session started, no test password
    in a file under the temporary directory outside the tests' own directories."""
    if getattr(session.config.option, "collectonly", False) or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from airflow_provider_pravega.embedded.pytest_plugin import SECURE_USERS

    _stop_spark_gateway()  # the session's Spark JVM lives as long as this process: end it first
    processes = leftover_processes(_SESSION_MARK)
    files = secrets_on_disk([pw for pw, _acl in SECURE_USERS.values()], _SESSION_START,
                            exclude=[_AIRFLOW_HOME, Path(__file__).resolve().parents[1]])
    if processes or files:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["LEFT BEHIND by this test session:"]
        lines += [f"  process still running: {p}" for p in processes]
        lines += [f"  a test password in plain text on disk: {f}" for f in files]
        if reporter is not None:
            reporter.write_line("\n".join(lines), red=True)
        else:
            print("\n".join(lines))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _stop_spark_gateway() -> None:
    """The JVM behind this process's SparkContexts (py4j gateway) exits only with the process;
    the sessions were stopped by their fixtures, so stop the JVM too."""
    module = sys.modules.get("pyspark.core.context") or sys.modules.get("pyspark.context")
    context = getattr(module, "SparkContext", None)
    gateway = getattr(context, "_gateway", None)
    if gateway is None:
        return
    import psutil

    proc = getattr(gateway, "proc", None)
    tree: list[psutil.Process] = []
    if proc is not None:
        try:
            root = psutil.Process(proc.pid)
            tree = [root, *root.children(recursive=True)]  # spark-submit's shell and the JVM under it
        except psutil.Error:
            pass
    try:
        gateway.shutdown()
    except Exception:  # already gone
        pass
    if proc is not None and proc.stdin is not None:
        proc.stdin.close()  # the JVM's gateway server exits when its stdin closes
    _gone, alive = psutil.wait_procs(tree, timeout=30)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    context._gateway = context._jvm = None


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_AIRFLOW_HOME, ignore_errors=True)


# ------------------------------------------------------------------ which Pravega the tests talk to
#
# Tests that take ``pravega_controller_uri`` (and nothing embedded-specific such as
# ``pravega_embedded``) are backend-neutral: they run against every selected backend — the
# embedded server and real Pravega standalone (Maven Central, Java 17) — so a behaviour only our
# server has cannot hide. ``auto`` (the default) adds standalone when it can run here.


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--pravega-backend", default=os.environ.get("PRAVEGA_BACKEND", "auto"),
        choices=["auto", "embedded", "standalone", "both", "cluster"],
        help="Pravega for backend-neutral tests: auto (embedded, plus standalone when Java 17 and its jars or "
             "Maven Central are available), embedded, standalone, both, or cluster (real Pravega as separate "
             "processes: ZooKeeper, 3 bookies, 3 segment stores, 2 controllers; tests/backends/cluster.py) "
             "(default: $PRAVEGA_BACKEND or auto)",
    )
    parser.addoption(
        "--suite-part", choices=["all", "1", "2"], default="all",
        help="scripts/test runs the suite as two pytest processes side by side: part 2 is every test that talks "
             "to Pravega standalone plus the heaviest self-contained scenarios (SECOND_PART), part 1 the rest",
    )


def _selected_backends(config: pytest.Config) -> list[str]:
    choice = config.getoption("--pravega-backend")
    if choice == "embedded":
        return ["embedded"]
    if choice == "standalone":
        return ["standalone"]
    if choice == "both":
        return ["embedded", "standalone"]
    if choice == "cluster":
        return ["cluster"]
    from backends.standalone import standalone_available

    ok, reason = standalone_available()
    if not ok:
        config._pravega_standalone_skipped = reason  # type: ignore[attr-defined]
        return ["embedded"]
    return ["embedded", "standalone"]


def pytest_configure(config: pytest.Config) -> None:
    config._pravega_backends = _selected_backends(config)  # type: ignore[attr-defined]


#: Heavy scenarios with their own servers that run in part 2 of ``scripts/test`` (beside part 1).
#: tests/test_demo.py (a whole demo, about 3.5 minutes) runs in part 1: part 1 ended a quarter of an
#: hour before part 2, and the interpreter tiers start when it ends.
SECOND_PART = ("tests/topology/", "tests/lake/",
               "tests/dags/test_example_dags.py::test_delta_export_dag", "tests/export/test_stream_into_delta.py",
               "tests/export/test_export_delta_bad_input.py", "tests/triggers/test_shared_stream_triggerer.py")


def _in_second_part(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    backend = callspec.params.get("pravega_backend") if callspec is not None else None
    return (backend in ("standalone", "cluster") or item.get_closest_marker("standalone") is not None
            or item.nodeid.startswith(SECOND_PART))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--suite-part`` splits the suite between the two processes of ``scripts/test``. Tests
    marked ``official_client`` skip, saying why, where the official client is missing (modules that
    need it throughout call ``pravega_clients.require_official_client()``)."""
    from airflow_provider_pravega.embedded.pytest_plugin import OFFICIAL_CLIENT_REASON, official_client_installed

    part = config.getoption("--suite-part")
    if part != "all":
        keep = [item for item in items if _in_second_part(item) == (part == "2")]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep
    if official_client_installed():
        return
    skip = pytest.mark.skip(reason=OFFICIAL_CLIENT_REASON)
    for item in items:
        if item.get_closest_marker("official_client"):
            item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"pravega backends: {', '.join(config._pravega_backends)}"]  # type: ignore[attr-defined]
    skipped = getattr(config, "_pravega_standalone_skipped", None)
    if skipped:
        lines.append(f"pravega standalone not used: {skipped}")
    return lines


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "pravega_controller_uri" in metafunc.fixturenames and "pravega_embedded" not in metafunc.fixturenames:
        metafunc.parametrize("pravega_backend", metafunc.config._pravega_backends,  # type: ignore[attr-defined]
                             indirect=True, scope="session")


@pytest.fixture(scope="session")
def pravega_backend(request: pytest.FixtureRequest) -> str:
    return getattr(request, "param", "embedded")


@pytest.fixture(scope="session")
def pravega_standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Real Pravega standalone for the whole run (its controller URI)."""
    from backends.standalone import PravegaStandalone

    server = PravegaStandalone(work_dir=tmp_path_factory.mktemp("pravega-standalone"))
    uri = server.start()
    try:
        yield uri
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pravega_real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Real Pravega as a cluster of processes for the whole run (its controllers' URI)."""
    from backends.cluster import real_cluster

    with real_cluster(tmp_path_factory.mktemp("pravega-cluster")) as cluster:
        yield cluster.controller_uri


@pytest.fixture(scope="session")
def pravega_controller_uri(request: pytest.FixtureRequest, pravega_backend: str) -> str:
    if pravega_backend == "standalone":
        return request.getfixturevalue("pravega_standalone")
    if pravega_backend == "cluster":
        return request.getfixturevalue("pravega_real_cluster")
    return request.getfixturevalue("pravega_embedded").controller_uri


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """The temporary AIRFLOW_HOME of this test run (SQLite metadata DB inside it)."""
    return _AIRFLOW_HOME


@pytest.fixture
def fresh_airflow_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Environment for an ``airflow`` CLI subprocess with its own empty AIRFLOW_HOME and SQLite DB."""
    home = tmp_path / "airflow-home"
    home.mkdir()
    env = dict(os.environ)
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
    )
    yield env


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole run (the operators reuse the active session)."""
    from airflow_provider_pravega.spark.session import get_spark_session

    session = get_spark_session(None, "pravega-tests", **{"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


@pytest.fixture(scope="session", autouse=True)
def _py4j_closed_before_exit() -> Iterator[None]:
    """At the end of the run, close py4j's connections to Spark's JVM while logging still works.

    Left open (by the ``spark`` fixture or an operator's own session), they are closed by their
    ``__del__`` at interpreter exit, and py4j logs "Closing down clientserver connection" to a
    handler whose stream (pytest's captured stderr) is already closed: a ``--- Logging error ---``
    traceback at the end of the run.
    """
    yield
    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    _stop_spark_gateway()


@pytest.fixture
def read_stream():
    """``read_stream(uri, scope, stream, expected=None, timeout=60)``: every event of a stream from
    its head (until ``expected`` events arrived, or until nothing new came for a few seconds). Read
    with the official client's reader group (the oracle) where it is installed, else straight from
    the segment store with the provider's own client (each segment before its successors)."""
    from airflow_provider_pravega.embedded.pytest_plugin import official_client_installed

    return _read_stream_official if official_client_installed() else _read_stream_own


def _read_stream_own(uri: str, scope: str, stream: str, expected: int | None = None, timeout: float = 60.0,
                     quiet_s: float = 3.0) -> list[bytes]:
    import time

    from airflow_provider_pravega.client import PravegaClient
    from client.readback import read_segments_direct

    deadline = time.monotonic() + timeout
    with PravegaClient(uri) as client:
        got: list[bytes] = []
        last_new = time.monotonic()
        while time.monotonic() < deadline:
            segments = read_segments_direct(client, scope, stream)
            now = [e for segment_id in sorted(segments) for e in segments[segment_id]]
            if len(now) > len(got):
                last_new = time.monotonic()
            got = now
            if expected is not None and len(got) >= expected:
                break
            if expected is None and time.monotonic() - last_new > quiet_s:
                break
            time.sleep(0.2)
        return got


def _read_stream_official(uri: str, scope: str, stream: str, expected: int | None = None, timeout: float = 60.0,
                          quiet_s: float = 3.0) -> list[bytes]:
    import asyncio
    import time
    import uuid

    import pravega_client

    mgr = pravega_client.StreamManager(uri)

    async def run() -> list[bytes]:
        group = mgr.create_reader_group(f"rg-{uuid.uuid4().hex[:8]}", scope, stream)
        reader = group.create_reader("r")
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        last_new = time.monotonic()
        while time.monotonic() < deadline:
            if expected is not None and len(got) >= expected:
                break
            if expected is None and time.monotonic() - last_new > quiet_s:
                break
            try:
                sl = await asyncio.wait_for(reader.get_segment_slice_async(), quiet_s)
            except asyncio.TimeoutError:
                continue
            before = len(got)
            got.extend(e.data() for e in sl)
            reader.release_segment(sl)
            if len(got) > before:
                last_new = time.monotonic()
        reader.reader_offline()
        return got

    return asyncio.run(run())


@pytest.fixture
def run_dag():
    """``run_dag(dag, **dag_test_kwargs)``: ``dag.test()`` for a DAG defined in a test."""
    from pravega_testing.dag_test import run_dag as run

    return run


@pytest.fixture
def task_errors() -> Iterator[dict[str, BaseException]]:
    """task id -> the exception the task failed with, for tasks run in this process (``dag.test()``).

    Taken from Airflow's listener API (``on_task_instance_failed``), not from failure callbacks:
    Airflow 3.2 gives those callbacks no ``exception`` in their context (3.3 does)."""
    import pluggy
    from airflow.sdk.listener import get_listener_manager

    hookimpl = pluggy.HookimplMarker("airflow")
    errors: dict[str, BaseException] = {}

    class Recorder:
        @hookimpl
        def on_task_instance_failed(self, previous_state: Any, task_instance: Any, error: Any) -> None:
            errors[task_instance.task_id] = error if isinstance(error, BaseException) else RuntimeError(str(error))

    recorder = Recorder()
    manager = get_listener_manager()
    manager.add_listener(recorder)
    try:
        yield errors
    finally:
        manager.pm.unregister(recorder)


@pytest.fixture
def client(pravega_controller_uri: str):
    """This provider's client on the test's Pravega (closed after the test)."""
    from airflow_provider_pravega.client import PravegaClient

    with PravegaClient(pravega_controller_uri) as c:
        yield c


@pytest.fixture
def embedded_client(pravega_embedded: Any):
    """This provider's client on the embedded server alone, for a test that is not run on each
    backend (closed after the test)."""
    from airflow_provider_pravega.client import PravegaClient

    with PravegaClient(pravega_embedded.controller_uri) as c:
        yield c


@pytest.fixture
def pravega_conn(monkeypatch, pravega_embedded) -> None:
    """``pravega_default`` pointed at the session's embedded server (AIRFLOW_CONN_* JSON)."""
    import json

    host, port = pravega_embedded.controller_uri.rsplit("//", 1)[1].rsplit(":", 1)
    monkeypatch.setenv("AIRFLOW_CONN_PRAVEGA_DEFAULT", json.dumps({"conn_type": "pravega", "host": host,
                                                                   "port": int(port)}))


@pytest.fixture
def pravega_default_conn(monkeypatch, pravega_controller_uri):
    """``pravega_default`` pointed at the test's Pravega (AIRFLOW_CONN_* JSON); returns its URI."""
    import json

    host, port = pravega_controller_uri.rsplit("//", 1)[1].rsplit(":", 1)
    monkeypatch.setenv("AIRFLOW_CONN_PRAVEGA_DEFAULT", json.dumps({"conn_type": "pravega", "host": host,
                                                                   "port": int(port)}))
    return pravega_controller_uri
