"""The garbage collector in Spark's reused Python workers.

pyspark's daemon runs a full ``gc.collect()`` in a reused worker after every task, and a worker that
has imported pyspark, pyarrow, numpy and this provider holds about 65,000 tracked objects: each of
those collections costs about 20 ms of CPU, and the collections a task's own allocations trigger
walk the same objects again. Measured with ``perf`` on an export's Python workers: a fifth of their
CPU was the collector.

:func:`freeze_worker_heap` moves the objects alive at a task's start to the collector's permanent
generation (``gc.freeze``), so collections look only at what the task itself makes. It acts only in
processes forked by pyspark's daemon (never in a driver, an Airflow task or a test process): there
everything alive between tasks is a module, a cache or the worker's own state, kept for the life
of the process anyway.
"""

from __future__ import annotations

import gc
import sys

__all__ = ["freeze_worker_heap", "in_daemon_worker"]


def in_daemon_worker() -> bool:
    """Whether this process is a Python worker forked by pyspark's daemon (``python -m pyspark.daemon``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == "pyspark.daemon"


_IN_DAEMON_WORKER = in_daemon_worker()


def freeze_worker_heap() -> None:
    """At the start of a task in a daemon worker: what is alive now is left out of later collections."""
    if _IN_DAEMON_WORKER:
        gc.freeze()
