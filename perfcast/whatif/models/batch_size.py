"""batch-size: the same training step with the batch `factor` times larger.

Predicted times are per step; per-sample throughput = factor x baseline step
time / predicted step time.

GPU traces, kernel by kernel (Source.SCALED):

- forward and backward kernels do work in proportion to the batch (their
  FLOPs and activation bytes grow with it), and a kernel that already fills the
  GPU takes time in proportion to its work: the variable part scales by
  `factor`, quantized to whole waves: a kernel's time follows its waves
  (Habitat's wave scaling, Yu et al., USENIX ATC '21), waves(b) = ceil(b / SMs)
  with b = prod(grid) thread blocks, and the variable part scales by
  waves(ceil(b * factor)) / waves(b) for every kernel whose grid is recorded:
  about `factor` for a kernel of many waves, less where its last wave was
  partly empty, and 1 for one too small to fill the GPU once. One resident block per SM
  is the only occupancy assumed: the trace does not say how many of a kernel's
  blocks fit on an SM (registers and shared memory decide), and assuming the
  architectural maximum (up to 32) made large cuDNN kernels look a fraction of
  a wave, predicting x1.44 GPU time for a ResNet-50 batch 64 -> 128 that took
  x1.94 (measured on an H100). Without grid dimensions or a known device the
  variable part scales by `factor`;
- gradient accumulation into parameters (AccumulateGrad) is parameter-sized
  and unchanged;
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

from perfcast.errors import NotApplicableError, OptionValueError
from perfcast.graph.model import GpuKind, Graph
from perfcast.graph.phases import GPU_PHASE_RULE, PHASE_RULES, Phase, in_phases, phase_names
from perfcast.hardware import KernelClass, lookup_device
from perfcast.hardware.classify import copy_direction
from perfcast.whatif import primitives as P
from perfcast.whatif.kernels import (
    fixed_cost_ns,
    gpu_nodes,
    kernel_fixed_cost_ns,
    refuse_graph_replays,
    scale_variable,
)

SUMMARY = (
    "batch size x factor (factor=K): kernels scale with their work, small ones with their "
    "waves; data loading with the batch"
)

_STEP_PHASES = (int(Phase.FORWARD), int(Phase.BACKWARD))
_WHOLE_STEPS = (
    "profile whole training or inference steps, forward included, with torch.profiler's CPU "
    "and CUDA activities and prof.step() once per iteration"
)
_PARAM_SIZED_OPS = ("AccumulateGrad",)


def _param_sized(graph: Graph, gpu: np.ndarray) -> np.ndarray:
    """Per GPU node: launched inside an op whose work is sized by the parameters, not the
    batch (gradient accumulation: `torch::autograd::AccumulateGrad`, whose own kernels
    are its aten::add_'s and copy_'s, so the op's ancestors are read, not its name)."""
    from perfcast.analysis.common import nearest_ancestor

    c = graph.cols
    table = graph.table
    named = np.array([any(k in n for k in _PARAM_SIZED_OPS) for n in graph.names], dtype=bool)
    out = (c["op_name"][gpu] >= 0) & named[np.maximum(c["op_name"][gpu], 0)]
    if table is None or gpu.size == 0:
        return out
    wanted = np.array([any(k in n for k in _PARAM_SIZED_OPS) for n in table.names], dtype=bool)
    ops = c["op"][gpu].astype(np.int64)
    has = (ops >= 0) & (ops < len(table))
    out[has] |= nearest_ancestor(table, ops[has], wanted[table.name]) >= 0
    return out


@dataclass
class Options:
    factor: float = 2.0


def waves(blocks: np.ndarray, per_wave: np.ndarray) -> np.ndarray:
    return np.ceil(np.maximum(blocks, 1) / per_wave)


def check_options(options: Options) -> None:
    """Values the model cannot take (the registry calls this when it builds the options)."""
    factor = float(options.factor)
    if not math.isfinite(factor) or factor <= 0:
        raise OptionValueError("batch-size: factor must be > 0")


def apply(graph: Graph, options: Options) -> Graph:
    factor = float(options.factor)
    gpu = gpu_nodes(graph)
    refuse_graph_replays(graph, "batch-size")
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
    per, per_what = P.rank_steps(graph, cpu)
    after = int(c["dur"][cpu].sum())
    return f"data-loading CPU {before / per / 1e6:.2f} -> {after / per / 1e6:.2f} ms {per_what}"


def _apply_gpu(graph: Graph, gpu: np.ndarray, factor: float) -> str:
    c = graph.cols
    table = graph.table
    fixed = kernel_fixed_cost_ns(graph)
    phase = c["phase"][gpu]
    gk = c["gpu_kind"][gpu]
    klass = c["klass"][gpu]
    names = graph.names
    in_step = np.isin(phase, _STEP_PHASES)
    param_sized = _param_sized(graph, gpu)
    kern = gpu[
        in_step
        & (gk == GpuKind.KERNEL)
        & (klass != KernelClass.COMMUNICATION)
        & (klass != KernelClass.OPTIMIZER)
        & ~param_sized
    ]
    direction = [copy_direction(names[i]) for i in c["name"][gpu].tolist()]
    is_htod = np.array([d == "HtoD" for d in direction], dtype=bool)
    # Kineto names peer copies "Memcpy PtoP (Device -> Device)": copies within GPU memory.
    is_dtod = np.array([d in ("DtoD", "PtoP") for d in direction], dtype=bool)
    copies = gpu[
        ((gk == GpuKind.MEMCPY) & is_htod & ~np.isin(phase, [Phase.OPTIMIZER, Phase.COMMUNICATION]))
        | (in_step & (((gk == GpuKind.MEMCPY) & is_dtod) | (gk == GpuKind.MEMSET)))
    ]
    if kern.size == 0 and copies.size == 0:
        present = phase_names(phase)
        where = in_phases(present) if present else "outside every step"
        sized = (
            " (the forward/backward ones are parameter-sized: AccumulateGrad, optimizer or "
            "collective kernels)"
            if in_step.any()
            else ""
        )
        raise NotApplicableError(
            f"batch-size: no forward/backward GPU work to scale: the trace's GPU work "
            f"({gpu.size:,} task{'s' if gpu.size != 1 else ''}) is all {where}{sized}; "
            f"{PHASE_RULES}; {GPU_PHASE_RULE}",
            hint=_WHOLE_STEPS,
        )

    # Wave ratio per kernel where grid, block and SM count are known.
    scale = np.full(kern.size, factor, dtype=np.float64)
    n_waves = 0
    if table is not None and kern.size:
        ev = c["event"][kern]
        ok = ev >= 0
        grid = np.where(ok[:, None], table.grid[np.maximum(ev, 0)], 0).astype(np.int64)
        sms = np.array([_sm_count(graph, int(r)) for r in c["rank"][kern].tolist()], dtype=np.int64)
        known = ok & (grid > 0).all(axis=1) & (sms > 0)
        if known.any():
            blocks = grid[known].prod(axis=1)
            per_wave = sms[known]
            new_blocks = np.ceil(blocks * factor)
            scale[known] = waves(new_blocks, per_wave) / waves(blocks, per_wave)
            n_waves = int((blocks < per_wave).sum())
    before = int(c["dur"][kern].sum()) + int(c["dur"][copies].sum())
    scale_variable(graph, kern, scale, fixed)
    scale_variable(graph, copies, factor, fixed)
    after = int(c["dur"][kern].sum()) + int(c["dur"][copies].sum())
    sm_text = ", ".join(
        f"{name} {sms} SMs"
        for name, sms in sorted(
            {
                graph.device_names.get(int(r)) or "?": _sm_count(graph, int(r))
                for r in set(c["rank"][kern].tolist())
            }.items()
        )
        if sms
    )
    wave_rule = (
        f"; a wave is one resident block per SM ({sm_text}, device table), which underestimates "
        "what a wave holds for small blocks that fit several per SM"
        if sm_text
        else "; device SM count unknown: every kernel scaled by the factor"
    )
    per, per_what = P.rank_steps(graph, np.concatenate([kern, copies]).astype(np.int64))
    return (
        f"{per_what}: {P.per_count(kern.size, per)} forward/backward kernels x{factor:g} "
        f"(by their waves: ceil(blocks x {factor:g} / SMs) / ceil(blocks / SMs), "
        f"{P.per_count(n_waves, per)} of them smaller than one wave{wave_rule}) "
        f"and {P.per_count(copies.size, per)} copies/memsets: GPU time "
        f"{before / per / 1e6:.2f} -> {after / per / 1e6:.2f} ms; fixed {fixed / 1000:.1f} µs "
        "per kernel kept; host dispatch and launches unchanged"
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
        host = P.select(graph, kind="cpu")
        present = phase_names(c["phase"][host[(c["op"][host] >= 0) & (c["iteration"][host] >= 0)]])
        where = (
            f"the steps' CPU ops are all {in_phases(present)}"
            if present
            else ("the steps hold no CPU ops")
        )
        raise NotApplicableError(
            f"batch-size: no forward/backward work to scale in this CPU-only trace: {where}; "
            f"{PHASE_RULES}",
            hint=_WHOLE_STEPS,
        )
    ops, inv = np.unique(c["op"][cpu], return_inverse=True)
    per_op = np.bincount(inv, weights=c["dur"][cpu].astype(np.float64))
    fixed = fixed_cost_ns(per_op)
    f = np.minimum(per_op, fixed)
    new = f + (per_op - f) * factor
    ratio = np.divide(new, per_op, out=np.ones_like(per_op), where=per_op > 0)
    before = int(c["dur"][cpu].sum())
    P.scale(graph, cpu, ratio[inv])
    after = int(c["dur"][cpu].sum())
    per, per_what = P.rank_steps(graph, cpu)
    return (
        f"CPU-only, {per_what}: {P.per_count(ops.size, per)} forward/backward ops "
        f"{before / per / 1e6:.2f} -> {after / per / 1e6:.2f} ms (fixed dispatch cost "
        f"{fixed / 1000:.1f} µs per op kept)"
    )
