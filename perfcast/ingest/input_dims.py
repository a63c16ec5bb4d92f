"""Reading the "Input Dims" of an op (written with ``record_shapes=True``).

Kineto writes one entry per input: a list of dimensions for a tensor, a list of shapes for a
tensor list, and ``[]`` for anything else (scalars, None, strings). The loader keeps the value
as text (JSON, or the Python repr of a list of ints, which is the same), interned in
``EventTable.names``. Every reader of shapes (what-if models, roofline, calling-context
metrics, memory model, profiler cost) parses them here, so they agree on what is readable.

The strings come from files anyone can write, so parsing is bounded: anything too long, too
deep or with non-integer or absurd dimensions is unreadable (None), never an error.
"""

from __future__ import annotations

import functools
import json
import math

from perfcast.events import EventTable

# Limits on an "Input Dims" string: its length, how deeply its lists nest (a tensor-list input
# is a list of shapes: 3 levels), and the size of one dimension.
MAX_DIMS_CHARS = 1 << 16
MAX_DIMS_DEPTH = 4
MAX_DIM = 1 << 40


@functools.lru_cache(maxsize=1 << 14)
def parse_input_dims(text: str) -> list | None:
    """An "Input Dims" string as a list, one entry per input (do not modify: cached).

    None if unreadable: not a string, longer than MAX_DIMS_CHARS, not a JSON list, nested
    deeper than MAX_DIMS_DEPTH, or holding anything but integers within +-MAX_DIM.
    """
    if not isinstance(text, str) or len(text) > MAX_DIMS_CHARS:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, list) and _plain_dims(value, 1) else None


def _plain_dims(value: list, depth: int) -> bool:
    """Lists of integer dimensions (or nested lists of them), no deeper than the limit."""
    if depth > MAX_DIMS_DEPTH:
        return False
    for x in value:
        if isinstance(x, list):
            if not _plain_dims(x, depth + 1):
                return False
        elif type(x) is not int or not -MAX_DIM <= x <= MAX_DIM:
            return False
    return True


def row_input_dims(table: EventTable, row: int) -> list | None:
    """The parsed "Input Dims" of one event (do not modify), None if it has none or unreadable."""
    idx = int(table.shapes[row])
    return parse_input_dims(table.names[idx]) if idx >= 0 else None


def is_shape(dims: object) -> bool:
    """One tensor's shape: a list of non-negative integers ([] is a scalar or a non-tensor)."""
    return isinstance(dims, list) and all(type(x) is int and x >= 0 for x in dims)


def tensor_shapes(dims: list | None) -> list[list[int]]:
    """Per input, its tensor shape, or [] where the input is not a single tensor."""
    return [d if is_shape(d) else [] for d in dims or []]


def numel(shape: object) -> int:
    """Elements of a tensor shape; 0 for an empty, malformed or non-tensor entry."""
    if not isinstance(shape, list) or not shape or not is_shape(shape):
        return 0
    return math.prod(shape)


# "Input type" entries Kineto writes for tensors, and the dtype names perfcast uses.
_TYPE_DTYPE = {
    "float": "fp32",
    "double": "fp64",
    "c10::Half": "fp16",
    "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
}


@functools.lru_cache(maxsize=1 << 12)
def parse_input_types(text: str) -> tuple[str, ...] | None:
    """An "Input type" string (the Python repr of a list of type names, as the loader keeps
    it) as a tuple; None if unreadable."""
    if not isinstance(text, str) or len(text) > MAX_DIMS_CHARS:
        return None
    try:
        value = json.loads(text.replace("'", '"'))
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        return None
    return tuple(value)


def row_input_dtype(table: EventTable, row: int) -> str | None:
    """The floating dtype of an op's first floating tensor input ("fp32", "bf16", ...), from
    its "Input type"; None where the trace has none (record_shapes off) or none is floating."""
    idx = int(table.in_types[row])
    types = parse_input_types(table.names[idx]) if idx >= 0 else None
    for t in types or ():
        if t in _TYPE_DTYPE:
            return _TYPE_DTYPE[t]
    return None
