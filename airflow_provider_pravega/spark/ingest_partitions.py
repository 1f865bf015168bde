"""Which write task (transaction) writes which files: whole files, consecutive in path order,
placed on Spark's hash partitions by labels computed here, and checked afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from airflow_provider_pravega.client.ingest_errors import IngestError
from airflow_provider_pravega.spark.ingest_sources import key_of
from airflow_provider_pravega.spark.ingest_spec import LINE_FORMATS, IngestSpec


CONNECT_DEFAULT_WRITERS = 8  # writers on Spark Connect when its configuration does not say


#: A run gets a write task (a transaction) per this many planned bytes, up to Spark's parallelism:
#: each task of a scheduled run starts a new Python worker (Spark stops idle ones after 60 s; about
#: 0.5 s of the task), so a small day's files are written faster, and with fewer transactions, by one.
BYTES_PER_WRITER = 16 * 1024 * 1024


def writers_of(spark: Any, spec: IngestSpec, files: Mapping[str, Mapping[str, Any]]) -> int:
    """Write tasks (transactions) for a run of ``files``: ``num_writers``, else the cluster's
    parallelism, but no more than one per :data:`BYTES_PER_WRITER` planned."""
    if spec.num_writers:
        return spec.num_writers
    planned = sum(_planned_bytes(ident) for ident in files.values())
    return max(1, min(_parallelism(spark), -(-planned // BYTES_PER_WRITER)))


def _parallelism(spark: Any) -> int:
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext: what the server's configuration says
        pass
    conf = spark.conf.get
    if conf("spark.default.parallelism", None):
        return max(1, int(conf("spark.default.parallelism")))
    master = conf("spark.master", None) or ""
    if master.startswith("local"):
        cores = master[len("local"):].strip("[]").split(",")[0] or "1"
        return max(1, os.cpu_count() or 1) if cores == "*" else max(1, int(cores))
    instances, cores = conf("spark.executor.instances", None), conf("spark.executor.cores", None)
    if instances and cores:
        return max(1, int(instances) * int(cores))
    return CONNECT_DEFAULT_WRITERS  # not the SQL shuffle default (200 transactions per run)


def needs_labels(spec: IngestSpec, here: bool = False) -> bool:
    """Whether files must be assigned to write tasks explicitly: a line file read in Spark tasks is
    one task's input whole (``binaryFile``), so merging input partitions keeps it whole; lines read
    here (``here``: a local relation, cut into partitions by rows) and a CSV or Parquet file may be
    split between input partitions, and a routing key would spread every file over all tasks."""
    return bool(spec.routing_key_field) or spec.format not in LINE_FORMATS or here


def file_groups(files: Mapping[str, Mapping[str, Any]], writers: int) -> dict[str, int]:
    """Each file's write task (0..n-1): whole files, consecutive in path order, about the same
    bytes per task. Whole: a transaction lost after the commit point costs a rewrite of exactly its
    files (``IngestCoordinator.heal_lost``). Consecutive: with a routing key, the transactions are
    committed in path order of their files, so a key's events keep the source order across files."""
    keys = sorted(files)
    sizes = [max(1, _planned_bytes(files[k])) for k in keys]
    total, n = sum(sizes), max(1, min(writers, len(keys)))
    groups: dict[str, int] = {}
    before = 0
    for key, size in zip(keys, sizes):
        groups[key] = min(n - 1, before * n // total)
        before += size
    return groups


def _planned_bytes(ident: Mapping[str, Any]) -> int:
    if ident.get("end") is not None:
        return int(ident["end"]) - int(ident.get("start") or 0)
    return int(ident.get("size") or 0)


def spark_hash_long(value: int) -> int:
    """Spark's ``hash(value)`` of a bigint: Murmur3 x86 32-bit, seed 42, the hash of its hash
    partitioning (``HashPartitioning`` is ``pmod(hash(cols), n)``) since Spark 2.0. The write
    checks the outcome (:func:`check_file_groups`), so a Spark that partitions otherwise fails the
    run before its commit point instead of mixing the groups."""
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    def mix(h1: int, k1: int) -> int:
        k1 = rotl((k1 * 0xCC9E2D51) & mask, 15) * 0x1B873593 & mask
        return (rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & mask

    value &= 0xFFFFFFFFFFFFFFFF
    h1 = mix(mix(42, value & mask), value >> 32)
    h1 ^= 8
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & mask
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & mask
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def writer_labels(files: Mapping[str, Mapping[str, Any]], spec: IngestSpec, writers: int,
                  here: bool = False) -> dict[str, int] | None:
    """File key -> a label whose hash partition (``repartition(n, "w")``) is the file's write task
    (:func:`file_groups`), so that task *i* gets exactly group *i*; None where files stay whole
    without it (:func:`needs_labels`). The labels are the smallest ids that Spark's hash
    partitioner sends to each task (:func:`spark_hash_long`: computed here, not in a Spark job of
    its own; :func:`check_file_groups` checks what the tasks got)."""
    if not needs_labels(spec, here):
        return None
    groups = file_groups(files, writers)
    n = max(groups.values()) + 1
    label: dict[int, int] = {}
    for i in range(64 * n):
        label.setdefault(spark_hash_long(i) % n, i)
    fallback = [i for i in range(n) if i not in label]  # a task no label reached: share one (still whole files)
    for i in fallback:
        label[i] = label[min(label)]
    return {key: label[g] for key, g in groups.items()}


def check_file_groups(labels: Mapping[str, int] | None, holds: Mapping[str, Sequence[str]]) -> None:
    """Each transaction holds the files of one label (one group of :func:`file_groups`), as the
    labels meant: else the partitioner is not the one :func:`spark_hash_long` computes, and with a
    routing key the commit order would no longer follow the files' order. Raised before the
    commit point: nothing of the run is committed."""
    if labels is None:
        return
    for txn, keys in holds.items():
        found = {labels[k] for k in keys if k in labels}
        if len(found) > 1:
            raise IngestError(f"transaction {txn} holds files of {len(found)} write groups ({', '.join(keys[:3])}): "
                              f"this Spark does not partition as spark_hash_long computes. Nothing of this run was "
                              f"committed; this is a bug of the provider's partitioning: please report it")


def partition_for_writing(df: Any, spec: IngestSpec, writers: int, labels: Mapping[str, int] | None = None) -> Any:
    """One partition per write task (at most ``writers``), each holding whole files (see
    :func:`file_groups`); with a routing key, every key's events in source order within each file,
    as are labelled lines without one (read here, :func:`needs_labels`: a file's lines may come
    from several input partitions)."""
    if labels is None:
        return df.coalesce(writers)  # line files stay whole (coalesce only merges partitions)
    tasks = len(set(labels.values()))
    df = df.repartition(tasks, "w")
    return df.sortWithinPartitions("f", "b", "m") if spec.routing_key_field or spec.format in LINE_FORMATS else df


def whole_file_holds(reported: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """txn -> the file keys it holds, from the write tasks' reports; a file in two transactions
    would make a lapsed transaction impossible to heal, so it is refused before the commit point."""
    holds = {txn: sorted({key_of(f) for f in files}) for txn, files in reported.items()}
    owner: dict[str, str] = {}
    for txn, keys in holds.items():
        for key in keys:
            if key in owner:
                raise IngestError(f"{key} was written by two transactions ({owner[key]} and {txn}); a file must lie "
                                  f"wholly in one transaction. Nothing of this run was committed; this is a bug of "
                                  f"the provider's partitioning (file_groups): please report it")
            owner[key] = txn
    return holds
