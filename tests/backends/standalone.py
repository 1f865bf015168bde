"""Real Pravega standalone (Maven Central) as a test backend: availability check and a context manager.

Why: tests that only ever talk to our embedded server can pass while real Pravega would fail, so
backend-neutral tests also run against the real thing. The heavy lifting (resolving jars, choosing
loopback ports, starting, readiness, stopping) lives in scripts/pravega_standalone.py; this module
loads that script so there is one implementation for the command line and for pytest.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pravega_standalone.py"


def _load_script() -> ModuleType:
    name = "airflow_provider_pravega_scripts_pravega_standalone"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _SCRIPT)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {_SCRIPT}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses need the module registered while it executes
    spec.loader.exec_module(module)
    return module


script = _load_script()
StandaloneError = script.StandaloneError
DEFAULT_VERSION: str = script.DEFAULT_VERSION

# PRAVEGA_STANDALONE=0 (or off/false/no) switches the backend off, e.g. on a machine without Maven.
_DISABLED = {"0", "off", "false", "no"}


@functools.cache
def standalone_available(version: str = DEFAULT_VERSION) -> tuple[bool, str]:
    """Whether Pravega standalone can run here, and why not.

    Fast when the jars are cached (only a Java check); otherwise asks Maven for the
    pravega-standalone pom, which proves the registry (or a configured mirror) is reachable.
    """
    if os.environ.get("PRAVEGA_STANDALONE", "").strip().lower() in _DISABLED:
        return False, "Pravega standalone disabled by PRAVEGA_STANDALONE"
    try:
        java, major = script.find_java(17)
    except StandaloneError as exc:
        return False, f"Pravega standalone needs Java 17: {exc}"
    if script.is_fetched(version):
        return True, f"pravega-standalone {version} cached in {script.version_dir(version)}; {java} (Java {major})"
    ok, reason = script.maven_reachable(version)
    if not ok:
        return False, f"pravega-standalone {version} not cached and {reason}"
    return True, f"pravega-standalone {version} resolvable with Maven; {java} (Java {major})"


class PravegaStandalone:
    """Start real Pravega standalone on free loopback ports; `with` yields the controller URI.

    cache_dir is the jar cache root (default: $PRAVEGA_STANDALONE_CACHE or
    ~/.cache/airflow-provider-pravega/pravega-standalone); work_dir holds config, logs,
    ZooKeeper's files and, with storage="filesystem" (default), the segment data (default: a
    fresh temporary directory, removed afterwards unless keep_work_dir). The JVM is tied to this
    process: if the test run dies, so does Pravega.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike | None = None,
        work_dir: str | os.PathLike | None = None,
        controller_port: int = 0,
        segment_store_port: int = 0,
        version: str = DEFAULT_VERSION,
        heap_mb: int = script.DEFAULT_HEAP_MB,
        direct_mb: int = script.DEFAULT_DIRECT_MB,
        ready_timeout: float = script.DEFAULT_READY_TIMEOUT,
        keep_work_dir: bool = False,
        storage: str = "filesystem",
    ) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self._own_work_dir = work_dir is None
        self.work_dir = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="pravega-standalone-"))
        self.controller_port = controller_port
        self.segment_store_port = segment_store_port
        self.version = version
        self.heap_mb = heap_mb
        self.direct_mb = direct_mb
        self.ready_timeout = ready_timeout
        self.keep_work_dir = keep_work_dir
        self.storage = storage
        self.state = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> str:
        if self.state is not None:
            raise StandaloneError(f"already started: {self.controller_uri}")
        self.state = script.start(
            self.work_dir,
            version=self.version,
            root=self.cache_dir,
            controller_port=self.controller_port,
            segment_store_port=self.segment_store_port,
            heap_mb=self.heap_mb,
            direct_mb=self.direct_mb,
            ready_timeout=self.ready_timeout,
            die_with_parent=True,
            storage=self.storage,
        )
        return self.state.controller_uri

    def stop(self) -> str:
        if self.state is None:
            return "not started"
        try:
            return script.stop(self.work_dir)
        finally:
            self.state = None
            if self._own_work_dir and not self.keep_work_dir:
                shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- what tests may want to know ---------------------------------------------------------

    def _require_state(self):
        if self.state is None:
            raise StandaloneError("Pravega standalone is not running")
        return self.state

    @property
    def controller_uri(self) -> str:
        return self._require_state().controller_uri

    @property
    def segment_store_address(self) -> tuple[str, int]:
        host, port = self._require_state().segment_store.rsplit(":", 1)
        return host, int(port)

    @property
    def pid(self) -> int:
        return self._require_state().pid

    @property
    def ready_seconds(self) -> float | None:
        return self._require_state().ready_seconds

    @property
    def notes(self) -> dict:
        return self._require_state().notes

    def rss_kib(self) -> int | None:
        return script.rss_kib(self.pid)

    def listening(self) -> list[tuple[str, int]]:
        return script.listening_addresses(self.pid)

    def log_path(self) -> Path:
        return self.work_dir / script.LOG_FILE
