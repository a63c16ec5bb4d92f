"""Vectorized interval arithmetic: unions and overlaps of many [start, end) intervals."""

from __future__ import annotations

import numpy as np


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint, sorted intervals covering the same time as the input."""
    if starts.size == 0:
        return starts[:0], ends[:0]
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = ends[order]
    run_end = np.maximum.accumulate(e)
    # A new merged interval begins where a start lies past everything so far.
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], run_end[last]


def union_length(starts: np.ndarray, ends: np.ndarray) -> int:
    us, ue = union(starts, ends)
    return int((ue - us).sum())


def clip(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Intervals cut to [lo, hi); empty ones dropped."""
    s = np.maximum(starts, lo)
    e = np.minimum(ends, hi)
    keep = e > s
    return s[keep], e[keep]


def overlap_length(
    a_starts: np.ndarray, a_ends: np.ndarray, b_starts: np.ndarray, b_ends: np.ndarray
) -> int:
    """|A ∩ B| for two sets of intervals, via |A| + |B| - |A ∪ B|."""
    la = union_length(a_starts, a_ends)
    lb = union_length(b_starts, b_ends)
    lab = union_length(np.concatenate([a_starts, b_starts]), np.concatenate([a_ends, b_ends]))
    return la + lb - lab
