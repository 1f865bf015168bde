"""Files that grow or change while an ingest reads them, and between its runs (jsonl and text are
read as exact byte ranges of whole lines; see measure_pieces in spark/ingest_pieces.py). Appends are
driven by the ingest's own fault points (``airflow_provider_pravega.fault_points``), never by timing.
Every line must reach the stream exactly once across the runs. The last test writes the "growing-files" section of
docs/bad-input.md (PRAVEGA_UPDATE_DOCS=1 regenerates it)."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from pathlib import Path

import pytest
from bad_input_doc import check_section

from airflow_provider_pravega.client.ingest import IngestCoordinator
from airflow_provider_pravega.client.ingest_errors import ChangedFileError
from airflow_provider_pravega.client.ingest_location import open_state_store
from airflow_provider_pravega.client.streamcut import StreamCut
from airflow_provider_pravega.spark import ingest_frames, ingest_pieces, ingest_sources
from airflow_provider_pravega.spark.ingest_job import run_ingest, state_location
from airflow_provider_pravega.spark.ingest_frames import line_frame, lines_read_here
from airflow_provider_pravega.spark.ingest_pieces import TAIL_SETTLE_S, measure_local_pieces, measure_pieces
from airflow_provider_pravega.spark.ingest_sources import key_of, local_path
from airflow_provider_pravega.spark.ingest_spec import BadRecordError, IngestSpec, SourceError
from pravega_testing.faults import installed_for_test


def line(n: int) -> str:
    return json.dumps({"k": f"k{n % 5}", "n": n, "pad": "x" * 30})


def append(path: Path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


@pytest.fixture(autouse=True)
def long_settle_time(monkeypatch):
    """An hour: no file of these tests settles by itself, however slow the machine (settle() does it)."""
    monkeypatch.setattr(ingest_pieces, "TAIL_SETTLE_S", 3600.0)


def settle(path: Path) -> None:
    """Mark a file as not modified for longer than the settle time (its unterminated last line is final)."""
    past = time.time() - ingest_pieces.TAIL_SETTLE_S - 60
    os.utime(path, (past, past))


def at_step(monkeypatch, actions):
    """Run ``actions[step]()`` when the ingest reaches ``step`` (the crash-matrix hook, in process)."""
    def hook(step: str) -> None:
        action = actions.pop(step, None)
        if action is not None:
            action()

    installed_for_test(monkeypatch, hook)


def test_a_file_appended_during_a_run_and_between_runs_has_every_line_once(
        tmp_path, client, spark, read_stream, unique_name, pravega_controller_uri, monkeypatch):
    """The issue's case: 3,000 lines listed, 500 appended while the run reads (half of one line
    before the plan, the rest after it): the run commits exactly the 3,000 lines it listed, the
    next run exactly the 500 appended, the one after nothing."""
    scope = unique_name("grow")
    path = tmp_path / "in" / "app.jsonl"
    path.parent.mkdir()
    path.write_text("".join(line(n) + "\n" for n in range(1, 3001)))
    half = line(3251)[:20]
    at_step(monkeypatch, {
        # listed at 3,000 lines: 250 lines and half a line arrive before the run measures the file
        "after_listing": lambda: append(path, "".join(line(n) + "\n" for n in range(3001, 3251)) + half),
        # planned and recorded: the rest arrives before the tasks read the file
        "after_run_record": lambda: append(path, line(3251)[20:] + "\n" + "".join(
            line(n) + "\n" for n in range(3252, 3501))),
    })
    spec = IngestSpec(scope=scope, stream="s", source=str(path.parent), routing_key_field="k", create_stream=True,
                      stream_segments=2)
    first = run_ingest(client, spark, spec)
    assert first.events == 3000 and first.files_ingested == [str(path)]
    second = run_ingest(client, spark, spec)
    assert second.events == 500 and second.files_ingested == [str(path)]
    third = run_ingest(client, spark, spec)
    assert third.run_id is None and third.files_skipped == [str(path)]
    got = read_stream(pravega_controller_uri, scope, "s")  # until nothing more comes: duplicates would show
    assert Counter(e.decode() for e in got) == Counter(line(n) for n in range(1, 3501))
    per_key: dict[str, list[int]] = {}
    for e in got:
        rec = json.loads(e)
        per_key.setdefault(rec["k"], []).append(rec["n"])
    assert all(v == sorted(v) for v in per_key.values()), "a key's events are out of file order"


def test_a_last_line_without_line_end_waits_until_the_file_settles(tmp_path, client, spark, read_stream,
                                                                   unique_name, pravega_controller_uri):
    scope = unique_name("tail")
    path = tmp_path / "in" / "a.txt"
    path.parent.mkdir()
    path.write_text("one\r\ntwo\nthree")  # a text file, CR LF and LF line ends, the last line unterminated
    spec = IngestSpec(scope=scope, stream="s", source=str(path.parent), format="text", create_stream=True)
    assert run_ingest(client, spark, spec).events == 2  # "three" may still be being written
    assert run_ingest(client, spark, spec).run_id is None  # unchanged, not settled: not even read
    settle(path)
    assert run_ingest(client, spark, spec).events == 1  # settled: "three" is final
    append(path, "\nfour\n")  # the line end of "three", then a new line
    assert run_ingest(client, spark, spec).events == 1
    append(path, "five")
    assert run_ingest(client, spark, spec).run_id is None
    got = read_stream(pravega_controller_uri, scope, "s")
    assert Counter(got) == Counter([b"one", b"two", b"three", b"four"])


def test_a_grown_file_names_its_bad_line_by_its_number_in_the_whole_file(tmp_path, client, spark, unique_name):
    scope = unique_name("growbad")
    path = tmp_path / "in" / "a.jsonl"
    path.parent.mkdir()
    path.write_text("".join(line(n) + "\n" for n in range(1, 3001)))
    spec = IngestSpec(scope=scope, stream="s", source=str(path.parent), create_stream=True)
    assert run_ingest(client, spark, spec).events == 3000
    before = StreamCut.tail(client, scope, "s").positions
    append(path, line(3001) + "\n\n" + '{"n": 3003,, oops}\n')
    with pytest.raises(BadRecordError, match=r"a\.jsonl, line 3003: not valid JSON"):
        run_ingest(client, spark, spec)
    assert StreamCut.tail(client, scope, "s").positions == before


def test_changed_files_are_refused_naming_the_lines_that_would_repeat(tmp_path, client, spark, unique_name,
                                                                     monkeypatch):
    scope = unique_name("chg")
    rows: list[tuple[str, str]] = []

    def expect(what: str, error, pattern: str, path: Path, **kw) -> None:
        spec = IngestSpec(scope=scope, stream="s", source=str(path.parent), ingest_id=path.parent.name, **kw)
        before = StreamCut.tail(client, scope, "s").positions
        with pytest.raises(error, match=pattern) as info:
            run_ingest(client, spark, spec)
        message = str(info.value).replace(str(tmp_path), "/data").replace(scope, "myscope")
        message = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+Z", "<time>", message)
        message = re.sub(r"run-[0-9a-f]{12}", "run-…", message)
        message = re.sub(r"fingerprint [0-9a-f]{16}…", "fingerprint …", message)
        rows.append((what, f"`{type(info.value).__name__}`: {message}"))
        assert StreamCut.tail(client, scope, "s").positions == before, what

    def ingested(name: str, text: str, **kw) -> Path:
        path = tmp_path / name / "a.jsonl"
        path.parent.mkdir()
        path.write_text(text)
        run_ingest(client, spark, IngestSpec(scope=scope, stream="s", source=str(path.parent), ingest_id=name,
                                             create_stream=True, **kw))
        return path

    three = "".join(line(n) + "\n" for n in range(1, 4))
    # Growth is no error: appended while a run reads the file, then between runs.
    grown = tmp_path / "grown" / "a.jsonl"
    at_step(monkeypatch, {"after_listing": lambda: append(grown, line(4) + "\n" + line(5)[:10])})
    grown.parent.mkdir()
    grown.write_text(three)
    first = run_ingest(client, spark, IngestSpec(scope=scope, stream="s", source=str(grown.parent),
                                                 ingest_id="grown", create_stream=True))
    assert first.events == 3
    append(grown, line(5)[10:] + "\n")
    second = run_ingest(client, spark, IngestSpec(scope=scope, stream="s", source=str(grown.parent),
                                                  ingest_id="grown"))
    assert second.events == 2
    rows.append(("jsonl file appended while a run reads it, then between runs",
                 f"no error: the run commits the whole lines up to the size it listed ({first.events} lines); the "
                 f"next run the {second.events} lines appended after them, a line still being written once it has "
                 "its line end"))
    rows.append(("jsonl or text file whose last line has no line end",
                 f"no error: that line waits until the file has not been modified for {TAIL_SETTLE_S:g} s, then is "
                 "ingested once; the file may then grow only by a line end first (else the row 'settled last line "
                 "… extended later')"))
    path = ingested("rewritten", three)
    path.write_text(three.replace('"n": 2', '"n": 9'))  # same size, a committed line rewritten
    expect("jsonl file rewritten in place after it was ingested", ChangedFileError,
           r"its first 183 bytes differ from the bytes committed\. Committed so far: lines 1-3 .* writing lines "
           r"1-3 a second time", path)
    path = ingested("shrunk", three)
    path.write_text(line(1) + "\n")
    expect("jsonl file cut shorter after it was ingested", ChangedFileError,
           r"it shrank to 61 bytes, below the 183 bytes committed", path)
    path = ingested("prefixed", three)
    path.write_text(line(0) + "\n" + three)  # grew, but not at its end
    expect("jsonl file that grew at its start", ChangedFileError, r"its first 183 bytes differ", path)
    path = ingested("extended", '{"v": 1}\n{"v": 2}')
    settle(path)  # the unterminated last line is ingested once the file settles ...
    run_ingest(client, spark, IngestSpec(scope=scope, stream="s", source=str(path.parent), ingest_id="extended"))
    append(path, '{"v": 3}\n')  # ... and extending it would change a committed record
    expect("settled last line without line end, extended later", ChangedFileError,
           r"its last committed line, committed without a line end at byte 17, was extended\. Committed so far: "
           r"lines 1-2", path)
    # A record written before pieces (size and time, no fingerprint): an append cannot be told
    # from a rewrite, so growth is refused as before.
    old = tmp_path / "legacy" / "a.jsonl"
    old.parent.mkdir()
    old.write_text(three)
    legacy = IngestSpec(scope=scope, stream="s", source=str(old.parent), ingest_id="legacy")
    coord = IngestCoordinator(open_state_store(client, *state_location(legacy)), client.transactions, scope, "s")
    run_id, *_ = coord.start_run({str(old): {"size": old.stat().st_size, "mtime": old.stat().st_mtime_ns // 10**6}})
    coord.finish(run_id)
    append(old, line(4) + "\n")
    expect("jsonl file grown, ingested by a version that recorded no fingerprint", ChangedFileError,
           r"holds no fingerprint of the 183 bytes committed, so an append cannot be told from a rewrite\. "
           r"Committed so far: every record of its 183 bytes as recorded \(by run .* writing those records a second "
           r"time", old)
    # CSV and Parquet files are not tailed: a grown CSV file is a changed file.
    csv = tmp_path / "csv" / "a.csv"
    csv.parent.mkdir()
    csv.write_text("k,v\na,1\n")
    run_ingest(client, spark, IngestSpec(scope=scope, stream="s", source=str(csv.parent), ingest_id="csv",
                                         format="csv"))
    append(csv, "b,2\n")
    expect("CSV file appended after it was ingested (CSV is not tailed)", ChangedFileError,
           r"its size or modification time differ from those recorded", csv, format="csv")

    # Allowed anyway: the whole rewritten file again, as the message said.
    again = IngestSpec(scope=scope, stream="s", source=str(tmp_path / "rewritten"), ingest_id="rewritten",
                       allow_changed_files=True)
    assert run_ingest(client, spark, again).events == 3
    check_section("growing-files", "Files that grow or change", "tests/ingest/test_ingest_growing.py", rows,
                  "A jsonl or text file that only grows is tailed: each run ingests the whole lines appended "
                  "since the last (a line still being written waits for its line end, or until the file has not "
                  f"changed for {TAIL_SETTLE_S:g} s). Anything else that changed a committed file is refused, "
                  "naming the lines `allow_changed_files=True` would write a second time.")


def test_a_file_replaced_whole_by_a_longer_one_is_tailed_if_it_starts_with_what_was_committed(
        tmp_path, client, spark, read_stream, unique_name, pravega_controller_uri):
    """What object stores do to a 'growing' file: a new object under the same name (a new file
    renamed over the old one here). The same bytes plus more: the new lines; other bytes: changed."""
    scope = unique_name("replace")
    path = tmp_path / "in" / "a.jsonl"
    path.parent.mkdir()
    path.write_text("".join(line(n) + "\n" for n in range(1, 11)))
    spec = IngestSpec(scope=scope, stream="s", source=str(path.parent), create_stream=True)
    assert run_ingest(client, spark, spec).events == 10
    new = tmp_path / "a.jsonl.new"
    new.write_text(path.read_text() + "".join(line(n) + "\n" for n in range(11, 16)))
    os.replace(new, path)
    assert run_ingest(client, spark, spec).events == 5
    new.write_text("".join(line(n) + "\n" for n in range(100, 120)))
    os.replace(new, path)
    with pytest.raises(ChangedFileError, match="differ from the bytes committed"):
        run_ingest(client, spark, spec)
    got = read_stream(pravega_controller_uri, scope, "s")
    assert Counter(e.decode() for e in got) == Counter(line(n) for n in range(1, 16))


def test_local_files_are_measured_in_the_task_exactly_as_in_spark_tasks(tmp_path, spark):
    """Small local line files are measured in the task's process (no Spark job: a small daily run's
    fixed cost), larger or remote ones in Spark tasks: both apply one rule (measure_file), so every
    case of it gives the same piece either way; a listed file gone before it is read is named."""
    import hashlib

    head = "".join(line(n) + "\n" for n in range(3)).encode()
    fp = hashlib.blake2b(head, digest_size=20).hexdigest()
    files = {
        "new": (head + b'{"k": "k1", "n": 9}', {"base": 0, "fp": None, "open": False, "tail": False}),
        "new-settled": (head + b'{"k": "k1", "n": 9}', {"base": 0, "fp": None, "open": False, "tail": True}),
        "grown": (head + head, {"base": len(head), "fp": fp, "open": False, "tail": False}),
        "rewritten": (b"x" + head[1:] + head, {"base": len(head), "fp": fp, "open": False, "tail": False}),
        "shrunk": (head[:10], {"base": len(head), "fp": fp, "open": False, "tail": False}),
        "no-fingerprint": (head + head, {"base": len(head), "fp": None, "open": False, "tail": False}),
        "open-extended": (head[:-1] + b"more\n", {"base": len(head) - 1, "open": True, "tail": False,
                                             "fp": hashlib.blake2b(head[:-1], digest_size=20).hexdigest()}),
        "open-ended": (head + b"\nnext\n", {"base": len(head), "fp": fp, "open": True, "tail": False}),
        "old-record": (head + head, {"base": len(head), "fp": fp, "open": None, "tail": False}),
    }
    requests = {}
    for name, (content, req) in files.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(content)
        requests[key_of(path.resolve().as_uri())] = {"size": len(content), "mtime": 1, **req}
    in_task = measure_local_pieces(requests)
    assert in_task == measure_pieces(spark, requests)
    changed = {Path(k).stem: p.get("changed") for k, p in in_task.items()}
    assert {k for k, why in changed.items() if why} == {"rewritten", "shrunk", "no-fingerprint", "open-extended"}
    assert in_task[key_of((tmp_path / "grown.jsonl").resolve().as_uri())]["start"] == len(head)
    gone = next(iter(requests))
    os.remove(local_path(gone))
    with pytest.raises(SourceError, match="was listed but is gone"):
        measure_local_pieces(requests)


def test_small_local_files_are_read_in_the_task_exactly_as_in_spark_tasks(tmp_path, spark):
    """Small local line files are read in the task's process and their lines go to Spark inside the
    query (no Spark job reads them, and a Spark Connect server elsewhere needs no access to the
    task's disk); larger or remote ones are read in Spark tasks: both cut lines by one rule
    (piece_lines), so every piece gives the same rows either way, and a file changed or gone since
    it was measured is refused either way."""
    import hashlib

    head = "".join(line(n) + "\n" for n in range(3)).encode()
    files = {
        "crlf": ("".join(line(n) + "\r\n" for n in range(4)).encode(), {"base": 0, "fp": None}),
        "open-last-line": (head + b'{"k": "k1", "n": 9}', {"base": 0, "fp": None, "tail": True}),
        "grown": (head + b"\n" + head, {"base": len(head), "fp": hashlib.blake2b(head, digest_size=20).hexdigest()}),
    }
    requests = {}
    for name, (content, req) in files.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(content)
        requests[key_of(path.resolve().as_uri())] = {
            "size": len(content), "mtime": 1, "open": False, "tail": False, **req}
    pieces = measure_local_pieces(requests)
    labels = {key: 7 + i for i, key in enumerate(sorted(pieces))}
    for with_labels in (None, labels):
        here = line_frame(spark, pieces, with_labels, here=True).collect()
        there = line_frame(spark, pieces, with_labels).collect()
        assert sorted(map(tuple, here)) == sorted(map(tuple, there))
    rows = {(Path(key_of(r["f"])).stem, r["b"]): r["value"]
            for r in line_frame(spark, pieces, here=True).collect()}
    assert rows[("crlf", 4)] == line(3)  # CR LF cut, numbered from 1 in the whole file
    assert rows[("open-last-line", 4)] == '{"k": "k1", "n": 9}'  # settled: the unterminated line too
    assert {b for name, b in rows if name == "grown"} == {4, 5, 6, 7}  # only the piece after the committed head
    assert rows[("grown", 4)] == ""  # an empty line is a line (record_frame drops it)

    assert lines_read_here(pieces, listed_here=True)
    assert not lines_read_here(pieces, listed_here=False)  # listed by Spark: not on this disk
    total = sum(p["end"] for p in pieces.values())
    assert not lines_read_here({**pieces, "big": {"start": 0, "end": ingest_frames.LOCAL_LINES_MAX_BYTES
                                                             - total + 1}}, listed_here=True)

    grown = tmp_path / "grown.jsonl"
    grown.write_bytes(b"X" + (head + b"\n" + head)[1:])  # rewritten since it was measured
    with pytest.raises(SourceError, match="grown.jsonl changed while the ingest read it"):
        line_frame(spark, pieces, here=True)
    with pytest.raises(Exception, match="grown.jsonl changed while the ingest read it"):
        line_frame(spark, pieces).collect()
    grown.unlink()
    with pytest.raises(SourceError, match="grown.jsonl was listed but is gone"):
        line_frame(spark, pieces, here=True)


def test_a_run_of_small_local_files_reads_them_in_the_task_and_larger_ones_in_spark_tasks(
        tmp_path, client, spark, read_stream, unique_name, pravega_controller_uri, monkeypatch):
    """The run's wiring: a day of small local files is read by the task, with no Spark job reading
    files (one Python worker stage less); past LOCAL_LINES_MAX_BYTES the same run reads them in Spark
    tasks. Both commit every line once."""
    scope = unique_name("readhere")
    day = tmp_path / "day"
    day.mkdir()
    for i in range(2):
        (day / f"part-{i}.jsonl").write_text("".join(line(n) + "\n" for n in range(i * 50, i * 50 + 50)))
    read_by_spark = []
    real_file_contents = ingest_sources.file_contents

    def file_contents(spark_, keys):
        read_by_spark.append(sorted(keys))
        return real_file_contents(spark_, keys)

    for reader in (ingest_pieces, ingest_frames):  # the modules that read files through Spark
        monkeypatch.setattr(reader, "file_contents", file_contents)
    spec = IngestSpec(scope=scope, stream="s", source=str(day / "*.jsonl"), routing_key_field="k",
                      create_stream=True)
    assert run_ingest(client, spark, spec).events == 100
    assert read_by_spark == []
    for i in range(2):
        append(day / f"part-{i}.jsonl", "".join(line(n) + "\n" for n in range(100 + i * 50, 150 + i * 50)))
    monkeypatch.setattr(ingest_frames, "LOCAL_LINES_MAX_BYTES", 100)
    assert run_ingest(client, spark, spec).events == 100
    assert read_by_spark == [sorted(str(p) for p in day.glob("*.jsonl"))]
    got = read_stream(pravega_controller_uri, scope, "s")
    assert Counter(e.decode() for e in got) == Counter(line(n) for n in range(200))
