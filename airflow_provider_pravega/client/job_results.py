"""The outcome of an ingest or export submitted as a Spark application, kept in Pravega.

Why: in cluster deploy mode the job's driver runs on the cluster (a YARN container), so what it
prints is not where the Airflow task can read it, and the task's own process may die and be
replaced by a retry on another host while the application runs. The driver therefore records its
outcome (the result's JSON, or the failure's type and message) under the submission's id in a
table segment beside the job's state; whichever try of the task waits for the application reads
it from there. An entry is written once per driver attempt; the last one wins.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from airflow_provider_pravega.client.tables import UNCONDITIONAL, TableSegment

__all__ = ["JobOutcome", "JobResults", "results_table_name"]


def results_table_name(state_stream: str) -> str:
    """The table of submitted runs of the job whose state is ``state_stream`` (same scope)."""
    return f"{state_stream}-submissions"


@dataclass(frozen=True)
class JobOutcome:
    """What a submitted run recorded: its result, or why it failed."""

    ok: bool
    result: dict[str, Any] | None = None
    error: str | None = None
    error_type: str | None = None

    def to_json(self) -> bytes:
        return json.dumps({"ok": self.ok, "result": self.result, "error": self.error,
                           "error_type": self.error_type}, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> JobOutcome:
        data = json.loads(raw)
        return cls(ok=bool(data.get("ok")), result=data.get("result"), error=data.get("error"),
                   error_type=data.get("error_type"))


class JobResults:
    """The outcomes of one job's submissions (keyed by submission id), in the job's state scope."""

    def __init__(self, client: Any, scope: str, state_stream: str) -> None:
        self.table = TableSegment(client, scope, results_table_name(state_stream))

    def record(self, submission: str, outcome: JobOutcome) -> None:
        self.table.create()
        self.table.put([(submission.encode(), outcome.to_json(), UNCONDITIONAL)])

    def get(self, submission: str) -> JobOutcome | None:
        """The recorded outcome, or None (not finished yet, or never started)."""
        [(_version, value)] = self.table.get([submission.encode()])
        return None if value is None else JobOutcome.from_json(value)
