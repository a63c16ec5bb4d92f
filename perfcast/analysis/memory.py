"""Memory: the allocation timeline from `[memory]` events (peak, per step, per phase), and the
bandwidth of memory copies and memsets, overall and over time.

`[memory]` events (recorded with `profile_memory=True`) carry the bytes of each allocation
(negative: a free) and the allocator's total after it. The table keeps no device field for
them, and a trace interleaves the CPU's and each GPU's allocator. They are told apart by
their arithmetic: an event continues the series whose last total equals its own total minus
its bytes. Each such chain is one allocator; the timeline shown is the one with the largest
peak (the GPU's, in any GPU training trace).

Copy bandwidth per event is bytes / duration; "effective" bandwidth is all bytes over all
copy time; the series spreads each copy's bytes evenly over its duration (HTA's memory
bandwidth time series adds the rates of concurrent copies the same way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from perfcast.analysis.common import (
    NS_PER_MS,
    device_spec,
    downsample_steps,
    group_stats,
    rank_span_ns,
)
from perfcast.analysis.notes import input_notes
from perfcast.arrays import combine_codes, sorted_unique, split_by
from perfcast.events import MEM_DEVICE_CPU, NONE, EventTable, Kind
from perfcast.frames import Tables, plain
from perfcast.graph.phases import PHASE_LABELS, Phase, event_phases
from perfcast.hardware.classify import copy_direction

if TYPE_CHECKING:
    from perfcast.hardware.devices import DeviceSpec

MB = 1e6
SERIES_POINTS = 400
BANDWIDTH_BINS = 100


@dataclass
class Allocator:
    """One allocator of a rank (named by its device): event count and levels in MB (peak,
    min, first, last; allocated and freed sums)."""

    rank: int
    allocator: int  # 0 = the timeline's: the GPU's with the largest peak, else the largest
    device: str  # "GPU 0", "CPU", or "not recorded" (traces before the Device Type field)
    # "recorded" (Total Allocated), or "lower bound" where the trace has only each event's
    # Bytes: totals rebuilt from the lowest level the window reaches, taken as 0.
    totals: str
    events: int
    peak_mb: float
    min_mb: float
    first_mb: float  # total after the first event
    last_mb: float
    allocated_mb: float  # sum of allocations
    freed_mb: float  # sum of frees


@dataclass
class MemoryPoint:
    """A point of the allocation timeline: ms from the rank's first event, allocated MB."""

    rank: int
    t_ms: float  # from the rank's first event
    allocated_mb: float  # the bin's maximum when downsampled


@dataclass
class StepMemory:
    """A step's allocated memory in MB: at its start, peak and end, allocated and freed,
    and the allocation count."""

    rank: int
    step: str
    start_mb: float
    peak_mb: float
    end_mb: float
    allocated_mb: float
    freed_mb: float
    allocations: int


@dataclass
class PhaseMemory:
    """A phase's allocated memory in MB: peak, allocated, freed and net, and the allocation
    count."""

    rank: int
    phase: str
    peak_mb: float  # highest total reached during the phase
    allocated_mb: float
    freed_mb: float
    net_mb: float
    allocations: int


@dataclass
class CopyStats:
    """One kind of memcpy / memset on a rank: count, MB, time (ms) and bandwidth in
    GB/s."""

    rank: int
    kind: str  # Memcpy HtoD / DtoH / DtoD / PtoP / Memset
    count: int
    # Sizes and bandwidths over the calls whose size the trace records (None: none does).
    total_mb: float | None
    time_ms: float
    effective_gbs: float | None  # their bytes / their time
    mean_gbs: float | None  # mean of their per-event bandwidths
    max_gbs: float | None
    unsized: int = 0  # calls the trace gives no size for


@dataclass
class BandwidthPoint:
    """Copy bandwidth of one kind in one time bin: bin start in ms from the rank's first
    event, GB/s."""

    rank: int
    kind: str
    t_ms: float  # bin start, from the rank's first event
    gbs: float  # bytes moved in the bin / bin width


