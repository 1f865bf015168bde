"""A real Airflow api-server and a headless Chromium for the UI tests.

Nothing is installed here: ``scripts/bootstrap.sh --with-browser`` (which ``scripts/test`` runs)
installs Debian's ``chromium`` (as root) and the ``test`` extra brings the ``playwright`` package. When either is missing the tests skip and say how to
get it. Everything binds to 127.0.0.1, every wait is bounded, and the server is stopped afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pravega_testing.net import free_port

CHROMIUM = os.environ.get("PRAVEGA_UI_CHROMIUM", "/usr/bin/chromium")
# The flags that let Debian's Chromium run headless as root on a machine without internet access:
# without the background-networking ones it keeps trying (and failing) to reach Google's hosts.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MIGRATE_TIMEOUT_S = 120
SERVER_START_TIMEOUT_S = 90
SERVER_STOP_TIMEOUT_S = 20


@dataclass(frozen=True)
class ApiServer:
    """A running ``airflow api-server`` and the credentials of its one admin user."""

    base_url: str
    username: str
    password: str
    home: Path
    log: Path

    def token(self) -> str:
        """A JWT for the REST API, from the simple auth manager's login endpoint."""
        body = self.request("POST", "/auth/token", {"username": self.username, "password": self.password},
                            token=None)
        return body["access_token"]

    def request(self, method: str, path: str, payload: Any = None, token: str | None = "") -> Any:
        """One JSON request to the server (``token=""`` logs in first; ``None`` sends no token)."""
        if token == "":
            token = self.token()
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{method} {path} answered {e.code}: {e.read()[:500]!r}") from e



def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _airflow_env(home: Path, port: int, password_file: Path) -> dict[str, str]:
    """The environment of the ``airflow`` subprocesses: their own home, SQLite DB and simple auth.

    The api-server gets its own AIRFLOW_HOME (not the test run's shared one) so that its SQLite
    database is never written by two processes that other tests also use.
    """
    env = dict(os.environ)
    for key in ("AIRFLOW_CONFIG", "AIRFLOW__API__BASE_URL"):
        env.pop(key, None)
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
        # Airflow 3's default auth manager with one real admin user and a password we chose
        # (rather than all-admins mode), so the test logs in through the UI like a user does.
        AIRFLOW__CORE__AUTH_MANAGER="airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="False",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(password_file),
        AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_urlsafe(64),
        AIRFLOW__API__HOST="127.0.0.1",
        AIRFLOW__API__PORT=str(port),
    )
    return env


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (uvicorn runs workers), then SIGKILL after a bounded wait."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, SERVER_STOP_TIMEOUT_S), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def airflow_api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """``airflow db migrate`` then ``airflow api-server`` on 127.0.0.1:<free port>, until it serves."""
    home = tmp_path_factory.mktemp("ui-airflow-home")
    (home / "dags").mkdir()
    username, password = "admin", secrets.token_urlsafe(16)
    password_file = home / "simple_auth_manager_passwords.json"
    password_file.write_text(json.dumps({username: password}))
    port = free_port()
    env = _airflow_env(home, port, password_file)
    airflow = [sys.executable, "-m", "airflow"]

    migrate = subprocess.run([*airflow, "db", "migrate"], env=env, cwd=home, capture_output=True, text=True,
                             timeout=MIGRATE_TIMEOUT_S)
    assert migrate.returncode == 0, f"airflow db migrate failed:\n{migrate.stdout[-3000:]}\n{migrate.stderr[-3000:]}"

    log = home / "api-server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*airflow, "api-server", "--host", "127.0.0.1", "--port", str(port),
                                 "--workers", "1"],
                                env=env, cwd=home, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = ApiServer(f"http://127.0.0.1:{port}", username, password, home, log)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"airflow api-server exited with {proc.returncode} before serving:\n{_tail(log)}")
            try:
                with urllib.request.urlopen(server.base_url + "/api/v2/monitor/health", timeout=5) as resp:
                    if json.loads(resp.read())["metadatabase"]["status"] == "healthy":
                        break
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"airflow api-server did not serve within {SERVER_START_TIMEOUT_S}s:\n{_tail(log)}")
            time.sleep(1)
        yield server
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def chromium_executable() -> str:
    """Debian's Chromium (and the playwright package), or a skip naming how to install them.

    Tests request this before the api-server so that a machine without a browser skips at once.
    """
    reason = chromium_missing()
    if reason:
        pytest.skip(reason)
    return CHROMIUM


def chromium_missing() -> str | None:
    """Why the UI tests cannot drive a browser here (None: they can). Also used by the topology test."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return (f"no Chromium at {CHROMIUM}: run scripts/bootstrap.sh as root, or "
                "'apt-get install -y chromium' (or set PRAVEGA_UI_CHROMIUM to a Chromium binary)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the 'playwright' package is missing: pip install -e '.[test]' (scripts/bootstrap.sh does it)"
    return None


@contextlib.contextmanager
def chromium_page(executable: str, profile: Path) -> Iterator[Any]:
    """A Playwright page in headless Chromium with ``profile`` as its (fresh) profile directory."""
    from playwright import sync_api

    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=executable, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 1400}, timeout=60_000,
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(30_000)
            page.set_default_navigation_timeout(60_000)
            yield page
        finally:
            context.close()
    shutil.rmtree(profile, ignore_errors=True)


def ui_login(page: Any, url: str, username: str, password: str) -> None:
    """Open ``url``, log in on the simple auth manager's form it redirects to, and land on ``url``."""
    import re
    from urllib.parse import urlsplit

    page.goto(url)
    page.locator("input[name=username]").fill(username)
    page.locator("input[name=password]").fill(password)
    page.locator("button[type=submit]").click()
    page.wait_for_url(re.compile(re.escape(urlsplit(url).path) + "$"))


@pytest.fixture
def browser_page(chromium_executable: str, tmp_path: Path) -> Iterator[Any]:
    """A Playwright page in headless Chromium with a fresh, empty profile directory."""
    with chromium_page(chromium_executable, tmp_path / "chromium-profile") as page:
        yield page
