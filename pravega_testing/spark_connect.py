"""A stock Spark Connect server from pyspark's own jars (``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer``; no Spark download, no plugin of this
project unless a caller adds one): the command line, its environment, the readiness check and a
context manager that starts it and stops its whole process group. ``scripts/stack``,
``scripts/demo``, ``benchmarks/bench_per_run.py`` and the Spark Connect tests
(tests/lake/test_spark_connect.py, tests/lake/test_delta_connect_s3a.py) all start theirs with these.

The server binds to 127.0.0.1 only, on a port the caller picks, and sets nothing of the job's: its
SQL settings are Spark's defaults (``spark.sql.shuffle.partitions`` = 200), as on a Connect server
someone else runs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: Local mode on every core, with task retries (as the provider's own local sessions).
DEFAULT_MASTER = "local[*,4]"
#: The Airflow connection that ``scripts/stack`` and ``scripts/demo`` point at their server (the
#: Apache Spark provider's default ``spark_connect`` connection id).
CONN_ID = "spark_connect_default"


class SparkConnectServerError(RuntimeError):
    """The server did not come up (its log's tail is in the message)."""


def spark_home(python: str | None = None) -> Path:
    """The pyspark installation (``bin/spark-submit`` and the jars) of ``python`` (default: this
    interpreter's)."""
    if python is None or python == sys.executable:
        import pyspark

        return Path(pyspark.__file__).parent
    out = subprocess.run([python, "-c", "import pyspark; print(pyspark.__file__)"], check=True, capture_output=True,
                         text=True, cwd="/").stdout.strip()
    return Path(out).parent


def server_env(base: dict[str, str] | None = None, python: str | None = None, *,
               worker_launcher: bool = False) -> dict[str, str]:
    """The server's environment: pyspark's SPARK_HOME, Python workers on ``python`` (default: this
    interpreter; it must import pyarrow and this provider: the jobs' functions run there),
    loopback only. ``worker_launcher``: the workers start through this interpreter's
    ``pravega-spark-python`` (without compiling pyspark's zip in each new worker; docs/deployment.md),
    as the servers of ``scripts/stack`` and ``scripts/demo`` do; the tests' servers stay stock."""
    python = python or sys.executable
    workers = python
    if worker_launcher and python == sys.executable:
        from airflow_provider_pravega.spark.worker_python import worker_python

        workers = worker_python()
    return dict(base if base is not None else os.environ, SPARK_HOME=str(spark_home(python)), PYSPARK_PYTHON=workers,
                SPARK_LOCAL_IP="127.0.0.1")


#: The long-running server of ``scripts/stack`` and ``scripts/demo`` keeps an idle session this long
#: (Spark's default: 60 min), and the example DAGs' tasks share one session for
#: :data:`LONG_SESSION_WINDOW_S` (below it): a daily run then finds the session of the day before,
#: and its Python daemon, instead of paying a new one (2-4 s of a small run).
LONG_SESSION_TIMEOUT = "8d"
LONG_SESSION_WINDOW_S = 7 * 24 * 3600


def server_command(port: int, *, master: str = DEFAULT_MASTER, ui_port: int | None = None,
                   python: str | None = None, extra_args: Sequence[str] = (),
                   session_timeout: str | None = None) -> list[str]:
    """``spark-submit`` of the stock server on ``127.0.0.1:port``. ``ui_port``: the Spark UI (and its
    REST API, where jobs, stages and tasks are counted) on that loopback port; None: no UI.
    ``extra_args``: more ``spark-submit`` arguments (``--jars``, ``--conf``, ``--packages``).
    ``session_timeout``: how long the server keeps an idle session (a Spark duration, e.g. ``8d``)."""
    ui = ["--conf", "spark.ui.enabled=false"] if ui_port is None else [
        "--conf", "spark.ui.enabled=true", "--conf", f"spark.ui.port={ui_port}", "--conf", "spark.port.maxRetries=0"]
    if session_timeout:
        ui += ["--conf", f"spark.connect.session.manager.defaultSessionTimeout={session_timeout}"]
    return [str(spark_home(python) / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--master", master,
            "--conf", f"spark.connect.grpc.binding.port={port}",
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.driver.host=127.0.0.1",
            *ui, *extra_args]


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_ready(port: int, *, still_running: Callable[[], bool], log: str | os.PathLike[str] | None = None,
               timeout_s: float = 180.0) -> None:
    """Until the server takes connections on ``port``; SparkConnectServerError (with the log's tail)
    when ``still_running`` turns false or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not listening(port):
        why = None if still_running() else "exited while starting"
        if why is None and time.monotonic() > deadline:
            why = f"took no connection on 127.0.0.1:{port} within {timeout_s:.0f} s"
        if why is not None:
            tail = ""
            if log is not None:
                try:
                    tail = "; its log:\n" + Path(log).read_text(errors="replace")[-3000:]
                except OSError:
                    pass
            raise SparkConnectServerError(f"the Spark Connect server {why}{tail}")
        time.sleep(0.3)


def url(port: int) -> str:
    return f"sc://127.0.0.1:{port}"


def example_dags_env(port: int) -> dict[str, str]:
    """The environment that points the example DAGs (dags/) at the server on ``port``: the
    :data:`CONN_ID` connection, their tasks' Spark connection (see
    ``pravega_examples_common.spark_conn_id``) and the shared session's window for a server started
    with :data:`LONG_SESSION_TIMEOUT`."""
    import json

    return {f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1",
                                                            "port": port}),
            "PRAVEGA_EXAMPLES_SPARK_CONN": CONN_ID,
            "PRAVEGA_SPARK_CONNECT_SESSION_WINDOW_S": str(LONG_SESSION_WINDOW_S)}


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of the process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


def stop_group(pgid: int, timeout_s: float = 30.0, reap: Callable[[], object] | None = None) -> None:
    """SIGTERM the server's process group (the JVM and its Python workers), SIGKILL after
    ``timeout_s``; returns once no live process is left in it. ``reap``: reaps the group leader
    when it is this process's child (``Popen.poll``), so its zombie does not count as alive."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if reap is not None:
                reap()
            if not group_members(pgid):
                return
            time.sleep(0.1)


@dataclass
class RunningServer:
    port: int
    pid: int
    log: Path
    ui_port: int | None = None

    @property
    def url(self) -> str:
        return url(self.port)

    @property
    def ui_url(self) -> str | None:
        return None if self.ui_port is None else f"http://127.0.0.1:{self.ui_port}"


@contextmanager
def running_server(log: str | os.PathLike[str], *, port: int | None = None, master: str = DEFAULT_MASTER,
                   ui_port: int | None = None, python: str | None = None, extra_args: Sequence[str] = (),
                   env: dict[str, str] | None = None, timeout_s: float = 180.0,
                   session_timeout: str | None = None, worker_launcher: bool = False) -> Iterator[RunningServer]:
    """Start the server in its own process group (output to ``log``), wait until it takes
    connections, yield it; stop the whole group at the end, also on an error or an interrupt."""
    from pravega_testing.net import free_port

    port = port or free_port()
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(server_command(port, master=master, ui_port=ui_port, python=python,
                                               extra_args=extra_args, session_timeout=session_timeout),
                                env=server_env(env, python, worker_launcher=worker_launcher), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_ready(port, still_running=lambda: proc.poll() is None, log=log, timeout_s=timeout_s)
        yield RunningServer(port, proc.pid, log, ui_port)
    finally:
        stop_group(proc.pid, reap=proc.poll)
        proc.wait()
