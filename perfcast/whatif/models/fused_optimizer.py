"""fused-optimizer: a for-loop optimizer replaced by foreach or fused kernels.

A for-loop optimizer (Adam, SGD, ...) runs each of its k per-parameter ops
once per parameter: n = k * params small, memory-bound kernels, each with a
fixed cost (launch, scheduling, tail) plus time proportional to the bytes it
touches. Where the durations come from:

- fixed cost per kernel: the 5th percentile of the optimizer's own kernel
  durations (the smallest kernels are almost all fixed cost), measured;
- foreach: each op becomes one multi-tensor op over all parameters, launched
  in chunks of at most 48 tensors (PyTorch's multi_tensor_apply limits tensors
  per launch by list depth: 110, 64, 48, 36, 30 for depths 1-5; foreach Adam
  ops have depth 2-3). Bytes moved are unchanged;
- fused: one kernel for the whole update, chunks of 36 tensors (depth 4:
  params, grads, exp_avg, exp_avg_sq); each element is read 4 times and
  written 3 times instead of about 3 accesses per op, so the variable time
  scales by 7 / (3k) when k >= 3.
- CPU: time per launched kernel (Python, dispatcher, launch) stays as measured,
  so host time scales with the number of launches. On CPU-only traces the
  per-op fixed cost (5th percentile of optimizer op times) is paid once per op
  kind instead of once per parameter.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from perfcast.arrays import combine_codes, split_by
from perfcast.errors import NotApplicableError, OptionValueError
from perfcast.graph.model import Graph, NodeKind
from perfcast.whatif import primitives as P
from perfcast.whatif.kernels import refuse_graph_replays

SUMMARY = "for-loop optimizer -> foreach or fused multi-tensor kernels (kind=foreach|fused)"

# Tensors per multi_tensor_apply launch by list depth (PyTorch's depth_to_max_tensors in
# aten/src/ATen/native/cuda/MultiTensorApply.cuh: 110, 64, 48, 36, 30 for depths 1-5).
TENSORS_PER_LAUNCH = {"foreach": 48, "fused": 36}
# Fused Adam reads param, grad, exp_avg, exp_avg_sq and writes three of them: 7 accesses per
# element, where each for-loop op reads about two tensors and writes one (3 per op).
FUSED_ACCESSES = 7.0
ACCESSES_PER_LOOP_OP = 3.0
# Per torch.optim class with a fused kernel: accesses per element of its fused update. SGD
# with momentum and Adagrad read param, grad and one state tensor and write two of them.
FUSED_ACCESSES_BY_CLASS = {
    "Adam": FUSED_ACCESSES,
    "AdamW": FUSED_ACCESSES,
    "SGD": 5.0,
    "Adagrad": 5.0,
}
# Kernel durations below the trace's resolution read as 0 (2021-era traces record whole
# microseconds): a fixed cost measured as 0 is taken as one such microsecond.
MIN_FIXED_NS = 1_000
_ALREADY_FUSED = (
    "multi_tensor_apply",
    "fused_adam",
    "FusedAdam",
    "_foreach",
    "fused_sgd",
    "MultiTensorApply",
    "fused",
)


@dataclass
class Options:
    kind: str = "foreach"
    params: int | None = None  # number of parameter tensors, if known


def params_estimate(graph: Graph, nodes: np.ndarray) -> tuple[int, int]:
    """(parameters, ops per parameter): the most common op count is the parameter count."""
    c = graph.cols
    op_names = c["op_name"][nodes]
    counts = Counter(op_names[op_names >= 0].tolist())
    if not counts:
        return 0, 0
    mode_count = Counter(counts.values()).most_common(1)[0][0]
    return mode_count, max(1, round(len(nodes) / max(mode_count, 1)))


def check_options(options: Options) -> None:
    """Values the model cannot take (the registry calls this when it builds the options)."""
    if options.kind not in TENSORS_PER_LAUNCH:
        raise OptionValueError("fused-optimizer: kind must be foreach or fused")
    # `if options.params:` below reads 0 as not given: refused here, not silently estimated.
    if options.params is not None and options.params < 2:
        raise OptionValueError(
            f"fused-optimizer: params must be at least 2 (got {options.params}): the parameter "
            "tensors the optimizer updates, which one multi-tensor launch takes together",
            hint="leave params out to count them from the trace",
        )


def apply(graph: Graph, options: Options) -> Graph:
    refuse_graph_replays(graph, "fused-optimizer")
    c = graph.cols
    gpu = P.select(graph, kind="gpu", phase="optimizer")
    gpu = gpu[c["iteration"][gpu] >= 0]
    if gpu.size and already_fused(graph, gpu):
        raise NotApplicableError("fused-optimizer: the optimizer already uses multi-tensor kernels")
    if gpu.size:
        _apply_gpu(graph, gpu, options)
    else:
        _apply_cpu(graph, options)
    return graph


# What the modelled kernels are called: the template PyTorch's multi-tensor kernels share,
# the functor where the fused class is known, marked as perfcast's.
MODELLED = " (modelled)"


def modelled_kernel_name(kind: str, optimizer: str | None) -> str:
    if kind == "fused" and optimizer in ("Adam", "AdamW"):
        return f"multi_tensor_apply_kernel<FusedAdamMathFunctor>{MODELLED}"
    what = f"{kind} {optimizer}" if optimizer else kind
    return f"multi_tensor_apply_kernel ({what}){MODELLED}"


def already_fused(graph: Graph, gpu: np.ndarray) -> bool:
    """Do these optimizer kernels come from a multi-tensor (foreach) or fused optimizer?"""
    names = graph.names
    return any(
        any(k in names[i] for k in _ALREADY_FUSED)
        for i in np.unique(graph.cols["name"][gpu]).tolist()
    )


def _in_zero_grad(graph: Graph, nodes: np.ndarray) -> np.ndarray:
    """Which of `nodes` were launched inside an `Optimizer.zero_grad#...` range."""
    from perfcast.analysis.common import nearest_ancestor

    table = graph.table
    if table is None or nodes.size == 0:
        return np.zeros(nodes.size, dtype=bool)
    is_zero_grad = np.array([n.startswith("Optimizer.zero_grad#") for n in table.names])
    return nearest_ancestor(table, graph.cols["op"][nodes], is_zero_grad[table.name]) >= 0


def _fixed_cost(durs: np.ndarray) -> int:
    return int(min(np.percentile(durs, 5), np.median(durs)))


def _apply_gpu(graph: Graph, gpu: np.ndarray, options: Options) -> None:
    from perfcast.analysis.optimizers import optimizer_class

    c = graph.cols
    per_launch = TENSORS_PER_LAUNCH[options.kind]
    optimizer = optimizer_class(graph.table)
    accesses = FUSED_ACCESSES_BY_CLASS.get(optimizer or "", FUSED_ACCESSES)
    zeroing = int(_in_zero_grad(graph, gpu).sum())
    total_before = total_after = 0
    fixed_seen: list[int] = []
    k_seen: list[int] = []
    most = 0  # the most optimizer kernels of one (rank, step)
    # Grouped by (rank, step) with one sort, and the dropped kernels removed once at the
    # end: a mask and a removal per group cost O(groups x nodes) on long traces.
    host_all = P.select(graph, kind="host", phase="optimizer")
    host_all = host_all[c["kind"][host_all] != NodeKind.LAUNCH]
    host_codes, host_keys = combine_codes(
        c["rank"][host_all].astype(np.int64), c["iteration"][host_all].astype(np.int64)
    )
    host_of = {
        (int(host_keys[code, 0]), int(host_keys[code, 1])): host_all[pos]
        for code, pos in split_by(host_codes)
    }
    codes, keys = combine_codes(
        c["rank"][gpu].astype(np.int64), c["iteration"][gpu].astype(np.int64)
    )
    dropped: list[np.ndarray] = []
    host_scales: list[tuple[np.ndarray, float]] = []
    for code, pos in split_by(codes, c["order"][gpu]):
        rank, it = int(keys[code, 0]), int(keys[code, 1])
        group = gpu[pos]
        n = group.size
        most = max(most, n)
        params, k = params_estimate(graph, group)
        if options.params:
            params = options.params
            k = max(1, round(n / params))
        if params < 2 or n < 4:
            continue
        chunks = math.ceil(params / per_launch)
        n_new = k * chunks if options.kind == "foreach" else chunks
        if n_new >= n:
            continue
        durs = c["dur"][group]
        # No kernel takes no time: a 0 is a whole-microsecond trace rounding it down.
        fixed = _fixed_cost(durs) or MIN_FIXED_NS
        var = np.maximum(durs - fixed, 0).sum()
        if options.kind == "fused" and k >= 3:
            var = var * accesses / (ACCESSES_PER_LOOP_OP * k)
        fixed_seen.append(fixed)
        k_seen.append(k)
        new_total = var + n_new * fixed
        keep, drop = group[:n_new], group[n_new:]
        P.set_duration(graph, keep, int(new_total / n_new))
        # The kept nodes are the new multi-tensor kernels, not the for-loop kernels whose
        # places they take: named so (diff --apply set their time against the old names).
        c["name"][keep] = graph.intern(modelled_kernel_name(options.kind, optimizer))
        dropped.append(drop)
        host = host_of.get((rank, it))
        if host is not None:
            host_scales.append((host, n_new / n))
        total_before += int(durs.sum())
        total_after += int(new_total)
    if dropped:
        P.remove_gpu_work(graph, np.concatenate(dropped))
    # Host time per launch stays as measured: fewer launches, less host time (the launch
    # calls themselves went with the kernels they launched).
    for host, factor in host_scales:
        P.scale(graph, host[graph.alive[host]], factor)
    if total_before == 0:
        if options.params:  # the kernels are there: the count given leaves none to fuse
            raise NotApplicableError(
                f"fused-optimizer: params={options.params:,} leaves nothing to fuse: at "
                f"{per_launch} tensors per multi-tensor launch, that many parameters take no "
                f"fewer launches than the trace's optimizer kernels per step (at most {most:,})",
                hint="leave params out to count them from the trace",
            )
        raise NotApplicableError(
            "fused-optimizer: found no per-parameter optimizer kernels (at least 4 kernels "
            "and 2 parameters per step in the optimizer phase) to fuse"
        )
    k = int(np.median(k_seen))
    if optimizer in ("Adam", "AdamW") or optimizer not in FUSED_ACCESSES_BY_CLASS:
        who = "fused Adam reads param, grad and both moments and writes three"
        if optimizer not in FUSED_ACCESSES_BY_CLASS:
            who += f" (Adam's rule: {optimizer or 'the optimizer class is not named'})"
    else:
        who = f"fused {optimizer} reads param, grad and one state tensor and writes two"
    bytes_rule = (
        f"bytes moved x {accesses:g}/({ACCESSES_PER_LOOP_OP:g} x {k}) ({who}, where each of "
        "the k for-loop ops reads about two tensors and writes one)"
        if options.kind == "fused" and k >= 3
        else "bytes moved unchanged"
    )
    per, where = P.rank_steps(graph, gpu)
    fixed_us = np.median(fixed_seen) / 1e3
    zero_text = (
        f"; {P.per_count(zeroing, per)} of the kernels are zero_grad's per-parameter zero_ "
        "(with foreach or fused, zero_grad zeroes in one multi-tensor op; "
        "zero_grad(set_to_none=True), the default since PyTorch 2.0, launches none)"
        if zeroing
        else ""
    )
    graph.assumptions.append(
        f"optimizer kernels {options.kind}: GPU time {total_before / per / 1e6:.2f} -> "
        f"{total_after / per / 1e6:.2f} ms {where}; {k} ops per parameter, one launch per "
        f"{TENSORS_PER_LAUNCH[options.kind]} tensors (multi_tensor_apply's limit), each paying "
        f"the {fixed_us:.1f} µs fixed cost measured as the 5th percentile of the optimizer's "
        f"kernel times ({MIN_FIXED_NS / 1e3:g} µs where they read 0); {bytes_rule}; host time per "
        f"launch as measured, so host time scales with launches{zero_text}"
    )


def _apply_cpu(graph: Graph, options: Options) -> None:
    c = graph.cols
    host = P.select(graph, kind="host", phase="optimizer")
    host = host[c["iteration"][host] >= 0]
    ops = host[c["op"][host] >= 0]
    if ops.size == 0:
        raise NotApplicableError("fused-optimizer: no optimizer work found in the trace")
    total_before = total_after = 0
    keys = np.stack([c["rank"][ops], c["iteration"][ops]], axis=1)
    for rank, it in np.unique(keys, axis=0).tolist():
        grp = ops[(c["rank"][ops] == rank) & (c["iteration"][ops] == it)]
        # Per op call: its total host time.
        _, inv = np.unique(c["op"][grp], return_inverse=True)
        per_op = np.bincount(inv, weights=c["dur"][grp])
        op_name = c["op_name"][grp][np.unique(inv, return_index=True)[1]]
        counts = Counter(op_name.tolist())
        params = options.params or Counter(counts.values()).most_common(1)[0][0]
        if params < 2:
            continue
        kinds = len(counts)
        fixed = _fixed_cost(per_op)
        var = np.maximum(per_op - fixed, 0).sum()
        n_new = kinds if options.kind == "foreach" else 1
        new_total = var + n_new * fixed
        if options.kind == "fused" and kinds >= 3:
            new_total = var * FUSED_ACCESSES / (ACCESSES_PER_LOOP_OP * kinds) + fixed
        all_host = host[(c["rank"][host] == rank) & (c["iteration"][host] == it)]
        old = c["dur"][all_host].sum()
        if old <= 0:
            continue
        # Work outside the per-parameter ops (Python bookkeeping) scales alike.
        P.scale(graph, all_host, min(1.0, new_total / max(per_op.sum(), 1)))
        total_before += int(old)
        total_after += int(c["dur"][all_host].sum())
    if total_before == 0:
        raise NotApplicableError(
            f"fused-optimizer: too few optimizer ops to fuse ({ops.size} host nodes in the "
            "optimizer phase, but no op runs on 2 or more parameters in any step)"
        )
    per, where = P.rank_steps(graph, host)
    graph.assumptions.append(
        f"optimizer on CPU as {options.kind}: host time {total_before / per / 1e6:.2f} -> "
        f"{total_after / per / 1e6:.2f} ms {where} (per-op fixed cost, the 5th percentile of "
        "the optimizer's op times, paid once per op kind"
        + (
            f"; fused: the rest x {FUSED_ACCESSES:g}/({ACCESSES_PER_LOOP_OP:g} x op kinds), "
            "the bytes rule of the GPU model"
            if options.kind == "fused"
            else ""
        )
        + ")"
    )
