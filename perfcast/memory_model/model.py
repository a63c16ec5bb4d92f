"""Peak memory of a training step per rank: parameters, gradients, optimizer state,
activations, temporaries and library workspaces; checked against the device.

Where the numbers come from (`MemoryEstimate.source`):

- "[memory] events": the trace was recorded with `profile_memory=True`; the peak of the GPU
  allocator's running total is measured, and a what-if scales the modelled parts of it.
- "op shapes": the estimate below, from `perfcast.memory_model.facts` (parameter shapes of the
  `AccumulateGrad` ops, the optimizer named by its ops, activations kept for backward from the
  forward ops' input shapes).
- "model description": the same estimate from a `perfcast.plan` model description.

The estimate (PyTorch's caching allocator, `max_memory_allocated`, steady state):

    weights   W = params x 4 bytes (fp32 parameters; autocast keeps them fp32)
    grads     G = params x 4, alive from backward to zero_grad(set_to_none=True)
    optimizer O = params x 8 (Adam/AdamW: exp_avg, exp_avg_sq), x 4 (SGD with momentum)
    saved activations s_1..s_n (forward order), freed in reverse order during backward

    forward peak  = W + O + sum(s_1..s_n) + s_n + workspace, + G when the trace's zero_grad
                    runs between forward and backward (the last step's gradients are alive)
    backward peak = max_k  W + O + sum(s_1..s_k) + G (n-k)/n + s_k + s_(k+1) + workspace
                    (layer k's gradient-of-output and gradient-of-input buffers are live while
                    it runs; gradients are assumed to appear evenly over backward); where
                    activation checkpointing recomputes a region, r_k replaces s_k + s_(k+1):
                    the region's own walk, its tensors and its worst layer's buffers
    optimizer peak = W + G + O + temporaries (for-loop Adam: 2 x the largest parameter;
                    foreach: one full-size list (sqrt of exp_avg_sq); fused: none)
    workspace = 32 MiB cuBLAS workspace per CPU thread that launched GEMMs on sm90+ GPUs
                (PyTorch's default CUBLAS_WORKSPACE_CONFIG :4096:8 there), 8 MiB before

What it leaves out: allocator fragmentation and rounding (blocks are 512-byte multiples),
cuDNN benchmark-mode autotuning (it can try algorithms with gigabytes of workspace in the first
iterations, and `max_memory_allocated` keeps that peak), CUDA-graph private pools, memory
still held by an earlier job in the same process, NCCL buffers (outside the caching
allocator).
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from perfcast.memory_model.facts import ForwardOps, TraceFacts, trace_facts

MIB = 1 << 20
GIB = 1 << 30
# PyTorch's default cuBLAS workspace: CUBLAS_WORKSPACE_CONFIG ":4096:8" (32 MiB) on sm90+,
# ":4096:2:16:8" (8 MiB + 128 KiB) before (aten/src/ATen/cuda/CublasHandlePool.cpp).
_WORKSPACE_SM90 = 32 * MIB
_WORKSPACE_OLDER = 8 * MIB + 128 * 1024
# conv2d, _convolution, cudnn_convolution, conv_transpose2d; not convert_element_type.
_CONVOLUTION = re.compile(r"(?<![a-z])conv(?!ert)", re.IGNORECASE)
OPT_STATE_BYTES = {"adam": 8, "sgd": 4, "adagrad": 4, "rmsprop": 4, "adadelta": 8, "none": 0}


@dataclass
class MemoryInputs:
    """Everything the estimate needs, from a trace or from a model description."""

    param_numels: list[int]
    saved_bytes: list[int]  # activations kept for backward, forward order
    # The same tensors under 16-bit autocast (an fp32 trace's facts), else None: what the
    # AMP what-if uses instead of halving every one of them.
    saved_bytes_autocast: list[int] | None = None
    castable_params: int | None = None  # parameters autocast copies to 16 bits (None: all)
    optimizer: str = "adam"
    optimizer_impl: str = "for-loop"
    param_bytes: int = 4  # bytes per stored parameter
    grad_bytes: int = 4
    master_bytes: int = 0  # fp32 master copy kept by the optimizer (Megatron-style fp16)
    act_bytes_per_elem: int = 4
    workspace_bytes: int = 0
    capacity_bytes: int | None = None
    device_name: str | None = None
    extra_bytes: int = 0  # modelled buffers a what-if adds (DDP buckets, gathered shards)
    transient_bytes: int = 0  # a what-if's buffer that lives only while it is used
    set_to_none: bool = True
    assumptions: list[str] = field(default_factory=list)
    source: str = "op shapes"
    measured_peak_bytes: int | None = None
    shard_weights: float = 1.0  # fraction of W a rank keeps
    shard_grads: float = 1.0
    shard_optimizer: float = 1.0
    # The previous step's gradients are alive through forward (zero_grad between forward
    # and backward): the end of forward is a peak candidate with them.
    grads_live_in_forward: bool = False
    has_backward: bool = True  # False: an inference step, whose peak is in forward
    # The forward ops (a trace's), and the op that saved each of `saved_bytes`: where
    # activation checkpointing looks for repeated blocks. None once a change reshaped them.
    forward: ForwardOps | None = None
    saved_at: list[int] | None = None
    # Bytes recomputed while backward runs past each saved tensor (activation
    # checkpointing's regions), aligned with `saved_bytes`; with its autocast twin.
    recompute_bytes: list[int] | None = None
    recompute_bytes_autocast: list[int] | None = None

    @property
    def params(self) -> int:
        return int(sum(self.param_numels))


@dataclass
class MemoryEstimate:
    """Predicted peak memory of one rank's step, by part (bytes), and whether it fits."""

    peak_bytes: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    temporaries_bytes: int
    workspace_bytes: int
    at: str  # the phase where the peak falls: backward / optimizer
    source: str
    capacity_bytes: int | None = None
    device: str | None = None
    measured_peak_bytes: int | None = None  # the trace's own peak ([memory] events)
    assumptions: list[str] = field(default_factory=list)

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    @property
    def fits(self) -> bool | None:
        """None when the device's memory is unknown."""
        if self.capacity_bytes is None:
            return None
        return self.peak_bytes <= self.capacity_bytes

    def verdict(self) -> str:
        """One line: the peak, the device, and whether it fits."""
        cap = self.capacity_bytes
        if cap is None:
            return f"predicted peak {self.peak_gib:.2f} GiB (device memory unknown)"
        word = "fits" if self.fits else "DOES NOT FIT"
        return (
            f"predicted peak {self.peak_gib:.2f} GiB of {cap / GIB:.1f} GiB"
            f"{' on ' + self.device if self.device else ''}: {word}"
        )


