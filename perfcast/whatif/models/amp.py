"""amp: automatic mixed precision (torch.autocast) with bf16 or fp16.

What autocast does, from PyTorch's "Automatic Mixed Precision package" docs
(torch.amp, "Autocast Op Reference", CUDA op lists): ops in the lower-precision
list (matmul, linear, conv, bmm, addmm, baddbmm, scaled_dot_product_attention,
...) cast their floating-point inputs to 16 bits and run there; ops in the
float32 list (layer_norm, group_norm, softmax, log_softmax, losses, sum,
cumsum, exp, log, pow, norm, ...) run in fp32; other ops run in the dtype of
their inputs. float64 tensors are never cast. Parameters stay fp32: the
optimizer and the gradient all-reduce keep their fp32 sizes.

Where each duration comes from:

- matmul / convolution / attention kernels of forward and backward now in
  fp32 or tf32 (dtype from the kernel name; a matmul naming no dtype is fp32
  because `torch.backends.cuda.matmul.allow_tf32` defaults to False since
  PyTorch 1.12; a convolution is tf32 because `torch.backends.cudnn.allow_tf32`
  defaults to True, unless its name marks FP32 FMA math, see
  `models.device.kernel_dtype`): scaled (Source.SCALED). When the launching op
  records its input shapes (mm, addmm, bmm, baddbmm, linear, matmul), by the
  roofline: the kernel keeps its achieved efficiency (old roofline time /
  measured time) at the new roofline time, whose FLOPs run at the target
  dtype's peak and whose bytes halve, but no more than the part's large
  16-bit GEMMs reach where the project measured it (`achieved_gemm`: H100
  73.2% of its bf16 peak): fp32 GEMMs run on the FMA pipes near their small
  peak, which tensor cores do not match (about 15% of an H100's fp32 GEMMs'
  14.8x otherwise); otherwise by the ratio of the device's peaks, current
  dtype vs target (`perfcast.hardware` datasheet figures);
- memory-bound kernels (elementwise, reductions, copies, batch norm, the
  helper kernels of GEMM/conv libraries) of forward and backward whose name
  says fp32 or no dtype: activations are 16-bit, so they move half the bytes
  (Source.SCALED). Kernels of float32-list ops (in backward: their backward
  ops), layer/group norm, softmax, embeddings, optimizer, communication,
  memsets, host copies and kernels already in 16 or 64 bits are unchanged.
  batch_norm is in neither list: it runs in its input's 16-bit dtype. In fp16 cuDNN
  takes it (16-bit data, fp32 parameters), so it halves too; in bf16 PyTorch does not use
  cuDNN's batch norm at all (`_select_batch_norm_backend` in
  aten/src/ATen/native/Normalization.cpp excludes kBFloat16) but its own native kernels,
  which are no faster: the same GPU time (on the recorded H100 ResNet-50 pair they took
  1.53x (forward) and 1.11x (backward) the fp32 cuDNN time; that slowdown is not modelled),
  but a training forward launches three of them where cuDNN launched one (see
  `_native_batch_norm`; the recorded bf16 trace has 487 forward launches per step, the
  prediction 483);
- every kernel keeps its fixed part (launch, scheduling, tail): t_new =
  f + (t - f) * ratio with f = min(t, fixed), fixed = the 5th percentile of the
  trace's kernel durations (measured; the smallest kernels are almost all
  fixed cost);
- cast kernels (Source.MODELLED): autocast casts each fp32 weight before a
  forward matmul/convolution (once per use; one cast kernel per launching op,
  bias folded in). Duration = fixed + weight bytes moved / DRAM bandwidth,
  where the op's shapes give the weight size (read 4 bytes, write 2 per
  element), else `fixed`. Batched matmuls (bmm, baddbmm) and attention
  multiply activations, which are already 16-bit, and get no cast. Each cast
  is launched from a new launch call (the trace's median launch duration)
  right before the op's first launch, plus the CPU time of the cast op itself:
  the median of the trace's own casts (`aten::to` that launched one kernel, at
  any depth) when it has some; otherwise of forward's one-kernel elementwise
  ops (relu, add, ...), which pay autograd's bookkeeping as a weight's cast
  does; otherwise of any out-of-place one-kernel elementwise op (stated as an
  underestimate). A stand-in gets the ATen records a cast makes beyond its own (to,
  _to_copy, empty_strided, copy_: four) at the trace's median allocation op, less a
  record's profiler cost once that is out (on the recorded ResNet-50, per cast from the
  fp32 trace: 24.3 µs profiled, 12.0 without the profiler; the bf16 trace's own casts:
  25.5 and 13.6). All read from the graph being predicted, so with the
  profiler's cost taken out of it, out of these too;
- gradient casts (ToCopyBackward0): each weight cast is undone in backward by
  an autograd node that casts the 16-bit weight gradient back to fp32, right
  after the node of its layer: the node's own time (the median of the trace's
  `evaluate_function` ranges outside their ops) plus a cast on the host, a
  launch, and a kernel the size of the layer's forward cast (per rank and
  step, layers in reverse) on the layer's stream, after what was launched
  before it.

Converted kernels are renamed "autocast[bf16] <name>" so that later models
(device) know their new dtype. Refused: no GPU work; an unknown device (name
it with device=); a target dtype the GPU has no native math for (bf16 before
Ampere); no fp32/tf32 matmul/conv/attention in forward or backward (already
mixed precision); a trace already under autocast, told by the casts inside at
least a quarter of its forward matmuls/convolutions (cuDNN's kernel names do
not show bf16); amp applied twice.

- fp16 needs a GradScaler (bf16 none), whose step (torch.amp.GradScaler,
  torch/amp/grad_scaler.py) unscales every gradient with one multi-tensor
  kernel, checks for infs, and reads the result on the host before the
  optimizer runs (`sum(v.item() for v in found_inf)`), then updates the scale:
  modelled as an unscale kernel taking one pass over the gradients (the
  optimizer's GPU time divided by its ops per parameter, measured) plus a
  scale-update kernel of fixed cost, and a host synchronization on them
  before the optimizer's first host work — the CPU can then no longer run
  ahead of the GPU across the step boundary.

Not modelled: input casts of float32-list ops, autocast's dispatch overhead on
every other op, and autocast's weight-cast cache across repeated uses of one
weight within a step.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from perfcast.arrays import argmax_by, combine_codes, split_by
from perfcast.errors import NotApplicableError, OptionValueError
from perfcast.events import EventTable, Kind
from perfcast.graph.launches import DEFAULT_LAUNCH_LATENCY_NS, DEFAULT_STREAM_GAP_NS
from perfcast.graph.model import GpuKind, Graph, NodeKind, Source, SyncKind
from perfcast.graph.phases import Phase
from perfcast.graph.syncs import SYNC_MIN_NS
from perfcast.hardware import (
    KernelClass,
    convs_in_tf32,
    dtype_from_kernel_name,
    gemm_flops_bytes,
    roofline_time_us,
)
from perfcast.hardware.measured import AchievedGemm, achieved_gemm_or_stand_in
from perfcast.whatif import primitives as P
from perfcast.whatif.kernels import (
    is_compute_kernel,
    is_library_helper,
    kernel_fixed_cost_ns,
    node_dtype,
    op_input_dims,
    rank_devices,
    refuse_graph_replays,
    require_gpu,
    resolve_device,
    scale_variable,
)

SUMMARY = "automatic mixed precision: fp32/tf32 matmul and conv in 16 bits (dtype=bf16|fp16)"

_AUTOCAST_PREFIX = re.compile(r"^autocast\[\w+\] ")


def autocast_name(kernel: str, dtype: str) -> str:
    """The name a converted kernel takes: "autocast[bf16] <name>"."""
    return f"autocast[{dtype}] {kernel}"


def traced_name(kernel: str) -> str:
    """A kernel's name as traced, where `autocast_name` renamed it."""
    return _AUTOCAST_PREFIX.sub("", kernel)


