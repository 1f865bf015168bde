"""Spark's reused Python workers leave what they hold between tasks out of garbage collection
(spark/worker_heap.py); any other process is left as it is. Real PySpark in local mode."""

from __future__ import annotations

import gc

from airflow_provider_pravega.spark.worker_heap import freeze_worker_heap, in_daemon_worker


def test_a_daemon_worker_freezes_its_heap_and_this_process_does_not(spark) -> None:
    def task(batches):
        import gc as worker_gc

        import pyarrow as pa

        from airflow_provider_pravega.spark.worker_heap import freeze_worker_heap, in_daemon_worker

        for _ in batches:
            pass
        freeze_worker_heap()
        yield pa.RecordBatch.from_pylist([{"daemon": in_daemon_worker(), "frozen": worker_gc.get_freeze_count()}])

    rows = spark.range(1, numPartitions=1).mapInArrow(task, "daemon boolean, frozen long").collect()
    assert rows[0]["daemon"] is True
    assert rows[0]["frozen"] > 10_000  # pyspark, pyarrow and the provider's modules

    before = gc.get_freeze_count()
    freeze_worker_heap()
    assert not in_daemon_worker()
    assert gc.get_freeze_count() == before
