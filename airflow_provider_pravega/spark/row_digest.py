"""What a write task's rows are, in a few bytes: how a rerun under the same ``write_id`` tells a
retry of the rows an earlier job committed (skipped) from new rows (refused)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np


class RowDigest:
    """The count and a digest of a partition's rows, fed batch by batch. The digest covers every
    row's columns in order and does not depend on how the rows were cut into Arrow batches: the
    lengths of all values, and all their bytes, are each one hashed sequence."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self.rows = 0
        self._lengths = hashlib.blake2b(digest_size=16)
        self._bytes = hashlib.blake2b(digest_size=16)

    def add(self, batch: Any) -> None:
        # import cost: pyarrow (0.3-0.5 s) only where a batch is built, not with the module
        import pyarrow.compute as pc

        self.rows += batch.num_rows
        for name in self.columns:
            column = batch.column(name)
            lengths = pc.binary_length(column).fill_null(-1)  # a null is not an empty value
            self._lengths.update(lengths.to_numpy(zero_copy_only=False).astype("<i8").tobytes())
            self._bytes.update(_value_bytes(column))

    def identity(self) -> dict[str, Any]:
        """What the state records of the partition (see client/ingest_state.py ``units``)."""
        return {"events": self.rows, "digest": self._lengths.hexdigest() + self._bytes.hexdigest()}


def _value_bytes(column: Any) -> bytes | memoryview:
    """The bytes of a binary or string column's values, back to back, without copying."""
    # import cost: pyarrow (0.3-0.5 s) only where a batch is built, not with the module
    import pyarrow as pa

    if len(column) == 0 or column.buffers()[2] is None:
        return b""
    large = pa.types.is_large_binary(column.type) or pa.types.is_large_string(column.type)
    width = 8 if large else 4
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int64 if large else np.int32, count=len(column) + 1,
                            offset=column.offset * width)
    return memoryview(column.buffers()[2])[int(offsets[0]):int(offsets[-1])]


def describe(identity: Any) -> str:
    if not identity or "digest" not in identity:
        return "rows not recorded (written by a release before they were)"
    return f"{identity['events']} row(s), digest {identity['digest'][:12]}…"
