"""The replay loop: earliest start and end of every node, in dependency order.

    start = max(release, max(end[pred] + w) over start dependencies)
    end   = max(start + dur, max(end[pred] + w) over end dependencies)

Two implementations: `replay_reference`, plain Python and obviously right,
kept as the test oracle; and `replay_fast`, the same loop compiled with
numba when it is installed. Both are deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.graph.acyclic import topological_order
from perfcast.graph.lower import Lowered
from perfcast.graph.model import NO_RELEASE
from perfcast.jit import HAVE_NUMBA, compile_loop


class CycleError(RuntimeError):
    """The lowered graph has a dependency cycle (a transformation bug, or bad input)."""


@dataclass
class Replay:
    start: np.ndarray  # per compact node
    end: np.ndarray
    start_by: np.ndarray  # compact pred that set the start (-1: release / none)
    end_by: np.ndarray  # compact pred that set the end (-1: own duration)


def _topo_reference(low: Lowered) -> list[int]:
    n = low.n
    indeg = [0] * n
    out: list[list[int]] = [[] for _ in range(n)]
    for ptr, src in ((low.s_ptr, low.s_src), (low.e_ptr, low.e_src)):
        p = ptr.tolist()
        s = src.tolist()
        for v in range(n):
            for k in range(p[v], p[v + 1]):
                out[s[k]].append(v)
                indeg[v] += 1
    ready = [v for v in range(n) if indeg[v] == 0]
    order = []
    while ready:
        v = ready.pop()
        order.append(v)
        for w in out[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    if len(order) != n:
        raise CycleError(f"{n - len(order)} nodes are in dependency cycles")
    return order


def replay_reference(low: Lowered) -> Replay:
    n = low.n
    order = _topo_reference(low)
    start = [0] * n
    end = [0] * n
    sb = [-1] * n
    eb = [-1] * n
    s_ptr, s_src, s_w = low.s_ptr.tolist(), low.s_src.tolist(), low.s_w.tolist()
    e_ptr, e_src, e_w = low.e_ptr.tolist(), low.e_src.tolist(), low.e_w.tolist()
    rel = low.release.tolist()
    dur = low.dur.tolist()
    for v in order:
        s = rel[v]
        by = -1
        for k in range(s_ptr[v], s_ptr[v + 1]):
            t = end[s_src[k]] + s_w[k]
            if t > s:
                s, by = t, s_src[k]
        if s == NO_RELEASE:
            s = 0
        e = s + dur[v]
        eby = -1
        for k in range(e_ptr[v], e_ptr[v + 1]):
            t = end[e_src[k]] + e_w[k]
            if t > e:
                e, eby = t, e_src[k]
        start[v], end[v], sb[v], eb[v] = s, e, by, eby
    return Replay(
        np.array(start, np.int64),
        np.array(end, np.int64),
        np.array(sb, np.int64),
        np.array(eb, np.int64),
    )


def _replay_kernel(order, s_ptr, s_src, s_w, e_ptr, e_src, e_w, release, dur, no_release):
    n = release.shape[0]
    start = np.zeros(n, np.int64)
    end = np.zeros(n, np.int64)
    sb = np.full(n, -1, np.int64)
    eb = np.full(n, -1, np.int64)
    for i in range(order.shape[0]):
        v = order[i]
        s = release[v]
        by = -1
        for k in range(s_ptr[v], s_ptr[v + 1]):
            t = end[s_src[k]] + s_w[k]
            if t > s:
                s = t
                by = s_src[k]
        if s == no_release:
            s = 0
        e = s + dur[v]
        eby = -1
        for k in range(e_ptr[v], e_ptr[v + 1]):
            t = end[e_src[k]] + e_w[k]
            if t > e:
                e = t
                eby = e_src[k]
        start[v] = s
        end[v] = e
        sb[v] = by
        eb[v] = eby
    return start, end, sb, eb


_compiled = None


def replay_fast(low: Lowered) -> Replay:
    global _compiled
    if not HAVE_NUMBA:
        return replay_reference(low)
    if _compiled is None:
        _compiled = compile_loop(_replay_kernel)
    order = topological_order(low)
    if order.size != low.n:
        raise CycleError(f"{low.n - order.size} nodes are in dependency cycles")
    start, end, sb, eb = _compiled(
        order,
        low.s_ptr,
        low.s_src,
        low.s_w,
        low.e_ptr,
        low.e_src,
        low.e_w,
        low.release,
        low.dur,
        NO_RELEASE,
    )
    return Replay(start, end, sb, eb)