_DTYPE_ALIASES = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
}
BYTES_FP32 = 4
BYTES_16 = 2

# PyTorch autocast's CUDA float32 op list (torch.amp docs, "CUDA Ops that can autocast to
# float32"), as aten op names appear in traces.
_FP32_BASE = (
    r"pow|rdiv|rpow|rtruediv|acos|asin|binary_cross_entropy_with_logits|cosh"
    r"|cosine_embedding_loss|cdist|cosine_similarity|cross_entropy|cross_entropy_loss|cumprod"
    r"|cumsum|dist|erfinv|exp|expm1|group_norm|hinge_embedding_loss|kl_div|l1_loss|layer_norm"
    r"|log|log_softmax|log10|log1p|log2|margin_ranking_loss|mse_loss|multilabel_margin_loss"
    r"|multi_margin_loss|nll_loss|nll_loss2d|nll_loss_nd|norm|linalg_vector_norm|normalize"
    r"|pdist|poisson_nll_loss|prod|reciprocal|rsqrt|sinh|smooth_l1_loss|soft_margin_loss"
    r"|softmax|softmin|softplus|sum|renorm|tan|triplet_margin_loss"
)
_FP32_FWD = re.compile(rf"^aten::_*(?:native_)?(?:{_FP32_BASE})(?:_forward|_out|_)?$")
_FP32_BWD = re.compile(rf"^aten::_*(?:native_)?(?:{_FP32_BASE})_backward(?:_data)?$")
_BATCH_NORM = re.compile(r"batch_?norm|(?<![a-z])bn_(?:fw|bw)")
# Ops whose operands are activations (already 16-bit under autocast): no weight cast.
_NO_WEIGHT = re.compile(r"bmm|attention|sdpa|flash|_efficient|fmha")
_MEMORY_CLASSES = (KernelClass.ELEMENTWISE, KernelClass.REDUCTION, KernelClass.COPY)
_CAST_NAME = "autocast cast fp32 -> {dtype} (modelled)"
# The host calls of the casts this model adds (forward, backward): eager dispatch that
# torch.compile traces into its graph (perfcast.whatif.models.torch_compile drops them).
FORWARD_CAST_CALL = "aten::_to_copy (autocast, modelled)"
BACKWARD_CAST_CALL = "ToCopyBackward0 (autocast, modelled)"
CAST_KERNEL_PREFIX = "autocast cast "


@dataclass
class Options:
    dtype: str = "bf16"
    device: str | None = None  # the trace's GPU, when deviceProperties lack or misname it


# ---------------------------------------------------------------- shapes


def _ints(d: object) -> list[int] | None:
    if isinstance(d, list) and d and all(isinstance(x, int) and x >= 0 for x in d):
        return d
    return None


def _numel(d: object) -> int | None:
    v = _ints(d)
    return math.prod(v) if v is not None else None


def gemm_shape(op_name: str, dims: list | None) -> tuple[int, int, int, int] | None:
    """(m, n, k, batch) of the GEMM an op runs, from its Input Dims; None when unclear."""
    if not dims:
        return None
    op = op_name.removeprefix("aten::")
    args = [_ints(d) for d in dims]

    def arg(i: int) -> list[int] | None:
        return args[i] if i < len(args) else None

    a = b = None
    if op in ("mm", "matmul", "linear", "bmm"):
        a, b = arg(0), arg(1)
    elif op in ("addmm", "baddbmm"):
        a, b = arg(1), arg(2)
    if a is None or b is None:
        return None
    if op == "linear":  # x[..., k] @ w[n, k].T
        if len(b) != 2 or a[-1] != b[1]:
            return None
        return math.prod(a[:-1]), b[0], b[1], 1
    if len(a) == 2 and len(b) == 2:
        m, k, k2, n = a[0], a[1], b[0], b[1]
        return (m, n, k, 1) if k == k2 else None
    if len(a) >= 2 and len(b) == 2 and op == "matmul":  # x[..., m, k] @ w[k, n]
        return (math.prod(a[:-1]), b[1], a[-1], 1) if a[-1] == b[0] else None
    if len(a) == len(b) >= 3 and a[:-2] == b[:-2]:
        if a[-1] != b[-2]:
            return None
        return a[-2], b[-1], a[-1], math.prod(a[:-2])
    return None


def weight_numel(op_name: str, dims: list | None) -> int | None:
    """Elements of the fp32 parameters autocast casts for this op (weight + bias)."""
    if not dims:
        return None
    op = op_name.removeprefix("aten::")
    if op in ("linear", "mm", "matmul") or "conv" in op:
        w = _numel(dims[1]) if len(dims) > 1 else None
        if w is None:
            return None
        bias = _numel(dims[2]) if len(dims) > 2 and op != "mm" and op != "matmul" else None
        return w + (bias or 0)
    if op == "addmm":
        w = _numel(dims[2]) if len(dims) > 2 else None
        if w is None:
            return None
        return w + (_numel(dims[0]) or 0)
    return None


# ---------------------------------------------------------------- the model


def _keeps_fp32(op_name: str, phase: int) -> bool:
    if phase == Phase.BACKWARD:
        return bool(_FP32_BWD.match(op_name))
    return bool(_FP32_FWD.match(op_name))


_HOST_KINDS = (NodeKind.CPU, NodeKind.LAUNCH, NodeKind.RUNTIME)
_AUTOGRAD_NODE = "autograd::engine::evaluate_function: "
_MIN_PROXY_OPS = 5  # fewer forward ops than this and their median says little


@dataclass
class _HostCosts:
    """What a cast costs the host, from this graph's own host work (so when the profiler's
    cost has been taken out of the graph, it is out of these figures too)."""

    cast_ns: int  # one cast op's CPU time, its launch call excluded
    cast_from: str  # which ops of the trace it was read from
    node_ns: int  # an autograd node's own CPU time (evaluate_function outside its ops)


