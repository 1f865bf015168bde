"""A bearer token that expires in the middle of a Spark ingest: the job's write task is held by the
test harness's fault hook (``task_mid_write``: events appended in its open transaction, none
committed) until every token the job's processes held has expired; once released, the job renews
its tokens and commits every line exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_ranges
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.keycloak import KeycloakClientSettings, KeycloakTokenSource
from airflow_provider_pravega.client.streamcut import StreamCut
from pravega_testing.faults import fault_env
from pravega_testing.keycloak import Keycloak
from pravega_testing.wait import wait_until

from held_jobs import kill_if_running, release, wait_until_held
from security.realm import APP, APP_SECRET, REALM, WRITABLE

#: What the embedded server logs when it refuses a call for an expired bearer token.
EXPIRED_REFUSAL = "refused: bearer token expired"


@pytest.fixture
def client_logins(keycloak: Keycloak) -> Iterator[Callable[[], list[int]]]:
    """``client_logins()``: when (epoch ms) Keycloak granted pravega-app a token, from the realm's
    events, recorded while the test runs (the realm's event settings are put back afterwards)."""
    base = f"{keycloak.url}/admin/realms/{REALM['realm']}"

    def admin() -> dict[str, str]:
        return {"authorization": "Bearer " + keycloak.admin_token()}

    saved = httpx.get(f"{base}/events/config", headers=admin(), timeout=30).raise_for_status().json()
    httpx.put(f"{base}/events/config", headers=admin(), timeout=30, json={
        **saved, "eventsEnabled": True, "enabledEventTypes": ["CLIENT_LOGIN"]}).raise_for_status()

    def logins() -> list[int]:
        answer = httpx.get(f"{base}/events", headers=admin(), timeout=30,
                           params={"type": "CLIENT_LOGIN", "client": APP, "max": 10000})
        return sorted(int(e["time"]) for e in answer.raise_for_status().json())

    try:
        yield logins
    finally:
        httpx.put(f"{base}/events/config", headers=admin(), timeout=30, json=saved).raise_for_status()


def test_a_token_expiring_while_a_spark_task_writes_is_renewed_and_every_line_lands_once(
    tmp_path: Path, bearer_server: Any, keycloak_json: Callable[..., str], admin_config: PravegaConnectionConfig,
    client_logins: Callable[[], list[int]],
) -> None:
    stream = f"expiring-{uuid.uuid4().hex[:8]}"
    source = tmp_path / "in"
    source.mkdir()
    lines = [json.dumps({"sensor_id": f"s{n % 4}", "n": n}) for n in range(200)]
    (source / "a.jsonl").write_text("\n".join(lines[:100]) + "\n")
    (source / "b.jsonl").write_text("\n".join(lines[100:]) + "\n")
    with PravegaClient(admin_config) as admin:
        admin.admin.create_scope(WRITABLE)
    held = tmp_path / "held"
    held.mkdir()
    server_log = bearer_server.data_dir / "server.log"
    refusals_before = server_log.read_text(errors="replace").count(EXPIRED_REFUSAL)
    # One writer: one task, held after its first file's events were appended, before its second.
    env = {**fault_env(hold_at="task_mid_write", hold_dir=held), "PYSPARK_PYTHON": sys.executable,
           "PRAVEGA_PASSWORD": json.dumps(json.loads(keycloak_json()))}
    job = subprocess.Popen(
        [sys.executable, "-m", "airflow_provider_pravega.spark.ingest_job", "--controller-uri",
         bearer_server.controller_uri, "--auth-method", "Bearer", "--scope", WRITABLE, "--stream", stream,
         "--source", str(source), "--routing-key-field", "sensor_id", "--create-stream", "--segments", "2",
         "--num-writers", "1", "--master", "local[2,4]"],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_until_held(job, held, "the middle of its write task")
        # A token Keycloak issues now expires no earlier than any the job obtained before it was held.
        probe = KeycloakTokenSource(KeycloakClientSettings.parse(keycloak_json())).token()
        expires = jwt.decode(probe, options={"verify_signature": False})["exp"]
        wait_until("every token the held job obtained to expire", lambda: time.time() > expires + 1,
                   REALM["accessTokenLifespan"] + 60, poll_s=0.5)
        released_ms = time.time() * 1000
        out, err = release(job, held)
    finally:
        kill_if_running(job)
    assert job.returncode == 0, err[-3000:]
    assert "fault injection: holding at task_mid_write" in err, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["events"] == len(lines), summary

    # Its calls after the hold went with new tokens, obtained before any was sent expired.
    assert [t for t in client_logins() if t > released_ms], "no token was obtained after the held ones expired"
    assert server_log.read_text(errors="replace").count(EXPIRED_REFUSAL) == refusals_before
    with PravegaClient(admin_config) as admin:
        ranges = plan_segment_ranges(admin, StreamCut.head(admin, WRITABLE, stream),
                                     StreamCut.tail(admin, WRITABLE, stream))
        events = [e.payload.decode() for e in read_segment_ranges(admin, ranges)]
    assert Counter(events) == Counter(lines)
    assert APP_SECRET not in out + err
