"""PravegaTransactionSensor against the embedded server, in poke, reschedule and deferrable modes.

Every mode runs one DAG through ``dag.test()`` (which runs a deferred task's trigger in-process)
with sensors for: committed transactions (by int, by UUID text, and a list templated from XCom),
one committed while the sensor waits, one aborted while it waits, an aborted one, an unknown id,
and a still-open one that must time out.
"""

from __future__ import annotations

import json
import random
import re
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pendulum
import pytest
from bad_input_doc import check_section
from pravega_clients import official_client_installed, require_official_client

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.controller_types import TransactionInfo
from pravega_testing.dag_test import run_dag

START = pendulum.datetime(2024, 1, 1, tz="UTC")


def official_committed_txn(controller_uri: str, scope: str, stream: str) -> int:
    """A transaction written and committed with the official client's transactional writer (the
    oracle), or with the provider's own client where the official one does not install."""
    if not official_client_installed():
        from airflow_provider_pravega.client import PravegaClient

        with PravegaClient(controller_uri) as own:
            info = own.transactions.begin(scope, stream)
            with own.transactions.writer(scope, stream, info) as writer:
                writer.write_event(b"committed by the provider's own client")
            own.transactions.commit(scope, stream, info.txn_id)
            return info.txn_id
    pravega_client = require_official_client()
    manager = pravega_client.StreamManager(controller_uri)
    writer = manager.create_transaction_writer(scope, stream, random.randrange(1, 1 << 62))
    txn = writer.begin_txn()
    txn.write_event("committed by the official client")
    txn.commit()
    return txn.get_txn_id()


