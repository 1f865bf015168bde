"""``spark.read.format("pravega")`` and ``df.write.format("pravega")``: a PySpark (Spark 4) Python
data source over this provider's client.

Register it once per session with :func:`register` (classic PySpark or Spark Connect), then:

* **batch read** between two stream cuts: the driver resolves the cuts and plans the segment
  ranges between them (:func:`~airflow_provider_pravega.client.batch.plan_segment_ranges`, which
  follows scaling); each range is one Spark partition, read straight from the segment store as
  Arrow batches by :func:`read_ranges_arrow`. A job that plans its own ranges (the export job)
  passes them as ``segment_ranges`` (partitions in its order) and may emit fewer ``columns``.
  Rows: ``event`` (binary, or UTF-8 text with ``decode=text``; with ``decode=json`` the
  columns of the given schema instead, parsed by Arrow), ``scope``, ``stream``,
  ``segment_id``, ``offset`` (where the event's header starts in its segment).
* **batch write**, exactly once, through the provider's transactional stage (the ingest's run
  protocol, :class:`~airflow_provider_pravega.client.ingest.IngestCoordinator`): ``save()`` starts
  a run in a state keyed by the target stream and ``write_id``; each task attempt begins a Pravega
  transaction, registers it in the run (fenced), writes its rows (routed by the optional
  ``routing_key`` column, so one key's rows keep their order within a task) and flushes them, and
  while it writes it renews every transaction registered in the run. The driver's ``commit``
  records the commit point (the winning attempts' transactions, each holding its input
  partition), aborts every other registered transaction (failed and losing speculative
  attempts), commits, and records the run done; ``abort`` aborts them all. Nothing runs on an
  executor host after its tasks: no helper process, nothing on disk. With ``write_id``, a rerun
  after a crash skips the partitions whose transactions committed and writes the rest. The
  process that registered the data source with ``renew_writes`` keeps a write alive between its
  last task and its commit (:mod:`~airflow_provider_pravega.spark.write_renewal`).
* **streaming write**, exactly once per micro-batch, through the same stage: one run per batch id,
  started by its first task; tasks register under their input partition, so a replay skips the
  partitions committed and writes the rest.

Options (all strings, as Spark passes them): ``OPTION_SPECS``, also the README's "Spark data source".
Every one is checked (:func:`check_options`) on the driver as soon as Spark shows it to the data
source: names and values at ``load()``/``save()`` (the constructor); then, once Spark says which
use this is, that each applies to it (a read's ``schema()`` at ``load()``, a batch read's planning
at its first action, a streaming read's start, a write's ``save()``).

The parts: the options and their checks (:mod:`~airflow_provider_pravega.spark.datasource_options`),
the reads (:mod:`~airflow_provider_pravega.spark.datasource_read`) and the writes
(:mod:`~airflow_provider_pravega.spark.datasource_write`); this module is the data source Spark
looks up, and its registration.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader

from airflow_provider_pravega.spark.worker_imports import missing_dependency

try:
    from airflow_provider_pravega.client.errors import PravegaError
    from airflow_provider_pravega.spark import write_renewal
    from airflow_provider_pravega.spark.datasource_options import (
        _METADATA_COLUMNS,
        BATCH_READ,
        BATCH_WRITE,
        OPTION_SPECS,
        OPTIONS,
        READ,
        STREAM_READ,
        STREAM_WRITE,
        OptionSpec,
        PravegaDataSourceError,
        _client,
        _first_line,
        _fixed_columns,
        _required,
        _value,
        check_options,
        connection_config,
        connection_options,
        segment_ranges_option,
    )
    from airflow_provider_pravega.spark.datasource_read import (
        NOT_UTF8_ADVICE,
        Decoding,
        PravegaBatchReader,
        PravegaStreamReader,
        _RefusedStreamRead,
        read_ranges_arrow,
    )
    from airflow_provider_pravega.spark.datasource_write import PravegaBatchWriter, PravegaStreamWriter
    from airflow_provider_pravega.spark.worker_heap import prepare_worker_heap
except ImportError as _missing:
    raise missing_dependency(_missing) from _missing

#: What users import from here: the data source and its registration, and the names jobs that
#: read through it use (defined in the modules named above).
__all__ = [
    "FORMAT",
    "OPTIONS",
    "OPTION_SPECS",
    "OptionSpec",
    "check_options",
    "PravegaDataSource",
    "NOT_UTF8_ADVICE",
    "PravegaDataSourceError",
    "connection_options",
    "read_ranges_arrow",
    "register",
    "segment_ranges_option",
]

#: The name ``spark.read.format(...)`` takes.
FORMAT = "pravega"


class PravegaDataSource(DataSource):
    """``format("pravega")``: batch reads between stream cuts and exactly-once batch writes."""

    def __init__(self, options: dict[str, str]) -> None:  # in a planning worker
        prepare_worker_heap()
        super().__init__(options)
        with _first_line():  # at load() and save(), before Spark knows which use this is
            check_options(self.options)

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:  # asked at load() of a read without .schema(...)
        with _first_line():
            check_options(self.options, READ)
            return self._schema()

    def _schema(self) -> str:
        decode = _value(self.options, "decode")
        if decode == "json":
            raise PravegaDataSourceError(
                "decode=json needs the events' fields as a schema, e.g. spark.read.format('pravega')"
                ".schema('sensor string, temperature double, offset bigint').option('decode', 'json'); "
                f"columns named {', '.join(_METADATA_COLUMNS)} are filled from the event's position")
        types = _fixed_columns(self.options, decode)
        return ", ".join(f"{name} {kind} not null" for name, kind in types.items())

    def reader(self, schema: Any) -> DataSourceReader:  # planning the first action
        with _first_line():
            check_options(self.options, BATCH_READ)
            return PravegaBatchReader(self.options, Decoding.of(self.options, schema))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # the query's start
        try:
            check_options(self.options, STREAM_READ)
            return PravegaStreamReader(self.options, Decoding.of(self.options, schema))
        except PravegaError as exc:
            return _RefusedStreamRead(exc)

    def writer(self, schema: Any, overwrite: bool) -> PravegaBatchWriter:  # save()
        with _first_line():
            check_options(self.options, BATCH_WRITE)
            return PravegaBatchWriter(self.options, schema, overwrite, renewal=getattr(self, "renewal", None))

    def streamWriter(self, schema: Any, overwrite: bool) -> PravegaStreamWriter:  # the query's start
        with _first_line():
            check_options(self.options, STREAM_WRITE)
            return PravegaStreamWriter(self.options, schema, overwrite)


#: Session -> the class it has as ``format("pravega")`` (weakly held: a new session is a new object).
_REGISTERED: weakref.WeakKeyDictionary[Any, type] = weakref.WeakKeyDictionary()


def register(spark: Any, *, renew_writes: Mapping[str, str] | None = None) -> Any:
    """Make ``format("pravega")`` available in ``spark`` (a classic or a Spark Connect session).

    ``renew_writes``: connection options (``controller``, ``scope``, and ``username``/``password``,
    ``tls``... as a write takes them). This process then runs a renewer thread that keeps every
    exactly-once batch write of the session alive between its last task and its commit (see
    :mod:`~airflow_provider_pravega.spark.write_renewal`), through a registry in that scope.
    Returns the renewer (``.stop()`` ends it; it is a daemon thread) or None.

    Without ``renew_writes``, a session that has this plain source already is left as it is (each
    export reads through it; registering it again costs 10-25 ms)."""
    if renew_writes is None:
        if _REGISTERED.get(spark) is not PravegaDataSource:
            spark.dataSource.register(PravegaDataSource)
            _REGISTERED[spark] = PravegaDataSource
        return None
    with _first_line():
        config = connection_config(renew_writes)
        scope = _required(renew_writes, "scope", "the scope of the write renewer's registry")
        with _client(config) as client:  # unreachable or refused: said now, not at the first write
            client.admin.create_scope(scope)
            write_renewal.open_registry(client, scope).close()
    renewer = write_renewal.WriteRenewer(config, scope)
    # A subclass carrying the renewer's token (pickled by value with the class, no secret in it).
    renewed = type(PravegaDataSource.__name__, (PravegaDataSource,),
                   {"renewal": renewer.renewal, "__module__": __name__,
                    "__qualname__": f"{PravegaDataSource.__qualname__}.renewed", "__doc__": PravegaDataSource.__doc__})
    spark.dataSource.register(renewed)
    _REGISTERED[spark] = renewed
    renewer.start()
    return renewer
