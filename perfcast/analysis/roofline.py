"""Per-op roofline: FLOPs and bytes from the recorded input shapes, the GPU time of the kernels
each op launched, achieved TFLOP/s and GB/s, and the fraction of the device's peak.

Needs `record_shapes=True`. Formulas (per call; b = bytes per element):

- mm [M,K]x[K,N]: 2MKN FLOPs, (MK + KN + MN)·b bytes; addmm adds the bias (read) to that;
  bmm / baddbmm the same per batch; linear [...,K] with weight [N,K]: 2·rows·K·N.
- scaled dot-product attention q [B,H,L,E], k [B,H,S,E], v [B,H,S,Ev]: 2·B·H·L·S·(E + Ev)
  FLOPs (QKᵀ and PV), q + k + v + output bytes.
- elementwise ops (add, mul, relu, ...) and normalizations / softmax: one FLOP per output
  element (five for norms and softmax), every input read and the output written once.

- convolutions (forward, transposed, backward): `analysis.convolution`; a forward one needs
  its stride and padding from the trace's "Concrete Inputs" (PyTorch 2.x), and is left out
  of traces without them (the row's shapes then say so in the notes).

The dtype (and so b and the peak) is read from the names of the kernels the op launched
(`hardware.classify.dtype_from_kernel_name`), fp32 when they do not say (the row says so).
The peak is the device's for that dtype (`DeviceSpec.peak`), the bandwidth its memory's.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from perfcast.analysis.common import NS_PER_MS, device_spec, nearest_ancestor
from perfcast.analysis.convolution import (
    CONVOLUTION_OPS,
    FORWARD_CONVOLUTIONS,
    allows_tf32,
    conv_args_text,
    conv_cost,
    parse_concrete,
)
from perfcast.analysis.notes import input_notes
from perfcast.arrays import combine_codes, split_by
from perfcast.events import EventTable, Kind
from perfcast.frames import Tables, plain
from perfcast.hardware import convs_in_tf32
from perfcast.hardware.classify import dtype_from_kernel_name
from perfcast.ingest.input_dims import parse_input_dims, row_input_dtype, tensor_shapes

DTYPE_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

MATRIX_PRODUCTS = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::linear",
    "aten::matmul",
    "aten::_addmm_activation",
}
_SDPA_FORWARD = (
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_flash_attention_forward",
    "aten::_efficient_attention_forward",
)
# Their backward ops take the output's gradient first, then q, k, v. They run four matmuls
# (dV, dP, dQ, dK) where forward ran two, and the fused kernels recompute the scores (one
# more): 2.5x forward's FLOPs (FlashAttention-2 paper, Dao 2023, section 3.1.2 counts the
# same five matmuls).
_SDPA_BACKWARD = {
    "aten::_scaled_dot_product_flash_attention_backward": False,
    "aten::_scaled_dot_product_efficient_attention_backward": False,
    "aten::_scaled_dot_product_cudnn_attention_backward": False,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": False,
    "aten::_flash_attention_backward": True,  # seq-major
    "aten::_efficient_attention_backward": True,
}
FUSED_ATTENTION = (*_SDPA_FORWARD, *_SDPA_BACKWARD)
_SDPA = FUSED_ATTENTION
ATTENTION_BACKWARD_FLOPS = 2.5
_ELEMENTWISE = {
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "relu", "relu_", "gelu",
    "silu", "silu_", "sigmoid", "tanh", "threshold_backward", "gelu_backward",
    "silu_backward", "sigmoid_backward", "tanh_backward", "addcmul_", "addcdiv_", "lerp_",
    "sqrt", "rsqrt", "exp", "neg", "pow", "clamp", "clamp_", "where", "fill_", "copy_",
    "_foreach_add_", "_foreach_mul_", "dropout", "native_dropout", "abs", "maximum", "minimum",
}  # fmt: skip
# Attention ops that take q, k, v as (batch, seq, heads, dim); the scaled_dot_product_* ones
# take (batch, heads, seq, dim).
SEQ_MAJOR_ATTENTION = ("aten::_flash_attention_forward", "aten::_efficient_attention_forward")
# Arguments of the out-of-place elementwise ops (a scalar or option records an empty shape):
# one more, a tensor shaped like the result, is the .out variant's output.
_ARGS = {
    **dict.fromkeys(("relu", "silu", "sigmoid", "tanh", "sqrt", "rsqrt", "exp", "neg", "abs"), 1),
    **dict.fromkeys(
        ("gelu", "mul", "div", "pow", "maximum", "minimum", "silu_backward", "sigmoid_backward",
         "tanh_backward"),
        2,
    ),
    **dict.fromkeys(
        ("add", "sub", "threshold_backward", "gelu_backward", "clamp", "where", "dropout",
         "native_dropout"),
        3,
    ),
}  # fmt: skip
_NORMS = {
    "native_layer_norm",
    "native_layer_norm_backward",
    "_softmax",
    "_log_softmax",
    "_softmax_backward_data",
    "native_batch_norm",
    "cudnn_batch_norm",
    "native_group_norm",
    "_fused_rms_norm",
}


def attention_flops(name: str, dims: list[list[int]]) -> float | None:
    """FLOPs of one fused attention op (forward or backward) from its input shapes, or None
    where they are not 4-d q, k, v."""
    backward = name in _SDPA_BACKWARD
    qkv = dims[1:4] if backward else dims[0:3]
    if len(qkv) < 3 or any(len(t) != 4 for t in qkv) or qkv[0][-1] != qkv[1][-1]:
        return None
    q, k, v = qkv
    if name in SEQ_MAJOR_ATTENTION or _SDPA_BACKWARD.get(name, False):
        (n, lq, h, e), lk = q, k[1]  # flash-attn / xformers layout: batch, seq, heads, dim
    else:
        (n, h, lq, e), lk = q, k[2]  # scaled_dot_product_*: batch, heads, seq, dim
    forward = 2.0 * n * h * lq * lk * (e + v[3])
    return forward * ATTENTION_BACKWARD_FLOPS if backward else forward


def op_cost(name: str, shapes: list, b: int) -> tuple[float, float] | None:
    """(FLOPs, bytes) of one call of op `name` with input shapes `shapes`, or None.

    >>> op_cost("aten::mm", [[64, 256], [256, 128]], 4)
    (4194304.0, 229376.0)
    """
    # A tensor's shape is a list of ints; tensor lists and scalars count as no tensor.
    dims = [s if isinstance(s, list) and all(isinstance(x, int) for x in s) else [] for s in shapes]

    def numel(s: list) -> int:
        return math.prod(int(x) for x in s) if s else 0

    tensors = [d for d in dims if d]
    if name in MATRIX_PRODUCTS:
        return matrix_product_cost(name, dims, b)
    if name in _SDPA:
        flops = attention_flops(name, dims)
        if flops is None:
            return None
        backward = name in _SDPA_BACKWARD
        qkv = dims[1:4] if backward else dims[0:3]
        q_out = numel(qkv[0])  # the output (and its gradient) is shaped like q (v's dim aside)
        # Forward reads q, k, v and writes the output; backward reads the output's gradient,
        # q, k, v and the output and writes dq, dk, dv.
        moved = sum(numel(t) for t in qkv) * (2 if backward else 1) + q_out * (2 if backward else 1)
        return flops, float(moved) * b
    short = name.removeprefix("aten::")
    if (short in _ELEMENTWISE or short in _NORMS) and tensors:
        out = max(numel(t) for t in tensors)
        per = 5.0 if short in _NORMS else 1.0
        if short == "fill_":
            return 0.0, float(out) * b  # writes its tensor, reads nothing
        if short == "copy_":
            return 0.0, float(sum(numel(t) for t in tensors)) * b  # reads src, writes self
        reads = tensors
        args = _ARGS.get(short)
        if args is not None and len(dims) == args + 1 and numel(dims[-1]) == out:
            reads = tensors[:-1]  # the .out variant: its last tensor is where it writes
        return per * out, float(sum(numel(t) for t in reads) + out) * b
    return None


def _trace_allows_tf32(table: EventTable) -> bool:
    """cuDNN's allow_tf32 for convolution ops that do not record it: off when one forward
    convolution of the trace says it was off, else PyTorch's default (on)."""
    conv = np.array([n in FORWARD_CONVOLUTIONS for n in table.names], dtype=bool)
    rows = np.flatnonzero((table.kind == Kind.CPU_OP) & conv[table.name] & (table.concrete >= 0))
    for code in np.unique(table.concrete[rows]).tolist():
        for row in rows[table.concrete[rows] == code][:1].tolist():
            name = table.names[int(table.name[row])]
            if allows_tf32(name, parse_concrete(table.names[int(code)])) is False:
                return False
    return True


