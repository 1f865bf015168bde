"""One place that decides how the provider gets a SparkSession.

The task's ``spark_conn_id`` names one of the Spark provider's connections:

* ``spark`` (``spark_default``): the host is the master, such as ``spark://master:7077``, ``yarn``,
  ``k8s://…`` or ``local[4]``; extra ``{"conf": {...}}`` adds Spark settings;
* ``spark_connect``: a Spark Connect server (``sc://host:15002``, user id, token and ``use_ssl`` as
  the Spark provider's ``SparkConnectHook`` builds the URL).

Without a connection id, or when ``spark_default`` does not exist, the job runs in local mode on
every core; any other connection id that does not exist is an error (a typo must not silently run
the job on the Airflow worker). Local mode is given task retries (``local[N,4]``) so that a crashed
task attempt is retried as it would be on a cluster.

A session already active in the process (``dag.test()``, a notebook, the tests) is reused only when
it is what the task asks for: another master or a different value of a setting the task names is
an error naming the settings, never a silent mismatch (Spark cannot change most settings of a
running session). Under a scheduler every task runs in its own process, so this never happens there.

Logs: the driver's JVM (started here, in the task's process) writes log4j lines to its stderr, which
Airflow's task supervisor would record at ERROR level, INFO and WARN alike. The JVM is therefore
started with its stderr on a pipe that a thread relays to the ``airflow_provider_pravega.spark.jvm``
logger at each line's own level (:func:`jvm_log_level`); py4j's per-connection INFO chatter
("Closing down clientserver connection", hundreds per task, and a ``RecursionError`` when it logs
from a finalizer while the process shuts down) is kept at WARNING.

Spark Connect: a job that asks for it (``share_session``: the ingest) reuses one server-side
session across task processes instead of opening a new one per process. A stock Connect server
starts a new Python daemon for every session (its Python workers are keyed by the session's
artifact id, ``SPARK_JOB_ARTIFACT_UUID``, isolation or not), and a session's first Python stage
pays that start and the workers' imports: 1.5-3 s, most of a small run. The shared session's id is
derived from the server's address, the user, the job's name, its settings, the provider's version
and the current half hour (:func:`shared_session_id`), so only tasks asking for the same thing
share one, and a session is never kept past the server's idle timeout (60 min by default) for
lack of a fresh id: a session the server has closed (expired) is replaced by a new one. On a server
whose sessions live for days (``scripts/stack``'s), ``PRAVEGA_SPARK_CONNECT_SESSION_WINDOW_S``
widens the window so that a daily schedule's runs find their session, and its Python daemon, still
there. A task
never releases a shared session. ``PRAVEGA_SPARK_CONNECT_SHARED_SESSION=false`` turns sharing off
(a new session per task process, as before); a ``session_id`` in the connection's URL is used as
given.
"""

from __future__ import annotations

import collections
import getpass
import hashlib
import importlib.util
import json
import logging
import os
import re
import socket
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pyspark
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from airflow_provider_pravega import __version__
from airflow_provider_pravega.spark.worker_python import worker_python

try:  # classic sessions only: the full pyspark (the `spark` extra) brings py4j, pyspark-client does not
    from py4j.protocol import Py4JError
except ImportError:  # a Spark Connect client: nothing can raise py4j's errors here

    class Py4JError(Exception):  # type: ignore[no-redef]
        """Stands in for py4j's error where py4j is not installed; never raised."""

log = logging.getLogger(__name__)

LOCAL_TASK_RETRIES = 4
JVM_LOGGER = "airflow_provider_pravega.spark.jvm"
# log4j's default console layout: "yy/MM/dd HH:mm:ss LEVEL logger: message".
_LOG4J_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ")
_LOG4J_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
                 "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}
# Spark logs this WARN with a full stack trace for every glob source path (it looks for a
# _spark_metadata directory under the pattern): noise for a task that reads "dir/*.jsonl".
_QUIET_JVM_LOGGERS = ("org.apache.spark.sql.execution.streaming.sinks.FileStreamSink",
                      "org.apache.spark.sql.execution.streaming.FileStreamSink")
DEFAULT_CONN_ID = "spark_default"
# What the JVM and Spark print at every start: never the cause of a failed one.
_JVM_BANNERS = ("WARNING:", "Using Spark's default log4j profile", "Setting default log level",
                "To adjust logging level", "Picked up ")
# gRPC core's own log lines ("E1126 12:09:30.801070   17001 ev_epoll1_linux.cc:373] ..."), and how
# often a JVM start that left nothing else on its stderr is tried (see _start_jvm).
_GRPC_LOG_LINE = re.compile(r"^[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w.]+:\d+\]")
_FORK_ATTEMPTS = 3
# What Spark raises when it fails; anything else (a task's timeout, a kill) passes through unchanged.
_SPARK_ERRORS = (PySparkException, Py4JError)
#: Seconds a Spark endpoint (Spark Connect server, standalone master) has to answer before the task
#: fails naming it; the Spark Connect client's own retries at start are bounded to about as long.
CONNECT_TIMEOUT_S = 15.0
# Spark reads every key under these prefixes itself (environment, Hadoop, catalog settings), so it
# has no list of them to check a key against.
_FREE_FORM_PREFIXES = ("spark.hadoop.", "spark.executorEnv.", "spark.sql.catalog.", "spark.kubernetes.", "spark.yarn.",
                       "spark.driverEnv.", "spark.appMasterEnv.", "spark.jars.", "spark.plugins", "spark.history.",
                       "spark.worker.", "spark.deploy.", "spark.connect.", "spark.metrics.conf.")
