"""Launch -> GPU task links, what each node is attributed to, and launch/stream edge weights.

Edge weights are chosen so an untransformed replay reproduces the trace: for each GPU task,
the dependency that explains its start (launch, stream predecessor or cross-stream wait) keeps
its measured slack; the others get a nominal latency no larger than their measured slack. When
work ahead of a task shrinks in a what-if, the task then starts as soon as its other
dependencies allow, instead of waiting for a delay that no longer exists.
"""

from __future__ import annotations

import numpy as np

from perfcast.arrays import split_by
from perfcast.events import NONE, EventTable
from perfcast.graph.lanes import RT_KINDS
from perfcast.graph.model import EdgeType, Graph, NodeKind
from perfcast.graph.phases import Phase

# Used only when a trace shows fewer than 5 kernels bound by their launch (or by their stream
# predecessor) to measure a median from: assumptions. Measured on the 36 project traces that
# show them (shared/traces and gpu-truth, 2026-11-24): launch latency 1.0-7.0 µs, median
# 2.0 µs; gap 0-4 µs, median 1.0 µs (one trace 20 µs). 5 µs errs long: a GPU-bound trace
# (where the launch is never binding, so it cannot be measured) keeps its GPU bound.
DEFAULT_LAUNCH_LATENCY_NS = 5_000
DEFAULT_STREAM_GAP_NS = 1_000
_MIN_SAMPLES = 5
UNEXPLAINED_TOL_NS = 20_000

# The launch queue: a launch returns only once the stream has a free slot. About 1,000
# launches can be pending per stream (NVIDIA developer forum, "CUDA stream are blocked when
# launching lots of kernels (>1000)", 2018: ~1,000 per stream, each stream its own queue).
# Measured on the traces here (H100, CUDA 13; V100, CUDA 11): a blocked launch returns when the
# 1,022nd entry before it on its stream ends, so that is the default depth; a trace whose
# launches block shows its own depth and that is used instead.
DEFAULT_LAUNCH_QUEUE_DEPTH = 1022
QUEUE_RELEASE_NS = 5_000  # a blocked launch returns this soon after its slot frees (at most)
QUEUE_TOL_NS = 50_000  # a launch that returned within this of a slot freeing had waited for it
MIN_BLOCKED_LAUNCHES = 3  # blocked launches needed to read the depth off the trace
MIN_BLOCKED_NS = 20_000  # a launch this long that returned as a slot freed had been blocked
# No driver keeps fewer pending launches than this; a smaller "depth" read off a trace is a
# launch-bound step whose launches merely return as the previous tiny kernel ends.
MIN_PLAUSIBLE_DEPTH = 256


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
    _order_unlaunched(graph, gpu)
    # GPU work takes the op, phase and iteration of the call that launched it.
    c["op"][gpu[has]] = c["op"][lnode[has]]
    launched_phase = c["phase"][lnode[has]]
    own = c["phase"][gpu[has]]
    # Collectives stay communication, and graph replays keep their own label (their launch,
    # a cudaGraphLaunch, says nothing of the ops they came from).
    keep = (own == Phase.COMMUNICATION) | (own == Phase.GRAPH)
    c["phase"][gpu[has]] = np.where(keep, own, launched_phase)


