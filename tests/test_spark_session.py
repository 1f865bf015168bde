"""How a task's ``spark_conn_id`` and ``spark_conf`` become a SparkSession: the Spark provider's
``spark`` and ``spark_connect`` connections, the local fallback only for ``spark_default``, and no
silent reuse of an active session that differs from what the task asks for."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bad_input_doc import check_section

from airflow_provider_pravega.spark.session import _JAVA_OPTION_VARIABLES, SparkSessionError, get_spark_session, spark_target
from pravega_testing.net import free_port


def _connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


def test_a_missing_connection_other_than_the_default_is_an_error() -> None:
    with pytest.raises(SparkSessionError, match="Spark connection 'spark_typo' does not exist"):
        spark_target("spark_typo")
    assert spark_target("spark_default").default  # documented fallback: local mode
    assert spark_target(None).master == "local[*,4]"


def test_spark_connections_give_the_master_and_conf(monkeypatch: pytest.MonkeyPatch) -> None:
    _connection(monkeypatch, "spark_cluster", conn_type="spark", host="spark://10.0.0.5", port=7077,
                extra={"conf": {"spark.executor.memory": "2g"}})
    _connection(monkeypatch, "spark_small", conn_type="spark", host="local[2]")
    cluster = spark_target("spark_cluster")
    assert (cluster.master, cluster.conf, cluster.default) == ("spark://10.0.0.5:7077", {"spark.executor.memory": "2g"},
                                                               False)
    assert spark_target("spark_small").master == "local[2,4]"  # local mode retries tasks


def test_the_connections_queue_namespace_and_principal_reach_a_driver_in_the_task(monkeypatch, caplog) -> None:
    _connection(monkeypatch, "spark_yarn", conn_type="spark", host="yarn",
                extra={"queue": "etl", "principal": "etl@EXAMPLE.COM", "keytab": "AAAA", "namespace": "ignored",
                       "conf": {"spark.yarn.queue": "adhoc"}})
    _connection(monkeypatch, "spark_k8s", conn_type="spark", host="k8s://https://api.example:6443",
                extra={"namespace": "lake", "queue": "ignored"})
    with caplog.at_level("WARNING"):
        assert spark_target("spark_yarn").conf == {"spark.yarn.queue": "adhoc",  # the conf wins
                                                   "spark.kerberos.principal": "etl@EXAMPLE.COM"}
    assert "its keytab applies to cluster deploy mode only" in caplog.text
    assert spark_target("spark_k8s").conf == {"spark.kubernetes.namespace": "lake"}


def test_spark_connect_connections_give_the_remote_url(monkeypatch: pytest.MonkeyPatch) -> None:
    _connection(monkeypatch, "spark_connect_lab", conn_type="spark_connect", host="spark.example", port=15002,
                login="etl", password="tok", extra={"use_ssl": True})
    target = spark_target("spark_connect_lab")
    assert target.master is None
    assert target.remote == "sc://spark.example:15002/;user_id=etl;token=tok;use_ssl=True"


def test_an_active_session_is_reused_only_when_it_matches(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert get_spark_session(None, "same", **{"spark.sql.shuffle.partitions": "2"}) is spark
    with pytest.raises(SparkSessionError, match=r"spark.sql.shuffle.partitions: 2 != 7"):
        get_spark_session(None, "other", **{"spark.sql.shuffle.partitions": "7"})
    with pytest.raises(SparkSessionError, match=r"spark.jars.packages: None != org.apache.hadoop:hadoop-aws"):
        get_spark_session(None, "other", **{"spark.jars.packages": "org.apache.hadoop:hadoop-aws:3.5.0"})
    _connection(monkeypatch, "spark_three", conn_type="spark", host="local[3]")
    with pytest.raises(SparkSessionError, match=r"master: local\[\S+\] != local\[3,4\]"):
        get_spark_session("spark_three", "other")


def test_jvm_stderr_lines_keep_their_log4j_level() -> None:
    """The driver JVM's stderr is relayed at each line's own level, not as errors (a task's
    supervisor records raw stderr at ERROR)."""
    import logging

    from airflow_provider_pravega.spark.session import jvm_log_level

    info, warn, error = logging.INFO, logging.WARNING, logging.ERROR
    assert jvm_log_level("26/11/25 22:35:06 INFO SparkContext: Running Spark version 4.0.1", error) == info
    assert jvm_log_level("26/11/25 22:35:06 WARN Utils: Set SPARK_LOCAL_IP", info) == warn
    assert jvm_log_level("26/11/25 22:35:06 ERROR Executor: Exception in task 0.0", info) == error
    # A stack trace continues the level of the line that started it.
    assert jvm_log_level("java.io.FileNotFoundException: File file:/x/*.jsonl does not exist", warn) == warn
    assert jvm_log_level("\tat org.apache.hadoop.fs.RawLocalFileSystem.getFileStatus(RawLocalFileSystem.java:970)",
                         error) == error
    assert jvm_log_level("Caused by: java.net.ConnectException: refused", error) == error
    # Spark's plain banners are information; the JVM's own "WARNING:" lines are warnings.
    assert jvm_log_level('Setting default log level to "WARN".', error) == info
    assert jvm_log_level("WARNING: Using incubator modules: jdk.incubator.vector", info) == warn
    # What the JVM dies of is an error, whatever came before.
    assert jvm_log_level('Exception in thread "main" org.apache.spark.SparkException: Master must', info) == error
    assert jvm_log_level("Error: Could not create the Java Virtual Machine.", info) == error


def test_the_jvm_start_error_is_the_jvms_first_own_error_line() -> None:
    from airflow_provider_pravega.spark.session import jvm_start_error

    banners = ["WARNING: Using incubator modules: jdk.incubator.vector",
               "Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties",
               "26/11/26 12:03:52 WARN Utils: Set SPARK_LOCAL_IP if you need to bind to another address"]
    assert jvm_start_error(banners + ["Invalid maximum heap size: -Xmxlots",
                                      "Error: Could not create the Java Virtual Machine."]) == (
        "Invalid maximum heap size: -Xmxlots")
    assert jvm_start_error(banners + ['Exception in thread "main" org.apache.spark.SparkException: Master must',
                                      "\tat org.apache.spark.deploy.SparkSubmit.error(SparkSubmit.scala:1068)"]) == (
        "org.apache.spark.SparkException: Master must")
    assert jvm_start_error(banners + ["26/11/26 12:05:43 ERROR StandaloneSchedulerBackend: Application has been "
                                      "killed. Reason: All masters are unresponsive! Giving up."], exited=False) == (
        "StandaloneSchedulerBackend: Application has been killed. Reason: All masters are unresponsive! Giving up.")
    assert jvm_start_error(banners + [":: loading settings :: url = jar:file:/x"], exited=False) is None


# ---- Spark endpoints that do not answer, and Spark starts that fail (docs/bad-input.md "spark-start")

_ROWS: dict[str, tuple[str, str]] = {}


def _row(key: str, what: str, error: str, message: str, port: int | None = None) -> str:
    """Record ``error: message`` as the docs row ``key`` (a test's random port shown as <port>)."""
    shown = message.replace(f":{port}", ":<port>") if port else message
    _ROWS[key] = (what, f"`{error}`: {shown}")
    return message


@pytest.mark.timeout(120)  # the Connect client's default retries wait ten minutes
def test_an_unreachable_spark_connect_server_fails_the_ingest_naming_connection_and_address(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, client: Any,
        pravega_default_conn: str, unique_name: Any) -> None:
    from airflow_provider_pravega.operators import PravegaTransactionalIngestOperator

    port = free_port()
    _connection(monkeypatch, "spark_connect_down", conn_type="spark_connect", host="127.0.0.1", port=port)
    scope = unique_name("scdown")
    client.admin.create_scope(scope)
    (tmp_path / "a.jsonl").write_text('{"k": "a"}\n')
    task = PravegaTransactionalIngestOperator(task_id="ingest", scope=scope, stream="s", source=str(tmp_path),
                                              create_stream=True, spark_conn_id="spark_connect_down")
    # On the provider's logger itself: Airflow replaces the root logger's handlers when it sets its
    # logging up (on the first connection it reads), caplog's among them.
    session_log = logging.getLogger("airflow_provider_pravega.spark.session")
    monkeypatch.setattr(session_log, "level", logging.INFO)
    session_log.addHandler(caplog.handler)
    try:
        with pytest.raises(SparkSessionError) as info:
            task.execute({})
    finally:
        session_log.removeHandler(caplog.handler)
    message = _row("connect-refused", "`spark_conn_id` → a `spark_connect` connection to a closed port",
                   "SparkSessionError", str(info.value), port)
    assert message.startswith(f"Spark Connect server sc://127.0.0.1:{port} (connection 'spark_connect_down') is "
                              f"unreachable: ")
    assert "Connection refused" in message
    assert f"connecting to Spark Connect server sc://127.0.0.1:{port} (connection 'spark_connect_down')" in caplog.text


@pytest.mark.timeout(120)
def test_a_spark_connect_server_that_never_answers_fails_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port that takes the TCP connection but never speaks (a hung server, a wrong service):
    each call has a deadline while the session starts."""
    from airflow_provider_pravega.spark import session as spark_session

    monkeypatch.setattr(spark_session, "CONNECT_TIMEOUT_S", 1.0)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        _connection(monkeypatch, "spark_connect_silent", conn_type="spark_connect", host="127.0.0.1", port=port)
        with pytest.raises(SparkSessionError) as info:
            get_spark_session("spark_connect_silent", "t")
    message = _row("connect-silent", "`spark_connect` connection to a port that accepts but never answers "
                                     "(deadline 1 s here, 15 s by default)", "SparkSessionError", str(info.value), port)
    assert message.startswith(f"Spark Connect server sc://127.0.0.1:{port} (connection 'spark_connect_silent') is "
                              f"unreachable: no answer within 1 s")


@pytest.mark.timeout(120)
def test_a_task_timeout_interrupts_the_connect_and_is_not_reported_as_unreachable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Airflow's execution_timeout (SIGALRM) and kill (SIGTERM → on_kill) arrive as signals in the
    task's main thread: the wait for the server gives way and the interrupt passes unchanged."""
    from airflow.sdk.exceptions import AirflowTaskTimeout
    from airflow.sdk.execution_time.timeout import timeout

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        _connection(monkeypatch, "spark_connect_slow", conn_type="spark_connect", host="127.0.0.1",
                    port=silent.getsockname()[1])
        with pytest.raises(AirflowTaskTimeout), timeout(1):
            get_spark_session("spark_connect_slow", "t")


def test_an_unreachable_standalone_master_fails_naming_connection_and_master(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    _connection(monkeypatch, "spark_master_down", conn_type="spark", host="spark://127.0.0.1", port=port)
    with pytest.raises(SparkSessionError) as info:
        get_spark_session("spark_master_down", "t")
    message = _row("master-refused", "`spark` connection whose master is `spark://127.0.0.1:<closed port>`",
                   "SparkSessionError", str(info.value), port)
    assert message.startswith(f"Spark master spark://127.0.0.1:{port} (host of connection 'spark_master_down') is "
                              f"unreachable: 127.0.0.1:{port}: [Errno 111] Connection refused")


# Spark starts in a process of their own (this one's JVM runs already, with other settings). The
# stand-in spark-submit fails as a forked child that gRPC's fork handler killed before it ran
# spark-submit (grpc/grpc#43055), once, then runs the real one.
_FORK_DIES_ONCE = """#!/bin/sh
if [ ! -e "$0.died" ]; then
  touch "$0.died"
  echo "E1126 12:09:30.801070   17001 ev_epoll1_linux.cc:373] (event_engine) Epoll1Poller:0x55dd12f55b00" \
       "encountered epoll_wait error: Bad file descriptor" >&2
  exit 134
fi
SPARK_HOME="$REAL_SPARK_HOME" exec "$REAL_SPARK_HOME/bin/spark-submit" "$@"
"""

_STARTS = r"""
import json, logging, os, sys
from airflow_provider_pravega.spark.session import get_spark_session, spark_target
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.getMessage()))
keep = Keep()
spark_target("spark_garbage")  # Airflow sets its logging up when it first reads a connection

def attempt(case, conn_id=None, spark_home=None, env=None, cwd=None, **conf):
    del records[:]
    saved = {name: os.environ.get(name) for name in env or {}}, os.getcwd()
    os.environ.update(env or {})
    if cwd:
        os.chdir(cwd)
    log = logging.getLogger("airflow_provider_pravega.spark.session")
    log.addHandler(keep)
    log.setLevel(logging.INFO)
    if spark_home:
        os.environ["SPARK_HOME"] = spark_home
    try:
        get_spark_session(conn_id, "bad-start", **conf)
        result = {"session": True}
    except Exception as exc:
        result = {"error": type(exc).__name__, "message": str(exc), "cause": type(exc.__cause__).__name__}
    os.environ.pop("SPARK_HOME", None)
    for name, value in saved[0].items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    os.chdir(saved[1])
    result["warnings"] = [m for level, m in records if level == "WARNING"]
    print("CASE " + json.dumps({case: result}), flush=True)

attempt("driver-memory", **{"spark.driver.memory": "lots"})
attempt("garbage-master", "spark_garbage")
# The cut archive given by the environment, none by the provider (its archive directory is empty).
attempt("jvm-crash", env={"SPARK_SUBMIT_OPTS": f"-XX:SharedArchiveFile={sys.argv[2]}/cut.jsa",
                          "PRAVEGA_SPARK_CLASS_ARCHIVE_DIR": sys.argv[2]}, cwd=sys.argv[2],
        **{"spark.master": "local[1]", "spark.ui.enabled": "false"})
attempt("shuffle-partitions", spark_home=sys.argv[1],
        **{"spark.sql.shuffle.partitions": "-1", "spark.nonsense.key": "x"})
attempt("unknown-key", **{"spark.nonsense.key": "x", "spark.master": "local[1]", "spark.app.name": "named"})
"""


@pytest.fixture(scope="module")
def bad_starts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each bad start's error (or session) and the provider's warnings, from one process."""
    import pyspark

    home = tmp_path_factory.mktemp("spark-home")
    (home / "bin").mkdir()
    (home / "bin" / "spark-submit").write_text(_FORK_DIES_ONCE)
    (home / "bin" / "spark-submit").chmod(0o755)
    env = {**os.environ, "REAL_SPARK_HOME": os.path.dirname(pyspark.__file__),
           "AIRFLOW_CONN_SPARK_GARBAGE": json.dumps({"conn_type": "spark", "host": "garbage://nowhere",
                                                     "port": 7077})}
    env.pop("SPARK_HOME", None)
    crash_dir = _cut_class_archive(home / "crash")
    done = subprocess.run([sys.executable, "-c", _STARTS, str(home), str(crash_dir)],
                          capture_output=True, text=True, timeout=600, env=env,
                          cwd=str(Path(__file__).resolve().parents[1]))
    cases: dict[str, dict[str, Any]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("CASE "):
            cases.update(json.loads(line[5:]))
    assert len(cases) == 5, done.stdout[-3000:] + done.stderr[-3000:]
    cases["jvm-crash"]["directory"] = str(crash_dir)
    return cases


def _cut_class_archive(directory: Path) -> Path:
    """``directory`` with ``cut.jsa``: the first half of a small dynamic class archive (the classes
    of ``java -version``), which crashes a JVM that maps it (SIGBUS)."""
    from airflow_provider_pravega.spark.class_archive import _java

    directory.mkdir()
    whole = directory / "whole.jsa"
    subprocess.run([str(_java()), f"-XX:ArchiveClassesAtExit={whole}", "-Xlog:cds=off", "-version"],
                   capture_output=True, check=True, timeout=120)
    data = whole.read_bytes()
    (directory / "cut.jsa").write_bytes(data[:len(data) // 2])
    return directory


def _reported(result: dict[str, Any]) -> tuple[str, str]:
    assert result.get("error") == "SparkSessionError", result
    return result["error"], result["message"]


def test_a_bad_memory_setting_names_the_jvm_error_and_the_setting(bad_starts: dict[str, dict[str, Any]]) -> None:
    result = bad_starts["driver-memory"]
    message = _row("driver-memory", '`spark_conf={"spark.driver.memory": "lots"}`', *_reported(result))
    assert message.startswith("Spark could not start: Invalid maximum heap size: -Xmxlots; from spark_conf "
                              "'spark.driver.memory'='lots'")
    assert result["cause"] == "PySparkRuntimeError"  # raised from JAVA_GATEWAY_EXITED


def test_a_bad_master_url_names_the_jvm_error_and_the_connection(bad_starts: dict[str, dict[str, Any]]) -> None:
    result = bad_starts["garbage-master"]
    message = _row("garbage-master", "`spark` connection host `garbage://nowhere`, port 7077", *_reported(result))
    assert message.startswith("Spark could not start: org.apache.spark.SparkException: Master must either be yarn or "
                              "start with spark, k8s, or local; from the master 'garbage://nowhere:7077' (host of "
                              "connection 'spark_garbage')")
    assert result["cause"] == "PySparkRuntimeError"


def test_a_jvm_that_crashed_at_start_is_named_with_its_report_not_blamed_on_the_settings(
        bad_starts: dict[str, dict[str, Any]]) -> None:
    """A driver JVM that crashed (here mapping a class archive cut short, given by SPARK_SUBMIT_OPTS)
    writes its crash report where it runs and its summary to stdout: the error names the crash,
    the report and the archive, and none of the task's settings."""
    result = bad_starts["jvm-crash"]
    error, message = _reported(result)
    crash_dir = Path(result["directory"])
    report = re.search(r"its crash report: (\S+hs_err_pid\d+\.log);", message)
    assert message.startswith("Spark could not start: the driver's JVM crashed (SIGBUS"), message
    assert report and Path(report.group(1)).parent == crash_dir and Path(report.group(1)).is_file(), message
    assert f"it crashed mapping the class archive {crash_dir}/cut.jsa, which is damaged" in message
    assert "spark.ui.enabled" not in message and "spark.master" not in message and "local[1]" not in message
    shown = re.sub(r"pid\d+", "pid…", message.replace(str(crash_dir), "/data"))
    shown = re.sub(r"\(SIGBUS \(0x7\) in [^)]*\)\+0x[0-9a-f]+\)", "(SIGBUS (0x7) in …)", shown)
    _row("jvm-crash", "driver JVM that crashed at start (a class archive cut short, from `SPARK_SUBMIT_OPTS`)",
         error, shown)


def test_a_setting_spark_rejects_is_named_at_start_not_blamed_on_the_source(
        bad_starts: dict[str, dict[str, Any]]) -> None:
    """Spark checks SQL settings when the session is first used: that is now at start. The JVM's
    process, killed once by gRPC's fork handler before it ran, was started again."""
    result = bad_starts["shuffle-partitions"]
    message = _row("shuffle-partitions", '`spark_conf={"spark.sql.shuffle.partitions": "-1", '
                                         '"spark.nonsense.key": "x"}`', *_reported(result))
    assert message.startswith("Spark rejected a setting: [INVALID_CONF_VALUE.REQUIREMENT] The value '-1' in the config "
                              '"spark.sql.shuffle.partitions" is invalid.')
    assert message.endswith("from spark_conf 'spark.sql.shuffle.partitions'='-1'")
    assert any("the JVM's process died before it started" in w and "epoll_wait error" in w
               for w in result["warnings"]), result["warnings"]


def test_an_unknown_setting_starts_with_a_warning_naming_it(bad_starts: dict[str, dict[str, Any]]) -> None:
    result = bad_starts["unknown-key"]
    assert result.get("session") is True, result
    assert result["warnings"] == ["spark_conf 'spark.nonsense.key' is not a setting this Spark knows: Spark keeps it "
                                  "but ignores it unless a library reads it; check its spelling"]


def test_the_bad_input_doc_lists_the_spark_start_errors(bad_starts: dict[str, dict[str, Any]]) -> None:
    """Runs last in this file: the rows the tests above recorded, in a fixed order."""
    order = ["connect-refused", "connect-silent", "master-refused", "garbage-master", "driver-memory",
             "jvm-crash", "shuffle-partitions"]
    assert set(_ROWS) == set(order), f"run the whole file: missing rows {set(order) - set(_ROWS)}"
    rows = [_ROWS[key] for key in order]
    rows.append(('`spark_conf={"spark.nonsense.key": "x"}` alone', "starts; warning: "
                 + bad_starts["unknown-key"]["warnings"][0]))
    check_section("spark-start", "Spark sessions and connections", "tests/test_spark_session.py", rows,
                  "Each but the last fails before the task reads or writes anything. A Spark Connect server or "
                  "standalone master that does not answer fails within seconds (a few retries, a 15 s deadline per "
                  "call at start).")


def test_a_cluster_keeps_its_own_shuffle_partitions_and_ui():
    """Only a local session (inside the Airflow task) gets this machine's core count as shuffle
    partitions and no UI; a cluster master keeps what its operators configured (issue 28)."""
    from airflow_provider_pravega.spark.session import session_defaults

    local = session_defaults("local[*]")
    assert local["spark.ui.enabled"] == "false" and int(local["spark.sql.shuffle.partitions"]) >= 2
    for master in ("spark://master:7077", "yarn", "k8s://https://api:6443"):
        cluster = session_defaults(master)
        assert "spark.sql.shuffle.partitions" not in cluster and "spark.ui.enabled" not in cluster
        assert cluster["spark.ui.showConsoleProgress"] == "false"


def test_a_local_session_gets_the_parallel_collector_unless_its_java_options_are_chosen(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A local session's JVM gets -XX:+UseParallelGC (under G1 an export spent a median 0.36 CPU-s
    more, mostly in the JIT compiler: docs/benchmarks.md) and a small initial heap; never on a
    cluster, and never when the task's settings, spark-defaults.conf or a JAVA_TOOL_OPTIONS-style
    variable choose the driver's Java options, a collector (the JVM refuses two collectors) or an
    initial heap (which ours would override)."""
    from airflow_provider_pravega.spark.session import LOCAL_JVM_OPTIONS, session_defaults

    for name in _JAVA_OPTION_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.setenv("PRAVEGA_SPARK_CLASS_ARCHIVE_DIR", str(tmp_path / "no-archives"))  # the collector alone
    key = "spark.driver.extraJavaOptions"
    assert LOCAL_JVM_OPTIONS == "-XX:+UseParallelGC -Xms64m"
    assert session_defaults("local[*]")[key] == LOCAL_JVM_OPTIONS
    assert session_defaults("local[2]", {"spark.sql.shuffle.partitions": "3"})[key] == LOCAL_JVM_OPTIONS
    assert key not in session_defaults("yarn") and key not in session_defaults("spark://master:7077")
    for conf in ({key: "-Xss1m"}, {"spark.driver.defaultJavaOptions": "-XX:+UseSerialGC"}):
        assert key not in session_defaults("local[*]", conf)
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-XX:MaxRAMPercentage=50")  # no collector: still ours
    assert session_defaults("local[*]")[key] == LOCAL_JVM_OPTIONS
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Xss1m -XX:+UseZGC")
    assert key not in session_defaults("local[*]")
    monkeypatch.delenv("JAVA_TOOL_OPTIONS")
    for initial_heap in ("-Xms1g", "-XX:InitialRAMPercentage=5"):
        monkeypatch.setenv("JDK_JAVA_OPTIONS", initial_heap)
        assert key not in session_defaults("local[*]")
    monkeypatch.delenv("JDK_JAVA_OPTIONS")
    (tmp_path / "spark-defaults.conf").write_text("spark.driver.memory 2g\nspark.driver.extraJavaOptions=-XX:+UseG1GC\n")
    assert key not in session_defaults("local[*]")


def test_the_local_session_runs_the_parallel_collector(tmp_path: Path) -> None:
    """The default reaches the JVM: a session the provider starts in a process whose environment
    chooses no Java options (the suite's own SPARK_SUBMIT_OPTS, tests/conftest.py, removed) runs
    the parallel collector."""
    import subprocess
    import sys

    code = (
        "from airflow_provider_pravega.spark.session import get_spark_session\n"
        "spark = get_spark_session(None, 'gc-check', **{'spark.master': 'local[1]'})\n"
        "beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()\n"
        "print(sorted(str(b.getName()) for b in beans))\n"
        "spark.stop()\n")
    env = {k: v for k, v in os.environ.items()
           if k not in _JAVA_OPTION_VARIABLES}
    env["SPARK_CONF_DIR"] = str(tmp_path)  # no spark-defaults.conf
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "['PS MarkSweep', 'PS Scavenge']", done.stdout


def test_a_shared_spark_connect_session_id_is_keyed_by_what_the_task_asks_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Task processes asking for the same server, job and settings in the same window share one
    server-side session (one Python daemon on the server instead of one per task); anything else,
    and the next window, gets another. The URL's token is not part of the id."""
    import uuid

    from airflow_provider_pravega.spark.session import (
        SHARED_SESSION_WINDOW_S,
        _with_session_id,
        shared_session_id,
        sharing_sessions,
    )

    now = 1_000 * SHARED_SESSION_WINDOW_S + 5
    url = "sc://spark.example:15002/;user_id=etl"
    sid = shared_session_id(url, "pravega-ingest-d.t", {"spark.sql.ansi.enabled": "true"}, now)
    assert uuid.UUID(sid).version == 4
    assert sid == shared_session_id(url + ";token=secret", "pravega-ingest-d.t", {"spark.sql.ansi.enabled": "true"},
                                    now + SHARED_SESSION_WINDOW_S - 10)
    others = {shared_session_id(url, "pravega-ingest-d.other", {"spark.sql.ansi.enabled": "true"}, now),
              shared_session_id(url, "pravega-ingest-d.t", {}, now),
              shared_session_id("sc://spark.example:15002/;user_id=bi", "pravega-ingest-d.t",
                                {"spark.sql.ansi.enabled": "true"}, now),
              shared_session_id(url, "pravega-ingest-d.t", {"spark.sql.ansi.enabled": "true"},
                                now + SHARED_SESSION_WINDOW_S)}
    assert sid not in others and len(others) == 4
    assert _with_session_id("sc://h:1", sid) == f"sc://h:1/;session_id={sid}"
    assert _with_session_id(url, sid) == f"{url};session_id={sid}"
    monkeypatch.delenv("PRAVEGA_SPARK_CONNECT_SHARED_SESSION", raising=False)
    assert sharing_sessions()
    monkeypatch.setenv("PRAVEGA_SPARK_CONNECT_SHARED_SESSION", "false")
    assert not sharing_sessions()


def test_the_shared_sessions_window_can_span_days_and_a_bad_window_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """PRAVEGA_SPARK_CONNECT_SESSION_WINDOW_S widens the window (a server keeping sessions for days):
    a daily run then gets yesterday's session id; with the default half hour it does not. A window
    that is not a positive number of seconds is refused, naming the setting."""
    from airflow_provider_pravega.spark.session import SparkSessionError, shared_session_id

    url, job = "sc://spark.example:15002", "pravega-ingest-d.t"
    day = 86_400
    monday = 20_000 * 7 * day + 3600  # the start of a 7-day window, one hour in
    monkeypatch.delenv("PRAVEGA_SPARK_CONNECT_SESSION_WINDOW_S", raising=False)
    assert shared_session_id(url, job, {}, monday) != shared_session_id(url, job, {}, monday + day)
    monkeypatch.setenv("PRAVEGA_SPARK_CONNECT_SESSION_WINDOW_S", str(7 * day))
    week = {shared_session_id(url, job, {}, monday + n * day) for n in range(7)}
    assert len(week) == 1 and shared_session_id(url, job, {}, monday + 7 * day) not in week
    for bad in ("0", "-5", "a week", "1.5"):
        monkeypatch.setenv("PRAVEGA_SPARK_CONNECT_SESSION_WINDOW_S", bad)
        with pytest.raises(SparkSessionError, match="PRAVEGA_SPARK_CONNECT_SESSION_WINDOW_S=.*not a positive"):
            shared_session_id(url, job, {}, monday)


def test_a_closed_shared_session_is_replaced_and_a_given_session_id_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ingest joins the shared session; when the server has closed it (its idle timeout), the
    task opens a new session of its own; a URL naming a session, and sharing turned off, keep
    the URL as given. Anything else that fails the start is raised as it is."""
    from airflow_provider_pravega.spark import session as session_module

    calls: list[tuple[str, bool]] = []
    closed = {"yes": True}

    def fake_open(remote: str, app_name: str, wanted: dict, source: str, shared: bool = False) -> str:
        calls.append((remote, shared))
        if shared and closed["yes"]:
            cause = RuntimeError("[INVALID_HANDLE.SESSION_CLOSED] The handle x is invalid. Session was closed.")
            raise SparkSessionError("Spark Connect server sc://h:1 is unreachable") from cause
        return remote

    monkeypatch.setattr(session_module, "_open_connect", fake_open)
    monkeypatch.delenv("PRAVEGA_SPARK_CONNECT_SHARED_SESSION", raising=False)
    assert session_module._connect("sc://h:1", "job", {}, "test", share=True) == "sc://h:1"
    assert [shared for _, shared in calls] == [True, False] and "/;session_id=" in calls[0][0]
    calls.clear()
    closed["yes"] = False
    assert "/;session_id=" in session_module._connect("sc://h:1", "job", {}, "test", share=True)
    given = "sc://h:1/;session_id=0ede3b47-6304-482c-ac1f-5576c5294fab"
    assert session_module._connect(given, "job", {}, "test", share=True) == given
    assert session_module._connect("sc://h:1", "job", {}, "test") == "sc://h:1"
    monkeypatch.setenv("PRAVEGA_SPARK_CONNECT_SHARED_SESSION", "false")
    assert session_module._connect("sc://h:1", "job", {}, "test", share=True) == "sc://h:1"

    def refused(remote: str, app_name: str, wanted: dict, source: str, shared: bool = False) -> str:
        raise SparkSessionError("Spark Connect server sc://h:1 is unreachable: connection refused")

    monkeypatch.setattr(session_module, "_open_connect", refused)
    monkeypatch.delenv("PRAVEGA_SPARK_CONNECT_SHARED_SESSION")
    with pytest.raises(SparkSessionError, match="connection refused"):
        session_module._connect("sc://h:1", "job", {}, "test", share=True)
