"""Files that grow or change while an ingest reads them, and between its runs (jsonl and text are
read as exact byte ranges of whole lines; see measure_pieces in spark/ingest_pieces.py). Appends are
driven by the ingest's own fault points (``airflow_provider_pravega.fault_points``), never by timing.
Every line must reach the stream exactly once across the runs. The last test writes the "growing-files" section of
docs/bad-input.md (PRAVEGA_UPDATE_DOCS=1 regenerates it)."""

from __future__ import annotations

import dataclasses
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
from airflow_provider_pravega.spark import ingest_frames, ingest_partitions, ingest_pieces, ingest_sources, ingest_task
from airflow_provider_pravega.spark.ingest_job import run_ingest, state_location
from airflow_provider_pravega.spark.ingest_pieces import TAIL_SETTLE_S, next_piece
from airflow_provider_pravega.spark.ingest_sources import key_of, local_path
from airflow_provider_pravega.spark.ingest_spec import IN_PROCESS_MAX_BYTES, BadRecordError, IngestSpec, SourceError
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
    # Grown by a line still being written: its task reads it (one pass: nothing is read before the
    # run) and finds no new whole line; the size is recorded, so the next run does not read it again.
    grown = run_ingest(client, spark, spec)
    assert (grown.events, grown.files_ingested, grown.files_skipped) == (0, [], [str(path)])
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


def test_the_write_task_takes_each_piece_from_the_bytes_it_reads(tmp_path):
    """One pass: a line file's next piece is decided from the bytes its write task reads anyway
    (next_piece), the committed prefix checked against its fingerprint there: a grown file
    continues at its committed end, a rewritten, shrunk or extended one is marked changed."""
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
    pieces = {name: next_piece(content, {"size": len(content), "mtime": 1, **req})
              for name, (content, req) in files.items()}
    assert {k for k, p in pieces.items() if p.get("changed")} == {"rewritten", "shrunk", "no-fingerprint",
                                                                   "open-extended"}
    assert (pieces["grown"]["start"], pieces["grown"]["end"], pieces["grown"]["line"]) == (len(head), 2 * len(head), 4)
    assert pieces["grown"]["fp"] == hashlib.blake2b(head + head, digest_size=20).hexdigest()  # of [0, end)
    assert (pieces["new"]["end"], pieces["new"]["open"]) == (len(head), False)  # the unsettled last line waits
    assert pieces["new-settled"]["open"] and pieces["new-settled"]["end"] == len(files["new-settled"][0])
    assert pieces["open-ended"]["start"] == len(head) + 1  # after the line end that closed the open line
    # A file cut after it was listed is measured as it is read, and said so.
    assert "cut to 10 bytes" in next_piece(head[:10], {"size": len(head), "base": 0, "fp": None, "open": False,
                                                        "tail": False})["changed"]


def test_line_files_read_here_by_their_tasks_or_by_spark_reach_their_tasks_alike(tmp_path, spark):
    """What a line file's write task gets: its bytes read by the task's process (small local files,
    sent in the query), its name only (other local files: the task reads them), or its bytes read by
    Spark tasks (binaryFile, every other filesystem; forced here on the same files). One partition
    per write group, whole files in path order within it, each read up to its listed size, the same
    bytes either way. A file gone before it is read is named, and so is one the task cannot see."""
    requests = {}
    for i in range(5):
        path = tmp_path / f"f{i}.jsonl"
        path.write_text("".join(line(n) + "\n" for n in range(10 * (i + 1))))
        requests[ingest_sources.key_of(path.resolve().as_uri())] = {
            "size": path.stat().st_size - 3 * (i == 2), "mtime": 1, "tail": False, "base": 0, "fp": None, "open": False}
    spec = IngestSpec(scope="s", stream="s", source=str(tmp_path), routing_key_field="k")
    groups = ingest_partitions.write_groups(requests, 2)
    assert len(groups) == 2 and groups[0] + groups[1] == sorted(requests)
    def tasks(batches):  # what each write task gets, seen from inside the task (as the writer sees it)
        import pyarrow as pa
        from pyspark import TaskContext

        for batch in batches:
            yield pa.RecordBatch.from_pydict({
                "path": batch.column("path").to_pylist(), "content": batch.column("content").to_pylist(),
                "p": pa.array([TaskContext.get().partitionId()] * batch.num_rows, pa.int32())})

    def by_spark(spark_, keys):  # what the frame reads on other filesystems, on these local files
        return spark_.read.format("binaryFile").load([ingest_sources.uri_of(k) for k in keys]).select("path", "content")

    seen = {}
    for how in ("here", "task", "spark"):
        with ingest_partitions.write_job_settings(spark, listed_here=True), pytest.MonkeyPatch.context() as mp:
            if how == "spark":
                mp.setattr(ingest_frames, "file_contents", by_spark)
                mp.setattr(ingest_frames, "is_local_key", lambda key: False)
            frame = ingest_frames.file_frame(spark, requests, spec, 2, here=how == "here")
            rows = frame.mapInArrow(tasks, "path string, content binary, p int").collect()
        if how == "here":  # read no further than the listed size (Spark's reader reads the file whole; the task cuts it)
            assert all(len(r["content"]) == requests[ingest_sources.key_of(r["path"])]["size"] for r in rows)
        if how == "task":  # named only: the write task reads each file up to its listed size itself
            assert all(r["content"] is None for r in rows)
            rows = [{**r.asDict(), "content": ingest_sources.local_bytes(key, upto=requests[key]["size"])}
                    for r in rows for key in [ingest_sources.key_of(r["path"])]]
        seen[how] = sorted((key, bytes(r["content"])[:requests[key]["size"]])
                           for r in rows for key in [ingest_sources.key_of(r["path"])])
        by_task: dict[int, list[str]] = {}
        for r in rows:
            by_task.setdefault(r["p"], []).append(ingest_sources.key_of(r["path"]))
        assert [by_task[p] for p in sorted(by_task)] == groups, how  # group i is task i, in path order
    assert seen["here"] == seen["task"] == seen["spark"]
    assert ingest_frames.files_read_here(requests, listed_here=True)
    assert not ingest_frames.files_read_here(requests, listed_here=False)  # listed by Spark: not on this disk
    first = sorted(requests)[1]
    with pytest.raises(SourceError, match="where the Spark task writing it ran"):
        raise ingest_sources.file_gone_where_read(first, "another-host")  # there, but not where the task ran
    os.remove(sorted(requests)[0])
    with pytest.raises(SourceError, match="was listed but is gone"):
        ingest_frames.file_frame(spark, requests, spec, 2, here=True)
    with pytest.raises(SourceError, match="was listed but is gone"):
        raise ingest_sources.file_gone_where_read(sorted(requests)[0], "another-host")  # gone here too


