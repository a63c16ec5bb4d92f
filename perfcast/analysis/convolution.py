"""FLOPs and bytes of a convolution op, from its input shapes and "Concrete Inputs".

A convolution's output size needs its stride, padding and dilation, which the trace's
"Input Dims" record as empty shapes; the values are in the op's "Concrete Inputs" (PyTorch
2.x with record_shapes=True; `EventTable.concrete`). A backward op needs none of them: its
output gradient has the forward output's shape.

Per call (b = bytes per element; x input [N, C, *in], w weight, o output [N, Cout, *out]):

- forward: 2·N·prod(out)·numel(w) FLOPs (each output element is a dot product of
  numel(w)/Cout terms; groups are already in w's shape), x + w + o (+ bias) bytes. Output
  size per spatial dimension: floor((in + 2·pad − dil·(k − 1) − 1) / stride) + 1.
- transposed forward: 2·N·prod(in)·numel(w) FLOPs (the forward's mirror), output size
  (in − 1)·stride − 2·pad + dil·(k − 1) + output_padding + 1.
- backward: the same FLOPs as forward for each gradient it computes (input, weight; the
  bias gradient's sum is left out), from its output_mask; both when the trace does not say
  (2021-era traces: the first layer's, which skips the input gradient, is counted double).

Ops that only wrap another convolution op (conv2d → convolution → _convolution →
cudnn_convolution) have the same cost; the callers count the innermost one that has one.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class _Args:
    """Positions of a forward convolution op's arguments (None: the op has none)."""

    bias: int | None
    stride: int
    padding: int
    dilation: int | None
    transposed: int | bool  # the argument's position, or the op's fixed answer
    output_padding: int | None = None


_FORWARD: dict[str, _Args] = {
    **dict.fromkeys(
        ("aten::conv1d", "aten::conv2d", "aten::conv3d"), _Args(2, 3, 4, 5, transposed=False)
    ),
    **dict.fromkeys(
        ("aten::convolution", "aten::_convolution"), _Args(2, 3, 4, 5, 6, output_padding=7)
    ),
    "aten::cudnn_convolution": _Args(None, 3, 2, 4, transposed=False),
    **dict.fromkeys(
        ("aten::miopen_convolution", "aten::mkldnn_convolution"), _Args(2, 4, 3, 5, False)
    ),
    "aten::cudnn_convolution_transpose": _Args(None, 4, 2, 5, True, output_padding=3),
    "aten::miopen_convolution_transpose": _Args(2, 5, 3, 6, True, output_padding=4),
    **dict.fromkeys(
        ("aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d"),
        _Args(2, 3, 4, 7, True, output_padding=5),
    ),
    "aten::_slow_conv2d_forward": _Args(3, 4, 5, None, False),
}
# Backward ops: (grad_output, input, weight) positions, transposed, output_mask positions.
# 2021-era cudnn_convolution_backward wraps _backward_input and _backward_weight, whose
# kernels the callers attribute to it (their own inputs leave a size unknown).
_BACKWARD: dict[str, tuple[tuple[int, int, int], int | bool, int]] = {
    "aten::convolution_backward": ((0, 1, 2), 7, 10),
    "aten::cudnn_convolution_backward": ((1, 0, 2), False, 10),
    "aten::miopen_convolution_backward": ((1, 0, 2), False, 9),
}
FORWARD_CONVOLUTIONS = frozenset(_FORWARD)
CONVOLUTION_OPS = FORWARD_CONVOLUTIONS | frozenset(_BACKWARD)


def parse_concrete(text: str | None) -> list[str] | None:
    """A trace's "Concrete Inputs" list (as `EventTable.concrete` keeps it) as strings."""
    if not text:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return [str(v) for v in value] if isinstance(value, list) else None


def _value(concrete: list[str] | None, i: int | None) -> object:
    if concrete is None or i is None or i >= len(concrete) or concrete[i] == "":
        return None
    try:
        return ast.literal_eval(concrete[i])
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return concrete[i]  # padding="same" / "valid" is written bare


def _per_dim(v: object, d: int, default: int) -> list[int] | None:
    if v is None:
        return [default] * d
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return [v] * d
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        if len(v) == d:
            return list(v)
        if len(v) == 1:
            return v * d
    return None


def _bool(v: object, default: bool) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v in ("True", "False"):
        return v == "True"
    return default


