"""At DEBUG level, ``airflow dags test`` of the example ingest DAG against a server with
authentication shows no secret sent by this provider.

Airflow's in-process test supervisor logs every value sent to the secrets masker in the clear at
DEBUG (``Sending request msg=MaskSecret(value=…)``); Airflow itself sends the connection's
password once per connection retrieval. The provider must add nothing to that: no second copy of
the password, and never the base64 ``user:password`` of the Basic header.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def test_dags_test_at_debug_level_logs_no_secret_of_the_provider(
    tmp_path: Path, fresh_airflow_env: dict[str, str], pravega_secure_embedded_factory: Any
) -> None:
    server = pravega_secure_embedded_factory(tls=False)
    password = server.passwords["admin"]
    basic = base64.b64encode(f"admin:{password}".encode()).decode()
    host, port = server.controller_uri.rsplit("//", 1)[1].rsplit(":", 1)
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(REPO / "scripts" / "generate_sample_data.py"), "--out", str(data / "incoming"),
                    "--days", "1", "--files-per-day", "1", "--events-per-file", "20"], check=True, capture_output=True)
    env = {k: v for k, v in fresh_airflow_env.items() if not k.startswith("pravega_client_")}
    env.update(
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        AIRFLOW__LOGGING__LOGGING_LEVEL="DEBUG",
        AIRFLOW_CONN_PRAVEGA_DEFAULT=json.dumps({"conn_type": "pravega", "host": host, "port": int(port),
                                                 "login": "admin", "password": password}),
        PRAVEGA_EXAMPLES_DATA=str(data),
    )
    migrate = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, capture_output=True,
                             text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    done = subprocess.run([sys.executable, "-m", "airflow", "dags", "test", "pravega_exactly_once_ingest",
                           "2026-11-01"], env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    assert "ingested 1 file(s), skipped 0, 20 events" in output  # the DAG did its work, with credentials

    # Never the Basic header's base64 (only this provider builds it).
    assert basic not in output
    # The password only where Airflow itself masks it: the MaskSecret that Airflow's get_connection
    # sends right before it logs "Connection Retrieved" (a second copy from the provider would follow
    # that line instead).
    lines = output.splitlines()
    leaks = [n for n, line in enumerate(lines) if password in line]
    assert len(leaks) >= 4  # every Pravega task fetched the connection (and Airflow masked it)
    for n in leaks:
        assert "Sending request" in lines[n] and "MaskSecret(value=" in lines[n], lines[n]
        assert any("Connection Retrieved 'pravega_default'" in line for line in lines[n + 1:n + 4]), (
            "a password sent to the masker other than by Airflow's connection retrieval:\n"
            + "\n".join(lines[max(0, n - 3):n + 4]))