def _order_unlaunched(graph: Graph, gpu: np.ndarray) -> None:
    """When GPU work whose launch the trace lacks was enqueued: right after the work before it
    on its stream, or before the trace began if nothing precedes it.

    Most such work was launched before the profiler's window opened (a CPU running ahead of
    the GPU leaves up to a full launch queue of work behind), so its start time, the default,
    would put it far too late among the launches that syncs and the launch queue count.
    """
    c = graph.cols
    if gpu.size == 0:
        return
    before_trace = float(np.min(c["order"])) - 1.0
    for _, pos in split_by(c["lane"][gpu], c["order"][gpu]):
        g = gpu[pos]
        unlaunched = c["launch"][g] < 0
        if not unlaunched.any():
            continue
        key = np.where(unlaunched, -np.inf, c["launch_order"][g])
        running = np.maximum.accumulate(key)
        c["launch_order"][g[unlaunched]] = np.where(
            np.isinf(running[unlaunched]), before_trace, running[unlaunched]
        )


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
    lat_measured = int(launch_bound.sum()) >= _MIN_SAMPLES
    lat = int(np.median(s_l[launch_bound])) if lat_measured else DEFAULT_LAUNCH_LATENCY_NS
    lat = int(np.clip(lat, 0, 50_000))
    stream_bound = has_p & (~has_l | (s_l > s_s)) & (s_s >= 0)
    gap_measured = int(stream_bound.sum()) >= _MIN_SAMPLES
    gap = int(np.median(s_s[stream_bound])) if gap_measured else DEFAULT_STREAM_GAP_NS
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

    def where(measured: bool) -> str:
        return "median measured on this trace" if measured else "assumed: too few kernels show it"

    graph.assumptions.append(
        f"launch latency {lat / 1000:.1f} µs ({where(lat_measured)}) and back-to-back kernel "
        f"gap {gap / 1000:.1f} µs ({where(gap_measured)})"
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
    late_ranks = set(np.unique(c["rank"][g[late]]).tolist())
    for rank, pos in split_by(c["rank"][g]):
        if rank not in late_ranks:
            continue
        on_rank = g[pos]
        order = on_rank[np.argsort(end[on_rank], kind="stable")]
        ends = end[order]
        lanes = c["lane"][order]
        # Index just before each run of same-lane tasks: skips the task's own stream in one
        # step (walking back one by one is quadratic on a long single stream).
        run_start = np.zeros(order.size, dtype=np.int64)
        change = np.flatnonzero(lanes[1:] != lanes[:-1]) + 1
        run_start[change] = change
        before_run = np.maximum.accumulate(run_start) - 1
        for node in on_rank[late[pos]].tolist():
            i = int(np.searchsorted(ends, start[node], side="right")) - 1
            if i >= 0 and lanes[i] == c["lane"][node]:
                i = int(before_run[i])
            if i >= 0 and start[node] - ends[i] <= UNEXPLAINED_TOL_NS:
                cross[node] = int(order[i])
                unresolved["cross_stream_inferred"] = unresolved.get("cross_stream_inferred", 0) + 1


def queue_entries(graph: Graph) -> tuple[np.ndarray, ...]:
    """Launch queue entries of every stream, in enqueue order within each stream.

    An entry is one launch call's work on one stream (a kernel, a copy, or all kernels of a
    graph launch); GPU work whose launch the trace lacks is an entry of its own.
    Returns (lane, launch node or NONE, last task, position in its lane) per entry.
    """
    c = graph.cols
    gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & graph.alive)
    g = gpu[np.lexsort((c["order"][gpu], c["launch_order"][gpu], c["lane"][gpu]))]
    lane = c["lane"][g]
    launch = c["launch"][g].astype(np.int64)
    new = np.ones(g.size, dtype=bool)
    new[1:] = (lane[1:] != lane[:-1]) | (launch[1:] != launch[:-1]) | (launch[1:] < 0)
    first = np.flatnonzero(new)
    last_task = g[np.r_[first[1:] - 1, g.size - 1]] if g.size else g
    entry_lane = lane[first]
    lane_first = np.ones(first.size, dtype=bool)
    lane_first[1:] = entry_lane[1:] != entry_lane[:-1]
    lane_begin = np.maximum.accumulate(np.where(lane_first, np.arange(first.size), 0))
    return entry_lane, launch[first], last_task, np.arange(first.size) - lane_begin


