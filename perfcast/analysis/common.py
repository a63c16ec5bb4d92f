"""Helpers the trace analyses share: grouped statistics, attribution of GPU work to the CPU
events that launched it, kernel kinds, device specs. All vectorized over the EventTable."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.arrays import sorted_unique
from perfcast.events import NONE, EventTable, Kind, RankInfo
from perfcast.graph.phases import collective_kernel_mask
from perfcast.hardware.devices import DeviceSpec, lookup_device, lookup_device_properties

NS_PER_US = 1e3
NS_PER_MS = 1e6

# Kernel kinds, as HTA names them (compute / communication / memory).
COMPUTATION = "computation"
COMMUNICATION = "communication"
MEMORY = "memory"
KINDS = (COMPUTATION, COMMUNICATION, MEMORY)


# ROCm runs hipMemcpy / hipMemset within a device as blit kernels of its own
# (__amd_rocclr_copyBuffer, __amd_rocclr_fillBufferAligned): copies, not compute.
ROCM_BLIT_PREFIX = "__amd_rocclr_"


def copy_rows(table: EventTable) -> np.ndarray:
    """Mask of the GPU rows that copy or set memory: copies, memsets and ROCm's blit kernels."""
    blit = np.array([n.startswith(ROCM_BLIT_PREFIX) for n in table.names], dtype=bool)
    gpu = table.is_gpu()
    return gpu & ((table.kind != Kind.KERNEL) | blit[table.name])


def gpu_kind_codes(table: EventTable) -> np.ndarray:
    """Per row: 0 computation, 1 communication, 2 memory (copies, memsets and ROCm's blit
    kernels), -1 not GPU."""
    out = np.full(len(table), -1, dtype=np.int8)
    gpu = table.is_gpu()
    out[gpu] = 0
    out[collective_kernel_mask(table)] = 1
    out[copy_rows(table)] = 2
    return out


@dataclass
class Groups:
    """Statistics of `values` grouped by integer `keys` (one entry per distinct key)."""

    keys: np.ndarray
    count: np.ndarray
    sum: np.ndarray
    mean: np.ndarray
    std: np.ndarray  # population standard deviation (0 for one value)
    min: np.ndarray
    max: np.ndarray
    first: np.ndarray  # index (into the inputs) of each group's first element, sorted order

    def __len__(self) -> int:
        return int(self.keys.size)


