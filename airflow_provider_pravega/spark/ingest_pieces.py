"""What the ingest knows of the listed files' contents: content fingerprints (CSV and Parquet
files recorded by older states), and each line file's next piece (the byte range of whole lines
not committed yet), measured by the write task that reads the file."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from airflow_provider_pravega.client.ingest_plan import known_files, line_request
from airflow_provider_pravega.spark.ingest_sources import SourceFile, file_contents, key_of
from airflow_provider_pravega.spark.worker_heap import prepare_worker_heap


#: A line file's last line without a line end is ingested only once the file has not been modified
#: for this long (at listing): until then it may be a line still being written.
TAIL_SETTLE_S = 60.0


_DIGEST_SCHEMA = "path string, fp string"


def fingerprint_files(spark: Any, keys: Sequence[str]) -> dict[str, str]:
    """BLAKE2b-160 content fingerprints (the form states recorded before listing went through
    Spark), computed inside Spark tasks — one file per row, never on the driver."""
    if not keys:
        return {}

    def digest(batches: Iterator[Any]) -> Iterator[Any]:
        prepare_worker_heap()

        # import cost: pyarrow (0.3-0.5 s) only where a batch is built, not with the module (arrow_columns imports it)
        from airflow_provider_pravega.spark.arrow_columns import record_batch, schema_of

        schema = schema_of(_DIGEST_SCHEMA)
        for batch in batches:
            paths = batch.column("path").to_pylist()
            fps = [hashlib.blake2b(c, digest_size=20).hexdigest() for c in batch.column("content").to_pylist()]
            yield record_batch({"path": paths, "fp": fps}, schema)

    rows = (file_contents(spark, keys)
            .mapInArrow(digest, _DIGEST_SCHEMA).collect())
    return {key_of(r["path"]): r["fp"] for r in rows}


def measure_file(content: bytes, req: dict[str, Any]) -> dict[str, Any]:
    """One line file's next piece from its ``content`` (the rule: :func:`next_piece`); ``req`` is
    its request (``open`` is filled in when unknown)."""
    size, base = req["size"], req["base"]
    data = memoryview(content)[:size]
    if req.get("open") is None:  # a record from before pieces: was its last line terminated?
        req["open"] = bool(base) and bytes(data[base - 1:base]) != b"\n"
    changed = None
    digest = hashlib.blake2b(data[:base], digest_size=20)
    if len(data) < size:
        changed = f"it was cut to {len(data)} bytes after it was listed at {size} bytes"
    elif base and size < base:
        changed = f"it shrank to {size} bytes, below the {base} bytes committed"
    elif base and not req.get("fp"):
        changed = (f"it grew or was rewritten (now {size} bytes), and its record holds no fingerprint "
                   f"of the {base} bytes committed, so an append cannot be told from a rewrite")
    elif base and digest.hexdigest() != req["fp"]:
        changed = f"its first {base} bytes differ from the bytes committed"
    elif base and req.get("open") and size > base and bytes(data[base:base + 1]) != b"\n":
        changed = f"its last committed line, committed without a line end at byte {base}, was extended"
    if changed:
        base, digest = 0, hashlib.blake2b(digest_size=20)
    start = base + 1 if base and req.get("open") and not changed and size > base else base
    nl = content.rfind(b"\n", start, size)
    end, is_open = (nl + 1 if nl >= 0 else start), False
    if req["tail"] and end < size:
        end, is_open = size, True
    if end > base:
        digest.update(data[base:end])
    else:
        end = base
    return {"start": start, "end": end, "fp": digest.hexdigest(), "line": content.count(b"\n", 0, start) + 1,
            "lines": content.count(b"\n", 0, end) + (1 if is_open else 0),
            "open": is_open or (end == base and bool(req.get("open")) and not changed), "changed": changed}


def next_piece(content: bytes, req: Mapping[str, Any]) -> dict[str, Any]:
    """A line file's next piece, decided by the write task that holds its bytes (``content``, read
    whole) from its request (:func:`line_requests`): ``size`` (listed), ``base`` (its committed
    end, 0 when new), ``fp``/``open`` (what the committed record says) and ``tail`` (whether a last
    line without a line end may be ingested: the file has settled). The piece is what the commit
    point records of the file, plus ``changed`` (why its committed bytes are not those committed).

    Rule (:func:`measure_file`): a piece is ``[start, end)`` where ``end`` follows the last line end
    before the listed size, so a line still being written is left for a later run; when ``tail`` is
    set, the unterminated last line is included and recorded ``open``: the file may then only grow
    by a line end first. A committed file continues at its committed end when ``[0, base)`` still
    has the committed fingerprint (checked here, where the bytes are read anyway); else (rewritten,
    shrunk, an open last line extended, or no fingerprint recorded) it is measured from byte 0 and
    marked ``changed`` with the reason (see ChangedFileError)."""
    req = dict(req)
    r = measure_file(content, req)
    piece = {"size": req["size"], "base": 0 if r["changed"] else req["base"], "start": r["start"], "end": r["end"],
             "fp": r["fp"], "line": r["line"], "lines": r["lines"], "open": r["open"]}
    if req.get("mtime") is not None:
        piece["mtime"] = req["mtime"]
    if r["changed"]:
        piece["changed"] = r["changed"]
    return piece


def line_requests(store: Any, listed: Sequence[SourceFile], identities: Mapping[str, Mapping[str, Any]],
                  listed_at_ms: int) -> dict[str, dict[str, Any]]:
    """What the write tasks need to take the next piece of every listed line file that may hold
    lines not committed yet (new, grown, changed, or with an unterminated last line that has
    settled since): see :func:`next_piece`. Nothing is read here: the task that writes a file
    measures it, in the same pass. Files listed exactly as committed are left to planning
    (skipped) without being read (nor Spark started for them)."""
    committed = known_files(store, store.fetch(), identities)
    requests = {}
    for f in listed:
        settled = listed_at_ms - f.mtime_ms >= TAIL_SETTLE_S * 1000
        request = line_request({**identities[f.key], "tail": settled}, committed.get(f.key))
        if request is not None:
            requests[f.key] = request
    return requests
