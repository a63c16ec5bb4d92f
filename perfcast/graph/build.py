"""EventTable -> Graph: lanes, node attribution, and the measured edge weights.

Edge weights are chosen so an untransformed replay reproduces the trace:
for each GPU task, the dependency that explains its start (launch, stream
predecessor or cross-stream wait) keeps its measured slack; the others get a
nominal latency no larger than their measured slack. When work ahead of a
task shrinks in a what-if, the task then starts as soon as its other
dependencies allow, instead of waiting for a delay that no longer exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from perfcast.analysis.phases import Phase, enclosing_scopes, event_phases
from perfcast.events import NONE, EventTable, Kind, RankInfo
from perfcast.graph.collectives import add_collective_waits
from perfcast.graph.model import (
    NO_RELEASE,
    NODE_COLUMNS,
    EdgeType,
    GpuKind,
    Graph,
    IterationSpan,
    Lane,
    NodeKind,
    Source,
    SyncKind,
)
from perfcast.graph.resolve import resolve_sync_targets

# Runtime calls that block the calling thread until GPU work finishes.
_DEVICE_SYNC = re.compile(r"^(cuda|hip)DeviceSynchronize$|^cu(Ctx)?Synchronize$|CtxSynchronize")
_STREAM_SYNC = re.compile(r"^(cuda|hip|cu)(Stream|Event)Synchronize$")
_BLOCKING_COPY = re.compile(r"^(cuda|hip)Memcpy$|^(cuda|hip)Memcpy(2D|3D)?(Async|WithStream)?$")
_EVENT_RECORD = re.compile(r"^(cuda|hip|cu)EventRecord")
_STREAM_WAIT = re.compile(r"^(cuda|hip|cu)StreamWaitEvent")

# Nominal latencies used where the trace cannot say (see module docstring).
DEFAULT_LAUNCH_LATENCY_NS = 5_000
DEFAULT_STREAM_GAP_NS = 1_000
SYNC_MIN_NS = 2_000  # CPU cost of a synchronization that did not have to wait
UNEXPLAINED_TOL_NS = 20_000
CROSS_THREAD_TOL_NS = 500_000
MIN_WAIT_GAP_NS = 20_000

_CPU_LANE_KINDS = np.array(
    [Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.RUNTIME, Kind.DRIVER], dtype=np.int8
)
_OP_KINDS = np.array([Kind.CPU_OP, Kind.USER_ANNOTATION], dtype=np.int8)
_RT_KINDS = np.array([Kind.RUNTIME, Kind.DRIVER], dtype=np.int8)
_GPU_KIND_OF = {
    int(Kind.KERNEL): GpuKind.KERNEL,
    int(Kind.MEMCPY): GpuKind.MEMCPY,
    int(Kind.MEMSET): GpuKind.MEMSET,
}


@dataclass
class _Acc:
    """Node columns being accumulated for all ranks."""

    parts: dict[str, list[np.ndarray]]
    n: int = 0

    def add(self, **cols: np.ndarray) -> np.ndarray:
        m = max(np.size(v) for v in cols.values())
        for key, dtype in NODE_COLUMNS.items():
            if key in cols:
                arr = np.broadcast_to(np.asarray(cols[key], dtype=dtype), (m,))
            else:
                arr = np.full(m, _default(key), dtype=dtype)
            self.parts.setdefault(key, []).append(arr)
        ids = np.arange(self.n, self.n + m)
        self.n += m
        return ids

    def columns(self) -> dict[str, np.ndarray]:
        return {
            k: (np.concatenate(self.parts[k]) if self.parts.get(k) else np.zeros(0, dtype=dt))
            for k, dt in NODE_COLUMNS.items()
        }


def _default(key: str) -> int:
    if key in ("dur", "dur_measured", "start_measured", "launch_w", "stream_w", "sync_w", "nbytes"):
        return 0
    if key == "release":
        return NO_RELEASE
    if key == "source":
        return int(Source.MEASURED)
    return NONE


def build_graph(table: EventTable) -> Graph:
    """The dependency graph of every rank in the table."""
    phases = event_phases(table)
    scopes = enclosing_scopes(table)
    klass = _kernel_classes(table)
    acc = _Acc(parts={})
    lanes: list[Lane] = []
    iterations: list[IterationSpan] = []
    origins: dict[int, int] = {}
    devices: dict[int, str | None] = {}
    row_to_node = np.full(len(table), NONE, dtype=np.int64)
    edges: list[tuple[np.ndarray, np.ndarray, np.ndarray, int, bool]] = []
    unresolved = {
        "gpu_without_launch": 0,
        "gpu_start_unexplained": 0,
        "sync_without_target": 0,
        "cycles_broken": 0,
    }

    for info in table.ranks:
        rank = info.rank
        on_rank = table.rank == rank
        act = np.flatnonzero(on_rank & (np.isin(table.kind, _CPU_LANE_KINDS) | table.is_gpu()))
        if act.size == 0:
            continue
        origin = int(table.ts[act].min())
        origins[rank] = origin
        devices[rank] = _device_name(info)
        _build_cpu_lanes(table, rank, origin, phases, acc, lanes, row_to_node)
        _build_gpu_lanes(table, rank, origin, phases, klass, acc, lanes, row_to_node)

    cols = acc.columns()
    graph = Graph(
        cols=cols,
        lanes=lanes,
        names=table.names,  # shared: what-ifs copy before adding names
        edge_src=np.zeros(0, np.int32),
        edge_dst=np.zeros(0, np.int32),
        edge_w=np.zeros(0, np.int64),
        edge_type=np.zeros(0, np.int8),
        edge_at_end=np.zeros(0, bool),
        iterations=iterations,
        rank_origin_ns=origins,
        device_names=devices,
        unresolved=unresolved,
    )
    graph.names = list(table.names)
    graph.table = table
    _link_launches(table, graph, row_to_node)
    _attribute_names(table, graph, scopes)
    _classify_runtime(table, graph, row_to_node)
    _split_blocking_copies(graph)
    cross = _cross_stream_edges(table, graph, row_to_node)
    _gpu_weights(graph, cross, unresolved, edges)
    _sync_weights(graph, unresolved)
    _cross_thread_waits(table, graph, edges)
    _forward_backward_edges(table, graph, edges)
    for src, dst, w, etype, at_end in edges:
        graph.add_edges(src, dst, w, EdgeType(etype), at_end)
    _collectives_across_ranks(graph, unresolved)
    iterations.extend(_iteration_spans(table, graph, row_to_node))
    graph.assumptions.extend(
        [
            "GPU tasks start after their launch, their stream predecessor and any "
            "cross-stream wait, with the measured latency of whichever one delayed them",
            f"a synchronization that did not wait costs {SYNC_MIN_NS / 1000:.0f} µs of CPU time",
            "a CPU thread that resumed within "
            f"{CROSS_THREAD_TOL_NS / 1000:.0f} µs of another thread's work ending waited for it",
        ]
    )
    return graph


def _collectives_across_ranks(graph: Graph, unresolved: dict[str, int]) -> None:
    """Cross-rank collective waits; dropped (and counted) if they would form a cycle."""
    if len({ln.rank for ln in graph.lanes}) < 2:
        return
    before = graph.copy()
    if add_collective_waits(graph) == 0:
        return
    from perfcast.sim.engine import CycleError, replay_fast
    from perfcast.sim.lower import lower

    try:
        replay_fast(lower(graph))
    except CycleError:
        graph.__dict__.update(before.__dict__)
        unresolved["collectives_unmatched"] = unresolved.get("collectives_unmatched", 0) + 1


def _device_name(info: RankInfo) -> str | None:
    """The device as the hardware tables know it (ROCm may call every GPU "AMD Radeon
    Graphics": its compute-unit count and memory then tell), else the trace's own name."""
    try:
        from perfcast.hardware.devices import lookup_device_properties
    except ImportError:  # pragma: no cover
        return info.device_name
    spec = lookup_device_properties(info.device_properties) if info.device_properties else None
    return spec.name if spec is not None else info.device_name


def _kernel_classes(table: EventTable) -> np.ndarray:
    """KernelClass per name (NONE when the classifier is unavailable)."""
    try:
        from perfcast.hardware.classify import classify_names
    except ImportError:
        return np.full(len(table.names), NONE, dtype=np.int8)
    return np.asarray(classify_names(table.names), dtype=np.int8)


def _innermost_op(
    table: EventTable, ops_sorted: np.ndarray, a: np.ndarray, b: np.ndarray
) -> np.ndarray:
    """For each interval [a, b), the innermost op (row) on the thread that contains it."""
    out = np.full(a.shape[0], NONE, dtype=np.int64)
    if ops_sorted.size == 0 or a.size == 0:
        return out
    op_ts = table.ts[ops_sorted]
    cand = np.searchsorted(op_ts, a, side="right") - 1
    ends = table.ts + table.dur
    parent = table.parent
    kind = table.kind
    is_op = np.isin(kind, _OP_KINDS)
    cand_rows = np.where(cand >= 0, ops_sorted[np.maximum(cand, 0)], NONE)
    # Most segments sit directly in the candidate op; climb only for the rest.
    ok = (cand_rows >= 0) & (ends[np.maximum(cand_rows, 0)] >= b)
    out[ok] = cand_rows[ok]
    for i in np.flatnonzero(~ok & (cand_rows >= 0)).tolist():
        r = int(parent[cand_rows[i]])
        bi = int(b[i])
        while r >= 0 and (not is_op[r] or ends[r] < bi):
            r = int(parent[r])
        out[i] = r
    return out


def _build_cpu_lanes(
    table: EventTable,
    rank: int,
    origin: int,
    phases: np.ndarray,
    acc: _Acc,
    lanes: list[Lane],
    row_to_node: np.ndarray,
) -> None:
    rows = np.flatnonzero((table.rank == rank) & np.isin(table.kind, _CPU_LANE_KINDS))
    if rows.size == 0:
        return
    keys = np.stack([table.pid[rows], table.tid[rows]], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    ts = table.ts
    end_all = table.ts + table.dur
    parent = table.parent
    is_rt = np.isin(table.kind, _RT_KINDS)
    for t_idx in range(uniq.shape[0]):
        pid, tid = int(uniq[t_idx, 0]), int(uniq[t_idx, 1])
        trows = rows[inv == t_idx]
        rt = trows[is_rt[trows]]
        # Outermost runtime calls only (a driver call inside a runtime call is one call).
        rt = rt[~((parent[rt] >= 0) & is_rt[np.maximum(parent[rt], 0)])]
        rt = rt[np.argsort(ts[rt], kind="stable")]
        ops = trows[np.isin(table.kind[trows], _OP_KINDS)]
        ops = ops[np.lexsort((-table.dur[ops], ts[ops]))]
        rt_s, rt_e = ts[rt], end_all[rt]
        points = np.unique(np.concatenate([ts[ops], end_all[ops], rt_s, rt_e]))
        if rt.size:
            k = np.searchsorted(rt_s, points, side="right") - 1
            km = np.maximum(k, 0)
            inside = (k >= 0) & (points > rt_s[km]) & (points < rt_e[km])
            points = points[~inside]
        a, b = points[:-1], points[1:]
        covered = np.zeros(a.size, dtype=bool)
        if rt.size:
            k = np.searchsorted(rt_s, a, side="right") - 1
            km = np.maximum(k, 0)
            covered = (k >= 0) & (rt_s[km] == a) & (rt_e[km] == b)
        seg_a, seg_b = a[~covered], b[~covered]
        seg_op = _innermost_op(table, ops, seg_a, seg_b)
        # Runtime calls are attributed to the op they run in.
        rt_op = parent[rt].astype(np.int64)
        for _ in range(4):
            climb = (rt_op >= 0) & ~np.isin(table.kind[np.maximum(rt_op, 0)], _OP_KINDS)
            if not climb.any():
                break
            rt_op[climb] = parent[rt_op[climb]]
        lane = len(lanes)
        name = table.thread_names.get((rank, pid, tid)) or f"thread {tid}"
        lanes.append(Lane(rank=rank, is_gpu=False, pid=pid, tid=tid, name=name))

        n_seg, n_rt = seg_a.size, rt.size
        start = np.concatenate([seg_a, rt_s])
        dur = np.concatenate([seg_b - seg_a, rt_e - rt_s])
        op = np.concatenate([seg_op, rt_op])
        event = np.concatenate([np.full(n_seg, NONE), rt])
        kind = np.concatenate([np.full(n_seg, NodeKind.CPU), np.full(n_rt, NodeKind.RUNTIME)])
        order = np.lexsort((start + dur, start))
        start, dur, op, event, kind = start[order], dur[order], op[order], event[order], kind[order]
        names = np.where(
            event >= 0,
            table.name[np.maximum(event, 0)],
            np.where(op >= 0, table.name[np.maximum(op, 0)], NONE),
        )
        phase = np.where(op >= 0, phases[np.maximum(op, 0)], Phase.NONE)
        phase = np.where(event >= 0, phases[np.maximum(event, 0)], phase)
        iteration = np.where(op >= 0, table.iteration[np.maximum(op, 0)], NONE)
        iteration = np.where(event >= 0, table.iteration[np.maximum(event, 0)], iteration)
        release = np.full(start.size, NO_RELEASE, dtype=np.int64)
        if start.size:
            release[0] = start[0] - origin  # a thread's first node starts where it did
        ids = acc.add(
            kind=kind,
            lane=np.full(start.size, lane),
            order=(start - origin).astype(np.float64),
            dur=dur,
            dur_measured=dur,
            start_measured=start - origin,
            event=event,
            op=op,
            phase=phase,
            iteration=iteration,
            name=names,
            release=release,
            rank=np.full(start.size, rank),
        )
        has_event = event >= 0
        row_to_node[event[has_event]] = ids[has_event]


def _build_gpu_lanes(
    table: EventTable,
    rank: int,
    origin: int,
    phases: np.ndarray,
    klass: np.ndarray,
    acc: _Acc,
    lanes: list[Lane],
    row_to_node: np.ndarray,
) -> None:
    rows = np.flatnonzero((table.rank == rank) & table.is_gpu())
    if rows.size == 0:
        return
    keys = np.stack([table.pid[rows], table.tid[rows]], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    gk = np.array(
        [_GPU_KIND_OF.get(int(k), GpuKind.NONE) for k in range(int(Kind.OTHER) + 1)], dtype=np.int8
    )
    for t_idx in range(uniq.shape[0]):
        dev, stream = int(uniq[t_idx, 0]), int(uniq[t_idx, 1])
        lrows = rows[inv == t_idx]
        lrows = lrows[np.lexsort((table.dur[lrows], table.ts[lrows]))]
        lane = len(lanes)
        lanes.append(
            Lane(rank=rank, is_gpu=True, pid=dev, tid=stream, name=f"GPU {dev} stream {stream}")
        )
        start = table.ts[lrows] - origin
        gkind = gk[table.kind[lrows]]
        ids = acc.add(
            kind=np.full(lrows.size, NodeKind.GPU),
            lane=np.full(lrows.size, lane),
            order=start.astype(np.float64),
            launch_order=start.astype(np.float64),
            dur=table.dur[lrows],
            dur_measured=table.dur[lrows],
            start_measured=start,
            event=lrows,
            op=NONE,
            phase=phases[lrows],
            iteration=table.iteration[lrows],
            name=table.name[lrows],
            gpu_kind=gkind,
            klass=np.where(gkind == GpuKind.KERNEL, klass[table.name[lrows]], NONE),
            nbytes=np.maximum(table.nbytes[lrows], 0),
            rank=np.full(lrows.size, rank),
        )
        row_to_node[lrows] = ids


def _link_launches(table: EventTable, graph: Graph, row_to_node: np.ndarray) -> None:
    """GPU node -> node of the outermost runtime call that launched it."""
    c = graph.cols
    gpu = np.flatnonzero(c["kind"] == NodeKind.GPU)
    rows = c["event"][gpu]
    lrow = table.launch[rows].astype(np.int64)
    # A launch recorded on a nested driver call belongs to its outermost runtime call.
    is_rt = np.isin(table.kind, _RT_KINDS)
    for _ in range(3):
        nested = (lrow >= 0) & (row_to_node[np.maximum(lrow, 0)] < 0)
        if not nested.any():
            break
        p = table.parent[lrow[nested]]
        lrow[nested] = np.where((p >= 0) & is_rt[np.maximum(p, 0)], p, NONE)
    lnode = np.where(lrow >= 0, row_to_node[np.maximum(lrow, 0)], NONE)
    c["launch"][gpu] = lnode
    has = lnode >= 0
    c["kind"][lnode[has]] = NodeKind.LAUNCH
    c["launch_order"][gpu[has]] = c["order"][lnode[has]]
    # GPU work takes the op, phase and iteration of the call that launched it.
    c["op"][gpu[has]] = c["op"][lnode[has]]
    launched_phase = c["phase"][lnode[has]]
    own = c["phase"][gpu[has]]
    c["phase"][gpu[has]] = np.where(own == Phase.COMMUNICATION, own, launched_phase)


def _attribute_names(table: EventTable, graph: Graph, scopes: np.ndarray) -> None:
    """Op name and module/annotation scope of every node (GPU work: its launcher's)."""
    c = graph.cols
    op = c["op"]
    has = op >= 0
    c["op_name"][has] = table.name[op[has]]
    c["scope"][has] = scopes[op[has]]
    ev = c["event"]
    own = (ev >= 0) & (c["kind"] != NodeKind.GPU)
    c["scope"][own] = np.where(scopes[ev[own]] >= 0, scopes[ev[own]], c["scope"][own])
    gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & (c["launch"] >= 0))
    c["op_name"][gpu] = c["op_name"][c["launch"][gpu]]
    c["scope"][gpu] = c["scope"][c["launch"][gpu]]


def _classify_runtime(table: EventTable, graph: Graph, row_to_node: np.ndarray) -> None:
    """Mark synchronizing runtime calls and what they wait for."""
    c = graph.cols
    rt_nodes = np.flatnonzero((c["kind"] == NodeKind.RUNTIME) | (c["kind"] == NodeKind.LAUNCH))
    names = graph.names
    # cuda_sync rows (recent Kineto) say exactly which stream a sync waited for.
    sync_rows = table.rows(Kind.CUDA_SYNC)
    sync_info: dict[tuple[int, int], tuple[str, int, int]] = {}
    for r in sync_rows.tolist():
        corr = int(table.correlation[r])
        if corr >= 0:
            sync_info[(int(table.rank[r]), corr)] = (
                table.name_of(r),
                int(table.pid[r]),
                int(table.tid[r]),
            )
    lane_of = graph.lane_index(gpu=True)
    # Sync kind per name, so only synchronizing calls are visited one by one.
    per_name = np.full(len(names), SyncKind.NONE, dtype=np.int8)
    for idx in np.unique(c["name"][rt_nodes]).tolist():
        nm = names[idx]
        if _DEVICE_SYNC.search(nm):
            per_name[idx] = SyncKind.DEVICE
        elif _STREAM_SYNC.search(nm):
            per_name[idx] = SyncKind.STREAM
        elif _BLOCKING_COPY.search(nm):
            per_name[idx] = SyncKind.COPY
    kinds = per_name[c["name"][rt_nodes]]
    # A copy call blocks only if it launched its copy (checked when it is split).
    kinds[(kinds == SyncKind.COPY) & (c["kind"][rt_nodes] != NodeKind.LAUNCH)] = SyncKind.NONE
    for node, kind in zip(
        rt_nodes[kinds != SyncKind.NONE].tolist(), kinds[kinds != SyncKind.NONE].tolist()
    ):
        lane = NONE
        if kind == SyncKind.STREAM:
            row = int(c["event"][node])
            info = sync_info.get((int(c["rank"][node]), int(table.correlation[row])))
            if info is not None:
                if info[0] == "Context Sync":
                    kind = SyncKind.DEVICE
                else:
                    lane = lane_of.get((int(c["rank"][node]), info[1], info[2]), NONE)
        c["sync_kind"][node] = kind
        c["sync_lane"][node] = lane
        if c["kind"][node] == NodeKind.RUNTIME:
            c["kind"][node] = NodeKind.SYNC


def _split_blocking_copies(graph: Graph) -> None:
    """A copy call that returned only after its copy ended = a launch, then a wait.

    Two nodes so that the copy can start after the launch part while the wait
    part ends after the copy (one node would depend on itself).
    """
    c = graph.cols
    cand = np.flatnonzero(c["sync_kind"] == SyncKind.COPY)
    c["sync_kind"][cand] = SyncKind.NONE
    if cand.size == 0:
        return
    gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & (c["launch"] >= 0))
    copy_end: dict[int, int] = {}
    for gnode, lnode in zip(gpu.tolist(), c["launch"][gpu].tolist()):
        e = int(c["start_measured"][gnode] + c["dur_measured"][gnode])
        copy_end[lnode] = max(copy_end.get(lnode, e), e)
    start = c["start_measured"]
    blocking = [
        int(n)
        for n in cand.tolist()
        if n in copy_end
        and start[n] + c["dur_measured"][n] >= copy_end[n]
        and c["dur_measured"][n] > SYNC_MIN_NS
    ]
    if not blocking:
        return
    b = np.array(blocking)
    d = c["dur_measured"][b]
    launch_part = np.minimum(d, SYNC_MIN_NS)
    graph.append(
        kind=NodeKind.SYNC,
        lane=c["lane"][b],
        order=c["order"][b] + 0.5,
        dur=d - launch_part,
        dur_measured=d - launch_part,
        start_measured=start[b] + launch_part,
        source=int(Source.MEASURED),
        event=NONE,
        op=c["op"][b],
        phase=c["phase"][b],
        iteration=c["iteration"][b],
        name=c["name"][b],
        sync_kind=int(SyncKind.COPY),
        launch=b,  # for a COPY sync: the launch whose copies it waits for
        rank=c["rank"][b],
    )
    c = graph.cols
    c["dur"][b] = launch_part
    c["dur_measured"][b] = launch_part


def _cross_stream_edges(table: EventTable, graph: Graph, row_to_node: np.ndarray) -> dict[int, int]:
    """GPU node -> GPU node on another stream it waits for (event record / stream wait)."""
    c = graph.cols
    out: dict[int, int] = {}
    gpu = np.flatnonzero(c["kind"] == NodeKind.GPU)
    if gpu.size == 0:
        return out
    # Per lane, GPU nodes sorted by when they were enqueued.
    lane_nodes: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for lane in np.unique(c["lane"][gpu]).tolist():
        nodes = gpu[c["lane"][gpu] == lane]
        nodes = nodes[np.argsort(c["launch_order"][nodes], kind="stable")]
        lane_nodes[lane] = (nodes, c["launch_order"][nodes])
    lane_of = graph.lane_index(gpu=True)

    def last_before(lane: int, t: float) -> int:
        nodes, keys = lane_nodes.get(lane, (None, None))
        if nodes is None:
            return NONE
        i = int(np.searchsorted(keys, t, side="right")) - 1
        return int(nodes[i]) if i >= 0 else NONE

    def first_after(lane: int, t: float) -> int:
        nodes, keys = lane_nodes.get(lane, (None, None))
        if nodes is None:
            return NONE
        i = int(np.searchsorted(keys, t, side="left"))
        return int(nodes[i]) if i < nodes.size else NONE

    # (a) cuda_sync "Stream Wait Event" rows name both streams.
    corr_to_rt: dict[tuple[int, int], int] = {}
    rt_rows = np.flatnonzero(np.isin(table.kind, _RT_KINDS) & (table.correlation >= 0))
    for r, rk, corr in zip(
        rt_rows.tolist(), table.rank[rt_rows].tolist(), table.correlation[rt_rows].tolist()
    ):
        corr_to_rt[(rk, corr)] = r
    used_exact = False
    for r in table.rows(Kind.CUDA_SYNC).tolist():
        if table.wait_corr[r] < 0 or table.wait_stream[r] < 0:
            continue
        rk = int(table.rank[r])
        rec = corr_to_rt.get((rk, int(table.wait_corr[r])))
        wait = corr_to_rt.get((rk, int(table.correlation[r])))
        if rec is None or wait is None or row_to_node[rec] < 0 or row_to_node[wait] < 0:
            continue
        src_lane = lane_of.get((rk, int(table.pid[r]), int(table.wait_stream[r])))
        dst_lane = lane_of.get((rk, int(table.pid[r]), int(table.tid[r])))
        if src_lane is None or dst_lane is None or src_lane == dst_lane:
            continue
        src = last_before(src_lane, c["order"][row_to_node[rec]])
        dst = first_after(dst_lane, c["order"][row_to_node[wait]])
        if src >= 0 and dst >= 0:
            out[dst] = src
            used_exact = True
    if used_exact:
        return out
    # (b) cudaEventRecord ... cudaStreamWaitEvent pairs in one thread's program order.
    names = graph.names
    cpu_lanes = [i for i, ln in enumerate(graph.lanes) if not ln.is_gpu]
    launches = np.flatnonzero(c["kind"] == NodeKind.LAUNCH)
    first_gpu_of = {}
    for g in gpu[c["launch"][gpu] >= 0].tolist():
        first_gpu_of.setdefault(int(c["launch"][g]), g)
    rt_like = np.flatnonzero((c["kind"] == NodeKind.RUNTIME) | (c["kind"] == NodeKind.LAUNCH))
    for lane in cpu_lanes:
        nodes = rt_like[c["lane"][rt_like] == lane]
        if nodes.size == 0:
            continue
        nodes = nodes[np.argsort(c["order"][nodes], kind="stable")]
        lnodes = launches[c["lane"][launches] == lane]
        lnodes = lnodes[np.argsort(c["order"][lnodes], kind="stable")]
        lkeys = c["order"][lnodes]
        last_record_src = NONE
        pending_wait = False
        for node in nodes.tolist():
            nm = names[int(c["name"][node])]
            if _EVENT_RECORD.search(nm):
                i = int(np.searchsorted(lkeys, c["order"][node], side="left")) - 1
                last_record_src = first_gpu_of.get(int(lnodes[i]), NONE) if i >= 0 else NONE
                # The event captures the last work launched before it, on that stream.
                if last_record_src >= 0:
                    lane_src = int(c["lane"][last_record_src])
                    last_record_src = last_before(lane_src, c["order"][node])
            elif _STREAM_WAIT.search(nm):
                pending_wait = last_record_src >= 0
            elif pending_wait and node in first_gpu_of:
                dst = first_gpu_of[node]
                if c["lane"][dst] != c["lane"][last_record_src]:
                    out[dst] = last_record_src
                pending_wait = False
    return out


def _gpu_weights(
    graph: Graph,
    cross: dict[int, int],
    unresolved: dict[str, int],
    edges: list[tuple[np.ndarray, np.ndarray, np.ndarray, int, bool]],
) -> None:
    """Launch and stream-order weights, and which dependency explains each start."""
    c = graph.cols
    gpu = np.flatnonzero(c["kind"] == NodeKind.GPU)
    if gpu.size == 0:
        return
    start = c["start_measured"]
    end = start + c["dur"]
    # Stream predecessor in stream order.
    gl = c["lane"][gpu]
    order = np.lexsort((c["order"][gpu], gl))
    g = gpu[order]
    prev = np.full(g.size, NONE, dtype=np.int64)
    same = gl[order][1:] == gl[order][:-1]
    prev[1:][same] = g[:-1][same]
    launch = c["launch"][g].astype(np.int64)
    has_l = launch >= 0
    has_p = prev >= 0
    s_l = np.where(has_l, start[g] - end[np.maximum(launch, 0)], 0)
    s_s = np.where(has_p, start[g] - end[np.maximum(prev, 0)], 0)
    # Nominal latencies, measured on this trace where it shows them.
    launch_bound = has_l & (~has_p | (s_s > s_l)) & (s_l >= 0)
    lat = (
        int(np.median(s_l[launch_bound])) if launch_bound.sum() >= 5 else DEFAULT_LAUNCH_LATENCY_NS
    )
    lat = int(np.clip(lat, 0, 50_000))
    stream_bound = has_p & (~has_l | (s_l > s_s)) & (s_s >= 0)
    gap = int(np.median(s_s[stream_bound])) if stream_bound.sum() >= 5 else DEFAULT_STREAM_GAP_NS
    gap = int(np.clip(gap, 0, 20_000))

    _infer_cross_stream(
        graph,
        g,
        start,
        end,
        np.where(has_l, s_l - lat, np.iinfo(np.int64).max),
        np.where(has_p, s_s - gap, np.iinfo(np.int64).max),
        cross,
        unresolved,
    )
    x_src = np.array([cross.get(int(n), NONE) for n in g.tolist()], dtype=np.int64)
    has_x = x_src >= 0
    s_x = np.where(has_x, start[g] - end[np.maximum(x_src, 0)], 0)
    big = np.iinfo(np.int64).max // 4
    n_l = np.where(has_l, s_l - lat, big)
    n_s = np.where(has_p, s_s - gap, big)
    n_x = np.where(has_x, s_x - gap, big)
    best = np.argmin(np.stack([n_l, n_s, n_x]), axis=0)
    none = ~has_l & ~has_p & ~has_x
    c["launch_w"][g] = np.where(best == 0, s_l, np.minimum(s_l, lat))
    c["stream_w"][g] = np.where(best == 1, s_s, np.minimum(s_s, gap))
    x_w = np.where(best == 2, s_x, np.minimum(s_x, gap))
    # With nothing to explain its start, a task starts where it did.
    c["release"][g[none]] = start[g[none]]
    unresolved["gpu_without_launch"] += int((~has_l).sum())
    slack = np.min(np.stack([n_l, n_s, n_x]), axis=0)
    unresolved["gpu_start_unexplained"] += int(((slack > UNEXPLAINED_TOL_NS) & ~none).sum())
    if has_x.any():
        edges.append((x_src[has_x], g[has_x], x_w[has_x], int(EdgeType.CROSS_STREAM), False))
    graph.nominal.update(launch_latency_ns=lat, stream_gap_ns=gap)
    graph.assumptions.append(
        f"launch latency {lat / 1000:.1f} µs and back-to-back kernel gap {gap / 1000:.1f} µs "
        "(medians measured on this trace)"
    )


def _infer_cross_stream(
    graph: Graph,
    g: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    n_l: np.ndarray,
    n_s: np.ndarray,
    cross: dict[int, int],
    unresolved: dict[str, int],
) -> None:
    """Timing fallback for starts neither the launch nor the stream explains.

    A task that began right after work on another stream of its device ended
    most likely waited for it (an event the trace does not record). Counted.
    """
    c = graph.cols
    late = (np.minimum(n_l, n_s) > UNEXPLAINED_TOL_NS) & ~np.isin(g, list(cross))
    if not late.any():
        return
    for rank in np.unique(c["rank"][g[late]]).tolist():
        on_rank = g[c["rank"][g] == rank]
        order = on_rank[np.argsort(end[on_rank], kind="stable")]
        ends = end[order]
        lanes = c["lane"][order]
        for node in g[late & (c["rank"][g] == rank)].tolist():
            i = int(np.searchsorted(ends, start[node], side="right")) - 1
            while i >= 0 and lanes[i] == c["lane"][node]:
                i -= 1
            if i >= 0 and start[node] - ends[i] <= UNEXPLAINED_TOL_NS:
                cross[node] = int(order[i])
                unresolved["cross_stream_inferred"] = unresolved.get("cross_stream_inferred", 0) + 1


def _sync_weights(graph: Graph, unresolved: dict[str, int]) -> None:
    """How long each synchronization waited after the GPU work it waited for ended."""
    c = graph.cols
    sync = np.flatnonzero(c["sync_kind"] != SyncKind.NONE)
    if sync.size == 0:
        return
    targets, infer_lane = resolve_sync_targets(graph, sync, infer=True)
    for node, lane in infer_lane.items():
        c["sync_lane"][node] = lane
    start = c["start_measured"]
    end_meas = start + c["dur_measured"]
    for i, node in enumerate(sync.tolist()):
        t = targets[i]
        if not t:
            unresolved["sync_without_target"] += 1
            c["sync_kind"][node] = SyncKind.NONE
            if c["kind"][node] == NodeKind.SYNC:
                c["kind"][node] = NodeKind.RUNTIME
            continue
        t_end = max(int(start[x] + c["dur_measured"][x]) for x in t)
        s, e = int(start[node]), int(end_meas[node])
        d = e - s
        if t_end > s + SYNC_MIN_NS:  # it waited: its own cost is small
            c["dur"][node] = min(d, SYNC_MIN_NS)
            c["sync_w"][node] = e - t_end
        else:  # it did not wait: it keeps its time, and would wait if work ran later
            c["dur"][node] = d
            c["sync_w"][node] = min(e - t_end, SYNC_MIN_NS)


def _cross_thread_waits(
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
        for gnode in gaps.tolist():
            ge, gs, gl = int(end[gnode]), int(start[gnode]), int(c["lane"][gnode])
            i = int(np.searchsorted(cend, ge, side="right")) - 1
            while i >= 0 and clane[i] == gl:
                i -= 1
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


def _forward_backward_edges(
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


def _iteration_spans(
    table: EventTable, graph: Graph, row_to_node: np.ndarray
) -> list[IterationSpan]:
    c = graph.cols
    spans = []
    start = c["start_measured"]
    end = start + c["dur_measured"]
    step_rows = np.flatnonzero(np.isin(table.kind, _OP_KINDS))
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
