"""The ingest and export operators in cluster deploy mode on a real YARN: Hadoop's MiniYARNCluster
over a MiniDFSCluster (pravega_testing.yarn), whose NodeManager launches the driver (Spark's
ApplicationMaster) and the executors as container processes. Each operator submits its job
through the Spark provider's SparkSubmitHook (a ``spark`` connection ``host=yarn``,
``deploy-mode: cluster``), follows the application through the ResourceManager's REST API and
reads the outcome from Pravega.

- An ingest from ``hdfs://`` with an executor container SIGKILLed while the write tasks run, then
  the export of its interval to ``hdfs://``: every record once in the stream and in the files.
- A try that dies after submitting; the next try reattaches to the running application (no second
  submission) while the driver holds right after the ingest's commit point, and the driver's
  container is SIGKILLed there; the try after that submits again and its driver finishes the run.
- A try that dies between submitting and storing the application's id: its driver runs on past
  the commit point while later tries submit, reattach and finish the run; released afterwards,
  it commits nothing twice.
- Killing the task kills its application.

Pravega has authentication on: the jobs get the password as a file spark-submit distributes
(spark/submit.py). While a driver holds, no process's command line or environment on the host, no
document of the application in the ResourceManager's and NodeManager's REST APIs, and no launch
script or container log holds the password.

Every record is in the stream once, and once the cluster stops no container process is left."""

from __future__ import annotations

import getpass
import json
import os
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_range
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.job_results import JobResults
from airflow_provider_pravega.client.ingest_location import open_state_store, state_location
from airflow_provider_pravega.client.ingest_state import COMMITTING
from airflow_provider_pravega.client.streamcut import StreamCut
from airflow_provider_pravega.embedded.pytest_plugin import _start_secure
from airflow_provider_pravega.operators.export import PravegaStreamCutExportOperator
from airflow_provider_pravega.operators.ingest import PravegaTransactionalIngestOperator
from airflow_provider_pravega.spark import ingest_job
from airflow_provider_pravega.spark.ingest_spec import IngestSpec
from airflow_provider_pravega.spark.submit import PASSWORD_FILE, ApplicationRun, SparkApplicationError
from leftovers import secrets_on_disk
from pravega_testing.faults import fault_spark_conf
from pravega_testing.hdfs import HdfsUnavailable
from pravega_testing.yarn import (Yarn, alive, application_documents, applications, container_processes, list_files,
                                  processes_under, read_file, role, spark_submit_conf, submit_env, write_file,
                                  yarn_minicluster)


@dataclass
class Cluster:
    yarn: Yarn
    #: Container processes the test saw (pid -> role); the fixture checks they are gone after stop.
    seen: dict[int, str | None] = field(default_factory=dict)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("yarn")
    try:  # YARN_LOG_RETAIN_S keeps the containers' logs for a look after a failure (costs 10 s at stop)
        with yarn_minicluster(work, log_retain_s=int(os.environ.get("YARN_LOG_RETAIN_S", "0"))) as yarn:
            state = Cluster(yarn)
            yield state
    except HdfsUnavailable as exc:
        pytest.skip(str(exc))
    left = [pid for pid in state.seen if alive(pid)] + [pid for pid, _cmd in processes_under(work)]
    assert not left, f"processes left after the cluster stopped: {left}"


@pytest.fixture(scope="module")
def pravega(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PravegaConnectionConfig]:
    """The embedded server with authentication (no TLS), and the connection of a user whose
    password is unique to this module: a scan of the host for it finds this module's copies only."""
    user, password = "yarn-jobs", f"yarn-{uuid.uuid4().hex}"
    server = _start_secure(tmp_path_factory.mktemp("pravega-auth"), token_ttl_s=None, tls=False,
                           extra_users={user: (password, "prn::*,READ_UPDATE")})
    try:
        yield PravegaConnectionConfig.from_connection_fields(host=server.process.controller_uri, login=user,
                                                             password=password)
    finally:
        server.process.stop()


DAY = datetime(2026, 11, 20, tzinfo=timezone.utc)
BOUND_S = 600.0  # a bound for a loaded machine, not a timing assertion


