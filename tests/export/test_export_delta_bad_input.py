"""Bad input for Delta exports (issue 48): where the table would go is not a place for one, the
catalog's ``table=`` is not a Delta table, or two exports of one interval commit at once. Each is a
clear ExportError (OutputPathError for the location) naming the path or table, and writes nothing;
the concurrent export retries and finds the interval written, adding no row.

All cases run in one process with one Delta session (a session with Delta's package is slow to
start), through ``run_export``; the tests below read its results. The concurrent export is made
deterministic by committing the competing export's version (with delta-rs, the rows and the
transaction id the other export would commit) from the write's own Spark task, after Spark's
transaction started and before it commits.

Embedded server only: the subject is Delta's side.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from contextlib import ExitStack

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from bad_input_doc import check_section
from unwritable import unwritable

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.spark.delta_export import CONFLICT_RETRIES

deltalake = pytest.importorskip("deltalake", reason="the test extra installs deltalake (delta-rs) to read tables")

EVENTS = [f"e{i:02d}" for i in range(30)]
INTERVAL = "2026-11-20"

CASES = textwrap.dedent("""
    import json, os, sys
    import pyarrow as pa
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.spark import export_write
    from airflow_provider_pravega.spark.delta_export import session_conf
    from airflow_provider_pravega.spark.export_job import ExportSpec, run_export
    from airflow_provider_pravega.spark.session import get_spark_session

    uri, scope, root, cases = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    spark = get_spark_session(None, "delta-bad-input", **session_conf(
        {"spark.master": "local[2]", "spark.sql.warehouse.dir": os.path.join(root, "warehouse")}))
    spark.sql("CREATE DATABASE IF NOT EXISTS lake")
    spark.sql("CREATE TABLE lake.plain (event string) USING parquet")
    spark.sql("INSERT INTO lake.plain VALUES ('mine')")
    spark.sql("CREATE VIEW lake.recent AS SELECT * FROM lake.plain")

    real_build_frame = export_write.build_frame

    def competing_commit(spark, config, spec, ranges, groups, observation=None):
        # The frame of a "concurrent" export: its one Spark task first commits, with delta-rs, what
        # the other export of the interval commits (its rows, its transaction id), once. Of a
        # "contended" one: the same rows without the transaction id, at every attempt.
        frame = real_build_frame(spark, config, spec, ranges, groups, observation)
        if not (spec.export_id or "").startswith(("concurrent", "contended")):
            return frame
        path, export_id, interval = spec.output_path, spec.export_id, spec.interval_key
        once = export_id.startswith("concurrent")
        marker = os.path.join(root, f"{export_id}.committed")

        def commit_first(batches):
            batches = list(batches)
            if once:
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    yield from batches
                    return
            from deltalake import CommitProperties, Transaction, write_deltalake

            rows = pa.Table.from_batches(batches) if batches else None
            n = rows.num_rows if rows is not None else 0
            rows = (rows.append_column("scope", pa.array([spec.scope] * n))
                    .append_column("stream", pa.array([spec.stream] * n))
                    .append_column("interval_key", pa.array([interval] * n)))
            txn = [Transaction(f"pravega-export:{export_id}:{interval}", 1)] if once else None
            write_deltalake(path, rows, mode="append", partition_by=["interval_key"],
                            commit_properties=CommitProperties(app_transactions=txn))
            yield from batches

        return frame.mapInArrow(commit_first, frame.schema)

    export_write.build_frame = competing_commit

    with PravegaClient(uri) as client:
        for case in cases:
            target = {"table": case["table"]} if "table" in case else {"output_path": case["path"]}
            try:
                result = run_export(client, spark, ExportSpec(
                    scope=scope, stream="s", format="delta", start_cut="head", interval_key=case.get("interval", "%s"),
                    export_id=case.get("export_id", case["case"]), num_partitions=1, **target))
                out = {"events": result.events, "skipped": result.already_written, "version": result.table_version}
            except Exception as exc:
                out = {"error": type(exc).__name__, "message": str(exc)}
            print("CASE", json.dumps({"case": case["case"], **out}), flush=True)
    spark.stop()