def matrix_product_cost(name: str, dims: list[list], b: int) -> tuple[float, float] | None:
    """(FLOPs, bytes) of one matrix product from its input shapes (`b` bytes per element), or
    None where the shapes do not chain (an inner dimension that differs). The one formula
    for the roofline, the calling-context tree's FLOPs and the models that read them."""

    def arg(i: int) -> list:
        return dims[i] if i < len(dims) else []

    if name == "aten::mm":
        a, w = arg(0), arg(1)
        if len(a) == 2 and len(w) == 2 and a[1] == w[0]:
            (m, k), n = a, w[1]
            return 2.0 * m * k * n, float(m * k + k * n + m * n) * b
        return None
    if name in ("aten::addmm", "aten::_addmm_activation"):
        bias, a, w = arg(0), arg(1), arg(2)
        if len(a) == 2 and len(w) == 2 and a[1] == w[0]:
            (m, k), n = a, w[1]
            bias_n = math.prod(bias) if bias else 0
            return 2.0 * m * k * n, float(m * k + k * n + m * n + bias_n) * b
        return None
    if name in ("aten::bmm", "aten::baddbmm"):
        a, w = (arg(0), arg(1)) if name == "aten::bmm" else (arg(1), arg(2))
        if len(a) == 3 and len(w) == 3 and a[0] == w[0] and a[2] == w[1]:
            (bt, m, k), n = a, w[2]
            out = 2 if name == "aten::baddbmm" else 1  # baddbmm reads its input too
            return 2.0 * bt * m * k * n, float(bt * (m * k + k * n + out * m * n)) * b
        return None
    if name == "aten::linear":
        x, w, bias = arg(0), arg(1), arg(2)
        if len(x) >= 1 and len(w) == 2 and x[-1] == w[1]:
            rows = math.prod(x[:-1]) if len(x) > 1 else 1
            k, n = x[-1], w[0]
            bias_n = math.prod(bias) if bias else 0
            return 2.0 * rows * k * n, float(rows * k + k * n + rows * n + bias_n) * b
        return None
    if name == "aten::matmul":
        x, w = arg(0), arg(1)
        if len(x) >= 2 and len(w) >= 2 and x[-1] == w[-2]:
            m, k, n = x[-2], x[-1], w[-1]
            bx, bw = math.prod(x[:-2]), math.prod(w[:-2])
            batch = max(bx, bw)  # one side broadcast over the other's batch
            return 2.0 * batch * m * k * n, float(bx * m * k + bw * k * n + batch * m * n) * b
        if len(x) >= 1 and len(w) == 1 and x[-1] == w[0]:  # (a batch of) matrices times a vector
            return 2.0 * math.prod(x), float(math.prod(x) + w[0] + math.prod(x[:-1])) * b
        if len(x) == 1 and len(w) >= 2 and x[0] == w[-2]:  # a vector times (a batch of) matrices
            out = math.prod(w[:-2]) * w[-1]
            return 2.0 * math.prod(w), float(x[0] + math.prod(w) + out) * b
        return None
    return None


