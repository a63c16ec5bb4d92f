"""batch-size: the same training step with the batch `factor` times larger.

Predicted times are per step; per-sample throughput = factor x baseline step
time / predicted step time.

GPU traces, kernel by kernel (Source.SCALED):

- forward and backward kernels are assumed to do work in proportion to the
  batch, spread over more thread blocks of the same size. A kernel's time then
  follows its waves (Habitat's wave scaling, Yu et al., USENIX ATC '21): with
  blocks = prod(grid) and waves(b) = ceil(b / (SMs * blocks_per_SM)), the
  variable part scales by waves(ceil(blocks * factor)) / waves(blocks), so a
  kernel that filled a fraction of one wave stays as fast. blocks_per_SM =
  min(32, max(1, 2048 // threads_per_block)): 2048 resident threads and 32
  resident blocks per SM are the limits of compute capability 8.0 and 9.0
  (CUDA C++ Programming Guide, "Compute Capabilities" table); register and
  shared-memory limits are ignored (they mean fewer blocks per wave, so a
  ratio nearer `factor`). SMs come from the device spec. Without grid/block
  dimensions or a known device the variable part scales by `factor`.
  Kernels that grow the work inside each block instead (weight-gradient GEMMs,
  whose batch is the reduction dimension) are underestimated by this rule;
- every kernel keeps its fixed part: t_new = f + (t - f) * scale with
  f = min(t, fixed), fixed = the 5th percentile of kernel durations (measured);
- device-to-device copies and memsets of forward/backward, and host-to-device
  copies (the batch's inputs), scale the same way by `factor`;
- optimizer kernels and communication are unchanged: they are sized by the
  parameters, not the batch (the gradient all-reduce moves as many bytes);
- CPU: dispatch, launches and synchronizations are unchanged (one launch per
  op whatever the batch); the data-loading phase's CPU time scales by
  `factor` (per-sample decoding and collation).

CPU-only traces: the CPU time of each forward/backward op (the exclusive time
of its segments) scales as f + (d - f) * factor, with f = min(d, fixed) and
fixed = the 5th percentile of those ops' exclusive times, the per-op dispatch
cost (measured); runtime calls stay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from perfcast.errors import NotApplicableError
from perfcast.graph.model import GpuKind, Graph
from perfcast.graph.phases import Phase
from perfcast.hardware import KernelClass, lookup_device
from perfcast.whatif import primitives as P
from perfcast.whatif.kernels import (
    fixed_cost_ns,
    gpu_nodes,
    kernel_fixed_cost_ns,
    scale_variable,
)

SUMMARY = "batch size x factor: kernels scale with their waves, data loading with the batch"

MAX_THREADS_PER_SM = 2048
MAX_BLOCKS_PER_SM = 32
_STEP_PHASES = (int(Phase.FORWARD), int(Phase.BACKWARD))


@dataclass
class Options:
    factor: float = 2.0


def waves(blocks: np.ndarray, per_wave: np.ndarray) -> np.ndarray:
    return np.ceil(np.maximum(blocks, 1) / per_wave)


def apply(graph: Graph, options: Options) -> Graph:
    factor = float(options.factor)
    if not math.isfinite(factor) or factor <= 0:
        raise NotApplicableError("batch-size needs factor > 0")
    gpu = gpu_nodes(graph)
    text = _apply_gpu(graph, gpu, factor) if gpu.size else _apply_cpu(graph, factor)
    loader = _scale_dataloader(graph, factor)
    graph.assumptions.append(
        f"batch x{factor:g}: {text}; {loader}; optimizer and communication unchanged "
        f"(parameter-sized); per-sample throughput = {factor:g} x baseline / predicted step time"
    )
    return graph


def _scale_dataloader(graph: Graph, factor: float) -> str:
    c = graph.cols
    cpu = P.select(graph, kind="cpu", phase="dataloader")
    before = int(c["dur"][cpu].sum())
    P.scale(graph, cpu, factor)
    if cpu.size == 0:
        return "no data-loading CPU work found"
    return f"data-loading CPU {before / 1e6:.2f} -> {int(c['dur'][cpu].sum()) / 1e6:.2f} ms"


def _apply_gpu(graph: Graph, gpu: np.ndarray, factor: float) -> str:
    c = graph.cols
    table = graph.table
    fixed = kernel_fixed_cost_ns(graph)
    phase = c["phase"][gpu]
    gk = c["gpu_kind"][gpu]
    klass = c["klass"][gpu]
    in_step = np.isin(phase, _STEP_PHASES)
    kern = gpu[
        in_step
        & (gk == GpuKind.KERNEL)
        & (klass != KernelClass.COMMUNICATION)
        & (klass != KernelClass.OPTIMIZER)
    ]
    names = graph.names
    is_htod = np.array(
        [("HtoD" in names[i] or "Host -> Device" in names[i]) for i in c["name"][gpu].tolist()],
        dtype=bool,
    )
    is_dtod = np.array(
        [("DtoD" in names[i] or "Device -> Device" in names[i]) for i in c["name"][gpu].tolist()],
        dtype=bool,
    )
    copies = gpu[
        ((gk == GpuKind.MEMCPY) & is_htod & ~np.isin(phase, [Phase.OPTIMIZER, Phase.COMMUNICATION]))
        | (in_step & (((gk == GpuKind.MEMCPY) & is_dtod) | (gk == GpuKind.MEMSET)))
    ]
    if kern.size == 0 and copies.size == 0:
        raise NotApplicableError("batch-size: no forward/backward GPU work to scale")

    # Wave ratio per kernel where grid, block and SM count are known.
    scale = np.full(kern.size, factor, dtype=np.float64)
    n_waves = 0
    if table is not None and kern.size:
        ev = c["event"][kern]
        ok = ev >= 0
        grid = np.where(ok[:, None], table.grid[np.maximum(ev, 0)], 0).astype(np.int64)
        block = np.where(ok[:, None], table.block[np.maximum(ev, 0)], 0).astype(np.int64)
        sms = np.array([_sm_count(graph, int(r)) for r in c["rank"][kern].tolist()], dtype=np.int64)
        known = ok & (grid > 0).all(axis=1) & (block > 0).all(axis=1) & (sms > 0)
        if known.any():
            blocks = grid[known].prod(axis=1)
            threads = block[known].prod(axis=1)
            per_sm = np.clip(MAX_THREADS_PER_SM // threads, 1, MAX_BLOCKS_PER_SM)
            per_wave = sms[known] * per_sm
            new_blocks = np.ceil(blocks * factor)
            scale[known] = waves(new_blocks, per_wave) / waves(blocks, per_wave)
            n_waves = int(known.sum())
    before = int(c["dur"][kern].sum()) + int(c["dur"][copies].sum())
    scale_variable(graph, kern, scale, fixed)
    scale_variable(graph, copies, factor, fixed)
    after = int(c["dur"][kern].sum()) + int(c["dur"][copies].sum())
    return (
        f"{kern.size:,} forward/backward kernels ({n_waves:,} by wave count from grid and "
        f"block sizes, the rest x{factor:g}) and {copies.size:,} copies/memsets: GPU time "
        f"{before / 1e6:.2f} -> {after / 1e6:.2f} ms; fixed {fixed / 1000:.1f} µs per kernel "
        "kept; host dispatch and launches unchanged"
    )


def _sm_count(graph: Graph, rank: int) -> int:
    name = graph.device_names.get(rank)
    spec = lookup_device(name) if name else None
    return int(spec.sm_count) if spec is not None and spec.sm_count else 0


def _apply_cpu(graph: Graph, factor: float) -> str:
    c = graph.cols
    cpu = P.select(graph, kind="cpu", phase=["forward", "backward"])
    cpu = cpu[c["op"][cpu] >= 0]
    if cpu.size == 0:
        raise NotApplicableError("batch-size: no forward/backward work in the trace")
    ops, inv = np.unique(c["op"][cpu], return_inverse=True)
    per_op = np.bincount(inv, weights=c["dur"][cpu].astype(np.float64))
    fixed = fixed_cost_ns(per_op)
    f = np.minimum(per_op, fixed)
    new = f + (per_op - f) * factor
    ratio = np.divide(new, per_op, out=np.ones_like(per_op), where=per_op > 0)
    before = int(c["dur"][cpu].sum())
    P.scale(graph, cpu, ratio[inv])
    after = int(c["dur"][cpu].sum())
    return (
        f"CPU-only: {ops.size:,} forward/backward ops {before / 1e6:.2f} -> {after / 1e6:.2f} ms "
        f"(fixed dispatch cost {fixed / 1000:.1f} µs per op kept)"
    )