def cudnn_autotune_note(facts: TraceFacts) -> str | None:
    """For a GPU trace with convolutions: the peak is a steady step's, and cuDNN's benchmark
    mode can take more in the first steps (measured on the recorded H100 runs)."""
    if not facts.has_gpu or not any(_CONVOLUTION.search(t.op) for t in facts.saved):
        return None
    return (
        "a steady step's peak: with torch.backends.cudnn.benchmark=True the first steps "
        "peak higher while cuDNN tries its algorithms (measured on an H100: ResNet-50 "
        "10.2 vs 5.6 GiB, a small CNN 2.4 vs 1.2 GiB)"
    )


def inputs_from_facts(facts: TraceFacts) -> MemoryInputs:
    """The estimate's inputs from a trace's facts."""
    from perfcast.hardware.devices import lookup_device

    spec = lookup_device(facts.device_name) if facts.device_name else None
    cap = facts.device_bytes
    if cap is None and spec is not None:
        cap = int(spec.mem_gb * GIB)
    major = _compute_major(facts.device_name)
    per = _WORKSPACE_SM90 if major >= 9 else _WORKSPACE_OLDER
    threads = facts.matmul_threads if facts.has_gpu else 0
    notes = list(facts.notes)
    notes.append(
        f"{len(facts.param_numels)} parameters ({facts.params / 1e6:.2f} M) from AccumulateGrad "
        f"shapes; "
        + (
            f"{facts.optimizer} ({facts.optimizer_impl}) state; "
            if facts.optimizer != "none"
            else "no optimizer state (no backward or optimizer in the step); "
        )
        + f"{len(facts.saved)} saved activations ({facts.activation_bytes / GIB:.3f} GiB at "
        f"{facts.act_bytes_per_elem} bytes per element, {facts.compute_dtype} compute) from "
        "forward op shapes"
    )
    if threads:
        notes.append(
            f"cuBLAS workspace {per / MIB:g} MiB x {threads} thread(s) that launched GEMMs"
        )
    autotune = cudnn_autotune_note(facts)
    if autotune:
        notes.append(autotune)
    castable = facts.params - facts.embedding_param_numel  # embedding tables are not cast
    extra = 0
    if facts.act_bytes_per_elem == 2 and facts.params:
        # An autocast trace: the 16-bit weight copies autocast caches for the forward pass
        # are kept by the layers for backward.
        extra = castable * 2
        notes.append(f"autocast's 16-bit weight copies: {extra / MIB:.0f} MiB")
    return MemoryInputs(
        extra_bytes=extra,
        param_numels=list(facts.param_numels),
        saved_bytes=[s.nbytes for s in facts.saved],
        saved_bytes_autocast=[s.autocast_nbytes for s in facts.saved],
        castable_params=castable,
        optimizer=facts.optimizer,
        optimizer_impl=facts.optimizer_impl,
        act_bytes_per_elem=facts.act_bytes_per_elem,
        workspace_bytes=per * threads,
        capacity_bytes=cap,
        device_name=spec.name if spec else facts.device_name,
        assumptions=notes,
        source="op shapes",
        measured_peak_bytes=facts.measured_peak_bytes,
        grads_live_in_forward=facts.grads_live_in_forward,
        has_backward=facts.has_backward,
        forward=facts.forward_ops if facts.forward_ops.tokens else None,
        saved_at=[t.op_index for t in facts.saved],
    )


