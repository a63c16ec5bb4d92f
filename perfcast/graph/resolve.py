"""What a synchronization waits for, worked out from the graph as it is now.

Resolved again on every replay (not frozen when the graph is built), so a
sync after a what-if waits for whatever is then the last work on its stream.
"""

from __future__ import annotations

import numpy as np

from perfcast.arrays import split_by
from perfcast.graph.model import NONE, Graph, NodeKind, SyncKind

_INFER_TOL_NS = 20_000


def _gpu_index(graph: Graph) -> dict[int, list[tuple[int, np.ndarray, np.ndarray]]]:
    """Per rank: (lane, nodes sorted by enqueue time, their enqueue times)."""
    c = graph.cols
    alive = graph.alive
    gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & alive)
    out: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}
    # One sort for all lanes (a mask per lane is O(lanes x nodes) on many ranks).
    for lane, pos in split_by(c["lane"][gpu], c["launch_order"][gpu]):
        nodes = gpu[pos]
        out.setdefault(graph.lanes[lane].rank, []).append((lane, nodes, c["launch_order"][nodes]))
    return out


def resolve_sync_targets(
    graph: Graph, sync_nodes: np.ndarray, infer: bool = False
) -> tuple[list[list[int]], dict[int, int]]:
    """For each sync node, the GPU nodes whose end it waits for.

    With `infer`, a stream sync whose stream the trace does not name gets the
    stream of the work that ended last while it blocked (else the last work
    enqueued before it); the chosen lanes are returned so they can be stored.
    """
    c = graph.cols
    index = _gpu_index(graph)
    targets: list[list[int]] = []
    inferred: dict[int, int] = {}
    launch = c["launch"]
    launched_by = _launched_by(
        index, launch, sync_nodes[c["sync_kind"][sync_nodes] == SyncKind.COPY]
    )
    for node in sync_nodes.tolist():
        kind = int(c["sync_kind"][node])
        rank = int(c["rank"][node])
        t = float(c["order"][node])
        lanes = index.get(rank, [])
        if kind == SyncKind.COPY:
            # Every blocking copy's wait names its launch (split_blocking_copies).
            targets.append(list(launched_by.get(int(launch[node]), [])))
            continue
        last_per_lane = {}
        for lane, nodes, keys in lanes:
            i = int(np.searchsorted(keys, t, side="left")) - 1
            if i >= 0:
                last_per_lane[lane] = int(nodes[i])
        if kind == SyncKind.DEVICE:
            targets.append(list(last_per_lane.values()))
            continue
        lane = int(c["sync_lane"][node])
        if lane < 0 and infer and last_per_lane:
            lane = _infer_lane(graph, node, last_per_lane)
            inferred[node] = lane
        x = last_per_lane.get(lane, NONE)
        targets.append([x] if x >= 0 else [])
    return targets, inferred


def _launched_by(
    index: dict[int, list[tuple[int, np.ndarray, np.ndarray]]],
    launch: np.ndarray,
    copy_syncs: np.ndarray,
) -> dict[int, list[int]]:
    """The GPU nodes each blocking copy's launch enqueued, lane by lane in enqueue order;
    found in one pass (a mask per copy over its rank's GPU work was quadratic)."""
    if copy_syncs.size == 0:
        return {}
    parts = [nodes for lanes in index.values() for _, nodes, _ in lanes]
    if not parts:
        return {}
    gpu = np.concatenate(parts)
    gpu = gpu[np.isin(launch[gpu], launch[copy_syncs]) & (launch[gpu] >= 0)]
    return {launcher: gpu[pos].tolist() for launcher, pos in split_by(launch[gpu])}


def _infer_lane(graph: Graph, node: int, last_per_lane: dict[int, int]) -> int:
    c = graph.cols
    s = int(c["start_measured"][node])
    e = s + int(c["dur_measured"][node])
    ends = {
        lane: int(c["start_measured"][x] + c["dur_measured"][x])
        for lane, x in last_per_lane.items()
    }
    waited = {lane: end for lane, end in ends.items() if s < end <= e + _INFER_TOL_NS}
    if waited:
        return max(waited, key=lambda k: waited[k])
    # Nothing ended while it blocked: the stream most recently given work.
    return max(last_per_lane, key=lambda k: c["launch_order"][last_per_lane[k]])
