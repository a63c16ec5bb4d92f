"""Launch -> GPU task links, what each node is attributed to, and launch/stream edge weights.

Edge weights are chosen so an untransformed replay reproduces the trace: for each GPU task,
the dependency that explains its start (launch, stream predecessor or cross-stream wait) keeps
its measured slack; the others get a nominal latency no larger than their measured slack. When
work ahead of a task shrinks in a what-if, the task then starts as soon as its other
dependencies allow, instead of waiting for a delay that no longer exists.
"""

from __future__ import annotations

import numpy as np

from perfcast.events import NONE, EventTable
from perfcast.graph.lanes import RT_KINDS
from perfcast.graph.model import EdgeType, Graph, NodeKind
from perfcast.graph.phases import Phase

DEFAULT_LAUNCH_LATENCY_NS = 5_000


DEFAULT_STREAM_GAP_NS = 1_000


UNEXPLAINED_TOL_NS = 20_000


def link_launches(table: EventTable, graph: Graph, row_to_node: np.ndarray) -> None:
    """GPU node -> node of the outermost runtime call that launched it."""
    c = graph.cols
    gpu = np.flatnonzero(c["kind"] == NodeKind.GPU)
    rows = c["event"][gpu]
    lrow = table.launch[rows].astype(np.int64)
    # A launch recorded on a nested driver call belongs to its outermost runtime call.
    is_rt = np.isin(table.kind, RT_KINDS)
    for _ in range(3):
        nested = (lrow >= 0) & (row_to_node[np.maximum(lrow, 0)] < 0)
        if not nested.any():
            break
        p = table.parent[lrow[nested]]
        lrow[nested] = np.where((p >= 0) & is_rt[np.maximum(p, 0)], p, NONE)
    lnode = np.where(lrow >= 0, row_to_node[np.maximum(lrow, 0)], NONE)
    c["launch"][gpu] = lnode
    has = lnode >= 0
    c["kind"][lnode[has]] = NodeKind.LAUNCH
    c["launch_order"][gpu[has]] = c["order"][lnode[has]]
    # GPU work takes the op, phase and iteration of the call that launched it.
    c["op"][gpu[has]] = c["op"][lnode[has]]
    launched_phase = c["phase"][lnode[has]]
    own = c["phase"][gpu[has]]
    c["phase"][gpu[has]] = np.where(own == Phase.COMMUNICATION, own, launched_phase)


def attribute_names(table: EventTable, graph: Graph, scopes: np.ndarray) -> None:
    """Op name and module/annotation scope of every node (GPU work: its launcher's)."""
    c = graph.cols
    op = c["op"]
    has = op >= 0
    c["op_name"][has] = table.name[op[has]]
    c["scope"][has] = scopes[op[has]]
    ev = c["event"]
    own = (ev >= 0) & (c["kind"] != NodeKind.GPU)
    c["scope"][own] = np.where(scopes[ev[own]] >= 0, scopes[ev[own]], c["scope"][own])
    gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & (c["launch"] >= 0))
    c["op_name"][gpu] = c["op_name"][c["launch"][gpu]]
    c["scope"][gpu] = c["scope"][c["launch"][gpu]]