def _outermost_aten(table: EventTable, rows: np.ndarray) -> np.ndarray:
    """Each row's outermost ancestor that is still an ATen op (itself when its parent is not)."""
    parent = table.parent
    is_aten = np.fromiter((n.startswith("aten::") for n in table.names), dtype=np.bool_)
    name = table.name
    top = rows.copy()
    for _ in range(16):
        p = parent[top]
        up = (p >= 0) & is_aten[name[np.maximum(p, 0)]] & is_aten[name[top]]
        if not up.any():
            break
        top[up] = p[up]
    return top


# PyTorch 1.8-1.10 record an autograd node by its own name ("CudnnConvolutionBackward").
_BARE_AUTOGRAD_NODE = re.compile(r"^[A-Z][A-Za-z0-9_]*Backward\d*$")


def _autograd_node_names(table: EventTable) -> np.ndarray:
    """A mask over name ids: autograd's node ranges (`evaluate_function: ...`, or a 2021-era
    trace's bare node name; 2021's V100 ResNet-50 got no gradient casts without them)."""
    ranged = np.fromiter(
        (n.startswith(_AUTOGRAD_NODE) for n in table.names), dtype=np.bool_, count=len(table.names)
    )
    if ranged.any():  # later traces also record the node's own op inside its range
        return ranged
    return np.fromiter(
        (bool(_BARE_AUTOGRAD_NODE.match(n)) for n in table.names),
        dtype=np.bool_,
        count=len(table.names),
    )


def _nearest(
    table: EventTable, rows: np.ndarray, named: int | np.ndarray, depth: int = 8
) -> np.ndarray:
    """Each row's nearest ancestor (itself included) with the name id `named` (or, given a
    boolean mask over name ids, any name it marks), or -1."""
    if isinstance(named, np.ndarray):
        mask = named
    else:
        mask = np.zeros(len(table.names), dtype=bool)
        mask[named] = True
    out = np.full(rows.size, -1, dtype=np.int64)
    cur = rows.astype(np.int64).copy()
    for _ in range(depth):
        live = (cur >= 0) & (out < 0)
        if not live.any():
            break
        hit = live & mask[table.name[np.maximum(cur, 0)]]
        out[hit] = cur[hit]
        cur = np.where(live & ~hit, table.parent[np.maximum(cur, 0)], -1)
    return out


# Autocast casts inside the op that asks for them; a user's own .to() sits outside. When at
# least this share of forward matmuls/convolutions has one inside, autocast is already on.
_AUTOCAST_SHARE = 0.25


def _under_autocast(graph: Graph, compute: np.ndarray) -> tuple[int, int]:
    """(forward matmul/conv ops with a cast kernel inside them, forward matmul/conv ops)."""
    table = graph.table
    c = graph.cols
    fwd = compute[(c["phase"][compute] == Phase.FORWARD) & (c["op"][compute] >= 0)]
    if table is None or fwd.size == 0:
        return 0, 0
    tops = np.unique(_outermost_aten(table, c["op"][fwd].astype(np.int64)))
    if "aten::to" not in table.names:
        return 0, int(tops.size)
    kernels = np.flatnonzero(
        (c["kind"] == NodeKind.GPU) & (c["gpu_kind"] == GpuKind.KERNEL) & (c["op"] >= 0)
    )
    cast = _nearest(table, c["op"][kernels].astype(np.int64), table.names.index("aten::to"))
    cast = cast[cast >= 0]
    # The op a cast sits in: the outermost ATen op above it (itself when it is top-level).
    holders = _outermost_aten(table, cast)
    inside = holders[holders != cast]
    return int(np.isin(tops, inside).sum()), int(tops.size)


def _compiled_phases(graph: Graph) -> set[str]:
    """The phases torch-compile, applied before, compiled (its assumption names them)."""
    out: set[str] = set()
    for a in graph.assumptions:
        m = re.match(r"torch-compile \(([a-z+]+)\)", a)
        if m:
            out.update(m.group(1).split("+"))
    return out


def _host_costs(graph: Graph) -> _HostCosts:
    """The CPU cost of one autocast cast and of one autograd node, read from the trace.

    A cast (`aten::to` -> `_to_copy` -> `empty_strided` + `copy_`) is an elementwise op
    with one kernel, and a weight's cast is recorded by autograd. In order of preference:
    the median inclusive host time of the trace's own casts that launched one kernel (at
    any depth: autocast's sit inside the op that asked for them); of forward's one-kernel
    elementwise ops, in place or not (at least `_MIN_PROXY_OPS` of them); of any
    out-of-place one-kernel elementwise op (no autograd bookkeeping: an underestimate,
    stated). The launch is counted apart. An autograd node's own time is the median of
    what `evaluate_function` ranges spend outside their ops.
    """
    table = graph.table
    if table is None:
        return _HostCosts(0, "no trace table: cast CPU not counted", 0)
    c = graph.cols
    alive = graph.alive
    host = np.flatnonzero(np.isin(c["kind"], _HOST_KINDS) & alive & (c["op"] >= 0))
    kernels = np.flatnonzero(
        (c["kind"] == NodeKind.GPU) & (c["gpu_kind"] == GpuKind.KERNEL) & alive & (c["op"] >= 0)
    )
    n_rows = len(table.dur)
    node_ns = 0
    is_node = _autograd_node_names(table)[table.name] & (table.kind == Kind.CPU_OP)
    if is_node.any():
        own = np.bincount(c["op"][host], weights=c["dur"][host], minlength=n_rows)
        node_ns = int(np.median(own[is_node]))
    launch_ns = P.median_launch_ns(graph)
    # The trace's own casts first: `aten::to` rows (at any depth: autocast's sit inside the
    # conv or matmul that asked for them) whose subtree launched exactly one kernel.
    casts = np.zeros(0, dtype=np.int64)
    if "aten::to" in table.names:
        to_name = table.names.index("aten::to")
        cast_of_kernel = _nearest(table, c["op"][kernels].astype(np.int64), to_name)
        n_kernels = np.bincount(cast_of_kernel[cast_of_kernel >= 0], minlength=n_rows)
        casts = np.flatnonzero(n_kernels == 1)
    if casts.size:
        cast_of_host = _nearest(table, c["op"][host].astype(np.int64), to_name)
        inside = cast_of_host >= 0
        inclusive = np.bincount(
            cast_of_host[inside], weights=c["dur"][host][inside], minlength=n_rows
        )
        how = f"the trace's {casts.size:,} casts that launched a kernel"
        picked = casts
    else:
        top_host = _outermost_aten(table, c["op"][host].astype(np.int64))
        top_kernel = _outermost_aten(table, c["op"][kernels].astype(np.int64))
        inclusive = np.bincount(top_host, weights=c["dur"][host], minlength=n_rows)
        n_kernels = np.bincount(top_kernel, minlength=n_rows)
        elementwise = np.zeros(n_rows, dtype=bool)
        elementwise[top_kernel[c["klass"][kernels] == KernelClass.ELEMENTWISE]] = True
        single = np.flatnonzero((n_kernels == 1) & elementwise & (table.kind == Kind.CPU_OP))
        # A weight's cast runs in forward on a tensor that requires grad, so autograd records
        # a node for it: forward's one-kernel elementwise ops (relu, add, ...) pay the same
        # bookkeeping, the optimizer's (under no_grad) do not.
        forward = np.zeros(n_rows, dtype=bool)
        forward[top_kernel[c["phase"][kernels] == Phase.FORWARD]] = True
        fwd = single[forward[single]]
        names = [table.names[int(i)] for i in table.name[single]]
        if fwd.size >= _MIN_PROXY_OPS:
            picked = fwd
            how = f"the trace's {fwd.size:,} one-kernel elementwise ops in forward (no casts in it)"
        else:
            out_of_place = [not n.endswith("_") and n != "aten::to" for n in names]
            picked = single[np.array(out_of_place, dtype=bool)] if names else single
            how = (
                f"the trace's {picked.size:,} out-of-place elementwise ops with one kernel "
                "(no casts in it; without autograd's bookkeeping, an underestimate)"
            )
    if picked.size == 0:
        return _HostCosts(0, "no op in the trace to read a cast's CPU cost from", node_ns)
    cast_ns = max(int(np.median(inclusive[picked])) - launch_ns, 0)
    if not casts.size:
        extra, thin_ns = _records_short_of_a_cast(graph, picked, host)
        if extra > 0 and thin_ns > 0:
            cast_ns += round(extra * thin_ns)
            how += (
                f", plus {extra:g} nested ops a cast records beyond them at "
                f"{thin_ns / 1000:.1f} µs each (the median allocation op)"
            )
    return _HostCosts(cast_ns, how, node_ns)


