"""Launch-queue length per stream over time, and the time the CPU was blocked on a full queue.

Queue length on a stream = GPU operations launched but not yet finished: +1 when the runtime
call that enqueues one starts, −1 when the operation ends (HTA's definition,
`get_queue_length_time_series`). CUDA blocks a launch call while the queue is full (about
1,024 pending launches per stream, HTA's `CUDA_MAX_LAUNCH_QUEUE_PER_STREAM`): such a call
returns only when an operation on the stream ends and frees a slot. A CPU blocked there is
waiting on the GPU, not working. Two measures of it:

- `time_at_max_ms`: how long the queue length was at `max_depth` or above (HTA's
  `get_time_spent_blocked_on_full_queue`);
- `blocked_ms`: over the launch calls that started with the queue full, the part of each call
  until a slot freed (or the call returned, if sooner).

`launch_queue(table)` is the trace-side measurement; `queue_length_series` gives one
stream's full-resolution step function for models that need it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfcast.analysis.common import NS_PER_MS, downsample_steps
from perfcast.analysis.notes import input_notes
from perfcast.arrays import combine_codes
from perfcast.events import EventTable
from perfcast.frames import Tables, plain

CUDA_MAX_LAUNCH_QUEUE = 1024
SERIES_POINTS = 400


@dataclass
class StreamQueue:
    rank: int
    device: int
    stream: int
    launches: int
    max_length: int
    mean_length: float  # time-weighted, over the stream's first launch to last end
    p95_length: float  # time-weighted
    time_at_max_ms: float  # queue length >= max_depth
    blocked_calls: int
    blocked_ms: float


@dataclass
class QueuePoint:
    rank: int
    device: int
    stream: int
    t_ms: float  # from the rank's first event
    length: int  # from t_ms to the next point (the bin's maximum when downsampled)


@dataclass(repr=False)
class LaunchQueue(Tables):
    """Result of `launch_queue`; tables: by_stream, series (downsampled step functions)."""

    by_stream: list[StreamQueue]
    series: list[QueuePoint]
    max_depth: int
    notes: list[str] = field(default_factory=list)

    ROW_TYPES = {"by_stream": StreamQueue, "series": QueuePoint}  # noqa: RUF012


@dataclass
class _Stream:
    key: tuple[int, int, int]
    t: np.ndarray  # event times (sorted)
    q: np.ndarray  # queue length after each event
    is_launch: np.ndarray
    call_end: np.ndarray  # for launch events: when the call returned


def _streams(table: EventTable) -> list[_Stream]:
    gpu = np.flatnonzero(table.is_gpu() & (table.launch >= 0))
    if gpu.size == 0:
        return []
    call = table.launch[gpu].astype(np.int64)
    lane, lanes = combine_codes(table.rank[gpu].astype(np.int64), table.pid[gpu], table.tid[gpu])
    n = gpu.size
    # Events: launch (+1 at the call's start) and finish (−1 at the operation's end).
    t = np.r_[table.ts[call], table.ts[gpu] + table.dur[gpu]]
    d = np.r_[np.ones(n, np.int64), -np.ones(n, np.int64)]
    ln = np.r_[lane, lane]
    call_end = np.r_[table.ts[call] + table.dur[call], np.zeros(n, np.int64)]
    # At equal times a finish comes before a launch: the slot frees first.
    order = np.lexsort((d, t, ln))
    t, d, ln, call_end = t[order], d[order], ln[order], call_end[order]
    bounds = np.flatnonzero(np.r_[True, ln[1:] != ln[:-1], True])
    out = []
    for i in range(bounds.size - 1):
        a, b = bounds[i], bounds[i + 1]
        out.append(
            _Stream(
                key=tuple(int(x) for x in lanes[ln[a]]),  # type: ignore[arg-type]
                t=t[a:b],
                q=np.cumsum(d[a:b]),
                is_launch=d[a:b] > 0,
                call_end=call_end[a:b],
            )
        )
    return out


def queue_length_series(
    table: EventTable, rank: int, device: int, stream: int
) -> tuple[np.ndarray, np.ndarray]:
    """(times ns, queue length from each time on) of one stream, at full resolution.

    >>> import perfcast
    >>> t = perfcast.load("perfcast/examples/ddp_a100_rank0.json.gz")
    >>> times, length = queue_length_series(t, 0, 0, 7)              # doctest: +SKIP
    """
    for s in _streams(table):
        if s.key == (rank, device, stream):
            return s.t, s.q
    return np.zeros(0, np.int64), np.zeros(0, np.int64)


def launch_queue(table: EventTable, max_depth: int = CUDA_MAX_LAUNCH_QUEUE) -> LaunchQueue:
    """Queue length per stream over time and the time launches were blocked on a full queue.

    >>> import perfcast
    >>> r = launch_queue(perfcast.load("perfcast/examples/ddp_a100_rank0.json.gz"))
    >>> r.by_stream[0].max_length >= 1                                # doctest: +SKIP
    True
    """
    out = LaunchQueue([], [], max_depth, notes=input_notes(table))
    origin: dict[int, int] = {}
    for s in _streams(table):
        rank, dev, stream = s.key
        if rank not in origin:
            origin[rank] = int(table.ts[table.rank == rank].min())
        t, q = s.t, s.q
        span = np.diff(t).astype(np.float64)
        level = q[:-1]
        total = float(span.sum()) or 1.0
        mean = float((span * level).sum()) / total
        p95 = _weighted_quantile(level, span, 0.95)
        at_max = float(span[level >= max_depth].sum())
        # A launch that starts with the queue full (length before it >= max_depth) returns
        # when the next operation on the stream finishes and frees a slot.
        before = q - s.is_launch
        blocked = s.is_launch & (before >= max_depth)
        blocked_ns = 0.0
        if blocked.any():
            idx = np.arange(t.size)
            nxt = np.where(~s.is_launch, idx, t.size)
            nxt = np.minimum.accumulate(nxt[::-1])[::-1]
            bi = np.flatnonzero(blocked)
            has = nxt[bi] < t.size
            free_t = np.where(has, t[np.minimum(nxt[bi], t.size - 1)], s.call_end[bi])
            blocked_ns = float(np.maximum(np.minimum(free_t, s.call_end[bi]) - t[bi], 0).sum())
        out.by_stream.append(
            StreamQueue(
                rank=rank,
                device=dev,
                stream=stream,
                launches=int(s.is_launch.sum()),
                max_length=int(q.max()),
                mean_length=mean,
                p95_length=p95,
                time_at_max_ms=at_max / NS_PER_MS,
                blocked_calls=int(blocked.sum()),
                blocked_ms=blocked_ns / NS_PER_MS,
            )
        )
        ts, qs = downsample_steps(t, q, SERIES_POINTS)
        rel = (ts - origin[rank]) / NS_PER_MS
        out.series.extend(
            QueuePoint(rank, dev, stream, float(x), int(y))
            for x, y in zip(rel.tolist(), qs.tolist())
        )
    return plain(out)


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    if values.size == 0 or weights.sum() <= 0:
        return 0.0
    order = np.argsort(values, kind="stable")
    cw = np.cumsum(weights[order])
    i = int(np.searchsorted(cw, q * cw[-1]))
    return float(values[order][min(i, values.size - 1)])