# Core settings Spark reads by name, without an entry in its list of settings (findEntry finds none).
_KEYS_WITHOUT_ENTRY = frozenset({"spark.master", "spark.app.name", "spark.app.id"})


class SparkSessionError(ValueError):
    """The Spark connection or settings a task asks for cannot be honoured."""


@dataclass
class SparkTarget:
    """Where a task's Spark jobs run: a master URL or a Spark Connect URL (``remote``)."""

    master: str | None = None
    remote: str | None = None
    conf: dict[str, str] = field(default_factory=dict)
    #: True when nothing asked for a master (local mode by default): any active session will do.
    default: bool = False
    #: The ``spark`` connection's ``deploy-mode`` extra (``cluster``: see spark/submit.py).
    deploy_mode: str | None = None
    #: The ``spark`` connection's ``pravega_password_secret`` extra: the Kubernetes secret
    #: (``name:key``) from which a driver pod takes the Pravega password (spark/submit.py).
    password_secret: str | None = None


def spark_target(spark_conn_id: str | None) -> SparkTarget:
    """Resolve a task's ``spark_conn_id`` (see the module docstring)."""
    if not spark_conn_id:
        return SparkTarget(master=_local(), default=True)
    try:
        # Airflow only where a task resolves its connection: spark/ imports no Airflow at module level (the jobs run on a cluster without it)
        from airflow.sdk import BaseHook  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - Airflow 3.0/3.1 layout
        from airflow.hooks.base import BaseHook  # type: ignore[no-redef]  # Airflow: see above
    try:
        conn = BaseHook.get_connection(spark_conn_id)
    except Exception as exc:
        if spark_conn_id == DEFAULT_CONN_ID:  # the documented fallback
            log.info("no Airflow connection %r: running Spark in local mode", spark_conn_id)
            return SparkTarget(master=_local(), default=True)
        raise SparkSessionError(
            f"Spark connection {spark_conn_id!r} does not exist ({type(exc).__name__}); create it (type 'spark' "
            f"or 'spark_connect') or pass spark_conn_id=None for local mode"
        ) from None
    extra = conn.extra_dejson or {}
    conf = {str(k): str(v) for k, v in (extra.get("conf") or {}).items()}
    if conn.conn_type == "spark_connect":
        # Airflow only where a task resolves its connection: spark/ imports no Airflow at module level (the jobs run on a cluster without it)
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        try:
            return SparkTarget(remote=SparkConnectHook(spark_conn_id).get_connection_url(), conf=conf)
        except ValueError as exc:
            raise SparkSessionError(f"Spark Connect connection {spark_conn_id!r}: {exc}") from None
    host = (conn.host or "").strip()
    deploy_mode = str(extra["deploy-mode"]).strip().lower() if extra.get("deploy-mode") else None
    if not host:
        return SparkTarget(master=_local(), conf=conf, default=True, deploy_mode=deploy_mode)
    master = host
    if conn.port and "://" in host and host.count(":") < 2:
        master = f"{host}:{conn.port}"
    if master.startswith("local"):
        master = _local(master)
    secret = str(extra["pravega_password_secret"]).strip() if extra.get("pravega_password_secret") else None
    return SparkTarget(master=master, conf={**_connection_fields(spark_conn_id, master, extra), **conf},
                       deploy_mode=deploy_mode, password_secret=secret)


def _connection_fields(spark_conn_id: str, master: str, extra: dict[str, Any]) -> dict[str, str]:
    """The Spark provider's connection fields as the settings a driver in the task's process
    takes (cluster deploy mode passes them to spark-submit, see spark/submit.py): the YARN queue,
    the Kubernetes namespace and the Kerberos principal. A keytab in the connection is its content
    (base64); only spark-submit writes it out, so a driver here uses the worker's ticket cache."""
    settings = {}
    if extra.get("queue") and master.startswith("yarn"):
        settings["spark.yarn.queue"] = str(extra["queue"])
    if extra.get("namespace") and master.startswith("k8s://"):
        settings["spark.kubernetes.namespace"] = str(extra["namespace"])
    if extra.get("principal"):
        settings["spark.kerberos.principal"] = str(extra["principal"])
    if extra.get("keytab") and str(extra.get("deploy-mode", "client")).lower() != "cluster":
        log.warning("Spark connection %r: its keytab applies to cluster deploy mode only; a driver in the task "
                    "uses the worker's Kerberos ticket cache", spark_conn_id)
    return settings


def starts_local_session(spark_conn_id: str | None = DEFAULT_CONN_ID, **conf: Any) -> bool:
    """Whether :func:`get_spark_session` with these arguments would run Spark in local mode in this
    process, so the files it writes are this machine's (not a cluster's or a Connect server's)."""
    target = spark_target(spark_conn_id)
    wanted = {**target.conf, **{str(k): str(v) for k, v in conf.items()}}
    if "spark.remote" in wanted or target.remote is not None:
        return False
    master = wanted.get("spark.master") or target.master or "local"
    return master.startswith("local")


