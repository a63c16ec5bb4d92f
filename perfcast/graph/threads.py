"""Dependencies between CPU threads: hand-offs (one thread idles until another's work ends)
and forward -> backward ops (often on different threads).
"""

from __future__ import annotations

import re

import numpy as np

from perfcast.arrays import split_by
from perfcast.events import EventTable, Kind
from perfcast.graph.model import NO_RELEASE, EdgeType, Graph, NodeKind
from perfcast.graph.phases import host_collective_mask

# How long after another thread's work ends a waiting thread may wake and still be taken to
# have waited for it. The H200 machine's 16-core host woke the autograd thread 126-743 us
# after the main thread handed backward over (seven hand-offs there took 515-743 us); with a
# 500 us bound they were missed, and the wait was replayed as fixed CPU time (a cnn step
# frozen at 69 ms whatever the what-if removed).
CROSS_THREAD_TOL_NS = 1_000_000
MIN_WAIT_GAP_NS = 20_000
# A thread's first work may come this long after the hand-off that started it: the first
# time the profiler sees a thread (the autograd thread in the first profiled step) it can
# take ~0.5 ms to show up.
FIRST_WORK_TOL_NS = 5_000_000
# Status queries: a thread that only polls (NCCL's watchdog, a pipeline's event poller) hands
# nothing to anyone, and waits for no one.
_QUERY_CALLS = re.compile(r"^(cuda|hip|cu)(EventQuery|StreamQuery)")


def cross_thread_waits(
    table: EventTable,
    graph: Graph,
    edges: list[tuple[np.ndarray, np.ndarray, np.ndarray, int, bool]],
) -> None:
    """Hand-offs between threads: one goes idle, another resumes right after.

    A thread idle until shortly after another thread finished its work and
    itself went idle (the autograd thread ending backward, the main thread
    calling it) is taken to have waited for that work. Requiring the source
    thread to go idle keeps busy neighbours from being mistaken for causes.
    Idle means CPU time outside every op, or directly inside a user annotation
    or a step marker (in 2021-era traces `ProfilerStep#N` is an op, and the main
    thread's wait for backward sits in it). A thread whose first event comes
    right after such a hand-off started because of it.
    """
    c = graph.cols
    cpu = np.flatnonzero(
        np.isin(c["kind"], [NodeKind.CPU, NodeKind.LAUNCH, NodeKind.SYNC, NodeKind.RUNTIME])
        & graph.alive
    )
    cpu = cpu[~_polling_lanes(graph)[c["lane"][cpu]]]
    if cpu.size == 0:
        return
    start = c["start_measured"]
    end = start + c["dur"]
    op = c["op"]
    is_marker = table.step_marker_names()
    op_row = np.maximum(op, 0)
    # A CPU backend's collective (gloo's `gloo:<op>` range on its worker thread) is work
    # another thread waits for, not idleness, though it is a user annotation.
    host_coll = host_collective_mask(table)
    in_no_op = (op < 0) | (
        ((table.kind[op_row] == Kind.USER_ANNOTATION) | is_marker[table.name[op_row]])
        & ~host_coll[op_row]
    )
    is_gap = (c["kind"] == NodeKind.CPU) & in_no_op & (c["dur"] >= MIN_WAIT_GAP_NS)
    # Per lane order: which work nodes are followed by idleness (or end their lane).
    o = cpu[np.lexsort((c["order"][cpu], c["lane"][cpu]))]
    lane_o = c["lane"][o]
    nxt_gap = np.ones(o.size, dtype=bool)
    same = lane_o[1:] == lane_o[:-1]
    nxt_gap[:-1] = np.where(same, is_gap[o[1:]], True)
    handoff = o[nxt_gap & ~is_gap[o]]
    # A lane's first node, when it is work: its thread may have been started by another.
    lane_first = np.ones(o.size, dtype=bool)
    lane_first[1:] = ~same
    first_work = o[lane_first & ~is_gap[o]]
    srcs, dsts, ws = [], [], []
    f_srcs, f_dsts, f_ws = [], [], []
    # Per rank, grouped once (a mask per rank was O(ranks x nodes): 4.6 s on 512 ranks).
    handoff_of = {r: handoff[p] for r, p in split_by(c["rank"][handoff])}
    gaps = cpu[is_gap[cpu]]
    gaps_of = {r: gaps[p] for r, p in split_by(c["rank"][gaps])}
    first_of = {r: first_work[p] for r, p in split_by(c["rank"][first_work])}
    none = np.zeros(0, dtype=np.int64)
    for rank, cand in handoff_of.items():
        cand = cand[np.argsort(end[cand], kind="stable")]
        cend = end[cand]
        clane = c["lane"][cand]
        # Index just before the run of same-lane candidates each one belongs to: skipping
        # the waiter's own lane in one step (walking back one by one was quadratic on a
        # single busy thread: 30k ops took 44 s).
        run_start = np.zeros(cand.size, dtype=np.int64)
        change = np.flatnonzero(clane[1:] != clane[:-1]) + 1
        run_start[change] = change
        before_run = np.maximum.accumulate(run_start) - 1
        for gnode in gaps_of.get(rank, none).tolist():
            ge = int(end[gnode])
            src = _source(
                cand, cend, clane, before_run, ge, int(c["lane"][gnode]), int(start[gnode])
            )
            if src >= 0:
                srcs.append(src)
                dsts.append(gnode)
                ws.append(ge - int(end[src]))
        for fnode in first_of.get(rank, none).tolist():
            fs = int(start[fnode])
            src = _source(
                cand,
                cend,
                clane,
                before_run,
                fs,
                int(c["lane"][fnode]),
                NO_RELEASE,
                FIRST_WORK_TOL_NS,
            )
            if src >= 0:
                f_srcs.append(src)
                f_dsts.append(fnode)
                f_ws.append(fs - int(end[src]))
    if dsts:
        d = np.array(dsts)
        c["kind"][d] = NodeKind.WAIT
        c["dur"][d] = 0
        edges.append((np.array(srcs), d, np.array(ws), int(EdgeType.CROSS_THREAD), True))
    if f_dsts:
        # The thread starts when it is handed work, no longer at its measured time.
        f = np.array(f_dsts)
        c["release"][f] = NO_RELEASE
        edges.append((np.array(f_srcs), f, np.array(f_ws), int(EdgeType.CROSS_THREAD), False))


