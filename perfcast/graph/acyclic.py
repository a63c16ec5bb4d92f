"""Dependency order of a lowered graph, the nodes caught in cycles, and breaking them.

Kahn's algorithm over the start and end dependencies of `graph.lower.Lowered`. The
simulator replays in this order; the builder uses it to check that the edges it adds
(collectives across ranks, hand-offs) leave the graph acyclic, and `break_cycles` (below)
removes what a damaged trace made it add against the measured timeline.
"""

from __future__ import annotations

import numpy as np

from perfcast.errors import InternalError
from perfcast.graph.lower import Lowered, lower
from perfcast.graph.model import NONE, Graph, NodeKind, SyncKind
from perfcast.graph.resolve import resolve_sync_targets
from perfcast.jit import compile_loop


def _kahn(n, s_ptr, s_src, e_ptr, e_src):
    # Out-adjacency (CSR) from the in-adjacency of both dependency kinds.
    indeg = np.zeros(n, np.int64)
    cnt = np.zeros(n + 1, np.int64)
    for v in range(n):
        for k in range(s_ptr[v], s_ptr[v + 1]):
            cnt[s_src[k] + 1] += 1
            indeg[v] += 1
        for k in range(e_ptr[v], e_ptr[v + 1]):
            cnt[e_src[k] + 1] += 1
            indeg[v] += 1
    for i in range(n):
        cnt[i + 1] += cnt[i]
    fill = cnt[:-1].copy()
    adj = np.empty(cnt[n], np.int64)
    for v in range(n):
        for k in range(s_ptr[v], s_ptr[v + 1]):
            u = s_src[k]
            adj[fill[u]] = v
            fill[u] += 1
        for k in range(e_ptr[v], e_ptr[v + 1]):
            u = e_src[k]
            adj[fill[u]] = v
            fill[u] += 1
    # A stack, seeded in reverse so ties resolve to the lowest index first.
    stack = np.empty(n, np.int64)
    top = 0
    for v in range(n - 1, -1, -1):
        if indeg[v] == 0:
            stack[top] = v
            top += 1
    order = np.empty(n, np.int64)
    done = 0
    while top > 0:
        top -= 1
        v = stack[top]
        order[done] = v
        done += 1
        for k in range(cnt[v], cnt[v + 1]):
            w = adj[k]
            indeg[w] -= 1
            if indeg[w] == 0:
                stack[top] = w
                top += 1
    return order[:done]


_compiled = None


def topological_order(low: Lowered) -> np.ndarray:
    """Compact node ids in dependency order; shorter than `low.n` when there are cycles."""
    global _compiled
    if _compiled is None:
        _compiled = compile_loop(_kahn)
    return _compiled(low.n, low.s_ptr, low.s_src, low.e_ptr, low.e_src)


def cyclic_node_count(low: Lowered) -> int:
    """How many nodes cannot be ordered: those in a cycle or downstream of one."""
    return low.n - int(topological_order(low).size)


# ---------------------------------------------------------------------------------------------
# Breaking cycles that a damaged or inconsistent trace leads the builder to make.
#
# A graph built from a consistent trace is acyclic: every dependency it records is met by
# the measured timeline (replaying it reproduces the trace), and a cycle of met dependencies
# is impossible with time moving forward. Traces from crashed jobs and other tools break
# that: correlation ids that tie a kernel to the wrong launch, forward/backward flows that
# point back in time, nested or duplicated steps. The builder then keeps dependencies the
# timeline itself contradicts, and some close cycles. `break_cycles` removes, inside each
# cycle, the dependencies the measured timeline violates (the wrong ones, by the trace's own
# account); where none is violated (ties between zero-length events at one timestamp), the
# stored edges of the cycle, then launch links, then synchronizations, in that order.

_MAX_ROUNDS = 32