def started_on_first_use(spark: Any) -> Any:
    """A SparkSession, or a function that starts one, as a function that returns the session and
    starts it at its first call only: a job with nothing to do starts no Spark."""
    made: list[Any] = []

    def get() -> Any:
        if not made:
            made.append(spark() if callable(spark) else spark)
        return made[0]

    return get


def classic_spark_missing() -> str | None:
    """Why this process cannot start a driver JVM (None when it can): the default install has only
    pyspark-client (Spark Connect), without py4j and Spark's jars."""
    if importlib.util.find_spec("py4j") is None:
        return "py4j is not installed (pyspark-client only)"
    if os.environ.get("SPARK_HOME"):  # a Spark of the user's own: its launcher finds its jars
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    if not jars.is_dir():
        return f"Spark's jars are not installed ({jars} does not exist)"
    return None


def _local(master: str = "local[*]") -> str:
    """``local[N]`` → ``local[N,retries]`` (Spark's local mode otherwise never retries a task)."""
    inner = master[len("local") :].strip("[]") or "*"
    if "," in inner:
        return master
    return f"local[{inner},{LOCAL_TASK_RETRIES}]"


def _mismatches(active: Any, target: SparkTarget, wanted: dict[str, str]) -> list[str]:
    """Settings the active session has otherwise than the task asks (``key: active != wanted``)."""
    found = []
    if not target.default and target.master is not None:
        master = active.sparkContext.master
        if master != target.master:
            found.append(f"master: {master} != {target.master}")
    for key, value in wanted.items():
        have = active.conf.get(key, None)
        if key == "spark.master" and have is not None and _local(value) == have:
            continue
        if have != value:
            found.append(f"{key}: {have} != {value}")
    return found


def jvm_log_level(line: str, previous: int) -> int:
    """The level of one line of the JVM's stderr: log4j's own for a log line, the previous line's
    for a continuation (a stack trace's ``\tat …``, ``Caused by``), INFO for anything else (Spark's
    plain banners such as 'Setting default log level to "WARN".')."""
    match = _LOG4J_LINE.match(line)
    if match:
        return _LOG4J_LEVELS[match.group(1)]
    if line.startswith(("Exception in thread", "Error: ")):  # the JVM dies of it
        return logging.ERROR
    if line[:1] in (" ", "\t") or line.startswith(("Caused by", "...")) or re.match(r"^[\w.$]+(Exception|Error)\b",
                                                                                  line):
        return previous
    return logging.WARNING if line.startswith("WARNING:") else logging.INFO


class _JvmStderrRelay:
    """Relays the JVM's stderr pipe to the JVM logger, line by line at each line's level, and keeps
    the first lines for an error message (:func:`jvm_start_error`). While fd 2 itself points at the
    pipe (until the JVM is spawned) lines are held, not logged: a handler writing to stderr would
    otherwise feed its own output back into the pipe (and, once the pipe is full, block the JVM's
    start for good). fd 2 is restored as soon as the gateway is up, so that what the JVM says while
    the SparkContext starts (a master that does not answer: a minute of retries) is logged live."""

    KEPT_LINES = 200

    def __init__(self, fd: int, saved_stderr: int) -> None:
        self._lock = threading.Lock()
        self._saved: int | None = saved_stderr
        self._held: list[tuple[int, str]] = []
        self.lines: list[str] = []
        self._closed = threading.Event()
        threading.Thread(target=self._run, args=(fd,), name="spark-jvm-stderr", daemon=True).start()

    def _run(self, fd: int) -> None:
        # optional: SparkContext needs the full pyspark (the spark extra), not pyspark-client
        from pyspark import SparkContext

        level = logging.INFO
        try:
            with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as lines:
                for line in lines:
                    line = line.rstrip("\r\n")
                    if not line.strip():
                        continue
                    level = jvm_log_level(line, level)
                    if len(self.lines) < self.KEPT_LINES:
                        self.lines.append(line)
                    if SparkContext._gateway is not None:  # the JVM (which inherited fd 2) runs
                        self.restore()
                    with self._lock:
                        if self._saved is not None:
                            self._held.append((level, line))
                            continue
                    logging.getLogger(JVM_LOGGER).log(level, "%s", line)
        finally:
            self._closed.set()

    def restore(self) -> None:
        """fd 2 is stderr again: log what was held, and every later line as it comes."""
        with self._lock:
            if self._saved is None:
                return
            os.dup2(self._saved, 2)
            os.close(self._saved)
            self._saved = None
            held, self._held = self._held, []
        for level, line in held:
            logging.getLogger(JVM_LOGGER).log(level, "%s", line)

    def wait_closed(self, timeout_s: float) -> None:
        """Until the JVM's end of the pipe is closed (it exited): every line it wrote is read."""
        self._closed.wait(timeout_s)


