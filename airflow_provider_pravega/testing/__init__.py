"""Test helpers for DAG authors and for this project: an embedded Pravega server as pytest fixtures.

Enable with ``pytest_plugins = ["airflow_provider_pravega.testing.pytest_plugin"]`` in a
``conftest.py`` (this project's own suite does).
"""
