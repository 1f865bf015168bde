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
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

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


def spark_target(spark_conn_id: str | None) -> SparkTarget:
    """Resolve a task's ``spark_conn_id`` (see the module docstring)."""
    if not spark_conn_id:
        return SparkTarget(master=_local(), default=True)
    try:
        from airflow.sdk import BaseHook  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - Airflow 3.0/3.1 layout
        from airflow.hooks.base import BaseHook  # type: ignore[no-redef]
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
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        try:
            return SparkTarget(remote=SparkConnectHook(spark_conn_id).get_connection_url(), conf=conf)
        except ValueError as exc:
            raise SparkSessionError(f"Spark Connect connection {spark_conn_id!r}: {exc}") from None
    host = (conn.host or "").strip()
    if not host:
        return SparkTarget(master=_local(), conf=conf, default=True)
    master = host
    if conn.port and "://" in host and host.count(":") < 2:
        master = f"{host}:{conn.port}"
    if master.startswith("local"):
        master = _local(master)
    return SparkTarget(master=master, conf=conf)


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
    if line[:1] in (" ", "\t") or line.startswith(("Caused by", "...")) or re.match(r"^[\w.$]+(Exception|Error)\b",
                                                                                  line):
        return previous
    return logging.WARNING if line.startswith("WARNING:") else logging.INFO


class _JvmStderrRelay:
    """Relays the JVM's stderr pipe to the JVM logger, line by line at each line's level. While fd 2
    itself points at the pipe (the moment the JVM is spawned) lines are held, not logged: a
    handler writing to stderr would otherwise feed its own output back into the pipe (and, once
    the pipe is full, block the JVM's start for good)."""

    def __init__(self, fd: int) -> None:
        self._lock = threading.Lock()
        self._held: list[tuple[int, str]] | None = []
        threading.Thread(target=self._run, args=(fd,), name="spark-jvm-stderr", daemon=True).start()

    def _run(self, fd: int) -> None:
        jvm_log = logging.getLogger(JVM_LOGGER)
        level = logging.INFO
        with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as lines:
            for line in lines:
                line = line.rstrip("\r\n")
                if not line.strip():
                    continue
                level = jvm_log_level(line, level)
                with self._lock:
                    if self._held is not None:
                        self._held.append((level, line))
                        continue
                jvm_log.log(level, "%s", line)

    def release(self) -> None:
        """fd 2 is stderr again: log what was held, and every later line as it comes."""
        with self._lock:
            held, self._held = self._held or [], None
        for level, line in held:
            logging.getLogger(JVM_LOGGER).log(level, "%s", line)


def _start_jvm(builder: Any) -> Any:
    """``builder.getOrCreate()``; when that starts this process's JVM, its stderr goes to a pipe
    relayed by :class:`_JvmStderrRelay` (the JVM inherits fd 2 when it is spawned, so fd 2 points
    at the pipe only for that moment)."""
    from pyspark import SparkContext

    if SparkContext._gateway is not None or os.environ.get("PYSPARK_GATEWAY_PORT"):
        return builder.getOrCreate()  # the JVM runs already (or spark-submit started it)
    read_fd, write_fd = os.pipe()
    relay = _JvmStderrRelay(read_fd)
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(write_fd, 2)
    try:
        return builder.getOrCreate()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(write_fd)
        relay.release()


def _quiet_logs(session: Any) -> None:
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        jvm = session.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.Level.ERROR
        for name in _QUIET_JVM_LOGGERS:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
    except Exception as exc:  # log4j 1 or a changed API: the noise stays, the job does not care
        log.debug("could not quieten Spark's loggers: %s", exc)


def get_spark_session(spark_conn_id: str | None = DEFAULT_CONN_ID, app_name: str = "pravega", **conf: Any):
    """A SparkSession for the provider's jobs: the Spark Connect server or master the connection
    names, with ``conf``; an active session of this process only when it matches."""
    from pyspark.sql import SparkSession

    target = spark_target(spark_conn_id)
    wanted = {**target.conf, **{k: str(v) for k, v in conf.items()}}
    remote = wanted.pop("spark.remote", None) or target.remote  # spark-submit's --remote / --conf spark.remote
    if remote is not None:
        builder = SparkSession.builder.remote(remote).appName(app_name)
        for key, value in wanted.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()
    active = SparkSession.getActiveSession()
    if active is not None:
        mismatched = _mismatches(active, target, wanted)
        if mismatched:
            raise SparkSessionError(
                f"this process already has a SparkSession that differs from what the task asks for "
                f"({'; '.join(mismatched)}); stop it first or run the task in its own process"
            )
        return active
    master = _local(wanted.pop("spark.master")) if wanted.get("spark.master", "").startswith("local") else (
        wanted.pop("spark.master", None) or target.master or _local())
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {
        "spark.ui.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.shuffle.partitions": str(max(2, os.cpu_count() or 2)),
        # The console progress bar redraws with carriage returns: in a task log, a line per redraw.
        "spark.ui.showConsoleProgress": "false",
        **wanted,
    }
    if master.startswith("local"):
        # Python workers must be this interpreter (with pravega and this provider installed),
        # not whatever `python3` is first on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        settings.setdefault("spark.driver.host", "127.0.0.1")
        settings.setdefault("spark.driver.bindAddress", "127.0.0.1")
    for key, value in settings.items():
        builder = builder.config(key, value)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    session = _start_jvm(builder)
    session.sparkContext.setLogLevel("WARN")
    _quiet_logs(session)
    return session