def jvm_start_error(lines: list[str], exited: bool = True) -> str | None:
    """The JVM's own first error line among its stderr ``lines``: a log4j ERROR line, an uncaught
    exception (``Exception in thread "main" X: why`` → ``X: why``), or, when the JVM ``exited``,
    the first line that is neither a log line below ERROR nor one of Spark's banners (the JVM's own
    "Invalid maximum heap size: -Xmxlots")."""
    level = logging.INFO
    plain = None
    for line in lines:
        level = jvm_log_level(line, level)
        uncaught = re.match(r'^Exception in thread "[^"]*" (.*)', line)
        if uncaught:
            return uncaught.group(1)
        match = _LOG4J_LINE.match(line)
        if match:
            if level >= logging.ERROR:
                return line[match.end():]
            continue
        if plain is None and not (line[:1] in (" ", "\t") or line.startswith(_JVM_BANNERS)):
            plain = line
    return plain if exited else None


#: A CDS frame in a crash report: the JVM died mapping a class archive.
_CDS_FRAME = re.compile(r"FileMapInfo|MetaspaceShared|DynamicArchive|ArchiveBuilder|SystemDictionaryShared")


def jvm_crash(since: float, directories: list[str] | None = None) -> str | None:
    """What the newest JVM crash report written since ``since`` says (``hs_err_pid<pid>.log``: the
    JVM writes it in its working directory, else in the temporary directory; its summary goes to
    stdout, out of the provider's sight): the signal, the frame, the report's path, and the class
    archive when the crash was in mapping one. ``None`` without a report: the JVM did not crash."""
    reports = []
    for directory in directories or [os.getcwd(), tempfile.gettempdir()]:
        for path in Path(directory).resolve().glob("hs_err_pid*.log"):
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            if mtime >= since - 1.0:  # the file system's clock granularity
                reports.append((mtime, path))
    if not reports:
        return None
    report = max(reports)[1]
    try:
        text = report.read_text(encoding="utf-8", errors="replace")[:100_000]
    except OSError:
        text = ""
    signal = re.search(r"^#[ \t]+(\S.*?) at pc=", text, re.M)
    frame = re.search(r"^# Problematic frame:\n#[ \t]*(?:\w[ \t]+\[[^\]\n]*\][ \t]*)?(.+)$", text, re.M)
    archive = re.search(r"^jvm_args:.*?-XX:SharedArchiveFile=(\S+)", text, re.M)
    what = " in ".join(m.group(1).strip() for m in (signal, frame) if m) or "see the report"
    found = f"the driver's JVM crashed ({what}); its crash report: {report}"
    if archive and frame and _CDS_FRAME.search(frame.group(1)):
        return (f"{found}; it crashed mapping the class archive {archive.group(1)}, which is damaged: make it again "
                f"(pravega-spark-class-archive build) or remove it")
    return f"{found}; a crash of the JVM itself, not a setting of the task's: read the report"


def _start_jvm(builder: Any, settings: _Settings) -> Any:
    """``builder.getOrCreate()``; when that starts this process's JVM, its stderr goes to a pipe
    relayed by :class:`_JvmStderrRelay` (the JVM inherits fd 2 when it is spawned, so fd 2 points
    at the pipe only until then). A start that fails raises :class:`SparkSessionError` with the
    JVM's own first error line and the settings it names.

    PySpark spawns the JVM with ``fork`` (it passes ``preexec_fn``); with gRPC channels active in
    the process (the Pravega client's), grpcio ≥ 1.80 restarts its poller in the forked child,
    which can die of ``epoll_wait error: Bad file descriptor`` before it runs ``spark-submit``
    (grpc/grpc#43055: a few forks in a hundred). A start that failed so, with nothing but gRPC's
    lines on the JVM's stderr, is tried again. A JVM that crashed (:func:`jvm_crash`) is reported
    as such, not blamed on the task's settings."""
    # optional: the full pyspark (see _run)
    from pyspark import SparkContext

    if SparkContext._gateway is not None or os.environ.get("PYSPARK_GATEWAY_PORT"):
        try:
            return builder.getOrCreate()  # the JVM runs already (or spark-submit started it)
        except _SPARK_ERRORS as exc:
            raise settings.start_error(None, exc) from exc
    for attempt in range(1, _FORK_ATTEMPTS + 1):
        started = time.time()
        read_fd, write_fd = os.pipe()
        sys.stderr.flush()
        relay = _JvmStderrRelay(read_fd, os.dup(2))
        os.dup2(write_fd, 2)
        try:
            return builder.getOrCreate()
        except _SPARK_ERRORS as exc:
            if SparkContext._gateway is None:  # the JVM exited at start: all it said is in the pipe
                relay.restore()
                os.close(write_fd)
                write_fd = -1
                relay.wait_closed(5.0)
                if attempt < _FORK_ATTEMPTS and relay.lines and all(map(_GRPC_LOG_LINE.match, relay.lines)):
                    log.warning("the JVM's process died before it started (gRPC in the forked process: %s); "
                                "starting it again", relay.lines[-1])
                    continue
                crash = jvm_crash(started)
                if crash is not None:
                    raise SparkSessionError(f"Spark could not start: {crash}") from exc
            raise settings.start_error(jvm_start_error(relay.lines, SparkContext._gateway is None), exc) from exc
        finally:
            relay.restore()
            if write_fd >= 0:
                os.close(write_fd)
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass
class _Settings:
    """What a task asked Spark for and where each part came from, to name the culprit of a failure."""

    master: str
    master_from: str
    #: key → (value, "spark_conf" or "connection 'x'"); only settings a user gave
    given: dict[str, tuple[str, str]] = field(default_factory=dict)

    def culprits(self, text: str) -> list[str]:
        """The settings ``text`` (a JVM or Spark error) names by key or value; all when none."""
        named = [f"the master {self.master!r} ({self.master_from})"] if (
            "master" in text.lower() or self.master in text) else []
        for key, (value, origin) in self.given.items():
            if key == "spark.master":
                continue
            if key in text or (len(value) >= 3 and value in text):
                named.append(f"{origin} {key!r}={value!r}")
        if named:
            return named
        return [f"the master {self.master!r} ({self.master_from})"] + [
            f"{origin} {key!r}={value!r}" for key, (value, origin) in self.given.items() if key != "spark.master"]

    def start_error(self, jvm_line: str | None, exc: BaseException) -> SparkSessionError:
        cause = jvm_line or _first_line(exc)
        return SparkSessionError(
            f"Spark could not start: {cause}; from {', '.join(self.culprits(cause))}: correct that setting "
            f"(the JVM's own messages are logged by {JVM_LOGGER})")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _check_master_reachable(settings: _Settings) -> None:
    """A standalone master (``spark://h1:p1,h2:p2``) that takes no TCP connection fails the task
    now, naming it: Spark itself retries registration for a minute, then stops the context."""
    if not settings.master.startswith("spark://"):
        return
    failures = []
    for address in settings.master[len("spark://"):].split(","):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
                return
        except (OSError, ValueError) as exc:
            failures.append(f"{address}: {exc}")
    raise SparkSessionError(
        f"Spark master {settings.master} ({settings.master_from}) is unreachable: {'; '.join(failures)}; "
        f"check that the master runs and the host and port")


