"""GPU work grouped by the ATen op that launched it, and the delay from op to first kernel.

Each kernel, copy or memset with a known launch call is attributed to the innermost `aten::`
op around that call (HTA's `get_aten_op_kernels_and_delay` uses the same "deepest ATen op"),
else to the innermost CPU op. Per op call: its kernels, their GPU time, and three delays:

- op to first launch: first launch call's start − the op's start (HTA's `aten_op_delay`);
- runtime delay: first kernel's start − its launch call's start (HTA's `runtime_delay`);
- op to first kernel: first kernel's start − the op's start (their sum, what the GPU sees).

`sequences` lists the most frequent (op, kernel sequence) pairs, as HTA does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfcast.analysis.common import NS_PER_MS, NS_PER_US, group_stats, launching_op
from perfcast.analysis.notes import input_notes
from perfcast.events import EventTable
from perfcast.frames import Tables, plain


@dataclass
class OpKernels:
    """GPU work by one launching op on a rank: calls, kernels, GPU ms and the op-to-launch
    and launch-to-kernel delays in µs."""

    rank: int
    op: str
    calls: int  # calls that launched GPU work
    kernels: int
    gpu_ms: float
    mean_gpu_us: float  # per call
    mean_op_to_launch_us: float
    mean_runtime_delay_us: float
    mean_op_to_kernel_us: float
    max_op_to_kernel_us: float
    top_kernel: str  # the kernel with the most GPU time under this op


@dataclass
class KernelSequence:
    """A kernel sequence one op launches, how often, and its mean delays in µs."""

    rank: int
    op: str
    sequence: str  # kernel names in launch order, " -> " joined
    occurrences: int
    mean_op_to_launch_us: float
    mean_runtime_delay_us: float


@dataclass(repr=False)
class OpKernelResult(Tables):
    """Result of `op_kernels`; tables: by_op, sequences."""

    by_op: list[OpKernels]
    sequences: list[KernelSequence]
    notes: list[str] = field(default_factory=list)

    ROW_TYPES = {"by_op": OpKernels, "sequences": KernelSequence}  # noqa: RUF012


def op_kernels(table: EventTable, top: int = 30) -> OpKernelResult:
    """GPU time and launch delays per launching ATen op; frequent kernel sequences.

    >>> import perfcast
    >>> r = op_kernels(perfcast.load("perfcast/examples/ddp_a100_rank0.json.gz"))
    >>> r.by_op[0].op                                                 # doctest: +SKIP
    'aten::addmm'
    """
    out = OpKernelResult([], [], notes=input_notes(table))
    gpu = np.flatnonzero(table.is_gpu() & (table.launch >= 0))
    op = launching_op(table, gpu)
    ok = op >= 0
    gpu, op = gpu[ok], op[ok]
    if gpu.size == 0:
        return out
    call = table.launch[gpu].astype(np.int64)
    # Order by (op call, launch start): each op call's first kernel comes first.
    order = np.lexsort((table.ts[call], op))
    gpu, op, call = gpu[order], op[order], call[order]
    starts = np.flatnonzero(np.r_[True, op[1:] != op[:-1]])
    inst = op[starts]
    first_g, first_c = gpu[starts], call[starts]
    counts = np.diff(np.r_[starts, op.size])
    gpu_ns = np.add.reduceat(table.dur[gpu], starts)
    op_to_launch = table.ts[first_c] - table.ts[inst]
    runtime_delay = table.ts[first_g] - table.ts[first_c]
    op_to_kernel = table.ts[first_g] - table.ts[inst]
    rank = table.rank[inst].astype(np.int64)
    n_names = len(table.names)
    key = rank * n_names + table.name[inst]
    g = group_stats(key, gpu_ns)
    k_cnt = group_stats(key, counts.astype(np.float64))
    d1 = group_stats(key, op_to_launch)
    d2 = group_stats(key, runtime_delay)
    d3 = group_stats(key, op_to_kernel)
    # Top kernel per op name: the (op key, kernel name) pair with the most GPU time.
    kkey = np.repeat(key, counts) * n_names + table.name[gpu]
    kg = group_stats(kkey, table.dur[gpu])
    kop, kname = np.divmod(kg.keys, n_names)
    best: dict[int, int] = {}
    best_t: dict[int, float] = {}
    for o, nm, t in zip(kop.tolist(), kname.tolist(), kg.sum.tolist()):
        if t > best_t.get(o, -1.0):
            best[o], best_t[o] = nm, t
    kept: dict[int, int] = {}
    for i in np.argsort(-g.sum, kind="stable").tolist():
        r, name_i = divmod(int(g.keys[i]), n_names)
        if kept.get(r, 0) >= top:
            continue
        kept[r] = kept.get(r, 0) + 1
        out.by_op.append(
            OpKernels(
                rank=r,
                op=table.names[name_i],
                calls=int(g.count[i]),
                kernels=int(k_cnt.sum[i]),
                gpu_ms=g.sum[i] / NS_PER_MS,
                mean_gpu_us=g.mean[i] / NS_PER_US,
                mean_op_to_launch_us=d1.mean[i] / NS_PER_US,
                mean_runtime_delay_us=d2.mean[i] / NS_PER_US,
                mean_op_to_kernel_us=d3.mean[i] / NS_PER_US,
                max_op_to_kernel_us=d3.max[i] / NS_PER_US,
                top_kernel=table.names[best[int(g.keys[i])]],
            )
        )
    out.by_op.sort(key=lambda row: (row.rank, -row.gpu_ms))
    out.sequences = _sequences(table, gpu, starts, counts, key, op_to_launch, runtime_delay, top)
    return plain(out)


def _sequences(
    table: EventTable,
    gpu: np.ndarray,
    starts: np.ndarray,
    counts: np.ndarray,
    key: np.ndarray,
    op_to_launch: np.ndarray,
    runtime_delay: np.ndarray,
    top: int,
) -> list[KernelSequence]:
    """Most frequent (op, kernel sequence) pairs: sequences hashed without a Python loop."""
    names = table.name[gpu].astype(np.uint64) + np.uint64(1)
    pos = np.arange(gpu.size) - np.repeat(starts, counts)
    base = np.uint64(1_000_003)
    powers = np.ones(int(counts.max()) + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(1, powers.size):
            powers[i] = powers[i - 1] * base
        h = np.add.reduceat(names * powers[pos], starts)
    # Group op calls by (op key, hash, length); count and average their delays.
    full = np.stack([key.astype(np.uint64), h, counts.astype(np.uint64)], axis=1)
    uniq, inv, occ = np.unique(full, axis=0, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    d1 = np.bincount(inv, weights=op_to_launch) / occ
    d2 = np.bincount(inv, weights=runtime_delay) / occ
    first = np.full(uniq.shape[0], -1, dtype=np.int64)
    first[inv[::-1]] = np.arange(inv.size)[::-1]
    n_names = len(table.names)
    rows = []
    for u in np.argsort(-occ, kind="stable")[:top].tolist():
        c = int(first[u])
        a, n = int(starts[c]), int(counts[c])
        r, name_i = divmod(int(key[c]), n_names)
        seq = " -> ".join(table.names_of(gpu[a : a + n]))
        rows.append(
            KernelSequence(
                rank=r,
                op=table.names[name_i],
                sequence=seq,
                occurrences=int(occ[u]),
                mean_op_to_launch_us=float(d1[u]) / NS_PER_US,
                mean_runtime_delay_us=float(d2[u]) / NS_PER_US,
            )
        )
    return rows
