"""Iteration spans: where each profiler step starts and ends among the graph's nodes."""

from __future__ import annotations

import numpy as np

from perfcast.events import NONE, EventTable
from perfcast.graph.lanes import OP_KINDS
from perfcast.graph.model import Graph, IterationSpan


def iteration_spans(
    table: EventTable, graph: Graph, row_to_node: np.ndarray
) -> list[IterationSpan]:
    c = graph.cols
    spans = []
    start = c["start_measured"]
    end = start + c["dur_measured"]
    step_rows = np.flatnonzero(np.isin(table.kind, OP_KINDS))
    for index, it in enumerate(table.iterations):
        info = table.rank_info(it.rank)
        origin = graph.rank_origin_ns.get(it.rank)
        if origin is None:
            continue
        if not info.has_steps:
            spans.append(IterationSpan(it.rank, it.name, it.dur_ns, NONE, NONE, index))
            continue
        rows = step_rows[(table.rank[step_rows] == it.rank) & (table.ts[step_rows] == it.start_ns)]
        rows = [r for r in rows.tolist() if table.name_of(r) == it.name]
        if not rows:
            continue
        r = rows[0]
        lane = next(
            (
                i
                for i, ln in enumerate(graph.lanes)
                if ln.rank == it.rank
                and not ln.is_gpu
                and ln.pid == table.pid[r]
                and ln.tid == table.tid[r]
            ),
            None,
        )
        if lane is None:
            continue
        nodes = np.flatnonzero(c["lane"] == lane)
        s0, e0 = it.start_ns - origin, it.cpu_end_ns - origin
        first = nodes[start[nodes] >= s0]
        last = nodes[end[nodes] <= e0]
        if first.size == 0 or last.size == 0:
            continue
        spans.append(
            IterationSpan(
                it.rank,
                it.name,
                it.dur_ns,
                int(first[np.argmin(start[first])]),
                int(last[np.argmax(end[last])]),
                index,
            )
        )
    return spans