def _polling_lanes(graph: Graph) -> np.ndarray:
    """Per lane: a CPU thread whose every call is a status query (cudaEventQuery, ...), with
    no op. Such threads poll at their own pace; taking their queries for hand-offs tied the
    main thread to a watchdog's timing (on a 16-rank A100 trace a step whose GPU work ran
    10x faster was held at the watchdog's traced time: 212 -> 280 ms)."""
    c = graph.cols
    n_lanes = len(graph.lanes)
    on = np.flatnonzero(graph.alive)
    # A lane's work: every node but the CPU time outside any op (a sync or a launch is work).
    on = on[(c["kind"][on] != NodeKind.CPU) | (c["op"][on] >= 0)]
    names = c["name"][on]
    ids = np.unique(names[names >= 0])
    query_ids = ids[
        np.array([bool(_QUERY_CALLS.match(graph.names[i])) for i in ids.tolist()], bool)
    ]
    query = (c["kind"][on] == NodeKind.RUNTIME) & (c["op"][on] < 0) & np.isin(names, query_ids)
    lane = c["lane"][on]
    has_work = np.bincount(lane, minlength=n_lanes) > 0
    has_other = np.bincount(lane[~query], minlength=n_lanes) > 0
    is_gpu = np.array([ln.is_gpu for ln in graph.lanes], dtype=bool)
    return has_work & ~has_other & ~is_gpu


def _source(
    cand: np.ndarray,
    cend: np.ndarray,
    clane: np.ndarray,
    before_run: np.ndarray,
    t: int,
    lane: int,
    after: int,
    tol: int = CROSS_THREAD_TOL_NS,
) -> int:
    """The last hand-off candidate (sorted by end) on another lane ending in (after, t] and
    within tol of t; -1 if none. `before_run[i]`: the last candidate before i's same-lane run."""
    i = int(np.searchsorted(cend, t, side="right")) - 1
    if i >= 0 and clane[i] == lane:
        i = int(before_run[i])
    if i < 0 or cend[i] <= after or t - cend[i] > tol:
        return -1
    return int(cand[i])


def forward_backward_edges(
    table: EventTable,
    graph: Graph,
    edges: list[tuple[np.ndarray, np.ndarray, np.ndarray, int, bool]],
) -> None:
    """A backward op cannot start before its forward op ended (often on another thread).

    The edge never binds in the measured replay (backward ran later); it keeps a
    what-if from moving backward work ahead of the forward work it differentiates.
    """
    pairs = table.fwd_bwd
    if pairs.size == 0:
        return
    c = graph.cols
    cpu = np.flatnonzero(c["kind"] != NodeKind.GPU)
    if cpu.size == 0:
        return
    start = c["start_measured"]
    end = start + c["dur_measured"]
    f, b = pairs[:, 0], pairs[:, 1]
    # Each pair's lanes and the rank's clock origin; pairs on ranks or threads the graph
    # lacks are dropped.
    rank_ids, rank_inv = np.unique(table.rank[f], return_inverse=True)
    origin = np.array([graph.rank_origin_ns.get(int(r), 0) for r in rank_ids], dtype=np.int64)
    known = np.isin(rank_ids, list(graph.rank_origin_ns))[rank_inv]
    lf = graph.cpu_lanes_of(table.rank[f], table.pid[f], table.tid[f])
    lb = graph.cpu_lanes_of(table.rank[f], table.pid[b], table.tid[b])
    keep = known & (lf >= 0) & (lb >= 0)
    f, b, lf, lb = f[keep], b[keep], lf[keep], lb[keep]
    at = origin[rank_inv[keep]]
    # Nodes found by (lane, measured time) exactly: the forward op's node by its end (the
    # last such node in lane order), the backward op's by its start (the first such node).
    by_order = cpu[np.argsort(c["order"][cpu], kind="stable")]
    n, m = by_order.size, f.size
    times = np.concatenate(
        [start[by_order], end[by_order], table.ts[f] + table.dur[f] - at, table.ts[b] - at]
    )
    uniq, code = np.unique(times, return_inverse=True)
    code = code.reshape(-1)
    lanes = c["lane"][by_order].astype(np.int64)
    width = np.int64(uniq.size)
    starts_key = lanes * width + code[:n]
    ends_key = lanes * width + code[n : 2 * n]
    src = _lookup(ends_key[::-1], by_order[::-1], lf * width + code[2 * n : 2 * n + m])
    dst = _lookup(starts_key, by_order, lb * width + code[2 * n + m :])
    ok = (src >= 0) & (dst >= 0) & (src != dst)
    src, dst = src[ok], dst[ok]
    if src.size:
        # Never more than the measured slack, so the replay still reproduces the trace.
        w = np.minimum(0, start[dst] - end[src])
        edges.append((src, dst, w, int(EdgeType.DATA), False))


def _lookup(keys: np.ndarray, nodes: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """For each query, the node at the first position of `keys` equal to it, else -1."""
    uniq, first = np.unique(keys, return_index=True)
    if uniq.size == 0:
        return np.full(queries.size, -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(uniq, queries), uniq.size - 1)
    return np.where(uniq[pos] == queries, nodes[first[pos]], -1)
