"""PravegaTransactionalIngestOperator: files → a Pravega stream, exactly once, with PySpark."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator, conf

from airflow_provider_pravega._streams import resolve_scope
from airflow_provider_pravega.client.ingest_location import check_state_scope
from airflow_provider_pravega.client.ingest_resume import RESUMABLE
from airflow_provider_pravega.hooks.pravega import PravegaHook
from airflow_provider_pravega.openlineage import file_dataset, operator_lineage, stream_dataset
from airflow_provider_pravega.operators.export import PravegaStreamCutExportOperator, _templated
from airflow_provider_pravega.spark.ingest_spec import (
    IngestResult,
    IngestSpec,
    check_options,
    configured_in_process_max_bytes,
)

try:  # common-compat hands out Airflow 3.3's mixin, or below 3.3 a stand-in that always runs afresh
    from airflow.providers.common.compat.sdk import ResumableJobMixin
except ImportError:  # a common-compat without it
    from airflow.sdk import ResumableJobMixin


class PravegaTransactionalIngestOperator(ResumableJobMixin, BaseOperator):
    """Ingest every record of the matching files into ``scope/stream`` exactly once.

    Whatever happens — task retries, a worker killed at any moment, two copies of the task at once,
    backfills re-running old intervals — each record lands once (``mode="exactly_once"``, the
    default: one Pravega transaction per Spark task, committed together after a durable commit
    record). Files already ingested by this ingest id (same path, size and modification time) are
    skipped.

    :param scope: Scope of the target stream (default: the connection's default scope).
    :param stream: Target stream.
    :param source: A path, a directory or a glob (templated), plain or as a Hadoop filesystem URI
        (``file://``, ``s3a://``, ``hdfs://`` …), or a list of them; listed through Spark. A path
        that exists as given is taken literally (``/in/a[1].jsonl`` is that file); otherwise
        ``*?[{`` make a glob (Hadoop's syntax), and a backslash escapes one (``/in/a\\[1\\].jsonl``).
    :param format: ``jsonl`` (default), ``csv`` (with a header), ``parquet`` or ``text``.
    :param routing_key_field: Field whose value is the routing key; all events of one key are
        written in file order by one task, so readers see them in source order.
    :param payload_field: Write only this field's value instead of the whole record.
    :param ingest_id: Identity of this ingest's progress record (default ``dag_id.task_id``).
    :param mode: ``exactly_once`` or ``at_least_once`` (the same write path without the commit point: a driver
        killed among its commits leaves its files to be written again, so records may be duplicated).
    :param create_stream: Create the scope/stream when missing (otherwise that is an error).
    :param stream_segments: Segments of a stream created by this operator.
    :param on_empty: ``fail`` (default) or ``succeed`` when the source matches no file.
    :param allow_changed_files: Re-ingest a file whose content changed since it was ingested.
    :param wait_for_commit: Wait until every transaction is COMMITTED (default). With False the
        operator returns once the commits are requested; pair it with PravegaTransactionSensor.
    :param num_writers: Transactions (Spark tasks) per run; default Spark's parallelism, but at most one per
        16 MiB of planned input.
    :param in_process_max_bytes: A run of local line files (jsonl, text) reading at most this many
        bytes is written by the task's own process, without Spark: no session, JVM or Python worker
        is started for a small day. The same transactional stage and the same exactly-once protocol
        as a Spark write task. 0: always through Spark. Default: Airflow's
        ``[pravega] ingest_in_process_max_bytes``, else 16 MiB.
    :param stale_after_s: A run of this ingest whose driver has not heartbeated for this long is
        presumed dead and recovered by the next run (default 60 s; the driver heartbeats every
        ``min(10 s, lease/3, stale_after_s/4)``, at most every 0.5 s, so at least 2 s). A run of an
        earlier try of the same task instance is taken over at once.
    :param durable: Airflow's durable execution (``ResumableJobMixin``, Airflow 3.3; default True):
        the run's identity is kept in the task state store (key ``pravega_ingest_run``) from the
        moment it is recorded until the task succeeds, so a retry after a killed try finishes that
        run without Spark when its write tasks had all flushed or its commits were acknowledged
        (docs/ingest.md, "What a retry does"). False: every try plans and writes afresh.
    :param remember_files_for: Forget committed files this long after their run (a ``timedelta``
        or seconds; default: never). Bounds the committed-file table. A forgotten file must not be listed
        again: one last modified before the forgotten horizon is refused (ForgottenFileError).
    :param unknown_commits: Only to resolve :class:`UnresolvedCommitError` (a crashed run whose
        transactions the controller forgot): ``"committed"`` or ``"not_committed"``.
    :param interval_key: Key under which the run's committed range is recorded in the ingest's
        interval index (default: the run's data interval, ``"<start ISO>/<end ISO>"``, as the export
        operator names it; nothing is recorded for runs without a data interval or with
        ``mode="at_least_once"``). ``PravegaStreamCutExportOperator(from_ingest=<ingest id>)`` exports
        exactly what the runs of the same interval committed. Runs of one ingest with an interval
        commit one at a time (a run waits at its commit point for another one's commits to finish).
    :param state_scope: The scope that keeps this ingest's state (templated; created if missing):
        its state stream and committed-file table, so the target's scope needs no create rights and
        holds only data. Default: the target stream's own scope. Changing it for an existing ingest
        is refused while its state is in the stream's scope (a new state would ingest every file again).
    :param pravega_conn_id: The ``pravega`` connection.
    :param spark_conn_id: The Spark provider's ``spark`` connection (its host is the master URL) or
        ``spark_connect`` connection (``sc://…``); local mode when ``spark_default`` does not exist,
        an error for any other missing id. See docs/deployment.md.
    :param spark_conf: Extra Spark settings.

    Returns (XCom) a summary: files ingested/skipped, events, bytes, transactions with their
    status, the stream's tail cut after commit (Pravega stream-cut text), throughput.
    """

    template_fields: Sequence[str] = (
        "scope", "stream", "source", "routing_key_field", "payload_field", "ingest_id", "interval_key",
        "state_scope",
    )
    template_fields_renderers = {"source": "py"}
    ui_color = "#6dc0e3"

    def __init__(
        self,
        *,
        stream: str,
        source: str | list[str],
        scope: str | None = None,
        format: str = "jsonl",
        routing_key_field: str | None = None,
        payload_field: str | None = None,
        ingest_id: str | None = None,
        mode: str = "exactly_once",
        create_stream: bool = False,
        stream_segments: int = 1,
        on_empty: str = "fail",
        allow_changed_files: bool = False,
        wait_for_commit: bool = True,
        num_writers: int | None = None,
        in_process_max_bytes: int | None = None,
        stale_after_s: float = 60.0,
        unknown_commits: str | None = None,
        remember_files_for: timedelta | float | None = None,
        interval_key: str | None = None,
        state_scope: str | None = None,
        durable: bool = True,
        pravega_conn_id: str = PravegaHook.default_conn_name,
        spark_conn_id: str | None = "spark_default",
        spark_conf: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        # A retry resumes a killed try's run while its transactions are still leased: soon.
        kwargs.setdefault("retry_delay", timedelta(seconds=5))
        if not durable:  # the mixin's own parameter (its Airflow < 3.3 stand-in warns about any value)
            kwargs["durable"] = False
        super().__init__(**kwargs)
        # Options no run could accept fail when the DAG is parsed, not after a SparkSession started.
        check_options(format=format, mode=mode, on_empty=on_empty, routing_key_field=routing_key_field,
                      payload_field=payload_field, num_writers=num_writers, stream_segments=stream_segments,
                      stale_after_s=float(stale_after_s), unknown_commits=unknown_commits,
                      remember_files_for_s=_seconds(remember_files_for), in_process_max_bytes=in_process_max_bytes)
        if not _templated(state_scope):  # a template is checked once rendered (IngestSpec)
            check_state_scope(state_scope)
        self.scope = scope
        self.stream = stream
        self.source = source
        self.format = format
        self.routing_key_field = routing_key_field
        self.payload_field = payload_field
        self.ingest_id = ingest_id
        self.mode = mode
        self.create_stream = create_stream
        self.stream_segments = stream_segments
        self.on_empty = on_empty
        self.allow_changed_files = allow_changed_files
        self.wait_for_commit = wait_for_commit
        self.num_writers = num_writers
        self.in_process_max_bytes = in_process_max_bytes
        self.stale_after_s = float(stale_after_s)
        self.unknown_commits = unknown_commits
        self.remember_files_for_s = _seconds(remember_files_for)
        self.interval_key = interval_key
        self.state_scope = state_scope
        self.pravega_conn_id = pravega_conn_id
        self.spark_conn_id = spark_conn_id
        self.spark_conf = spark_conf or {}
        self._result: dict[str, Any] | None = None

    #: The task state store key of the run's identity (renaming it strands the identities of running tasks).
    external_id_key = "pravega_ingest_run"

    def execute(self, context: Any) -> dict[str, Any]:
        # pyspark: spark.submit imports spark.session, kept out of the scheduler's import of this module
        from airflow_provider_pravega.spark.submit import cluster_submission

        submission = cluster_submission(self.spark_conn_id, self.spark_conf)
        if submission is not None:  # the driver runs on the cluster: submit the job as an application
            result = self._run_application(context, submission)
        else:
            result = self.execute_resumable(context)
        store = _state_store(context) if self.durable else None
        if store is not None:  # done: a cleared task runs afresh instead of finding this run
            store.delete(self.external_id_key)
        return result

    def _run_application(self, context: Any, submission: Any) -> dict[str, Any] | None:
        """Cluster deploy mode: the ingest's command line as a Spark application (spark/submit.py);
        a later try reattaches to it through the same task state store key."""
        # pyspark is imported with the job: kept out of the scheduler's import of this module
        from airflow_provider_pravega.spark import ingest_job
        from airflow_provider_pravega.spark.submit import ApplicationRun, run_application

        hook, spec = self._spec(context)
        with hook.get_client() as client:
            self._application = ApplicationRun.of_job(
                submission, ingest_job, spec, hook.get_config(), client, kind="ingest", lease=True,
                name=f"pravega-ingest-{self.dag_id}.{self.task_id}")
            outcome = run_application(self._application, _state_store(context) if self.durable else None,
                                      self.external_id_key)
        self._done(IngestResult.from_dict(outcome))
        return self._result

    def on_kill(self) -> None:
        application = getattr(self, "_application", None)
        if application is not None:  # cluster deploy mode: the application dies with the task
            application.kill()
        super().on_kill()

    # ResumableJobMixin: the "job" is the ingest run. Submitting it runs it to its end here, in the
    # task's process (the Spark driver), so only a later try ever reconnects to it.

    def submit_job(self, context: Any) -> None:
        """Run the ingest; the run's identity is stored as soon as the run is recorded (before
        anything is written: the mixin's gap between submitting and storing does not exist here)."""
        # pyspark is imported with the job: kept out of the scheduler's import of this module
        from airflow_provider_pravega.spark.ingest_job import run_ingest
        from airflow_provider_pravega.spark.session import get_spark_session

        hook, spec = self._spec(context)
        store = _state_store(context) if self.durable else None

        def remember(identity: dict[str, str]) -> None:
            if store is not None:
                store.set(self.external_id_key, identity)

        def spark() -> Any:  # only when there is something to ingest (run_ingest checks inputs first)
            return get_spark_session(self.spark_conn_id, f"pravega-ingest-{self.dag_id}.{self.task_id}",
                                     share_session=True, **self.spark_conf)

        with hook.get_client() as client:
            self._done(run_ingest(client, spark, spec, on_run=remember))
        return None  # stored already, and the run is over: nothing to reconnect to

    def get_job_status(self, external_id: Any, context: Any) -> str:
        # pyspark is imported with the job: kept out of the scheduler's import of this module
        from airflow_provider_pravega.spark.ingest_job import resume_status_of

        hook, spec = self._spec(context)
        with hook.get_client() as client:
            return resume_status_of(client, spec, external_id)

    def is_job_active(self, status: str) -> bool:
        return status in RESUMABLE

    def is_job_succeeded(self, status: str) -> bool:
        return False  # a run recorded done looks like one rolled back: run afresh (what is in is skipped)

    def poll_until_complete(self, external_id: Any, context: Any) -> dict[str, Any] | None:
        """After submit_job: nothing is left. On a later try: finish the earlier try's run without
        Spark, or run the ingest afresh when that is no longer possible."""
        if self._result is None and external_id is not None:
            # pyspark is imported with the job: kept out of the scheduler's import of this module
            from airflow_provider_pravega.spark.ingest_job import resume_ingest

            hook, spec = self._spec(context)
            with hook.get_client() as client:
                resumed = resume_ingest(client, spec, external_id)
            if resumed is None:
                self.submit_job(context)
            else:
                self._done(resumed)
        return self._result

    def get_job_result(self, external_id: Any, context: Any) -> dict[str, Any] | None:
        return self._result

    def _spec(self, context: Any) -> tuple[PravegaHook, Any]:
        hook = PravegaHook(self.pravega_conn_id)
        config = hook.get_config()
        scope = resolve_scope(self.scope, config, self.pravega_conn_id)
        spec = IngestSpec(
            scope=scope, stream=self.stream, source=self.source, format=self.format,
            routing_key_field=self.routing_key_field or None, payload_field=self.payload_field or None,
            ingest_id=self.ingest_id or f"{self.dag_id}.{self.task_id}", mode=self.mode,
            create_stream=self.create_stream, stream_segments=self.stream_segments, on_empty=self.on_empty,
            allow_changed_files=self.allow_changed_files, wait_for_commit=self.wait_for_commit,
            num_writers=self.num_writers, in_process_max_bytes=_in_process_max_bytes(self.in_process_max_bytes),
            stale_after_s=self.stale_after_s, unknown_commits=self.unknown_commits,
            remember_files_for_s=self.remember_files_for_s, interval_key=self.interval_key or _data_interval(context),
            state_scope=self.state_scope, **_task_try(context),
        )
        return hook, spec

    def _done(self, result: Any) -> None:
        self._result = result.to_dict()
        self.log.info(
            "%s %d file(s), skipped %d, %d events in %.1f s (%.0f events/s)",
            f"resumed run {result.run_id}: committed" if result.resumed else "ingested",
            len(result.files_ingested), len(result.files_skipped), result.events, result.seconds,
            result.events_per_second,
        )

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Input files and the output stream as OpenLineage datasets (None without OpenLineage)."""
        config = PravegaHook(self.pravega_conn_id).get_config()
        files = (self._result or {}).get("files_ingested", [])
        return operator_lineage(
            inputs=[file_dataset(f) for f in files],
            outputs=[stream_dataset(config, self.scope or config.scope, self.stream)],
        )


def _state_store(context: Any) -> Any:
    """Airflow's task state store (3.3+; None before, and in contexts without it)."""
    return context.get("task_state_store") if hasattr(context, "get") else None


def _task_try(context: Any) -> dict[str, Any]:
    """The task instance and try running this ingest: a later try takes an earlier try's run over
    at once (Airflow already gave up on it) instead of waiting ``stale_after_s``."""
    ti = context.get("ti") if hasattr(context, "get") else None
    if ti is None or getattr(ti, "try_number", None) is None:
        return {}
    key = f"{ti.dag_id}/{ti.task_id}/{ti.run_id}/{getattr(ti, 'map_index', -1)}"
    return {"task_instance": key, "try_number": int(ti.try_number)}


def _data_interval(context: Any) -> str | None:
    """``"<start>/<end>"`` of the run's data interval (None when it has none): the same key the
    export operator gives an interval."""
    return PravegaStreamCutExportOperator.interval_of(context) if hasattr(context, "get") else None


def _seconds(value: timedelta | float | None) -> float | None:
    return value.total_seconds() if isinstance(value, timedelta) else None if value is None else float(value)


def _in_process_max_bytes(value: int | None) -> int | None:
    """The task's own value, else the deployment's (Airflow's ``[pravega] ingest_in_process_max_bytes``),
    else None (the ingest's default)."""
    if value is not None:
        return value
    return configured_in_process_max_bytes(conf.get("pravega", "ingest_in_process_max_bytes", fallback=None),
                                           "[pravega] ingest_in_process_max_bytes")
