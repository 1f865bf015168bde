"""common.messaging's ``MessageQueueTrigger`` with the ``pravega`` queue provider, under a real
``airflow triggerer``: a DAG scheduled on an AssetWatcher runs when events arrive.

The DAG folder, metadata DB (SQLite) and triggerer are this test's own; the triggerer runs the
watcher stored by DAG parsing (``airflow dags reserialize``), and the test reads what it recorded in
the metadata DB: the asset event (with the new cut, the event count min_events asked for and a
sample of the events), the queued run of the consuming DAG, and the cut the watcher saved after
the triggerer took its event (on Airflow 3.3: once the event was stored, on the shared stream).
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow.providers.common.messaging", reason="apache-airflow-providers-common-messaging is not installed")

DAG_FILE = '''
from airflow.sdk import DAG, Asset, AssetWatcher, task
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

readings = Asset(
    "pravega://{host}:{port}/{scope}/readings",
    watchers=[AssetWatcher(name="readings_queue", trigger=MessageQueueTrigger(
        {how}, after_cut="head", poll_interval=0.5, max_retry_interval=1, sample_events=2, min_events=3))],
)

with DAG("{dag_id}", schedule=[readings], is_paused_upon_creation=False):

    @task
    def handle():
        pass

    handle()
'''


def _airflow(env: dict[str, str], *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"airflow {' '.join(args)}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def _asset_events(db: Path, dag_id: str) -> tuple[list[dict[str, Any]], bool, str | None]:
    """(payloads of the asset events of the DAG's asset, whether a run of the DAG is queued, the
    cut the watcher saved in the asset state store; None before Airflow 3.3, which has no such
    store: the trigger then starts from its ``after_cut`` after a restart)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        rows = conn.execute(
            "SELECT e.extra FROM asset_event e JOIN dag_schedule_asset_reference r ON r.asset_id = e.asset_id "
            "WHERE r.dag_id = ? ORDER BY e.id", (dag_id,)).fetchall()
        queued = conn.execute("SELECT count(*) FROM asset_dag_run_queue WHERE target_dag_id = ?", (dag_id,)).fetchone()
        has_store = conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'asset_state_store'").fetchone()[0]
        saved = conn.execute(
            "SELECT s.value FROM asset_state_store s JOIN dag_schedule_asset_reference r ON r.asset_id = s.asset_id "
            "WHERE r.dag_id = ? AND s.key = 'pravega_last_seen_cut'", (dag_id,)).fetchone() if has_store else None
    stored = (saved[0] if saved else "") if has_store else None
    return [json.loads(extra)["payload"] for (extra,) in rows], bool(queued[0]), stored


def _done(seen: tuple[list[dict[str, Any]], bool, str | None]) -> bool:
    """The asset event is stored, the run queued, and then the event's cut saved (at least once)."""
    payloads, queued, saved = seen
    return bool(payloads and queued) and (saved is None or payloads[-1]["cut"] in saved)


def test_dags_on_pravega_message_queues_run_when_events_arrive_under_a_real_triggerer(
    tmp_path: Path, fresh_airflow_env: dict[str, str], pravega_embedded: Any, unique_name: Any,
) -> None:
    """Both documented forms: ``scheme="pravega"`` with scope/stream arguments, and a
    ``queue="pravega://host:port/scope/stream"`` URI (deprecated by common.messaging, still used)."""
    from airflow_provider_pravega.client import PravegaClient

    host, port = pravega_embedded.controller_uri.rsplit("//", 1)[1].rsplit(":", 1)
    dags = tmp_path / "dags"
    dags.mkdir()
    scopes = {"scheme": unique_name("mq"), "queue": unique_name("mq")}
    for form, scope in scopes.items():
        how = (f'scheme="pravega", scope="{scope}", stream="readings"' if form == "scheme"
               else f'queue="pravega://{host}:{port}/{scope}/readings"')
        (dags / f"on_pravega_{form}.py").write_text(textwrap.dedent(
            DAG_FILE.format(host=host, port=port, scope=scope, how=how, dag_id=f"on_pravega_{form}")))
    env = dict(fresh_airflow_env, AIRFLOW__CORE__DAGS_FOLDER=str(dags),
               AIRFLOW_CONN_PRAVEGA_DEFAULT=json.dumps({"conn_type": "pravega", "host": host, "port": int(port)}))
    db = Path(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].removeprefix("sqlite:///"))
    _airflow(env, "db", "migrate")
    _airflow(env, "dags", "reserialize")  # DAG parsing stores the watchers' triggers

    triggerer = subprocess.Popen([sys.executable, "-m", "airflow", "triggerer", "--skip-serve-logs"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    events = [json.dumps({"reading": n}).encode() for n in range(3)]
    seen: dict[str, tuple[list[dict[str, Any]], bool, str]] = {}
    try:
        # The streams do not exist yet when the triggerer starts: the watchers wait for them.
        with PravegaClient(pravega_embedded.controller_uri) as client:
            for scope in scopes.values():
                client.admin.create_scope(scope)
                client.admin.create_stream(scope, "readings", 1)
                txn = client.transactions.begin(scope, "readings")
                with client.transactions.writer(scope, "readings", txn) as writer:
                    writer.write_events(events)
                    writer.flush()
                client.transactions.commit(scope, "readings", txn)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (seen and all(map(_done, seen.values()))):
            assert triggerer.poll() is None, f"the triggerer exited: {triggerer.stdout.read()[-3000:]}"
            time.sleep(1)
            seen = {form: _asset_events(db, f"on_pravega_{form}") for form in scopes}
    finally:
        triggerer.send_signal(signal.SIGTERM)
        try:
            output, _ = triggerer.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            triggerer.kill()
            output, _ = triggerer.communicate()
    for form, scope in scopes.items():
        payloads, queued, saved = seen.get(form, ([], False, ""))
        assert payloads and queued, f"{form}: no asset event or queued run from the triggerer:\n{output[-4000:]}"
        (payload,) = payloads
        assert payload["status"] == "success" and (payload["scope"], payload["stream"]) == (scope, "readings")
        assert payload["new_bytes"] == sum(8 + len(e) for e in events)  # everything since the head
        assert payload["new_events"] == 3  # min_events=3 went through MessageQueueTrigger
        assert payload["sample"] == [e.decode() for e in events[:2]]
        assert saved is None or payload["cut"] in saved, f"{form}: the announced cut was not saved: {saved!r}"
    assert "Traceback" not in output, output[-4000:]
    from airflow_provider_pravega.triggers.stream import SHARED_STREAMS

    if SHARED_STREAMS:  # Airflow 3.3: both queue forms ran on the shared stream, in ack mode
        assert output.count("(shared poll)") >= len(scopes), output[-4000:]