class TaskStateStore:
    """Airflow's task state store as the operators use it (get/set/delete), kept across tries."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def get(self, key: str) -> Any:
        return self.values.get(key)

    def set(self, key: str, value: Any) -> None:
        self.values[key] = json.loads(json.dumps(value))

    def delete(self, key: str) -> None:
        self.values.pop(key, None)


def _context(store: TaskStateStore, try_number: int | None = None) -> dict[str, Any]:
    """What the operators read of a task's context; with ``try_number``, the try of one task
    instance (a later try takes an earlier try's run over at once)."""
    context = {"task_state_store": store, "data_interval_start": DAY, "data_interval_end": DAY + timedelta(days=1)}
    if try_number is not None:
        context["ti"] = SimpleNamespace(dag_id="yarn", task_id="ingest", run_id="scheduled__2026-11-20", map_index=-1,
                                        try_number=try_number)
    return context


@pytest.fixture
def yarn_conn(cluster: Cluster, monkeypatch: pytest.MonkeyPatch, pravega: PravegaConnectionConfig) -> str:
    """A ``spark`` connection in cluster deploy mode on the minicluster; spark-submit on PATH;
    ``pravega_default`` on the module's Pravega with its user and password."""
    yarn = cluster.yarn
    monkeypatch.setenv("AIRFLOW_CONN_PRAVEGA_DEFAULT", json.dumps({
        "conn_type": "pravega", "host": pravega.host, "port": pravega.port, "login": pravega.username,
        "password": pravega.password}))
    for key, value in submit_env(yarn, base={}).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", f"{os.environ['SPARK_HOME']}/bin{os.pathsep}{os.environ['PATH']}")
    conf = {**spark_submit_conf(yarn), "spark.yarn.maxAppAttempts": "1"}
    conf.pop("spark.yarn.submit.waitAppCompletion")  # the operator's: spark-submit returns at once
    monkeypatch.setenv("AIRFLOW_CONN_YARN_CLUSTER", json.dumps({
        "conn_type": "spark", "host": "yarn",
        "extra": {"deploy-mode": "cluster", "yarn_resourcemanager_webapp_address": yarn.rm_web, "conf": conf}}))
    return "yarn_cluster"


def _records(yarn: Yarn, directory: str, files: int, per_file: int) -> list[str]:
    lines = [json.dumps({"sensor_id": f"s{n % 7}", "n": n, "pad": "p" * 30}) for n in range(files * per_file)]
    for part in range(files):
        write_file(yarn, f"{directory}/part-{part}.jsonl", ("\n".join(lines[part::files]) + "\n").encode())
    return lines


def _stream_events(pravega: PravegaConnectionConfig, scope: str, stream: str) -> list[str]:
    with PravegaClient(pravega) as client:
        head, tail = StreamCut.head(client, scope, stream), StreamCut.tail(client, scope, stream)
        return [e.payload.decode() for rng in plan_segment_ranges(client, head, tail)
                for e in read_segment_range(client, rng)]


def _run_state(pravega: PravegaConnectionConfig, scope: str, ingest_id: str) -> dict[str, Any]:
    with PravegaClient(pravega) as client:
        try:
            store = open_state_store(client, *state_location(scope, "readings", ingest_id), create=False)
        except Exception:  # not created yet
            return {}
        try:
            return store.fetch()
        finally:
            store.close()


def _wait_for(what: str, check, thread: threading.Thread | None = None, out: dict[str, Any] | None = None) -> Any:
    deadline = time.monotonic() + BOUND_S
    while not (found := check()):
        assert thread is None or thread.is_alive(), f"the task ended before {what}: {(out or {}).get('error')!r}"
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.2)
    return found