@dataclass
class OpRoofline:
    """One op and its shapes on a rank: calls, GPU ms, GFLOP and MB per call, achieved
    TFLOP/s and GB/s, % of the device's peaks and which bound it is."""

    rank: int
    op: str
    shapes: str
    dtype: str
    dtype_assumed: bool  # the kernels' names did not say: fp32 assumed
    calls: int
    kernels: int
    gpu_ms: float
    gflops_per_call: float
    mb_per_call: float
    intensity: float  # FLOPs per byte
    tflops: float  # achieved
    gbs: float  # achieved
    peak_tflops: float | None
    peak_gbs: float | None
    pct_peak_flops: float | None
    pct_peak_bw: float | None
    bound: str  # "compute" or "memory": which side of the device's ridge point


@dataclass(repr=False)
class Roofline(Tables):
    """Result of `roofline`; table: ops (one row per op, shapes and rank)."""

    ops: list[OpRoofline]
    covered_pct: list[float]  # per rank: share of kernel time the rows account for
    notes: list[str] = field(default_factory=list)

    ROW_TYPES = {"ops": OpRoofline}  # noqa: RUF012


def roofline(table: EventTable, top: int = 30) -> Roofline:
    """FLOPs, bytes, achieved TFLOP/s and GB/s per op (and shapes), against the device's peak.

    >>> import perfcast
    >>> r = roofline(perfcast.load("trace_with_shapes.json.gz"))      # doctest: +SKIP
    >>> r.to_pandas()[["op", "tflops", "pct_peak_flops"]]             # doctest: +SKIP
    """
    out = Roofline([], [], notes=input_notes(table))
    names = table.names
    formula = np.array(
        [
            n in MATRIX_PRODUCTS
            or n in _SDPA
            or n in CONVOLUTION_OPS
            or n.removeprefix("aten::") in _ELEMENTWISE
            or n.removeprefix("aten::") in _NORMS
            for n in names
        ],
        dtype=bool,
    )
    wanted = (table.kind == Kind.CPU_OP) & formula[table.name] & (table.shapes >= 0)
    kern = np.flatnonzero((table.kind == Kind.KERNEL) & (table.launch >= 0))
    launch = table.launch[kern].astype(np.int64)
    op = nearest_ancestor(table, table.parent[launch], wanted)
    ok = op >= 0
    kern, op = kern[ok], op[ok]
    if kern.size == 0:
        out.notes.append(
            "no kernel was launched by an op with recorded shapes "
            "(record_shapes=True) and a known formula"
        )
        return plain(out)
    # Per op instance: GPU time, kernel count, kernel names (for the dtype).
    inst, inv = np.unique(op, return_inverse=True)
    gpu_ns = np.bincount(inv, weights=table.dur[kern])
    n_kern = np.bincount(inv)
    first_kernel = np.full(inst.size, -1, dtype=np.int64)
    first_kernel[inv[::-1]] = kern[::-1]
    # Group instances by (rank, op name, shapes, a convolution's stride and padding).
    ginv, groups = combine_codes(
        table.rank[inst].astype(np.int64),
        table.name[inst].astype(np.int64),
        table.shapes[inst].astype(np.int64),
        table.concrete[inst].astype(np.int64),
    )
    # Each group's instances, found with one sort (a mask per group is O(groups x ops)).
    members_of = dict(split_by(ginv))
    g_gpu = np.bincount(ginv, weights=gpu_ns)
    g_calls = np.bincount(ginv)
    g_kern = np.bincount(ginv, weights=n_kern)
    devices = {info.rank: device_spec(info) for info in table.ranks}
    dtype_of_kernel: dict[int, str | None] = {}
    skipped_convs: list[str] = []
    conv_tf32 = _trace_allows_tf32(table)
    tf32_convs = False
    for gi in np.argsort(-g_gpu, kind="stable").tolist():
        rank, name_i, shape_i, concrete_i = (int(x) for x in groups[gi])
        shapes = parse_input_dims(names[shape_i])
        in_group = members_of[gi]
        members = first_kernel[in_group]
        votes: Counter[str] = Counter()
        for kname in table.name[members].tolist():
            if kname not in dtype_of_kernel:
                dtype_of_kernel[kname] = dtype_from_kernel_name(names[kname])
            if dtype_of_kernel[kname]:
                votes[dtype_of_kernel[kname]] += 1  # type: ignore[index]
        # The op's own input dtype first (record_shapes writes it); the kernels' names for
        # what the inputs do not say (fp32 data run as TF32).
        first = int(inst[in_group][0])
        traced = row_input_dtype(table, first)
        named = votes.most_common(1)[0][0] if votes else None
        as_traced = traced and not (traced == "fp32" and named == "tf32")
        dtype = traced if as_traced and traced else named or "fp32"
        assumed = traced is None and named is None
        op_name = names[name_i]
        shape_text = names[shape_i]
        spec = devices.get(rank)
        concrete = None
        if op_name in CONVOLUTION_OPS:
            concrete = parse_concrete(names[concrete_i]) if concrete_i >= 0 else None
            # cuDNN runs fp32 convolutions as TF32 by default on GPUs that have it, and
            # kernel names do not always say so.
            allowed = allows_tf32(op_name, concrete)
            if (
                dtype == "fp32"
                and (allowed if allowed is not None else conv_tf32)
                and convs_in_tf32(spec)
            ):
                dtype, assumed, tf32_convs = "tf32", False, True
        b = DTYPE_BYTES.get(dtype, 4)
        if op_name in CONVOLUTION_OPS:
            cost = conv_cost(op_name, tensor_shapes(shapes), concrete, b) if shapes else None
            if (
                cost is None
                and concrete is None
                and op_name in FORWARD_CONVOLUTIONS
                and op_name not in skipped_convs
            ):
                skipped_convs.append(op_name)
            if args := conv_args_text(op_name, concrete):
                shape_text = f"{shape_text} {args}"
        else:
            cost = op_cost(op_name, shapes, b) if shapes is not None else None
        if cost is None:
            continue
        flops, nbytes = cost
        calls = int(g_calls[gi])
        secs = g_gpu[gi] / 1e9
        peak = spec.peak(dtype) if spec else None
        bw = spec.mem_bw_gbs if spec else None
        tflops = flops * calls / secs / 1e12 if secs > 0 else 0.0
        gbs = nbytes * calls / secs / 1e9 if secs > 0 else 0.0
        intensity = flops / nbytes if nbytes else 0.0
        ridge = (peak * 1e12) / (bw * 1e9) if peak and bw else None
        out.ops.append(
            OpRoofline(
                rank=rank,
                op=op_name,
                shapes=shape_text,
                dtype=dtype,
                dtype_assumed=assumed,
                calls=calls,
                kernels=int(g_kern[gi]),
                gpu_ms=g_gpu[gi] / NS_PER_MS,
                gflops_per_call=flops / 1e9,
                mb_per_call=nbytes / 1e6,
                intensity=intensity,
                tflops=tflops,
                gbs=gbs,
                peak_tflops=peak,
                peak_gbs=bw,
                pct_peak_flops=100.0 * tflops / peak if peak else None,
                pct_peak_bw=100.0 * gbs / bw if bw else None,
                bound="compute"
                if ridge is not None and intensity >= ridge
                else "memory"
                if ridge is not None
                else "",
            )
        )
    kernels = np.flatnonzero(table.kind == Kind.KERNEL)
    total_kernel = {info.rank: 0.0 for info in table.ranks}
    for rank, pos in split_by(table.rank[kernels]):
        total_kernel[rank] = float(table.dur[kernels[pos]].sum())
    covered: dict[int, float] = {}
    for row in out.ops:
        covered[row.rank] = covered.get(row.rank, 0.0) + row.gpu_ms * NS_PER_MS
    out.covered_pct = [
        100.0 * covered.get(r, 0.0) / (total_kernel[r] or 1.0) for r in table.rank_ids()
    ]
    # Keep the `top` rows by GPU time per rank (the table is sorted that way already).
    kept: dict[int, int] = {}
    rows = []
    for row in out.ops:
        if kept.get(row.rank, 0) < top:
            rows.append(row)
            kept[row.rank] = kept.get(row.rank, 0) + 1
    out.ops = rows
    if tf32_convs:
        out.notes.append(
            "fp32 convolutions are rated against the TF32 peak: cuDNN runs them as TF32 "
            "unless torch.backends.cudnn.allow_tf32 is off, which this trace does not say"
        )
    if any((row.pct_peak_flops or 0.0) > 100.0 for row in out.ops):
        out.notes.append(
            "above 100% of peak: the kernels did fewer operations than the formula counts "
            "(Winograd or FFT convolutions do), or ran in a lower precision than the row's"
        )
    if skipped_convs:
        out.notes.append(
            f"{', '.join(skipped_convs[:3])}: left out, the trace does not record its stride "
            'and padding ("Concrete Inputs", written by PyTorch 2.x with record_shapes=True)'
        )
    if any(devices[r] is None for r in devices):
        out.notes.append("unknown device on some ranks: no peak to compare with")
    return plain(out)
