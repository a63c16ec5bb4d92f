"""Synchronizations and waits: runtime calls that block the CPU, and GPU-to-GPU waits.

A synchronizing call ends when the GPU work it waits for ends (resolved again at replay time,
see `graph.resolve`); a blocking copy is a launch followed by such a wait; a stream waits for
an event recorded on another stream (from `cuda_sync` rows or event record / wait pairs).
"""

from __future__ import annotations

import re

import numpy as np

from perfcast.arrays import split_by
from perfcast.events import NONE, EventTable, Kind
from perfcast.graph.lanes import RT_KINDS
from perfcast.graph.model import Graph, NodeKind, Source, SyncKind
from perfcast.graph.resolve import resolve_sync_targets

# Freeing device or pinned memory waits for all work on the device (CUDA runtime API docs:
# cudaFree and cudaFreeHost synchronize implicitly); the stream-ordered cudaFreeAsync does not.
_DEVICE_SYNC = re.compile(
    r"^(cuda|hip)DeviceSynchronize$|^cu(Ctx)?Synchronize$|CtxSynchronize"
    r"|^(cuda|hip)Free(Host)?$|^hipHostFree$|^cuMemFree(Host)?(_v2)?$"
)


_STREAM_SYNC = re.compile(r"^(cuda|hip|cu)(Stream|Event)Synchronize$")


_BLOCKING_COPY = re.compile(r"^(cuda|hip)Memcpy$|^(cuda|hip)Memcpy(2D|3D)?(Async|WithStream)?$")


_EVENT_RECORD = re.compile(r"^(cuda|hip|cu)EventRecord")


_STREAM_WAIT = re.compile(r"^(cuda|hip|cu)StreamWaitEvent")


SYNC_MIN_NS = 2_000  # CPU cost of a synchronization that did not have to wait


def classify_runtime(table: EventTable, graph: Graph, row_to_node: np.ndarray) -> None:
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


def split_blocking_copies(graph: Graph) -> None:
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


# A waiting task may start this long before the work it waits for ended (clock noise).
CONTRADICTION_TOL_NS = 1_000
# How far back on the recorded stream a contradicted wait looks for work that had ended.
RETARGET_LOOKBACK = 4_096


def cross_stream_edges(table: EventTable, graph: Graph, row_to_node: np.ndarray) -> dict[int, int]:
    """GPU node -> GPU node on another stream it waits for (event record / stream wait)."""
    c = graph.cols
    out: dict[int, int] = {}
    gpu = np.flatnonzero(c["kind"] == NodeKind.GPU)
    if gpu.size == 0:
        return out
    # Per lane, GPU nodes sorted by when they were enqueued.
    lane_nodes: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for lane, pos in split_by(c["lane"][gpu], c["launch_order"][gpu]):
        nodes = gpu[pos]
        lane_nodes[lane] = (nodes, c["launch_order"][nodes])
    lane_of = graph.lane_index(gpu=True)

    def last_before(lane: int, t: float) -> int:
        nodes, keys = lane_nodes.get(lane, (None, None))
        if nodes is None or keys is None:
            return NONE
        i = int(np.searchsorted(keys, t, side="right")) - 1
        return int(nodes[i]) if i >= 0 else NONE

    def first_after(lane: int, t: float) -> int:
        nodes, keys = lane_nodes.get(lane, (None, None))
        if nodes is None or keys is None:
            return NONE
        i = int(np.searchsorted(keys, t, side="left"))
        return int(nodes[i]) if i < nodes.size else NONE

    # (a) cuda_sync "Stream Wait Event" rows name both streams.
    corr_to_rt: dict[tuple[int, int], int] = {}
    rt_rows = np.flatnonzero(np.isin(table.kind, RT_KINDS) & (table.correlation >= 0))
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
    # The trace does not say which event a wait is for: DDP records each bucket's end event
    # when it launches the all-reduce and waits for it later, after newer records, so the
    # latest record can be work that ended milliseconds after the waiting task started (the
    # example's 19 such pairs). A wait the timeline contradicts is taken to be for the
    # latest work on that stream that had ended when the waiting task started.
    ends = c["start_measured"] + c["dur_measured"]

    def finished_before(src: int, dst: int) -> int:
        if ends[src] <= c["start_measured"][dst] + CONTRADICTION_TOL_NS:
            return src
        nodes, keys = lane_nodes[int(c["lane"][src])]
        # src and the work enqueued before it on its stream, the latest first
        i = int(np.searchsorted(keys, c["launch_order"][src], side="right"))
        lo = max(0, i - RETARGET_LOOKBACK)
        done = np.flatnonzero(ends[nodes[lo:i]] <= c["start_measured"][dst] + CONTRADICTION_TOL_NS)
        return int(nodes[lo + done[-1]]) if done.size else NONE

    names = graph.names
    # Which names record an event or wait for one, decided once per distinct name.
    is_record = np.array([bool(_EVENT_RECORD.search(n)) for n in names] + [False])
    is_wait = np.array([bool(_STREAM_WAIT.search(n)) for n in names] + [False])
    first_gpu_of: dict[int, int] = {}
    for g in gpu[c["launch"][gpu] >= 0].tolist():
        first_gpu_of.setdefault(int(c["launch"][g]), g)
    rt_like = np.flatnonzero((c["kind"] == NodeKind.RUNTIME) | (c["kind"] == NodeKind.LAUNCH))
    # A lane without a stream wait adds no edge; the others are grouped with one sort
    # (a mask per lane cost O(lanes x nodes): seconds on a thousand ranks).
    waiting_lanes = np.unique(c["lane"][rt_like[is_wait[c["name"][rt_like]]]])
    rt_like = rt_like[np.isin(c["lane"][rt_like], waiting_lanes)]
    for _, pos in split_by(c["lane"][rt_like], c["order"][rt_like]):
        nodes = rt_like[pos]
        lnodes = nodes[c["kind"][nodes] == NodeKind.LAUNCH]
        lkeys = c["order"][lnodes]
        last_record_src = NONE
        pending_wait = False
        for node, record, wait in zip(
            nodes.tolist(),
            is_record[c["name"][nodes]].tolist(),
            is_wait[c["name"][nodes]].tolist(),
            strict=True,
        ):
            if record:
                i = int(np.searchsorted(lkeys, c["order"][node], side="left")) - 1
                last_record_src = first_gpu_of.get(int(lnodes[i]), NONE) if i >= 0 else NONE
                # The event captures the last work launched before it, on that stream.
                if last_record_src >= 0:
                    lane_src = int(c["lane"][last_record_src])
                    last_record_src = last_before(lane_src, c["order"][node])
            elif wait:
                pending_wait = last_record_src >= 0
            elif pending_wait and node in first_gpu_of:
                dst = first_gpu_of[node]
                if c["lane"][dst] != c["lane"][last_record_src]:
                    src = finished_before(last_record_src, dst)
                    if src >= 0:
                        out[dst] = src
                pending_wait = False
    return out


def sync_weights(graph: Graph, unresolved: dict[str, int]) -> None:
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