def _compute_major(device: str | None) -> int:
    if not device:
        return 8
    d = device.lower()
    if any(k in d for k in ("h100", "h200", "h800", "gh200", "b200", "gb200", "b100")):
        return 9
    return 8


def estimate(inputs: MemoryInputs) -> MemoryEstimate:
    """Peak of one rank's step from its inputs (see the module docstring)."""
    p = inputs.params
    w = int(p * inputs.param_bytes * inputs.shard_weights)
    g = int(p * inputs.grad_bytes * inputs.shard_grads)
    state = OPT_STATE_BYTES.get(inputs.optimizer, 8) + inputs.master_bytes
    o = int(p * state * inputs.shard_optimizer)
    s = inputs.saved_bytes
    a = int(sum(s))
    ws = inputs.workspace_bytes
    base = w + o + inputs.extra_bytes + ws
    # Backward: walk the saved tensors in reverse; layer k's buffers are live while it runs.
    best_bwd, k_best = base + a, len(s)
    live = a
    n = len(s)
    g_live = 0 if inputs.set_to_none else g
    rec = inputs.recompute_bytes
    if rec is not None and len(rec) != n:
        rec = None
    for k in range(n, 0, -1):
        grads_so_far = g * (n - k) / n if n else 0.0
        if not inputs.set_to_none:
            grads_so_far = g
        recomputed = rec[k - 1] if rec else 0
        # A recomputed region brings its own gradient buffers (counted in `recomputed`).
        transient = 0 if recomputed else s[k - 1] + (s[k] if k < n else 0)
        total = base + live + grads_so_far + transient + recomputed + inputs.transient_bytes
        if total > best_bwd:
            best_bwd, k_best = int(total), k
        live -= s[k - 1]
    if n == 0:
        best_bwd = base + g_live + inputs.transient_bytes
    # The end of forward: everything saved, the last output being written, and the last
    # step's gradients when zero_grad has not run yet.
    g_fwd = g if inputs.grads_live_in_forward or not inputs.set_to_none else 0
    fwd_end = base + a + g_fwd + (s[-1] if s else 0)
    largest = max(inputs.param_numels) if inputs.param_numels else 0
    impl = inputs.optimizer_impl
    if inputs.optimizer == "none" or p == 0 or impl == "fused":
        opt_tmp = 0
    elif impl == "foreach":
        opt_tmp = int(p * 4 * inputs.shard_optimizer)
    else:
        opt_tmp = 2 * largest * 4
    opt_peak = w + g + o + opt_tmp + inputs.extra_bytes + ws
    if opt_peak > max(best_bwd, fwd_end):
        peak, at = opt_peak, "optimizer"
        temporaries = opt_tmp
    elif fwd_end > best_bwd:
        peak, at = fwd_end, "forward"
        temporaries = max(0, fwd_end - base - a)
    else:
        peak, at = best_bwd, "backward" if inputs.has_backward else "forward"
        temporaries = max(0, best_bwd - base - a)
    del k_best
    return MemoryEstimate(
        peak_bytes=int(peak),
        weights_bytes=w,
        grads_bytes=g,
        optimizer_bytes=o,
        activations_bytes=a,
        temporaries_bytes=int(temporaries),
        workspace_bytes=ws,
        at=at,
        source=inputs.source,
        capacity_bytes=inputs.capacity_bytes,
        device=inputs.device_name,
        measured_peak_bytes=inputs.measured_peak_bytes,
        assumptions=list(inputs.assumptions),
    )


# ----------------------------------------------------------------------------------------------
# What-ifs that change memory. Each takes the inputs and the model's options (strings or
# typed values, as `perfcast whatif --apply NAME:k=v` passes them) and returns new inputs.


def _opt(options: Mapping[str, Any], key: str, default: Any, cast: type = float) -> Any:
    v = options.get(key, default)
    if v is None:
        return None
    if cast is bool and isinstance(v, str):
        return v.lower() in ("1", "true", "yes", "on")
    return cast(v)


def _batch(inp: MemoryInputs, o: Mapping[str, Any]) -> MemoryInputs:
    f = _opt(o, "factor", 2.0)
    note = f"batch x{f:g}: saved activations scale with the batch"
    auto = inp.saved_bytes_autocast
    fwd = inp.forward
    return replace(
        inp,
        saved_bytes=_scaled(inp.saved_bytes, f),
        saved_bytes_autocast=_scaled(auto, f),
        recompute_bytes=_scaled_rec(inp.recompute_bytes, f),
        recompute_bytes_autocast=_scaled_rec(inp.recompute_bytes_autocast, f),
        forward=None
        if fwd is None
        else replace(
            fwd,
            input_bytes=_scaled(fwd.input_bytes, f),
            input_bytes_autocast=_scaled(fwd.input_bytes_autocast, f),
        ),
        assumptions=[*inp.assumptions, note],
    )


