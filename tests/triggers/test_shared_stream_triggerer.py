"""The stream trigger's shared poll under real Airflow processes on PostgreSQL (the topology
stack's own ``start_postgres`` and ``scripts/stack``), in ack mode (Airflow 3.3).

* Three AssetWatchers of one stream under a real ``airflow triggerer``, killed at each fault point
  of the shared poll, then restarted: every range is covered by the persisted asset events, once,
  or again where the kill came between persisting and saving the cut; never skipped. One poll loop
  serves the three watchers: the triggerer's log names one producer and three watchers of the
  shared poll, and the idle triggerer's controller calls come no faster than one per poll interval.
* The event-driven example ``pravega_count_new_readings`` in ``scripts/stack`` (scheduler on
  LocalExecutor, dag-processor, triggerer, api-server): events written in batches make one DAG run
  per persisted asset event, consecutive runs' ranges are contiguous (each ``previous_cut`` is the
  last ``cut``), and each run's task counted exactly its batch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow.triggers.shared_stream", reason="shared streams need Airflow 3.3")
psycopg2 = pytest.importorskip("psycopg2", reason="needs psycopg2 (the postgres extra)")

from airflow_provider_pravega.client import PravegaClient  # noqa: E402
from airflow_provider_pravega.protocol.streamcut import streamcut_from_text  # noqa: E402
from pravega_testing.faults import fault_env  # noqa: E402
from pravega_testing.wait import WaitTimeout, wait_until  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WATCHERS = ("plain", "sampled", "min_bytes")
#: The fault points in the order a kill leaves something to check: before anything is announced,
#: after an event left the filter (not yet persisted), after it was persisted (its cut not saved),
#: after the cut was saved.
#: The watchers' poll interval, and how many controller calls of the idle triggerer are timed.
POLL_S, IDLE_CALLS = 0.5, 20
FAULTS = ("stream_trigger_polled", "stream_trigger_yielded", "stream_trigger_persisted", "stream_trigger_advanced")

DAG_FILE = '''
from airflow.sdk import DAG, Asset, AssetWatcher, task
from airflow_provider_pravega.triggers import PravegaStreamTrigger

def watched(name, **kwargs):
    trigger = PravegaStreamTrigger(scope="{scope}", stream="{stream}", after_cut="head", poll_interval={poll_s},
                                   max_retry_interval=1, **kwargs)
    return Asset(f"watch_{{name}}", watchers=[AssetWatcher(name=f"watch_{{name}}", trigger=trigger)])

for name, kwargs in (("plain", {{}}), ("sampled", {{"sample_events": 1}}), ("min_bytes", {{"min_bytes": 1}})):
    with DAG(f"on_{{name}}", schedule=[watched(name, **kwargs)], is_paused_upon_creation=False):

        @task
        def handle():
            pass

        handle()
'''


def _stack_module() -> Any:
    """``scripts/stack.py`` as a module; the test skips, saying why, where it cannot start PostgreSQL."""
    spec = importlib.util.spec_from_file_location("pravega_stack_for_tests", REPO / "scripts" / "stack.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    try:
        module.pg_bindir(None)
        module.pg_user()
    except module.StackError as exc:
        pytest.skip(str(exc))
    return module


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private PostgreSQL cluster (as ``scripts/stack up`` starts it); its SQLAlchemy URL."""
    stack = _stack_module()
    bindir = stack.pg_bindir(None)
    work = tmp_path_factory.mktemp("pg")
    logs = work / "logs"
    logs.mkdir()
    component, url = stack.start_postgres(work, logs, dict(os.environ), bindir)
    try:
        yield url
    finally:  # a fast shutdown; the server is this process's child, so it is reaped here
        os.killpg(component["pgid"], signal.SIGINT)
        try:
            wait_until("PostgreSQL to stop", lambda: os.waitpid(component["pid"], os.WNOHANG)[0], 60, poll_s=0.2)
        except WaitTimeout:
            os.killpg(component["pgid"], signal.SIGKILL)
            os.waitpid(component["pid"], 0)