@pytest.mark.parametrize("mode", ["poke", "reschedule", "deferrable"])
def test_transaction_sensor_modes(
    mode: str,
    pravega_conn: None,
    pravega_controller_uri: str,
    client: PravegaClient,
    unique_name: Callable[[str], str],
    task_errors: dict[str, BaseException],
) -> None:
    from airflow.sdk import DAG, task

    from airflow_provider_pravega.sensors import PravegaTransactionSensor

    scope, stream = unique_name("txs"), unique_name("s")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 2)
    txns = client.transactions

    official = official_committed_txn(pravega_controller_uri, scope, stream)
    committed = [txns.begin(scope, stream).txn_id for _ in range(2)]
    for t in committed:
        txns.commit(scope, stream, t)
    aborted = txns.begin(scope, stream).txn_id
    txns.abort(scope, stream, aborted)
    unknown = (random.getrandbits(64) << 32) | 7  # epoch 0, never begun
    still_open = txns.begin(scope, stream, lease_ms=110_000).txn_id
    # Kept open however long the DAG takes on a loaded machine (its lease lapsed once in CI's tier).
    keeper = client.lease_keeper(10.0)
    keeper.add(scope, stream, still_open)
    late: dict[str, int] = {}  # begun by start_timers, so their leases start when their timers do

    outputs: dict[str, Any] = {}

    sensor_args: dict[str, Any] = {
        "scope": scope,
        "stream": stream,
        "poke_interval": 0.3,
        "timeout": 30,
        "mode": "poke" if mode == "deferrable" else mode,
        "deferrable": mode == "deferrable",
    }

    with DAG(unique_name(f"txn-sensor-{mode}"), schedule=None, start_date=START) as dag:

        @task
        def ids() -> list[str]:
            return [f"{t:032x}" for t in committed]

        @task
        def start_timers() -> dict[str, str]:
            """Begin two transactions, then commit one and abort the other while their sensors wait."""
            with PravegaClient(pravega_controller_uri) as c:
                late.update(commit=c.transactions.begin(scope, stream).txn_id,
                            abort=c.transactions.begin(scope, stream).txn_id)

            def finish() -> None:
                with PravegaClient(pravega_controller_uri) as c:
                    c.transactions.commit(scope, stream, late["commit"], wait=False)

            def cancel() -> None:
                with PravegaClient(pravega_controller_uri) as c:
                    c.transactions.abort(scope, stream, late["abort"])

            threading.Timer(1.5, finish).start()
            threading.Timer(3.5, cancel).start()
            return {name: f"{txn:032x}" for name, txn in late.items()}

        @task
        def keep(value: Any) -> None:
            outputs["from_xcom"] = value

        from_xcom = PravegaTransactionSensor(
            task_id="from_xcom", transaction_ids="{{ ti.xcom_pull(task_ids='ids') }}", **sensor_args
        )
        ids() >> from_xcom
        keep(from_xcom.output)
        PravegaTransactionSensor(task_id="official_int", transaction_ids=official, **sensor_args)
        PravegaTransactionSensor(task_id="uuid_text", transaction_ids=str(uuid.UUID(int=committed[0])), **sensor_args)
        PravegaTransactionSensor(task_id="aborted", transaction_ids=f"{aborted:032x}", **sensor_args)
        PravegaTransactionSensor(task_id="unknown", transaction_ids=unknown, **sensor_args)
        PravegaTransactionSensor(task_id="aborted_soft", transaction_ids=aborted, soft_fail=True, **sensor_args)
        PravegaTransactionSensor(
            task_id="mixed", transaction_ids=[committed[1], aborted], **sensor_args
        )
        PravegaTransactionSensor(
            task_id="still_open", transaction_ids=[official, still_open], **{**sensor_args, "timeout": 2}
        )
        late_ok = PravegaTransactionSensor(
            task_id="late_commit", transaction_ids="{{ ti.xcom_pull(task_ids='start_timers')['commit'] }}",
            **sensor_args,
        )
        late_bad = PravegaTransactionSensor(
            task_id="late_abort", transaction_ids="{{ ti.xcom_pull(task_ids='start_timers')['abort'] }}",
            trigger_rule="all_done", **sensor_args,
        )
        start_timers() >> late_ok >> late_bad

    dag_run = run_dag(dag)
    errors = {task_id: (type(exc).__name__, str(exc)) for task_id, exc in task_errors.items()}
    got = {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}

    assert {t: got[t] for t in ("from_xcom", "official_int", "uuid_text", "late_commit")} == dict.fromkeys(
        ("from_xcom", "official_int", "uuid_text", "late_commit"), "success"
    ), (got, errors)
    assert outputs["from_xcom"] == [f"{t:032x}" for t in committed]
    assert got["aborted_soft"] == "skipped", (got, errors)

    assert {t: got[t] for t in ("aborted", "unknown", "mixed", "still_open", "late_abort")} == dict.fromkeys(
        ("aborted", "unknown", "mixed", "still_open", "late_abort"), "failed"
    ), (got, errors)
    assert errors["aborted"][0] == "PravegaTransactionFailedError"
    assert f"{aborted:032x}" in errors["aborted"][1] and "ABORTED" in errors["aborted"][1]
    assert errors["unknown"][0] == "PravegaTransactionFailedError"
    assert f"{unknown:032x}" in errors["unknown"][1] and "UNKNOWN" in errors["unknown"][1]
    assert f"{aborted:032x}" in errors["mixed"][1] and "ABORTED" in errors["mixed"][1]
    assert errors["late_abort"][0] == "PravegaTransactionFailedError"
    assert f"{late['abort']:032x}" in errors["late_abort"][1] and "ABORT" in errors["late_abort"][1]
    assert errors["still_open"][0] == "AirflowSensorTimeout", errors["still_open"]
    if mode == "deferrable":
        assert f"{still_open:032x} is OPEN" in errors["still_open"][1]

    # Failures are immediate: each failed with the transaction's state (asserted above), not with the
    # sensor's 30-second timeout (only the 2-second one times out).
    assert txns.status(scope, stream, still_open).value == "OPEN"
    keeper.close()
    txns.abort(scope, stream, still_open)


