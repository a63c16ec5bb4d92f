"""Launch-queue length per stream over time, and the time the CPU was blocked on a full queue.

Queue length on a stream = launches enqueued but not yet finished: +1 when the runtime call
that enqueues one starts, −1 when its work on the stream ends (HTA's definition,
`get_queue_length_time_series`). A call that enqueues several operations on a stream (a
`cudaGraphLaunch` replaying a CUDA graph) is one entry, freed when the last of them ends, as
the graph builder counts entries (`perfcast.graph.launches`): counting each of a graph's
kernels put 1,574 launches in the queue of a trace whose 3 graph launches never had more than
one pending. CUDA blocks a launch call while the queue is full (about
1,024 pending launches per stream, HTA's `CUDA_MAX_LAUNCH_QUEUE_PER_STREAM`): such a call
returns only when an operation on the stream ends and frees a slot. A CPU blocked there is
waiting on the GPU, not working. Two measures of it:

- `time_at_max_ms`: how long the queue length was at `max_depth` or above (HTA's
  `get_time_spent_blocked_on_full_queue`);
- `blocked_ms`: over the launch calls that started with the queue full, the part of each call
  until a slot freed (or the call returned, if sooner).

`max_depth` is, by default, the depth the trace itself shows, read the way the graph builder
reads it (`perfcast.graph.launches.queue_depth`: launches that took over 20 µs and returned
as an entry of their stream finished; the pending count most of them saw): 1,022 entries on
the H100 and V100 traces here. Where no launch blocked, HTA's 1,024 is used. Both are said
in the result (`max_depth`, `depth_source`).

CUPTI records the blocking itself when its overhead activity is on (recent Kineto): a
"Command Buffer Full" overhead event inside a launch call that waited for the driver's
command buffer. `cupti_blocked_calls` / `cupti_blocked_ms` count those per stream (None
where the trace holds no CUPTI overhead events), so the model's count can be checked: on
the H100 ResNet-50 traces it finds 217 and 13 blocked launches where CUPTI recorded 215
and 13.

`launch_queue(table)` is the trace-side measurement; `queue_length_series` gives one
stream's full-resolution step function for models that need it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfcast.analysis.common import NS_PER_MS, downsample_steps, rank_span_ns
from perfcast.analysis.notes import input_notes
from perfcast.arrays import combine_codes
from perfcast.events import NONE, EventTable, Kind
from perfcast.frames import Tables, plain
from perfcast.graph.launches import blocked_occupancy, depth_from_occupancy

CUDA_MAX_LAUNCH_QUEUE = 1024  # HTA's CUDA_MAX_LAUNCH_QUEUE_PER_STREAM
# CUPTI's overhead activity names as Kineto writes them (category "overhead").
_COMMAND_BUFFER_FULL = "Command Buffer Full"
_CUPTI_OVERHEAD = {
    _COMMAND_BUFFER_FULL,
    "Activity Buffer Request",
    "Buffer Flush",
    "Lazy Function Loading",
    "Driver Compiler",
    "CUPTI Instrumentation",
    "CUPTI Resource",
    "Unknown",
}
SERIES_POINTS = 400


@dataclass
class StreamQueue:
    """One stream's launch queue: length statistics (time-weighted), time at the limit (ms)
    and launch calls blocked on a full queue."""

    rank: int
    device: int
    stream: int
    launches: int  # launch calls with work on the stream (a graph launch counts once)
    max_length: int
    mean_length: float  # time-weighted, over the stream's first launch to last end
    p95_length: float  # time-weighted
    time_at_max_ms: float  # queue length >= max_depth
    blocked_calls: int
    blocked_ms: float
    cupti_blocked_calls: int | None  # launches CUPTI saw wait for a full command buffer
    cupti_blocked_ms: float | None  # None: the trace has no CUPTI overhead events


@dataclass
class QueuePoint:
    """A point of a stream's queue-length step function: time in ms from the rank's first
    event, and the length."""

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
    depth_source: str = "given"  # "given", "measured on this trace" or "HTA's default"
    notes: list[str] = field(default_factory=list)

    ROW_TYPES = {"by_stream": StreamQueue, "series": QueuePoint}  # noqa: RUF012


@dataclass
class _Stream:
    key: tuple[int, int, int]
    t: np.ndarray  # event times (sorted)
    q: np.ndarray  # queue length after each event
    is_launch: np.ndarray
    call_end: np.ndarray  # for launch events: when the call returned
    call: np.ndarray  # for launch events: the launch call's row (NONE for finishes)


def _streams(table: EventTable) -> list[_Stream]:
    gpu = np.flatnonzero(table.is_gpu() & (table.launch >= 0))
    if gpu.size == 0:
        return []
    call = table.launch[gpu].astype(np.int64)
    lane, lanes = combine_codes(table.rank[gpu].astype(np.int64), table.pid[gpu], table.tid[gpu])
    # One entry per launch call and stream, finishing with the last of its operations there.
    entry = lane.astype(np.int64) * (len(table) + 1) + call
    _, first, inv = np.unique(entry, return_index=True, return_inverse=True)
    finish = np.full(first.size, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(finish, inv.reshape(-1), table.ts[gpu] + table.dur[gpu])
    call, lane = call[first], lane[first]
    n = first.size
    # Events: launch (+1 at the call's start) and finish (−1 at the end of its work).
    t = np.r_[table.ts[call], finish]
    d = np.r_[np.ones(n, np.int64), -np.ones(n, np.int64)]
    ln = np.r_[lane, lane]
    call_end = np.r_[table.ts[call] + table.dur[call], np.zeros(n, np.int64)]
    call_row = np.r_[call, np.full(n, NONE, np.int64)]
    # At equal times a finish comes before a launch: the slot frees first.
    order = np.lexsort((d, t, ln))
    t, d, ln, call_end = t[order], d[order], ln[order], call_end[order]
    call_row = call_row[order]
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
                call=call_row[a:b],
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


def _measured_depth(streams: list[_Stream]) -> int | None:
    """The pending count at which launches blocked, as `graph.launches.queue_depth` reads it
    (None when too few launches blocked to tell)."""
    seen = []
    for s in streams:
        idx = np.flatnonzero(s.is_launch)
        if idx.size:
            before = (s.q - s.is_launch)[idx]
            start = s.t[idx]
            finishes = s.t[~s.is_launch]  # in time order
            seen.append(blocked_occupancy(start, s.call_end[idx] - start, before, finishes))
    return depth_from_occupancy(seen)


def cupti_blocked_launches(table: EventTable) -> dict[int, tuple[int, int]] | None:
    """Launch call row -> (1, ns) for each launch CUPTI recorded waiting for a full command
    buffer (its "Command Buffer Full" overhead event inside the call); None when the trace
    holds no CUPTI overhead events at all."""
    overhead_names = np.array([n in _CUPTI_OVERHEAD for n in table.names], dtype=bool)
    buffer_full = np.array([n == _COMMAND_BUFFER_FULL for n in table.names], dtype=bool)
    over = np.flatnonzero((table.kind == Kind.OTHER) & overhead_names[table.name])
    if over.size == 0:
        return None
    full = over[buffer_full[table.name[over]]]
    calls = np.flatnonzero(np.isin(table.kind, [Kind.RUNTIME, Kind.DRIVER]))
    out: dict[int, tuple[int, int]] = {}
    if full.size == 0 or calls.size == 0:
        return out
    for rank in np.unique(table.rank[full]).tolist():
        c = calls[table.rank[calls] == rank]
        c = c[np.argsort(table.ts[c], kind="stable")]
        f = full[table.rank[full] == rank]
        # The call that started last at or before the event and had not returned by its end.
        i = np.searchsorted(table.ts[c], table.ts[f], side="right") - 1
        ok = i >= 0
        row = c[np.maximum(i, 0)]
        ok &= table.ts[row] + table.dur[row] >= table.ts[f] + table.dur[f]
        for r, ns in zip(row[ok].tolist(), table.dur[f][ok].tolist(), strict=True):
            n0, t0 = out.get(int(r), (0, 0))
            out[int(r)] = (n0 + 1, t0 + int(ns))
    return out


def launch_queue(table: EventTable, max_depth: int | None = None) -> LaunchQueue:
    """Queue length per stream over time and the time launches were blocked on a full queue.

    `max_depth`: pending launches per stream at which a launch blocks; by default the depth
    this trace shows, else HTA's 1,024.

    >>> import perfcast
    >>> r = launch_queue(perfcast.load("perfcast/examples/ddp_a100_rank0.json.gz"))
    >>> r.by_stream[0].max_length >= 1                                # doctest: +SKIP
    True
    """
    streams = _streams(table)
    source = "given"
    if max_depth is None:
        measured = _measured_depth(streams)
        source = "measured on this trace" if measured is not None else "HTA's default"
        max_depth = measured if measured is not None else CUDA_MAX_LAUNCH_QUEUE
    notes = input_notes(table)
    reached = max((int(s.q.max()) for s in streams if s.q.size), default=0)
    if source == "HTA's default" and reached > max_depth:
        # The queue grew past CUDA's limit without blocking there (ROCm's is deeper): the
        # limit is not known, so no launch is counted as blocked by it.
        notes.append(
            f"a stream's queue reached {reached:,} pending launches, past HTA's "
            f"{CUDA_MAX_LAUNCH_QUEUE:,} (CUDA's limit; this device's is deeper, ROCm's for "
            "one) and no depth where launches blocked shows in the trace: none is counted "
            "as blocked (pass max_depth to set one)"
        )
        max_depth = reached + 1
        source = f"unknown: above the {reached:,} this trace reached"
    out = LaunchQueue([], [], max_depth, depth_source=source, notes=notes)
    cupti = cupti_blocked_launches(table)
    # GPU work whose launch call the trace lacks holds queue slots this count cannot place.
    unlaunched = np.flatnonzero(table.is_gpu() & (table.launch < 0))
    lost: dict[tuple[int, int, int], int] = {}
    for key in zip(
        table.rank[unlaunched].tolist(),
        table.pid[unlaunched].tolist(),
        table.tid[unlaunched].tolist(),
        strict=True,
    ):
        lost[key] = lost.get(key, 0) + 1
    origin: dict[int, int] = {}
    for s in streams:
        rank, dev, stream = s.key
        if rank not in origin:
            origin[rank] = rank_span_ns(table, rank)[0]
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
        cupti_calls: int | None = None
        cupti_ns = 0
        if cupti is not None:
            hits = [cupti[c] for c in s.call[s.is_launch].tolist() if c in cupti]
            cupti_calls = sum(h[0] for h in hits)
            cupti_ns = sum(h[1] for h in hits)
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
                cupti_blocked_calls=cupti_calls,
                cupti_blocked_ms=cupti_ns / NS_PER_MS if cupti_calls is not None else None,
            )
        )
        where = f"rank {rank} stream {stream}" if len(table.ranks) > 1 else f"stream {stream}"
        if lost.get(s.key):
            out.notes.append(
                f"{where}: {lost[s.key]:,} GPU operations have no launch call in the trace; "
                "they hold queue slots this count leaves out, so the lengths read low"
            )
        if cupti_calls:
            out.notes.append(
                f"{where}: CUPTI recorded {cupti_calls:,} launches waiting for a full command "
                f"buffer ({cupti_ns / NS_PER_MS:,.2f} ms); the queue length finds "
                f"{int(blocked.sum()):,} ({blocked_ns / NS_PER_MS:,.2f} ms)"
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
