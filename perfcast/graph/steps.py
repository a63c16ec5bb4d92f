"""Iteration spans: where each profiler step starts and ends among the graph's nodes."""

from __future__ import annotations

import numpy as np

from perfcast.arrays import split_by
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
    is_op = table.kind_mask(OP_KINDS)
    cpu_lane = {(ln.rank, ln.pid, ln.tid): i for i, ln in enumerate(graph.lanes) if not ln.is_gpu}
    lane_nodes: dict[int, np.ndarray] | None = None
    for index, it in enumerate(table.iterations):
        info = table.rank_info(it.rank)
        origin = graph.rank_origin_ns.get(it.rank)
        if origin is None:
            continue
        if not info.has_steps:
            spans.append(IterationSpan(it.rank, it.name, it.dur_ns, NONE, NONE, index))
            continue
        on_rank = table.rank_rows(it.rank)
        rows = on_rank[is_op[on_rank] & (table.ts[on_rank] == it.start_ns)]
        rows = [r for r in rows.tolist() if table.name_of(r) == it.name]
        if not rows:
            continue
        r = rows[0]
        lane = cpu_lane.get((it.rank, int(table.pid[r]), int(table.tid[r])))
        if lane is None:
            continue
        if lane_nodes is None:  # every lane's nodes, grouped once
            lane_nodes = dict(split_by(c["lane"]))
        nodes = lane_nodes.get(lane, np.zeros(0, dtype=np.int64))
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