def _forward(
    args: _Args, dims: list[list[int]], concrete: list[str] | None, b: int
) -> tuple[float, float] | None:
    x, w = dims[0], dims[1]
    d = len(x) - 2
    if d < 1 or len(w) != len(x) or concrete is None:
        return None
    transposed = (
        args.transposed
        if isinstance(args.transposed, bool)
        else _bool(_value(concrete, args.transposed), False)
    )
    stride = _per_dim(_value(concrete, args.stride), d, 1)
    dilation = _per_dim(_value(concrete, args.dilation), d, 1)
    pad_value = _value(concrete, args.padding)
    kernel = w[2:]
    if isinstance(pad_value, str):
        if pad_value.strip("'\"") == "valid":
            padding = [0] * d
        elif pad_value.strip("'\"") == "same" and not transposed:
            padding = None  # output size = input size (PyTorch allows "same" at stride 1 only)
        else:
            return None
    else:
        padding = _per_dim(pad_value, d, 0)
        if padding is None:
            return None
    if stride is None or dilation is None or min(stride) < 1:
        return None
    n = x[0]
    if transposed:
        out_pad = _per_dim(_value(concrete, args.output_padding), d, 0) or [0] * d
        pads = padding or [0] * d
        out = [
            (i - 1) * s - 2 * p + dl * (k - 1) + op + 1
            for i, s, p, dl, k, op in zip(
                x[2:], stride, pads, dilation, kernel, out_pad, strict=True
            )
        ]
        flops = 2.0 * n * math.prod(x[2:]) * math.prod(w)
        c_out = w[1]  # w is (Cin, Cout / groups, *k): exact for one group, the usual case
    else:
        if padding is None:
            out = list(x[2:])
        else:
            out = [
                (i + 2 * p - dl * (k - 1) - 1) // s + 1
                for i, s, p, dl, k in zip(x[2:], stride, padding, dilation, kernel, strict=True)
            ]
        flops = 2.0 * n * math.prod(out) * math.prod(w)
        c_out = w[0]
    if min(out) < 1:
        return None
    bias = dims[args.bias] if args.bias is not None and args.bias < len(dims) else []
    moved = (
        math.prod(x) + math.prod(w) + n * c_out * math.prod(out) + (math.prod(bias) if bias else 0)
    )
    return flops, float(moved) * b


def _backward(
    spec: tuple[tuple[int, int, int], int | bool, int],
    dims: list[list[int]],
    concrete: list[str] | None,
    b: int,
) -> tuple[float, float] | None:
    (gi, xi, wi), transposed_at, mask_at = spec
    if max(gi, xi, wi) >= len(dims):
        return None
    go, x, w = dims[gi], dims[xi], dims[wi]
    if len(go) < 3 or len(go) != len(x) or len(w) != len(x) or go[0] != x[0]:
        return None
    transposed = (
        transposed_at
        if isinstance(transposed_at, bool)
        else _bool(_value(concrete, transposed_at), False)
    )
    mask = _value(concrete, mask_at)
    grad_input, grad_weight = (
        (bool(mask[0]), bool(mask[1]))
        if isinstance(mask, list) and len(mask) >= 2 and all(isinstance(m, bool) for m in mask)
        else (True, True)
    )
    # The forward's spatial extent its FLOPs are counted over: the output's, or for a
    # transposed convolution its input's (here the backward's `input`).
    spatial = x[2:] if transposed else go[2:]
    if not transposed and go[1] != w[0]:
        return None
    one = 2.0 * x[0] * math.prod(spatial) * math.prod(w)
    flops = one * (int(grad_input) + int(grad_weight))
    reads = (
        math.prod(go) + (math.prod(w) if grad_input else 0) + (math.prod(x) if grad_weight else 0)
    )
    writes = (math.prod(x) if grad_input else 0) + (math.prod(w) if grad_weight else 0)
    return flops, float(reads + writes) * b


def conv_cost(
    name: str, dims: list[list[int]], concrete: list[str] | None, b: int
) -> tuple[float, float] | None:
    """(FLOPs, bytes) of one call of convolution op `name`, or None where its shapes (or the
    forward's stride and padding) are not recorded.

    >>> conv_cost("aten::conv2d", [[64, 3, 224, 224], [64, 3, 7, 7], []],
    ...           ["", "", "", "[2, 2]", "[3, 3]", "[1, 1]", "1"], 4)[0] / 1e9
    15.105785856
    """
    if name in _FORWARD:
        return _forward(_FORWARD[name], dims, concrete, b) if len(dims) >= 2 else None
    if name in _BACKWARD:
        return _backward(_BACKWARD[name], dims, concrete, b)
    return None


def conv_args_text(name: str, concrete: list[str] | None) -> str:
    """A forward convolution's stride, padding and dilation as a short label ('' if none)."""
    args = _FORWARD.get(name)
    if args is None or concrete is None:
        return ""
    parts = [
        f"{label} {_value(concrete, i)}"
        for label, i in (
            ("stride", args.stride),
            ("padding", args.padding),
            ("dilation", args.dilation),
        )
        if _value(concrete, i) is not None
    ]
    return ", ".join(parts)


# Where a forward convolution op records cuDNN's allow_tf32 (torch.backends.cudnn.allow_tf32,
# True unless the user turned it off).
_ALLOW_TF32_AT = {
    "aten::cudnn_convolution": 8,
    "aten::_convolution": 12,
    "aten::cudnn_convolution_transpose": 9,
}


def allows_tf32(name: str, concrete: list[str] | None) -> bool | None:
    """Whether a convolution op's recorded allow_tf32 argument is on; None if not recorded."""
    value = _value(concrete, _ALLOW_TF32_AT.get(name))
    return _bool(value, False) if value is not None else None