def _in_thread(target) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = target()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_ingest_from_hdfs_survives_a_killed_executor_and_exports_to_hdfs(
    cluster: Cluster, yarn_conn: str, pravega: PravegaConnectionConfig, unique_name: Any,
) -> None:
    yarn = cluster.yarn
    scope = unique_name("yarn")
    lines = _records(yarn, "/in/day1", files=4, per_file=5000)
    ingest = PravegaTransactionalIngestOperator(
        task_id="ingest", scope=scope, stream="readings", source=f"{yarn.hdfs_uri}/in/day1/*.jsonl",
        routing_key_field="sensor_id", ingest_id="yarn", create_stream=True, stream_segments=2, num_writers=2,
        spark_conn_id=yarn_conn)
    store = TaskStateStore()
    thread, out = _in_thread(lambda: ingest.execute(_context(store)))
    _wait_for("a write task registered", lambda: any(
        run.get("txns") for run in _run_state(pravega, scope, "yarn").get("runs", {}).values()),
        thread, out)
    killed = None
    while killed is None and thread.is_alive():  # an executor container running a write task (a Python worker)
        for pid, cmd in container_processes(yarn):
            cluster.seen[pid] = role(cmd)
            if role(cmd) == "executor" and psutil.Process(pid).children(recursive=True):
                os.kill(pid, signal.SIGKILL)
                killed = pid
                break
        else:
            time.sleep(0.05)
    thread.join(BOUND_S)
    assert "error" not in out, out.get("error")
    assert killed is not None, "no executor container was running a write task to kill"
    result = out["result"]
    assert result["events"] == len(lines) and len(result["files_ingested"]) == 4
    assert store.values == {}  # done: a cleared task runs afresh
    assert Counter(_stream_events(pravega, scope, "readings")) == Counter(lines)

    export = PravegaStreamCutExportOperator(
        task_id="export", scope=scope, stream="readings", output_path=f"{yarn.hdfs_uri}/out/day1", format="jsonl",
        from_ingest="yarn", export_id="yarn-export", spark_conn_id=yarn_conn)
    exported = export.execute(_context(store))
    assert exported["events"] == len(lines)
    names = list_files(yarn, "/out/day1")
    assert "_SUCCESS" in names
    events = [json.loads(line)["event"] for name in names if name.startswith("part-")
              for line in read_file(yarn, f"/out/day1/{name}").decode().splitlines()]
    assert Counter(events) == Counter(lines)
    tags = {app["applicationTags"] for app in applications(yarn) if app["name"].startswith("pravega-")}
    assert len(tags) == 2  # one application each
    # Their staged files, the password file among them, went with them (the ApplicationMaster's
    # cleanup before it reports the end).
    ended = {app["id"] for app in applications(yarn) if app["name"].startswith("pravega-")}
    assert not ended & set(list_files(yarn, f"/user/{getpass.getuser()}/.sparkStaging"))


def _places_holding(secret: str, yarn: Yarn, application: str) -> list[str]:
    """Where a user of this host, or a client of the cluster's REST APIs, can read ``secret``:
    any process's command line or environment, a REST document of ``application``, a file the
    NodeManager wrote (containers' launch scripts, their environment and logs). The one place it
    belongs, the distributed password file in the application's own directories, is left out."""
    needle = secret.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        for name in ("cmdline", "environ"):
            try:
                if needle in (entry / name).read_bytes():
                    found.append(f"{entry}/{name}")
            except OSError:  # gone, or another user's environment
                continue
    found += [url for url, body in application_documents(yarn, application).items() if secret in body]
    for dirpath, _dirs, files in os.walk(yarn.nm_dir):
        for name in files:
            path = Path(dirpath, name)
            if name == PASSWORD_FILE or path.is_symlink():
                continue
            try:
                if needle in path.read_bytes():
                    found.append(str(path))
            except OSError:  # removed meanwhile
                continue
    return found


def _held_at(step: str, release: Path) -> dict[str, str]:
    """Settings that hold the submitted ingest's driver at ``step`` until ``release`` exists."""
    repo = str(Path(__file__).resolve().parents[2])  # spark_submit_conf's PYTHONPATH of the driver
    return fault_spark_conf("spark.yarn.appMasterEnv.", repo, delay_at=step, delay_s=3600, release=release)


class TryDied(Exception):
    """A try's worker died (raised where the test makes it die)."""


