pytest_plugins = ["airflow_provider_pravega.testing.pytest_plugin"]
