"""The functions Spark's Python workers run here build their Arrow batches without importing pandas
(pyarrow imports it on its first ``pa.array``/``pa.scalar`` of Python values: 0.25-0.3 CPU-s in each
new worker, a quarter of a daily run's write task), and the builders give what pyarrow's own do."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_pravega.client.batch import plan_segment_ranges
from airflow_provider_pravega.client.streamcut import StreamCut
from airflow_provider_pravega.spark import arrow_columns as ac

ROOT = Path(__file__).resolve().parents[2]

CASES = [
    (["a", None, "ü€", ""], pa.string()),
    ([b"x", b"", None, bytes(range(256))], pa.binary()),
    ([1, None, -5, 2**62], pa.int64()),
    ([True, None, False, True, True, False, False, True, True], pa.bool_()),
    ([["a", "b"], None, [], ["c"]], pa.list_(pa.string())),
    ([], pa.string()),
    ([None, None], pa.int64()),
]


@pytest.mark.parametrize(("values", "kind"), CASES, ids=lambda c: str(c)[:30])
def test_a_built_column_equals_pyarrows_own(values, kind):
    built = ac.array(values, kind)
    built.validate(full=True)
    assert built.equals(pa.array(values, kind))
    assert built.null_count == sum(v is None for v in values)


def test_repeated_values_schemas_and_refusals():
    for value, kind in (("scope-ü", pa.string()), (b"\n", pa.binary()), (42, pa.int64())):
        assert ac.repeated(value, kind, 3).equals(pa.repeat(pa.scalar(value, kind), 3))
        assert ac.repeated(value, kind, 0).equals(pa.array([], kind))
        assert ac.scalar(value, kind).equals(pa.scalar(value, kind))
    ddl = "txn string, events long, open boolean, content binary, files array<string>"
    assert ac.schema_of(ddl) == pa.schema([("txn", pa.string()), ("events", pa.int64()), ("open", pa.bool_()),
                                           ("content", pa.binary()), ("files", pa.list_(pa.string()))])
    batch = ac.record_batch({"txn": ["t"], "events": [3], "open": [False], "content": [b"c"], "files": [["f"]]},
                            ac.schema_of(ddl))
    assert batch.to_pylist() == [{"txn": "t", "events": 3, "open": False, "content": b"c", "files": ["f"]}]
    with pytest.raises(TypeError, match="no builder for the Spark type 'double' of column 'x'"):
        ac.schema_of("x double")
    with pytest.raises(TypeError, match="expected str for an Arrow string column, got b'x'"):
        ac.array([b"x"], pa.string())
    with pytest.raises(TypeError, match="expected int for an Arrow int64 column, got True"):
        ac.array([True], pa.int64())
    with pytest.raises(TypeError, match="no builder for Arrow type double"):
        ac.array([1.5], pa.float64())


# A new interpreter, as a Spark Python worker is (the daemon imports pyspark.daemon, the worker
# pyarrow): it runs what the workers run and says whether pandas got imported.
_WORKER = """
import json, pickle, sys
import pyspark.daemon, pyarrow as pa
from airflow_provider_pravega.spark.datasource_options import connection_config
from airflow_provider_pravega.spark.datasource_read import Decoding, _read_partition
from airflow_provider_pravega.spark.ingest_frames import piece_lines
from airflow_provider_pravega.spark.ingest_pieces import _DIGEST_SCHEMA
from airflow_provider_pravega.spark.ingest_task import task_result
from airflow_provider_pravega.spark.arrow_columns import record_batch, schema_of

uri, ranges = pickle.load(open(sys.argv[1], "rb"))
config = connection_config({"controller": uri})
text = Decoding("text", pa.schema([("event", pa.string()), ("scope", pa.string()), ("stream", pa.string()),
                                   ("segment_id", pa.int64()), ("offset", pa.int64())]))
rows = [r for b in _read_partition(config, ranges, text) for r in b.to_pylist()]
parsed = Decoding("json", pa.schema([("n", pa.int64()), ("offset", pa.int64())]), ("n",))
numbers = [r["n"] for b in _read_partition(config, ranges, parsed) for r in b.to_pylist()]
content = b"one\\r\\ntwo\\n\\nthree\\n"
lines = [dict(r, value=r["value"].decode()) for b in piece_lines("/in/a.jsonl", content, (0, len(content), 0, None), 7)
         for r in b.to_pylist()]
answer = task_result("00ff", 3, 9, files=["b", "a"]).to_pylist()
digest = record_batch({"path": ["p"], "fp": ["f"]}, schema_of(_DIGEST_SCHEMA)).to_pylist()
print(json.dumps({"pandas": "pandas" in sys.modules, "rows": len(rows), "scopes": sorted({r["scope"] for r in rows}),
                  "offsets_rise": all(a["offset"] < b["offset"] for a, b in zip(rows, rows[1:])
                                      if a["segment_id"] == b["segment_id"]),
                  "numbers": sorted(numbers), "lines": lines, "answer": answer, "digest": digest}))
"""


def test_what_spark_workers_run_imports_no_pandas(client, pravega_controller_uri, unique_name, tmp_path):
    scope, stream = unique_name("arrow-cols"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 2)
    with client.event_writer(scope, stream) as writer:
        for i in range(50):
            writer.write_event(json.dumps({"n": i}).encode(), routing_key=f"k{i % 5}")
        writer.flush()
    ranges = [r for r in plan_segment_ranges(client, StreamCut.head(client, scope, stream),
                                             StreamCut.tail(client, scope, stream)) if r.length]
    plan = tmp_path / "plan.pickle"
    plan.write_bytes(pickle.dumps((pravega_controller_uri, ranges)))
    done = subprocess.run([sys.executable, "-c", _WORKER, str(plan)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["pandas"] is False
    assert got["rows"] == 50 and got["scopes"] == [scope] and got["offsets_rise"]
    assert got["numbers"] == list(range(50))
    assert got["lines"] == [{"f": "/in/a.jsonl", "b": b, "value": v, "j": None, "w": 7}
                            for b, v in enumerate(["one", "two", "", "three"])]
    assert got["answer"] == [{"txn": "00ff", "events": 3, "bytes": 9, "error": None, "bad_file": None,
                              "files": ["a", "b"]}]
    assert got["digest"] == [{"path": "p", "fp": "f"}]