def _airflow(env: dict[str, str], *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"airflow {' '.join(args)}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"


class Triggerer:
    """``airflow triggerer`` in a session of its own (so a kill takes its runner process too)."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.proc: subprocess.Popen | None = None

    def start(self, fault: str | None = None) -> None:
        env = fault_env(kill_at=fault, base=self.env) if fault else dict(self.env)
        with open(self.log, "a") as out:
            out.write(f"\n===== triggerer start, fault point {fault}\n")
            out.flush()
            self.proc = subprocess.Popen([sys.executable, "-m", "airflow", "triggerer", "--skip-serve-logs"], env=env,
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def this_start(self) -> str:
        """The output since the last start."""
        return self.output().rsplit("===== triggerer start", 1)[1]

    def kill(self) -> None:
        """SIGKILL the whole process group (the triggerer and its trigger runner)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)
        self.proc = None


def _offset(cut: str) -> int:
    return sum(streamcut_from_text(cut).positions.values())


def _metadata_db(url: str) -> Any:
    """A psycopg2 connection to the metadata database at Airflow's SQLAlchemy ``url``."""
    return psycopg2.connect(url.replace("postgresql+psycopg2", "postgresql"))


def _payload(extra: Any) -> dict[str, Any]:
    """The trigger event's payload from an asset event's ``extra`` (JSON, or already decoded)."""
    return (extra if isinstance(extra, dict) else json.loads(extra))["payload"]


def _recorded(url: str) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """(asset name -> payloads of its persisted asset events, in order; asset name -> saved cut)."""
    with _metadata_db(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT a.name, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id ORDER BY e.id")
        events: dict[str, list[dict[str, Any]]] = {}
        for name, extra in cur.fetchall():
            events.setdefault(name, []).append(_payload(extra))
        cur.execute("SELECT a.name, s.value FROM asset_state_store s JOIN asset a ON a.id = s.asset_id "
                    "WHERE s.key = 'pravega_last_seen_cut'")
        saved = {name: value if isinstance(value, str) and not value.startswith('"') else json.loads(value)
                 for name, value in cur.fetchall()}
    return events, saved


def test_three_watchers_share_one_poll_and_no_range_is_skipped_whatever_point_the_triggerer_is_killed_at(
    tmp_path: Path, postgres: str, counted_server: Any, unique_name: Callable[[str], str],
) -> None:
    host, port = counted_server.controller_uri.rsplit("//", 1)[1].rsplit(":", 1)
    scope, stream = unique_name("shr"), unique_name("s")
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "watchers.py").write_text(textwrap.dedent(DAG_FILE.format(scope=scope, stream=stream, poll_s=POLL_S)))
    home = tmp_path / "airflow-home"
    home.mkdir()
    env = dict(os.environ, AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__CORE__DAGS_FOLDER=str(dags), AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=postgres,
               AIRFLOW_CONN_PRAVEGA_DEFAULT=json.dumps({"conn_type": "pravega", "host": host, "port": int(port)}))
    _airflow(env, "db", "migrate")
    _airflow(env, "dags", "reserialize")
    names = [f"watch_{w}" for w in WATCHERS]
    triggerer = Triggerer(env, tmp_path / "triggerer.log")

    with PravegaClient(counted_server.controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, stream, 1)

        def write(count: int) -> None:
            with client.event_writer(scope, stream) as writer:
                writer.write_events([f"event-{i}".encode() for i in range(count)])
                writer.flush()

        def tail() -> int:
            return sum(client.admin.tail(scope, stream).values())

        def settled() -> bool:
            """Every watcher's saved cut is the stream's tail, and so is its last persisted event's cut."""
            events, saved = _recorded(postgres)
            end = tail()
            return all(n in saved and _offset(saved[n]) == end and events.get(n)
                       and _offset(events[n][-1]["cut"]) == end for n in names)

        killed: dict[str, str] = {}
        try:
            for fault in FAULTS:
                write(2)
                triggerer.start(fault)
                # The runner kills itself at the fault point (the supervisor reports its SIGKILL);
                # the test then kills what is left.
                wait_until(f"the triggerer's runner to be killed at {fault}",
                           lambda: "signal_name=SIGKILL" in triggerer.this_start(), 180, poll_s=0.5)
                killed[fault] = triggerer.this_start()
                triggerer.kill()
            write(3)
            triggerer.start()
            wait_until("every watcher's cut saved at the tail", settled, 180, poll_s=0.5)
            # One poll loop for the three watchers, counted at the controller: with nothing new
            # (and no call from this test meanwhile) each poll is one call, and polls are at least
            # a poll interval apart, so IDLE_CALLS calls take at least IDLE_CALLS - 2 intervals
            # (three loops would make them three times as fast).
            calls = counted_server.controller.rpc_calls
            served, since = sum(list(calls.values())), time.monotonic()
            wait_until(f"{IDLE_CALLS} controller calls from the idle triggerer",
                       lambda: sum(list(calls.values())) - served >= IDLE_CALLS, 180, poll_s=0.05)
            took = time.monotonic() - since
            assert took >= (IDLE_CALLS - 2) * POLL_S, f"{IDLE_CALLS} calls in {took:.1f} s: {dict(calls)}"
            # One poll loop for the three watchers: the shared producer says so once, each watcher once.
            started = triggerer.this_start()
            assert started.count("Polling ") == 1 and started.count("(shared poll)") == len(WATCHERS), started[-4000:]
        finally:
            triggerer.kill()
    # Where each kill came: after the first poll nothing was announced yet (the runner's own log
    # line of that kill may not leave it before it dies); the others say where they fired.
    assert "Trigger fired event" not in killed["stream_trigger_polled"], killed["stream_trigger_polled"][-4000:]
    for fault in FAULTS[1:]:
        assert f"fault injection: SIGKILL at {fault}" in killed[fault], f"{fault} did not fire:\n{killed[fault][-4000:]}"

    events, saved = _recorded(postgres)
    end = _offset(saved[names[0]])
    for name in names:
        payloads = events[name]
        assert _offset(payloads[0]["previous_cut"]) == 0, f"{name}: does not start at the head"
        seen_cuts = {payloads[0]["previous_cut"]}
        again = 0
        for before, event in zip(payloads, payloads[1:]):
            assert event["previous_cut"] in seen_cuts | {before["cut"]}, f"{name}: a range skipped: {payloads}"
            if event["previous_cut"] != before["cut"]:
                again += 1
                assert event["previous_cut"] == before["previous_cut"], payloads
            seen_cuts.add(event["cut"])
        # Announced again only where the kill came after persisting and before the save.
        assert again == 1, f"{name}: {again} ranges announced again: {payloads}"
        assert _offset(payloads[-1]["cut"]) == end == _offset(saved[name])
    final = triggerer.this_start()
    assert "Traceback" not in final, final[-4000:]  # the kills' broken pipes aside, no error


