"""What the ingest measures of the listed files before a run: content fingerprints, and each line
file's next piece (the byte range of whole lines not committed yet), in Spark tasks or here."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from airflow_provider_pravega.client.ingest_plan import committed_end, known_files, same_file
from airflow_provider_pravega.spark.ingest_sources import SourceFile, file_contents, file_gone, key_of, local_bytes
from airflow_provider_pravega.spark.worker_heap import prepare_worker_heap

log = logging.getLogger(__name__)


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
        import hashlib

        prepare_worker_heap()

        from airflow_provider_pravega.spark.arrow_columns import record_batch, schema_of

        schema = schema_of(_DIGEST_SCHEMA)
        for batch in batches:
            paths = batch.column("path").to_pylist()
            fps = [hashlib.blake2b(c, digest_size=20).hexdigest() for c in batch.column("content").to_pylist()]
            yield record_batch({"path": paths, "fp": fps}, schema)

    rows = (file_contents(spark, keys)
            .mapInArrow(digest, _DIGEST_SCHEMA).collect())
    return {key_of(r["path"]): r["fp"] for r in rows}


#: Line files listed in the task's own process (local files) and holding at most this many bytes in
#: all are measured there, not in a Spark job: a small daily run saves the job (0.2-0.4 s of about
#: 2 s through a warm Spark Connect server); larger ones are read in Spark tasks, never on the driver.
LOCAL_MEASURE_MAX_BYTES = 64 * 1024 * 1024


#: What a measure task returns per file (see measure_file).
_MEASURED_SCHEMA = ("path string, start long, end long, fp string, line long, lines long, open boolean, "
                    "changed string")


def measure_file(content: bytes, req: dict[str, Any]) -> dict[str, Any]:
    """One line file's next piece (the rule: :func:`measure_pieces`) from its ``content``;
    ``req`` is its request (``open`` is filled in when unknown)."""
    import hashlib

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


def measure_pieces(spark: Any, requests: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each line file's next piece, decided in Spark tasks (one file per row, never on the driver)
    from its bytes up to its listed size: ``requests`` maps a file key to ``size`` (listed),
    ``base`` (its committed end, 0 when new), ``fp``/``open`` (what the committed record says) and
    ``tail`` (whether a last line without a line end may be ingested: the file has settled).

    Rule (:func:`measure_file`): a piece is ``[start, end)`` where ``end`` follows the last line end
    before the listed size, so a line still being written is left for a later run; when ``tail`` is
    set, the unterminated last line is included and recorded ``open``: the file may then only grow
    by a line end first. A committed file continues at its committed end when ``[0, base)`` still
    has the committed fingerprint; else (rewritten, shrunk, an open last line extended, or no
    fingerprint recorded) it is measured from byte 0 and marked ``changed`` with the reason (see
    ChangedFileError)."""
    if not requests:
        return {}
    requests = {k: dict(v) for k, v in requests.items()}

    def measure(batches: Iterator[Any]) -> Iterator[Any]:
        from airflow_provider_pravega.spark.arrow_columns import record_batch, schema_of

        prepare_worker_heap()

        schema = schema_of(_MEASURED_SCHEMA)
        for batch in batches:
            out: dict[str, list[Any]] = {c: [] for c in schema.names}
            for path, content in zip(batch.column("path").to_pylist(), batch.column("content").to_pylist()):
                row = {"path": path, **measure_file(content, requests[key_of(path)])}
                for c in schema.names:
                    out[c].append(row[c])
            yield record_batch(out, schema)

    rows = (file_contents(spark, requests)
            .mapInArrow(measure, _MEASURED_SCHEMA).collect())
    return _pieces(requests, {key_of(r["path"]): r for r in rows})


def measure_local_pieces(requests: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """:func:`measure_pieces` for local files, read in this process (at most
    :data:`LOCAL_MEASURE_MAX_BYTES` in all: the caller checks)."""
    requests = {k: dict(v) for k, v in requests.items()}
    found = {}
    for key, req in requests.items():
        content = local_bytes(key)
        if content is not None:  # a file that is gone is reported with the others
            found[key] = measure_file(content, req)
    return _pieces(requests, found)


def _pieces(requests: Mapping[str, Mapping[str, Any]], found: Mapping[str, Mapping[str, Any]]
            ) -> dict[str, dict[str, Any]]:
    """The pieces to record from what each file measured (``found``, by key)."""
    missing = sorted(set(requests) - set(found))
    if missing:
        raise file_gone(missing[0])
    pieces = {}
    for key, r in found.items():
        req = requests[key]
        piece = {"size": req["size"], "base": 0 if r["changed"] else req["base"], "start": r["start"],
                 "end": r["end"], "fp": r["fp"], "line": r["line"], "lines": r["lines"], "open": r["open"]}
        if req.get("mtime") is not None:
            piece["mtime"] = req["mtime"]
        if r["changed"]:
            piece["changed"] = r["changed"]
        pieces[key] = piece
    return pieces


def line_pieces(get_spark: Callable[[], Any], store: Any, listed: Sequence[SourceFile],
                 identities: Mapping[str, Mapping[str, Any]], listed_at_ms: int,
                 local: bool = False) -> dict[str, dict[str, Any]]:
    """The next piece of every listed line file that may hold lines not committed yet (new, grown,
    changed, or with an unterminated last line that has settled since), measured in Spark tasks, or
    here when ``local`` (listed in this process) and small (:data:`LOCAL_MEASURE_MAX_BYTES`);
    files listed exactly as committed are left to planning (skipped) without being read (nor
    Spark started for them)."""
    committed = known_files(store, store.fetch(), identities)
    requests = {}
    for f in listed:
        before = committed.get(f.key)
        settled = listed_at_ms - f.mtime_ms >= TAIL_SETTLE_S * 1000
        if before is not None and same_file(before, identities[f.key]) and not (
                settled and committed_end(before) < before["size"]):
            continue
        requests[f.key] = {"size": f.size, "mtime": f.mtime_ms, "tail": settled,
                           "base": 0 if before is None else committed_end(before),
                           "fp": None if before is None else before.get("fp"),
                           # unknown (None) for a record from before pieces: measured
                           "open": bool(before.get("open")) if before is not None and "end" in before else
                           None if before is not None else False}
    if not requests:
        return {}
    size = sum(r["size"] for r in requests.values())
    if local and size <= LOCAL_MEASURE_MAX_BYTES:
        log.info("measuring %d line file(s) of %d bytes here (the whole lines not committed yet)",
                 len(requests), size)
        return measure_local_pieces(requests)
    log.info("measuring %d line file(s) in Spark tasks (the whole lines not committed yet)", len(requests))
    return measure_pieces(get_spark(), requests)
