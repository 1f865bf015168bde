"""Tests of airflow_provider_pravega.client (a package, so modules share helpers)."""