@dataclass(repr=False)
class Memory(Tables):
    """Result of `memory`; tables: allocators, by_step, by_phase, copies, timeline, bandwidth."""

    allocators: list[Allocator]
    by_step: list[StepMemory]
    by_phase: list[PhaseMemory]
    copies: list[CopyStats]
    timeline: list[MemoryPoint]
    bandwidth: list[BandwidthPoint]
    notes: list[str] = field(default_factory=list)

    ROW_TYPES = {  # noqa: RUF012
        "allocators": Allocator,
        "by_step": StepMemory,
        "by_phase": PhaseMemory,
        "copies": CopyStats,
        "timeline": MemoryPoint,
        "bandwidth": BandwidthPoint,
    }


def allocators(
    device: np.ndarray, total: np.ndarray, nbytes: np.ndarray
) -> tuple[np.ndarray, list[str], list[bool]]:
    """Allocator code per memory event (events in time order), with each code's device
    label and whether it is a GPU's. Events that name their device (Kineto's Device Type
    and Device Id) are grouped by it; the rest by `allocator_chains`."""
    known = device != NONE
    code = np.empty(device.size, dtype=np.int64)
    devices = sorted_unique(device[known]).tolist()
    code[known] = np.searchsorted(devices, device[known])
    labels = [("CPU" if d == MEM_DEVICE_CPU else f"GPU {d}") for d in devices]
    is_gpu = [d != MEM_DEVICE_CPU for d in devices]
    if not known.all():
        chain = allocator_chains(total[~known], nbytes[~known])
        code[~known] = len(devices) + chain
        extra = int(chain.max()) + 1
        labels += ["not recorded"] * extra
        is_gpu += [False] * extra
    return code, labels, is_gpu