def _scaled(xs: list[int] | None, f: float) -> Any:
    return None if xs is None else [int(x * f) for x in xs]


def _scaled_rec(xs: list[int] | None, f: float) -> Any:
    # A recompute entry stays nonzero: zero means "no region here" to the backward walk.
    return None if xs is None else [max(1, int(x * f)) if x else 0 for x in xs]


def _amp(inp: MemoryInputs, o: Mapping[str, Any]) -> MemoryInputs:
    if inp.act_bytes_per_elem <= 2:
        return replace(inp, assumptions=[*inp.assumptions, "amp: activations already 16-bit"])
    auto = inp.saved_bytes_autocast
    if auto is not None and len(auto) == len(inp.saved_bytes):
        saved = list(auto)
        what = (
            "activations by autocast's op lists (GEMM and convolution inputs 16-bit, norms "
            "and softmax fp32, other ops in the dtype they read, dropout masks 1 byte)"
        )
    else:
        r = 2 / inp.act_bytes_per_elem
        saved = [int(x * r) for x in inp.saved_bytes]
        what = "activations 16-bit (half the bytes)"
    # Autocast caches a 16-bit copy of every weight it casts for the forward pass (not the
    # embedding tables); the layers keep it for backward.
    castable = inp.params if inp.castable_params is None else inp.castable_params
    copies = castable * 2
    note = (
        f"amp: {what}; parameters, gradients and optimizer stay fp32; autocast's 16-bit "
        f"weight copies add {copies / MIB:.0f} MiB"
    )
    fwd = inp.forward
    rec = inp.recompute_bytes
    if rec is not None:
        rec = inp.recompute_bytes_autocast or [int(x * 2 / inp.act_bytes_per_elem) for x in rec]
    return replace(
        inp,
        saved_bytes=saved,
        saved_bytes_autocast=None,
        recompute_bytes=rec,
        recompute_bytes_autocast=None,
        forward=None if fwd is None else replace(fwd, input_bytes=list(fwd.input_bytes_autocast)),
        act_bytes_per_elem=2,
        extra_bytes=inp.extra_bytes + copies,
        assumptions=[*inp.assumptions, note],
    )


def _checkpoint(inp: MemoryInputs, o: Mapping[str, Any]) -> MemoryInputs:
    s = inp.saved_bytes
    if not s:
        return inp
    if inp.recompute_bytes is not None:
        note = "activation checkpointing applied already: a second pass changes nothing"
        return replace(inp, assumptions=[*inp.assumptions, note])
    asked = int(_opt(o, "regions", 0, int) or 0)
    fwd, at = inp.forward, inp.saved_at
    if fwd is not None and at is not None and len(at) == len(s) and _valid_at(at, fwd):
        b = repeated_blocks(fwd.tokens, asked or None, s, at)
        if b is not None:
            spans = [
                (b.start + j * b.period, b.start + (j + 1) * b.period) for j in range(b.repeats)
            ]
            what = (
                f"{b.repeats} repeated blocks ({b.period} forward ops each, from op {b.start}); "
                "the ops outside them keep what they save"
            )
            return _checkpoint_spans(inp, spans, what)
        # No repeated blocks: contiguous regions of about equal forward op counts (a CNN's
        # stages have about as many layers each, its early ones more bytes).
        n_ops = len(fwd.tokens)
        regions = max(1, min(asked or round(math.sqrt(len(s))), n_ops))
        bounds = [round(i * n_ops / regions) for i in range(regions + 1)]
        # Each region starts at a layer: an op that saves its input, or would but another
        # op saved that tensor already (not a view or a copy on the way).
        starts = sorted(set(at) | {i for i, dup in enumerate(fwd.input_saved) if dup})
        snapped = [0]
        for bound in bounds[1:-1]:
            k = bisect.bisect_left(starts, bound)
            snapped.append(starts[k] if k < len(starts) else n_ops)
        snapped.append(n_ops)
        spans = [(a, b) for a, b in itertools.pairwise(snapped) if b > a]
        what = f"{len(spans)} regions of equal forward op counts (no repeated blocks found)"
        return _checkpoint_spans(inp, spans, what)
    # No forward ops to go by (a model description): regions of equal counts of saved
    # tensors, each keeping its first.
    regions = max(1, min(asked or round(math.sqrt(len(s))), len(s)))
    n = len(s)
    bounds = [round(i * n / regions) for i in range(regions + 1)]
    idx = [(a, b) for a, b in itertools.pairwise(bounds) if b > a]
    auto = inp.saved_bytes_autocast
    biggest = max(sum(s[a:b]) for a, b in idx)
    note = (
        f"activation checkpointing, {len(idx)} regions of equal counts of saved tensors: each "
        f"keeps its input; backward recomputes one region at a time ({biggest / GIB:.3f} GiB "
        "at most)"
    )
    return replace(
        inp,
        saved_bytes=[s[a] for a, _ in idx],
        saved_bytes_autocast=None if auto is None else [auto[a] for a, _ in idx],
        recompute_bytes=[sum(s[a:b]) for a, b in idx],
        recompute_bytes_autocast=None if auto is None else [sum(auto[a:b]) for a, b in idx],
        forward=None,
        saved_at=None,
        assumptions=[*inp.assumptions, note],
    )


