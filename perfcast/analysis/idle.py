"""GPU idle time per stream, split by cause, with statistics of the idle intervals.

Each gap between consecutive GPU operations (kernels, copies, memsets) on one stream is
classified as HTA defines it (HolisticTraceAnalysis, `get_idle_time_breakdown`):

- host wait: the runtime call that launched the next operation started after the previous
  one ended: the CPU had not enqueued it yet;
- kernel wait: otherwise, a gap shorter than `kernel_gap_ns`: the cost of starting
  back-to-back kernels. HTA's default is "30", documented as ns but applied to its
  microsecond timestamps, so 30 µs in effect; the default here is the same 30 µs;
- other: the rest (waits on other streams or events, launches whose call is unknown).

The whole trace of each rank is analysed; gaps are measured between the first and the last
operation of each stream. Overlapping operations on a stream (rare) give no gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfcast.analysis.common import (
    NS_PER_MS,
    NS_PER_US,
    group_stats,
    percentiles_by_group,
)
from perfcast.analysis.notes import input_notes
from perfcast.arrays import combine_codes
from perfcast.events import EventTable
from perfcast.frames import Tables, plain

CATEGORIES = ("host wait", "kernel wait", "other")


@dataclass
class StreamIdle:
    """One GPU stream's span, busy and idle time (ms), idle split into host wait, kernel
    wait and other, and idle % of the span."""

    rank: int
    device: int
    stream: int
    operations: int
    span_ms: float  # first start to last end on the stream
    busy_ms: float
    idle_ms: float
    host_wait_ms: float
    kernel_wait_ms: float
    other_ms: float
    idle_pct: float  # of the span


@dataclass
class IdleIntervals:
    """Statistics of one stream's idle intervals of one category: count, total ms and
    durations in µs."""

    rank: int
    device: int
    stream: int
    category: str
    count: int
    total_ms: float
    mean_us: float
    std_us: float
    min_us: float
    p25_us: float
    p50_us: float
    p75_us: float
    max_us: float


@dataclass(repr=False)
class IdleTime(Tables):
    """Result of `idle_time`; tables: by_stream, intervals."""

    by_stream: list[StreamIdle]
    intervals: list[IdleIntervals]
    kernel_gap_ns: int
    notes: list[str] = field(default_factory=list)

    ROW_TYPES = {"by_stream": StreamIdle, "intervals": IdleIntervals}  # noqa: RUF012


def idle_time(table: EventTable, kernel_gap_ns: int = 30_000) -> IdleTime:
    """Idle time of every GPU stream split into host wait, kernel wait and other.

    >>> import perfcast
    >>> r = idle_time(perfcast.load("perfcast/examples/ddp_a100_rank0.json.gz"))
    >>> r.by_stream[0].idle_ms >= 0                               # doctest: +SKIP
    True
    """
    gpu = np.flatnonzero(table.is_gpu())
    out = IdleTime([], [], kernel_gap_ns, notes=input_notes(table))
    if gpu.size == 0:
        return out
    rank = table.rank[gpu].astype(np.int64)
    dev = table.pid[gpu]
    stream = table.tid[gpu]
    # One integer per (rank, device, stream), then rows sorted by stream and start.
    lane, lanes = combine_codes(rank, dev, stream)
    ts = table.ts[gpu]
    order = np.lexsort((ts, lane))
    rows, lane, ts = gpu[order], lane[order], ts[order]
    end = ts + table.dur[rows]
    same = np.r_[False, lane[1:] == lane[:-1]]
    starts = np.flatnonzero(~same)
    # Gaps are measured from the latest end so far on the stream (the previous operation's).
    prev_end = _segment_running_max_prev(end, starts)
    gap = np.where(same, ts - np.where(same, prev_end, ts), 0)
    has_gap = same & (gap > 0)
    launch = table.launch[rows]
    launch_ts = np.where(launch >= 0, table.ts[np.maximum(launch, 0)], np.iinfo(np.int64).min)
    host = has_gap & (launch >= 0) & (launch_ts > prev_end)
    kern = has_gap & ~host & (gap < kernel_gap_ns)
    cat = np.full(rows.size, -1, dtype=np.int64)
    cat[has_gap] = 2
    cat[kern] = 1
    cat[host] = 0

    n_lanes = lanes.shape[0]
    span_lo = np.minimum.reduceat(ts, starts)
    span_hi = np.maximum.reduceat(end, starts)
    busy = _busy_per_lane(ts, end, lane, n_lanes)
    cat_tot = np.zeros((n_lanes, 3))
    sel = cat >= 0
    np.add.at(cat_tot, (lane[sel], cat[sel]), gap[sel])
    counts = np.bincount(lane, minlength=n_lanes)
    for i in range(n_lanes):
        r, d, s = (int(x) for x in lanes[i])
        span = float(span_hi[i] - span_lo[i])
        idle = float(cat_tot[i].sum())
        out.by_stream.append(
            StreamIdle(
                rank=r,
                device=d,
                stream=s,
                operations=int(counts[i]),
                span_ms=span / NS_PER_MS,
                busy_ms=busy[i] / NS_PER_MS,
                idle_ms=idle / NS_PER_MS,
                host_wait_ms=cat_tot[i, 0] / NS_PER_MS,
                kernel_wait_ms=cat_tot[i, 1] / NS_PER_MS,
                other_ms=cat_tot[i, 2] / NS_PER_MS,
                idle_pct=100.0 * idle / (span or 1.0),
            )
        )
    key = lane[sel] * 3 + cat[sel]
    g = group_stats(key, gap[sel])
    q = percentiles_by_group(key, gap[sel], (25, 50, 75))
    for j, k in enumerate(g.keys.tolist()):
        i, c = divmod(k, 3)
        r, d, s = (int(x) for x in lanes[i])
        out.intervals.append(
            IdleIntervals(
                rank=r,
                device=d,
                stream=s,
                category=CATEGORIES[c],
                count=int(g.count[j]),
                total_ms=g.sum[j] / NS_PER_MS,
                mean_us=g.mean[j] / NS_PER_US,
                std_us=g.std[j] / NS_PER_US,
                min_us=g.min[j] / NS_PER_US,
                p25_us=q[j, 0] / NS_PER_US,
                p50_us=q[j, 1] / NS_PER_US,
                p75_us=q[j, 2] / NS_PER_US,
                max_us=g.max[j] / NS_PER_US,
            )
        )
    return plain(out)


def _segment_running_max_prev(end: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per element, the largest `end` of the earlier elements of its segment (first: min)."""
    # Offsetting each segment above all earlier ones makes one global running max restart.
    seg = np.zeros(end.size, dtype=np.int64)
    seg[starts[1:]] = 1
    seg = np.cumsum(seg)
    lo = int(end.min()) if end.size else 0
    span = (int(end.max()) - lo + 1) if end.size else 1
    shifted = (end - lo) + seg * span
    run = np.maximum.accumulate(shifted)
    prev = np.r_[np.iinfo(np.int64).min, run[:-1]]
    prev = prev - seg * span + lo
    first = np.zeros(end.size, dtype=bool)
    first[starts] = True
    return np.where(first, np.iinfo(np.int64).min, prev)


def _busy_per_lane(ts: np.ndarray, end: np.ndarray, lane: np.ndarray, n: int) -> np.ndarray:
    """Union length of the intervals of each lane (rows sorted by lane, then start)."""
    starts = np.flatnonzero(np.r_[True, lane[1:] != lane[:-1]])
    prev = _segment_running_max_prev(end, starts)
    # Each interval adds the part of it past everything before it on its lane.
    add = end - np.maximum(ts, prev)
    add = np.where(end > prev, np.minimum(add, end - ts), 0)
    return np.bincount(lane, weights=np.maximum(add, 0), minlength=n)