def group_stats(keys: np.ndarray, values: np.ndarray) -> Groups:
    """count/sum/mean/std/min/max of `values` per distinct key, in key order.

    >>> g = group_stats(np.array([2, 1, 2]), np.array([1.0, 5.0, 3.0]))
    >>> g.keys.tolist(), g.sum.tolist(), g.max.tolist()
    ([1, 2], [5.0, 4.0], [5.0, 3.0])
    """
    values = np.asarray(values, dtype=np.float64)
    if keys.size == 0:
        z = np.zeros(0)
        return Groups(keys[:0], np.zeros(0, np.int64), z, z, z, z, z, np.zeros(0, np.int64))
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    v = values[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    count = np.diff(np.r_[starts, k.size])
    total = np.add.reduceat(v, starts)
    mean = total / count
    sq = np.add.reduceat(v * v, starts)
    var = np.maximum(sq / count - mean * mean, 0.0)
    return Groups(
        keys=k[starts],
        count=count,
        sum=total,
        mean=mean,
        std=np.sqrt(var),
        min=np.minimum.reduceat(v, starts),
        max=np.maximum.reduceat(v, starts),
        first=order[starts],
    )


def percentiles_by_group(keys: np.ndarray, values: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
    """(groups, len(qs)) percentiles (linear interpolation) of values per distinct key."""
    if keys.size == 0:
        return np.zeros((0, len(qs)))
    order = np.lexsort((values, keys))
    k = keys[order]
    v = np.asarray(values, dtype=np.float64)[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    counts = np.diff(np.r_[starts, k.size])
    out = np.empty((starts.size, len(qs)))
    for j, q in enumerate(qs):
        pos = starts + (counts - 1) * (q / 100.0)
        lo = np.floor(pos).astype(np.int64)
        hi = np.ceil(pos).astype(np.int64)
        out[:, j] = v[lo] + (v[hi] - v[lo]) * (pos - lo)
    return out


def nearest_ancestor(table: EventTable, rows: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Per row of `rows`: the nearest enclosing event (itself included) where `wanted`
    (a mask over all rows) holds, or NONE. Walks the parent links level by level."""
    cur = rows.astype(np.int64)
    out = np.full(rows.size, NONE, dtype=np.int64)
    parent = table.parent
    for _ in range(256):
        live = cur >= 0
        if not live.any():
            break
        hit = live & wanted[np.maximum(cur, 0)]
        out[hit] = cur[hit]
        cur = np.where(live & ~hit, parent[np.maximum(cur, 0)], NONE)
    return out


# `first_launch_correlation` of a rank that recorded no launch.
NO_LAUNCH = np.iinfo(np.int64).max


def first_launch_correlation(table: EventTable) -> np.ndarray:
    """Per rank id: the lowest correlation id of a runtime or driver call the trace recorded
    (NO_LAUNCH where none): GPU work without a launch and a lower id was launched before the
    trace began."""
    calls = np.flatnonzero(table.kind_mask((Kind.RUNTIME, Kind.DRIVER)) & (table.correlation >= 0))
    first = np.full(int(table.rank.max(initial=0)) + 1, NO_LAUNCH, dtype=np.int64)
    np.minimum.at(first, table.rank[calls], table.correlation[calls])
    return first


def launching_op(table: EventTable, gpu_rows: np.ndarray, aten_first: bool = True) -> np.ndarray:
    """Per GPU row, the CPU op that launched it (NONE where no launch is known).

    The innermost `aten::` op around the launching runtime call, as HTA attributes kernels,
    else the innermost CPU op of any name.
    """
    return op_around(table, table.launch[gpu_rows], aten_first)


def op_around(table: EventTable, calls: np.ndarray, aten_first: bool = True) -> np.ndarray:
    """Per runtime call (NONE entries allowed), the CPU op that made it: the innermost
    `aten::` op around it, else the innermost CPU op of any name (NONE when none)."""
    calls = calls.astype(np.int64)
    start = np.where(calls >= 0, table.parent[np.maximum(calls, 0)], NONE)
    is_op = table.kind == Kind.CPU_OP
    if aten_first:
        aten = np.array([n.startswith("aten::") for n in table.names], dtype=bool)
        found = nearest_ancestor(table, start, is_op & aten[table.name])
        rest = found < 0
        if rest.any():
            found[rest] = nearest_ancestor(table, start[rest], is_op)
        return found
    return nearest_ancestor(table, start, is_op)


def device_spec(info: RankInfo) -> DeviceSpec | None:
    """The spec of the rank's GPU, from its deviceProperties or its device name."""
    spec = None
    if info.device_properties:
        spec = lookup_device_properties(info.device_properties)
    if spec is None and info.device_name:
        spec = lookup_device(info.device_name)
    return spec


def traced_device(table: EventTable) -> tuple[DeviceSpec | None, str | None, str | None]:
    """(the spec of the trace's GPU, the name the trace gives it, how it was identified when
    not by its name); the spec is None when the trace names no known part."""
    from perfcast.hardware.devices import nearest_device

    named = next((i.device_name for i in table.ranks if i.device_name), None)
    for info in table.ranks:
        spec = device_spec(info)
        if spec is not None:
            how = None
            if info.device_name and lookup_device(info.device_name) is None:
                how = (
                    f"the trace calls its GPU '{info.device_name}'; its compute units and "
                    f"memory are those of the {spec.name}"
                )
            return spec, info.device_name or spec.name, how
    if named:
        near = nearest_device(named)
        if near is not None:
            return near[0], named, near[1]
    return None, named, None


def rank_span_ns(table: EventTable, rank: int) -> tuple[int, int]:
    """First start and last end of any event of the rank (its own clock)."""
    on = table.rank_rows(rank)  # cached: callers ask once per rank
    if not on.size:
        return 0, 0
    return int(table.ts[on].min()), int(table.ends()[on].max())


def downsample_steps(t: np.ndarray, y: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """A step function (value y[i] from t[i] on; of several values at one time, the last
    holds) as at most max(`points`, 3) samples at distinct times: the first, and per bin its
    peak where the peak was reached and the value the bin ends on, so peaks survive at their
    times and the level after each bin is right (one bin still needs those three)."""
    t, y = np.asarray(t), np.asarray(y)
    if t.size:
        # Values at a repeated time last no time: a viewer gets one value per time.
        held = np.r_[t[1:] != t[:-1], True]
        t, y = t[held], y[held]
    if t.size <= points:
        return t, y
    bins = max((points - 1) // 2, 1)
    # Bins over times from the first: epoch ns in float64 are multiples of 256, which moved
    # samples across bin edges (another clock origin picked other samples).
    since = t - t[0]
    edges = np.linspace(0, since[-1], bins + 1)
    b = np.clip(np.searchsorted(edges, since, side="right") - 1, 0, bins - 1)
    starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
    lengths = np.diff(np.r_[starts, t.size])
    peak = np.maximum.reduceat(y, starts)
    at = np.where(y == np.repeat(peak, lengths), np.arange(t.size), t.size)
    first_peak = np.minimum.reduceat(at, starts)
    keep = sorted_unique(np.r_[0, first_peak, starts + lengths - 1])
    return t[keep], y[keep]