def test_a_run_reads_each_line_file_once_here_or_in_spark_tasks(
        tmp_path, client, spark, read_stream, unique_name, pravega_controller_uri, monkeypatch):
    """One pass: a run reads each line file's bytes once, where they are written, and starts no
    other Spark job (no measuring pass). A day of small local files is written by the task's own
    process without Spark (no session is asked for); with ``in_process_max_bytes=0`` it is read by
    the task's process and sent in the query; past LOCAL_LINES_MAX_BYTES the same run's Spark
    write tasks read them (neither this process nor a Spark reader does). Each commits every line
    once; a grown file's committed prefix is checked in that same read. A file deleted after the
    listing is named."""
    scope = unique_name("readhere")
    day = tmp_path / "day"
    day.mkdir()
    files = [day / f"part-{i}.jsonl" for i in range(2)]
    read_by_spark, read_here, sessions = [], [], []
    real_file_contents, real_local_bytes = ingest_sources.file_contents, ingest_sources.local_bytes

    def file_contents(spark_, keys):
        read_by_spark.append(sorted(keys))
        return real_file_contents(spark_, keys)

    def local_bytes(key, upto=-1):
        read_here.append(key)
        return real_local_bytes(key, upto)

    for reader in (ingest_pieces, ingest_frames):  # the modules that read files
        monkeypatch.setattr(reader, "file_contents", file_contents, raising=False)
    monkeypatch.setattr(ingest_frames, "local_bytes", local_bytes)
    monkeypatch.setattr(ingest_task, "local_bytes", local_bytes)  # the write task's reads, when it runs here
    tracker = spark.sparkContext.statusTracker()

    def session():
        sessions.append(None)
        return spark

    def run(spec: IngestSpec) -> tuple[int, int]:
        """(events, Spark jobs) of one run, after 50 more lines in each file."""
        for i, path in enumerate(files):
            first = run.lines + i * 50
            append(path, "".join(line(n) + "\n" for n in range(first, first + 50)))
        run.lines += 100
        read_by_spark.clear()
        read_here.clear()
        group = f"one-pass-{scope}-{run.lines}"
        spark.sparkContext.setJobGroup(group, "one pass")
        try:
            events = run_ingest(client, session, spec).events
        finally:
            spark.sparkContext.setJobGroup("", "")
        return events, len(tracker.getJobIdsForGroup(group))

    run.lines = 0
    spec = IngestSpec(scope=scope, stream="s", source=str(day / "*.jsonl"), routing_key_field="k",
                      create_stream=True, in_process_max_bytes=IN_PROCESS_MAX_BYTES)
    assert run(spec) == (100, 0) and sessions == []  # written here: no Spark job, no session
    assert read_by_spark == [] and sorted(read_here) == sorted(map(str, files))
    spark_spec = dataclasses.replace(spec, in_process_max_bytes=0)
    assert run(spark_spec) == (100, 1)  # one Spark job: the write, its bytes read here
    assert read_by_spark == [] and sorted(read_here) == sorted(map(str, files))
    monkeypatch.setattr(ingest_frames, "LOCAL_LINES_MAX_BYTES", 100)
    assert run(spark_spec) == (100, 1)
    assert read_by_spark == [] and read_here == []  # the Spark write tasks read them
    got = read_stream(pravega_controller_uri, scope, "s")
    assert Counter(e.decode() for e in got) == Counter(line(n) for n in range(300))
    (day / "part-2.jsonl").write_text(line(300) + "\n")
    at_step(monkeypatch, {"after_listing": lambda: os.remove(day / "part-2.jsonl")})
    with pytest.raises(SourceError, match=r"part-2.jsonl was listed but is gone"):
        run_ingest(client, spark, spark_spec)
    assert Counter(e.decode() for e in read_stream(pravega_controller_uri, scope, "s")) == Counter(
        line(n) for n in range(300))