def gpu_weights(
    graph: Graph,
    cross: dict[int, int],
    unresolved: dict[str, int],
    edges: list[tuple[np.ndarray, np.ndarray, np.ndarray, int, bool]],
) -> None:
    """Launch and stream-order weights, and which dependency explains each start."""
    c = graph.cols
    gpu = np.flatnonzero(c["kind"] == NodeKind.GPU)
    if gpu.size == 0:
        return
    start = c["start_measured"]
    end = start + c["dur"]
    # Stream predecessor in stream order.
    gl = c["lane"][gpu]
    order = np.lexsort((c["order"][gpu], gl))
    g = gpu[order]
    prev = np.full(g.size, NONE, dtype=np.int64)
    same = gl[order][1:] == gl[order][:-1]
    prev[1:][same] = g[:-1][same]
    launch = c["launch"][g].astype(np.int64)
    has_l = launch >= 0
    has_p = prev >= 0
    s_l = np.where(has_l, start[g] - end[np.maximum(launch, 0)], 0)
    s_s = np.where(has_p, start[g] - end[np.maximum(prev, 0)], 0)
    # Nominal latencies, measured on this trace where it shows them.
    launch_bound = has_l & (~has_p | (s_s > s_l)) & (s_l >= 0)
    lat = (
        int(np.median(s_l[launch_bound])) if launch_bound.sum() >= 5 else DEFAULT_LAUNCH_LATENCY_NS
    )
    lat = int(np.clip(lat, 0, 50_000))
    stream_bound = has_p & (~has_l | (s_l > s_s)) & (s_s >= 0)
    gap = int(np.median(s_s[stream_bound])) if stream_bound.sum() >= 5 else DEFAULT_STREAM_GAP_NS
    gap = int(np.clip(gap, 0, 20_000))

    _infer_cross_stream(
        graph,
        g,
        start,
        end,
        np.where(has_l, s_l - lat, np.iinfo(np.int64).max),
        np.where(has_p, s_s - gap, np.iinfo(np.int64).max),
        cross,
        unresolved,
    )
    x_src = np.array([cross.get(int(n), NONE) for n in g.tolist()], dtype=np.int64)
    has_x = x_src >= 0
    s_x = np.where(has_x, start[g] - end[np.maximum(x_src, 0)], 0)
    big = np.iinfo(np.int64).max // 4
    n_l = np.where(has_l, s_l - lat, big)
    n_s = np.where(has_p, s_s - gap, big)
    n_x = np.where(has_x, s_x - gap, big)
    best = np.argmin(np.stack([n_l, n_s, n_x]), axis=0)
    none = ~has_l & ~has_p & ~has_x
    c["launch_w"][g] = np.where(best == 0, s_l, np.minimum(s_l, lat))
    c["stream_w"][g] = np.where(best == 1, s_s, np.minimum(s_s, gap))
    x_w = np.where(best == 2, s_x, np.minimum(s_x, gap))
    # With nothing to explain its start, a task starts where it did.
    c["release"][g[none]] = start[g[none]]
    unresolved["gpu_without_launch"] += int((~has_l).sum())
    slack = np.min(np.stack([n_l, n_s, n_x]), axis=0)
    unresolved["gpu_start_unexplained"] += int(((slack > UNEXPLAINED_TOL_NS) & ~none).sum())
    if has_x.any():
        edges.append((x_src[has_x], g[has_x], x_w[has_x], int(EdgeType.CROSS_STREAM), False))
    graph.nominal.update(launch_latency_ns=lat, stream_gap_ns=gap)
    graph.assumptions.append(
        f"launch latency {lat / 1000:.1f} µs and back-to-back kernel gap {gap / 1000:.1f} µs "
        "(medians measured on this trace)"
    )


def _infer_cross_stream(
    graph: Graph,
    g: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    n_l: np.ndarray,
    n_s: np.ndarray,
    cross: dict[int, int],
    unresolved: dict[str, int],
) -> None:
    """Timing fallback for starts neither the launch nor the stream explains.

    A task that began right after work on another stream of its device ended
    most likely waited for it (an event the trace does not record). Counted.
    """
    c = graph.cols
    late = (np.minimum(n_l, n_s) > UNEXPLAINED_TOL_NS) & ~np.isin(g, list(cross))
    if not late.any():
        return
    for rank in np.unique(c["rank"][g[late]]).tolist():
        on_rank = g[c["rank"][g] == rank]
        order = on_rank[np.argsort(end[on_rank], kind="stable")]
        ends = end[order]
        lanes = c["lane"][order]
        # Index just before each run of same-lane tasks: skips the task's own stream in one
        # step (walking back one by one is quadratic on a long single stream).
        run_start = np.zeros(order.size, dtype=np.int64)
        change = np.flatnonzero(lanes[1:] != lanes[:-1]) + 1
        run_start[change] = change
        before_run = np.maximum.accumulate(run_start) - 1
        for node in g[late & (c["rank"][g] == rank)].tolist():
            i = int(np.searchsorted(ends, start[node], side="right")) - 1
            if i >= 0 and lanes[i] == c["lane"][node]:
                i = int(before_run[i])
            if i >= 0 and start[node] - ends[i] <= UNEXPLAINED_TOL_NS:
                cross[node] = int(order[i])
                unresolved["cross_stream_inferred"] = unresolved.get("cross_stream_inferred", 0) + 1
