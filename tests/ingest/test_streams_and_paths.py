"""Re-created target streams, literal source paths with glob characters, and the export's cut
options (issue 26, items 4, 6 and 8): an ingest or export whose recorded state belongs to a deleted
namesake of its stream fails naming the reset, never skips; a source that names an existing file
is that file whatever its name holds; skipped files are logged with their reason; a bad cut names
``start_cut``/``end_cut``. The last test writes this file's section of docs/bad-input.md."""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from pathlib import Path

import pytest
from bad_input_doc import check_section

from airflow_provider_pravega.client.errors import InvalidStreamCutError
from airflow_provider_pravega.client.ingest import reset_ingest_state
from airflow_provider_pravega.client.ingest_errors import RecreatedStreamError
from airflow_provider_pravega.client.streamcut import StreamCut
from airflow_provider_pravega.spark.export_job import ExportError, ExportSpec, reset_export_state, run_export
from airflow_provider_pravega.spark.ingest_job import run_ingest
from airflow_provider_pravega.spark.ingest_sources import list_sources, precheck_sources
from airflow_provider_pravega.spark.ingest_spec import IngestSpec, SourceError

ROWS: dict[str, tuple[str, str]] = {}  # what -> (what, "`Error`: message"), filled by the tests below


def no_session():
    raise AssertionError("a SparkSession was started although there was nothing to do")


def jsonl(path: Path, records) -> list[str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in records]
    path.write_text("".join(line + "\n" for line in lines))
    return lines


def row(what: str, exc: BaseException, tmp_path: Path | None = None, scope: str | None = None) -> None:
    message = str(exc)
    if tmp_path is not None:
        message = message.replace(str(tmp_path), "/data")
    if scope is not None:
        message = message.replace(scope, "myscope")
    message = re.sub(r"(ingest|export)-state-[0-9a-f]{20}", r"\1-state-…", message)
    ROWS[what] = (what, f"`{type(exc).__name__}`: {message}")


def recreate(client, scope: str, stream: str) -> None:
    client.admin.delete_stream(scope, stream, seal=True)
    client.admin.create_stream(scope, stream)


def test_a_recreated_stream_fails_the_ingest_and_the_export_until_reset(tmp_path, client, spark, read_stream,
                                                                        unique_name, pravega_controller_uri):
    """Ingest and export, delete and re-create the stream: the next ingest, from_ingest export and
    'previous' export each fail naming their reset (before: both files skipped, 0 events, the new
    stream left empty); after the resets the files reach the new stream."""
    scope = unique_name("recreate")
    a = jsonl(tmp_path / "in" / "a.jsonl", [{"n": n} for n in range(3)])
    b = jsonl(tmp_path / "in" / "b.jsonl", [{"n": n} for n in range(3, 5)])
    spec = IngestSpec(scope=scope, stream="s", source=str(tmp_path / "in"), create_stream=True, ingest_id="daily",
                      interval_key="2026-11-20T00:00:00+00:00/2026-11-21T00:00:00+00:00")
    assert run_ingest(client, spark, spec).events == 5
    export = ExportSpec(scope=scope, stream="s", output_path=str(tmp_path / "out1"), format="jsonl", export_id="exp")
    assert run_export(client, spark, export).events == 5
    old_origin = client.admin.origin(scope, "s")

    recreate(client, scope, "s")
    assert client.admin.origin(scope, "s") != old_origin  # segment numbers continue after the deleted stream's
    with pytest.raises(RecreatedStreamError, match=r"reset_ingest_state\(client, '.*', 's', 'daily'\)") as info:
        run_ingest(client, spark, spec)
    row("ingest after the target stream was deleted and re-created", info.value, tmp_path, scope)
    from_ingest = ExportSpec(scope=scope, stream="s", output_path=str(tmp_path / "out2"), from_ingest="daily",
                             interval_key=spec.interval_key)
    with pytest.raises(RecreatedStreamError, match="reset_ingest_state"):
        run_export(client, spark, from_ingest)
    again = ExportSpec(scope=scope, stream="s", output_path=str(tmp_path / "out3"), format="jsonl", export_id="exp")
    with pytest.raises(ExportError, match=r"reset_export_state\(client, '.*', 's', 'exp'\)") as info:
        run_export(client, spark, again)
    row("export `start_cut='previous'` after the stream was deleted and re-created", info.value, tmp_path, scope)
    assert not (tmp_path / "out3").exists()

    assert reset_ingest_state(client, scope, "s", "daily") and reset_export_state(client, scope, "s", "exp")
    result = run_ingest(client, spark, spec)
    assert result.events == 5 and result.files_skipped == []
    assert Counter(x.decode() for x in read_stream(pravega_controller_uri, scope, "s", expected=5)) == Counter(a + b)
    assert run_export(client, spark, again).events == 5


