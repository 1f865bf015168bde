"""A real Keycloak (started once per test session: its start takes a minute or more) with the
``pravega`` realm of keycloak_realm.json, and an embedded server that accepts that realm's bearer
tokens besides an ``admin`` account's Basic credentials.

The realm's client ``pravega-app`` may create scopes and write scope ``alpha``, and only read
scope ``beta``; its access tokens live 10 s, so renewal is exercised."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.embedded.auth import auth_file_line
from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess
from pravega_testing.keycloak import Keycloak, KeycloakUnavailable, keycloak_server
from security.realm import ADMIN, APP, APP_SECRET, REALM


@pytest.fixture(scope="session")
def keycloak(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keycloak]:
    try:
        with keycloak_server(tmp_path_factory.mktemp("keycloak")) as server:
            server.create_realm(REALM)
            yield server
    except KeycloakUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def keycloak_json(keycloak: Keycloak) -> Callable[..., str]:
    """``keycloak_json(secret=..., **more)``: the keycloak.json of ``pravega-app`` as Keycloak's
    console exports it (more keys make a file of its own, with its own token source)."""

    def make(secret: str = APP_SECRET, **more: Any) -> str:
        return json.dumps({"realm": REALM["realm"], "auth-server-url": keycloak.url, "ssl-required": "none",
                           "resource": APP, "credentials": {"secret": secret}, "confidential-port": 0, **more},
                          indent=2)

    return make


@pytest.fixture(scope="session")
def bearer_server(tmp_path_factory: pytest.TempPathFactory, keycloak: Keycloak) -> Iterator[EmbeddedPravegaProcess]:
    base = tmp_path_factory.mktemp("pravega-bearer")
    auth_file = base / "passwd"
    auth_file.write_text(auth_file_line(ADMIN[0], ADMIN[1], "prn::*,READ_UPDATE") + "\n")
    server = EmbeddedPravegaProcess(base / "data", auth_file=auth_file,
                                    keycloak_realm_url=keycloak.realm_url(REALM["realm"]))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def admin_config(bearer_server: EmbeddedPravegaProcess) -> PravegaConnectionConfig:
    return PravegaConnectionConfig.from_connection_fields(host=bearer_server.controller_uri, login=ADMIN[0],
                                                          password=ADMIN[1])


@pytest.fixture
def bearer_config(bearer_server: EmbeddedPravegaProcess, keycloak_json: Callable[..., str]) -> Callable[..., PravegaConnectionConfig]:
    def make(**json_keys: Any) -> PravegaConnectionConfig:
        return PravegaConnectionConfig.from_connection_fields(
            host=bearer_server.controller_uri, password=keycloak_json(**json_keys), extra={"auth_method": "Bearer"})

    return make


@pytest.fixture
def bearer_connection(monkeypatch: pytest.MonkeyPatch, bearer_server: EmbeddedPravegaProcess,
                      keycloak_json: Callable[..., str]) -> Callable[..., str]:
    """``bearer_connection(conn_id, keycloak=None, host=None, **extra)``: a ``pravega`` connection
    as a deployment defines it (``AIRFLOW_CONN_...``): the keycloak.json as its password (the
    client's, by default), ``auth_method`` Bearer and ``extra``; against the bearer server unless
    ``host`` says. Returns ``conn_id``."""

    def define(conn_id: str, keycloak: str | None = None, host: str | None = None, **extra: Any) -> str:
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({
            "conn_type": "pravega", "host": host or bearer_server.controller_uri,
            "password": keycloak_json() if keycloak is None else keycloak,
            "extra": {"auth_method": "Bearer", **extra}}))
        return conn_id

    return define