def test_a_retry_reattaches_and_a_driver_killed_after_the_commit_point_loses_nothing(
    cluster: Cluster, yarn_conn: str, pravega: PravegaConnectionConfig, unique_name: Any, tmp_path: Path, monkeypatch,
) -> None:
    yarn = cluster.yarn
    scope = unique_name("yarn")
    started = time.time()
    lines = _records(yarn, "/in/day2", files=2, per_file=3000)
    held = _held_at("after_commit_record", tmp_path / "release")

    def operator(conf: dict[str, str]) -> PravegaTransactionalIngestOperator:
        return PravegaTransactionalIngestOperator(
            task_id="ingest", scope=scope, stream="readings", source=f"{yarn.hdfs_uri}/in/day2/*.jsonl",
            ingest_id="held", create_stream=True, spark_conn_id=yarn_conn, spark_conf=conf)

    store = TaskStateStore()

    real_wait, real_submit = ApplicationRun.wait, ApplicationRun.submit
    monkeypatch.setattr(ApplicationRun, "wait", lambda self, identity: (_ for _ in ()).throw(TryDied()))
    with pytest.raises(TryDied):
        operator(held).execute(_context(store, 1))
    identity = store.get("pravega_ingest_run")
    application = identity["application"]
    tag = f"pravega-submission-{identity['submission']}"

    def committing() -> bool:
        runs = _run_state(pravega, scope, "held").get("runs", {}).values()
        return any(run.get("phase") == COMMITTING for run in runs)

    _wait_for("the driver at its commit point", committing)
    # Held there, the driver and the executors have used the password (the executors wrote).
    places = _places_holding(pravega.password, yarn, application)
    assert not places, f"the password is readable in {places}"
    assert secrets_on_disk([pravega.password], started, Path(tempfile.gettempdir())) == []  # spark-submit's copy

    reattached = threading.Event()

    def waiting(self, identity):
        reattached.set()
        return real_wait(self, identity)

    monkeypatch.setattr(ApplicationRun, "wait", waiting)
    monkeypatch.setattr("airflow_provider_pravega.spark.submit.ApplicationRun.submit",
                        lambda self: pytest.fail("the second try submitted again instead of reattaching"))
    thread, out = _in_thread(lambda: operator(held).execute(_context(store, 2)))
    _wait_for("the second try reattached", reattached.is_set, thread, out)
    drivers = [(pid, cmd) for pid, cmd in container_processes(yarn) if role(cmd) == "driver"]
    assert len(drivers) == 1, drivers
    os.kill(drivers[0][0], signal.SIGKILL)  # the driver's container: its JVM
    thread.join(BOUND_S)
    assert isinstance(out.get("error"), SparkApplicationError), out
    assert f"{application} ended" in str(out["error"]) and "without recording an outcome" in str(out["error"])
    assert [a["id"] for a in applications(yarn, tag=tag)] == [application]  # reattached: no second submission

    # The third try submits again (the application failed; no hold this time): its driver takes the
    # earlier try's run over at its commit point and finishes it.
    monkeypatch.setattr(ApplicationRun, "wait", real_wait)
    monkeypatch.setattr(ApplicationRun, "submit", real_submit)
    result = operator({}).execute(_context(store, 3))
    assert result["recovered_runs"] or result["finished_runs"], result
    assert len({a["id"] for a in applications(yarn) if a["applicationTags"].startswith("pravega-submission-")
                and a["name"].endswith("ingest") and a["id"] != application}) >= 1
    assert Counter(_stream_events(pravega, scope, "readings")) == Counter(lines)