# A cast records four ATen ops: aten::to -> aten::_to_copy -> aten::empty_strided + copy_.
_CAST_RECORDS = 4
_ALLOCATION_OPS = ("aten::empty", "aten::empty_strided", "aten::empty_like")


def _records_short_of_a_cast(
    graph: Graph, proxies: np.ndarray, host: np.ndarray
) -> tuple[float, float]:
    """How many more ATen records a cast makes than the proxy ops (median records per
    proxy, children included), and what one thin record costs here: the median own host
    time of the trace's allocation ops (`aten::empty*`, no kernel), less a record's
    profiler cost when the graph has it taken out."""
    table = graph.table
    c = graph.cols
    is_op = np.flatnonzero(table.kind == Kind.CPU_OP)
    tops = _outermost_aten(table, is_op)
    records = np.bincount(tops, minlength=len(table.dur))[proxies]
    extra = max(_CAST_RECORDS - float(np.median(records)), 0.0)
    alloc_ids = [table.names.index(n) for n in _ALLOCATION_OPS if n in table.names]
    if not alloc_ids:
        return extra, 0.0
    own = np.bincount(c["op"][host], weights=c["dur"][host], minlength=len(table.dur))
    alloc = is_op[np.isin(table.name[is_op], alloc_ids)]
    alloc = alloc[own[alloc] > 0]
    if not alloc.size:
        return extra, 0.0
    # An allocation op's own time keeps its record's profiler cost outside it (in its
    # parent's time, where the correction takes it out): an added record costs its own time
    # when profiled, and that less the record's cost once the profiler's cost is out.
    record_ns = graph.nominal.get("profiler_op_ns", 0)
    return extra, max(float(np.median(own[alloc])) - record_ns, 0.0)


def check_options(options: Options) -> None:
    """Values the model cannot take (the registry calls this when it builds the options)."""
    if _DTYPE_ALIASES.get(options.dtype.lower()) is None:
        raise OptionValueError(f"amp: dtype must be bf16 or fp16, not '{options.dtype}'")
    if options.device:  # an unknown GPU, refused before a trace is read
        resolve_device(options.device, "amp", "device option")


