"""Graph -> flat dependency arrays the replay loop runs over.

Derived here, from the graph as it is now: thread order, stream order,
launch -> GPU task, and what each synchronization waits for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.graph.launches import launch_queue_pairs
from perfcast.graph.model import NO_RELEASE, EdgeType, Graph, NodeKind, Source, SyncKind
from perfcast.graph.resolve import resolve_sync_targets


@dataclass
class Lowered:
    n: int
    nodes: np.ndarray  # compact index -> graph node id
    dur: np.ndarray
    release: np.ndarray
    # Dependencies grouped by destination (CSR): start deps and end deps.
    s_ptr: np.ndarray
    s_src: np.ndarray
    s_w: np.ndarray
    e_ptr: np.ndarray
    e_src: np.ndarray
    e_w: np.ndarray


def _csr(dst: np.ndarray, src: np.ndarray, w: np.ndarray, n: int):
    order = np.argsort(dst, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=ptr[1:])
    return ptr, src[order].astype(np.int64), w[order].astype(np.int64)


def _launch_weights(c: dict[str, np.ndarray], gpu: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """Launch -> task weights. A task that started before its launch call returned (a
    CUDA graph's kernels run while cudaGraphLaunch is still enqueuing them) keeps its place
    *within* the call: a call made shorter (the profiler's cost taken out, a faster host)
    moves it proportionally, where a fixed offset from the call's end put a graph's first
    kernels 1.6 ms before the launch that starts them."""
    w = c["launch_w"][gpu]
    now = c["dur"][launch]
    was = c["dur_measured"][launch]
    # Only calls changed after the build (corrected, scaled, modelled): the build itself
    # shortens a launch blocked on a full queue, and its tasks must replay where they ran.
    changed = c["source"][launch] != int(Source.MEASURED)
    moved = (w < 0) & (was > 0) & (now != was) & changed
    if not moved.any():
        return w
    w = w.copy()
    w[moved] = np.rint(w[moved] * (now[moved] / was[moved])).astype(np.int64)
    return w


def lower(graph: Graph) -> Lowered:
    c = graph.cols
    alive = graph.alive
    nodes = np.flatnonzero(alive)
    n = nodes.size
    compact = np.full(len(graph), -1, dtype=np.int64)
    compact[nodes] = np.arange(n)
    kind = c["kind"][nodes]
    lane = c["lane"][nodes]

    s_dst, s_src, s_w = [], [], []
    e_dst, e_src, e_w = [], [], []

    # Lane order: each node after the previous one on its thread or stream.
    o = np.lexsort((c["order"][nodes], lane))
    same = lane[o][1:] == lane[o][:-1]
    prev_c = o[:-1][same]
    next_c = o[1:][same]
    is_gpu_next = kind[next_c] == NodeKind.GPU
    s_dst.append(next_c)
    s_src.append(prev_c)
    s_w.append(np.where(is_gpu_next, c["stream_w"][nodes[next_c]], 0))

    # Launch -> GPU task.
    gpu_c = np.flatnonzero(kind == NodeKind.GPU)
    lnode = c["launch"][nodes[gpu_c]]
    ok = lnode >= 0
    ok[ok] = compact[lnode[ok]] >= 0
    s_dst.append(gpu_c[ok])
    s_src.append(compact[lnode[ok]])
    s_w.append(_launch_weights(c, nodes[gpu_c[ok]], lnode[ok]))

    # Synchronizations wait for what is now last on their stream(s).
    sync = nodes[c["sync_kind"][nodes] != SyncKind.NONE]
    if sync.size:
        targets, _ = resolve_sync_targets(graph, sync)
        counts = np.fromiter((len(t) for t in targets), dtype=np.int64, count=len(targets))
        waiter = np.repeat(sync, counts)
        e_dst.append(compact[waiter])
        e_src.append(compact[np.fromiter((x for t in targets for x in t), np.int64)])
        e_w.append(c["sync_w"][waiter])

    # A launch returns only once its stream's queue has a free slot.
    q_src, q_dst = launch_queue_pairs(graph, int(graph.nominal.get("launch_queue_depth", 0)))
    if q_dst.size:
        e_dst.append(compact[q_dst])
        e_src.append(compact[q_src])
        e_w.append(c["queue_w"][q_dst])

    # Stored edges; a removed source hands the edge to its lane predecessor.
    if graph.edge_src.size:
        src = graph.edge_src.astype(np.int64)
        dst = graph.edge_dst.astype(np.int64)
        src = _redirect_removed(graph, src, alive)
        # A thread handed work whose first node a what-if removed still waits for the
        # hand-off before its next work: dropped, the autograd thread's first step began
        # backward at the trace's start (torch-compile on identical steps: the first 10%
        # shorter than the others).
        handed = (graph.edge_type == EdgeType.CROSS_THREAD) & ~graph.edge_at_end & ~alive[dst]
        if handed.any():
            dst = dst.copy()
            dst[handed] = _redirect_removed(graph, dst[handed], alive, later=True)
        keep = (src >= 0) & (dst >= 0)
        keep[keep] &= alive[dst[keep]]
        src, dst = src[keep], dst[keep]
        w = graph.edge_w[keep]
        at_end = graph.edge_at_end[keep]
        s_dst.append(compact[dst[~at_end]])
        s_src.append(compact[src[~at_end]])
        s_w.append(w[~at_end])
        e_dst.append(compact[dst[at_end]])
        e_src.append(compact[src[at_end]])
        e_w.append(w[at_end])

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    s_ptr, s_src_a, s_w_a = _csr(cat(s_dst), cat(s_src), cat(s_w), n)
    e_ptr, e_src_a, e_w_a = _csr(cat(e_dst), cat(e_src), cat(e_w), n)
    release = c["release"][nodes].copy()
    # Inserted nodes with nothing before them start at time zero of their rank.
    no_dep = (np.diff(s_ptr) == 0) & (release == NO_RELEASE)
    release[no_dep] = 0
    return Lowered(
        n=n,
        nodes=nodes,
        dur=c["dur"][nodes].astype(np.int64),
        release=release.astype(np.int64),
        s_ptr=s_ptr,
        s_src=s_src_a,
        s_w=s_w_a,
        e_ptr=e_ptr,
        e_src=e_src_a,
        e_w=e_w_a,
    )


def _redirect_removed(
    graph: Graph, src: np.ndarray, alive: np.ndarray, later: bool = False
) -> np.ndarray:
    """Removed edge sources -> the nearest earlier live node on the same lane (with
    `later`: the nearest later one); -1 where the lane has none."""
    dead = ~alive[src]
    if not dead.any():
        return src
    c = graph.cols
    live = np.flatnonzero(alive)
    if live.size == 0:
        return np.where(dead, -1, src)
    # Live nodes sorted by (lane, order): a dead node's replacement is the live entry just
    # before where it would sort, if that entry is on the same lane.
    o = live[np.lexsort((c["order"][live], c["lane"][live]))]
    keys_lane = c["lane"][o]
    keys = c["order"][o]
    d = src[dead]
    d_lane = c["lane"][d]
    x = c["order"][d]
    # Each dead node's lane is the run [lo, hi) of `o`; a binary search inside every run at
    # once, halving all intervals per round (a loop over lanes rescanned every dead node per
    # lane: 15 of advise's 113 s on 1,024 ranks).
    lo = np.searchsorted(keys_lane, d_lane, side="left")
    hi = np.searchsorted(keys_lane, d_lane, side="right")
    a, b = lo.copy(), hi.copy()
    last = max(keys.size - 1, 0)
    while True:
        open_ = a < b
        if not open_.any():
            break
        mid = (a + b) // 2
        km = keys[np.minimum(mid, last)]  # closed intervals may sit at the end
        # The first position whose key is > x (later) or >= x (earlier).
        right = open_ & ((km <= x) if later else (km < x))
        left = open_ & ~right
        a = np.where(right, mid + 1, a)
        b = np.where(left, mid, b)
    pos = np.where(a < hi, a, -1) if later else np.where(a > lo, a - 1, -1)
    out = src.copy()
    out[np.flatnonzero(dead)] = np.where(pos >= 0, o[np.maximum(pos, 0)], -1)
    return out
