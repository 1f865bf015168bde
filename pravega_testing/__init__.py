"""This repository's own test helpers: servers and clients the tests, benchmarks and
``scripts/stack`` share (an S3-compatible store, HDFS, a Spark standalone cluster, a stock Spark
Connect server, a raw segment-store peer, ``dag.test()`` for a DAG defined in a test, bounded waits,
the triggerer's shared-stream side).

Not part of the provider's distribution: the production wheel carries only
``airflow_provider_pravega``. DAG authors who want an embedded server in their own tests use
``pytest_plugins = ["airflow_provider_pravega.embedded.pytest_plugin"]`` (the ``embedded`` extra).
"""
