"""Which write task (transaction) writes which files: whole files, consecutive in path order, each
group read on its own into one partition (no shuffle), and checked afterwards."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from airflow_provider_pravega.client.ingest_errors import IngestError
from airflow_provider_pravega.spark.ingest_sources import key_of
from airflow_provider_pravega.spark.ingest_spec import IngestSpec


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


def read_bytes(files: Mapping[str, Mapping[str, Any]]) -> int:
    """What a run of line files reads: each up to its listed size (the committed prefix is checked
    in the same read)."""
    return sum(int(ident.get("size") or 0) for ident in files.values())


def written_in_process(files: Mapping[str, Mapping[str, Any]], limit: int, listed_here: bool) -> bool:
    """Whether a run's write tasks run in this process instead of Spark: its line files were listed
    here (local files) and it reads at most ``limit`` bytes (``in_process_limit``)."""
    return listed_here and read_bytes(files) <= limit


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


def write_groups(files: Mapping[str, Mapping[str, Any]], writers: int) -> list[list[str]]:
    """The files of each write task, in path order (:func:`file_groups`)."""
    groups: dict[int, list[str]] = {}
    for key, group in file_groups(files, writers).items():
        groups.setdefault(group, []).append(key)
    return [sorted(keys) for _group, keys in sorted(groups.items())]


def one_task_per_group(parts: Sequence[Any], order: Sequence[str] = ()) -> Any:
    """The union of each write group's own read (``parts``, in group order), each coalesced into one
    partition: task *i* writes group *i*, and no shuffle moves the data (run it under
    :func:`write_job_settings`). ``order``: the columns sorting the rows within each task (with a
    routing key, its events in source order)."""
    frame = parts[0].coalesce(1)
    for part in parts[1:]:
        frame = frame.union(part.coalesce(1))
    return frame.sortWithinPartitions(*order) if order else frame


#: Spark 4.1+ merges the i-th partitions of a union's children when they all have the same
#: partitioning (one partition each, here): every group would land in one task. Whole files in
#: path order either way (correct, only without parallelism); off while the write job is planned.
_UNION_PARTITIONING = "spark.sql.unionOutputPartitioning"
#: Spark lists the paths a read names before reading them, in a Spark job of a task per path (up to
#: its parallelism setting, 10,000 by default) when there are more than the threshold (32). A write
#: group names each of its files: a folder of small files cost a listing task per file.
_LISTING_THRESHOLD = "spark.sql.sources.parallelPartitionDiscovery.threshold"
_LISTING_TASKS = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


@contextlib.contextmanager
def write_job_settings(spark: Any, *, listed_here: bool) -> Iterator[None]:
    """While the write job's reads are made, planned and run: a union of the groups' one-partition
    reads keeps one partition per group (see :data:`_UNION_PARTITIONING`), and the files the reads
    name are listed by no more tasks than the cluster runs at once, or, when this process listed
    them (local files), by the driver without a job. The session's settings are restored after."""
    settings = {_UNION_PARTITIONING: "false", _LISTING_TASKS: str(_parallelism(spark))}
    if listed_here:
        settings[_LISTING_THRESHOLD] = str(2**31 - 1)
    conf = spark.conf
    before = {name: conf.get(name, None) for name in settings}
    for name, value in settings.items():
        conf.set(name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                conf.unset(name)
            else:
                conf.set(name, value)


def _planned_bytes(ident: Mapping[str, Any]) -> int:
    """What a file's task reads anew: a line file its bytes after its committed end."""
    return int(ident.get("size") or 0) - int(ident.get("base") or 0)


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
