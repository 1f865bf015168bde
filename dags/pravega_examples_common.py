"""What the example pipelines share: where their data lives, the stream they use, and the daily
schedule with retries. Not a pipeline itself (listed in .airflowignore); the folder of these files
is on the import path when they are parsed, as every DAG folder is."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from typing import Any

SCOPE = "iot"
STREAM = "readings"


def data_dir() -> str:
    """Input and output files: ``$PRAVEGA_EXAMPLES_DATA``, default ``/data`` (as in docker-compose.yaml);
    read when a pipeline file is parsed."""
    return os.environ.get("PRAVEGA_EXAMPLES_DATA", "/data")


def start_date() -> datetime:
    """The first daily interval: ``$PRAVEGA_EXAMPLES_START`` (an ISO date; ``scripts/stack`` and the
    topology test set it to limit catchup to a few days), default 2026-11-01."""
    text = os.environ.get("PRAVEGA_EXAMPLES_START", "2026-11-01")
    try:
        day = datetime.strptime(text, "%Y-%m-%d")
    except ValueError:
        raise ValueError(f"PRAVEGA_EXAMPLES_START must be a date like 2026-11-01, not {text!r}") from None
    return day.replace(tzinfo=timezone.utc)


def spark_conn_id() -> str:
    """The Spark connection of the examples' ingest and export tasks: ``$PRAVEGA_EXAMPLES_SPARK_CONN``,
    default ``spark_default`` (local mode on this worker when that connection does not exist).
    ``scripts/stack`` and ``scripts/demo`` point it at their warm local Spark Connect server
    (``spark_connect_default``); read when a pipeline file is parsed."""
    return os.environ.get("PRAVEGA_EXAMPLES_SPARK_CONN") or "spark_default"


def daily(**overrides: Any) -> dict[str, Any]:
    """Keyword arguments of a daily example pipeline from :func:`start_date` with catchup, one run
    at a time, and two retries 5 s apart (a retry resumes or recovers a killed ingest: soon, while
    the killed try's transactions are still leased; docs/ingest.md, "What a retry does")."""
    return {
        "schedule": "@daily",
        "start_date": start_date(),
        "catchup": True,
        "max_active_runs": 1,
        "default_args": {"retries": 2, "retry_delay": timedelta(seconds=5)},
        "tags": ["pravega", "example"],
        **overrides,
    }
