"""Bad options of ``format("pravega")``, each refused as soon as Spark lets the data source see it,
with the provider's message on the first line of the error: at ``load()`` / ``save()`` (the data
source's constructor and ``schema()`` run on the driver there) for every name and value; at the
first action for what only a batch read's planning tells apart from a streaming read; at the start
of a streaming query for what only a streaming read rules out. Also the errors that must name an
option or a task: a lease the controller refuses, a null event. docs/bad-input.md's "datasource"
section is made from these cases."""

from __future__ import annotations

import re

import pytest
from bad_input_doc import check_section

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.spark.datasource import register


@pytest.fixture(scope="module")
def registered(spark):
    register(spark)
    return spark


def _first_line(exc: BaseException, scope: str) -> str:
    """The line a user sees first, without what changes from run to run."""
    line = str(exc).splitlines()[0].replace(scope, "myscope")
    line = re.sub(r"\[id = [-0-9a-f]+, runId = [-0-9a-f]+\]", "[id = …, runId = …]", line)
    return re.sub(r"tcp://127\.0\.0\.1:\d+", "tcp://127.0.0.1:9090", line)


def _stream_events(client: PravegaClient, scope: str, stream: str) -> list[bytes]:
    from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_ranges
    from airflow_provider_pravega.client.streamcut import StreamCut

    ranges = plan_segment_ranges(client, StreamCut.head(client, scope, stream), StreamCut.tail(client, scope, stream))
    return [e.payload for e in read_segment_ranges(client, ranges)]


def test_bad_options_fail_where_the_read_or_write_is_defined_and_make_the_doc_table(
        registered, client, pravega_controller_uri, unique_name, tmp_path):
    from pyspark.errors import PySparkException

    scope = unique_name("ds-options")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "s", 2)
    rows: list[tuple[str, str]] = []
    base = {"controller": pravega_controller_uri, "scope": scope, "stream": "s"}

    def record(what: str, exc: BaseException, message: str) -> None:
        line = _first_line(exc, scope)
        assert message in line, f"{what}: the provider's message is not on the first line: {str(exc)[:2000]}"
        rows.append((what, f"`{type(exc).__name__}`: {line}"))

    def read(stream: bool = False, **options: str):
        reader = (registered.readStream if stream else registered.read).format("pravega").options(**base)
        return reader.options(**options)

    def at_load(what: str, message: str, stream: bool = False, path: str | None = None, **options: str) -> None:
        reader = read(stream, **options)
        with pytest.raises(PySparkException) as info:
            reader.load(path) if path else reader.load()  # refused here, not later
        record(what, info.value, message)

    def at_save(what: str, message: str, frame=None, **options: str) -> None:
        frame = frame if frame is not None else registered.createDataFrame([("a",)], "event string")
        with pytest.raises(PySparkException) as info:
            frame.write.format("pravega").mode("append").options(**base).options(**options).save()
        record(what, info.value, message)

    for value in ("0", "-5", "abc", "1.5"):
        at_load(f"streaming read, `max_events_per_trigger={value}`", "PravegaDataSourceError: option "
                f"max_events_per_trigger must be a positive whole number, got '{value}'", stream=True,
                max_events_per_trigger=value)
    at_load("`start_streamcut` (a typo)", "unknown option 'start_streamcut' for the pravega data source: did you "
            "mean 'start_stream_cut'?", start_streamcut="tail")
    at_load("`Start_StreamCut` (options are case-insensitive in Spark)", "did you mean 'start_stream_cut'?",
            Start_StreamCut="tail")
    at_load("`load(\"myscope/s\")` (a path)", "the pravega data source takes no path", path=f"{scope}/s")
    at_load("a write option in a read (`mode=at_least_once`)", "option mode is for a batch write or a streaming "
            "write, not a read", mode="at_least_once")
    at_load("`start_stream_cut=garbage!!`", "option start_stream_cut: invalid stream cut text",
            start_stream_cut="garbage!!")
    at_load("`start_stream_cut=\"\"` (a template that rendered to nothing)", "option start_stream_cut is empty",
            start_stream_cut="")
    at_load("`end_stream_cut=\" \"`", "option end_stream_cut is empty", end_stream_cut=" ")
    at_load("`decode=yaml`", "option decode must be one of binary, text, json", decode="yaml")

    # A batch read and a streaming read look the same at load(): what only one of them rules out is
    # refused when Spark first tells which it is (the first action; the start of the query).
    frame = read(max_events_per_trigger="10").load()
    with pytest.raises(PySparkException) as info:
        frame.collect()
    record("batch read with `max_events_per_trigger=10` (at the first action)", info.value,
           "a batch read has no micro-batches")
    for option, value, message in (("end_stream_cut", "tail", "a streaming read has no end_stream_cut"),
                                   ("segment_ranges", "[]", "option segment_ranges is for batch reads")):
        query = (read(True, **{option: value}).load().writeStream.format("console")
                 .option("checkpointLocation", str(tmp_path / option)).start())
        try:
            with pytest.raises(PySparkException) as info:
                query.awaitTermination(300)
        finally:
            query.stop()
        assert "UnboundLocalError" not in str(info.value)
        record(f"streaming read with `{option}` (at `start()`, the query fails)", info.value, message)

    at_save("write with `segments=7` without `create_stream`", "option segments only applies with "
            "create_stream=true", segments="7")
    at_save("write with `retention_time_ms=1` without `create_stream`", "option retention_time_ms only applies with "
            "create_stream=true", retention_time_ms="1")
    at_save("a read option in a write (`decode=text`)", "option decode is for a batch read or a streaming read, not "
            "a batch write", decode="text")
    at_save("`writer_id` in a batch write", "option writer_id is for a streaming write, not a batch write",
            writer_id="w")
    at_save("write with `transaction_lease_ms=5`", "option transaction_lease_ms=5 is below the controller's minimum "
            "lease", transaction_lease_ms="5")
    with pytest.raises(PySparkException) as info:  # the maximum is the server's: not in the backend-neutral table
        registered.createDataFrame([("a",)], "event string").write.format("pravega").mode("append").options(
            **base).option("transaction_lease_ms", "700000").save()
    assert re.search(r"option transaction_lease_ms=700000 is above the controller's maximum lease of (120000|600000) "
                     r"ms", _first_line(info.value, scope))
    with_null = registered.createDataFrame([(f"e{i}",) for i in range(5)] + [(None,)], "event string").repartition(1)
    with pytest.raises(PySparkException) as info:
        with_null.write.format("pravega").mode("append").options(**base).save()
    assert re.search(r"row 5 of task 0 \(counted from 0 within its partition\) has a null event", str(info.value))
    rows.append(("a null `event` (6th row of a one-partition DataFrame)",
                 "Spark's task failure, whose Python error ends: `PravegaDataSourceError`: " + re.search(
                     r"PravegaDataSourceError: (.*)", str(info.value)).group(1)))
    assert _stream_events(client, scope, "s") == []  # nothing of any of these was written

    check_section("datasource", "The Spark data source (format(\"pravega\"))",
                  "tests/spark_datasource/test_datasource_options.py", rows,
                  "Every one fails before anything is read or written: option names and values at `load()` or "
                  "`save()`, except where noted; the provider's message is on the first line.")


