"""Why an ingest cannot proceed: the errors of the exactly-once protocol, each saying what to do."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from airflow_provider_pravega.client.errors import PravegaError


class IngestError(PravegaError):
    """The ingest cannot proceed; the message says why and what to do."""


class FencedError(IngestError):
    """Another copy of this ingest took over the run (this one was presumed dead)."""

    def __init__(self, run_id: str, detail: str = "") -> None:
        self.run_id = run_id
        super().__init__(
            f"ingest run {run_id} is no longer owned by this process{': ' + detail if detail else ''}. "
            "Another copy of the task (a retry, or a copy started while this one looked dead) recovered "
            "it; this copy stops without committing anything."
        )


class ChangedFileError(IngestError):
    """A committed file whose committed bytes changed (or that can only be compared by size and
    time): ingesting it again writes its committed records a second time, and the message says which."""

    def __init__(self, path: str, before: Mapping[str, Any], now: Mapping[str, Any]) -> None:
        self.path = path
        run = f"run {before['run']}" if before.get("run") else "an earlier run"
        if before.get("lines") is not None:
            what = repeat = "line 1" if before["lines"] == 1 else f"lines 1-{before['lines']}"
            by = f"by {run}" if before["lines"] == 1 else f"the last of them by {run}"
        else:
            what, repeat, by = f"every record of its {before['size']} bytes as recorded", "those records", f"by {run}"
        reason = now.get("changed") or "its size or modification time differ from those recorded"
        super().__init__(
            f"{path} changed since it was ingested: {reason}. Committed so far: {what} ({by}; recorded "
            f"{describe_identity(before)}; now {describe_identity(now)}). allow_changed_files=True would ingest the "
            f"whole file again from its first line, writing {repeat} a second time. To add records without "
            "duplicates, append them to a jsonl or text file (its new lines are ingested once) or write them to a "
            "new file."
        )


class ForgottenFileError(IngestError):
    """A file the state does not remember, last modified before the state forgot old files: it may
    have been ingested already (its record was pruned by ``remember_files_for``)."""

    def __init__(self, path: str, ident: Mapping[str, Any], forgotten_before_ms: int) -> None:
        self.path = path
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(forgotten_before_ms / 1000))
        super().__init__(
            f"{path} ({describe_identity(ident)}) is not in this ingest's state, but it was last modified before "
            f"{when}, up to which the state forgot the files it ingested (remember_files_for): it may have been "
            f"ingested already. Remove it from the source if it was; pass allow_changed_files=True to ingest it "
            f"anyway. Keep remember_files_for longer than any file stays in the source."
        )


class RecreatedStreamError(IngestError):
    """The state was recorded for an earlier stream of the target's name (deleted and re-created
    since): its committed files and positions describe the deleted stream."""


class LostCommitError(IngestError):
    """A transaction listed at the commit point was aborted: its events can never be committed."""


class UnresolvedCommitError(IngestError):
    """Nothing can tell whether a crashed run's transactions were committed (see the module doc)."""


def describe_identity(ident: Mapping[str, Any]) -> str:
    parts = [f"size {ident['size']}"]
    if ident.get("mtime") is not None:
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ident["mtime"] / 1000))
        parts.append(f"modified {when}.{ident['mtime'] % 1000:03d}Z")
    if ident.get("fp"):
        parts.append(f"fingerprint {ident['fp'][:16]}…")
    return ", ".join(parts)
