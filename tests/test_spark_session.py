"""How a task's ``spark_conn_id`` and ``spark_conf`` become a SparkSession: the Spark provider's
``spark`` and ``spark_connect`` connections, the local fallback only for ``spark_default``, and no
silent reuse of an active session that differs from what the task asks for."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_pravega.spark.session import SparkSessionError, get_spark_session, spark_target


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
