"""The chain of work and waits that sets a step's time, read off a replay.

The replay records, for every node, which dependency set its start and its
end. Walking those back from the step's completion (its last CPU node or its
last GPU work, whichever ended later) to the previous step's completion gives
the critical path; each stretch of it is charged to what was running or
waiting then, so the categories add up to the step time exactly.

Categories: host work ("cpu", "launch", "data loading"), GPU work ("gpu
compute", "gpu communication", "gpu copy"), "other ranks" (time on the path
spent on another rank's work: a collective waited for a late rank, charged to
that rank in `waits_on_rank_ms`), "latency" (launch latency, back-to-back
gaps, the time a waiter takes to resume) and "idle" (delays nothing in the
graph explains: a start pinned where it was measured, or a dependency's slack
beyond UNEXPLAINED_NS).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfcast.graph.model import NONE, GpuKind, NodeKind
from perfcast.graph.phases import Phase, collective_name_mask
from perfcast.sim.timeline import Timeline

# A dependency's slack above this is not latency but a delay nothing explains.
UNEXPLAINED_NS = 20_000
CATEGORIES = (
    "cpu",
    "launch",
    "data loading",
    "gpu compute",
    "gpu communication",
    "gpu copy",
    "other ranks",
    "latency",
    "idle",
)
HOST = ("cpu", "launch", "data loading")
GPU = ("gpu compute", "gpu communication", "gpu copy")


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
    total_ms: float  # the step time: the categories add up to it
    by_category_ms: dict[str, float]
    top_items: list[tuple[str, str, float]]  # (category, name, ms)
    steps: list[PathStep] = field(default_factory=list)
    # Time on the path spent on each other rank's work (the ranks this step waited for).
    waits_on_rank_ms: dict[int, float] = field(default_factory=dict)
    # The same path as arrays (graph node, nanoseconds charged), latest first.
    path_nodes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    path_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)

    @property
    def bottleneck(self) -> str:
        """What sets most of the step: "GPU-bound", "host-bound", "waiting on other ranks"
        or "idle" (delays the trace does not explain)."""
        shares = {
            "GPU-bound": sum(self.by_category_ms[c] for c in GPU),
            "host-bound": sum(self.by_category_ms[c] for c in HOST),
            "waiting on other ranks": self.by_category_ms["other ranks"],
            "idle": self.by_category_ms["idle"],
        }
        return max(shares, key=lambda k: shares[k])


_CAT_CODE = {name: i for i, name in enumerate(CATEGORIES)}


def _node_categories(tl: Timeline) -> np.ndarray:
    """Category code of each graph node when it runs (not when it waits)."""
    c = tl.graph.cols
    comm = collective_name_mask(tl.graph.names)
    kind = c["kind"]
    cat = np.full(len(tl.graph), _CAT_CODE["cpu"], dtype=np.int8)
    cat[kind == NodeKind.LAUNCH] = _CAT_CODE["launch"]
    cat[(kind != NodeKind.GPU) & (c["phase"] == Phase.DATALOADER)] = _CAT_CODE["data loading"]
    gpu = kind == NodeKind.GPU
    name = c["name"]
    is_comm = (name >= 0) & comm[np.maximum(name, 0)]
    cat[gpu] = _CAT_CODE["gpu compute"]
    cat[gpu & is_comm] = _CAT_CODE["gpu communication"]
    cat[gpu & np.isin(c["gpu_kind"], [GpuKind.MEMCPY, GpuKind.MEMSET])] = _CAT_CODE["gpu copy"]
    return cat


def _walk_kernel(v, lo, start, end, sb, eb, out_node, out_s, out_e, out_t):
    """Walk binding dependencies back from v to time lo; t: 0 = ran, 1 = waited, 2 = latency.

    A cursor moves back from v's end; every segment ends where the previous one began, so the
    segments tile [reached, end[v]] whatever the weights (overlaps and negative slack are
    clipped). Returns the number of segments; the last one's start is where the walk stopped.
    """
    k = 0
    cur = end[v]
    while v >= 0 and k + 2 < out_node.shape[0] and cur > lo:
        if eb[v] >= 0:
            u = eb[v]
            a = max(min(end[u], cur), lo)
            if a < cur:
                out_node[k] = v
                out_s[k] = a
                out_e[k] = cur
                out_t[k] = 1
                k += 1
                cur = a
            v = u
            continue
        a = max(min(start[v], cur), lo)
        if a < cur:
            out_node[k] = v
            out_s[k] = a
            out_e[k] = cur
            out_t[k] = 0
            k += 1
            cur = a
        u = sb[v]
        if u < 0 or cur <= lo:
            break
        a = max(min(end[u], cur), lo)
        if a < cur:
            out_node[k] = v
            out_s[k] = a
            out_e[k] = cur
            out_t[k] = 2
            k += 1
            cur = a
        v = u
    return k


_walk_compiled = None


def _walk_fn():
    global _walk_compiled
    if _walk_compiled is None:
        from perfcast.jit import compile_loop

        _walk_compiled = compile_loop(_walk_kernel)
    return _walk_compiled


def critical_paths(tl: Timeline, top: int = 8, keep_steps: bool = True) -> list[CriticalPath]:
    """One critical path per iteration of the timeline.

    It covers the step's window as `Timeline.iteration_ns` counts step time: from the
    previous step's completion to whichever ends later, the step's CPU range or its last GPU
    work (the CPU may run ahead, as after a what-if that makes the host faster), so the
    paths' categories add up to the step times.
    """
    g = tl.graph
    nodes = tl.nodes
    compact = np.full(len(g), -1, dtype=np.int64)
    compact[nodes] = np.arange(nodes.size)
    cats = _node_categories(tl)
    out = []
    c = g.cols
    # Replayed times of every rank on one clock (ranks' clocks differ by the offsets that
    # aligned their collectives), so a path that crosses ranks tiles time.
    shift = g.rank_clock_ns
    node_shift = np.zeros(nodes.size, np.int64)
    if shift:
        per_rank = np.zeros(int(c["rank"].max()) + 1, np.int64)
        for r, x in shift.items():
            per_rank[r] = x
        node_shift = per_rank[c["rank"][nodes]]
    clock = (tl.replay.start + node_shift, tl.replay.end + node_shift)
    for w in tl.step_windows():
        lo = w.begin + shift.get(w.span.rank, 0)
        out.append(
            _walk(
                tl, compact, clock, cats, w.span.rank, w.span.name, w.end_node, lo, top, keep_steps
            )
        )
    return out


def _walk(
    tl: Timeline,
    compact: np.ndarray,
    clock: tuple[np.ndarray, np.ndarray],
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
    nodes = tl.nodes
    v = int(compact[end_node])
    cap = 3 * nodes.size + 3
    out_node = np.empty(cap, np.int64)
    out_s = np.empty(cap, np.int64)
    out_e = np.empty(cap, np.int64)
    out_t = np.empty(cap, np.int8)
    start, end = clock
    k = _walk_fn()(v, lo, start, end, rep.start_by, rep.end_by, out_node, out_s, out_e, out_t)
    node = nodes[out_node[:k]]
    dur = out_e[:k] - out_s[:k]
    t = out_t[:k]
    cat = np.where(t == 0, cats[node], _CAT_CODE["latency"])
    # A start that waited longer than any latency for its dependency is idle, unless the
    # dependency is a thread hand-off: then it is the time the thread took to wake up.
    kind = g.cols["kind"]
    lane = g.cols["lane"]
    pred = np.r_[node[1:], NONE] if k else node  # a slack segment's dependency is next
    handoff = (
        (pred >= 0)
        & (kind[node] != NodeKind.GPU)
        & (kind[np.maximum(pred, 0)] != NodeKind.GPU)
        & (lane[node] != lane[np.maximum(pred, 0)])
    )
    cat[(t == 2) & (dur > UNEXPLAINED_NS) & ~handoff] = _CAT_CODE["idle"]
    # Work and waits of other ranks on this rank's path: charged to those ranks.
    node_rank = g.cols["rank"][node]
    other = node_rank != rank
    cat[other] = _CAT_CODE["other ranks"]
    hi = int(end[v]) if v >= 0 else lo
    # What the walk did not reach (a start nothing in the graph explains) is idle, or the
    # other rank's when the walk ended there (its trace began later than this step).
    reached = int(out_s[k - 1]) if k else hi
    head = max(reached - lo, 0)
    ended_on = int(node_rank[-1]) if k else rank
    totals = np.bincount(cat, weights=dur, minlength=len(CATEGORIES))
    totals[_CAT_CODE["idle" if ended_on == rank else "other ranks"]] += head
    waits_on_rank: dict[int, float] = {}
    for r in np.unique(node_rank[other]).tolist():
        waits_on_rank[int(r)] = float(dur[other & (node_rank == r)].sum()) / 1e6
    if ended_on != rank:
        waits_on_rank[ended_on] = waits_on_rank.get(ended_on, 0.0) + head / 1e6
    by_cat = {c: float(totals[i]) / 1e6 for i, c in enumerate(CATEGORIES)}
    # Top items: (category, name) pairs by time on the path, latency excluded.
    names = g.cols["name"][node]
    sel = (cat != _CAT_CODE["latency"]) & (cat != _CAT_CODE["idle"]) & (dur > 0)
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
    return CriticalPath(
        rank=rank,
        iteration=name,
        total_ms=(hi - lo) / 1e6,
        by_category_ms=by_cat,
        top_items=items,
        steps=steps,
        waits_on_rank_ms=waits_on_rank,
        path_nodes=node,
        path_ns=dur,
    )
