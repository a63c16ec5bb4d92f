"""GPU kernel breakdown: time by kind (computation / communication / memory), the time each
mix of kinds ran at once, and the top kernels of each kind with their spread across ranks.

Kinds follow HTA's convention: communication is NCCL/RCCL (or kernels carrying collective
arguments), memory is copies and memsets, everything else is computation. The whole trace of
each rank is counted, as HTA does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfcast.analysis.common import KINDS, NS_PER_MS, NS_PER_US, gpu_kind_codes, group_stats
from perfcast.analysis.notes import input_notes
from perfcast.events import EventTable
from perfcast.frames import Tables, plain


@dataclass
class KindTime:
    """GPU time of one kind of kernel (computation, communication, memory) on a rank:
    count, summed ms and % of the rank's summed GPU time."""

    rank: int
    kind: str
    count: int
    total_ms: float  # summed kernel durations (overlaps count twice)
    pct: float  # of the rank's summed GPU time


@dataclass
class OverlapTime:
    """Wall time (ms, and % of the busy GPU time) during which exactly this mix of kernel
    kinds ran on a rank."""

    rank: int
    kinds: str  # e.g. "computation", "computation + communication"
    time_ms: float  # wall time during which exactly these kinds ran
    pct: float  # of the rank's busy GPU time


@dataclass
class KernelStats:
    """One of a rank's top kernels of a kind: count, total ms, duration statistics in µs,
    and % of the rank's time in kernels of that kind."""

    rank: int
    kind: str
    name: str
    count: int
    total_ms: float
    mean_us: float
    min_us: float
    max_us: float
    std_us: float
    pct: float  # of the rank's time in kernels of this kind


@dataclass
class KernelAcrossRanks:
    """One kernel's GPU ms on every rank: total, min / median / max per rank, the busiest
    rank and the spread in %."""

    kind: str
    name: str
    ranks: int  # ranks that ran it
    total_ms: float  # summed over ranks
    # Over every rank with GPU work, those that never ran it at 0 ms (a kernel only some
    # ranks run is the imbalance this table is for).
    min_rank_ms: float
    median_rank_ms: float
    max_rank_ms: float
    max_rank: int  # the rank with the most time in it
    spread_pct: float  # (max - min) / median of the per-rank totals (0 median: of the max)


@dataclass(repr=False)
class KernelBreakdown(Tables):
    """Result of `kernel_breakdown`; tables: by_kind, overlap, top, across_ranks."""

    by_kind: list[KindTime]
    overlap: list[OverlapTime]
    top: list[KernelStats]
    across_ranks: list[KernelAcrossRanks]
    notes: list[str] = field(default_factory=list)

    ROW_TYPES = {  # noqa: RUF012
        "by_kind": KindTime,
        "overlap": OverlapTime,
        "top": KernelStats,
        "across_ranks": KernelAcrossRanks,
    }