def test_a_lease_over_the_controllers_maximum_is_refused_at_save_not_in_every_task(
        registered, pravega_embedded_factory, unique_name):
    """A lease within Pravega's default range (10 s to 600 s) but over this server's maximum (the
    embedded server's is 120 s) is refused by the controller when save() asks it (a transaction
    begun and aborted), before any Spark task runs: the error names the option, the value and the
    controller's maximum."""
    from pyspark.errors import PySparkException

    controller = pravega_embedded_factory().controller_uri
    scope = unique_name("ds-lease-max")
    with PravegaClient(controller) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 1)
        with pytest.raises(PySparkException) as info:
            (registered.range(0, 10, 1, 1).selectExpr("cast(id as string) as event").write.format("pravega")
             .mode("append").option("controller", controller).option("scope", scope).option("stream", "s")
             .option("transaction_lease_ms", "130000").save())
        first = _first_line(info.value, scope)
        assert "Failed to initialize Python data source writer" in first, first  # save(), not a task
        assert "option transaction_lease_ms=130000 is above the controller's maximum lease of 120000 ms" in first
        assert _stream_events(client, scope, "s") == []
    check_section("datasource-lease", "The data source's transaction lease",
                  "tests/spark_datasource/test_datasource_options.py",
                  [("exactly-once write with `transaction_lease_ms=130000`, on a controller whose maximum is 120000 ms "
                    "(the embedded server's; Pravega's default is 600000 ms)", f"`{type(info.value).__name__}`: {first}")],
                  "Refused at `save()`, before any Spark task: the write asks the controller for one transaction "
                  "with its lease there (begun and aborted at once), since only the controller knows its limits.")


def test_a_session_gets_the_plain_source_once_and_a_renewed_one_is_replaced(spark, monkeypatch, pravega_controller_uri,
                                                                            unique_name):
    """Each export registers the source: a session that has it is left alone; one that has the
    renewed source of ``register(renew_writes=...)`` gets the plain one again."""
    from airflow_provider_pravega.spark.datasource import PravegaDataSource

    registration = type(spark.dataSource)
    calls: list[type] = []
    real = registration.register
    monkeypatch.setattr(registration, "register", lambda self, cls: (calls.append(cls), real(self, cls))[1])
    register(spark)
    register(spark)
    assert calls in ([], [PravegaDataSource])  # at most the first: earlier tests may have registered it
    renewer = register(spark, renew_writes={"controller": pravega_controller_uri, "scope": unique_name("reg")})
    try:
        assert calls[-1] is not PravegaDataSource and issubclass(calls[-1], PravegaDataSource)
        count = len(calls)
        register(spark)
        register(spark)
        assert calls[count:] == [PravegaDataSource]
    finally:
        renewer.stop()
