"""Airflow hooks of the Pravega provider."""
