"""Program order: each CPU thread as a gap-free chain of nodes, each GPU stream in stream order.

A CPU thread is cut at every op boundary and runtime call, so each node belongs to one op
(its phase, module scope and iteration come with it); GPU lanes hold kernels, copies and
memsets sorted by start.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.arrays import combine_codes, sorted_unique
from perfcast.events import GPU_KINDS, NONE, EventTable, Kind
from perfcast.graph.model import (
    NO_RELEASE,
    NODE_COLUMNS,
    GpuKind,
    Lane,
    NodeKind,
    Source,
    column_default,
)
from perfcast.graph.phases import Phase

CPU_LANE_KINDS = np.array(
    [Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.RUNTIME, Kind.DRIVER], dtype=np.int8
)


OP_KINDS = np.array([Kind.CPU_OP, Kind.USER_ANNOTATION], dtype=np.int8)


RT_KINDS = np.array([Kind.RUNTIME, Kind.DRIVER], dtype=np.int8)


_GPU_KIND_OF = {
    int(Kind.KERNEL): GpuKind.KERNEL,
    int(Kind.MEMCPY): GpuKind.MEMCPY,
    int(Kind.MEMSET): GpuKind.MEMSET,
}


@dataclass
class NodeColumns:
    """Node columns being accumulated for all ranks."""

    parts: dict[str, list[np.ndarray]]
    n: int = 0

    def add(self, **cols: np.ndarray | int) -> np.ndarray:
        m = max(np.size(v) for v in cols.values())
        for key, dtype in NODE_COLUMNS.items():
            arr: np.ndarray
            # A scalar or default is kept as a zero-stride view: memory is spent once, in
            # columns(), not per part (a 1.7 M-event trace builds ~1 M nodes, 30 columns).
            value = cols[key] if key in cols else column_default(key, Source.MEASURED)
            arr = np.broadcast_to(np.asarray(value, dtype=dtype), (m,))
            self.parts.setdefault(key, []).append(arr)
        ids = np.arange(self.n, self.n + m)
        self.n += m
        return ids

    def columns(self) -> dict[str, np.ndarray]:
        """The accumulated columns; the parts are released column by column as they are
        joined, so the peak holds one column twice, not every column."""
        out: dict[str, np.ndarray] = {}
        for k, dt in NODE_COLUMNS.items():
            parts = self.parts.pop(k, None)
            out[k] = np.concatenate(parts).astype(dt, copy=False) if parts else np.zeros(0, dt)
        return out


def innermost_op(
    table: EventTable, ops_sorted: np.ndarray, a: np.ndarray, b: np.ndarray
) -> np.ndarray:
    """For each interval [a, b), the innermost op (row) on the thread that contains it."""
    out = np.full(a.shape[0], NONE, dtype=np.int64)
    if ops_sorted.size == 0 or a.size == 0:
        return out
    op_ts = table.ts[ops_sorted]
    cand = np.searchsorted(op_ts, a, side="right") - 1
    ends = table.ends()
    parent = table.parent
    is_op = table.kind_mask(OP_KINDS)
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


def build_cpu_lanes(
    table: EventTable,
    rank: int,
    origin: int,
    phases: np.ndarray,
    acc: NodeColumns,
    lanes: list[Lane],
    row_to_node: np.ndarray,
) -> None:
    on_rank = table.rank_rows(rank)
    rows = on_rank[table.kind_mask(CPU_LANE_KINDS)[on_rank]]
    if rows.size == 0:
        return
    inv, uniq = combine_codes(table.pid[rows], table.tid[rows])
    ts = table.ts
    end_all = table.ends()
    parent = table.parent
    is_rt = table.kind_mask(RT_KINDS)
    for t_idx in range(uniq.shape[0]):
        pid, tid = int(uniq[t_idx, 0]), int(uniq[t_idx, 1])
        trows = rows[inv == t_idx]
        rt = trows[is_rt[trows]]
        # Outermost runtime calls only (a driver call inside a runtime call is one call).
        rt = rt[~((parent[rt] >= 0) & is_rt[np.maximum(parent[rt], 0)])]
        rt = rt[np.argsort(ts[rt], kind="stable")]
        ops = trows[np.isin(table.kind[trows], OP_KINDS)]
        ops = ops[np.lexsort((-table.dur[ops], ts[ops]))]
        rt_s, rt_e = ts[rt], end_all[rt]
        points = sorted_unique(np.concatenate([ts[ops], end_all[ops], rt_s, rt_e]))
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
        seg_op = innermost_op(table, ops, seg_a, seg_b)
        # Runtime calls are attributed to the op they run in.
        rt_op = parent[rt].astype(np.int64)
        for _ in range(4):
            climb = (rt_op >= 0) & ~np.isin(table.kind[np.maximum(rt_op, 0)], OP_KINDS)
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


def build_gpu_lanes(
    table: EventTable,
    rank: int,
    origin: int,
    phases: np.ndarray,
    klass: np.ndarray,
    acc: NodeColumns,
    lanes: list[Lane],
    row_to_node: np.ndarray,
) -> None:
    on_rank = table.rank_rows(rank)
    rows = on_rank[table.kind_mask(GPU_KINDS)[on_rank]]
    if rows.size == 0:
        return
    inv, uniq = combine_codes(table.pid[rows], table.tid[rows])
    gk = np.array(
        [_GPU_KIND_OF.get(int(k), GpuKind.NONE) for k in range(max(Kind) + 1)], dtype=np.int8
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
