"""Spark's reused Python workers leave what they hold between tasks out of garbage collection and
keep freed large buffers for reuse (spark/worker_heap.py); any other process is left as it is.
Real PySpark in local mode."""

from __future__ import annotations

import gc

from airflow_provider_pravega.spark import worker_heap
from airflow_provider_pravega.spark.worker_heap import in_daemon_worker, prepare_worker_heap


def test_a_daemon_worker_prepares_its_heap_and_this_process_does_not(spark) -> None:
    def task(batches):
        import gc as worker_gc

        import pyarrow as pa

        from airflow_provider_pravega.spark import worker_heap as heap

        for _ in batches:
            pass
        heap.prepare_worker_heap()
        yield pa.RecordBatch.from_pylist([{"daemon": heap.in_daemon_worker(), "frozen": worker_gc.get_freeze_count(),
                                           "malloc_tuned": heap._malloc_tuned}])

    schema = "daemon boolean, frozen long, malloc_tuned boolean"
    rows = spark.range(1, numPartitions=1).mapInArrow(task, schema).collect()
    assert rows[0]["daemon"] is True
    assert rows[0]["frozen"] > 10_000  # pyspark, pyarrow and the provider's modules
    assert rows[0]["malloc_tuned"] is True

    before = gc.get_freeze_count()
    prepare_worker_heap()
    assert not in_daemon_worker()
    assert gc.get_freeze_count() == before
    assert worker_heap._malloc_tuned is False


def test_glibc_takes_the_thresholds() -> None:
    """tune_malloc finds glibc's mallopt here and glibc accepts both values (it returns 0 for one
    out of its range); in a child process, so this one keeps its own settings."""
    import subprocess
    import sys

    code = "from airflow_provider_pravega.spark.worker_heap import tune_malloc; print(tune_malloc())"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "True\n"