def _strong_components(low: Lowered, nodes: np.ndarray) -> np.ndarray:
    """Component id per compact node among `nodes` (-1 elsewhere, or when alone in it);
    Tarjan's algorithm, iterative, over the dependencies between those nodes only."""
    n = low.n
    inside = np.zeros(n, dtype=bool)
    inside[nodes] = True
    dst = np.concatenate(
        [np.repeat(np.arange(n), np.diff(low.s_ptr)), np.repeat(np.arange(n), np.diff(low.e_ptr))]
    )
    src = np.concatenate([low.s_src, low.e_src])
    keep = inside[src] & inside[dst]
    src, dst = src[keep], dst[keep]
    o = np.argsort(src, kind="stable")
    succ = dst[o].tolist()
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
    ptr_l = ptr.tolist()

    index = [-1] * n
    lowlink = [0] * n
    on_stack = [False] * n
    stack: list[int] = []
    comp = np.full(n, -1, dtype=np.int64)
    counter = 0
    n_comp = 0
    for root in nodes.tolist():
        if index[root] >= 0:
            continue
        work = [(root, ptr_l[root])]
        index[root] = lowlink[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            v, k = work[-1]
            if k < ptr_l[v + 1]:
                work[-1] = (v, k + 1)
                w = succ[k]
                if index[w] < 0:
                    index[w] = lowlink[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = True
                    work.append((w, ptr_l[w]))
                elif on_stack[w]:
                    lowlink[v] = min(lowlink[v], index[w])
                continue
            work.pop()
            if work:
                u = work[-1][0]
                lowlink[u] = min(lowlink[u], lowlink[v])
            if lowlink[v] == index[v]:
                members = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    members.append(w)
                    if w == v:
                        break
                if len(members) > 1:
                    comp[members] = n_comp
                    n_comp += 1
    return comp


def break_cycles(graph: Graph) -> int:
    """Remove dependencies until the graph is acyclic; returns how many were removed.

    Deterministic (the same graph always loses the same dependencies). Stored edges are
    deleted; a launch link or a synchronization inside a cycle is unset on its node
    (`launch`, `sync_kind`), which is how the graph says "not known". Raises
    InternalError if a cycle survives (only lane order left in it: cannot happen).
    """
    removed = 0
    c = graph.cols
    for _ in range(_MAX_ROUNDS):
        low = lower(graph)
        order = topological_order(low)
        if order.size == low.n:
            return removed
        ordered = np.zeros(low.n, dtype=bool)
        ordered[order] = True
        comp_c = _strong_components(low, np.flatnonzero(~ordered))
        # Component per graph node (-1: in no cycle).
        comp = np.full(len(graph), -1, dtype=np.int64)
        comp[low.nodes] = comp_c
        start = c["start_measured"]
        end = start + c["dur_measured"]

        # Stored edges inside a cycle, and whether the measured timeline violates each.
        es, ed = graph.edge_src.astype(np.int64), graph.edge_dst.astype(np.int64)
        in_cycle = (comp[es] >= 0) & (comp[es] == comp[ed])
        bound = np.where(graph.edge_at_end, end[ed], start[ed])
        # Across ranks the clocks differ (collective edges are aligned by their own weights):
        # the timeline cannot judge those edges.
        same_rank = c["rank"][es] == c["rank"][ed]
        e_violated = in_cycle & same_rank & (end[es] + graph.edge_w > bound)

        # Launch links inside a cycle.
        gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & (comp >= 0) & (c["launch"] >= 0))
        gpu = gpu[comp[c["launch"][gpu]] == comp[gpu]]
        launcher = c["launch"][gpu]
        l_violated = end[launcher] + c["launch_w"][gpu] > start[gpu]

        # Synchronizations waiting, inside a cycle, for work that ended after them.
        syncs = np.flatnonzero((c["sync_kind"] != SyncKind.NONE) & (comp >= 0) & graph.alive)
        s_in, s_violated = [], []
        if syncs.size:
            targets, _ = resolve_sync_targets(graph, syncs)
            for node, tg in zip(syncs.tolist(), targets, strict=True):
                same = [t for t in tg if comp[t] == comp[node]]
                if same:
                    s_in.append(node)
                    late = max(int(end[t]) for t in same) + int(c["sync_w"][node])
                    s_violated.append(late > int(end[node]))
        s_nodes = np.array(s_in, dtype=np.int64)
        s_bad = np.array(s_violated, dtype=bool)

        # What the timeline contradicts goes first; else (ties) stored, launch, sync.
        if e_violated.any() or l_violated.any() or s_bad.any():
            drop_e, drop_l, drop_s = e_violated, gpu[l_violated], s_nodes[s_bad]
        elif in_cycle.any():
            drop_e, drop_l, drop_s = in_cycle, gpu[:0], s_nodes[:0]
        elif gpu.size:
            drop_e, drop_l, drop_s = in_cycle, gpu, s_nodes[:0]
        elif s_nodes.size:
            drop_e, drop_l, drop_s = in_cycle, gpu[:0], s_nodes
        else:
            break
        graph.drop_edges(drop_e)
        c["launch"][drop_l] = NONE
        c["sync_kind"][drop_s] = SyncKind.NONE
        removed += int(drop_e.sum()) + int(drop_l.size) + int(drop_s.size)
    low = lower(graph)
    left = low.n - int(topological_order(low).size)
    raise InternalError(f"{left} nodes of the dependency graph are still in cycles")
