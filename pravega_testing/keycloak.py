"""A real Keycloak for tests: ``org.keycloak:keycloak-quarkus-dist`` from Maven Central, fetched by
Maven into the project's cache the first time (about 170 MB), unpacked there, and started in dev
mode on a free loopback port; a test's realm is created through the admin REST API. Keycloak 26 needs Java 21 or
newer: the newest JDK found is used (``KEYCLOAK_JAVA_HOME`` overrides)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from airflow_provider_pravega._cache import cache_dir
from pravega_testing.net import free_port
from pravega_testing.spark_connect import stop_group
from pravega_testing.wait import wait_until

#: The newest keycloak-quarkus-dist Maven Central serves that these tests were run with.
VERSION = "26.7.3"
_JDKS = ("/usr/lib/jvm/temurin-25-jdk-amd64", "/usr/lib/jvm/java-25-openjdk-amd64", "/usr/lib/jvm/java-21-openjdk-amd64")


class KeycloakUnavailable(RuntimeError):
    """No Java 21+ or Maven, or Maven Central refused: the Keycloak tests skip with this reason."""


def java_home() -> Path:
    """A JDK that runs Keycloak 26 (Java 21+)."""
    candidates = [os.environ["KEYCLOAK_JAVA_HOME"]] if os.environ.get("KEYCLOAK_JAVA_HOME") else list(_JDKS)
    for candidate in candidates:
        if (Path(candidate) / "bin" / "java").exists():
            return Path(candidate)
    raise KeycloakUnavailable(f"Keycloak {VERSION} needs Java 21 or newer; none of {', '.join(candidates)} exists")


def distribution(version: str = VERSION) -> Path:
    """The unpacked Keycloak distribution in the cache (fetched by Maven and unpacked when missing)."""
    root = cache_dir("keycloak")
    home = root / f"keycloak-{version}"
    if (home / "bin" / "kc.sh").exists():
        return home
    archive = root / f"keycloak-quarkus-dist-{version}.tar.gz"
    if not archive.exists():
        mvn = shutil.which("mvn")
        if not mvn:
            raise KeycloakUnavailable("fetching Keycloak needs mvn on PATH")
        root.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [mvn, "-B", "-q", "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy",
             f"-Dartifact=org.keycloak:keycloak-quarkus-dist:{version}:tar.gz", f"-DoutputDirectory={root}"],
            capture_output=True, text=True, timeout=900)
        if done.returncode != 0 or not archive.exists():
            raise KeycloakUnavailable(f"maven could not fetch keycloak-quarkus-dist {version}: "
                                      f"{(done.stdout + done.stderr)[-800:]}")
    unpacking = Path(tempfile.mkdtemp(prefix="unpacking-", dir=root))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(unpacking, filter="tar")
        (unpacking / f"keycloak-{version}").rename(home)  # atomic: a half-unpacked tree is never used
    finally:
        shutil.rmtree(unpacking, ignore_errors=True)
    return home


@dataclass
class Keycloak:
    """A running Keycloak: ``url`` is ``http://127.0.0.1:<port>``; ``admin`` its bootstrap admin."""

    url: str
    process: subprocess.Popen
    log: Path
    admin: tuple[str, str] = ("admin", "admin")

    def realm_url(self, realm: str) -> str:
        return f"{self.url}/realms/{realm}"

    def admin_token(self) -> str:
        answer = httpx.post(f"{self.realm_url('master')}/protocol/openid-connect/token", timeout=30, data={
            "grant_type": "password", "client_id": "admin-cli", "username": self.admin[0], "password": self.admin[1]})
        answer.raise_for_status()
        return str(answer.json()["access_token"])

    def create_realm(self, representation: dict) -> str:
        """Create a realm (clients, service accounts, authorization settings) through the admin REST
        API, as an import would; its URL."""
        answer = httpx.post(f"{self.url}/admin/realms", json=representation, timeout=120,
                            headers={"authorization": "Bearer " + self.admin_token()})
        if answer.status_code != 201:
            raise RuntimeError(f"Keycloak refused realm {representation.get('realm')!r}: "
                               f"HTTP {answer.status_code} {answer.text[:500]}")
        return self.realm_url(representation["realm"])


@contextmanager
def keycloak_server(work: Path, *, version: str = VERSION, timeout_s: float = 300.0) -> Iterator[Keycloak]:
    """Keycloak in dev mode (in-memory database) on a free loopback port; stopped (its whole
    process group) on exit. Realms are created by :meth:`Keycloak.create_realm`. The first start
    of a distribution builds it for these options first: it gets twice ``timeout_s`` or more."""
    home = distribution(version)
    built = home / "lib" / "built-for-pravega-tests"
    if not built.exists():
        timeout_s = max(2 * timeout_s, 900.0)
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = work / "keycloak.log"
    env = {**os.environ, "JAVA_HOME": str(java_home()), "JAVA_OPTS_KC_HEAP": "-Xms64m -Xmx512m",
           "KC_BOOTSTRAP_ADMIN_USERNAME": "admin", "KC_BOOTSTRAP_ADMIN_PASSWORD": "admin"}
    # --db=dev-mem: nothing of one run is left for the next. A build option: the first start with it
    # rebuilds the distribution in the cache (a minute), later starts reuse that build.
    cmd = [str(home / "bin" / "kc.sh"), "start-dev", "--db=dev-mem", "--http-host=127.0.0.1", f"--http-port={port}"]
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, start_new_session=True)
    server = Keycloak(f"http://127.0.0.1:{port}", process, log)

    def serving() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"Keycloak exited ({process.returncode}): {log.read_text(errors='replace')[-3000:]}")
        try:
            return httpx.get(f"{server.realm_url('master')}/.well-known/openid-configuration", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until("Keycloak to serve its master realm", serving, timeout_s, poll_s=0.5,
                   details=lambda: log.read_text(errors="replace")[-3000:])
        built.touch()
        yield server
    finally:
        stop_group(process.pid, reap=process.poll)
        process.wait()