def checkpointed_inputs(inp: MemoryInputs) -> MemoryInputs | None:
    """The inputs with full activation checkpointing applied as the what-if's default places
    it (repeated blocks, else regions of equal op counts); None without saved tensors."""
    out = _checkpoint(inp, {})
    return out if out.recompute_bytes is not None else None


# Forward ops longer than this are not searched for repeats (the search is quadratic: about
# 0.2 s at this many ops with few distinct ones, on a 2-core VM).
_MAX_OPS_SEARCHED = 5_000


def _valid_at(at: list[int], fwd: ForwardOps) -> bool:
    """Saved tensors' op indices sorted and inside the forward ops (a hand-made input may
    not be)."""
    n = len(fwd.tokens)
    return all(0 <= a < n for a in at) and all(x <= y for x, y in itertools.pairwise(at))


@dataclass(frozen=True)
class Blocks:
    """`repeats` consecutive copies of the same `period` forward ops from op `start`."""

    start: int
    period: int
    repeats: int


def repeated_blocks(
    tokens: list[int], count: int | None, saved: list[int], saved_at: list[int]
) -> Blocks | None:
    """The repeated blocks a user checkpoints: the longest run of identical consecutive op
    sequences (same op names and input shapes) whose blocks hold at least half of the saved
    bytes. With `count`, a run of at least that many blocks, the blocks as long as possible
    (12 layers in 4 regions: 3 layers each); without, the run covering the most ops, in the
    shortest blocks (one layer each, as Hugging Face's and torchtitan's per-layer
    checkpointing do). None when there is no such run."""
    a = np.asarray(tokens, dtype=np.int64)
    n = int(a.size)
    if n < 2 or n > _MAX_OPS_SEARCHED:
        return None
    saved_on = np.zeros(n, dtype=bool)
    saved_on[np.asarray(saved_at, dtype=np.int64)] = True
    total = float(sum(saved))
    cum = np.concatenate([[0.0], np.cumsum(np.bincount(saved_at, weights=saved, minlength=n))])
    best: tuple[tuple[int, int], Blocks] | None = None
    for p in range(1, n // 2 + 1):
        same = a[:-p] == a[p:]  # same[i]: op i repeats p ops later
        # Runs of `same`: a run of length L from i means ops i .. i+L+p-1 have period p.
        edges = np.flatnonzero(np.diff(np.concatenate([[0], same.astype(np.int8), [0]])))
        for lo, hi in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
            reps = (hi - lo + p) // p
            if reps < 2 or (count is not None and reps < count):
                continue
            if count is not None:
                p_eff, use = p * (reps // count), count  # fewer, longer blocks
            else:
                p_eff, use = p, reps
            span = use * p_eff
            # Align the blocks on an op that saves a tensor (a block starts where its input
            # is first kept: a norm, convolution or linear layer).
            slack = hi - lo + p - span
            on = np.flatnonzero(saved_on[lo : lo + slack + 1])
            start = lo + (int(on[0]) if on.size else 0)
            if (cum[start + span] - cum[start]) < 0.5 * total:
                continue
            key = (span, use) if count is None else (p_eff, span)
            if best is None or key > best[0]:
                best = (key, Blocks(start, p_eff, use))
    return None if best is None else best[1]


def _region_peak(saved: list[int], output: int) -> int:
    """What backward holds while it runs a recomputed region, by the same rule as the
    whole step's walk: the region's tensors saved up to layer i, and layer i's gradient
    buffers (s_i + s_(i+1)), at the worst layer; past the region's last layer, the
    gradient of the region's output (`output` bytes)."""
    out, prefix = 0, 0
    for i, x in enumerate(saved):
        prefix += x
        out = max(out, prefix + x + (saved[i + 1] if i + 1 < len(saved) else output))
    return out


def _checkpoint_spans(inp: MemoryInputs, spans: list[tuple[int, int]], what: str) -> MemoryInputs:
    """Checkpoint regions over forward op indices [lo, hi): each keeps its input; ops
    outside them (embedding, head, loss) keep what they save; backward recomputes one
    region at a time."""
    fwd, at = inp.forward, inp.saved_at
    assert fwd is not None and at is not None
    s, auto = inp.saved_bytes, inp.saved_bytes_autocast
    first, end = spans[0][0], spans[-1][1]
    kept: list[int] = []
    kept_auto: list[int] = []
    rec: list[int] = []
    rec_auto: list[int] = []

    def keep(x: int, xa: int, r: int = 0, ra: int = 0) -> None:
        kept.append(x)
        kept_auto.append(xa)
        rec.append(r)
        rec_auto.append(ra)

    for i, op in enumerate(at):
        if op < first:
            keep(s[i], auto[i] if auto else s[i])
    for j, (lo, hi) in enumerate(spans):
        inside = range(bisect.bisect_left(at, lo), bisect.bisect_left(at, hi))
        # The region's input, unless the first region reads a tensor kept before it.
        first_kept = j == 0 and fwd.input_saved[lo]
        sz = [s[i] for i in inside]
        sza = [(auto[i] if auto else s[i]) for i in inside]
        # Never more than the region would have saved without checkpointing (a region
        # starting at a view of a large buffer keeps no copy of it).
        x_in = 0 if first_kept else min(fwd.input_bytes[lo], sum(sz))
        xa_in = 0 if first_kept else min(fwd.input_bytes_autocast[lo], sum(sza))
        if inside and at[inside[0]] == lo:
            # Its first op saves the region's input again while recomputing: one tensor.
            sz[0] -= min(x_in, sz[0])
            sza[0] -= min(xa_in, sza[0])
        # The region's output: what the next region or the first op after them reads.
        nxt = hi if j + 1 == len(spans) else spans[j + 1][0]
        y = fwd.input_bytes[nxt] if nxt < len(fwd.input_bytes) else 0
        ya = fwd.input_bytes_autocast[nxt] if nxt < len(fwd.input_bytes) else 0
        keep(x_in, xa_in, max(1, _region_peak(sz, y)), max(1, _region_peak(sza, ya)))
    for i, op in enumerate(at):
        if op >= end:
            keep(s[i], auto[i] if auto else s[i])
    biggest = max(rec) if rec else 0
    note = (
        f"activation checkpointing of {what}: each region keeps its input; backward "
        f"recomputes one region at a time ({biggest / GIB:.3f} GiB at most)"
    )
    return replace(
        inp,
        saved_bytes=kept,
        saved_bytes_autocast=kept_auto if auto is not None else None,
        recompute_bytes=rec,
        recompute_bytes_autocast=rec_auto if auto is not None else None,
        forward=None,
        saved_at=None,
        assumptions=[*inp.assumptions, note],
    )


def _fused(inp: MemoryInputs, o: Mapping[str, Any]) -> MemoryInputs:
    from perfcast.whatif.models.fused_optimizer import Options as FusedOptions

    # The what-if's own default, so that memory and time assume the same optimizer.
    kind = str(o.get("kind", FusedOptions().kind))
    return replace(inp, optimizer_impl=kind, assumptions=[*inp.assumptions, f"optimizer: {kind}"])


# The scale-out what-ifs' defaults, so that memory and time assume the same plan: zero's
# layer units and pipeline-parallel's micro-batches per stage.
ZERO_UNITS = 16
PP_MICROBATCHES_PER_STAGE = 4


def _ddp(inp: MemoryInputs, o: Mapping[str, Any]) -> MemoryInputs:
    g = inp.params * inp.grad_bytes
    note = (
        "ddp: gradient buckets are a second copy of the gradients "
        "(gradient_as_bucket_view=False, DDP's default)"
    )
    return replace(inp, extra_bytes=inp.extra_bytes + g, assumptions=[*inp.assumptions, note])


def _zero(inp: MemoryInputs, o: Mapping[str, Any]) -> MemoryInputs:
    n = int(_opt(o, "gpus", 8, int))
    stage = int(_opt(o, "stage", 3, int))
    units = int(_opt(o, "units", 0, int) or ZERO_UNITS)
    prefetch = int(_opt(o, "prefetch", 1, int))
    sw = 1 / n if stage >= 3 else 1.0
    sg = 1 / n if stage >= 2 else 1.0
    so = 1 / n if stage >= 1 else 1.0
    extra = 0
    if stage >= 3 and inp.param_numels:
        # The unit running and those prefetched hold their full parameters at once.
        live = min(prefetch + 1, units)
        # Gathered at the what-if's param_bytes (2: FSDP's bf16 param_dtype), not the
        # stored fp32 parameters' 4: the time model all-gathers that many bytes.
        gathered = int(_opt(o, "param_bytes", inp.param_bytes, int))
        per_unit = inp.params / units * gathered
        extra = int(live * per_unit)
    # FSDP is stage 3 (FULL_SHARD); naming it beside ZeRO-1 said it shards parameters.
    name = f"ZeRO-{stage}" + (" / FSDP" if stage >= 3 else "")
    note = (
        f"{name} over {n} GPUs: optimizer state"
        f"{', gradients' if stage >= 2 else ''}{', parameters' if stage >= 3 else ''} sharded "
        f"1/{n}"
        + (
            f"; {live} of {units} gathered units live at once (+{extra / MIB:.0f} MiB)"
            if extra
            else ""
        )
    )
    return replace(
        inp,
        shard_weights=inp.shard_weights * sw,
        shard_grads=inp.shard_grads * sg,
        shard_optimizer=inp.shard_optimizer * so,
        extra_bytes=inp.extra_bytes + extra,
        assumptions=[*inp.assumptions, note],
    )


def _tp(inp: MemoryInputs, o: Mapping[str, Any], linear_share: float) -> MemoryInputs:
    t = int(_opt(o, "tp", 2, int))
    lin = linear_share
    note = (
        f"tensor parallel x{t}: linear layers' parameters ({lin:.0%} of all) and their state "
        f"split 1/{t}; saved activations scaled by the same share (which activations sit "
        "inside the split pairs is not traced; Megatron without sequence parallelism keeps "
        "norms' inputs and dropout masks whole, so this is a lower bound)"
    )
    scale = (1 - lin) + lin / t
    return replace(
        inp,
        shard_weights=inp.shard_weights * scale,
        shard_grads=inp.shard_grads * scale,
        shard_optimizer=inp.shard_optimizer * scale,
        saved_bytes=_scaled(inp.saved_bytes, scale),
        saved_bytes_autocast=_scaled(inp.saved_bytes_autocast, scale),
        recompute_bytes=_scaled_rec(inp.recompute_bytes, scale),
        recompute_bytes_autocast=_scaled_rec(inp.recompute_bytes_autocast, scale),
        forward=None
        if inp.forward is None
        else replace(
            inp.forward,
            input_bytes=_scaled(inp.forward.input_bytes, scale),
            input_bytes_autocast=_scaled(inp.forward.input_bytes_autocast, scale),
        ),
        assumptions=[*inp.assumptions, note],
    )


def _pp(inp: MemoryInputs, o: Mapping[str, Any]) -> MemoryInputs:
    p = int(_opt(o, "pp", 2, int))
    m = int(_opt(o, "microbatches", 0, int) or PP_MICROBATCHES_PER_STAGE * p)
    inflight = min(p, m)
    # The first stage holds the most: its share of the layers for `inflight` micro-batches.
    n = len(inp.saved_bytes)
    per = max(1, math.ceil(n / p))
    first = inp.saved_bytes[:per]
    scaled = [int(x * inflight / m) for x in first]
    note = (
        f"pipeline x{p}, {m} micro-batches (1F1B): the first stage keeps 1/{p} of the "
        f"parameters and state, and activations of {inflight} micro-batches of its layers"
    )
    return replace(
        inp,
        saved_bytes=scaled,
        saved_bytes_autocast=None
        if inp.saved_bytes_autocast is None
        else [int(x * inflight / m) for x in inp.saved_bytes_autocast[:per]],
        recompute_bytes=None
        if inp.recompute_bytes is None
        else [max(1, int(x / m)) for x in inp.recompute_bytes[:per]],  # one micro-batch's
        recompute_bytes_autocast=None
        if inp.recompute_bytes_autocast is None
        else [max(1, int(x / m)) for x in inp.recompute_bytes_autocast[:per]],
        forward=None,
        saved_at=None,
        shard_weights=inp.shard_weights / p,
        shard_grads=inp.shard_grads / p,
        shard_optimizer=inp.shard_optimizer / p,
        assumptions=[*inp.assumptions, note],
    )


def _device(inp: MemoryInputs, o: Mapping[str, Any]) -> MemoryInputs:
    from perfcast.hardware.devices import lookup_device

    name = str(o.get("device", o.get("target", "")))
    spec = lookup_device(name) if name else None
    if spec is None:
        return inp
    return replace(inp, capacity_bytes=int(spec.mem_gb * GIB), device_name=spec.name)


_CHANGES: dict[str, Any] = {
    "batch-size": _batch,
    "amp": _amp,
    "activation-checkpointing": _checkpoint,
    "fused-optimizer": _fused,
    "ddp": _ddp,
    "zero": _zero,
    "fsdp": _zero,
    "pipeline-parallel": _pp,
    "device": _device,
}
# What-ifs that leave memory as it is (time only).
_NEUTRAL = {
    "faster-op",
    "cuda-graphs",
    "fuse-elementwise",
    "torch-compile",
    "dataloader-overlap",
    "remove-host-sync",
}

# What a memory-neutral change still assumes.
_NEUTRAL_NOTES = {
    "cuda-graphs": "cuda-graphs: the graph's private pool holds the captured step's tensors "
    "in place of the caching allocator's blocks, taken as the eager step's peak (on the "
    "recorded H100 rows within 9% of the peak over the capture's first steps; the capture's "
    "side-stream warm-up adds its own cuBLAS workspace)",
}

Change = tuple[str, Mapping[str, Any]]


def apply_changes(
    inputs: MemoryInputs, changes: Iterable[Any], linear_share: float = 0.0
) -> MemoryInputs:
    """The inputs after each change in order; a change is a `Spec`, a (name, options) pair
    or "NAME:k=v" text."""
    out = inputs
    for ch in changes:
        name, options = _as_change(ch)
        if name == "tensor-parallel":
            out = _tp(out, options, linear_share)
        elif name in _CHANGES:
            out = _CHANGES[name](out, options)
        elif name in _NEUTRAL:
            if name in _NEUTRAL_NOTES:
                out = replace(out, assumptions=[*out.assumptions, _NEUTRAL_NOTES[name]])
            continue
        else:
            out = replace(
                out, assumptions=[*out.assumptions, f"{name}: memory effect not modelled"]
            )
    return out


def _checked_changes(changes: Any) -> list[Any]:
    """`changes` as a list (one spec string is one change, not its letters), every name one
    the memory model or the what-if registry knows and every option one its what-if takes."""
    from perfcast.errors import OptionError
    from perfcast.whatif.registry import MODEL_MODULES, build_options

    if changes is None:
        return []
    if isinstance(changes, (str, tuple)):
        items = [changes]
    elif isinstance(changes, Iterable):
        items = list(changes)
    else:
        raise OptionError(f"changes must be what-if specs such as ['amp'], not {changes!r}")
    for ch in items:
        if not isinstance(ch, (str, tuple)) and not hasattr(ch, "name"):
            raise OptionError(f"a change is a what-if spec such as 'amp:dtype=bf16', not {ch!r}")
        name, options = _as_change(ch)
        if name not in _CHANGES and name not in _NEUTRAL and name not in MODEL_MODULES:
            known = sorted(set(_CHANGES) | _NEUTRAL | set(MODEL_MODULES))
            raise OptionError(f"unknown change {name!r}", hint=f"known: {', '.join(known)}")
        if name in MODEL_MODULES:
            build_options(name, dict(options))  # the what-if's own checks of every value
    return items


def _as_change(ch: Any) -> tuple[str, Mapping[str, Any]]:
    from perfcast.errors import OptionError
    from perfcast.whatif.registry import MODEL_MODULES, parse_spec

    if isinstance(ch, str):
        name, _, rest = ch.partition(":")
        if name.strip() in MODEL_MODULES:  # a what-if's spec reads as whatif reads it
            spec = parse_spec(ch)
            return spec.name, spec.options
        opts = dict(p.split("=", 1) for p in rest.split(",") if "=" in p)
        return name.strip(), {k.strip().replace("-", "_"): v.strip() for k, v in opts.items()}
    if isinstance(ch, tuple):
        if not (
            1 <= len(ch) <= 2
            and isinstance(ch[0], str)
            and (len(ch) == 1 or isinstance(ch[1], Mapping))
        ):
            raise OptionError(
                f"a change given as a tuple is (name, {{option: value}}), not {ch!r}",
                hint='e.g. ("amp", {"dtype": "fp16"})',
            )
        return ch[0], dict(ch[1]) if len(ch) == 2 else {}
    return str(ch.name), dict(ch.options)


def predict_peak_memory(
    source: Any, changes: Iterable[Any] | None = None, rank: int | None = None
) -> MemoryEstimate:
    """Predicted peak memory of one rank's step, after `changes` (what-if specs).

    `source` is an EventTable, a Graph built from one, `TraceFacts` or `MemoryInputs`.
    With `[memory]` events in the trace, the measured peak anchors the estimate: the
    prediction is the measured peak moved by what the changes move in the estimate.
    """
    import os

    from perfcast.errors import OptionError

    changes = _checked_changes(changes)
    facts: TraceFacts | None = None
    if isinstance(source, MemoryInputs):
        inputs = source
    else:
        if isinstance(source, TraceFacts):
            facts = source
        else:
            if isinstance(source, (str, os.PathLike)):
                from perfcast.ingest import load

                source = load(source)
            table = getattr(source, "table", None) if not hasattr(source, "kind") else source
            if table is None:
                raise OptionError(
                    "predict_peak_memory needs a trace path, an EventTable, a Graph, "
                    f"TraceFacts or MemoryInputs, not {type(source).__name__}"
                )
            facts = trace_facts(table, rank)
        inputs = inputs_from_facts(facts)
    linear_share = (
        facts.linear_param_numel / facts.params if facts is not None and facts.params else 0.0
    )
    before = estimate(inputs)
    after = estimate(apply_changes(inputs, changes, linear_share)) if changes else before
    measured = inputs.measured_peak_bytes
    if measured:
        # The trace measured its peak: keep it, and move it by what the changes move in the
        # estimate (the estimate's error on the parts it cannot see stays out).
        delta = after.peak_bytes - before.peak_bytes
        # Floored at the measured peak scaled by the estimate's ratio: where the estimate is
        # far above the measurement (an inference trace's forward counted as saved), its
        # difference would take the peak below zero.
        ratio = after.peak_bytes / before.peak_bytes if before.peak_bytes else 1.0
        after = replace(
            after,
            peak_bytes=max(int(measured * ratio), int(measured + delta)),
            source="[memory] events",
            assumptions=[
                *after.assumptions,
                f"anchored on the trace's measured peak {measured / GIB:.2f} GiB ([memory] "
                f"events; the shape estimate gave {before.peak_gib:.2f} GiB before changes)",
            ],
        )
    return after
