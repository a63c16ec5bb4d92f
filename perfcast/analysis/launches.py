"""Kernel launch statistics: CPU time of each launch call, GPU time of what it launched, and
the launch delay between them, per kernel, per launching op and per runtime call.

Definitions follow HTA (`get_cuda_kernel_launch_stats`): launch delay = GPU start − end of
the runtime call (negative clipped to 0). Flagged, as HTA plots them:

- short kernels: GPU time shorter than the CPU time of their launch call (the CPU cannot
  keep such a GPU busy);
- runtime outliers: launch calls longer than `runtime_cutoff_us` (HTA default 50 µs);
- launch-delay outliers: delay longer than `launch_delay_cutoff_us` (HTA default 100 µs).

Every GPU operation with a known launch call counts (kernels, and copies or memsets enqueued
by a runtime call). A call that launched several (a `cudaGraphLaunch` replaying a CUDA graph)
is counted once: each of its kernels carries its share of the call's CPU time, the call is a
runtime outlier once, and only its first kernel has a launch delay (the others wait for
their graph predecessors, not for the CPU). Charging each of a graph's 4,725 kernels the
whole 2 ms call once made a 14 ms trace report 10 s of launch CPU time. The delay statistics
are therefore over the launches that have one (each call's first operation): a kernel that
never starts a call has none (None), not a delay of 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfcast.analysis.common import (
    NS_PER_MS,
    NS_PER_US,
    group_stats,
    launching_op,
    percentiles_by_group,
)
from perfcast.analysis.notes import input_notes
from perfcast.events import NONE, EventTable
from perfcast.frames import Tables, plain


@dataclass
class LaunchSummary:
    """A rank's kernel launches: count, CPU and GPU time (ms, means in µs), launch delay
    statistics (µs) and outlier counts."""

    rank: int
    launches: int
    cpu_ms: float  # summed CPU time of the launch calls
    gpu_ms: float  # summed GPU time of what they launched
    mean_cpu_us: float
    mean_gpu_us: float
    mean_delay_us: float
    p50_delay_us: float
    p95_delay_us: float
    max_delay_us: float
    short_kernels: int
    runtime_outliers: int
    delay_outliers: int


@dataclass
class LaunchGroup:
    """Launches of one kernel, op or runtime call: count, CPU and GPU ms, means and launch
    delay in µs, outlier counts."""

    rank: int
    name: str  # kernel, op or runtime call name, as the table says
    launches: int
    cpu_ms: float
    gpu_ms: float
    mean_cpu_us: float
    mean_gpu_us: float
    # Over the group's launches that have a delay (a call's first operation); None when
    # none has (a kernel a CUDA graph runs after its first).
    mean_delay_us: float | None
    max_delay_us: float | None
    short_kernels: int
    runtime_outliers: int
    delay_outliers: int


@dataclass
class LaunchOutlier:
    """One launch past a cutoff (runtime or launch delay): its kernel, op and call, GPU
    start (ms), CPU, GPU and delay µs and flags."""

    rank: int
    kernel: str
    op: str
    runtime: str
    start_ms: float  # GPU start, on the rank's clock, from its first event
    cpu_us: float
    gpu_us: float
    delay_us: float
    flags: str


@dataclass(repr=False)
class LaunchStats(Tables):
    """Result of `launch_stats`; tables: summary, by_kernel, by_op, by_runtime, outliers."""

    summary: list[LaunchSummary]
    by_kernel: list[LaunchGroup]
    by_op: list[LaunchGroup]
    by_runtime: list[LaunchGroup]
    outliers: list[LaunchOutlier]
    runtime_cutoff_us: float
    launch_delay_cutoff_us: float
    notes: list[str] = field(default_factory=list)

    ROW_TYPES = {  # noqa: RUF012
        "summary": LaunchSummary,
        "by_kernel": LaunchGroup,
        "by_op": LaunchGroup,
        "by_runtime": LaunchGroup,
        "outliers": LaunchOutlier,
    }


@dataclass
class Launches:
    """Per launched GPU row (the arrays every launch analysis starts from)."""

    gpu: np.ndarray  # GPU rows with a known launch call
    call: np.ndarray  # their runtime call rows
    cpu: np.ndarray  # ns: the call's CPU time, shared among the rows it launched
    gpu_dur: np.ndarray
    delay: np.ndarray  # ns: GPU start - call end, for a call's first row (0 for the rest)
    first: np.ndarray  # bool: the call's first launched row (the call counted once)
    call_cpu: np.ndarray  # ns: the call's whole CPU time


def launched(table: EventTable) -> Launches:
    gpu = np.flatnonzero(table.is_gpu() & (table.launch >= 0))
    call = table.launch[gpu].astype(np.int64)
    call_cpu = table.dur[call]
    _, inv, counts = np.unique(call, return_inverse=True, return_counts=True)
    cpu = call_cpu / counts[inv]
    # The first row each call launched: the earliest-starting one.
    order = np.lexsort((table.ts[gpu], call))
    first = np.zeros(gpu.size, dtype=bool)
    if gpu.size:
        head = np.ones(gpu.size, dtype=bool)
        head[1:] = call[order][1:] != call[order][:-1]
        first[order[head]] = True
    delay = np.where(first, np.maximum(table.ts[gpu] - (table.ts[call] + call_cpu), 0), 0)
    return Launches(gpu, call, cpu, table.dur[gpu], delay, first, call_cpu)


def launch_stats(
    table: EventTable,
    runtime_cutoff_us: float = 50.0,
    launch_delay_cutoff_us: float = 100.0,
    top: int = 20,
) -> LaunchStats:
    """Launch CPU time, GPU time and launch delay per rank, kernel, op and runtime call.

    >>> import perfcast
    >>> r = launch_stats(perfcast.load("perfcast/examples/ddp_a100_rank0.json.gz"))
    >>> r.summary[0].launches > 0                                 # doctest: +SKIP
    True
    """
    lau = launched(table)
    out = LaunchStats([], [], [], [], [], runtime_cutoff_us, launch_delay_cutoff_us)
    out.notes = input_notes(table)
    if lau.gpu.size == 0:
        return out
    short = lau.gpu_dur < lau.cpu
    slow_call = lau.first & (lau.call_cpu > runtime_cutoff_us * NS_PER_US)
    late = lau.delay > launch_delay_cutoff_us * NS_PER_US
    rank = table.rank[lau.gpu].astype(np.int64)
    flags = np.stack([short, slow_call, late], axis=1).astype(np.int64)

    g = group_stats(rank, lau.cpu)
    gg = group_stats(rank, lau.gpu_dur)
    # Delays of the calls' first operations only (every rank here has some): a CUDA graph's
    # other kernels have no launch delay, and counting them as 0 put the mean launch delay
    # of the 3-graph MLP trace at 1.5 µs, its median at 0 (its 6 calls': 1,202 and 1,196 µs).
    gd = group_stats(rank[lau.first], lau.delay[lau.first])
    q = percentiles_by_group(rank[lau.first], lau.delay[lau.first], (50, 95))
    fl = _flag_sums(rank, flags, g.keys)
    for i, r in enumerate(g.keys.tolist()):
        out.summary.append(
            LaunchSummary(
                rank=r,
                launches=int(g.count[i]),
                cpu_ms=g.sum[i] / NS_PER_MS,
                gpu_ms=gg.sum[i] / NS_PER_MS,
                mean_cpu_us=g.mean[i] / NS_PER_US,
                mean_gpu_us=gg.mean[i] / NS_PER_US,
                mean_delay_us=gd.mean[i] / NS_PER_US,
                p50_delay_us=q[i, 0] / NS_PER_US,
                p95_delay_us=q[i, 1] / NS_PER_US,
                max_delay_us=gd.max[i] / NS_PER_US,
                short_kernels=int(fl[i, 0]),
                runtime_outliers=int(fl[i, 1]),
                delay_outliers=int(fl[i, 2]),
            )
        )
    op = launching_op(table, lau.gpu)
    op_name = np.where(op >= 0, table.name[np.maximum(op, 0)], NONE)
    out.by_kernel = _groups(table, rank, table.name[lau.gpu], lau, flags, top)
    out.by_op = _groups(table, rank, op_name, lau, flags, top)
    out.by_runtime = _groups(table, rank, table.name[lau.call], lau, flags, top)

    # The worst outliers: longest delays and calls first.
    bad = np.flatnonzero(flags[:, 1:].any(axis=1))
    bad = bad[np.argsort(-(lau.delay[bad] + lau.cpu[bad]), kind="stable")[:top]]
    base = {r: int(table.ts[table.rank == r].min()) for r in np.unique(rank[bad]).tolist()}
    for i in bad.tolist():
        f = [n for n, on in zip(("short", "slow call", "late"), flags[i]) if on]
        out.outliers.append(
            LaunchOutlier(
                rank=int(rank[i]),
                kernel=table.names[int(table.name[lau.gpu[i]])],
                op=table.names[int(op_name[i])] if op_name[i] >= 0 else "",
                runtime=table.names[int(table.name[lau.call[i]])],
                start_ms=(int(table.ts[lau.gpu[i]]) - base[int(rank[i])]) / NS_PER_MS,
                cpu_us=lau.cpu[i] / NS_PER_US,
                gpu_us=lau.gpu_dur[i] / NS_PER_US,
                delay_us=lau.delay[i] / NS_PER_US,
                flags=", ".join(f),
            )
        )
    return plain(out)


def _flag_sums(key: np.ndarray, flags: np.ndarray, keys: np.ndarray) -> np.ndarray:
    pos = np.searchsorted(keys, key)
    out = np.zeros((keys.size, flags.shape[1]), dtype=np.int64)
    np.add.at(out, pos, flags)
    return out


def _groups(
    table: EventTable,
    rank: np.ndarray,
    name: np.ndarray,
    lau: Launches,
    flags: np.ndarray,
    top: int,
) -> list[LaunchGroup]:
    """Per (rank, name) launch statistics, the `top` names by GPU time on each rank."""
    ok = name >= 0
    n_names = len(table.names) + 1
    key = rank[ok] * n_names + name[ok]
    g = group_stats(key, lau.cpu[ok])
    gg = group_stats(key, lau.gpu_dur[ok])
    first = lau.first[ok]
    gd = group_stats(key[first], lau.delay[ok][first])  # those with a delay (see above)
    at = np.minimum(np.searchsorted(gd.keys, g.keys), max(gd.keys.size - 1, 0))
    has_delay = (gd.keys[at] == g.keys) if gd.keys.size else np.zeros(g.keys.size, bool)
    fl = _flag_sums(key, flags[ok], g.keys)
    r_of, n_of = np.divmod(g.keys, n_names)
    rows: list[LaunchGroup] = []
    for r in np.unique(r_of).tolist():
        sel = np.flatnonzero(r_of == r)
        sel = sel[np.argsort(-gg.sum[sel], kind="stable")[:top]]  # ties by name (sorted ids)
        for i in sel.tolist():
            rows.append(
                LaunchGroup(
                    rank=int(r),
                    name=table.names[int(n_of[i])],
                    launches=int(g.count[i]),
                    cpu_ms=g.sum[i] / NS_PER_MS,
                    gpu_ms=gg.sum[i] / NS_PER_MS,
                    mean_cpu_us=g.mean[i] / NS_PER_US,
                    mean_gpu_us=gg.mean[i] / NS_PER_US,
                    mean_delay_us=gd.mean[at[i]] / NS_PER_US if has_delay[i] else None,
                    max_delay_us=gd.max[at[i]] / NS_PER_US if has_delay[i] else None,
                    short_kernels=int(fl[i, 0]),
                    runtime_outliers=int(fl[i, 1]),
                    delay_outliers=int(fl[i, 2]),
                )
            )
    return rows