def _check_session(session: Any, settings: _Settings) -> None:
    """Spark builds a session's SQL state (and checks its SQL settings) on first use: use it now,
    so that a bad setting fails here, named as such, not in the first job (a source listing)."""
    try:
        session.conf.get("spark.sql.shuffle.partitions")
    except _SPARK_ERRORS as exc:
        session.stop()
        cause = _first_line(exc).split(": ", 1)[-1]
        raise SparkSessionError(
            f"Spark rejected a setting: {cause}; from {', '.join(settings.culprits(cause))}") from exc
    try:
        find = session.sparkContext._jvm.org.apache.spark.internal.config.ConfigEntry.findEntry
        unknown = [key for key in settings.given if key.startswith("spark.") and not key.startswith(_FREE_FORM_PREFIXES)
                   and key not in _KEYS_WITHOUT_ENTRY and find(key) is None]
    except Exception as exc:  # a changed internal API: no warning, nothing else depends on it
        log.debug("could not look up Spark's settings: %s", exc)
        return
    for key in unknown:
        log.warning("%s %r is not a setting this Spark knows: Spark keeps it but ignores it unless a library reads "
                    "it; check its spelling", settings.given[key][1], key)


def _grpc_reason(exc: BaseException) -> str:
    """Why a call to the Spark Connect server failed, in gRPC's own words (its status details)."""
    text = str(exc)
    if "DEADLINE_EXCEEDED" in text or "Deadline Exceeded" in text:
        return f"no answer within {CONNECT_TIMEOUT_S:g} s"
    details = re.search(r'details = "(.*)"', text)
    return details.group(1) if details else _first_line(exc)


def _connect_address(remote: str) -> str:
    """``sc://host:port`` of a Spark Connect URL, without its token and other parameters."""
    # import cost: Spark Connect's client (about 1 s, pandas and pyarrow) only for a Connect session
    from pyspark.sql.connect.client import DefaultChannelBuilder

    return f"sc://{DefaultChannelBuilder(remote).endpoint}"