def allocator_chains(total: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Chain id per memory event (events in time order): each event continues the latest
    earlier event whose total equals its own total minus its bytes.

    >>> allocator_chains(np.array([10, 3, 15, 0]), np.array([10, 3, 5, -3])).tolist()
    [0, 1, 0, 1]
    """
    n = total.size
    if n == 0:
        return np.zeros(0, np.int64)
    before = total - nbytes
    uniq = np.unique(total)
    r_tot = np.searchsorted(uniq, total)
    pos = np.searchsorted(uniq, before)
    found = (pos < uniq.size) & (uniq[np.minimum(pos, uniq.size - 1)] == before)
    idx = np.arange(n, dtype=np.int64)
    # The latest j < i with total_j == before_i: search the (value rank, index) order.
    key = r_tot * (n + 1) + idx
    order = np.argsort(key)
    skey = key[order]
    q = np.where(found, pos, 0) * (n + 1) + idx
    j = np.searchsorted(skey, q, side="left") - 1
    jj = order[np.maximum(j, 0)]
    pred = np.where(found & (j >= 0) & (r_tot[jj] == pos) & (jj < idx), jj, -1)
    # Two events may claim the same predecessor; only the first keeps it.
    claimed = np.full(n, False)
    has = np.flatnonzero(pred >= 0)
    _, first = np.unique(pred[has], return_index=True)
    keep = np.zeros(has.size, dtype=bool)
    keep[first] = True
    claimed[has[keep]] = True
    pred = np.where(claimed, pred, -1)
    # Roots by pointer jumping.
    root = np.where(pred >= 0, pred, idx)
    for _ in range(64):
        nxt = root[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    _, chain = np.unique(root, return_inverse=True)
    return chain.reshape(-1)


def _enclosing_cpu_event(table: EventTable, rows: np.ndarray) -> np.ndarray:
    """Innermost CPU event on the same thread whose span holds each row's timestamp."""
    cpu = np.flatnonzero(
        np.isin(table.kind, [Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON_FUNCTION])
    )
    out = np.full(rows.size, NONE, dtype=np.int64)
    if cpu.size == 0 or rows.size == 0:
        return out
    both = np.r_[cpu, rows]
    th, _ = combine_codes(table.rank[both], table.pid[both], table.tid[both])
    th_cpu, th_rows = th[: cpu.size], th[cpu.size :]
    lo = int(min(table.ts[cpu].min(), table.ts[rows].min()))
    width = int(max((table.ts[cpu] + table.dur[cpu]).max(), table.ts[rows].max())) - lo + 1
    # Sorted by (thread, start, longest first): the last candidate at or before t is the
    # innermost event starting there.
    order = np.lexsort((-table.dur[cpu], table.ts[cpu], th_cpu))
    cpu = cpu[order]
    ckey = th_cpu[order] * width + (table.ts[cpu] - lo)
    t = table.ts[rows]
    qkey = th_rows * width + (t - lo)
    pos = np.searchsorted(ckey, qkey, side="right") - 1
    cur = np.where(pos >= 0, cpu[np.maximum(pos, 0)], NONE)
    cur = np.where((cur >= 0) & (th_cpu[order][np.maximum(pos, 0)] == th_rows), cur, NONE)
    end = table.ts + table.dur
    for _ in range(256):
        live = cur >= 0
        if not live.any():
            break
        hit = live & (end[np.maximum(cur, 0)] >= t)
        out[hit] = cur[hit]
        cur = np.where(live & ~hit, table.parent[np.maximum(cur, 0)], NONE)
    return out


def memory(table: EventTable) -> Memory:
    """Allocation timeline, per-step and per-phase memory, and copy bandwidth, per rank.

    >>> import perfcast
    >>> r = memory(perfcast.load("trace_with_profile_memory.json.gz"))      # doctest: +SKIP
    >>> max(a.peak_mb for a in r.allocators)                                # doctest: +SKIP
    """
    out = Memory([], [], [], [], [], [], notes=input_notes(table))
    mem_all = table.rows(Kind.MEMORY)
    mem_all = mem_all[table.nbytes[mem_all] != NONE]
    totals, rebuilt = _totals(table, mem_all)
    keep = totals >= 0
    mem_all, totals, rebuilt = mem_all[keep], totals[keep], rebuilt[keep]
    if rebuilt.any():
        out.notes.append(
            f"{int(rebuilt.sum()):,} [memory] events record their bytes but no allocator "
            "total (older PyTorch): each allocator's total is rebuilt from the bytes, "
            "counting from the lowest level the window reaches, so its levels and peaks are "
            "lower bounds (what was allocated before the window is not in the trace)"
        )
    phases = event_phases(table) if mem_all.size else None
    encl = _enclosing_cpu_event(table, mem_all) if mem_all.size else None
    # Each rank's memory events, grouped once (a mask per rank is O(ranks x events)).
    mem_of = dict(split_by(table.rank[mem_all])) if mem_all.size else {}
    for info in table.ranks:
        rank = info.rank
        origin = rank_span_ns(table, rank)[0]
        sel = mem_of.get(rank, np.zeros(0, np.int64))
        if sel.size and phases is not None and encl is not None:
            _rank_memory(
                table,
                out,
                rank,
                origin,
                mem_all[sel],
                totals[sel],
                rebuilt[sel],
                phases,
                encl[sel],
            )
        _copies(table, out, rank, origin, device_spec(info))
    if not mem_all.size:
        out.notes.append("no [memory] events: record with profile_memory=True for a timeline")
    return plain(out)


def _totals(table: EventTable, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The allocator's total after each memory event, and which were rebuilt: the recorded
    Total Allocated; else, for events that name their device, the running sum of their
    Bytes per rank and device, raised so that its lowest point is 0 (the real total is at
    least that); else NONE."""
    total = table.mem_total[rows].copy()
    rebuilt = (total < 0) & (table.mem_device[rows] != NONE)
    if rebuilt.any():
        at = np.flatnonzero(rebuilt)
        r = rows[at]
        codes, _ = combine_codes(
            table.rank[r].astype(np.int64), table.mem_device[r].astype(np.int64)
        )
        for _, pos in split_by(codes, table.ts[r]):
            level = np.cumsum(table.nbytes[r[pos]])
            total[at[pos]] = level + max(0, -int(level.min()))
    return total, rebuilt


def _rank_memory(
    table: EventTable,
    out: Memory,
    rank: int,
    origin: int,
    rows: np.ndarray,
    totals: np.ndarray,
    rebuilt: np.ndarray,
    phases: np.ndarray,
    encl: np.ndarray,
) -> None:
    order = np.argsort(table.ts[rows], kind="stable")
    rows, encl, total, rebuilt = rows[order], encl[order], totals[order], rebuilt[order]
    nbytes = table.nbytes[rows]
    chain, labels, is_gpu = allocators(table.mem_device[rows], total, nbytes)
    g = group_stats(chain, total)
    # The timeline's allocator first: a GPU's where the trace names devices (a CPU
    # allocator can peak higher), else the largest peak (the GPU's in a GPU training trace).
    gpu_first = np.array([not is_gpu[int(k)] for k in g.keys])
    by_peak = np.lexsort((-g.max, gpu_first))
    for a, ci in enumerate(by_peak.tolist()):
        m = chain == g.keys[ci]
        b = nbytes[m]
        out.allocators.append(
            Allocator(
                rank=rank,
                allocator=a,
                device=labels[int(g.keys[ci])],
                totals="lower bound" if rebuilt[m].any() else "recorded",
                events=int(m.sum()),
                peak_mb=g.max[ci] / MB,
                min_mb=g.min[ci] / MB,
                first_mb=float(total[m][0]) / MB,
                last_mb=float(total[m][-1]) / MB,
                allocated_mb=float(b[b > 0].sum()) / MB,
                freed_mb=float(-b[b < 0].sum()) / MB,
            )
        )
    main = chain == g.keys[by_peak[0]]
    rows, total, nbytes, encl = rows[main], total[main], nbytes[main], encl[main]
    t = table.ts[rows]
    ts, vs = downsample_steps(t, total, SERIES_POINTS)
    out.timeline.extend(
        MemoryPoint(rank, (x - origin) / NS_PER_MS, y / MB)
        for x, y in zip(ts.tolist(), vs.tolist())
    )
    # Per step: the total before the step's first event is the previous event's total.
    it = table.iteration[rows]
    for i, iteration in enumerate(table.iterations):
        if iteration.rank != rank:
            continue
        m = np.flatnonzero(it == i)
        if m.size == 0:
            continue
        b = nbytes[m]
        out.by_step.append(
            StepMemory(
                rank=rank,
                step=iteration.name,
                start_mb=float(total[m[0]] - nbytes[m[0]]) / MB,
                peak_mb=float(total[m].max()) / MB,
                end_mb=float(total[m[-1]]) / MB,
                allocated_mb=float(b[b > 0].sum()) / MB,
                freed_mb=float(-b[b < 0].sum()) / MB,
                allocations=int((b > 0).sum()),
            )
        )
    ph = np.where(encl >= 0, phases[np.maximum(encl, 0)], Phase.NONE)
    for p in [*PHASE_LABELS, Phase.NONE]:
        m = ph == p
        if not m.any():
            continue
        b = nbytes[m]
        out.by_phase.append(
            PhaseMemory(
                rank=rank,
                phase=PHASE_LABELS.get(Phase(p), "outside any phase"),
                peak_mb=float(total[m].max()) / MB,
                allocated_mb=float(b[b > 0].sum()) / MB,
                freed_mb=float(-b[b < 0].sum()) / MB,
                net_mb=float(b.sum()) / MB,
                allocations=int((b > 0).sum()),
            )
        )


def copy_kind(name: str) -> str:
    """ "Memcpy HtoD (Pageable -> Device)" -> "Memcpy HtoD" (ROCm's "CopyHostToDevice" too);
    memsets -> "Memset"."""
    if name.startswith("Memset") or "memset" in name.lower():
        return "Memset"
    direction = copy_direction(name)
    return f"Memcpy {direction}" if direction else "Memcpy other"


# Copy kinds that stay in the GPU's memory (bounded by its DRAM bandwidth).
_ON_GPU = ("Memset", "Memcpy DtoD")


def _note_beyond_dram(
    out: Memory, rank: int, on_gpu: np.ndarray, bw: np.ndarray, device: DeviceSpec | None
) -> None:
    """Say so where copies or memsets on the GPU ran faster than its memory can: bytes over
    time above the DRAM's bandwidth (a copy within the GPU moves twice its bytes) are small
    buffers in L2 cache, or durations at the trace's resolution, not DRAM's speed."""
    if device is None or not device.mem_bw_gbs:
        return
    fast = on_gpu & (bw > device.mem_bw_gbs)
    if fast.any():
        out.notes.append(
            f"rank {rank}: {int(fast.sum()):,} of {int(on_gpu.sum()):,} memsets and "
            f"device-to-device copies ran faster than the {device.name}'s memory "
            f"({device.mem_bw_gbs:,.0f} GB/s; up to {float(bw[fast].max()):,.0f} GB/s): "
            "small buffers held in L2 cache, or durations at the trace's resolution; their "
            "max_gbs is not DRAM bandwidth"
        )


def _copies(
    table: EventTable, out: Memory, rank: int, origin: int, device: DeviceSpec | None
) -> None:
    on_rank = table.rank_rows(rank)  # cached: this runs once per rank
    rows = on_rank[table.kind_mask([Kind.MEMCPY, Kind.MEMSET])[on_rank]]
    if rows.size == 0:
        return
    uniq_names = np.unique(table.name[rows]).tolist()
    kinds = sorted({copy_kind(table.names[i]) for i in uniq_names})
    kind_of_name = {i: kinds.index(copy_kind(table.names[i])) for i in uniq_names}
    k = np.array([kind_of_name[i] for i in table.name[rows].tolist()], dtype=np.int64)
    ts = table.ts[rows]
    # A 0-length copy is below the clock's resolution: count it as 1 µs, as HTA does.
    dur = np.where(table.dur[rows] > 0, table.dur[rows], 1000)
    sized = table.nbytes[rows] >= 0
    # An unknown size moves nothing in the bandwidth timeline and is left out of the sums.
    nbytes = np.where(sized, table.nbytes[rows], 0).astype(np.float64)
    bw = nbytes / dur  # bytes per ns = GB/s
    if not sized.all():
        out.notes.append(
            f"rank {rank}: {int((~sized).sum()):,} of {sized.size:,} copies and memsets have no "
            "size in the trace: left out of their kind's MB and bandwidths (- where no call of "
            "a kind has one) and of the bandwidth timeline"
        )
    on_gpu = np.isin(k, [i for i, kind in enumerate(kinds) if kind in _ON_GPU])
    _note_beyond_dram(out, rank, on_gpu, bw, device)
    # Times from the first copy: epoch ns (~1.7e18) in float64 are multiples of 256, which
    # moved the bins and the copies' starts and ends within them.
    lo = int(ts.min())
    ts = ts - lo
    edges = np.linspace(0, int((ts + dur).max()), BANDWIDTH_BINS + 1)
    for ki, kind in enumerate(kinds):
        m = k == ki
        if not m.any():
            continue
        ms = m & sized
        known = bool(ms.any())
        out.copies.append(
            CopyStats(
                rank=rank,
                kind=kind,
                count=int(m.sum()),
                total_mb=float(nbytes[ms].sum()) / MB if known else None,
                time_ms=float(dur[m].sum()) / NS_PER_MS,
                effective_gbs=float(nbytes[ms].sum() / dur[ms].sum()) if known else None,
                mean_gbs=float(bw[ms].mean()) if known else None,
                max_gbs=float(bw[ms].max()) if known else None,
                unsized=int((m & ~sized).sum()),
            )
        )
        # Cumulative bytes moved, piecewise linear between copy starts and ends.
        t = np.r_[ts[m], ts[m] + dur[m]]
        rate = np.r_[bw[m], -bw[m]]
        o = np.argsort(t, kind="stable")
        t, rate = t[o], rate[o]
        level = np.cumsum(rate)
        moved = np.r_[0.0, np.cumsum(level[:-1] * np.diff(t))]
        at_edges = np.interp(edges, t, moved, left=0.0, right=float(moved[-1]))
        width = np.diff(edges)
        gbs = np.diff(at_edges) / np.where(width > 0, width, 1)
        out.bandwidth.extend(
            BandwidthPoint(rank, kind, (lo - origin + e) / NS_PER_MS, float(v))
            for e, v in zip(edges[:-1].tolist(), gbs.tolist())
        )
