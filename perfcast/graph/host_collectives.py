"""Collectives of a CPU backend (gloo): the calling thread enqueues, a worker thread runs.

`c10d::allreduce_` on the training thread hands the work to one of gloo's worker threads,
which runs it under a `gloo:all_reduce` range (holding the tensors' shapes) and may start
before the call returns. Without an edge the worker's idle time before the range would be
replayed as a fixed duration, so the collective would start where it was measured whatever
a what-if did to the work that enqueued it. Here each range on a rank is paired with the
oldest earlier call not yet paired that could have produced it: the same kind (gloo runs
`_reduce_scatter_base_` as an all-reduce) and, where both record shapes, tensors of the
range's sizes (calls of several process groups interleave). Calls that launched GPU work
(NCCL's) and calls that run on the calling thread itself (sends, receives, the monitored
barrier) take no part. The idle time before a paired range becomes a wait on its call.

The training thread's wait for the result needs nothing here: the range is work that the
thread hands off to (`threads.cross_thread_waits`). Matching across ranks is
`collectives.add_collective_waits`, as for NCCL kernels.
"""

from __future__ import annotations

import numpy as np

from perfcast.events import NONE, EventTable, Kind
from perfcast.graph.model import NO_RELEASE, EdgeType, Graph, NodeKind
from perfcast.graph.phases import (
    collective_kernel_mask,
    collective_kind_of_op,
    host_collective_kind,
    host_collective_mask,
)
from perfcast.ingest.input_dims import is_shape, numel, parse_input_dims

_CALL_PREFIX = "c10d::"
_P2P = "sendrecv"
# The kinds of range a call may produce beyond its own (gloo's reduce-scatter all-reduces).
_ALSO_RUNS_AS = {"reducescatter": ("allreduce",)}
# How many unpaired calls a range looks back over for its own (calls without a range, such
# as those of a group the trace's window cut, stay unpaired).
_LOOKBACK = 64


def tensor_sizes(table: EventTable, row: int) -> list[int]:
    """Elements of every tensor an event's shapes record, tensor lists included (empty when
    it has no shapes)."""
    idx = int(table.shapes[row])
    if idx < 0:
        return []
    out: list[int] = []
    for d in parse_input_dims(table.names[idx]) or []:
        for shape in [d] if is_shape(d) else d if isinstance(d, list) else []:
            if numel(shape) > 0:
                out.append(numel(shape))
    return out


def _worker_ranges(table: EventTable) -> np.ndarray:
    """Mask of the gloo ranges its worker threads run: every collective but sends and
    receives, which run on the calling thread and are not collectives of every rank."""
    mask = host_collective_mask(table)
    if not mask.any():
        return mask
    p2p = np.array([host_collective_kind(nm) == _P2P for nm in table.names], dtype=bool)
    return mask & ~p2p[table.name]


def matchable_ranges(table: EventTable) -> np.ndarray:
    """Mask of the gloo ranges that can be matched across ranks: the worker threads' ranges,
    and none where a trace lists a gloo group smaller than the world (a range does not say
    its group, and ranks of different groups would be matched as one)."""
    if any(info.gloo_subgroups for info in table.ranks):
        return np.zeros(len(table), dtype=bool)
    return _worker_ranges(table)


def match_group(table: EventTable, row: int) -> str:
    """What tells a gloo range's collective apart beside its kind (it names no group): the
    shapes of its tensors."""
    idx = int(table.shapes[row])
    return "shapes " + (table.names[idx] if idx >= 0 else "")


SUBGROUPS_NOTE = (
    "gloo's collectives are not matched across ranks: the trace lists gloo process groups "
    "smaller than the world, and a gloo range does not say its group"
)


def node_per_op(graph: Graph, nodes: np.ndarray, longest: bool = False) -> dict[int, int]:
    """Per op row among `nodes`' ops, one of its nodes: the first in lane order, or the
    longest (a gloo range cut by child ops keeps its wait in its longest piece)."""
    c = graph.cols
    if nodes.size == 0:
        return {}
    op = c["op"][nodes]
    rank_in_op = -c["dur"][nodes] if longest else c["order"][nodes]
    o = np.lexsort((rank_in_op, op))
    first = np.ones(o.size, dtype=bool)
    first[1:] = op[o][1:] != op[o][:-1]
    return dict(zip(op[o][first].tolist(), nodes[o][first].tolist()))