def test_transaction_ids_forms() -> None:
    from airflow_provider_pravega.triggers.transaction import parse_txn_ids

    txn = (3 << 96) | 0x1234
    hex_id = f"{txn:032x}"
    assert parse_txn_ids(txn) == [txn]
    assert parse_txn_ids(hex_id) == [txn]
    assert parse_txn_ids(str(txn)) == [txn]
    assert parse_txn_ids("00000000000000000000000000000005") == [5]  # 32 characters: hex, even all digits
    assert parse_txn_ids({"txn_id": f"{5:032x}"}) == [5]
    assert parse_txn_ids(str(uuid.UUID(int=txn))) == [txn]
    assert parse_txn_ids(f"0x{txn:x}") == [txn]
    assert parse_txn_ids(json.dumps([hex_id, str(txn + 1)])) == [txn, txn + 1]
    assert parse_txn_ids(repr([hex_id, hex_id])) == [txn]  # a rendered Python list; repeats dropped
    info = TransactionInfo("s", "t", txn, ())
    assert parse_txn_ids(info) == [txn] and parse_txn_ids([info.to_dict()]) == [txn]
    for bad, message in (([], "empty"), ("zz", "not 32 hex digits"), (-1, "128-bit"), ({"id": 1}, "txn_id")):
        with pytest.raises(ValueError, match=message):
            parse_txn_ids(bad)
    for bad in (True, 1.5, None):
        with pytest.raises(TypeError, match="transaction id"):
            parse_txn_ids(bad)


def test_sensor_refuses_bad_ids_without_retrying(pravega_conn: None) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_pravega.sensors import PravegaTransactionSensor

    sensor = PravegaTransactionSensor(task_id="bad", scope="s", stream="t", transaction_ids="not-an-id")
    with pytest.raises(AirflowFailException, match="bad transaction_ids"):
        sensor.poke({})


def test_sensor_with_no_transactions_has_nothing_to_wait_for(pravega_conn: None) -> None:
    """An ingest interval whose files were all ingested before commits nothing: its (rendered)
    empty id list must let the DAG go on, in poke and deferrable modes alike."""
    from airflow.sdk import PokeReturnValue

    from airflow_provider_pravega.sensors import PravegaTransactionSensor

    for empty in ([], "[]"):
        sensor = PravegaTransactionSensor(task_id="none", scope="s", stream="t", transaction_ids=empty,
                                          deferrable=True)
        done = sensor.poke({})
        assert isinstance(done, PokeReturnValue) and done.is_done and done.xcom_value == []
        assert sensor.execute({}) == []


def test_a_rendered_missing_xcom_is_refused_naming_transaction_ids(pravega_conn: None) -> None:
    """A template whose XCom is missing renders 'None' (or nothing; None with native rendering):
    not an empty list, so the sensor fails naming the parameter instead of succeeding at once
    (which would let the DAG go on before any commit), without retries."""
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_pravega.sensors import PravegaTransactionSensor

    rows = []
    for missing in ("None", "", None):
        sensor = PravegaTransactionSensor(task_id="wait", scope="s", stream="t", transaction_ids=missing,
                                          deferrable=True)
        for call in (sensor.poke, sensor.execute):
            with pytest.raises(AirflowFailException, match=f"transaction_ids is {re.escape(repr(missing))}, not "
                                                           "transaction ids") as raised:
                call({})
        rows.append((f"`transaction_ids={missing!r}`", f"`AirflowFailException`: {raised.value}"))
    check_section("sensors", "Sensors", "tests/sensors/test_transaction_sensor.py", rows,
                  "Each fails the task at its first poke (in poke, reschedule and deferrable modes), without retries; "
                  "an empty list (`[]`, or its text) is nothing to wait for and succeeds at once.")


def test_ingest_run_of_an_ingest_with_nothing_to_do_is_no_run() -> None:
    """A day without input: the ingest's XCom has no run id and no state location; the sensor has
    nothing to record (it used to fail the run, e.g. the example DAG's catchup of today)."""
    from airflow_provider_pravega.sensors import PravegaTransactionSensor

    nothing = {"bytes": 0, "events": 0, "run_id": None, "state_scope": None, "state_stream": None,
               "transactions": [], "files_ingested": [], "files_skipped": []}
    for rendered in (nothing, repr(nothing), json.dumps(nothing)):
        sensor = PravegaTransactionSensor(task_id="nothing", scope="s", stream="t", transaction_ids=[],
                                          ingest_run=rendered)
        assert sensor._ingest() is None
    with pytest.raises(Exception, match="must be the ingest operator's XCom"):
        PravegaTransactionSensor(task_id="bad", scope="s", stream="t", transaction_ids=[],
                                 ingest_run={"run_id": "run-1"})._ingest()
