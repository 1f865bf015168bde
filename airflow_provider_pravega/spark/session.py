"""One place that decides how the provider gets a SparkSession.

The master comes from the Spark provider's connection (``spark_default``: host such as
``spark://master:7077``, ``yarn``, ``k8s://…`` or ``local[4]``); without that connection the job
runs in local mode on every core. Local mode is given task retries (``local[N,4]``) so that a
crashed task attempt is retried as it would be on a cluster.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

log = logging.getLogger(__name__)

LOCAL_TASK_RETRIES = 4


def spark_master_from_connection(spark_conn_id: str | None) -> tuple[str, dict[str, str]]:
    """(master URL, extra Spark conf) from an Airflow Spark connection, or local mode."""
    if not spark_conn_id:
        return _local(), {}
    try:
        from airflow.sdk import BaseHook  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - Airflow 3.0/3.1 layout
        from airflow.hooks.base import BaseHook  # type: ignore[no-redef]
    try:
        conn = BaseHook.get_connection(spark_conn_id)
    except Exception:  # the connection does not exist: the documented fallback
        log.info("no Airflow connection %r: running Spark in local mode", spark_conn_id)
        return _local(), {}
    host = (conn.host or "").strip()
    if not host:
        return _local(), {}
    master = host
    if conn.port and "://" in host and host.count(":") < 2:
        master = f"{host}:{conn.port}"
    extra = conn.extra_dejson or {}
    conf = {str(k): str(v) for k, v in (extra.get("conf") or {}).items()}
    if master.startswith("local"):
        master = _local(master)
    return master, conf


def _local(master: str = "local[*]") -> str:
    """``local[N]`` → ``local[N,retries]`` (Spark's local mode otherwise never retries a task)."""
    inner = master[len("local") :].strip("[]") or "*"
    if "," in inner:
        return master
    return f"local[{inner},{LOCAL_TASK_RETRIES}]"


def get_spark_session(spark_conn_id: str | None = "spark_default", app_name: str = "pravega", **conf: Any):
    """A SparkSession for the provider's jobs (an existing active session is reused)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    master, extra_conf = spark_master_from_connection(spark_conn_id)
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {
        "spark.ui.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.shuffle.partitions": str(max(2, os.cpu_count() or 2)),
        **extra_conf,
        **{k: str(v) for k, v in conf.items()},
    }
    if master.startswith("local"):
        # Python workers must be this interpreter (with pravega and this provider installed),
        # not whatever `python3` is first on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        settings.setdefault("spark.driver.host", "127.0.0.1")
        settings.setdefault("spark.driver.bindAddress", "127.0.0.1")
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