""" % INTERVAL)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, pravega_embedded):
    """Every case's result (``events``/``skipped``) or error (``error``, ``message``), by name; and
    the folder the cases' paths are in."""
    root = tmp_path_factory.mktemp("delta-bad-input")
    scope = f"delta-bad-{root.name.replace('_', '-')}"
    with PravegaClient(pravega_embedded.controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 1)
        with client.event_writer(scope, "s") as writer:
            for event in EVENTS:
                writer.write_event(event.encode())
            writer.flush()
    (root / "plain").mkdir()
    pq.write_table(pa.table({"reading": [1, 2, 3]}), root / "plain" / "part-0.parquet")
    (root / "a-file").write_text("not a directory")
    (root / "read-only").mkdir()
    (root / "existing").mkdir()
    cases = [
        {"case": "parquet folder", "path": str(root / "plain")},
        {"case": "path is a file", "path": str(root / "a-file")},
        {"case": "under a file", "path": str(root / "a-file" / "table")},
        {"case": "in /proc", "path": "/proc/pravega-delta-export/table"},
        {"case": "read-only folder", "path": str(root / "read-only")},
        {"case": "parquet table", "table": "lake.plain"},
        {"case": "view", "table": "lake.recent"},
        {"case": "unknown catalog", "table": "nocatalog.lake.readings"},
        {"case": "unknown database", "table": "nodb.readings"},
        # Two exports of one interval committing at once: into a new table, and into one that has
        # another interval already.
        {"case": "concurrent, new table", "path": str(root / "new"), "export_id": "concurrent-new"},
        {"case": "existing table", "path": str(root / "existing"), "export_id": "daily", "interval": "2026-11-19"},
        {"case": "concurrent, existing table", "path": str(root / "existing"), "export_id": "concurrent-existing"},
        {"case": "contended", "path": str(root / "contended"), "export_id": "contended"},
    ]
    script = root / "cases.py"
    script.write_text(CASES)
    found: dict[str, dict] = {}
    with ExitStack() as read_only:
        try:
            read_only.enter_context(unwritable(root / "read-only"))
        except pytest.skip.Exception as why:  # root without chattr: that case alone is left out
            cases = [case for case in cases if case["case"] != "read-only folder"]
            found["read-only folder"] = {"skip": str(why)}
        done = subprocess.run([sys.executable, str(script), pravega_embedded.controller_uri, scope, str(root),
                               json.dumps(cases)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    for line in done.stdout.splitlines():
        if line.startswith("CASE "):
            outcome = json.loads(line[len("CASE "):])
            found[outcome.pop("case")] = outcome
    assert set(found) >= {case["case"] for case in cases}, done.stdout[-4000:] + done.stderr[-4000:]
    return found, root


def _refused(outcome: dict, error: str = "OutputPathError") -> str:
    assert outcome.get("error") == error, outcome
    assert len(outcome["message"].splitlines()) == 1, outcome["message"]  # one line, no Java frames
    return outcome["message"]


def test_a_folder_of_other_files_is_refused_and_left_as_it_was(outcomes):
    """Was: the Parquet folder silently became a Delta table, and its Parquet readers saw the 30
    exported rows instead of its own 3."""
    found, root = outcomes
    message = _refused(found["parquet folder"])
    assert repr(str(root / "plain")) in message and "is not a Delta table" in message and "part-0.parquet" in message
    assert sorted(p.name for p in (root / "plain").iterdir()) == ["part-0.parquet"]
    assert pq.read_table(root / "plain").column("reading").to_pylist() == [1, 2, 3]


def test_a_location_that_cannot_be_written_is_an_output_path_error(outcomes):
    """Was: a raw Py4JJavaError (the CLI printed the Java stack), where file exports say
    OutputPathError."""
    found, root = outcomes
    assert "is a file" in _refused(found["path is a file"])
    for case, path in [("under a file", root / "a-file" / "table"), ("in /proc", "/proc/pravega-delta-export/table")]:
        message = _refused(found[case])
        assert repr(str(path)) in message and "is not writable" in message, (case, message)
    assert (root / "a-file").read_text() == "not a directory"


def test_a_read_only_folder_is_an_output_path_error(outcomes):
    """Was: a raw Py4JJavaError (DELTA_CANNOT_CREATE_LOG_PATH and its Java stack)."""
    found, root = outcomes
    if "skip" in found["read-only folder"]:
        pytest.skip(found["read-only folder"]["skip"])
    message = _refused(found["read-only folder"])
    assert repr(str(root / "read-only")) in message and "is not writable" in message
    assert "_delta_log" in message and list((root / "read-only").iterdir()) == []


def test_a_catalog_name_that_is_not_a_delta_table_is_said_so(outcomes):
    """Was: errors about DESCRIBE HISTORY, or REQUIRES_SINGLE_PART_NAMESPACE."""
    found, root = outcomes
    message = _refused(found["parquet table"], "ExportError")
    assert "table 'lake.plain'" in message and "not a Delta table" in message and "parquet" in message.lower()
    message = _refused(found["view"], "ExportError")
    assert "table 'lake.recent'" in message and "is a view" in message
    message = _refused(found["unknown catalog"], "ExportError")
    assert "table 'nocatalog.lake.readings'" in message and "no catalog 'nocatalog'" in message
    assert "spark.sql.catalog.nocatalog" in message
    message = _refused(found["unknown database"], "ExportError")
    assert "table 'nodb.readings'" in message and "database 'nodb'" in message
    # The Parquet table is untouched: its one row, no Delta log beside it.
    assert not (root / "warehouse" / "lake.db" / "plain" / "_delta_log").exists()
    assert pq.read_table(root / "warehouse" / "lake.db" / "plain").column("event").to_pylist() == ["mine"]


def test_an_export_whose_interval_another_export_committed_meanwhile_adds_no_row(outcomes):
    """Was: a raw ProtocolChangedException (or ConcurrentTransactionException). The second export
    retries its write; the interval's transaction id is then committed, so Delta writes nothing."""
    found, root = outcomes
    for case, table, intervals in [("concurrent, new table", root / "new", [INTERVAL]),
                                   ("concurrent, existing table", root / "existing", ["2026-11-19", INTERVAL])]:
        assert found[case] == {"events": 0, "skipped": True, "version": found[case]["version"]}, (case, found[case])
        rows = deltalake.DeltaTable(str(table)).to_pyarrow_table().to_pylist()
        assert Counter((r["interval_key"], r["event"]) for r in rows) == Counter(
            (i, e) for i in intervals for e in EVENTS), case


def test_an_export_that_keeps_losing_to_concurrent_commits_says_so(outcomes):
    """Each attempt loses to another commit into its interval: after the retries, a clear error
    saying what to do, and none of the export's rows in the table."""
    found, root = outcomes
    message = _refused(found["contended"], "ExportError")
    assert f"delta table {root / 'contended'}: the write of interval {INTERVAL} lost to a concurrent commit" in message
    assert f"{CONFLICT_RETRIES + 1} times" in message and "run one export of a table at a time" in message
    history = deltalake.DeltaTable(str(root / "contended")).history()
    assert len(history) == CONFLICT_RETRIES + 1 and all(h["engineInfo"].startswith("delta-rs") for h in history)


def test_the_refusals_are_in_docs_bad_input(outcomes):
    found, root = outcomes
    if "skip" in found["read-only folder"]:
        pytest.skip(found["read-only folder"]["skip"])
    rows = [(what, f"`{found[case]['error']}`: {found[case]['message'].replace(str(root), '/data')}") for case, what in [
        ("parquet folder", "`output_path` a folder of Parquet files (no `_delta_log`)"),
        ("path is a file", "`output_path` a file"),
        ("under a file", "`output_path` under a file"),
        ("in /proc", "`output_path` in `/proc`"),
        ("read-only folder", "`output_path` a folder that cannot be written"),
        ("parquet table", "`table=` a Parquet table"),
        ("view", "`table=` a view"),
        ("unknown catalog", "`table=` naming a catalog the session does not have"),
        ("unknown database", "`table=` in a database that does not exist"),
        ("contended", f"every write of the interval loses to a concurrent commit ({CONFLICT_RETRIES + 1} times)"),
    ]]
    rows.insert(-1, ("another export of the interval commits while this one writes (into a new or an existing table)",
                     "no error: a warning (the commit of interval … lost to a concurrent commit (…ProtocolChangedException"
                     " or …ConcurrentTransactionException…); writing it again), then the write finds the interval's "
                     "transaction committed: `already_written`, no row added"))
    check_section("delta-export", "Delta exports: locations, catalog tables, concurrent commits",
                  "tests/export/test_export_delta_bad_input.py", rows,
                  "None adds a row to a table; a location or catalog table that is refused is left as it was.")