def host_collective_nodes(graph: Graph) -> np.ndarray:
    """Per CPU-backend collective range run by a worker thread, the node that holds its wait
    and transfer (its longest piece), in node order. Sends and receives are left out: they
    run on the calling thread and are not collectives of every rank."""
    table = graph.table
    c = graph.cols
    if table is None or len(table) == 0:
        return np.zeros(0, dtype=np.int64)
    mask = _worker_ranges(table)
    if not mask.any():
        return np.zeros(0, dtype=np.int64)
    op = c["op"]
    cand = np.flatnonzero((c["kind"] == NodeKind.CPU) & graph.alive & (op >= 0))
    cand = cand[mask[op[cand]]]
    return np.sort(np.array(list(node_per_op(graph, cand, longest=True).values()), np.int64))


def _queued_calls(table: EventTable) -> np.ndarray:
    """c10d collective calls that hand their work to a CPU backend's worker threads, in time
    order: not sends, receives or the monitored barrier (they run on the calling thread),
    and not an NCCL group's calls (they launch a collective kernel or hold an `nccl:` range;
    gloo on CUDA tensors launches copies only)."""
    names = table.names
    ok = np.array(
        [
            nm.startswith(_CALL_PREFIX)
            and "monitored" not in nm
            and collective_kind_of_op(nm[len(_CALL_PREFIX) :]) not in (None, _P2P)
            for nm in names
        ],
        dtype=bool,
    )
    calls = np.flatnonzero((table.kind == Kind.CPU_OP) & ok[table.name])
    if calls.size == 0:
        return calls
    nccl = np.zeros(calls.size, dtype=bool)
    # Calls holding an `nccl:<op>` range (within a few levels).
    is_nccl = np.array([nm.startswith("nccl:") for nm in names], dtype=bool)
    up = np.flatnonzero(is_nccl[table.name])
    holders: set[int] = set()
    for _ in range(4):
        up = table.parent[up]
        up = up[up >= 0]
        holders.update(up.tolist())
    nccl |= np.isin(calls, list(holders))
    # Calls on whose thread, within whose time, a collective kernel was launched.
    launchers = np.unique(table.launch[collective_kernel_mask(table) & (table.launch >= 0)])
    if launchers.size:
        key = np.lexsort((table.ts[launchers], table.tid[launchers], table.rank[launchers]))
        launchers = launchers[key]
        thread = np.stack([table.rank[launchers], table.tid[launchers]], axis=1)
        cut = np.flatnonzero(np.any(thread[1:] != thread[:-1], axis=1)) + 1
        by_thread = {
            (int(table.rank[g[0]]), int(table.tid[g[0]])): table.ts[g]
            for g in np.split(launchers, cut)
        }
        for i, row in enumerate(calls.tolist()):
            t = by_thread.get((int(table.rank[row]), int(table.tid[row])))
            if t is None:
                continue
            j = int(np.searchsorted(t, table.ts[row], side="left"))
            nccl[i] |= j < t.size and t[j] <= table.ts[row] + table.dur[row]
    calls = calls[~nccl]
    return calls[np.argsort(table.ts[calls], kind="stable")]


