"""The stream trigger and sensor on a connection with Keycloak bearer credentials: each obtains its
token from the connection's keycloak.json, and the trigger keeps polling across a renewal."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import pendulum
import pytest

from airflow_provider_pravega.client import PravegaClient, keycloak
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.protocol.streamcut import streamcut_from_text
from pravega_testing.dag_test import run_dag

from security.realm import WRITABLE

START = pendulum.datetime(2024, 1, 1, tz="UTC")


def bearer_connection(monkeypatch: pytest.MonkeyPatch, server: Any, keycloak_json: str) -> str:
    conn_id = f"pravega_kc_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({
        "conn_type": "pravega", "host": server.controller_uri, "password": keycloak_json,
        "extra": {"auth_method": "Bearer", "scope": WRITABLE}}))
    return conn_id


def write(config: PravegaConnectionConfig, stream: str, payloads: list[bytes]) -> int:
    with PravegaClient(config) as client:
        writer = client.event_writer(WRITABLE, stream)
        for payload in payloads:
            writer.write_event(payload, routing_key="one-key")
        writer.flush()
        writer.close()
    return sum(8 + len(p) for p in payloads)


@pytest.fixture
def stream(bearer_config: Callable[..., PravegaConnectionConfig]) -> str:
    name = f"watched-{uuid.uuid4().hex[:8]}"
    with PravegaClient(bearer_config()) as client:
        client.admin.create_scope(WRITABLE)
        client.admin.create_stream(WRITABLE, name)
    return name


def test_stream_trigger_polls_with_bearer_tokens_across_a_renewal(
        monkeypatch: pytest.MonkeyPatch, bearer_server: Any, keycloak_json: Callable[..., str],
        bearer_config: Callable[..., PravegaConnectionConfig], stream: str) -> None:
    from airflow_provider_pravega.triggers import PravegaStreamTrigger

    text = keycloak_json(**{"trigger-test": uuid.uuid4().hex})  # a token source of its own
    conn_id = bearer_connection(monkeypatch, bearer_server, text)
    config = bearer_config()
    source = keycloak.token_source(PravegaConnectionConfig.from_connection_fields(
        host="h", password=text, extra={"auth_method": "Bearer"}).keycloak_json())
    now = [0.0]
    source.clock = lambda: now[0]
    first_size = write(config, stream, [b"a", b"b", b"c"])
    trigger = PravegaStreamTrigger(stream=stream, pravega_conn_id=conn_id, after_cut="head", poll_interval=0.1)

    async def scenario() -> tuple[Any, Any, int, int]:
        events = trigger.run()
        try:
            first = await asyncio.wait_for(anext(events), 60)
            fetched = source.fetches
            now[0] += 3600  # the RPT the trigger holds is past its renewal time
            second_size = await asyncio.to_thread(write, config, stream, [b"d", b"e"])
            second = await asyncio.wait_for(anext(events), 60)
        finally:
            await events.aclose()
        return first, second, fetched, second_size

    first, second, fetched, second_size = asyncio.run(scenario())
    assert first.payload["status"] == "success" and first.payload["new_bytes"] == first_size
    assert second.payload["status"] == "success" and second.payload["new_bytes"] == second_size
    assert second.payload["previous_cut"] == first.payload["cut"]
    assert fetched >= 1 and source.fetches > fetched  # renewed while polling


def test_stream_sensor_pokes_with_bearer_tokens(
        monkeypatch: pytest.MonkeyPatch, bearer_server: Any, keycloak_json: Callable[..., str],
        bearer_config: Callable[..., PravegaConnectionConfig], stream: str) -> None:
    from airflow.sdk import DAG, task

    from airflow_provider_pravega.sensors import PravegaStreamSensor

    conn_id = bearer_connection(monkeypatch, bearer_server, keycloak_json())
    size = write(bearer_config(), stream, [b"one", b"two"])
    results: dict[str, Any] = {}
    with DAG(f"bearer-sensor-{uuid.uuid4().hex[:8]}", schedule=None, start_date=START) as dag:
        @task
        def keep(value: Any) -> None:
            results["event"] = value

        sensor = PravegaStreamSensor(task_id="poked", stream=stream, pravega_conn_id=conn_id, after_cut="head",
                                     poke_interval=0.2, timeout=30)
        keep(sensor.output)

    dag_run = run_dag(dag)
    states = {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}
    assert states["poked"] == "success", states
    event = results["event"]
    assert event["status"] == "success" and event["new_bytes"] == size
    assert sum(streamcut_from_text(event["cut"]).positions.values()) == size
