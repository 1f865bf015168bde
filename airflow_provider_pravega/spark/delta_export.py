"""An export's interval written into a Delta Lake table, exactly once whatever the order of runs.

Why a table and not a folder: readers get snapshot isolation and an atomic commit on any
filesystem, object stores included. How it is exactly once: each interval is the table partition
``interval_key = <interval>``, written with ``mode("overwrite")`` + ``replaceWhere`` on it, so a
write replaces exactly that interval's rows, and as an idempotent Delta write
(``txnAppId``/``txnVersion``): a retry, rerun or backfill of an interval already written is a
no-op that Delta itself decides. The app id is per interval, so an older interval exported after a
newer one is written, not skipped (Delta skips a version not above the app id's last one). The
version is 1, or for ``from_ingest`` exports the number of the ingest's committed pieces, so an
interval whose ingest added a later range is written again (replacing it) once. Each commit's user
metadata names the export, the interval and its stream cuts.

The table is a location (``path``: written with ``save``) or a catalog table (``table``, e.g.
``lake.readings``, resolved by the session's catalog, Delta's ``DeltaCatalog`` as
``spark_catalog``: written with ``saveAsTable``, which takes the same ``replaceWhere`` and
``txnAppId``/``txnVersion`` options and creates the table at the first export).

A location that holds other files but no Delta table is refused (Delta would write its log beside
them, hiding them from their readers).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: The table's partition column: the export's interval key.
INTERVAL_COLUMN = "interval_key"
#: Delta Lake's Spark package per Spark minor (Delta publishes one artifact per Spark minor).
DELTA_PACKAGES = {"4.2": "io.delta:delta-spark_4.2_2.13:4.4.0"}
DELTA_SQL_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def delta_package() -> str | None:
    import pyspark

    return DELTA_PACKAGES.get(".".join(pyspark.__version__.split(".")[:2]))


def session_conf(conf: Mapping[str, Any]) -> dict[str, str]:
    """``conf`` plus what a new classic session needs for Delta: its package through
    ``spark.jars.packages`` (added to the packages given) and its SQL extension and catalog,
    unless set. A Spark version without a known Delta package gets none: Delta must then be on the
    cluster already. A Spark Connect session (``spark.remote``) is left as it is: its server has
    its own packages."""
    out = {str(k): str(v) for k, v in conf.items()}
    if "spark.remote" in out:
        return out
    package = delta_package()
    packages = [p.strip() for p in out.get("spark.jars.packages", "").split(",") if p.strip()]
    if package is not None and not any(p.startswith("io.delta:delta-spark_") for p in packages):
        out["spark.jars.packages"] = ",".join([*packages, package])
    for key, value in DELTA_SQL_CONF.items():
        out.setdefault(key, value)
    return out


@dataclass
class DeltaWrite:
    version: int  # the table version holding the interval (this write's, or the earlier one's)
    events: int  # rows the write added (0 when it was a no-op)
    skipped: bool  # Delta found this interval's version already committed: nothing was written
    location: str | None = None  # the table's location (a catalog table: as its catalog reports it)


def _history(spark: Any, table: str, limit: int | None = None) -> list[Any]:
    """The commits of ``table`` (a SQL table reference), newest first (the ``limit`` newest); []
    when there is no table yet."""
    try:
        return spark.sql(f"DESCRIBE HISTORY {table}" + (f" LIMIT {limit}" if limit else "")).collect()
    except Exception as exc:  # noqa: BLE001 - Spark's error classes differ between classic and Connect
        text = str(exc)
        if ("DELTA_MISSING_DELTA_TABLE" in text or "is not a Delta table" in text or "PATH_NOT_FOUND" in text
                or "TABLE_OR_VIEW_NOT_FOUND" in text):
            return []
        raise _missing_delta(exc) or exc


def table_location(spark: Any, table: str) -> str | None:
    """The location of the catalog table ``table`` as its catalog reports it (None if it reports
    none)."""
    try:
        rows = spark.sql(f"DESCRIBE DETAIL {table}").collect()
    except Exception:  # noqa: BLE001 - a catalog without locations: the table is named by its name
        return None
    location = rows[0]["location"] if rows else None
    return str(location) if location else None


def _missing_delta(exc: BaseException) -> Exception | None:
    from airflow_provider_pravega.spark.export_job import ExportError

    text = str(exc)
    if "DATA_SOURCE_NOT_FOUND" in text or "Failed to find the data source: delta" in text or (
            "delta" in text and "ClassNotFoundException" in text) or (
            "PARSE_SYNTAX_ERROR" in text and "DESCRIBE HISTORY" in text):  # no Delta SQL extension
        package = delta_package() or "io.delta:delta-spark_<spark minor>_2.13:<version>"
        return ExportError(
            "format='delta' needs Delta Lake in the Spark session: start it with spark.jars.packages="
            f"{package}, spark.sql.extensions={DELTA_SQL_CONF['spark.sql.extensions']} and "
            f"spark.sql.catalog.spark_catalog={DELTA_SQL_CONF['spark.sql.catalog.spark_catalog']} (the export operator "
            "sets them for a session it starts), or install Delta on the cluster or Spark Connect server")
    return None


def _sql_text(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def write_interval(spark: Any, frame: Any, *, path: str | None = None, table: str | None = None, export_id: str,
                   scope: str, stream: str, interval: str, start_cut: str, end_cut: str,
                   pieces: Sequence[Sequence[str]] | None = None,
                   check_location: Callable[[], None] | None = None) -> DeltaWrite:
    """Write ``frame`` (the export's rows) as interval ``interval`` of the Delta table at ``path``,
    or of the catalog table ``table`` (one of the two; ExportSpec checked the name).
    ``check_location`` is called before the write when no Delta table is at ``path`` yet (it raises
    when the path must not become one)."""
    from pyspark.sql import functions as F

    if (path is None) == (table is None):
        raise ValueError("write_interval writes to a path or a catalog table: give exactly one")
    ref = f"delta.`{path}`" if path is not None else str(table)
    shown = path if path is not None else f"table {table}"
    app_id = f"pravega-export:{export_id}:{interval}"
    txn_version = len(pieces) if pieces else 1
    metadata = {"export_id": export_id, "scope": scope, "stream": stream, "interval": interval,
                "start_cut": start_cut, "end_cut": end_cut, "txn_app_id": app_id, "txn_version": txn_version}
    if pieces:
        metadata["pieces"] = [list(p) for p in pieces]
    before = _history(spark, ref, limit=1)
    if not before and path is not None and check_location is not None:
        check_location()
    rows = (frame.withColumn("scope", F.lit(scope)).withColumn("stream", F.lit(stream))
            .withColumn(INTERVAL_COLUMN, F.lit(interval)))
    writer = (rows.write.format("delta").mode("overwrite").partitionBy(INTERVAL_COLUMN)
              .option("replaceWhere", f"{INTERVAL_COLUMN} = {_sql_text(interval)}")
              .option("txnAppId", app_id).option("txnVersion", str(txn_version))
              .option("userMetadata", json.dumps(metadata, sort_keys=True)))
    try:
        if path is not None:
            writer.save(path)
        else:
            writer.saveAsTable(table)
    except Exception as exc:  # noqa: BLE001 - said clearly when Delta is missing, else as Spark says
        missing = _missing_delta(exc)
        if missing is not None:
            raise missing from None
        raise
    after = _history(spark, ref, limit=1)
    location = path if path is not None else table_location(spark, ref)
    newest_before = before[0]["version"] if before else -1
    if not after or after[0]["version"] == newest_before:  # Delta skipped it: which version holds it?
        version = _version_of(_history(spark, ref), app_id, txn_version)
        log.info("delta table %s: interval %s (txn %s v%d) was already written (version %s): nothing written", shown,
                 interval, app_id, txn_version, version)
        return DeltaWrite(version if version is not None else newest_before, 0, True, location)
    commit = after[0]
    metrics = commit["operationMetrics"] or {}
    return DeltaWrite(commit["version"], int(metrics.get("numOutputRows") or 0), False, location)


def _version_of(history: Sequence[Any], app_id: str, txn_version: int) -> int | None:
    for commit in history:
        try:
            meta = json.loads(commit["userMetadata"] or "{}")
        except ValueError:
            continue
        if meta.get("txn_app_id") == app_id and int(meta.get("txn_version") or 0) >= txn_version:
            return commit["version"]
    return None
