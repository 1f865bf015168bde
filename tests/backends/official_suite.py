"""The official ``pravega`` client's own tests, fetched from PyPI at test time (never committed).

Why: the embedded server is judged by what the official client observes, and the client's authors
wrote down what they expect of a Pravega in ``tests/`` of the ``pravega`` source distribution. This
module downloads the sdist of the installed client's version (PEP 691 JSON simple index, checked
against the index's sha256), caches it in ``~/.cache/airflow-provider-pravega/pravega-client-tests``
like the Pravega standalone jars, and extracts only its ``tests/*.py``.

    python tests/backends/official_suite.py fetch     # prints the directory of the extracted tests

Environment: ``PRAVEGA_CLIENT_TESTS_CACHE`` (cache root), ``PIP_INDEX_URL`` (simple index, default
https://pypi.org/simple).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

from airflow_provider_pravega._cache import cache_dir

DIST = "pravega"
# The test files the client's source distribution ships (tests/test.py is a script, not a test module).
TEST_FILES = ("pravega_client_test.py", "pravega_reader_test.py")


class OfficialSuiteError(RuntimeError):
    """The official tests cannot be had here (no such version on the index, no network, bad archive)."""


def client_version() -> str:
    return metadata.version(DIST)


def cache_root() -> Path:
    return cache_dir("pravega-client-tests", "PRAVEGA_CLIENT_TESTS_CACHE")


def tests_dir(version: str | None = None, root: Path | None = None) -> Path:
    return (root or cache_root()) / (version or client_version()) / "tests"


def is_fetched(version: str | None = None, root: Path | None = None) -> bool:
    d = tests_dir(version, root)
    return all((d / name).is_file() for name in TEST_FILES)


def _index_url() -> str:
    return (os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip("/")


def _get(url: str, accept: str | None = None, timeout: float = 60.0) -> bytes:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - https index URL
            return resp.read()
    except OSError as exc:
        raise OfficialSuiteError(f"cannot download {url}: {exc}") from exc


def sdist_location(version: str) -> tuple[str, str]:
    """(URL, sha256) of ``pravega-<version>.tar.gz`` from the index's JSON simple API (PEP 691)."""
    index = f"{_index_url()}/{DIST}/"
    try:
        listing = json.loads(_get(index, "application/vnd.pypi.simple.v1+json"))
    except ValueError as exc:
        raise OfficialSuiteError(f"{index} did not answer JSON (PEP 691): {exc}") from exc
    wanted = f"{DIST}-{version}.tar.gz"
    for f in listing.get("files", []):
        if f.get("filename") == wanted:
            sha = f.get("hashes", {}).get("sha256")
            if not sha:
                raise OfficialSuiteError(f"{index} gives no sha256 for {wanted}")
            return f["url"], sha
    raise OfficialSuiteError(f"{index} lists no source distribution {wanted}")


def fetch(version: str | None = None, root: Path | None = None) -> Path:
    """Extract the official tests of ``version`` (default: the installed client's) into the cache."""
    version = version or client_version()
    target = tests_dir(version, root)
    if is_fetched(version, root):
        return target
    url, sha = sdist_location(version)
    data = _get(url, timeout=120.0)
    got = hashlib.sha256(data).hexdigest()
    if got != sha:
        raise OfficialSuiteError(f"{url}: sha256 {got}, the index says {sha}")
    prefix = f"{DIST}-{version}/tests/"
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar.getmembers():
                name = member.name[len(prefix):] if member.name.startswith(prefix) else None
                # only plain files directly in tests/ (no paths, links or devices from the archive)
                if name in TEST_FILES and member.isfile():
                    found[name] = tar.extractfile(member).read()  # type: ignore[union-attr]
    except tarfile.TarError as exc:
        raise OfficialSuiteError(f"{url} is not a readable .tar.gz: {exc}") from exc
    missing = sorted(set(TEST_FILES) - set(found))
    if missing:
        raise OfficialSuiteError(f"{url} has no {', '.join(prefix + m for m in missing)}")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tests-", dir=target.parent))
    for name, body in found.items():
        (staging / name).write_bytes(body)
    (staging / "SOURCE.json").write_text(json.dumps({"url": url, "sha256": sha}) + "\n")
    try:
        staging.rename(target)  # atomic: a parallel fetch that won leaves its complete copy
    except OSError:
        if not is_fetched(version, root):
            raise
        for p in staging.iterdir():
            p.unlink()
        staging.rmdir()
    return target


SUBPROCESS_TIMEOUT_S = 600


def run_suite(suite: Path, target: str, work: Path) -> dict[str, tuple[str, str]]:
    """Run both official test modules once in a subprocess pytest against ``target`` (a controller
    URI, or ``fresh-embedded`` for a new embedded server per test): {official test: (outcome, details)}."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "pytest.ini").write_text("[pytest]\n")
    junit = work / "results.xml"
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent)  # official_plugin.py
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    env["PRAVEGA_OFFICIAL_URI"] = target
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-c", str(work / "pytest.ini"), "--rootdir", str(suite),
           "-p", "official_plugin", "-p", "no:cacheprovider", f"--junitxml={junit}", "-q", "-rA",
           *(str(suite / name) for name in TEST_FILES)]
    try:
        done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        raise OfficialSuiteError(f"official suite still running after {SUBPROCESS_TIMEOUT_S} s against {target}; "
                                 f"output so far:\n{out[-4000:]}") from None
    if not junit.exists():
        raise OfficialSuiteError(f"official suite wrote no results (exit {done.returncode}):\n"
                                 f"{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
    results: dict[str, tuple[str, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module, cls = case.get("classname", "").rsplit(".", 1)
        key = f"{module.rsplit('.', 1)[-1]}.py::{cls}::{case.get('name')}"
        outcome, details = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                details = f"{child.get('message', '')}\n{child.text or ''}"
                break
        out = "".join(f"\n--- {c.tag}\n{c.text}" for c in case if c.tag in ("system-out", "system-err") and c.text)
        results[key] = (outcome, details + out)
    return results


if __name__ == "__main__":
    if sys.argv[1:] != ["fetch"]:
        sys.exit(f"usage: {sys.argv[0]} fetch")
    try:
        print(fetch())
    except OfficialSuiteError as exc:
        sys.exit(f"official_suite: {exc}")
