"""The ingest's data side against the embedded server and real Spark local mode: sources as plain
paths, ``file://`` URIs, directories, globs and lists (listed through Spark); file identity from the
listing (no driver read) and states recorded before it; bad records named by file and line in both
modes with nothing written; input errors before any SparkSession. The last test also writes the
README's bad-input table, docs/bad-input.md (PRAVEGA_UPDATE_DOCS=1 regenerates it)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest
from bad_input_doc import check_section

from airflow_provider_pravega.client.errors import StreamNotFoundError
from airflow_provider_pravega.client.ingest import IngestCoordinator
from airflow_provider_pravega.client.ingest_errors import ChangedFileError
from airflow_provider_pravega.client.ingest_location import open_state_store
from airflow_provider_pravega.client.streamcut import StreamCut
from airflow_provider_pravega.spark.ingest_job import run_ingest, state_location
from airflow_provider_pravega.spark.ingest_sources import list_sources
from airflow_provider_pravega.spark.ingest_spec import BadRecordError, IngestSpec, SourceError



def no_session():
    """A SparkSession factory that fails the test if anything calls it."""
    raise AssertionError("a SparkSession was started although there was nothing to do")


def nothing_written(client, scope, stream) -> bool:
    return all(offset == 0 for offset in StreamCut.tail(client, scope, stream).positions.values())


def jsonl(path: Path, records) -> list[str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("".join(line + "\n" for line in lines))
    return lines


def test_sources_as_uris_directories_globs_and_lists(tmp_path, client, spark, read_stream, unique_name,
                                                     pravega_controller_uri):
    d = tmp_path / "in dir"
    a = jsonl(d / "a.jsonl", [{"k": "a", "n": n} for n in range(5)])
    b = jsonl(d / "b c.jsonl", [{"k": "b", "n": n} for n in range(3)])
    jsonl(d / "_SUCCESS", ["{}"])
    jsonl(d / ".a.jsonl.crc", ["{}"])
    c = jsonl(d / "sub" / "c.jsonl", [{"k": "c"}])
    e = jsonl(tmp_path / "other" / "e.jsonl", [{"k": "e"}])
    keys = lambda src: [f.key for f in list_sources(spark, src)]  # noqa: E731
    uri = (tmp_path / "in dir").as_uri()
    assert keys(str(d)) == [str(d / "a.jsonl"), str(d / "b c.jsonl")]  # hidden names skipped
    assert keys(f"{uri}/*.jsonl") == keys(str(d / "*.jsonl")) == keys(str(d))
    assert keys(str(d / "{a,b c}.jsonl")) == keys(str(d))  # Hadoop glob syntax
    assert keys(str(d / "*")) == [str(d / "a.jsonl"), str(d / "b c.jsonl"), str(d / "sub" / "c.jsonl")]
    assert keys([str(d / "*.csv"), str(tmp_path / "other")]) == [str(tmp_path / "other" / "e.jsonl")]
    listed = list_sources(spark, str(d / "a.jsonl"))[0]
    assert listed.size == (d / "a.jsonl").stat().st_size
    assert listed.mtime_ms == (d / "a.jsonl").stat().st_mtime_ns // 1_000_000

    scope = unique_name("src")
    spec = IngestSpec(scope=scope, stream="s", source=[f"{uri}/*", (tmp_path / "other").as_uri()],
                      routing_key_field="k", create_stream=True)
    result = run_ingest(client, spark, spec)
    assert result.files_ingested == sorted([str(d / "a.jsonl"), str(d / "b c.jsonl"), str(d / "sub" / "c.jsonl"),
                                            str(tmp_path / "other" / "e.jsonl")])
    got = read_stream(pravega_controller_uri, scope, "s", expected=10)
    assert Counter(x.decode() for x in got) == Counter(a + b + c + e)
    # The same files named as plain paths are the same files: nothing to do.
    again = IngestSpec(scope=scope, stream="s", source=[str(d), str(d / "sub"), str(tmp_path / "other" / "e.jsonl")],
                       routing_key_field="k")
    assert run_ingest(client, spark, again).run_id is None


def test_identity_from_the_listing_and_states_recorded_with_fingerprints(tmp_path, client, spark, unique_name):
    scope = unique_name("ident")
    f = tmp_path / "in" / "a.jsonl"
    jsonl(f, [{"v": 1}, {"v": 2}])
    spec = IngestSpec(scope=scope, stream="s", source=str(tmp_path / "in"), create_stream=True)
    assert run_ingest(client, spark, spec).events == 2
    st = f.stat()
    jsonl(f, [{"v": 3}, {"v": 4}])  # same size, new content
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    with pytest.raises(ChangedFileError, match=r"a\.jsonl changed since it was ingested: its first 18 bytes differ "
                                               r"from the bytes committed\. Committed so far: lines 1-2 \(the last "
                                               r"of them by run run-\w+; recorded size 18, modified .*; now size 18, "
                                               r"modified"):
        run_ingest(client, spark, spec)

    # A state written before identities came from the listing: {size, fp} (BLAKE2b of the bytes).
    old = tmp_path / "old" / "b.jsonl"
    jsonl(old, [{"v": n} for n in range(4)])
    old_spec = IngestSpec(scope=scope, stream="s", source=str(old.parent), ingest_id="before-upgrade")
    coord = IngestCoordinator(open_state_store(client, *state_location(old_spec)), client.transactions, scope, "s")
    digest = hashlib.blake2b(old.read_bytes(), digest_size=20).hexdigest()
    run_id, *_ = coord.start_run({str(old): {"size": old.stat().st_size, "fp": digest}})
    coord.finish(run_id)
    # Read by its write task, which finds the committed bytes unchanged and nothing new: no event,
    # and the record is rewritten as a piece with the listed time (the next run reads nothing).
    skipped = run_ingest(client, spark, old_spec)
    assert (skipped.events, skipped.files_ingested, skipped.files_skipped) == (0, [], [str(old)])
    assert run_ingest(client, spark, old_spec).run_id is None
    jsonl(old, [{"v": n} for n in range(5, 9)])
    with pytest.raises(ChangedFileError, match=r"fingerprint " + digest[:16]):
        run_ingest(client, spark, old_spec)


def test_line_numbers_across_splits_and_at_least_once_validation(tmp_path, client, spark, unique_name):
    """A file read as several splits (tiny maxPartitionBytes) still gets the right line number, and
    at_least_once writes nothing of a run with a bad record anywhere."""
    scope = unique_name("split")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "s", segments=2)
    lines = [{"k": f"k{n % 7}", "n": n, "pad": "x" * 40} for n in range(1, 1500)]
    lines.insert(1233, '{"k": "k1", "n": oops}')
    jsonl(tmp_path / "in" / "big.jsonl", lines)
    jsonl(tmp_path / "in" / "fine.jsonl", [{"k": "k2"}] * 10)
    before = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "4096")
    try:
        with pytest.raises(BadRecordError, match=r"big\.jsonl, line 1234: not valid JSON"):
            run_ingest(client, spark, IngestSpec(scope=scope, stream="s", source=str(tmp_path / "in"),
                                                 routing_key_field="k", mode="at_least_once", num_writers=4))
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", before)
    assert nothing_written(client, scope, "s")


def _case(tmp_path: Path, name: str, format: str, body: str | bytes, **spec):
    d = tmp_path / name
    d.mkdir()
    (d / f"data.{format}").write_bytes(body.encode() if isinstance(body, str) else body)
    return {"source": str(d), "format": format, **spec}


def test_json_lines_spark_would_misread_are_valid_json_and_committed(tmp_path, client, spark, read_stream,
                                                                      unique_name, pravega_controller_uri):
    """Valid JSON by RFC 8259 that Spark's JSON functions refuse (a number of 1,500 digits) or that
    is unusual (deep nesting within the check's depth, duplicate keys, escapes) is committed as is."""
    lines = [b'{"k": "a", "n": ' + b"7" * 1500 + b"}", b'{"k": "b", "d": ' + b"[" * 500 + b"]" * 500 + b"}",
             b'{"k": "c", "k2": 1, "k2": 2}', b'{"k": "d", "s": "\\u00e9\\ud83d\\ude00 \xc3\xa9"}',
             b'  {"k": "e", "f": -1.5e+300}  ']
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "odd.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    scope = unique_name("strict")
    run_ingest(client, spark, IngestSpec(scope=scope, stream="s", source=str(tmp_path / "in"), create_stream=True))
    assert Counter(read_stream(pravega_controller_uri, scope, "s", expected=len(lines))) == Counter(lines)


def test_bad_inputs_fail_before_writing_and_make_the_readme_table(tmp_path, embedded_client, spark, unique_name):
    """Every bad input: the error and its message, nothing written; the table of them is
    docs/bad-input.md (kept in step with these messages).

    On the embedded server only: every refusal comes from the provider's own checks before the
    first transaction (a missing stream is the controller's plain answer), so Pravega standalone
    would run the same Spark jobs to the same messages."""
    client = embedded_client
    scope = unique_name("badin")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "s")
    big = '{"k": "a", "blob": "' + "x" * (9 * 1024 * 1024) + '"}\n'
    rows: list[tuple[str, str]] = []

    def expect(what: str, error: type, pattern: str, spark_arg=spark, **kw) -> None:
        spec = IngestSpec(**{"scope": scope, "stream": "s", **kw})
        with pytest.raises(error, match=pattern) as info:
            run_ingest(client, spark_arg, spec)
        message = str(info.value).replace(str(tmp_path), "/data").replace(scope, "myscope")
        message = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+Z", "<time>", message)
        message = re.sub(r"run-[0-9a-f]{12}", "run-…", message)
        rows.append((what, f"`{type(info.value).__name__}`: {message}"))
        assert nothing_written(client, scope, "s"), what

    # Before any SparkSession (no_session fails the test if one is asked for).
    expect("source path does not exist", SourceError, "does not exist", no_session,
           source=str(tmp_path / "missing.jsonl"))
    expect("glob matches no file (`on_empty='fail'`)", SourceError, "matches no file", no_session,
           source=str(tmp_path / "*.jsonl"))
    assert run_ingest(client, no_session, IngestSpec(scope=scope, stream="s", source=(tmp_path / "*.jsonl").as_uri(),
                                                     on_empty="succeed")).run_id is None
    (tmp_path / "done").mkdir()  # a directory holding only what Spark's listing skips
    (tmp_path / "done" / "_SUCCESS").write_text("")
    (tmp_path / "done" / ".part-0.crc").write_text("x")
    (tmp_path / "done" / "part-0.jsonl").write_text("")
    assert run_ingest(client, no_session, IngestSpec(scope=scope, stream="s", source=str(tmp_path / "done"),
                                                     on_empty="succeed")).run_id is None
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "a.jsonl").write_text('{"k": "a"}\n')
    expect("target stream missing (`create_stream=False`)", StreamNotFoundError, "missing", no_session,
           source=str(tmp_path / "ok"), stream="missing")
    expect("filesystem whose Hadoop connector Spark lacks", SourceError,
           r"cannot list source 'gs://bucket/in/\*\.jsonl': .*GoogleHadoopFileSystem not found \(the filesystem's "
           r"Hadoop connector is not on Spark's classpath", source="gs://bucket/in/*.jsonl")
    # Records: one definition of a bad record, checked before writing in both modes.
    for mode in ("exactly_once", "at_least_once"):
        expect(f"malformed JSON line ({mode})", BadRecordError, r"data\.jsonl, line 2: not valid JSON",
               mode=mode, routing_key_field="k",
               **_case(tmp_path, f"json-{mode}", "jsonl", '{"k": "a"}\n{"k": "b", "value": 5,,, BROKEN\n'))
        expect(f"event over 8 MiB ({mode})", BadRecordError, r"data\.jsonl, line 3: an event of \d+ bytes is "
               r"over Pravega's 8388608-byte", mode=mode,
               **_case(tmp_path, f"big-{mode}", "jsonl", '{"k": "a"}\n\n' + big))
        expect(f"routing key field missing ({mode})", BadRecordError,
               r"data\.jsonl, line 2: no routing key field 'k'", mode=mode, routing_key_field="k",
               **_case(tmp_path, f"nokey-{mode}", "jsonl", '{"k": "a"}\n{"other": 1}\n'))
    expect("JSON line that is not an object", BadRecordError, r"line 1: not a JSON object",
           **_case(tmp_path, "array", "jsonl", '[1, 2]\n'))
    # What Spark's lenient JSON functions accept and no strict reader of the stream decodes.
    for what, line, pattern in (
            ("single-quoted keys", b"{'k': 'a'}", r"not valid JSON \(object keys must be strings"),
            ("text after the object", b'{"k": "a"} x', r"not valid JSON \(trailing characters"),
            ("a `//` comment after the object", b'{"k": "a"} // note', r"not valid JSON \(trailing characters"),
            ("bytes that are not UTF-8", b'{"k": "a\xff\xfe"}', r"not valid UTF-8 \(byte 0xff at byte 8"),
            ("a raw NUL inside a string", b'{"k": "a\x00b"}', r"not valid JSON \(unescaped control character 0x00"),
            ("`NaN` as a number", b'{"k": "a", "v": NaN}', r"not valid JSON \(invalid character"),
            ("JSON nested 1,200 levels deep", b'{"k": ' + b"[" * 1200 + b"]" * 1200 + b"}",
             r"JSON nested 1201 levels deep, deeper than the check follows \(about 1,000 levels")):
        expect(f"JSON line with {what}", BadRecordError, rf"data\.jsonl, line 2: {pattern}", routing_key_field="k",
               **_case(tmp_path, f"strict-{len(rows)}", "jsonl", b'{"k": "a"}\n' + line + b"\n"))
    expect("line of 21 MiB (over the event limit and Spark's JSON string limit)", BadRecordError,
           r"data\.jsonl, line 1: an event of \d+ bytes is over Pravega's", routing_key_field="k",
           **_case(tmp_path, "huge", "jsonl", '{"k": "a", "blob": "' + "x" * (21 * 1024 * 1024) + '"}\n'))
    expect("payload field missing", BadRecordError, r"line 2: no payload field 'v'", payload_field="v",
           **_case(tmp_path, "nopayload", "jsonl", '{"v": 1}\n{"w": 2}\n'))
    expect("CSV row with more fields than the header", BadRecordError, r"data\.csv, line 4: 3 fields where the "
           r"header has 2", **_case(tmp_path, "csvfields", "csv", "k,v\na,1\n\nb,2,3\n"))
    expect("CSV row without the routing key value", BadRecordError,
           r"data\.csv, line 3: no value for routing key field 'k'", routing_key_field="k",
           **_case(tmp_path, "csvkey", "csv", "k,v\na,1\n,2\n"))
    expect("routing key field that is not a CSV column", BadRecordError,
           r"routing_key_field 'sensor' is not a column of .*data\.csv \(columns: k, v\)", routing_key_field="sensor",
           **_case(tmp_path, "csvcol", "csv", "k,v\na,1\n"))
    spark.createDataFrame([("a", 1), ("b", None)], "k string, v long").coalesce(1).write.parquet(
        str(tmp_path / "pqw"))
    (tmp_path / "pq").mkdir()
    next((tmp_path / "pqw").glob("*.parquet")).rename(tmp_path / "pq" / "data.parquet")
    expect("Parquet record without the payload field's value", BadRecordError,
           r"data\.parquet, record 2: no payload field 'v'", format="parquet", payload_field="v",
           source=str(tmp_path / "pq"))
    # A file changed after it was ingested.
    run_ingest(client, spark, IngestSpec(scope=scope, stream="ok", source=str(tmp_path / "ok"), create_stream=True,
                                         ingest_id="changed"))
    (tmp_path / "ok" / "a.jsonl").write_text('{"k": "b"}\n{"k": "c"}\n')  # rewritten (appending is tailing)
    expect("file changed since it was ingested", ChangedFileError, "writing line 1 a second time",
           source=str(tmp_path / "ok"), ingest_id="changed", stream="ok")

    check_section("ingest", "Ingest: sources, records, files", "tests/ingest/test_ingest_inputs.py", rows,
                  "Every one fails before anything is committed; the first three before a SparkSession starts.")


def test_options_no_run_could_accept_fail_when_the_dag_is_parsed():
    from airflow_provider_pravega.operators.ingest import PravegaTransactionalIngestOperator

    for bad, message in (({"format": "xml"}, "format must be one of"), ({"mode": "maybe"}, "mode must be one of"),
                         ({"on_empty": "skip"}, "on_empty must be"), ({"num_writers": 0}, "num_writers must be"),
                         ({"stream_segments": 0}, "stream_segments must be"),
                         ({"format": "text", "routing_key_field": "k"}, "format 'text' has no fields")):
        with pytest.raises(ValueError, match=message):
            PravegaTransactionalIngestOperator(task_id="t", stream="s", source="/in", **bad)
    with pytest.raises(ValueError, match="source must be a non-empty"):
        IngestSpec(scope="x", stream="s", source=[])