# ------------------------------------------------------------------ DAG runs of the example (scripts/stack)

EXAMPLE_DAG = "pravega_count_new_readings"
#: Readings per batch; the next batch is written once the last one's run exists.
BATCHES = (3, 1, 4, 2)


def _stack(work: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "stack.py"), "--work-dir", str(work), *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def example_stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """``scripts/stack up`` with the count example alone in its DAG folder (unpaused, polling every
    half second, no Spark); its ``stack.json``, then ``down`` (nothing of it left running)."""
    stack = _stack_module()
    dags = tmp_path / "dags"
    dags.mkdir()
    for name in (f"{EXAMPLE_DAG}.py", "pravega_examples_common.py", ".airflowignore"):
        shutil.copy(REPO / "dags" / name, dags / name)
    work = tmp_path / "stack"
    up = _stack(work, "up", "--no-spark-connect", "--sample-days", "0", "--parallelism", "2", "--dags", str(dags),
                "--timeout", "600", "--env", "PRAVEGA_EXAMPLES_POLL_S=0.5",
                "--env", "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=False")
    try:
        assert up.returncode == 0, f"scripts/stack up failed:\n{up.stdout[-3000:]}\n{up.stderr[-5000:]}"
        yield {**json.loads((work / "stack.json").read_text()), "work": work}
    finally:
        down = _stack(work, "down", timeout=300)
        state = json.loads((work / "stack.json").read_text()) if (work / "stack.json").exists() else None
        left = [n for n, c in (state or {}).get("components", {}).items() if stack.group_alive(c["pgid"])]
        _stack(work, "down", "--purge", timeout=300)
        assert down.returncode == 0 and not left, (down.stdout, down.stderr, left)