def apply(graph: Graph, options: Options) -> Graph:
    dtype = _DTYPE_ALIASES[options.dtype.lower()]
    if any(a.startswith("amp (") for a in graph.assumptions):
        raise NotApplicableError("amp: mixed precision is already applied to this graph")
    gpu = require_gpu(graph, "amp")
    refuse_graph_replays(graph, "amp")
    c = graph.cols
    devices = rank_devices(graph, c["rank"][gpu], options.device, "amp")
    for dev in devices.values():
        if dtype not in dev.peak_tflops:
            raise NotApplicableError(
                f"amp: {dev.name} has no native {dtype} math", hint="try dtype=fp16"
            )
    tf32 = {rank: convs_in_tf32(dev) for rank, dev in devices.items()}
    fixed = kernel_fixed_cost_ns(graph)
    names = graph.names
    in_step = np.isin(c["phase"][gpu], [Phase.FORWARD, Phase.BACKWARD]) & (
        c["gpu_kind"][gpu] == GpuKind.KERNEL
    )
    work = gpu[in_step]

    compute: list[int] = []
    memory: list[int] = []
    sixteen: dict[str, int] = {}  # compute kernels already in 16 bits, by dtype
    kept_batch_norm: list[int] = []
    for n in work.tolist():
        name = graph.name_of(n)
        k = int(c["klass"][n])
        opn = names[int(c["op_name"][n])] if c["op_name"][n] >= 0 else ""
        phase = int(c["phase"][n])
        if opn and _keeps_fp32(opn, phase):
            continue
        if is_compute_kernel(graph, n):
            d = node_dtype(graph, n, tf32[int(c["rank"][n])])
            if d in ("fp32", "tf32"):
                compute.append(n)
            else:
                sixteen[d] = sixteen.get(d, 0) + 1
            continue
        helper = k >= 0 and is_library_helper(name)
        batch_norm = (k == KernelClass.NORM and bool(_BATCH_NORM.search(name.lower()))) or bool(
            opn and _BATCH_NORM.search(opn.lower())
        )
        if batch_norm and dtype == "bf16":
            kept_batch_norm.append(n)  # native kernels, not cuDNN's: see the docstring
            continue
        if not (k in _MEMORY_CLASSES or helper or batch_norm):
            continue
        if dtype_from_kernel_name(name) in (None, "fp32") and node_dtype(graph, n) == "fp32":
            memory.append(n)
    if not compute and sixteen:
        per, where = P.rank_steps(graph, work)
        held = ", ".join(f"{P.per_count(k, per)} {d}" for d, k in sorted(sixteen.items()))
        raise NotApplicableError(
            "amp: the trace already runs its matmuls, convolutions and attention in 16 bits "
            f"({held} {where}, by their kernels' names or their ops' input types)"
        )
    if not compute:
        raise NotApplicableError(
            "amp: no fp32/tf32 matmul, convolution or attention kernels in forward or backward"
        )
    cast, ops = _under_autocast(graph, np.array(compute, dtype=np.int64))
    if ops and cast >= _AUTOCAST_SHARE * ops:
        raise NotApplicableError(
            f"amp: the trace already runs under autocast: {cast:,} of the {ops:,} forward "
            "matmuls and convolutions whose kernel names look fp32 cast their inputs inside "
            "the op (an aten::to with a kernel), which is autocast's doing"
        )

    # Compute-bound kernels: roofline with the kept efficiency, else the peak ratio.
    comp = np.array(compute, dtype=np.int64)
    ratio = np.empty(comp.size, dtype=np.float64)
    n_roofline = 0
    n_capped = 0
    capped: dict[str, AchievedGemm] = {}
    from_dtypes: Counter[str] = Counter()
    for i, n in enumerate(comp.tolist()):
        dev = devices[int(c["rank"][n])]
        cur = node_dtype(graph, n, tf32[int(c["rank"][n])])
        from_dtypes[cur] += 1
        opn = names[int(c["op_name"][n])] if c["op_name"][n] >= 0 else ""
        shape = gemm_shape(opn, op_input_dims(graph, n)) if opn else None
        if shape is not None and min(shape) > 0:
            m, nn, k, batch = shape
            flops, bytes_old = gemm_flops_bytes(m, nn, k, BYTES_FP32, batch)
            _, bytes_new = gemm_flops_bytes(m, nn, k, BYTES_16, batch)
            old = roofline_time_us(flops, bytes_old, dev, cur)
            new = roofline_time_us(flops, bytes_new, dev, dtype)
            ratio[i] = new / old
            n_roofline += 1
            best = achieved_gemm_or_stand_in(dev.name, dev.vendor)
            variable_ns = float(c["dur"][n]) - min(float(c["dur"][n]), float(fixed))
            if best is not None and variable_ns > 0:
                floor = new * 1000 / best.efficiency / variable_ns
                if floor > ratio[i]:
                    ratio[i] = floor
                    capped[dev.name] = best
                    n_capped += 1
        else:
            ratio[i] = dev.peak(cur) / dev.peak(dtype)
    comp_before = int(c["dur"][comp].sum())
    scale_variable(graph, comp, ratio, fixed)
    comp_after = int(c["dur"][comp].sum())
    for n in comp.tolist():
        c["name"][n] = graph.intern(autocast_name(graph.name_of(n), dtype))

    mem = np.array(memory, dtype=np.int64)
    mem_before = int(c["dur"][mem].sum())
    scale_variable(graph, mem, BYTES_16 / BYTES_FP32, fixed)
    mem_after = int(c["dur"][mem].sum())

    costs = _host_costs(graph)
    # Applied after torch-compile: Dynamo traces autocast, and in the compiled phases the
    # casts are kernels of the compiled graph, launched like Inductor's, with no dispatch.
    compiled = _compiled_phases(graph)
    in_graph = _HostCosts(0, "none: torch.compile, applied before, runs them in its graph", 0)
    n_native = _native_batch_norm(graph, np.array(kept_batch_norm, dtype=np.int64), fixed)
    c = graph.cols
    fwd_costs = in_graph if "forward" in compiled else costs
    bwd_costs = in_graph if "backward" in compiled else costs
    casts = _insert_casts(graph, comp, dtype, devices, fixed, fwd_costs)
    grad_durs = _insert_grad_casts(graph, comp, dtype, bwd_costs, casts, fixed)
    costs = in_graph if compiled >= {"forward", "backward"} else costs
    n_casts, n_grad = len(casts), len(grad_durs)
    cast_ns = sum(x.dur for x in casts) + sum(grad_durs)
    scaler = _grad_scaler(graph, fixed) if dtype == "fp16" else ""

    per, per_what = P.rank_steps(graph, comp)

    def cnt(n: int) -> str:
        return P.per_count(n, per)

    graph.assumptions.append(
        f"amp ({dtype}), {per_what}: {cnt(comp.size)} fp32/tf32 matmul/conv/attention kernels "
        f"{comp_before / per / 1e6:.2f} -> {comp_after / per / 1e6:.2f} ms ({cnt(n_roofline)} "
        "by roofline from op shapes, the rest by peak ratio"
        f"{_capped_text(cnt(n_capped) if n_capped else '', capped, dtype)}); "
        f"{cnt(mem.size)} memory-bound kernels move half the bytes "
        f"({mem_before / per / 1e6:.2f} -> {mem_after / per / 1e6:.2f} ms); {cnt(n_casts)} "
        f"weight casts in forward and {cnt(n_grad)} gradient casts back to fp32 in backward "
        f"added ({cast_ns / per / 1e6:.2f} ms of GPU time; {costs.cast_ns / 1000:.1f} µs of "
        "CPU per cast "
        f"besides its launch, from {costs.cast_from}; {costs.node_ns / 1000:.1f} µs per "
        f"autograd node); fixed {fixed / 1000:.1f} µs per kernel kept; norms, softmax, "
        "losses, optimizer and all-reduce stay fp32"
        + (
            f"; {cnt(len(kept_batch_norm))} batch-norm kernels run PyTorch's native bf16 kernels "
            f"instead of cuDNN's, in the same GPU time (uncertain: in the one measured pair, "
            "ResNet-50 on an H100, they took 1.53x forward and 1.11x backward the fp32 cuDNN "
            f"time); {cnt(n_native)} forward ones launch three kernels (statistics, running-stats "
            "update, transform: Normalization.cu) where cuDNN launched one"
            if kept_batch_norm
            else ""
        )
        + scaler
        + "; "
        + _peaks_text(devices, from_dtypes, dtype, cnt, tf32)
    )
    return graph


def _capped_text(n: str, capped: dict[str, AchievedGemm], dtype: str) -> str:
    """The roofline kernels held at the part's measured large-GEMM efficiency (`n` of them,
    per step and rank), if any."""
    if not n:
        return ""
    where = "; ".join(
        f"{name} {best.efficiency:.1%} of its {dtype} peak ({best.source})"
        for name, best in capped.items()
    )
    return f"; {n} of them no faster than the part's large 16-bit GEMMs reach, measured: {where}"


def _peaks_text(
    devices: dict,
    from_dtypes: Counter[str],
    dtype: str,
    cnt: Callable[[int], str],
    tf32: dict[int, bool],
) -> str:
    """Which device figures the peak ratios and rooflines used, and how dtypes were read
    (counts per step and rank, like every count of the assumption)."""
    specs = {d.name: d for d in devices.values()}.values()
    parts = []
    for dev in specs:
        peaks = ", ".join(
            f"{d} {dev.peak(d):g}" for d in sorted(set(from_dtypes) | {dtype}, key=str)
        )
        parts.append(
            f"{dev.name}: peak TFLOPS {peaks}, memory {dev.mem_bw_gbs:g} GB/s (datasheet: "
            f"{dev.source})"
        )
    read = ", ".join(f"{cnt(k)} {d}" for d, k in from_dtypes.most_common())
    if all(tf32.values()):
        conv = "tf32 (cuDNN's default on GPUs with TF32 tensor cores)"
    elif not any(tf32.values()):
        amd = any(d.vendor != "NVIDIA" for d in specs)
        conv = "fp32 (" + ("MIOpen's convolutions run fp32" if amd else "no TF32 on this GPU") + ")"
    else:
        conv = "tf32 on GPUs with TF32 tensor cores, else fp32"
    return (
        "; ".join(parts)
        + f"; kernels' current dtype from their names ({read}): a convolution naming none is "
        f"{conv}, a matmul naming none fp32 (matmul TF32 is off by default since PyTorch 1.12)"
    )