def test_paths_with_glob_characters_are_taken_literally_when_they_exist(tmp_path, client, spark, read_stream,
                                                                         unique_name, pravega_controller_uri):
    """A file named ``a[1].jsonl`` is that file (before: brackets read as a class, "matches no
    file"), escaped ``a\\[1\\].jsonl`` too (before: raw PATH_NOT_FOUND after the listing); a name
    that does not exist stays a glob."""
    d = tmp_path / "in"
    bracket = jsonl(d / "a[1].jsonl", [{"f": "a[1]"}])
    jsonl(d / "a1.jsonl", [{"f": "a1"}])  # what the glob a[1].jsonl matches
    brace = jsonl(d / "b{c}.jsonl", [{"f": "b{c}"}, {"f": "b{c}"}])
    jsonl(d / "q?.jsonl", [{"f": "q?"}])
    jsonl(d / "qx.jsonl", [{"f": "qx"}])
    keys = lambda src: [Path(f.key).name for f in list_sources(spark, src)]  # noqa: E731
    assert keys(str(d / "a[1].jsonl")) == ["a[1].jsonl"]
    assert keys(str(d / "a[2].jsonl")) == []  # no such file: a glob matching nothing
    assert keys(str(d / "a[0-9].jsonl")) == ["a1.jsonl"]
    assert keys(str(d / "q?.jsonl")) == ["q?.jsonl"]
    assert keys(str(d / r"q\?.jsonl")) == ["q?.jsonl"]
    assert keys(str(d / r"a\[1\].jsonl")) == ["a[1].jsonl"]
    assert keys((d / "b{c}.jsonl").as_uri()) == ["b{c}.jsonl"]
    assert precheck_sources(str(d / "a[1].jsonl")).empty is False

    scope = unique_name("literal")
    spec = IngestSpec(scope=scope, stream="s", source=[str(d / "a[1].jsonl"), str(d / r"b\{c\}.jsonl")],
                      create_stream=True)
    result = run_ingest(client, spark, spec)
    assert result.files_ingested == [str(d / "a[1].jsonl"), str(d / "b{c}.jsonl")] and result.events == 3
    got = read_stream(pravega_controller_uri, scope, "s", expected=3)
    assert Counter(x.decode() for x in got) == Counter(bracket + brace)