def test_a_driver_left_running_by_a_lost_submission_is_harmless(
    cluster: Cluster, yarn_conn: str, pravega: PravegaConnectionConfig, unique_name: Any, tmp_path: Path, monkeypatch,
) -> None:
    """The first try dies after spark-submit and before the application's id is stored (the gap
    Airflow's mixin documents): its driver A runs on, and holds past the ingest's commit point. The
    second try therefore submits B, stores it and dies too; the third reattaches to B. B takes A's
    run over (an earlier try's) and finishes it; A, released afterwards, commits nothing twice."""
    yarn = cluster.yarn
    scope = unique_name("yarn")
    lines = _records(yarn, "/in/day3", files=2, per_file=3000)

    def operator(conf: dict[str, str]) -> PravegaTransactionalIngestOperator:
        return PravegaTransactionalIngestOperator(
            task_id="ingest", scope=scope, stream="readings", source=f"{yarn.hdfs_uri}/in/day3/*.jsonl",
            ingest_id="gap", create_stream=True, spark_conn_id=yarn_conn, spark_conf=conf)

    class LosingStore(TaskStateStore):
        def set(self, key: str, value: Any) -> None:
            raise TryDied()

    lost = LosingStore()
    with pytest.raises(TryDied):
        operator(_held_at("after_commit_record", tmp_path / "release-a")).execute(_context(lost, 1))
    _wait_for("driver A at its commit point", lambda: any(
        run.get("phase") == COMMITTING for run in _run_state(pravega, scope, "gap").get("runs", {}).values()))
    [app_a] = [a["id"] for a in applications(yarn) if a["name"].startswith("pravega-ingest") and
               a["state"] == "RUNNING"]

    store = TaskStateStore()
    real_wait = ApplicationRun.wait
    monkeypatch.setattr(ApplicationRun, "wait", lambda self, identity: (_ for _ in ()).throw(TryDied()))
    with pytest.raises(TryDied):
        operator(_held_at("after_listing", tmp_path / "release-b")).execute(_context(store, 2))
    app_b = store.get("pravega_ingest_run")["application"]

    monkeypatch.setattr(ApplicationRun, "wait", real_wait)
    monkeypatch.setattr(ApplicationRun, "submit",
                        lambda self: pytest.fail("the third try submitted again instead of reattaching"))
    thread, out = _in_thread(lambda: operator({}).execute(_context(store, 3)))
    (tmp_path / "release-b").touch()
    thread.join(BOUND_S)
    assert "error" not in out, out.get("error")
    assert out["result"]["recovered_runs"] or out["result"]["finished_runs"], out["result"]
    assert Counter(_stream_events(pravega, scope, "readings")) == Counter(lines)

    assert [a["state"] for a in applications(yarn) if a["id"] == app_a] == ["RUNNING"]  # A still holds
    (tmp_path / "release-a").touch()  # driver A goes on from its commit point
    _wait_for("application A to end", lambda: [a["state"] for a in applications(yarn) if a["id"] == app_a]
              != ["RUNNING"])
    assert Counter(_stream_events(pravega, scope, "readings")) == Counter(lines)  # nothing twice
    assert app_a != app_b
    [tags_a] = [a["applicationTags"] for a in applications(yarn) if a["id"] == app_a]
    with PravegaClient(pravega) as client:
        outcome_a = JobResults(client, *ingest_job.state_location(IngestSpec(
            scope=scope, stream="readings", source="-", ingest_id="gap"))).get(tags_a.split("pravega-submission-")[1])
    assert not outcome_a.ok and outcome_a.error_type == "FencedError", outcome_a  # it stopped, fenced


def test_killing_the_task_kills_its_application(
    cluster: Cluster, yarn_conn: str, pravega: PravegaConnectionConfig, unique_name: Any, tmp_path: Path, monkeypatch,
) -> None:
    """``on_kill`` (Airflow killing the task) kills the YARN application through the
    ResourceManager; the waiting try then fails with YARN's verdict, and nothing was written."""
    yarn = cluster.yarn
    scope = unique_name("yarn")
    _records(yarn, "/in/day4", files=1, per_file=100)
    ingest = PravegaTransactionalIngestOperator(
        task_id="ingest", scope=scope, stream="readings", source=f"{yarn.hdfs_uri}/in/day4/*.jsonl",
        ingest_id="killed", create_stream=True, spark_conn_id=yarn_conn,
        spark_conf=_held_at("after_listing", tmp_path / "never"))
    waiting = threading.Event()
    real_wait = ApplicationRun.wait
    monkeypatch.setattr(ApplicationRun, "wait", lambda self, identity: waiting.set() or real_wait(self, identity))
    store = TaskStateStore()
    thread, out = _in_thread(lambda: ingest.execute(_context(store)))
    _wait_for("the application submitted", waiting.is_set, thread, out)
    application = store.get("pravega_ingest_run")["application"]
    ingest.on_kill()
    thread.join(BOUND_S)
    assert isinstance(out.get("error"), SparkApplicationError), out
    assert [a["state"] for a in applications(yarn) if a["id"] == application] == ["KILLED"]
    assert f"{application} ended KILLED" in str(out["error"])
    with PravegaClient(pravega) as client:
        assert not client.admin.stream_exists(scope, "readings") or \
            not _stream_events(pravega, scope, "readings")