def _grad_scaler(graph: Graph, fixed: int) -> str:
    """fp16's GradScaler per rank and step: unscale + scale-update kernels and the host's
    inf check, before the optimizer (see module docstring). Returns the assumption's text.

    Every rank-step's nodes are placed first and appended together: an insert per
    rank-step re-scanned and re-copied the whole graph each time."""
    from perfcast.whatif.models.fused_optimizer import params_estimate

    c = graph.cols
    in_opt = (c["iteration"] >= 0) & (c["phase"] == Phase.OPTIMIZER) & graph.alive
    host_all = np.flatnonzero(
        in_opt & np.isin(c["kind"], [NodeKind.CPU, NodeKind.LAUNCH, NodeKind.RUNTIME])
    )
    gpu_all = np.flatnonzero(in_opt & (c["kind"] == NodeKind.GPU))
    rank_step = combine_codes(
        np.concatenate([c["rank"][host_all], c["rank"][gpu_all]]).astype(np.int64),
        np.concatenate([c["iteration"][host_all], c["iteration"][gpu_all]]).astype(np.int64),
    )[0]
    gpu_of = dict(split_by(rank_step[host_all.size :], c["order"][gpu_all]))
    firsts: list[int] = []
    gpu_lanes: list[int] = []
    likes: list[int] = []
    unscale: list[int] = []
    for code, pos in split_by(rank_step[: host_all.size], c["order"][host_all]):
        gpos = gpu_of.get(code)
        if gpos is None:
            continue
        opt_gpu = gpu_all[gpos]  # in launch order: the first on the first stream used
        _, per_param = params_estimate(graph, opt_gpu)
        firsts.append(int(host_all[pos[0]]))
        gpu_lanes.append(int(c["lane"][opt_gpu[0]]))
        likes.append(int(opt_gpu.min()))
        unscale.append(fixed + int(c["dur"][opt_gpu].sum()) // max(per_param, 1))
    if not firsts:
        return "; no optimizer found for fp16's GradScaler"
    first = np.array(firsts, dtype=np.int64)
    lane_gpu = np.array(gpu_lanes, dtype=np.int64)
    host_lane = c["lane"][first]
    launch_ns = P.median_launch_ns(graph)
    # Two launches right before the optimizer's first host work, then the inf check (a
    # sync on the unscale kernel's stream) right after them.
    launch_at = P.order_slots(graph, first, 2, after=False, near=True)
    sync_at = launch_at[:, 1] + (c["order"][first] - launch_at[:, 1]) * 0.5e-3
    # On the stream, right after the work enqueued before these launches.
    anchor = _last_launched_before(graph, lane_gpu, launch_at[:, 0], np.full(first.size, -1))
    after = anchor >= 0
    for lane in np.unique(lane_gpu[~after]).tolist():  # nothing before: the lane's first
        on = np.flatnonzero((c["lane"] == lane) & graph.alive)
        anchor[~after & (lane_gpu == lane)] = on[np.argmin(c["order"][on])]
    kernel_at = np.empty((first.size, 2))
    for flag in (True, False):
        sel = after == flag
        if sel.any():
            kernel_at[sel] = P.order_slots(graph, anchor[sel], 2, after=flag, near=True)
    host_like = P.like_columns(graph, np.repeat(first, 2))
    launches = graph.append(
        kind=int(NodeKind.LAUNCH),
        lane=np.repeat(host_lane, 2),
        order=launch_at.reshape(-1),
        launch_order=launch_at.reshape(-1),
        dur=launch_ns,
        source=int(Source.MODELLED),
        name=graph.intern("cudaLaunchKernel"),
        **host_like,
    )
    gpu_like = P.like_columns(graph, np.repeat(np.array(likes, dtype=np.int64), 2))
    gpu_like["gpu_kind"] = np.full(launches.size, int(GpuKind.KERNEL))
    graph.append(
        kind=int(NodeKind.GPU),
        lane=np.repeat(lane_gpu, 2),
        order=kernel_at.reshape(-1),
        launch_order=launch_at.reshape(-1),
        dur=np.stack([np.array(unscale, dtype=np.int64), np.full(first.size, fixed)], 1).reshape(
            -1
        ),
        source=int(Source.MODELLED),
        name=graph.intern("GradScaler unscale / update_scale (modelled)"),
        launch=launches,
        launch_w=int(graph.nominal.get("launch_latency_ns", DEFAULT_LAUNCH_LATENCY_NS)),
        stream_w=int(graph.nominal.get("stream_gap_ns", DEFAULT_STREAM_GAP_NS)),
        **gpu_like,
    )
    graph.append(
        kind=int(NodeKind.SYNC),
        lane=host_lane,
        order=sync_at,
        launch_order=sync_at,
        dur=SYNC_MIN_NS,
        source=int(Source.MODELLED),
        name=graph.intern("cudaStreamSynchronize (GradScaler inf check, modelled)"),
        sync_kind=int(SyncKind.STREAM),
        sync_lane=lane_gpu,
        **P.like_columns(graph, first),
    )
    _, where = P.rank_steps(graph, first)
    return (
        f"; fp16 GradScaler {where}: unscale + update kernels and a host inf check "
        "(a synchronization) before the optimizer"
    )


@dataclass(frozen=True)
class _Cast:
    """One forward weight cast as inserted: where it is, and what its kernel moves."""

    rank: int
    iteration: int
    dur: int
    nbytes: int


def _native_batch_norm(graph: Graph, kept: np.ndarray, fixed: int) -> int:
    """Forward batch norm in bf16 runs ATen's native CUDA kernels (`batch_norm_cuda` in
    aten/src/ATen/native/cuda/Normalization.cu): a statistics kernel, a running-stats update
    and an elementwise transform, each launched by its own call, where cuDNN's training
    forward was one kernel. The cuDNN kernel's variable time is split between the statistics
    and the transform (same GPU time; the measured slowdown of the native kernels is not
    modelled); the update kernel and each new kernel pay the fixed cost; the two new launches
    take the trace's median launch time. Returns how many batch norms were converted."""
    c = graph.cols
    if kept.size == 0:
        return 0
    fwd = kept[c["phase"][kept] == Phase.FORWARD]
    fwd = fwd[(c["launch"][fwd] >= 0)]
    # The last kernel of each launching op on each stream stands for the op's work.
    last: dict[tuple[int, int], int] = {}
    for n in fwd[np.argsort(c["order"][fwd], kind="stable")].tolist():
        last[(int(c["op"][n]), int(c["lane"][n]))] = n
    anchors = np.array(sorted(last.values()), dtype=np.int64)
    if anchors.size == 0:
        return 0
    launches = c["launch"][anchors].astype(np.int64)
    launch_ns = P.median_launch_ns(graph)
    host_slots = P.order_slots(graph, launches, 2, after=True)
    new_launches = [
        graph.append(
            kind=int(NodeKind.LAUNCH),
            lane=c["lane"][launches],
            order=host_slots[:, j],
            dur=launch_ns,
            dur_measured=launch_ns,
            source=int(Source.MODELLED),
            name=graph.intern("cudaLaunchKernel"),
            **P.like_columns(graph, launches),
        )
        for j in range(2)
    ]
    c = graph.cols
    d = c["dur"][anchors].astype(np.int64)
    f = np.minimum(d, fixed)
    half = (d - f) // 2
    P.set_duration(graph, anchors, f + half, Source.SCALED)
    gpu_slots = P.order_slots(graph, anchors, 2, after=True)
    for j, (dur, label) in enumerate(
        (
            (np.full(anchors.size, fixed), "batch_norm_update_stats (native bf16, modelled)"),
            (f + (d - f - half), "batch_norm_transform (native bf16, modelled)"),
        )
    ):
        like = P.like_columns(graph, anchors)
        graph.append(
            kind=int(NodeKind.GPU),
            lane=c["lane"][anchors],
            order=gpu_slots[:, j],
            launch_order=graph.cols["order"][new_launches[j]],
            dur=dur.astype(np.int64),
            source=int(Source.MODELLED),
            name=graph.intern(label),
            launch=new_launches[j],
            launch_w=int(graph.nominal.get("launch_latency_ns", DEFAULT_LAUNCH_LATENCY_NS)),
            stream_w=int(graph.nominal.get("stream_gap_ns", DEFAULT_STREAM_GAP_NS)),
            **like,
        )
        c = graph.cols
    return int(anchors.size)


def _insert_casts(
    graph: Graph, comp: np.ndarray, dtype: str, devices: dict, fixed: int, costs: _HostCosts
) -> list[_Cast]:
    """One weight cast before each forward op that launched a converted matmul/conv.

    Insertions are batched (one `Graph.append` per node kind) with positions chosen as
    `primitives.insert(before=...)` chooses them.
    """
    c = graph.cols
    names = graph.names
    fwd = comp[c["phase"][comp] == Phase.FORWARD]
    fwd = fwd[np.argsort(c["order"][fwd], kind="stable")]
    if fwd.size == 0:
        return []
    # The first GPU task of each op on each stream (a layout transform may precede the GEMM).
    alive_gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & graph.alive & (c["op"] >= 0))
    alive_gpu = alive_gpu[np.isin(c["op"][alive_gpu], c["op"][fwd])]
    alive_gpu = alive_gpu[np.argsort(c["order"][alive_gpu], kind="stable")]
    first_of: dict[tuple[int, int], int] = {}
    for n, op, lane in zip(
        alive_gpu.tolist(), c["op"][alive_gpu].tolist(), c["lane"][alive_gpu].tolist()
    ):
        first_of.setdefault((op, lane), n)
    # One cast per launching op (kernels without one stand alone), before its first task.
    firsts: list[int] = []
    durs: list[int] = []
    nbytes: list[int] = []
    seen: set[tuple[int, int]] = set()
    for n in fwd.tolist():
        op, lane = int(c["op"][n]), int(c["lane"][n])
        key = (op, lane) if op >= 0 else (-1 - n, lane)
        if key in seen:
            continue
        seen.add(key)
        opn = names[int(c["op_name"][n])] if c["op_name"][n] >= 0 else ""
        if opn and _NO_WEIGHT.search(opn):
            continue
        numel = weight_numel(opn, op_input_dims(graph, n)) if opn else None
        moved = numel * (BYTES_FP32 + BYTES_16) if numel else 0
        dev = devices[int(c["rank"][n])]
        firsts.append(first_of.get((op, lane), n) if op >= 0 else n)
        durs.append(fixed + round(moved / dev.mem_bw_gbs))
        nbytes.append(moved)
    if not firsts:
        return []
    first = np.array(firsts, dtype=np.int64)
    launch = c["launch"][first].astype(np.int64)
    has_launch = launch >= 0
    launch_ns = P.median_launch_ns(graph)
    cpu_ns = costs.cast_ns
    new_launch = np.full(first.size, -1, dtype=np.int64)
    if has_launch.any():
        anchors = launch[has_launch]
        slots = P.order_slots(graph, anchors, 2, after=False)
        new_launch[has_launch] = _append_cast_call(
            graph, anchors, slots, cpu_ns, FORWARD_CAST_CALL, launch_ns
        )
    c = graph.cols
    slots = P.order_slots(graph, first, 1, after=False)[:, 0]
    like = P.like_columns(graph, first)
    like["gpu_kind"] = np.full(first.size, int(GpuKind.KERNEL))
    like["klass"] = np.full(first.size, int(KernelClass.ELEMENTWISE))
    graph.append(
        kind=int(NodeKind.GPU),
        lane=c["lane"][first],
        order=slots,
        launch_order=np.where(new_launch >= 0, c["order"][np.maximum(new_launch, 0)], slots),
        dur=np.array(durs, dtype=np.int64),
        source=int(Source.MODELLED),
        name=graph.intern(_CAST_NAME.format(dtype=dtype)),
        launch=new_launch,
        launch_w=int(graph.nominal.get("launch_latency_ns", DEFAULT_LAUNCH_LATENCY_NS)),
        stream_w=int(graph.nominal.get("stream_gap_ns", DEFAULT_STREAM_GAP_NS)),
        nbytes=np.array(nbytes, dtype=np.int64),
        **like,
    )
    return [
        _Cast(int(r), int(i), d, b)
        for r, i, d, b in zip(
            c["rank"][first].tolist(), c["iteration"][first].tolist(), durs, nbytes
        )
    ]