class _StartDeadline(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """A gRPC client interceptor that gives every call a deadline while :attr:`active`: the Spark
    Connect client's calls have none, so a server that takes the connection but never answers
    would hold the task for good."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.active = True

    def _details(self, details: Any) -> Any:
        if not self.active or details.timeout is not None:
            return details
        return _CallDetails(details.method, self.timeout_s, details.metadata, details.credentials,
                            getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                         "wait_for_ready", "compression")), grpc.ClientCallDetails):
    """A call's details with another timeout (gRPC's own class is abstract)."""


#: Environment switch: "false" (or 0/no/off) gives every task process a new Spark Connect session.
SHARED_SESSION_ENV = "PRAVEGA_SPARK_CONNECT_SHARED_SESSION"
#: Seconds during which tasks asking for the same session get the same session id (the id changes
#: with the next window): below the Connect server's default idle timeout (60 min), so a window's
#: session is not expired while tasks keep using it.
SHARED_SESSION_WINDOW_S = 1800
#: Environment setting: the window in seconds, for a server whose sessions live longer
#: (``spark.connect.session.manager.defaultSessionTimeout``): a daily schedule keeps one session,
#: its Python daemon included, for days with a window of days and a server timeout above it.
SHARED_SESSION_WINDOW_ENV = "PRAVEGA_SPARK_CONNECT_SESSION_WINDOW_S"


def sharing_sessions() -> bool:
    """Whether :envvar:`PRAVEGA_SPARK_CONNECT_SHARED_SESSION` leaves session sharing on."""
    return os.environ.get(SHARED_SESSION_ENV, "true").strip().lower() not in ("false", "0", "no", "off")


def shared_session_window_s() -> int:
    """The shared session's window: :envvar:`PRAVEGA_SPARK_CONNECT_SESSION_WINDOW_S`, else
    :data:`SHARED_SESSION_WINDOW_S`. A value that is not a positive whole number of seconds is
    refused, naming the setting."""
    raw = os.environ.get(SHARED_SESSION_WINDOW_ENV, "").strip()
    if not raw:
        return SHARED_SESSION_WINDOW_S
    try:
        window = int(raw)
    except ValueError:
        window = 0
    if window <= 0:
        raise SparkSessionError(
            f"{SHARED_SESSION_WINDOW_ENV}={raw!r} is not a positive number of seconds: set it below the Spark "
            f"Connect server's spark.connect.session.manager.defaultSessionTimeout (default 60 min), e.g. 604800 "
            f"(7 days) with a server timeout of 8d, or unset it for {SHARED_SESSION_WINDOW_S} s")
    return window


def shared_session_id(remote: str, app_name: str, wanted: dict[str, str], now: float | None = None) -> str:
    """The Spark Connect session id that task processes asking for the same session share: a
    UUID (version 4 form, as the client checks) from the server's address, the user, the job's
    name, its settings, the provider's version and the current window
    (:func:`shared_session_window_s`). The URL's token is not part of it."""
    # import cost: see _connect_address
    from pyspark.sql.connect.client import DefaultChannelBuilder

    channel = DefaultChannelBuilder(remote)
    try:
        user = channel.userId or getpass.getuser()
    except Exception:  # no user name in this environment: the server takes the session anyway
        user = ""
    window = int((time.time() if now is None else now) // shared_session_window_s())
    key = json.dumps([channel.endpoint, user, app_name, sorted(wanted.items()), __version__, window])
    return str(uuid.UUID(bytes=hashlib.blake2b(key.encode(), digest_size=16).digest(), version=4))


def _with_session_id(remote: str, session_id: str) -> str:
    """``remote`` with the ``session_id`` parameter (``sc://host:port/;session_id=...``)."""
    if "/;" in remote:
        return f"{remote};session_id={session_id}"
    return f"{remote.rstrip('/')}/;session_id={session_id}"


def _session_closed(exc: BaseException) -> bool:
    return "INVALID_HANDLE.SESSION_CLOSED" in str(exc)


def _connect(remote: str, app_name: str, wanted: dict[str, str], source: str, share: bool = False) -> Any:
    """A Spark Connect session whose first calls are bounded: a deadline on each and a few quick
    retries (the client's default retries an unreachable server for ten minutes, silently).
    ``share``: the session that task processes asking for the same one share (see the module's
    docstring), unless the URL names a session or sharing is turned off."""
    # import cost: see _connect_address
    from pyspark.sql.connect.client import DefaultChannelBuilder

    if share and sharing_sessions() and DefaultChannelBuilder(remote).session_id is None:
        shared = _with_session_id(remote, shared_session_id(remote, app_name, wanted))
        try:
            return _open_connect(shared, app_name, wanted, source, shared=True)
        except SparkSessionError as exc:
            if not _session_closed(exc.__cause__ or exc):
                raise
            log.info("the Spark Connect server has closed this window's shared session (its idle timeout): "
                     "opening a new one for this task")
    return _open_connect(remote, app_name, wanted, source)


def _open_connect(remote: str, app_name: str, wanted: dict[str, str], source: str, shared: bool = False) -> Any:
    try:
        # optional: the full pyspark (see the except)
        from pyspark import SparkContext
    except ImportError:  # pyspark-client: this process cannot hold a classic session at all
        SparkContext = None
    # import cost: see _connect_address
    from pyspark.sql.connect.client import DefaultChannelBuilder
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    address = _connect_address(remote)
    log.info("connecting to Spark Connect server %s (%s)%s", address, source,
             "; the session shared by tasks asking for the same one" if shared else "")
    channel = DefaultChannelBuilder(remote)
    deadline = _StartDeadline(CONNECT_TIMEOUT_S)
    channel.add_interceptor(deadline)  # type: ignore[arg-type]
    session = ConnectSession.builder.channelBuilder(channel).getOrCreate()  # no call to the server yet
    if shared:  # other tasks use it: stopping this process's client must not close it on the server
        session.release_session_on_close = False
    client = session.client
    policies = client.get_retry_policies()
    # 0.25 + 0.5 + 1 + 2 s between the tries: enough for a connection that drops once
    client.set_retry_policies([DefaultPolicy(max_retries=4, initial_backoff=250, backoff_multiplier=2.0,
                                             max_backoff=2000, jitter=0, max_server_retry_delay=2000)])
    try:
        try:
            with warnings.catch_warnings():  # pyspark's RETRIES_EXCEEDED warning: the error says more
                warnings.simplefilter("ignore", UserWarning)
                session.version  # noqa: B018 - the first call: does the server answer?
        except (*_SPARK_ERRORS, grpc.RpcError) as exc:  # not an interrupt (a task's timeout, a kill)
            session.release_session_on_close = False  # releasing would be one more call to a server that is not there
            session.stop()
            raise SparkSessionError(
                f"Spark Connect server {address} ({source}) is unreachable: {_grpc_reason(exc)}; check that the "
                f"server runs and the connection's host, port and use_ssl") from exc
        if SparkContext is not None and SparkContext._active_spark_context is not None:
            session.stop()
            raise SparkSessionError(
                f"this process already runs a classic SparkSession, and a process holds either a classic or a "
                f"Spark Connect session ({address}, {source}): stop it first or run the task in its own process")
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"  # as pyspark's own builder.remote(): pyspark.sql is Connect's
        try:
            ConnectSession.builder.config(map={"spark.app.name": app_name, **wanted}).getOrCreate()
        except _SPARK_ERRORS as exc:
            session.stop()
            raise SparkSessionError(f"Spark Connect server {address} ({source}) rejected the task's settings "
                                    f"{sorted(wanted)}: {_first_line(exc)}") from exc
    finally:
        deadline.active = False
    client.set_retry_policies(policies)  # later calls: the client's own patience (a server restarting)
    return session


def _quiet_logs(session: Any) -> None:
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        jvm = session.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.Level.ERROR
        for name in _QUIET_JVM_LOGGERS:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
    except Exception as exc:  # log4j 1 or a changed API: the noise stays, the job does not care
        log.debug("could not quieten Spark's loggers: %s", exc)


def submitted_master() -> str | None:
    """The master ``spark-submit`` gave this process when it runs as a Spark application's Python
    driver (in a YARN container in cluster deploy mode, say), else None: a job started that way
    must use it, not local mode."""
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):  # set by spark-submit's PythonRunner only
        return None
    # optional: the full pyspark (see _run)
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connect to spark-submit's JVM, whose properties hold the master
    return SparkConf().get("spark.master", None)


