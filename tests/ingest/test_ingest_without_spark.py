"""A run with nothing to do starts no JVM: local sources are listed without Spark, exactly as Spark
lists them, and Spark starts only for files not committed yet (issue 28, item 4).

The runs under test get a ``JAVA_HOME`` whose ``bin/java`` only records that it was started and
fails: a run that started Spark would fail, and the record says so whatever the timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_pravega.spark.ingest_sources import list_sources, precheck_sources


def _write(path: Path, lines: int, *, tag: str) -> list[str]:
    rows = [json.dumps({"sensor_id": f"s{n % 3}", "tag": tag, "n": n}) for n in range(lines)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n")
    return rows


def test_local_listing_is_the_one_spark_makes(tmp_path: Path, spark) -> None:
    """Names with spaces, glob characters, non-ASCII, hidden and empty files, a symbolic link and
    a dangling one, through a directory, a glob in the last name, a literal file and a list."""
    d = tmp_path / "in dir"
    for name in ("a.jsonl", "b c.jsonl", "x[1].jsonl", "é.jsonl", "_hidden.jsonl", ".dot.jsonl"):
        _write(d / name, 3, tag=name)
    (d / "empty.jsonl").write_text("")
    os.symlink(d / "a.jsonl", d / "link.jsonl")
    os.symlink(d / "gone.jsonl", d / "dangling.jsonl")
    for source in (str(d), str(d / "*.jsonl"), f"file://{d}/a.jsonl", str(d / "x[1].jsonl"), f"{d}/../{d.name}/a*",
                   [str(d / "a.jsonl"), str(d / "b*"), str(d)]):
        local = precheck_sources(source).files
        assert local is not None, source
        assert [(f.key, f.size, f.mtime_ms) for f in local] == \
            [(f.key, f.size, f.mtime_ms) for f in list_sources(spark, source)], source


def test_what_only_spark_can_list_is_left_to_spark(tmp_path: Path) -> None:
    d = tmp_path / "in"
    _write(d / "day=1" / "a.jsonl", 2, tag="a")
    _write(d / "b.jsonl", 2, tag="b")
    assert precheck_sources(str(d)).files is None  # a subdirectory: Spark's partition discovery
    assert precheck_sources(str(tmp_path / "*" / "b.jsonl")).files is None  # a wildcard directory
    assert precheck_sources(str(d / "{a,b}.jsonl")).files is None  # Hadoop's own glob syntax
    assert precheck_sources(f"file://{d}/../in/b.jsonl").files is None  # Hadoop's Path may spell it otherwise
    assert precheck_sources("s3a://bucket/key.jsonl").files is None
    assert [f.key for f in precheck_sources(str(d / "b.jsonl")).files] == [str(d / "b.jsonl")]


def _recording_java(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose Java only records its start (and fails, as no JVM would be there)."""
    home = tmp_path / "no-jvm"
    (home / "bin").mkdir(parents=True)
    started = tmp_path / "java-started"
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho \"$@\" >> '{started}'\nexit 1\n")
    java.chmod(0o755)
    return {**os.environ, "JAVA_HOME": str(home)}, started


def _ingest(uri: str, scope: str, source: str, *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "airflow_provider_pravega.spark.ingest_job", "--controller-uri", uri,
           "--scope", scope, "--stream", "s", "--source", source, "--create-stream", "--ingest-id", "daily",
           "--interval", "2026-11-01/2026-11-02", "--on-empty", "succeed", "--master", "local[2]"]
    return subprocess.run(cmd, env=env or dict(os.environ), capture_output=True, text=True, timeout=600)


def _summary(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_done_interval_and_an_empty_glob_start_no_jvm(tmp_path: Path, pravega_embedded, unique_name,
                                                         read_stream) -> None:
    uri = pravega_embedded.controller_uri
    scope = unique_name("nojvm")
    day = tmp_path / "in" / "2026-11-01"
    lines = _write(day / "a.jsonl", 40, tag="a") + _write(day / "b.jsonl", 40, tag="b")
    first = _summary(_ingest(uri, scope, str(day / "*.jsonl")))  # with Spark: there is work
    assert sorted(Path(f).name for f in first["files_ingested"]) == ["a.jsonl", "b.jsonl"]

    no_java, started = _recording_java(tmp_path)
    again = _summary(_ingest(uri, scope, str(day / "*.jsonl"), env=no_java))  # a backfill of a done day
    assert again["run_id"] is None and len(again["files_skipped"]) == 2
    empty = _summary(_ingest(uri, scope, str(tmp_path / "in" / "2026-11-02" / "*.jsonl"), env=no_java))
    assert empty["run_id"] is None
    assert not started.exists(), f"a JVM was started: {started.read_text()}"

    # The guard is real: a new file is work, and that run reaches for Java (and fails without it).
    lines += _write(day / "c.jsonl", 40, tag="c")
    refused = _ingest(uri, scope, str(day / "*.jsonl"), env=no_java)
    assert refused.returncode != 0 and started.exists()
    third = _summary(_ingest(uri, scope, str(day / "*.jsonl")))
    assert [Path(f).name for f in third["files_ingested"]] == ["c.jsonl"]
    got = [e.decode() for e in read_stream(uri, scope, "s", expected=len(lines))]
    assert sorted(got) == sorted(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