def _insert_grad_casts(
    graph: Graph,
    comp: np.ndarray,
    dtype: str,
    costs: _HostCosts,
    forward: list[_Cast],
    fixed: int,
) -> list[int]:
    """ToCopyBackward0: each weight cast of forward is undone in backward, where the 16-bit
    weight gradient is cast back to fp32 by an autograd node of its own, right after the
    node of the layer (ConvolutionBackward0, AddmmBackward0, ...) that produced it.

    One node per autograd node that launched a converted matmul/convolution in backward
    (attention and batched matmuls have no weight): its CPU (the node's own time plus a
    cast) and a launch after the layer node's last host work, and a cast kernel on the
    layer's stream after everything launched before it. Its size is the forward cast's of
    the same layer: within each rank and step, backward meets the layers in reverse order
    (where the counts differ, the median of that step's forward casts). Returns the
    kernels' durations.
    """
    table = graph.table
    c = graph.cols
    bwd = comp[c["phase"][comp] == Phase.BACKWARD]
    if table is None or bwd.size == 0 or not forward:
        return []
    is_node = _autograd_node_names(table)
    if not is_node.any():
        return []

    def node_of(rows: np.ndarray) -> np.ndarray:
        return _nearest(table, rows, is_node, depth=24)

    bwd = bwd[c["op"][bwd] >= 0]
    nodes = node_of(c["op"][bwd])
    keep = nodes >= 0
    bwd, nodes = bwd[keep], nodes[keep]
    weighted = [
        not _NO_WEIGHT.search(table.names[int(table.name[r])].lower())
        for r in np.unique(nodes).tolist()
    ]
    targets = np.unique(nodes)[np.array(weighted, dtype=bool)] if nodes.size else nodes
    if targets.size == 0:
        return []
    alive = graph.alive
    host = np.flatnonzero(np.isin(c["kind"], _HOST_KINDS) & alive & (c["op"] >= 0))
    host_node = node_of(c["op"][host])
    # Per target node: its last host work and its last kernel (by position), where it has
    # both; grouped with one sort each (a mask per target was O(targets x host nodes)).
    mine = np.isin(host_node, targets)
    host, host_node = host[mine], host_node[mine]
    host_keys, host_at = argmax_by(host_node, c["order"][host])
    mine = np.isin(nodes, targets)
    kern, kern_node = bwd[mine], nodes[mine]
    kern_keys, kern_at = argmax_by(kern_node, c["order"][kern])
    both = np.intersect1d(host_keys, kern_keys)
    if both.size == 0:
        return []
    h = host[host_at[np.searchsorted(host_keys, both)]].astype(np.int64)
    g = kern[kern_at[np.searchsorted(kern_keys, both)]].astype(np.int64)
    durs, nbytes = _grad_cast_sizes(c, h, forward)
    launch_ns = P.median_launch_ns(graph)
    slots = P.order_slots(graph, h, 2, after=True)
    launches = _append_cast_call(
        graph,
        h,
        slots,
        costs.node_ns + costs.cast_ns,
        BACKWARD_CAST_CALL,
        launch_ns,
    )
    c = graph.cols
    launch_order = c["order"][launches]
    # On a stream, what was launched earlier runs earlier: the cast goes after the last task
    # of the layer's stream launched before it (a bias gradient, a layout helper, ...).
    anchors = _last_launched_before(graph, c["lane"][g], launch_order, fallback=g)
    gpu_slots = P.order_slots(graph, anchors, 1, after=True)[:, 0]
    like = P.like_columns(graph, g)
    like["gpu_kind"] = np.full(g.size, int(GpuKind.KERNEL))
    like["klass"] = np.full(g.size, int(KernelClass.ELEMENTWISE))
    graph.append(
        kind=int(NodeKind.GPU),
        lane=c["lane"][g],
        order=gpu_slots,
        launch_order=launch_order,
        dur=np.maximum(durs, fixed),
        source=int(Source.MODELLED),
        name=graph.intern(f"autocast cast {dtype} -> fp32 gradient (modelled)"),
        launch=launches,
        launch_w=int(graph.nominal.get("launch_latency_ns", DEFAULT_LAUNCH_LATENCY_NS)),
        stream_w=int(graph.nominal.get("stream_gap_ns", DEFAULT_STREAM_GAP_NS)),
        nbytes=nbytes,
        **like,
    )
    return np.maximum(durs, fixed).tolist()


