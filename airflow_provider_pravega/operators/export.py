"""PravegaStreamCutExportOperator: what a stream received between two stream cuts → files, with PySpark."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator

from airflow_provider_pravega._streams import resolve_scope
from airflow_provider_pravega.assets import catalog_table_asset, table_asset
from airflow_provider_pravega.client.errors import StreamNotFoundError
from airflow_provider_pravega.client.ingest_location import check_state_scope
from airflow_provider_pravega.hooks.pravega import PravegaHook
from airflow_provider_pravega.openlineage import (
    catalog_table_dataset,
    file_dataset,
    operator_lineage,
    stream_dataset,
    table_dataset,
)
from airflow_provider_pravega.spark.export_spec import check_cut_option, check_target


class PravegaStreamCutExportOperator(BaseOperator):
    """Export the events of ``scope/stream`` between two stream cuts to Parquet, JSON lines or CSV.

    Scheduled runs are repeatable: the first run of a data interval records the interval's cuts
    in a state synchronizer (per ``export_id``), and every re-run or backfill of that interval
    reuses them, so it writes the same rows into files of the same names and bytes. With
    ``start_cut="previous"`` consecutive intervals tile the stream, without gap or overlap.
    The output directory appears atomically; a failed run leaves nothing at ``output_path``, and
    an existing directory there is replaced only by a re-run of the same export and cuts.

    :param scope: Scope of the stream (default: the connection's default scope).
    :param stream: The stream to export.
    :param output_path: Directory to write (templated, e.g. ``"/lake/readings/{{ ds }}/"``); a local
        path or any filesystem URL Spark can write (``s3a://``, ``hdfs://``...). With
        ``format="delta"``: the table's location. Give exactly one of ``output_path`` and ``table``.
    :param table: With ``format="delta"``, instead of ``output_path``: a catalog table,
        ``"db.table"`` or ``"catalog.db.table"`` (templated), resolved by the session's catalog
        (``spark_catalog`` is Delta's ``DeltaCatalog`` in a session the operator starts) and created
        at the first export. Written with the same idempotent Delta commits (``saveAsTable``). Its
        outlet is the name-based asset ``assets.catalog_table_asset(table)``
        (``spark-catalog://spark_catalog/db.table``); its OpenLineage output is the table's location
        as the catalog reports it (the same dataset as an ``output_path`` export there), else that
        name-based one.
    :param start_cut: ``"previous"`` (default: where the previous interval, or the previous export of
        this export id, ended; the head the first time), ``"head"``, ``"tail"``, a Pravega stream-cut
        text (e.g. an ingest's ``tail_cut`` from XCom) or its JSON form.
    :param end_cut: ``"tail"`` (default), ``"head"``, a stream-cut text or its JSON form. A literal
        cut that cannot be one fails when the DAG is parsed, a templated one at execute before any
        Spark work; both name ``start_cut``/``end_cut``.
    :param format: ``parquet`` (default), ``jsonl``, ``csv``, or ``delta`` (``iceberg`` is refused,
        naming why: no Iceberg Spark runtime for Spark 4.2 yet, see docs/export.md). ``output_path`` is then a
        Delta Lake table's location, each interval one partition (``interval_key``) written as an
        idempotent Delta commit, so retries, reruns and backfills of an interval never duplicate it
        (see docs/export.md). The operator adds Delta's package and SQL settings to a classic session
        it starts; a Spark Connect server or cluster must have Delta already. The table is an outlet
        of the task (``assets.table_asset(output_path)``, unless the path is templated) and its
        OpenLineage output, with the table version written.
    :param event_format: ``text`` (UTF-8, default), ``json`` (one column per top-level field) or
        ``binary``. Every row also has ``segment_id`` and ``offset``.
    :param export_id: Identity of this export's recorded cuts (default ``dag_id.task_id``).
    :param interval_key: The interval whose cuts are recorded (default: the run's data interval,
        ``"<start ISO>/<end ISO>"``; runs without a data interval continue "previous" plainly).
    :param from_ingest: The id of an exactly-once ingest into this stream (its ``ingest_id``; the
        ingest operator's default is ``"<dag_id>.<task_id>"``): export exactly what that ingest's
        runs of this data interval committed, whatever order the intervals ran in (catchup,
        backfills, late days), instead of ``start_cut``/``end_cut``. Events other writers appended
        to the stream while such a run committed are included. An interval the ingest did not
        record (yet) fails with ``IntervalNotIngestedError`` naming it: let the export wait for the
        ingest (e.g. an ``ExternalTaskSensor`` on its commit sensor, as the example DAGs do).
    :param state_scope: The scope that keeps this export's recorded cuts (templated; created if
        missing), so the stream's scope needs no create rights. Default: the stream's own scope.
        A new state scope starts with no recorded cuts ("previous" starts at the head again).
    :param ingest_state_scope: With ``from_ingest``: the scope that keeps the ingest's state (its
        ``state_scope``; templated). Default: ``state_scope``.
    :param on_truncated: ``fail`` (default) when the start cut lies before the stream's head, or
        ``head`` to start from the head there.
    :param num_partitions: Output files / Spark partitions (default: one per 128 MiB of payload, as
        Spark splits files, at most one per segment range; derived from the interval's cuts, so a
        re-run writes the same files). More partitions than that spread a large interval over more
        Spark cores; keep a given number fixed for an export id, since the files of a re-run are
        byte-identical only with the same number (figures: docs/benchmarks.md).
    :param json_schema: Spark DDL schema of JSON events (default: inferred from a sample).
    :param compression: Codec of the files (default: Spark's, snappy for Parquet). ``"none"`` spends
        less CPU in Spark's Parquet writer for larger files, ``"zstd"`` more for smaller ones
        (figures: docs/benchmarks.md).
    :param pravega_conn_id: The ``pravega`` connection.
    :param spark_conn_id: The Spark provider's ``spark`` connection (its host is the master URL) or
        ``spark_connect`` connection (``sc://…``, a stock or managed Connect server); local mode when
        ``spark_default`` does not exist, an error for any other missing id. See docs/deployment.md.
    :param spark_conf: Extra Spark settings.

    Returns (XCom) the start and end cut (stream-cut texts), event and byte counts, the files
    written, the interval and whether its cuts were reused from an earlier run.
    """

    template_fields: Sequence[str] = (
        "scope", "stream", "start_cut", "end_cut", "output_path", "export_id", "interval_key", "json_schema",
        "from_ingest", "state_scope", "ingest_state_scope", "table",
    )
    ui_color = "#9fd3c7"

    def __init__(
        self,
        *,
        stream: str,
        output_path: str | None = None,
        table: str | None = None,
        scope: str | None = None,
        start_cut: Any = "previous",
        end_cut: Any = "tail",
        format: str = "parquet",
        event_format: str = "text",
        export_id: str | None = None,
        interval_key: str | None = None,
        on_truncated: str = "fail",
        num_partitions: int | None = None,
        json_schema: str | None = None,
        compression: str | None = None,
        from_ingest: str | None = None,
        state_scope: str | None = None,
        ingest_state_scope: str | None = None,
        pravega_conn_id: str = PravegaHook.default_conn_name,
        spark_conn_id: str | None = "spark_default",
        spark_conf: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        _check_literal_cuts(scope, stream, start_cut, end_cut)  # before the task joins its DAG
        _check_literal_state_scopes(state_scope=state_scope, ingest_state_scope=ingest_state_scope)
        _check_literal_target(format, output_path, table)
        asset = None
        if format == "delta" and isinstance(output_path, str) and not _templated(output_path):
            asset = table_asset(output_path)
        elif format == "delta" and isinstance(table, str) and not _templated(table):
            asset = catalog_table_asset(table)
        if asset is not None:
            outlets = list(kwargs.get("outlets") or [])
            if all(getattr(o, "uri", None) != asset.uri for o in outlets):
                kwargs["outlets"] = [*outlets, asset]  # downstream DAGs can be scheduled on the table
        super().__init__(**kwargs)
        self.scope = scope
        self.stream = stream
        self.output_path = output_path
        self.table = table
        self.start_cut = start_cut
        self.end_cut = end_cut
        self.format = format
        self.event_format = event_format
        self.export_id = export_id
        self.interval_key = interval_key
        self.on_truncated = on_truncated
        self.num_partitions = num_partitions
        self.json_schema = json_schema
        self.compression = compression
        self.from_ingest = from_ingest
        self.state_scope = state_scope
        self.ingest_state_scope = ingest_state_scope
        self.pravega_conn_id = pravega_conn_id
        self.spark_conn_id = spark_conn_id
        self.spark_conf = spark_conf or {}
        self._result: dict[str, Any] | None = None
        self._scope_used: str | None = None

    @staticmethod
    def interval_of(context: Any) -> str | None:
        """``"<start>/<end>"`` of the run's data interval (None when the run has none)."""
        start = context.get("data_interval_start")
        end = context.get("data_interval_end")
        if start is None or end is None:
            return None
        return f"{start.isoformat()}/{end.isoformat()}"

    def execute(self, context: Any) -> dict[str, Any]:
        # pyspark is imported with the job: kept out of the scheduler's import of this module
        from airflow_provider_pravega.spark.export_job import ExportSpec, run_export
        from airflow_provider_pravega.spark.session import get_spark_session, starts_local_session

        hook = PravegaHook(self.pravega_conn_id)
        config = hook.get_config()
        scope = resolve_scope(self.scope, config, self.pravega_conn_id)
        self._scope_used = scope
        spec = ExportSpec(
            scope=scope, stream=self.stream, output_path=self.output_path, start_cut=self.start_cut,
            end_cut=self.end_cut, format=self.format, event_format=self.event_format,
            export_id=self.export_id or f"{self.dag_id}.{self.task_id}",
            interval_key=self.interval_key or self.interval_of(context), on_truncated=self.on_truncated,
            num_partitions=self.num_partitions, json_schema=self.json_schema or None,
            compression=self.compression or None, from_ingest=self.from_ingest or None,
            state_scope=self.state_scope, ingest_state_scope=self.ingest_state_scope, table=self.table or None,
        )
        spark_conf = dict(self.spark_conf)
        if spec.format == "delta":
            # pyspark is imported with the job: kept out of the scheduler's import of this module
            from airflow_provider_pravega.spark.delta_export import session_conf
            from airflow_provider_pravega.spark.session import spark_target

            if spark_target(self.spark_conn_id).remote is None:  # a Connect server has its own packages
                spark_conf = session_conf(spark_conf)
        # pyspark: spark.submit imports spark.session, kept out of the scheduler's import of this module
        from airflow_provider_pravega.spark.submit import cluster_submission

        submission = cluster_submission(self.spark_conn_id, spark_conf)
        with hook.get_client() as client:
            if not client.admin.stream_exists(scope, self.stream):  # said before any JVM or Connect session
                raise StreamNotFoundError(scope, self.stream)
            if submission is not None:  # the driver runs on the cluster: submit the job as an application
                return self._run_application(context, client, config, spec, submission)
            result = run_export(  # Spark starts when there is something to read
                client, lambda: get_spark_session(self.spark_conn_id, f"pravega-export-{self.dag_id}.{self.task_id}",
                                                  **spark_conf),
                spec, local_files=starts_local_session(self.spark_conn_id, **spark_conf))
        self._result = result.to_dict()
        self.log.info(
            "exported %d events (%d bytes) of %s/%s%s to %d file(s) in %s (%.1f s)", result.events, result.bytes,
            scope, self.stream, f" for {spec.interval_key}" if spec.interval_key else "", len(result.files),
            result.output_path, result.seconds,
        )
        return self._result

    #: The task state store key of a submitted export application (cluster deploy mode).
    application_key = "pravega_export_application"

    def _run_application(self, context: Any, client: Any, config: Any, spec: Any, submission: Any) -> dict[str, Any]:
        """Cluster deploy mode: the export's command line as a Spark application (spark/submit.py);
        a later try reattaches to it through the task state store."""
        # pyspark is imported with the job: kept out of the scheduler's import of this module
        from airflow_provider_pravega.spark import export_job
        from airflow_provider_pravega.spark.submit import ApplicationRun, run_application

        self._application = ApplicationRun.of_job(submission, export_job, spec, config, client, kind="export",
                                                  name=f"pravega-export-{self.dag_id}.{self.task_id}")
        store = context.get("task_state_store") if hasattr(context, "get") else None
        self._result = run_application(self._application, store, self.application_key)
        self.log.info("exported %s events (%s bytes) of %s/%s%s to %d file(s) in %s (Spark application %s)",
                      self._result.get("events"), self._result.get("bytes"), spec.scope, spec.stream,
                      f" for {spec.interval_key}" if spec.interval_key else "", len(self._result.get("files") or []),
                      spec.table or spec.output_path, self._application.submission.master)
        return self._result

    def on_kill(self) -> None:
        application = getattr(self, "_application", None)
        if application is not None:  # cluster deploy mode: the application dies with the task
            application.kill()
        super().on_kill()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The stream as input, the output directory (or the Delta table) as output (None without
        OpenLineage). A ``table=`` export's output is the table's location the run found (its
        catalog's answer), else its name-based dataset."""
        config = PravegaHook(self.pravega_conn_id).get_config()
        scope = self._scope_used or self.scope or config.scope
        result = self._result or {}
        version = result.get("table_version")
        if self.table and not self.output_path:
            location = result.get("output_path")
            if location and location != self.table and not _templated(location):  # the catalog named its location
                output = table_dataset(location.rstrip("/") or "/", version=version)
            else:
                output = catalog_table_dataset(result.get("table") or self.table, version=version)
        else:
            location = (result.get("output_path") or self.output_path).rstrip("/") or "/"
            output = table_dataset(location, version=version) if self.format == "delta" else file_dataset(location)
        return operator_lineage(inputs=[stream_dataset(config, scope, self.stream)], outputs=[output])


def _templated(value: Any) -> bool:
    """Whether Airflow renders ``value`` at execute (Jinja markers in a text)."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _check_literal_cuts(scope: Any, stream: Any, start_cut: Any, end_cut: Any) -> None:
    """A bad literal cut fails when the DAG is parsed, naming ``start_cut``/``end_cut``; a
    templated one is checked at execute (by ExportSpec), before any Spark work."""
    scope = scope if isinstance(scope, str) and not _templated(scope) else None
    stream = stream if isinstance(stream, str) and not _templated(stream) else None
    for option, value in (("start_cut", start_cut), ("end_cut", end_cut)):
        if isinstance(value, str) and not _templated(value) or isinstance(value, dict):
            check_cut_option(option, value, scope, stream)


def _check_literal_target(format: Any, output_path: Any, table: Any) -> None:
    """A bad literal format, or not exactly one of ``output_path``/``table``, or ``table`` without
    format='delta', fails when the DAG is parsed, naming the options; a templated path or table
    name is checked at execute (by ExportSpec)."""
    if _templated(output_path) or _templated(table):
        if output_path is not None and table is not None:
            check_target(format, output_path, table)  # both given: said now, whatever they render to
        return
    check_target(format, output_path, table)


def _check_literal_state_scopes(**options: Any) -> None:
    """A bad literal state scope fails when the DAG is parsed, naming the option; a templated one
    is checked at execute (by ExportSpec)."""
    for option, value in options.items():
        if not _templated(value):
            check_state_scope(value, option)