def _runs(url: str, dag_id: str) -> list[dict[str, Any]]:
    """The DAG's asset-triggered runs in order of creation: state, the payloads of the asset events
    each consumed (in order) and its task's XCom."""
    with _metadata_db(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT r.id, r.state, e.extra FROM dag_run r LEFT JOIN dagrun_asset_event d ON d.dag_run_id = r.id "
                    "LEFT JOIN asset_event e ON e.id = d.event_id WHERE r.dag_id = %s AND r.run_type = 'asset_triggered' "
                    "ORDER BY r.id, e.timestamp, e.id", (dag_id,))
        runs: dict[int, dict[str, Any]] = {}
        for run_id, state, extra in cur.fetchall():
            run = runs.setdefault(run_id, {"state": state, "events": [], "xcom": None})
            if extra is not None:
                run["events"].append(_payload(extra))
        cur.execute("SELECT dag_run_id, value FROM xcom WHERE dag_id = %s AND key = 'return_value'", (dag_id,))
        for run_id, value in cur.fetchall():
            if run_id in runs:
                runs[run_id]["xcom"] = json.loads(value) if isinstance(value, str) else value
    return [runs[k] for k in sorted(runs)]


def _stored_events(url: str, uri: str) -> list[dict[str, Any]]:
    """Payloads of every persisted asset event of the asset ``uri``, in order."""
    with _metadata_db(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.uri = %s "
                    "ORDER BY e.id", (uri,))
        return [_payload(extra) for (extra,) in cur.fetchall()]


def test_the_event_driven_example_makes_one_dag_run_per_persisted_event_with_contiguous_ranges(
    example_stack: dict[str, Any],
) -> None:
    state = example_stack
    url, uri = state["sql_alchemy_conn"], f"pravega://127.0.0.1:{state['pravega_port']}/iot/readings"
    logs = state["work"] / "logs"

    def failing(what: str) -> str:
        return f"{what}; runs: {_runs(url, EXAMPLE_DAG)}\n" + "\n".join(
            f"--- {n}\n{(logs / f'{n}.log').read_text(errors='replace')[-3000:]}" for n in ("scheduler", "triggerer"))

    with PravegaClient(state["controller_uri"]) as client:
        client.admin.create_scope("iot")
        client.admin.create_stream("iot", "readings", 1)
        for n, size in enumerate(BATCHES):
            # One transaction per batch: its readings appear in the stream at once, so one poll
            # announces the whole batch in one asset event.
            txn = client.transactions.begin("iot", "readings")
            with client.transactions.writer("iot", "readings", txn) as writer:
                writer.write_events([json.dumps({"batch": n, "reading": i}).encode() for i in range(size)])
                writer.flush()
            client.transactions.commit("iot", "readings", txn)
            end = sum(client.admin.tail("iot", "readings").values())

            def batch_has_its_run() -> bool:
                runs = _runs(url, EXAMPLE_DAG)
                return len(runs) > n and bool(runs[-1]["events"]) and _offset(runs[-1]["events"][-1]["cut"]) == end

            try:
                wait_until(f"a DAG run for batch {n + 1}", batch_has_its_run, 240, poll_s=0.5)
            except WaitTimeout as exc:
                pytest.fail(failing(str(exc)))

    def all_done() -> bool:
        runs = _runs(url, EXAMPLE_DAG)
        if any(r["state"] == "failed" for r in runs):
            pytest.fail(failing("a run failed"))
        return all(r["state"] == "success" for r in runs)

    try:
        wait_until("every run to succeed", all_done, 300, poll_s=1)
    except WaitTimeout as exc:
        pytest.fail(failing(str(exc)))
    runs, stored = _runs(url, EXAMPLE_DAG), _stored_events(url, uri)
    # One run per persisted event: as many runs as events, each consumed exactly one, all of them.
    assert len(runs) == len(stored) == len(BATCHES), failing(f"{len(runs)} runs, {len(stored)} events")
    assert [r["events"] for r in runs] == [[event] for event in stored]
    # Contiguous: the first from the head, each next from the last one's cut.
    assert _offset(stored[0]["previous_cut"]) == 0
    for before, event in zip(stored, stored[1:]):
        assert event["previous_cut"] == before["cut"], stored
    # Each run's task read exactly its event's range and counted its batch.
    for run, event, size in zip(runs, stored, BATCHES):
        assert run["xcom"] == {"previous_cut": event["previous_cut"], "cut": event["cut"], "asset_events": 1,
                               "readings": size}, run
