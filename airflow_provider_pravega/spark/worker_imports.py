"""The error for a module of the ``pravega`` data source that a Spark Python worker cannot import.

Spark imports the data source's modules in its Python workers too (on a cluster or a Connect
server): a worker interpreter without the provider's dependencies would only say "No module named
'grpc'". Each of those modules imports the provider's code through :func:`missing_dependency`,
so the worker's error names the remedy. Imports only the standard library.
"""

from __future__ import annotations

import sys

__all__ = ["missing_dependency"]


def missing_dependency(missing: ImportError) -> ImportError:
    """The error to raise (``from missing``) for an import of the provider's code that failed."""
    return ImportError(
        f"the pravega Spark data source cannot import {missing.name or missing}: it runs in Spark's "
        f"Python workers as well as the driver, and {sys.executable} lacks the provider's dependencies. "
        "Install airflow-provider-pravega into the interpreter the workers use (PYSPARK_PYTHON or "
        "spark.pyspark.python) on every Spark host.", name=missing.name)
