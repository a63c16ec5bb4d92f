"""Dependencies between CPU threads: hand-offs (one thread idles until another's work ends)
and forward -> backward ops (often on different threads).
"""

from __future__ import annotations

import numpy as np

from perfcast.events import EventTable, Kind
from perfcast.graph.model import EdgeType, Graph, NodeKind

CROSS_THREAD_TOL_NS = 500_000


MIN_WAIT_GAP_NS = 20_000


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
    """
    c = graph.cols
    cpu = np.flatnonzero(
        np.isin(c["kind"], [NodeKind.CPU, NodeKind.LAUNCH, NodeKind.SYNC, NodeKind.RUNTIME])
        & graph.alive
    )
    if cpu.size == 0:
        return
    start = c["start_measured"]
    end = start + c["dur"]
    op = c["op"]
    is_gap = (
        (c["kind"] == NodeKind.CPU)
        & ((op < 0) | (table.kind[np.maximum(op, 0)] == Kind.USER_ANNOTATION))
        & (c["dur"] >= MIN_WAIT_GAP_NS)
    )
    # Per lane order: which work nodes are followed by idleness (or end their lane).
    o = cpu[np.lexsort((c["order"][cpu], c["lane"][cpu]))]
    lane_o = c["lane"][o]
    nxt_gap = np.ones(o.size, dtype=bool)
    same = lane_o[1:] == lane_o[:-1]
    nxt_gap[:-1] = np.where(same, is_gap[o[1:]], True)
    handoff = o[nxt_gap & ~is_gap[o]]
    srcs, dsts, ws = [], [], []
    for rank in np.unique(c["rank"][cpu]).tolist():
        cand = handoff[c["rank"][handoff] == rank]
        gaps = cpu[is_gap[cpu] & (c["rank"][cpu] == rank)]
        if cand.size == 0 or gaps.size == 0:
            continue
        cand = cand[np.argsort(end[cand], kind="stable")]
        cend = end[cand]
        clane = c["lane"][cand]
        # Index just before the run of same-lane candidates each one belongs to: skipping
        # the gap's own lane in one step (walking back one by one was quadratic on a
        # single busy thread: 30k ops took 44 s).
        run_start = np.zeros(cand.size, dtype=np.int64)
        change = np.flatnonzero(clane[1:] != clane[:-1]) + 1
        run_start[change] = change
        before_run = (np.maximum.accumulate(run_start) - 1).tolist()
        clane_l = clane.tolist()
        for gnode in gaps.tolist():
            ge, gs, gl = int(end[gnode]), int(start[gnode]), int(c["lane"][gnode])
            i = int(np.searchsorted(cend, ge, side="right")) - 1
            if i >= 0 and clane_l[i] == gl:
                i = before_run[i]
            if i < 0:
                continue
            pe = int(cend[i])
            if pe > gs and ge - pe <= CROSS_THREAD_TOL_NS:
                srcs.append(int(cand[i]))
                dsts.append(gnode)
                ws.append(ge - pe)
    if dsts:
        d = np.array(dsts)
        c["kind"][d] = NodeKind.WAIT
        c["dur"][d] = 0
        edges.append((np.array(srcs), d, np.array(ws), int(EdgeType.CROSS_THREAD), True))


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
    origin = graph.rank_origin_ns
    # Nodes by (lane, measured start) and (lane, measured end), for exact lookups.
    lane_of = graph.lane_index(gpu=False)
    first_at: dict[tuple[int, int], int] = {}
    last_at: dict[tuple[int, int], int] = {}
    for node in cpu[np.lexsort((c["order"][cpu],))].tolist():
        key = (int(c["lane"][node]), int(start[node]))
        first_at.setdefault(key, node)
        last_at[(int(c["lane"][node]), int(end[node]))] = node
    srcs, dsts, ws = [], [], []
    for f, b in pairs.tolist():
        rank = int(table.rank[f])
        if rank not in origin:
            continue
        lf = lane_of.get((rank, int(table.pid[f]), int(table.tid[f])))
        lb = lane_of.get((rank, int(table.pid[b]), int(table.tid[b])))
        if lf is None or lb is None:
            continue
        src = last_at.get((lf, int(table.ts[f] + table.dur[f]) - origin[rank]))
        dst = first_at.get((lb, int(table.ts[b]) - origin[rank]))
        if src is None or dst is None or src == dst:
            continue
        srcs.append(src)
        dsts.append(dst)
        # Never more than the measured slack, so the replay still reproduces the trace.
        ws.append(min(0, int(start[dst] - end[src])))
    if srcs:
        edges.append((np.array(srcs), np.array(dsts), np.array(ws), int(EdgeType.DATA), False))