def _grad_cast_sizes(
    c: dict[str, np.ndarray], anchors: np.ndarray, forward: list[_Cast]
) -> tuple[np.ndarray, np.ndarray]:
    """Per backward cast (anchored at `anchors`), the duration and bytes of the forward cast
    of the same layer: per rank and step, forward's casts in reverse order."""
    durs = np.empty(anchors.size, dtype=np.int64)
    nbytes = np.empty(anchors.size, dtype=np.int64)
    groups: dict[tuple[int, int], list[_Cast]] = {}
    for x in forward:
        groups.setdefault((x.rank, x.iteration), []).append(x)
    every = [x.dur for x in forward]
    every_bytes = [x.nbytes for x in forward]
    keys = list(zip(c["rank"][anchors].tolist(), c["iteration"][anchors].tolist()))
    for key in set(keys):
        mine = np.flatnonzero([k == key for k in keys])
        mine = mine[np.argsort(c["order"][anchors[mine]], kind="stable")]
        fwd = groups.get(key, [])
        if len(fwd) == mine.size:
            durs[mine] = [x.dur for x in reversed(fwd)]
            nbytes[mine] = [x.nbytes for x in reversed(fwd)]
        else:
            durs[mine] = int(np.median([x.dur for x in fwd] or every))
            nbytes[mine] = int(np.median([x.nbytes for x in fwd] or every_bytes))
    return durs, nbytes


def _last_launched_before(
    graph: Graph, lanes: np.ndarray, launch_order: np.ndarray, fallback: np.ndarray
) -> np.ndarray:
    """Per (lane, launch order key): the live task of that lane with the latest position
    among those launched before the key (`fallback` where none is)."""
    c = graph.cols
    alive = graph.alive
    out = fallback.copy()
    for lane in np.unique(lanes).tolist():
        on = np.flatnonzero((c["lane"] == lane) & alive)
        if on.size == 0:
            continue
        by_launch = on[np.argsort(c["launch_order"][on], kind="stable")]
        keys = c["launch_order"][by_launch]
        # The latest-positioned task among the first k by launch order, for every k.
        which = by_launch[_argmax_prefix(c["order"][by_launch])]
        sel = np.flatnonzero(lanes == lane)
        k = np.searchsorted(keys, launch_order[sel], side="left")
        has = k > 0
        out[sel[has]] = which[k[has] - 1]
    return out


def _argmax_prefix(values: np.ndarray) -> np.ndarray:
    """Index of the running maximum of `values` at every position."""
    idx = np.arange(values.size)
    is_new_max = np.r_[True, values[1:] > np.maximum.accumulate(values)[:-1]]
    return np.maximum.accumulate(np.where(is_new_max, idx, 0))


def _append_cast_call(
    graph: Graph, anchors: np.ndarray, slots: np.ndarray, cpu_ns: int, name: str, launch_ns: int
) -> np.ndarray:
    """A modelled cast on the host beside each anchor: its op's CPU time (none when `cpu_ns`
    is 0) in the first of two order slots, and the kernel launch in the second. Returns the
    launches."""
    lanes = graph.cols["lane"][anchors]
    if cpu_ns > 0:
        graph.append(
            kind=int(NodeKind.CPU),
            lane=lanes,
            order=slots[:, 0],
            dur=cpu_ns,
            source=int(Source.MODELLED),
            name=graph.intern(name),
            **P.like_columns(graph, anchors),
        )
    return graph.append(
        kind=int(NodeKind.LAUNCH),
        lane=lanes,
        order=slots[:, 1],
        dur=launch_ns,
        dur_measured=launch_ns,
        source=int(Source.MODELLED),
        name=graph.intern("cudaLaunchKernel"),
        **P.like_columns(graph, anchors),
    )
