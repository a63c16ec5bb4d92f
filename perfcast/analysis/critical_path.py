"""The chain of work and waits that sets a step's time, read off a replay.

The replay records, for every node, which dependency set its start and its
end. Walking those back from the step's last node gives the critical path;
each stretch of it is charged to what was running or waiting then.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfcast.graph.model import NONE, GpuKind, NodeKind
from perfcast.sim.timeline import Timeline

CATEGORIES = (
    "cpu",
    "runtime",
    "sync wait",
    "gpu compute",
    "gpu communication",
    "gpu copy",
    "latency",
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


def _category(tl: Timeline, node: int, comm_names: np.ndarray) -> str:
    c = tl.graph.cols
    kind = int(c["kind"][node])
    if kind == NodeKind.GPU:
        if c["gpu_kind"][node] in (GpuKind.MEMCPY, GpuKind.MEMSET):
            return "gpu copy"
        if comm_names[int(c["name"][node])]:
            return "gpu communication"
        return "gpu compute"
    if kind in (NodeKind.LAUNCH, NodeKind.RUNTIME, NodeKind.SYNC):
        return "runtime"
    if kind == NodeKind.WAIT:
        return "sync wait"
    return "cpu"


def _comm_names(names: list[str]) -> np.ndarray:
    import re

    pat = re.compile(r"nccl|rccl|AllReduce|AllGather|ReduceScatter|all_reduce", re.IGNORECASE)
    return np.array([bool(pat.search(n)) for n in names], dtype=bool)


def critical_paths(tl: Timeline, top: int = 8) -> list[CriticalPath]:
    """One critical path per iteration of the timeline."""
    g = tl.graph
    low = tl.lowered
    compact = np.full(len(g), -1, dtype=np.int64)
    compact[low.nodes] = np.arange(low.n)
    comm = _comm_names(g.names)
    out = []
    alive = g.alive
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
        out.append(_walk(tl, compact, comm, span.rank, span.name, end_node, lo, top))
    return out


def _walk(
    tl: Timeline,
    compact: np.ndarray,
    comm: np.ndarray,
    rank: int,
    name: str,
    end_node: int,
    lo: int,
    top: int,
) -> CriticalPath:
    g = tl.graph
    rep = tl.replay
    nodes = tl.lowered.nodes
    v = int(compact[end_node])
    steps: list[PathStep] = []
    hi = int(rep.end[v])
    guard = tl.lowered.n + 1
    while v >= 0 and guard > 0:
        guard -= 1
        node = int(nodes[v])
        e = int(rep.end[v])
        if rep.end_by[v] >= 0:
            u = int(rep.end_by[v])
            steps.append(PathStep(node, max(int(rep.end[u]), lo), e, "sync wait"))
            if rep.end[u] <= lo:
                break
            v = u
            continue
        s = int(rep.start[v])
        steps.append(PathStep(node, max(s, lo), e, _category(tl, node, comm)))
        if s <= lo:
            break
        u = int(rep.start_by[v])
        if u < 0:
            break
        if rep.end[u] < s:
            steps.append(PathStep(node, max(int(rep.end[u]), lo), s, "latency"))
        v = u
    by_cat = dict.fromkeys(CATEGORIES, 0.0)
    items: dict[tuple[str, str], float] = {}
    for st in steps:
        ms = max(st.end_ns - st.start_ns, 0) / 1e6
        by_cat[st.category] += ms
        if st.category != "latency" and ms > 0:
            nm = g.name_of(st.node) if g.cols["name"][st.node] >= 0 else "(CPU gap)"
            key = (st.category, nm)
            items[key] = items.get(key, 0.0) + ms
    steps.reverse()
    ranked = sorted(items.items(), key=lambda kv: -kv[1])[:top]
    return CriticalPath(
        rank=rank,
        iteration=name,
        total_ms=(hi - lo) / 1e6,
        by_category_ms=by_cat,
        top_items=[(k[0], k[1], v) for k, v in ranked],
        steps=steps,
    )