#: The garbage collector and the initial heap a local session's JVM gets unless something else
#: chooses its options (see :func:`session_defaults`).
LOCAL_JVM_OPTIONS = "-XX:+UseParallelGC -Xms64m"
#: Where a JVM option can come from besides the session's settings (the JVM refuses two collectors).
_JAVA_OPTION_VARIABLES = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS", "SPARK_SUBMIT_OPTS")
# What such a variable may choose that LOCAL_JVM_OPTIONS would override or contradict.
_CHOSEN_IN_ENVIRONMENT = re.compile(r"-XX:\+Use\w*GC\b|-Xms\d|-XX:(InitialHeapSize|MinHeapSize|InitialRAMPercentage)=")
_DRIVER_JAVA_OPTIONS = ("spark.driver.extraJavaOptions", "spark.driver.defaultJavaOptions")
# A line of spark-defaults.conf (a Java properties file: "key value", "key=value" or "key:value").
_DRIVER_JAVA_OPTION_LINE = re.compile(r"\s*spark\.driver\.(extra|default)JavaOptions\s*[=:\s]")


def _java_options_set_elsewhere(conf: Mapping[str, str]) -> bool:
    """Whether the driver JVM's options are chosen by ``conf`` or Spark's ``spark-defaults.conf``,
    or a collector or an initial heap by the environment: the provider's JVM defaults then stay
    out of the way."""
    if any(key in conf for key in _DRIVER_JAVA_OPTIONS):
        return True
    if any(_CHOSEN_IN_ENVIRONMENT.search(os.environ.get(name, "")) for name in _JAVA_OPTION_VARIABLES):
        return True
    conf_dirs = [os.environ.get("SPARK_CONF_DIR")]
    spark_home = os.environ.get("SPARK_HOME")
    if not spark_home:
        try:
            # optional: no Spark home with a Connect client (see the except)
            from pyspark.find_spark_home import _find_spark_home

            spark_home = _find_spark_home()
        except Exception:  # a Spark Connect client, or a layout pyspark does not know
            spark_home = None
    if spark_home:
        conf_dirs.append(os.path.join(spark_home, "conf"))
    for directory in filter(None, conf_dirs):
        try:
            with open(os.path.join(directory, "spark-defaults.conf"), encoding="utf-8") as fh:
                if any(_DRIVER_JAVA_OPTION_LINE.match(line) for line in fh):
                    return True
        except OSError:
            continue
    return False


