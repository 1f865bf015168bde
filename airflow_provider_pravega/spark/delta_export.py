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
them, hiding them from their readers). A write whose commit loses to a concurrent commit is done
again: the lost commit left nothing, and the write replaces its interval or finds it committed.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyspark
from pyspark.sql import functions as F

from airflow_provider_pravega.spark.export_spec import ExportError

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


#: How often an interval is written again after its commit lost to a concurrent commit to the
#: table (Delta's optimistic concurrency: the lost commit left nothing in the table).
CONFLICT_RETRIES = 3
#: Delta's errors for a commit that lost to a concurrent one (its ``io.delta.exceptions`` classes,
#: and their error classes as Spark Connect reports them).
_CONFLICTS = ("io.delta.exceptions.Concurrent", "ProtocolChangedException", "MetadataChangedException",
              "[DELTA_CONCURRENT_", "[DELTA_PROTOCOL_CHANGED]", "[DELTA_METADATA_CHANGED]")


def write_interval(spark: Any, frame: Any, *, path: str | None = None, table: str | None = None, export_id: str,
                   scope: str, stream: str, interval: str, start_cut: str, end_cut: str,
                   pieces: Sequence[Sequence[str]] | None = None,
                   check_location: Callable[[], None] | None = None) -> DeltaWrite:
    """Write ``frame`` (the export's rows) as interval ``interval`` of the Delta table at ``path``,
    or of the catalog table ``table`` (one of the two; ExportSpec checked the name).
    ``check_location`` is called before the write when no Delta table is at ``path`` yet (it raises
    when the path must not become one).

    A write whose commit lost to a concurrent commit (another export of the table) is done again,
    up to :data:`CONFLICT_RETRIES` times: safe, as the lost commit added nothing and the write
    replaces its interval, or is skipped when the other commit was this interval's transaction."""
    if (path is None) == (table is None):
        raise ValueError("write_interval writes to a path or a catalog table: give exactly one")
    app_id = f"pravega-export:{export_id}:{interval}"
    txn_version = len(pieces) if pieces else 1
    metadata = {"export_id": export_id, "scope": scope, "stream": stream, "interval": interval,
                "start_cut": start_cut, "end_cut": end_cut, "txn_app_id": app_id, "txn_version": txn_version}
    if pieces:
        metadata["pieces"] = [list(p) for p in pieces]
    shown = path if path is not None else f"table {table}"
    for attempt in range(CONFLICT_RETRIES + 1):
        try:
            return _write_once(spark, frame, path, table, scope, stream, interval, app_id, txn_version, metadata,
                               check_location)
        except ExportError:
            raise
        except Exception as exc:  # noqa: BLE001 - said clearly when it is known, else as Spark says
            conflict = next((line.strip().lstrip(": ") for line in str(exc).splitlines()
                             if any(c in line for c in _CONFLICTS)), None)
            if conflict is None:
                clear = _write_failure(spark, exc, table)
                if clear is not None:
                    raise clear from None
                raise
            if attempt == CONFLICT_RETRIES:
                raise ExportError(
                    f"delta table {shown}: the write of interval {interval} lost to a concurrent commit "
                    f"{CONFLICT_RETRIES + 1} times ({conflict}); another writer keeps changing the table: run one "
                    "export of a table at a time, then run this one again (its interval is written once)") from None
            log.warning("delta table %s: the commit of interval %s lost to a concurrent commit (%s); writing it "
                        "again (nothing of it was committed)", shown, interval, conflict)
    raise AssertionError("unreachable")


def _write_once(spark: Any, frame: Any, path: str | None, table: str | None, scope: str, stream: str, interval: str,
                app_id: str, txn_version: int, metadata: Mapping[str, Any],
                check_location: Callable[[], None] | None) -> DeltaWrite:
    ref = f"delta.`{path}`" if path is not None else str(table)
    shown = path if path is not None else f"table {table}"
    before = _history(spark, ref, limit=1)
    if not before and path is not None and check_location is not None:
        check_location()
    rows = (frame.withColumn("scope", F.lit(scope)).withColumn("stream", F.lit(stream))
            .withColumn(INTERVAL_COLUMN, F.lit(interval)))
    writer = (rows.write.format("delta").mode("overwrite").partitionBy(INTERVAL_COLUMN)
              .option("replaceWhere", f"{INTERVAL_COLUMN} = {_sql_text(interval)}")
              .option("txnAppId", app_id).option("txnVersion", str(txn_version))
              .option("userMetadata", json.dumps(metadata, sort_keys=True)))
    if path is not None:
        writer.save(path)
    else:
        writer.saveAsTable(table)
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


def _write_failure(spark: Any, exc: BaseException, table: str | None) -> Exception | None:
    """A clear error for a failed write whose cause is Delta's side: no Delta in the session, or a
    catalog name that is not a Delta table (a location that cannot be written: the caller)."""
    missing = _missing_delta(exc)
    if missing is not None:
        return missing
    return _table_problem(spark, exc, table) if table is not None else None


def _name_parts(table: str) -> list[str]:
    return [part.strip("`") for part in re.findall(r"`[^`]+`|[^.`]+", table.strip())]


def _table_problem(spark: Any, exc: BaseException, table: str) -> Exception | None:
    """What is wrong with the catalog name ``table`` when Spark refused it (None if not that)."""
    text = str(exc)
    parts = _name_parts(table)
    if "EXPECT_TABLE_NOT_VIEW" in text:
        return ExportError(f"table {table!r} is a view, not a Delta table: a Delta export writes into a table; name a "
                           "Delta table, or a new one (created at the first export)")
    if "DELTA_ONLY_OPERATION" in text or "is not a Delta table" in text:
        provider = _provider(spark, table)
        return ExportError(f"table {table!r} is not a Delta table" + (f" (it is a {provider} table)" if provider else "")
                           + ": a Delta export writes its intervals into a Delta table; name a Delta table, or a new "
                           "one (created at the first export)")
    if "REQUIRES_SINGLE_PART_NAMESPACE" in text and len(parts) == 3:
        return ExportError(f"table {table!r}: the session has no catalog {parts[0]!r} (a three-part name is "
                           f"catalog.database.table): configure it with spark.sql.catalog.{parts[0]}=<its class>, or "
                           "name a table of the session's catalog as database.table")
    if "SCHEMA_NOT_FOUND" in text and len(parts) >= 2:
        return ExportError(f"table {table!r}: the catalog has no database {parts[-2]!r}: create it (CREATE DATABASE "
                           f"{parts[-2]}) or name a table in another database")
    return None


def _provider(spark: Any, table: str) -> str | None:
    """The catalog table's format (its ``Provider``, e.g. ``parquet``), if the catalog says."""
    try:
        rows = spark.sql(f"DESCRIBE TABLE EXTENDED {table}").collect()
    except Exception:  # noqa: BLE001 - only for the message
        return None
    return next((str(row["data_type"]).strip() for row in rows if str(row["col_name"]).strip() == "Provider"), None)


def _version_of(history: Sequence[Any], app_id: str, txn_version: int) -> int | None:
    for commit in history:
        try:
            meta = json.loads(commit["userMetadata"] or "{}")
        except ValueError:
            continue
        if meta.get("txn_app_id") == app_id and int(meta.get("txn_version") or 0) >= txn_version:
            return commit["version"]
    return None
