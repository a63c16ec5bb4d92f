"""The chain of work and waits that sets a step's time, read off a replay.

The replay records, for every node, which dependency set its start and its
end. Walking those back from the step's last node gives the critical path;
each stretch of it is charged to what was running or waiting then.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfcast.graph.model import NONE, GpuKind, NodeKind
from perfcast.graph.phases import collective_name_mask
from perfcast.sim.timeline import Timeline

# "latency": launch latency and back-to-back gaps; "unexplained": a start delayed
# longer than any dependency in the trace accounts for (counted by the graph builder).
UNEXPLAINED_NS = 20_000
CATEGORIES = (
    "cpu",
    "runtime",
    "sync wait",
    "gpu compute",
    "gpu communication",
    "gpu copy",
    "latency",
    "unexplained",
)


@dataclass
class PathStep:
    node: int  # graph node id
    start_ns: int
    end_ns: int
    category: str


@dataclass
class CriticalPath:
    rank: int
    iteration: str
    total_ms: float
    by_category_ms: dict[str, float]
    top_items: list[tuple[str, str, float]]  # (category, name, ms)
    steps: list[PathStep] = field(default_factory=list)
    # The same path as arrays (graph node, nanoseconds charged), latest first.
    path_nodes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    path_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)


_CAT_CODE = {name: i for i, name in enumerate(CATEGORIES)}


def _node_categories(tl: Timeline) -> np.ndarray:
    """Category code of each graph node when it runs (not when it waits)."""
    c = tl.graph.cols
    comm = collective_name_mask(tl.graph.names)
    kind = c["kind"]
    cat = np.full(len(tl.graph), _CAT_CODE["cpu"], dtype=np.int8)
    cat[np.isin(kind, [NodeKind.LAUNCH, NodeKind.RUNTIME, NodeKind.SYNC])] = _CAT_CODE["runtime"]
    cat[kind == NodeKind.WAIT] = _CAT_CODE["sync wait"]
    gpu = kind == NodeKind.GPU
    name = c["name"]
    is_comm = (name >= 0) & comm[np.maximum(name, 0)]
    cat[gpu] = _CAT_CODE["gpu compute"]
    cat[gpu & is_comm] = _CAT_CODE["gpu communication"]
    cat[gpu & np.isin(c["gpu_kind"], [GpuKind.MEMCPY, GpuKind.MEMSET])] = _CAT_CODE["gpu copy"]
    return cat


def _walk_kernel(v, lo, start, end, sb, eb, out_node, out_s, out_e, out_t):
    """Walk binding dependencies back from v; t: 0 = ran, 1 = waited, 2 = latency."""
    k = 0
    while v >= 0 and k + 2 < out_node.shape[0]:
        if eb[v] >= 0:
            u = eb[v]
            out_node[k] = v
            out_s[k] = max(end[u], lo)
            out_e[k] = end[v]
            out_t[k] = 1
            k += 1
            if end[u] <= lo:
                break
            v = u
            continue
        s = start[v]
        out_node[k] = v
        out_s[k] = max(s, lo)
        out_e[k] = end[v]
        out_t[k] = 0
        k += 1
        if s <= lo:
            break
        u = sb[v]
        if u < 0:
            break
        if end[u] < s:
            out_node[k] = v
            out_s[k] = max(end[u], lo)
            out_e[k] = s
            out_t[k] = 2
            k += 1
        v = u
    return k


_walk_compiled = None


def _walk_fn():
    global _walk_compiled
    if _walk_compiled is None:
        from perfcast.jit import compile_loop

        _walk_compiled = compile_loop(_walk_kernel)
    return _walk_compiled


def critical_paths(
    tl: Timeline, top: int = 8, keep_steps: bool = True, from_completion: bool = False
) -> list[CriticalPath]:
    """One critical path per iteration of the timeline.

    The walk starts at the end of the step's CPU range and stops at the step's first node.
    With `from_completion` it covers the step's window as `Timeline.iteration_ns` counts
    step time: from the previous step's completion to whichever ends later, the step's CPU
    range or its last GPU work (the CPU may run ahead, as after a what-if that makes the
    host faster), so the paths' lengths add up to the step times.
    """
    g = tl.graph
    low = tl.lowered
    compact = np.full(len(g), -1, dtype=np.int64)
    compact[low.nodes] = np.arange(low.n)
    cats = _node_categories(tl)
    out = []
    alive = g.alive
    prev_done: dict[int, int] = {}
    for span in g.iterations:
        if span.start_node == NONE:
            on_rank = np.flatnonzero((g.cols["rank"] == span.rank) & alive)
            if on_rank.size == 0:
                continue
            end_node = int(on_rank[np.argmax(tl.end[on_rank])])
            lo = int(tl.start[on_rank].min())
        else:
            end_node = span.end_node
            lo = int(tl.start[span.start_node])
            if from_completion:
                gpu = np.flatnonzero(
                    (g.cols["kind"] == NodeKind.GPU) & alive & (g.cols["iteration"] == span.index)
                )
                if gpu.size:
                    last = int(gpu[np.argmax(tl.end[gpu])])
                    if tl.end[last] > tl.end[end_node]:
                        end_node = last
                lo = prev_done.get(span.rank, lo)
                prev_done[span.rank] = int(tl.end[end_node])
        out.append(_walk(tl, compact, cats, span.rank, span.name, end_node, lo, top, keep_steps))
    return out


def _walk(
    tl: Timeline,
    compact: np.ndarray,
    cats: np.ndarray,
    rank: int,
    name: str,
    end_node: int,
    lo: int,
    top: int,
    keep_steps: bool,
) -> CriticalPath:
    g = tl.graph
    rep = tl.replay
    nodes = tl.lowered.nodes
    v = int(compact[end_node])
    cap = 3 * tl.lowered.n + 3
    out_node = np.empty(cap, np.int64)
    out_s = np.empty(cap, np.int64)
    out_e = np.empty(cap, np.int64)
    out_t = np.empty(cap, np.int8)
    k = _walk_fn()(
        v, lo, rep.start, rep.end, rep.start_by, rep.end_by, out_node, out_s, out_e, out_t
    )
    node = nodes[out_node[:k]]
    dur = np.maximum(out_e[:k] - out_s[:k], 0)
    t = out_t[:k]
    cat = np.where(
        t == 0, cats[node], np.where(t == 1, _CAT_CODE["sync wait"], _CAT_CODE["latency"])
    )
    cat[(t == 2) & (dur > UNEXPLAINED_NS)] = _CAT_CODE["unexplained"]
    totals = np.bincount(cat, weights=dur, minlength=len(CATEGORIES))
    by_cat = {c: float(totals[i]) / 1e6 for i, c in enumerate(CATEGORIES)}
    # Top items: (category, name) pairs by time on the path, latency excluded.
    names = g.cols["name"][node]
    sel = (cat != _CAT_CODE["latency"]) & (cat != _CAT_CODE["unexplained"]) & (dur > 0)
    key = cat[sel].astype(np.int64) * (len(g.names) + 1) + (names[sel] + 1)
    items = []
    if key.size:
        uk, inv = np.unique(key, return_inverse=True)
        tot = np.bincount(inv, weights=dur[sel])
        for i in np.argsort(-tot)[:top].tolist():
            ci, ni = divmod(int(uk[i]), len(g.names) + 1)
            nm = g.names[ni - 1] if ni > 0 else "(CPU gap)"
            items.append((CATEGORIES[ci], nm, float(tot[i]) / 1e6))
    steps = []
    if keep_steps:
        steps = [
            PathStep(int(a), int(b), int(e), CATEGORIES[int(ct)])
            for a, b, e, ct in zip(node[::-1], out_s[:k][::-1], out_e[:k][::-1], cat[::-1])
        ]
    hi = int(rep.end[v]) if v >= 0 else lo
    return CriticalPath(
        rank=rank,
        iteration=name,
        total_ms=(hi - lo) / 1e6,
        by_category_ms=by_cat,
        top_items=items,
        steps=steps,
        path_nodes=node,
        path_ns=dur,
    )
