"""Dependency order of a lowered graph, and the nodes caught in cycles.

Kahn's algorithm over the start and end dependencies of `graph.lower.Lowered`. The
simulator replays in this order; the builder uses it to check that the edges it adds
(collectives across ranks, hand-offs) leave the graph acyclic.
"""

from __future__ import annotations

import numpy as np

from perfcast.graph.lower import Lowered
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