def kernel_breakdown(table: EventTable, top: int = 10) -> KernelBreakdown:
    """Kernel time by kind, the overlap of kinds, and the `top` kernels of each kind.

    >>> import perfcast
    >>> r = kernel_breakdown(perfcast.load("perfcast/examples/ddp_a100_rank0.json.gz"))
    >>> sorted({row.kind for row in r.by_kind}) # doctest: +SKIP
    ['communication', 'computation', 'memory']
    """
    kind = gpu_kind_codes(table)
    gpu = np.flatnonzero(kind >= 0)
    g_kind = kind[gpu].astype(np.int64)
    g_rank = table.rank[gpu].astype(np.int64)
    g_name = table.name[gpu].astype(np.int64)
    dur = table.dur[gpu]
    ranks = table.rank_ids()
    out = KernelBreakdown([], [], [], [], notes=input_notes(table))

    # Kind totals per rank.
    g = group_stats(g_rank * 4 + g_kind, dur)
    rank_total = {r: float(dur[g_rank == r].sum()) for r in ranks}
    for key, cnt, tot in zip(g.keys.tolist(), g.count.tolist(), g.sum.tolist()):
        r, k = divmod(key, 4)
        out.by_kind.append(
            KindTime(r, KINDS[k], cnt, tot / NS_PER_MS, 100.0 * tot / (rank_total[r] or 1.0))
        )

    # Wall time of each mix of kinds (HTA's "computation overlapping communication").
    for r in ranks:
        on = g_rank == r
        out.overlap.extend(_overlap_rows(r, table.ts[gpu][on], dur[on], g_kind[on]))

    # Top kernels per (rank, kind): chosen by their total over all ranks.
    n_names = len(table.names)
    n_gpu_ranks = int(np.unique(g_rank).size)
    stats = group_stats((g_rank * 4 + g_kind) * n_names + g_name, dur)
    s_rank, rest = np.divmod(stats.keys, 4 * n_names)
    s_kind, s_name = np.divmod(rest, n_names)
    kind_total = {(row.rank, row.kind): row.total_ms for row in out.by_kind}
    for k in range(len(KINDS)):
        in_kind = s_kind == k
        if not in_kind.any():
            continue
        overall = group_stats(s_name[in_kind], stats.sum[in_kind])
        chosen = overall.keys[np.argsort(-overall.sum, kind="stable")[:top]]
        for nm in chosen.tolist():
            sel = np.flatnonzero(in_kind & (s_name == nm))
            per_rank = stats.sum[sel]
            for i in sel.tolist():
                r = int(s_rank[i])
                total_ms = stats.sum[i] / NS_PER_MS
                out.top.append(
                    KernelStats(
                        rank=r,
                        kind=KINDS[k],
                        name=table.names[nm],
                        count=int(stats.count[i]),
                        total_ms=total_ms,
                        mean_us=stats.mean[i] / NS_PER_US,
                        min_us=stats.min[i] / NS_PER_US,
                        max_us=stats.max[i] / NS_PER_US,
                        std_us=stats.std[i] / NS_PER_US,
                        pct=100.0 * total_ms / (kind_total.get((r, KINDS[k])) or 1.0),
                    )
                )
            ran = per_rank
            idle_ranks = n_gpu_ranks - sel.size
            if idle_ranks > 0:
                per_rank = np.concatenate([per_rank, np.zeros(idle_ranks)])
            med = float(np.median(per_rank))
            out.across_ranks.append(
                KernelAcrossRanks(
                    kind=KINDS[k],
                    name=table.names[nm],
                    ranks=int(sel.size),
                    total_ms=float(per_rank.sum()) / NS_PER_MS,
                    min_rank_ms=float(per_rank.min()) / NS_PER_MS,
                    median_rank_ms=med / NS_PER_MS,
                    max_rank_ms=float(per_rank.max()) / NS_PER_MS,
                    max_rank=int(s_rank[sel[int(np.argmax(ran))]]),
                    spread_pct=100.0
                    * float(per_rank.max() - per_rank.min())
                    / (med or float(per_rank.max()) or 1.0),
                )
            )
    return plain(out)


def _overlap_rows(
    rank: int, start: np.ndarray, dur: np.ndarray, kind: np.ndarray
) -> list[OverlapTime]:
    """Sweep over the union of each kind's intervals; a bit per kind says what runs."""
    from perfcast.analysis import intervals as iv

    t_parts, d_parts = [], []
    for k in range(len(KINDS)):
        m = kind == k
        if not m.any():
            continue
        us, ue = iv.union(start[m], start[m] + dur[m])
        t_parts += [us, ue]
        d_parts += [np.full(us.size, 1 << k), np.full(ue.size, -(1 << k))]
    if not t_parts:
        return []
    t = np.concatenate(t_parts)
    d = np.concatenate(d_parts)
    order = np.argsort(t, kind="stable")
    t, d = t[order], d[order]
    state = np.cumsum(d)[:-1]
    span = np.diff(t)
    busy = float(span[state > 0].sum()) or 1.0
    g = group_stats(state[state > 0], span[state > 0])
    rows = []
    for s, tot in zip(g.keys.tolist(), g.sum.tolist()):
        if tot <= 0:
            continue
        label = " + ".join(KINDS[k] for k in range(len(KINDS)) if s & (1 << k))
        rows.append(OverlapTime(rank, label, tot / NS_PER_MS, 100.0 * tot / busy))
    rows.sort(key=lambda r: -r.time_ms)
    return rows
