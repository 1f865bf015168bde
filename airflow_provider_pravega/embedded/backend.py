"""The contract between the embedded controller and the embedded segment store.

The controller decides *which* segments exist (streams, epochs, transactions); the segment store
owns their bytes. Pravega's controller drives its segment stores over the wire protocol; inside one
process we call this interface instead, with the same semantics.

Every method is durable when it returns and idempotent, because the controller replays its own
metadata log after a crash and repeats whatever it cannot prove finished.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What the segment store knows about one segment."""

    name: str
    length: int  # write offset: bytes ever appended (truncation does not lower it)
    start_offset: int  # truncation point; reads below it answer "truncated"
    sealed: bool
    last_modified_ms: int


class SegmentBackend(Protocol):
    """Segment operations the controller needs (all durable on return, all idempotent)."""

    def create_segment(self, name: str) -> None:
        """Create an empty, open segment; no-op when it exists."""

    def seal_segment(self, name: str) -> int:
        """Seal the segment (appends refused, readers see end-of-segment); return its length."""

    def merge_segment(self, source: str, target: str) -> int:
        """Append all of ``source``'s bytes to ``target`` atomically and remove ``source``.

        Returns the target's new length. Calling it again after it succeeded (``source`` already
        merged into ``target``) is a no-op that returns the target's current length.
        """

    def discard_segment(self, name: str) -> None:
        """Turn an aborted transaction's segment into a sink: later appends are acknowledged and
        dropped (the official client may still flush into it after abort), its data is gone."""

    def delete_segment(self, name: str) -> None:
        """Remove the segment and its data; no-op when it does not exist."""

    def truncate_segment(self, name: str, offset: int) -> None:
        """Make bytes below ``offset`` unreadable (start_offset = offset); never lowers it."""

    def segment_info(self, name: str) -> SegmentInfo | None:
        """Length, start offset and sealed flag, or None when the segment does not exist."""