def session_defaults(master: str, conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the provider sets on a session it starts, unless the connection or ``spark_conf`` says
    otherwise. Only a local master gets a shuffle-partition count from this machine's cores and no
    UI (a local session lives inside the Airflow task); a cluster keeps Spark's own defaults, as
    the cluster's operators configured them.

    A local session's JVM (the driver, which runs the tasks too) also gets the parallel garbage
    collector (``spark.driver.extraJavaOptions``: :data:`LOCAL_JVM_OPTIONS`) instead of the JVM's
    default G1, unless ``conf`` (the task's settings), a ``JAVA_TOOL_OPTIONS``-style variable or
    ``spark-defaults.conf`` sets the driver's Java options: measured on the export (1M events of
    200 B, warm sessions side by side, docs/benchmarks.md), under G1 the JIT compiler kept
    compiling on every job while under the parallel collector it settled; over 15 interleaved
    rounds in three runs an export took a median 0.36 CPU-s less with the parallel collector (10
    of 15 rounds lower, most of it JIT; one of the three runs showed no difference at its medians).
    It also starts with a small heap (``-Xms``): the JVM's default initial heap is a fraction of
    the machine's memory, and the young generation fills all of it before its first collection,
    whatever the work needs; from a small one the heap grows to what the work uses, up to
    ``spark.driver.memory`` as before (docs/deployment.md has the figures). With those options come
    the class archive's, when this installation has one (:func:`local_jvm_options`)."""
    defaults = {
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # The console progress bar redraws with carriage returns: in a task log, a line per redraw.
        "spark.ui.showConsoleProgress": "false",
    }
    if master.startswith("local"):
        defaults["spark.ui.enabled"] = "false"
        defaults["spark.sql.shuffle.partitions"] = str(max(2, os.cpu_count() or 2))
        if not _java_options_set_elsewhere(conf or {}):
            defaults["spark.driver.extraJavaOptions"] = local_jvm_options()
    return defaults


def local_jvm_options() -> str:
    """:data:`LOCAL_JVM_OPTIONS`, plus the options that map this Spark installation's class archive
    when one was made (:mod:`.class_archive`: by ``pravega-spark-class-archive build``, or in the
    background by the first session that found none): a fresh driver then maps Spark's classes
    instead of loading them, seconds sooner every run."""
    # optional: class_archive imports the full pyspark's SparkContext (pyspark-client has none)
    from airflow_provider_pravega.spark import class_archive

    return f"{LOCAL_JVM_OPTIONS} {class_archive.java_options()}".strip()


def get_spark_session(spark_conn_id: str | None = DEFAULT_CONN_ID, app_name: str = "pravega", *,
                      share_session: bool = False, **conf: Any):
    """A SparkSession for the provider's jobs: the Spark Connect server or master the connection
    names, with ``conf``; an active session of this process only when it matches. An endpoint that
    does not answer, a JVM that exits at start and a setting Spark rejects are
    :class:`SparkSessionError` naming the connection or setting. ``share_session``: on a Spark
    Connect server, the server-side session shared by the task processes asking for the same one
    (see the module's docstring); only for jobs that register nothing in their session."""
    target = spark_target(spark_conn_id)
    origin = f"connection {spark_conn_id!r}"
    given = {key: (value, f"{origin} conf") for key, value in target.conf.items()}
    given.update({str(key): (str(value), "spark_conf") for key, value in conf.items()})
    wanted = {key: value for key, (value, _) in given.items()}
    remote = wanted.pop("spark.remote", None)  # spark-submit's --remote / --conf spark.remote
    if remote is not None:
        return _connect(remote, app_name, wanted, f"{given['spark.remote'][1]} 'spark.remote'", share_session)
    if target.remote is not None:
        return _connect(target.remote, app_name, wanted, origin, share_session)
    if "spark.master" in wanted:
        master = wanted.pop("spark.master")
        master_from = f"{given['spark.master'][1]} 'spark.master'"
    elif target.master is not None and not target.default:
        master, master_from = target.master, f"host of {origin}"
    elif target.default and (submitted := submitted_master()) is not None:
        master, master_from = submitted, "spark-submit"
    else:
        master, master_from = target.master or _local(), "local mode"
    settings = _Settings(_local(master) if master.startswith("local") else master, master_from, given)
    missing = classic_spark_missing() if master_from != "spark-submit" else None  # its JVM runs already
    if missing is not None:
        raise SparkSessionError(
            f"Spark master {settings.master} ({master_from}) runs the driver in this process, which needs the full "
            f"pyspark and Java 17+, but {missing}: install 'airflow-provider-pravega[spark]' (and a JRE), or give "
            f"spark_conn_id a 'spark_connect' connection to run the job on a Spark Connect server"
        )
    _check_master_reachable(settings)
    active = SparkSession.getActiveSession()
    if active is not None:
        if "spark.master" in given:
            wanted["spark.master"] = given["spark.master"][0]
        mismatched = _mismatches(active, target, wanted)
        if mismatched:
            raise SparkSessionError(
                f"this process already has a SparkSession that differs from what the task asks for "
                f"({'; '.join(mismatched)}); stop it first or run the task in its own process"
            )
        return active
    master = settings.master
    builder = SparkSession.builder.master(master).appName(app_name)
    defaults = {**session_defaults(master, wanted), **wanted}
    if master.startswith("local"):
        # Python workers must be this interpreter (with pravega and this provider installed), not
        # whatever `python3` is first on PATH; started through the launcher that spares them
        # compiling pyspark's zip (spark/worker_python.py).
        os.environ.setdefault("PYSPARK_PYTHON", worker_python())
        defaults.setdefault("spark.driver.host", "127.0.0.1")
        defaults.setdefault("spark.driver.bindAddress", "127.0.0.1")
    for key, value in defaults.items():
        builder = builder.config(key, value)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    log.info("starting Spark with master %s (%s)", master, master_from)
    session = _start_jvm(builder, settings)
    session.sparkContext.setLogLevel("WARN")
    _quiet_logs(session)
    _check_session(session, settings)
    return session
