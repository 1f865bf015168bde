"""Arrow columns from Python values, built without pyarrow's pandas import.

``pa.array``, ``pa.scalar`` and ``RecordBatch.from_pydict`` first ask whether the values are pandas
objects, and the first time a process asks, pyarrow imports pandas: 0.25-0.3 CPU-s. The functions
that Spark's Python workers run here (``mapInArrow`` tasks, the data source's reads) make small
batches, and a scheduled run's workers are new processes (Spark stops a Python worker after 60 s
idle), so that import was a quarter of a daily run's write task. These builders lay the Arrow
buffers out themselves (``Array.from_buffers`` asks nothing) for the few column types the workers
return: string, binary, int64, boolean and list<string>.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

#: The most bytes one string or binary column holds (its offsets are 32-bit).
MAX_VALUE_BYTES = 2**31 - 1


#: Spark's DDL names of the types built here.
_DDL_TYPES = {"string": pa.string(), "binary": pa.binary(), "long": pa.int64(), "bigint": pa.int64(),
              "boolean": pa.bool_(), "array<string>": pa.list_(pa.string())}


def schema_of(ddl: str) -> pa.Schema:
    """The Arrow schema of a ``mapInArrow`` DDL schema of these types (``"path string, end long"``),
    so a task's columns are declared once."""
    fields = []
    for part in ddl.split(","):
        name, _, kind = part.strip().partition(" ")
        kind = kind.strip().lower()
        if kind not in _DDL_TYPES:
            raise TypeError(f"no builder for the Spark type {kind!r} of column {name!r}")
        fields.append((name, _DDL_TYPES[kind]))
    return pa.schema(fields)


def record_batch(columns: Mapping[str, Sequence[Any]], schema: pa.Schema) -> pa.RecordBatch:
    """``RecordBatch.from_pydict(columns, schema=schema)``, without the pandas import."""
    return pa.RecordBatch.from_arrays([array(columns[f.name], f.type) for f in schema], schema=schema)


def array(values: Sequence[Any], type: pa.DataType) -> pa.Array:
    """``pa.array(values, type)`` for a list of Python values (None is null) of one of the types
    above; TypeError for another type or a value that does not fit it."""
    n = len(values)
    validity, nulls = _validity(values)
    if pa.types.is_string(type) or pa.types.is_binary(type):
        offsets, data = _offsets_and_data(values, type, nulls)
        return pa.Array.from_buffers(type, n, [validity, offsets, data], null_count=nulls)
    if pa.types.is_int64(type):
        ints = np.array([0 if v is None else _int_of(v) for v in values], dtype=np.int64)
        return pa.Array.from_buffers(type, n, [validity, pa.py_buffer(ints)], null_count=nulls)
    if pa.types.is_boolean(type):
        bits = np.packbits(np.array([bool(_bool_of(v)) for v in values], dtype=bool), bitorder="little")
        return pa.Array.from_buffers(type, n, [validity, pa.py_buffer(bits)], null_count=nulls)
    if pa.types.is_list(type) and (pa.types.is_string(type.value_type) or pa.types.is_binary(type.value_type)):
        lengths = [0 if v is None else len(v) for v in values]
        child = array([x for v in values if v is not None for x in v], type.value_type)
        ends = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=ends[1:])
        return pa.Array.from_buffers(type, n, [validity, pa.py_buffer(ends)], null_count=nulls, children=[child])
    raise TypeError(f"no builder for Arrow type {type}")


def int64_array(values: np.ndarray) -> pa.Array:
    """An int64 numpy array as an Arrow array (no copy when it is contiguous)."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def repeated(value: str | bytes | int, type: pa.DataType, n: int) -> pa.Array:
    """``value`` (not None) ``n`` times: ``pa.repeat(pa.scalar(value, type), n)``."""
    if pa.types.is_int64(type):
        return int64_array(np.full(n, _int_of(value), dtype=np.int64))
    if pa.types.is_string(type) or pa.types.is_binary(type):
        one = _bytes_of(value, type)
        if len(one) * n > MAX_VALUE_BYTES:
            raise OverflowError(f"{n} copies of a {len(one)}-byte value do not fit one Arrow {type} column")
        ends = np.arange(n + 1, dtype=np.int32) * np.int32(len(one))
        return pa.Array.from_buffers(type, n, [None, pa.py_buffer(ends), pa.py_buffer(one * n)])
    raise TypeError(f"no builder for Arrow type {type}")


def scalar(value: str | bytes | int, type: pa.DataType) -> pa.Scalar:
    """``pa.scalar(value, type)``."""
    return repeated(value, type, 1)[0]


def _validity(values: Sequence[Any]) -> tuple[pa.Buffer | None, int]:
    valid = [v is not None for v in values]
    nulls = len(valid) - sum(valid)
    if not nulls:
        return None, 0
    return pa.py_buffer(np.packbits(np.array(valid, dtype=bool), bitorder="little")), nulls


def _offsets_and_data(values: Sequence[Any], type: pa.DataType, nulls: int) -> tuple[pa.Buffer, pa.Buffer]:
    """The offsets and data buffers of a string or binary column (a null takes no bytes). Whole-list
    operations, not a call per value: line files pass through here 10,000 lines at a time."""
    text = pa.types.is_string(type)
    if nulls:
        values = [("" if text else b"") if v is None else v for v in values]
    try:
        chunks = [v.encode("utf-8") for v in values] if text else values
        data = b"".join(chunks)
    except (AttributeError, TypeError):
        for v in values:
            _bytes_of(v, type)  # names the value that does not fit
        raise
    ends = np.zeros(len(chunks) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, chunks), dtype=np.int64, count=len(chunks)), out=ends[1:])
    if ends[-1] > MAX_VALUE_BYTES:
        raise OverflowError(f"{ends[-1]} bytes do not fit one Arrow string or binary column "
                            f"(at most {MAX_VALUE_BYTES})")
    return pa.py_buffer(ends.astype(np.int32)), pa.py_buffer(data)


def _bytes_of(value: Any, type: pa.DataType) -> bytes:
    if pa.types.is_string(type):
        if not isinstance(value, str):
            raise TypeError(f"expected str for an Arrow string column, got {value!r}")
        return value.encode("utf-8")
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes for an Arrow binary column, got {value!r}")
    return bytes(value)


def _int_of(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"expected int for an Arrow int64 column, got {value!r}")
    return int(value)


def _bool_of(value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"expected bool for an Arrow boolean column, got {value!r}")
    return bool(value)
