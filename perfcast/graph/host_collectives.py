"""Collectives of a CPU backend (gloo): the calling thread enqueues, a worker thread runs.

`c10d::allreduce_` on the training thread hands the work to one of gloo's worker threads,
which runs it under a `gloo:all_reduce` range (holding the tensors' shapes) and may start
before the call returns. Without an edge the worker's idle time before the range would be
replayed as a fixed duration, so the collective would start where it was measured whatever
a what-if did to the work that enqueued it. Here the n-th collective call on a rank is
paired with the n-th range on the rank's worker threads (they take work in FIFO order; the
kinds may differ: gloo runs `_reduce_scatter_base_` as an all-reduce), and the range waits
for its call: the idle time before it becomes a wait. Sends and receives run on the calling
thread itself and take no part.

The training thread's wait for the result needs nothing here: the range is work that the
thread hands off to (`threads.cross_thread_waits`). Matching across ranks is
`collectives.add_collective_waits`, as for NCCL kernels.
"""

from __future__ import annotations

from collections import defaultdict, deque

import numpy as np

from perfcast.events import NONE, EventTable, Kind
from perfcast.graph.model import NO_RELEASE, EdgeType, Graph, NodeKind
from perfcast.graph.phases import host_collective_kind, host_collective_mask
from perfcast.hardware.collectives import collective_from_kernel_name

_ENQUEUE_PREFIX = "c10d::"
_P2P = "sendrecv"


def _queued_mask(table: EventTable) -> np.ndarray:
    """CPU-backend collective ranges that went through the worker queue (not send/recv)."""
    mask = host_collective_mask(table)
    p2p = np.array([host_collective_kind(nm) == _P2P for nm in table.names], dtype=bool)
    return mask & ~p2p[table.name] if len(table) else mask


def host_collective_nodes(graph: Graph) -> np.ndarray:
    """Per CPU-backend collective range run by a worker thread, its node (the range has no
    child ops, so one node), in node order; the nodes of ranges cut in several are their
    first. Sends and receives are left out: they are not collectives of every rank."""
    table = graph.table
    c = graph.cols
    if table is None or len(table) == 0:
        return np.zeros(0, dtype=np.int64)
    mask = _queued_mask(table)
    if not mask.any():
        return np.zeros(0, dtype=np.int64)
    op = c["op"]
    cand = np.flatnonzero((c["kind"] == NodeKind.CPU) & graph.alive & (op >= 0))
    cand = cand[mask[op[cand]]]
    if cand.size == 0:
        return cand.astype(np.int64)
    cand = cand[np.lexsort((c["order"][cand], op[cand]))]
    first = np.ones(cand.size, dtype=bool)
    first[1:] = op[cand][1:] != op[cand][:-1]
    return np.sort(cand[first]).astype(np.int64)


def _is_queued_call(name: str) -> bool:
    """A c10d collective call that hands its work to the backend's worker threads."""
    if not name.startswith(_ENQUEUE_PREFIX):
        return False
    rest = name[len(_ENQUEUE_PREFIX) :]
    kind = collective_from_kernel_name(rest) or ("barrier" if "barrier" in rest else None)
    return kind is not None and kind != _P2P


def enqueue_edges(
    table: EventTable,
    graph: Graph,
    edges: list[tuple[np.ndarray, np.ndarray, np.ndarray, int, bool]],
) -> int:
    """Each CPU-backend collective waits for the call that enqueued it; returns how many
    were paired with their call."""
    nodes = host_collective_nodes(graph)
    if nodes.size == 0:
        return 0
    c = graph.cols
    names = table.names
    call_names = [i for i, nm in enumerate(names) if _is_queued_call(nm)]
    calls = np.flatnonzero((table.kind == Kind.CPU_OP) & np.isin(table.name, call_names))
    # The node of each enqueueing call: its first node on its thread.
    cpu = np.flatnonzero((c["kind"] != NodeKind.GPU) & graph.alive & (c["op"] >= 0))
    cpu = cpu[np.isin(c["op"][cpu], calls)]
    cpu = cpu[np.lexsort((c["order"][cpu], c["op"][cpu]))]
    first = np.ones(cpu.size, dtype=bool)
    first[1:] = c["op"][cpu][1:] != c["op"][cpu][:-1]
    node_of_call = dict(zip(c["op"][cpu][first].tolist(), cpu[first].tolist()))

    queues: dict[int, deque[int]] = defaultdict(deque)
    for row in calls[np.argsort(table.ts[calls], kind="stable")].tolist():
        if row in node_of_call:
            queues[int(table.rank[row])].append(row)
    start = c["start_measured"]
    end = start + c["dur"]
    # Lane predecessors of the collectives, to turn the idle time before each into a wait.
    lane_nodes = np.flatnonzero(graph.alive & (c["kind"] != NodeKind.GPU))
    lane_nodes = lane_nodes[np.isin(c["lane"][lane_nodes], np.unique(c["lane"][nodes]))]
    lane_nodes = lane_nodes[np.lexsort((c["order"][lane_nodes], c["lane"][lane_nodes]))]
    pos = {n: i for i, n in enumerate(lane_nodes.tolist())}
    op = c["op"]
    host = host_collective_mask(table)
    srcs, gap_dsts, gap_ws = [], [], []
    s_srcs, s_dsts, s_ws = [], [], []
    paired = 0
    for x in nodes[np.argsort(start[nodes], kind="stable")].tolist():
        row = int(op[x])
        q = queues.get(int(table.rank[row]))
        # The call was made before the range started (the oldest one waiting, FIFO).
        if not q or table.ts[q[0]] > table.ts[row]:
            continue
        src = node_of_call[q.popleft()]
        paired += 1
        w = int(start[x] - end[src])
        i = pos[x]
        prev = int(lane_nodes[i - 1]) if i > 0 else NONE
        if prev != NONE and c["lane"][prev] == c["lane"][x]:
            p_op = int(op[prev])
            # Idle: CPU time in no op (or directly in an annotation other than a collective).
            idle = c["kind"][prev] in (NodeKind.CPU, NodeKind.WAIT) and (
                p_op < 0 or (table.kind[p_op] == Kind.USER_ANNOTATION and not host[p_op])
            )
            if idle:
                c["kind"][prev] = NodeKind.WAIT
                c["dur"][prev] = 0
                srcs.append(src)
                gap_dsts.append(prev)
                gap_ws.append(w)
                continue
        else:
            c["release"][x] = NO_RELEASE  # the thread's first work: it starts when handed it
        s_srcs.append(src)
        s_dsts.append(x)
        s_ws.append(w)
    if gap_dsts:
        edges.append(
            (np.array(srcs), np.array(gap_dsts), np.array(gap_ws), int(EdgeType.CROSS_THREAD), True)
        )
    if s_dsts:
        edges.append(
            (np.array(s_srcs), np.array(s_dsts), np.array(s_ws), int(EdgeType.CROSS_THREAD), False)
        )
    if paired:
        graph.assumptions.append(
            f"{paired} collective(s) of a CPU backend (gloo) start on their worker thread no "
            "earlier than the call that enqueued them, with the measured delay"
        )
    return paired