def _pairs(table: EventTable, calls: np.ndarray, ranges: list[int]) -> dict[int, int]:
    """range row -> the call row that enqueued it (see the module docstring). Calls wait per
    rank and kind, so calls that never get a range (a window's edge, a collective gloo runs
    as two) hold back only their own kind, and only for _LOOKBACK calls."""
    names = table.names
    sizes_of: dict[int, list[int]] = {}  # per shapes string: parsed once

    def sizes(row: int) -> list[int]:
        key = int(table.shapes[row])
        if key not in sizes_of:
            sizes_of[key] = tensor_sizes(table, row)
        return sizes_of[key]

    pending: dict[tuple[int, str], list[int]] = {}
    for row in calls.tolist():
        kind = collective_kind_of_op(names[int(table.name[row])][len(_CALL_PREFIX) :]) or ""
        rank = int(table.rank[row])
        for runs_as in (kind, *_ALSO_RUNS_AS.get(kind, ())):
            pending.setdefault((rank, runs_as), []).append(row)
    taken: set[int] = set()
    out: dict[int, int] = {}
    for r in sorted(ranges, key=lambda x: (int(table.ts[x]), x)):
        kind = host_collective_kind(names[int(table.name[r])]) or ""
        queue = pending.get((int(table.rank[r]), kind), [])
        while queue and queue[0] in taken:  # paired under its other kind
            queue.pop(0)
        mine = set(sizes(r))
        for i, call in enumerate(queue[:_LOOKBACK]):
            if table.ts[call] > table.ts[r]:
                break
            if call in taken:
                continue
            have = set(sizes(call))
            # Another group's call of the same kind holds other sizes. (A scatter's root
            # records its list of chunks, the range one chunk or several: any in common.)
            if mine and have and not mine & have:
                continue
            out[r] = call
            taken.add(call)
            del queue[i]
            break
    return out


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
    op = c["op"]
    pairs = _pairs(table, _queued_calls(table), op[nodes].tolist())
    if not pairs:
        return 0
    # Every non-GPU node in lane order: a range's predecessor (the idle time before it) and a
    # call's predecessor (where the call began).
    lane_nodes = np.flatnonzero(graph.alive & (c["kind"] != NodeKind.GPU))
    lane_nodes = lane_nodes[np.lexsort((c["order"][lane_nodes], c["lane"][lane_nodes]))]
    pos = {n: i for i, n in enumerate(lane_nodes.tolist())}

    def before(node: int) -> int:
        i = pos[node]
        prev = int(lane_nodes[i - 1]) if i > 0 else NONE
        return prev if prev != NONE and c["lane"][prev] == c["lane"][node] else NONE

    call_nodes = np.flatnonzero(graph.alive & (c["kind"] != NodeKind.GPU) & (op >= 0))
    call_nodes = call_nodes[np.isin(op[call_nodes], list(pairs.values()))]
    node_of_call = node_per_op(graph, call_nodes)
    start = c["start_measured"]
    end = start + c["dur"]
    gloo = host_collective_mask(table)
    first_of_range = node_per_op(graph, np.flatnonzero(graph.alive & np.isin(op, list(pairs))))
    srcs, gap_dsts, gap_ws = [], [], []
    s_srcs, s_dsts, s_ws = [], [], []
    for rng, call in pairs.items():
        if call not in node_of_call or rng not in first_of_range:
            continue
        x = first_of_range[rng]
        src = node_of_call[call]
        w = int(start[x] - end[src])
        if w < 0:
            # The range started before its call returned (the enqueue is inside the call):
            # wait for the call's start (its thread predecessor's end, which the lane makes
            # the call's start), so a shorter call cannot start the range before it. Measured
            # from the call's own start: the predecessor may be a wait replayed at 0 length.
            anchor = before(src)
            if anchor != NONE:
                src, w = anchor, int(start[x] - start[src])
        prev = before(x)
        if prev != NONE:
            p_op = int(op[prev])
            # Idle: CPU time in no op, or directly in an annotation other than a collective.
            idle = c["kind"][prev] in (NodeKind.CPU, NodeKind.WAIT) and (
                p_op < 0 or (table.kind[p_op] == Kind.USER_ANNOTATION and not gloo[p_op])
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
        _drop_guessed_waits(edges, np.array(gap_dsts))
        edges.append(
            (np.array(srcs), np.array(gap_dsts), np.array(gap_ws), int(EdgeType.CROSS_THREAD), True)
        )
    if s_dsts:
        edges.append(
            (np.array(s_srcs), np.array(s_dsts), np.array(s_ws), int(EdgeType.CROSS_THREAD), False)
        )
    paired = len(gap_dsts) + len(s_dsts)
    if paired:
        graph.assumptions.append(
            f"{paired} collective(s) of a CPU backend (gloo) start on their worker thread no "
            "earlier than the call that enqueued them, with the measured delay"
        )
    return paired


def _drop_guessed_waits(
    edges: list[tuple[np.ndarray, np.ndarray, np.ndarray, int, bool]], waits: np.ndarray
) -> None:
    """The hand-offs `threads.cross_thread_waits` guessed into these waits (from whatever
    work ended just before): each now waits for the call that enqueued it instead."""
    for i, (src, dst, w, etype, at_end) in enumerate(edges):
        if etype == int(EdgeType.CROSS_THREAD) and at_end:
            keep = ~np.isin(dst, waits)
            if not keep.all():
                edges[i] = (src[keep], dst[keep], w[keep], etype, at_end)