def test_skipped_files_are_logged_and_named(tmp_path, caplog):
    """A dangling symbolic link and empty files are logged with path and reason (before: skipped
    without a word); a source of only empty files says so (before: "matches no file")."""
    d = tmp_path / "in"
    jsonl(d / "a.jsonl", [{"n": 1}])
    (d / "x.jsonl").symlink_to(tmp_path / "gone.jsonl")
    (d / "e.jsonl").write_text("")
    with caplog.at_level(logging.WARNING, logger="airflow_provider_pravega.spark.ingest_sources"):
        assert precheck_sources(str(d)).empty is False
    logged = [r.getMessage().replace(str(tmp_path), "/data") for r in caplog.records]
    assert ("source '/data/in': skipping /data/in/x.jsonl: a dangling symbolic link to /data/gone.jsonl, which "
            "does not exist") in logged
    assert "source '/data/in': skipping /data/in/e.jsonl: empty (0 bytes)" in logged

    for name in ("a", "b", "c"):
        (tmp_path / "empty" / f"{name}.jsonl").parent.mkdir(exist_ok=True)
        (tmp_path / "empty" / f"{name}.jsonl").write_text("")
    (tmp_path / "empty" / "_SUCCESS").write_text("")
    spec = IngestSpec(scope="myscope", stream="s", source=str(tmp_path / "empty"))
    with pytest.raises(SourceError, match=r"matches 3 file\(s\), all empty: .*/a\.jsonl, .*/b\.jsonl, .*/c\.jsonl"
                       ) as info:
        run_ingest(_NoServer(), no_session, spec)
    row("directory of only empty files", info.value, tmp_path)
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "e.jsonl").write_text("")
    (tmp_path / "mixed" / "x.jsonl").symlink_to(tmp_path / "gone.jsonl")
    with pytest.raises(SourceError, match="none readable") as info:
        run_ingest(_NoServer(), no_session, IngestSpec(scope="myscope", stream="s", source=str(tmp_path / "mixed")))
    row("directory of an empty file and a dangling symbolic link", info.value, tmp_path)


class _NoServer:
    """A client for runs that must end before talking to Pravega."""

    class transactions:  # noqa: N801
        default_lease_ms = 30_000

    def __getattr__(self, name):
        raise AssertionError(f"the run used the client ({name}) although nothing was to be ingested")


def test_bad_cuts_name_their_option_and_make_the_doc_section():
    """``start_cut="garbage!!"`` names start_cut (before: only "not valid base64"), when the DAG is
    parsed for a literal, at execute (ExportSpec, before any Spark work) for a template."""
    from airflow_provider_pravega.operators.export import PravegaStreamCutExportOperator

    def operator(**kw):
        return PravegaStreamCutExportOperator(task_id="t", stream="s", output_path="/out", **kw)

    for option in ("start_cut", "end_cut"):
        with pytest.raises(InvalidStreamCutError, match=rf"^{option}='garbage!!' is not a usable stream cut") as info:
            operator(**{option: "garbage!!"})
        row(f"export `{option}='garbage!!'` (when the DAG is parsed)", info.value)
    with pytest.raises(InvalidStreamCutError, match=r"^start_cut=\{'scope': 'a'\} is not a usable stream cut"):
        operator(start_cut={"scope": "a"})
    with pytest.raises(InvalidStreamCutError, match="the end_cut belongs to stream other/s"):
        operator(scope="myscope", end_cut=StreamCut("other", "s", {0: 0}).to_text())
    templated = operator(start_cut="{{ params.cut }}", end_cut="{{ ti.xcom_pull('ingest')['tail_cut'] }}")
    assert templated.start_cut == "{{ params.cut }}"
    for good in ("previous", "head", "tail", "UNBOUNDED", StreamCut("myscope", "s", {0: 10}).to_text()):
        operator(scope="myscope", start_cut=good)
    with pytest.raises(InvalidStreamCutError, match=r"^start_cut='garbage!!' is not a usable stream cut") as info:
        ExportSpec(scope="myscope", stream="s", output_path="/out", start_cut="garbage!!")
    row("export `start_cut` rendered from a template to 'garbage!!' (at execute, before Spark)", info.value)

    order = ["ingest after the target stream was deleted and re-created",
             "export `start_cut='previous'` after the stream was deleted and re-created",
             "directory of only empty files", "directory of an empty file and a dangling symbolic link",
             "export `start_cut='garbage!!'` (when the DAG is parsed)", "export `end_cut='garbage!!'` (when the DAG "
             "is parsed)", "export `start_cut` rendered from a template to 'garbage!!' (at execute, before Spark)"]
    if set(order) <= set(ROWS):  # the whole file ran (on the first backend at least)
        check_section("streams-and-paths", "Re-created streams, literal paths, stream cuts",
                      "tests/ingest/test_streams_and_paths.py", [ROWS[k] for k in order],
                      "A source path that exists as given is read literally, whatever its name holds.")
