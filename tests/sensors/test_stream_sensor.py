"""PravegaStreamSensor through ``dag.test()`` against the embedded server: deferred until events are
written, poke mode with a cut from XCom, timeout while deferred, and a sealed stream; its pokes
with min_bytes, and the batching it hands to its trigger."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pendulum
import pytest
from pravega_clients import stream_writer

from airflow_provider_pravega._streams import cut_text
from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.protocol.streamcut import streamcut_from_text
from pravega_testing.dag_test import run_dag

START = pendulum.datetime(2024, 1, 1, tz="UTC")


def write_events(controller_uri: str, scope: str, stream: str, count: int, *, atomic: bool = False) -> int:
    """Write ``count`` events; ``atomic`` writes them in one transaction under one routing key, so a
    sensor polling meanwhile sees all of them or none (one segment, one merge at commit)."""
    payloads = [f"sensor-event-{i}" for i in range(count)]
    if atomic:
        with PravegaClient(controller_uri) as own:
            txn = own.transactions.begin(scope, stream)
            with own.transactions.writer(scope, stream, txn) as txn_writer:
                for payload in payloads:
                    txn_writer.write_event(payload.encode(), routing_key="one-key")
            own.transactions.commit(scope, stream, txn.txn_id)
    else:
        writer = stream_writer(controller_uri, scope, stream)
        for i, payload in enumerate(payloads):
            writer.write_event(payload, routing_key=f"k{i}")
        writer.flush()
    return sum(8 + len(payload) for payload in payloads)


def test_stream_sensor_modes(
    pravega_conn: None, pravega_controller_uri: str, client: PravegaClient, unique_name: Callable[[str], str],
    task_errors: dict[str, BaseException],
) -> None:
    from airflow.sdk import DAG, task

    from airflow_provider_pravega.sensors import PravegaStreamSensor

    scope = unique_name("sns")
    client.admin.create_scope(scope)
    streams = {name: unique_name(name) for name in ("deferred", "xcom", "quiet", "sealed")}
    for stream in streams.values():
        client.admin.create_stream(scope, stream, 2)
    client.admin.seal_stream(scope, streams["sealed"])
    written: dict[str, int] = {}
    results: dict[str, Any] = {}
    common: dict[str, Any] = {"scope": scope, "poke_interval": 0.2, "timeout": 30}

    with DAG(unique_name("stream-sensor"), schedule=None, start_date=START) as dag:

        @task
        def write_later() -> None:
            """Events arrive 2 s after the deferred sensor starts waiting."""
            def write() -> None:
                # atomic: the sensor may poll between two appends of a plain writer and see part of them
                written["deferred"] = write_events(pravega_controller_uri, scope, streams["deferred"], 5, atomic=True)

            threading.Timer(2.0, write).start()

        @task
        def cut_then_write() -> str:
            with PravegaClient(pravega_controller_uri) as c:
                cut = cut_text(scope, streams["xcom"], c.admin.tail(scope, streams["xcom"]))
            written["xcom"] = write_events(pravega_controller_uri, scope, streams["xcom"], 3)
            return cut

        @task
        def keep(name: str, value: Any) -> None:
            results[name] = value

        # after_cut="head" (the empty stream's start), not the default tail-at-start: on a loaded
        # machine the sensor may start after the delayed write, and must still count those events.
        deferred = PravegaStreamSensor(task_id="deferred", stream=streams["deferred"], after_cut="head",
                                       deferrable=True, **common)
        write_later() >> deferred
        keep("deferred", deferred.output)
        from_xcom = PravegaStreamSensor(
            task_id="from_xcom", stream=streams["xcom"], after_cut="{{ ti.xcom_pull(task_ids='cut_then_write') }}",
            mode="reschedule", **common,
        )
        cut_then_write() >> from_xcom
        keep("from_xcom", from_xcom.output)
        PravegaStreamSensor(task_id="quiet", stream=streams["quiet"], deferrable=True, **{**common, "timeout": 1.5})
        PravegaStreamSensor(task_id="sealed", stream=streams["sealed"], **common)

    dag_run = run_dag(dag)
    errors = {task_id: (type(exc).__name__, str(exc)) for task_id, exc in task_errors.items()}
    got = {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}
    assert got["deferred"] == "success" and got["from_xcom"] == "success", (got, errors)
    assert got["quiet"] == "failed" and got["sealed"] == "failed", (got, errors)

    deferred_event = results["deferred"]
    assert deferred_event["status"] == "success" and deferred_event["new_bytes"] == written["deferred"]
    assert sum(streamcut_from_text(deferred_event["previous_cut"]).positions.values()) == 0
    assert client.admin.tail(scope, streams["deferred"]) == streamcut_from_text(deferred_event["cut"]).positions

    assert results["from_xcom"]["new_bytes"] == written["xcom"]

    assert errors["quiet"][0] == "AirflowSensorTimeout" and streams["quiet"] in errors["quiet"][1]
    assert errors["sealed"][0] == "AirflowFailException" and "sealed" in errors["sealed"][1]


def test_reschedule_mode_needs_a_fixed_cut_and_no_max_wait() -> None:
    from airflow_provider_pravega.sensors import PravegaStreamSensor

    with pytest.raises(ValueError, match="reschedule mode"):
        PravegaStreamSensor(task_id="s", stream="x", mode="reschedule")
    with pytest.raises(ValueError, match="max_wait_s cannot be used in reschedule mode"):
        PravegaStreamSensor(task_id="s", stream="x", after_cut="head", mode="reschedule", min_bytes=10, max_wait_s=5)
    with pytest.raises(TypeError, match="min_bytes must be an integer"):
        PravegaStreamSensor(task_id="s", stream="x", min_bytes="1k")


def test_stream_sensor_pokes_until_min_bytes_and_defers_with_its_batching(
    pravega_conn: None, pravega_controller_uri: str, client: PravegaClient, unique_name: Callable[[str], str]
) -> None:
    """Pokes wait below min_bytes and succeed at it; a sealed stream ends the wait with what it
    holds (nothing more can arrive); the deferred trigger gets the same batching."""
    from airflow_provider_pravega.sensors import PravegaStreamSensor

    scope, stream = unique_name("sns"), unique_name("batch")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 1)
    one = write_events(pravega_controller_uri, scope, stream, 2)
    sensor = PravegaStreamSensor(task_id="batch", scope=scope, stream=stream, after_cut="head", min_bytes=2 * one,
                                 max_wait_s=600)
    assert sensor.poke({}) is False
    two = write_events(pravega_controller_uri, scope, stream, 2)
    done = sensor.poke({})
    assert done and done.xcom_value["new_bytes"] == one + two
    assert sum(streamcut_from_text(done.xcom_value["previous_cut"]).positions.values()) == 0

    kwargs = sensor.deferred_trigger().serialize()[1]
    assert (kwargs["min_bytes"], kwargs["min_events"], kwargs["max_wait_s"]) == (2 * one, 0, 600.0)

    client.admin.seal_stream(scope, stream)
    sealed = PravegaStreamSensor(task_id="sealed", scope=scope, stream=stream, after_cut="head", min_events=100)
    done = sealed.poke({})
    assert done and done.xcom_value["new_events"] == 4 and done.xcom_value["new_bytes"] == one + two
