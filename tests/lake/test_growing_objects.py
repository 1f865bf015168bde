"""A "growing" jsonl object on the S3-compatible server (moto), ingested through ``s3a://`` by the
ingest job's own process: objects are replaced whole, so growth is a new object under the same key
that starts with the old bytes (whole lines here: an object is never caught mid-write, and a last
line without a line end waits TAIL_SETTLE_S, which a test on process timing cannot drive). One replaced while a run reads it (after the run listed it: the
job's step pause, released by the test) and one replaced between runs are tailed, every line once;
one replaced by other bytes is a ChangedFileError naming the lines that would repeat.

Embedded server only: the subject is the object store's side (listing, replaced objects, tailing);
the tailing ingest runs against Pravega standalone in tests/ingest/test_ingest_growing.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from pravega_testing.faults import fault_env


def line(n: int) -> str:
    return json.dumps({"k": f"k{n % 5}", "n": n})


def lines(first: int, last: int) -> bytes:
    return "".join(line(n) + "\n" for n in range(first, last + 1)).encode()


def ingest_cmd(uri: str, scope: str, conf: dict[str, str]) -> list[str]:
    cmd = [sys.executable, "-m", "airflow_provider_pravega.spark.ingest_job", "--controller-uri", uri,
           "--scope", scope, "--stream", "s", "--source", "s3a://lake/logs/", "--routing-key-field", "k",
           "--create-stream", "--master", "local[2]"]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd


def test_an_object_replaced_by_a_longer_one_is_tailed_once(tmp_path: Path, object_store: Any, unique_name: Any,
                                                           pravega_embedded: Any, read_stream: Any) -> None:
    pravega_controller_uri = pravega_embedded.controller_uri
    s3 = object_store
    s3.client.create_bucket(Bucket="lake")
    s3.client.put_object(Bucket="lake", Key="logs/app.jsonl", Body=lines(1, 3000))
    scope = unique_name("s3grow")
    cmd = ingest_cmd(pravega_controller_uri, scope, s3.spark_conf())
    release = tmp_path / "release"
    env = fault_env(delay_at="after_listing", release=release)
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as job:
        try:
            for text in job.stderr:  # the job's log: it pauses right after listing the object
                if "fault injection: pausing" in text:
                    break
            else:
                raise AssertionError("the ingest job ended before listing the object")
            # The writer uploads the whole log again, 500 lines longer.
            s3.client.put_object(Bucket="lake", Key="logs/app.jsonl", Body=lines(1, 3500))
            release.write_text("")
            out, err = job.communicate(timeout=600)
        finally:
            if job.poll() is None:
                job.kill()
    assert job.returncode == 0, err[-4000:]
    assert json.loads(out.strip().splitlines()[-1])["events"] == 3000

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600)

    second = run()
    assert second.returncode == 0, second.stderr[-4000:]
    assert json.loads(second.stdout.strip().splitlines()[-1])["events"] == 500
    # Replaced between runs: 100 lines longer.
    s3.client.put_object(Bucket="lake", Key="logs/app.jsonl", Body=lines(1, 3600))
    third = run()
    assert third.returncode == 0, third.stderr[-4000:]
    assert json.loads(third.stdout.strip().splitlines()[-1])["events"] == 100
    # Replaced by other, more bytes (a rotated log under the same key): refused, nothing written.
    s3.client.put_object(Bucket="lake", Key="logs/app.jsonl", Body=lines(9001, 13000))
    changed = run()
    assert changed.returncode == 1
    assert ("s3a://lake/logs/app.jsonl changed since it was ingested: its first " in changed.stderr
            and "writing lines 1-3600 a second time" in changed.stderr), changed.stderr[-4000:]
    got = read_stream(pravega_controller_uri, scope, "s")  # until nothing more comes: duplicates would show
    assert Counter(e.decode() for e in got) == Counter(line(n) for n in range(1, 3601))