def launch_queue_pairs(graph: Graph, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """(last task of queue entry k - depth, launch node of entry k) for every stream.

    The launch of entry k cannot return before entry k - depth has finished: until then its
    stream's queue is full. Derived from the graph as it is, so a what-if that adds or removes
    GPU work changes who waits for whom.
    """
    _, launch, last_task, pos = queue_entries(graph)
    sel = (pos >= depth) & (launch >= 0)
    sel[sel] = graph.alive[launch[sel]]
    idx = np.flatnonzero(sel)
    return last_task[idx - depth], launch[idx]


def blocked_occupancy(
    start: np.ndarray, dur: np.ndarray, occupancy: np.ndarray, finishes: np.ndarray
) -> np.ndarray:
    """The occupancy (entries pending on the stream) each blocked launch saw.

    A launch that took over MIN_BLOCKED_NS and returned within QUEUE_TOL_NS of an entry
    finishing (`finishes`: the stream's entry end times, sorted) was blocked on a full
    queue; an occupancy under MIN_PLAUSIBLE_DEPTH is a launch-bound step, not a full queue.
    """
    k = np.searchsorted(finishes, start + dur, side="right") - 1
    freed = np.where(k >= 0, finishes[np.maximum(k, 0)], np.iinfo(np.int64).min)
    blocked = (dur > MIN_BLOCKED_NS) & (freed > start) & (start + dur - freed <= QUEUE_TOL_NS)
    return occupancy[blocked & (occupancy >= MIN_PLAUSIBLE_DEPTH)]


def depth_from_occupancy(seen: list[np.ndarray]) -> int | None:
    """The occupancy most blocked launches saw, when at least MIN_BLOCKED_LAUNCHES did."""
    occ = np.concatenate(seen) if seen else np.zeros(0, np.int64)
    if occ.size:
        values, counts = np.unique(occ, return_counts=True)
        if counts.max() >= MIN_BLOCKED_LAUNCHES:
            return int(values[np.argmax(counts)])
    return None


def queue_depth(graph: Graph) -> tuple[int, bool]:
    """(launch queue depth, whether it was read off this trace).

    For each launch, the entries of its stream enqueued and not yet finished when it began.
    A launch that took over MIN_BLOCKED_NS and returned within QUEUE_TOL_NS of an entry
    finishing was blocked on a full queue; the occupancy most of them saw is the depth.
    """
    c = graph.cols
    lane, launch, last_task, _ = queue_entries(graph)
    start = c["start_measured"]
    seen: list[np.ndarray] = []
    for _, on in split_by(lane):
        lnode, task = launch[on], last_task[on]
        # Entries finish in stream order, so the last task's end is when each frees its slot.
        fin = np.sort(start[task] + c["dur_measured"][task])
        has = np.flatnonzero(lnode >= 0)
        ls = start[lnode[has]]
        d = c["dur_measured"][lnode[has]]
        occupancy = has - np.searchsorted(fin, ls, side="right")
        seen.append(blocked_occupancy(ls, d, occupancy, fin))
    depth = depth_from_occupancy(seen)
    if depth is not None:
        return depth, True
    return DEFAULT_LAUNCH_QUEUE_DEPTH, False


def queue_weights(graph: Graph) -> None:
    """A launch that returned only when its queue slot freed: its own cost, then a wait.

    Its duration becomes what an unblocked launch of the same call costs on this trace
    (median), and the rest a dependency on the entry whose end freed the slot, with the
    measured release delay; a launch that did not wait keeps its time and would wait (after
    at most QUEUE_RELEASE_NS) only if work ahead of it ran later.
    """
    c = graph.cols
    depth, measured = queue_depth(graph)
    graph.nominal["launch_queue_depth"] = depth
    src, dst = launch_queue_pairs(graph, depth)
    if dst.size:
        start = c["start_measured"]
        l_start, l_end = start[dst], start[dst] + c["dur_measured"][dst]
        t_end = start[src] + c["dur_measured"][src]
        slack = l_end - t_end
        blocked = (t_end > l_start) & (slack >= 0) & (slack <= QUEUE_TOL_NS)
        free = np.flatnonzero(c["kind"] == NodeKind.LAUNCH)
        free = free[~np.isin(free, dst[blocked])]
        own = _typical_cost(graph, free)
        b = dst[blocked]
        typical = np.array([own.get(int(n), own.get(-1, 0)) for n in c["name"][b].tolist()])
        c["dur"][b] = np.minimum(c["dur_measured"][b], typical)
        c["queue_w"][dst] = np.where(blocked, slack, np.minimum(slack, QUEUE_RELEASE_NS))
        graph.unresolved["launches_blocked_on_queue"] = int(blocked.sum())
    how = "measured on this trace" if measured else "the driver's default, not seen here"
    graph.assumptions.append(
        f"a launch waits for a free slot when {depth} launches are pending on its stream ({how})"
    )


def _typical_cost(graph: Graph, launches: np.ndarray) -> dict[int, int]:
    """Median duration per call name of launches that did not wait (-1: over all names)."""
    c = graph.cols
    out: dict[int, int] = {}
    if launches.size == 0:
        return out
    d = c["dur_measured"][launches]
    names = c["name"][launches]
    out[-1] = int(np.median(d))
    for n in np.unique(names).tolist():
        out[int(n)] = int(np.median(d[names == n]))
    return out
