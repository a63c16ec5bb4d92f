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
    """Each step's first and last node on the thread that ran its ProfilerStep range.

    Lookups are binary searches over each rank's ops sorted by start and each lane's nodes
    sorted by start and by end: a trace of 20,000 steps scanned every event once per step.
    """
    c = graph.cols
    spans = []
    start = c["start_measured"]
    end = start + c["dur_measured"]
    is_op = table.kind_mask(OP_KINDS)
    cpu_lane = {(ln.rank, ln.pid, ln.tid): i for i, ln in enumerate(graph.lanes) if not ln.is_gpu}
    lane_nodes: dict[int, np.ndarray] | None = None
    ops_by_rank: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    lane_order: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    for index, it in enumerate(table.iterations):
        info = table.rank_info(it.rank)
        origin = graph.rank_origin_ns.get(it.rank)
        if origin is None:
            continue
        if not info.has_steps:
            spans.append(IterationSpan(it.rank, it.name, it.dur_ns, NONE, NONE, index))
            continue
        if it.rank not in ops_by_rank:  # the rank's ops by start time, once
            on_rank = table.rank_rows(it.rank)
            ops = on_rank[is_op[on_rank]]
            ops = ops[np.argsort(table.ts[ops], kind="stable")]
            ops_by_rank[it.rank] = (ops, table.ts[ops])
        ops, ops_ts = ops_by_rank[it.rank]
        lo, hi = np.searchsorted(ops_ts, [it.start_ns, it.start_ns + 1])
        rows = [r for r in ops[lo:hi].tolist() if table.name_of(r) == it.name]
        if not rows:
            continue
        r = min(rows)
        lane = cpu_lane.get((it.rank, int(table.pid[r]), int(table.tid[r])))
        if lane is None:
            continue
        if lane_nodes is None:  # every lane's nodes, grouped once
            lane_nodes = dict(split_by(c["lane"]))
        if lane not in lane_order:  # the lane's nodes by start and by end, once
            nodes = np.sort(lane_nodes.get(lane, np.zeros(0, dtype=np.int64)))
            by_start = nodes[np.argsort(start[nodes], kind="stable")]
            by_end = nodes[np.argsort(end[nodes], kind="stable")]
            lane_order[lane] = (by_start, start[by_start], by_end, end[by_end])
        by_start, starts, by_end, ends = lane_order[lane]
        s0, e0 = it.start_ns - origin, it.cpu_end_ns - origin
        f = int(np.searchsorted(starts, s0, "left"))  # the earliest start >= s0
        n_last = int(np.searchsorted(ends, e0, "right"))  # ends <= e0: the first n_last
        if f == starts.size or n_last == 0:
            continue
        # the latest end <= e0; among equal ends the lowest node, as argmax picks
        l_pos = int(np.searchsorted(ends, ends[n_last - 1], "left"))
        spans.append(
            IterationSpan(it.rank, it.name, it.dur_ns, int(by_start[f]), int(by_end[l_pos]), index)
        )
    return spans
