"""Grouping helpers for large integer columns, and equality of classes that hold arrays.

NumPy 2.x's `np.unique` takes a hash-table path when no inverse is asked for, which on a
million distinct values ran 12x slower than sorting (640 vs 53 ms, numpy 2.4 on this
project's machine), and `np.unique(axis=0)` on rows is slower still (1.4 s for 1.2 M rows of
three columns). These keep to sorts, whose cost is predictable at any size.
"""

from __future__ import annotations

import dataclasses

import numpy as np


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """The distinct values of a 1-D integer array, ascending (`np.unique` without options)."""
    s = np.sort(np.asarray(values).reshape(-1))
    if s.size < 2:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def combine_codes(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense codes of the distinct tuples of several integer columns, and those tuples
    (rows of a 2-D array, in code order: sorted by the first column, then the next, ...).
    What `np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)` returns, but fast
    on many rows.

    >>> codes, keys = combine_codes(np.array([1, 1, 2]), np.array([7, 8, 7]))
    >>> codes.tolist(), keys.tolist()
    ([0, 1, 2], [[1, 7], [1, 8], [2, 7]])
    """
    n = cols[0].shape[0]
    key = np.zeros(n, dtype=np.int64)
    distinct = 1
    for j, c in enumerate(cols):
        u, inv = np.unique(c, return_inverse=True)
        # key < distinct * u.size <= n * n: re-densified after each column, so it never
        # overflows (the first column's codes are dense already).
        key = key * u.size + inv.reshape(-1)
        if j:
            uk, dense = np.unique(key, return_inverse=True)
            key, distinct = dense.reshape(-1), uk.size
        else:
            distinct = u.size
        key = key.astype(np.int64, copy=False)
    rows = np.empty((distinct, len(cols)), dtype=np.int64)
    if n:
        first = np.zeros(distinct, dtype=np.int64)
        first[key[::-1]] = np.arange(n - 1, -1, -1)  # a row of each code
        for j, c in enumerate(cols):
            rows[:, j] = c[first]
    return key, rows


def argmax_by(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each distinct key (ascending): the position of its largest value, the first such
    position on ties (what `np.argmax` over each key's positions gives), in one sort.

    >>> k, at = argmax_by(np.array([5, 3, 5, 3]), np.array([1.0, 2.0, 7.0, 2.0]))
    >>> k.tolist(), at.tolist()
    ([3, 5], [1, 2])
    """
    keys = np.asarray(keys)
    if keys.size == 0:
        return keys[:0], np.zeros(0, dtype=np.int64)
    pos = np.arange(keys.size)
    order = np.lexsort((-pos, values, keys))
    sk = keys[order]
    last = np.r_[sk[1:] != sk[:-1], True]
    return sk[last], order[last]


def split_by(keys: np.ndarray, *then: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(key, positions) for each distinct key, ascending; positions index `keys` and are
    sorted by the `then` arrays (first the first), ties kept in order. One sort for all
    groups, where a mask per key costs O(groups x n)."""
    keys = np.asarray(keys)
    if keys.size == 0:
        return []
    order = np.lexsort((*reversed(then), keys)) if then else np.argsort(keys, kind="stable")
    sk = keys[order]
    cuts = np.flatnonzero(sk[1:] != sk[:-1]) + 1
    bounds = np.concatenate([[0], cuts, [sk.size]])
    return [(int(sk[a]), order[a:b]) for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]


def same_value(a: object, b: object) -> bool:
    """`a == b` as one bool for values that hold NumPy arrays (in dataclasses, dicts, lists):
    a dataclass's generated `==` compared arrays into an array, which `bool()` refused
    ("the truth value of an array ... is ambiguous"). Arrays are equal with the same dtype,
    shape and values (NaN equal to NaN); a dataclass's private fields (caches) are skipped."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(
            same_value(getattr(a, f.name), getattr(b, f.name))
            for f in dataclasses.fields(a)
            if f.compare and not f.name.startswith("_")
        )
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and a.keys() == b.keys()
            and all(same_value(v, b[k]) for k, v in a.items())
        )
    if isinstance(a, (list, tuple)):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(same_value(x, y) for x, y in zip(a, b, strict=True))
        )
    return bool(a == b)
