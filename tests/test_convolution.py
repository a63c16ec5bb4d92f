"""Convolution FLOPs and bytes from input shapes and "Concrete Inputs": by hand, then on the
recorded H100 ResNet-50 (against torchvision's published 4.09 GMACs per image) and on
traces that do not record stride and padding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import perfcast
from perfcast.analysis.context import op_flops
from perfcast.analysis.convolution import allows_tf32, conv_args_text, conv_cost, parse_concrete
from perfcast.events import Kind

RECORDED = Path(__file__).parents[1] / "benchmarks/accuracy/recorded/traces/h100"
CONV2D = ["", "", "", "[2, 2]", "[3, 3]", "[1, 1]", "1"]  # stride, padding, dilation, groups


def test_forward_output_size_and_flops_by_hand() -> None:
    # ResNet-50's stem: 224 -> 112 (stride 2, padding 3, 7x7): 2 * N * 112^2 * numel(w).
    x, w = [64, 3, 224, 224], [64, 3, 7, 7]
    flops, nbytes = conv_cost("aten::conv2d", [x, w, []], CONV2D, 4)  # type: ignore[misc]
    assert flops == 2 * 64 * 112 * 112 * (64 * 3 * 7 * 7)
    assert nbytes == (64 * 3 * 224 * 224 + 64 * 3 * 7 * 7 + 64 * 64 * 112 * 112) * 4
    # A 1x1 downsample at stride 2 has the same input shapes as one at stride 1: its
    # FLOPs are a quarter of them.
    one = ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "1"]
    two = ["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "1"]
    dims = [[8, 256, 56, 56], [512, 256, 1, 1], []]
    f1 = conv_cost("aten::conv2d", dims, one, 4)
    f2 = conv_cost("aten::conv2d", dims, two, 4)
    assert f1 is not None and f2 is not None and f1[0] == 4 * f2[0]
    # cudnn_convolution takes padding before stride; miopen's has a bias in between.
    cudnn = ["", "", "[3, 3]", "[2, 2]", "[1, 1]", "1", "True", "False", "True"]
    assert conv_cost("aten::cudnn_convolution", [x, w], cudnn, 4)[0] == flops  # type: ignore[index]
    miopen = ["", "", "", "[3, 3]", "[2, 2]", "[1, 1]", "1", "False", "False"]
    assert conv_cost("aten::miopen_convolution", [x, w, []], miopen, 4)[0] == flops  # type: ignore[index]


def test_dilation_groups_bias_same_padding_and_3d() -> None:
    # Dilation 2 on a 3x3: the kernel spans 5, so 32 -> 28 without padding.
    dims = [[1, 4, 32, 32], [4, 4, 3, 3], []]
    c = ["", "", "", "[1, 1]", "[0, 0]", "[2, 2]", "1"]
    assert conv_cost("aten::conv2d", dims, c, 4)[0] == 2 * 28 * 28 * 4 * 4 * 9  # type: ignore[index]
    # Depthwise (groups = channels): the weight's shape already says it.
    dw = [[2, 32, 16, 16], [32, 1, 3, 3], [32]]
    c = ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "32"]
    flops, nbytes = conv_cost("aten::conv2d", dw, c, 2)  # type: ignore[misc]
    assert flops == 2 * 2 * 16 * 16 * 32 * 9
    assert nbytes == (2 * 32 * 16 * 16 * 2 + 32 * 9 + 32) * 2  # input, output, weight, bias
    # padding="same" keeps the size; "valid" is no padding.
    same = ["", "", "", "[1, 1]", "same", "[1, 1]", "1"]
    valid = ["", "", "", "[1, 1]", "valid", "[1, 1]", "1"]
    dims = [[1, 3, 10, 10], [5, 3, 3, 3], []]
    assert conv_cost("aten::conv2d", dims, same, 4)[0] == 2 * 100 * 5 * 27  # type: ignore[index]
    assert conv_cost("aten::conv2d", dims, valid, 4)[0] == 2 * 64 * 5 * 27  # type: ignore[index]
    # conv3d, and conv1d with one-element lists.
    c = ["", "", "", "[1, 1, 1]", "[1, 1, 1]", "[1, 1, 1]", "1"]
    assert conv_cost("aten::conv3d", [[1, 2, 4, 4, 4], [3, 2, 3, 3, 3], []], c, 4)[0] == (
        2 * 64 * 3 * 2 * 27
    )
    c = ["", "", "", "[2]", "[0]", "[1]", "1"]
    assert conv_cost("aten::conv1d", [[1, 2, 9], [3, 2, 3], []], c, 4)[0] == 2 * 4 * 3 * 2 * 3


def test_transposed_convolution() -> None:
    # conv_transpose2d 8 -> 16 (stride 2, kernel 2): FLOPs over the input's positions.
    x, w = [1, 16, 8, 8], [16, 4, 2, 2]
    c = ["", "", "", "[2, 2]", "[0, 0]", "[0, 0]", "1", "[1, 1]"]
    flops, nbytes = conv_cost("aten::conv_transpose2d", [x, w, []], c, 4)  # type: ignore[misc]
    assert flops == 2 * 64 * (16 * 4 * 2 * 2)
    assert nbytes == (16 * 64 + 16 * 4 * 4 + 4 * 16 * 16) * 4
    # aten::convolution says transposed in its own argument.
    conv = ["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "True", "[0, 0]", "1"]
    assert conv_cost("aten::convolution", [x, w, []], conv, 4)[0] == flops  # type: ignore[index]


def test_backward_counts_the_gradients_its_mask_asks_for() -> None:
    go, x, w = [64, 2048, 7, 7], [64, 512, 7, 7], [2048, 512, 1, 1]
    one = 2 * 64 * 49 * 2048 * 512
    both = ["", "", "", "[0]", "[1, 1]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1",
            "[True, True, False]"]  # fmt: skip
    weight_only = [*both[:-1], "[False, True, False]"]
    b = conv_cost("aten::convolution_backward", [go, x, w], both, 4)
    assert b is not None and b[0] == 2 * one
    assert b[1] == (64 * 2048 * 49 + 2048 * 512 + 64 * 512 * 49 + 64 * 512 * 49 + 2048 * 512) * 4
    b = conv_cost("aten::convolution_backward", [go, x, w], weight_only, 4)
    assert b is not None and b[0] == one
    # 2021-era cudnn_convolution_backward (input first, no Concrete Inputs): both gradients.
    b = conv_cost("aten::cudnn_convolution_backward", [x, go, w], None, 4)
    assert b is not None and b[0] == 2 * one
    # Shapes that do not fit together are no answer.
    assert conv_cost("aten::convolution_backward", [go, x, [1024, 512, 1, 1]], both, 4) is None


def test_what_is_not_recorded_gives_no_answer() -> None:
    dims = [[64, 3, 224, 224], [64, 3, 7, 7], []]
    assert conv_cost("aten::conv2d", dims, None, 4) is None  # no stride or padding
    assert conv_cost("aten::conv2d", dims, ["", "", "", "[2, 2, 2]", "[3]", "", "1"], 4) is None
    small = [[1, 3, 2, 2], [4, 3, 7, 7], []]  # a kernel larger than the input
    assert (
        conv_cost("aten::conv2d", small, ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "1"], 4) is None
    )
    assert conv_cost("aten::conv2d", [[64, 3, 224, 224]], CONV2D, 4) is None
    assert parse_concrete("['', '[2, 2]'") is None and parse_concrete("") is None
    assert (
        conv_args_text("aten::conv2d", CONV2D) == "stride [2, 2], padding [3, 3], dilation [1, 1]"
    )
    assert (
        allows_tf32("aten::cudnn_convolution", ["", "", "", "", "", "1", "", "", "False"]) is False
    )
    assert allows_tf32("aten::conv2d", CONV2D) is None


def test_only_convolution_ops_keep_their_concrete_inputs() -> None:
    table = perfcast.load(str(RECORDED / "r50_base.json.gz"))
    kept = np.flatnonzero(table.concrete >= 0)
    names = {table.names[int(n)] for n in table.name[kept]}
    assert names == {
        "aten::conv2d",
        "aten::convolution",
        "aten::_convolution",
        "aten::cudnn_convolution",
        "aten::convolution_backward",
    }
    assert (table.kind[kept] == Kind.CPU_OP).all()
    assert "concrete" in table.to_pandas().columns


def test_resnet50_training_flops_are_torchvisions() -> None:
    """torchvision's ResNet-50 card: 4.09 GMACs per 224x224 image. A training step is the
    forward and both gradients (3x), at 2 FLOPs per MAC, batch 64, less the stem's input
    gradient, which autograd does not compute (the image needs none)."""
    table = perfcast.load(str(RECORDED / "r50_base.json.gz"))
    tree = perfcast.tree(table)
    per_step = tree.incl["flops"][0] / len(table.iterations)
    stem_input_grad = 2 * 64 * 112 * 112 * (64 * 3 * 7 * 7)
    assert per_step == pytest.approx(3 * 2 * 4.09e9 * 64 - stem_input_grad, rel=0.005)
    # The same figure, op by op: one forward conv's FLOPs from its recorded stride.
    assert op_flops("aten::cudnn_convolution", "[[64, 3, 224, 224], [64, 3, 7, 7]]",
                    repr(["", "", "[3, 3]", "[2, 2]", "[1, 1]", "1", "True", "False", "True"])
                    ) == 2 * 64 * 112 * 112 * 9408  # fmt: skip


def test_roofline_rates_convolutions_on_the_h100() -> None:
    r = perfcast.roofline(str(RECORDED / "r50_base.json.gz"), top=1000)
    fwd = [o for o in r.ops if o.op == "aten::cudnn_convolution"]
    bwd = [o for o in r.ops if o.op == "aten::convolution_backward"]
    assert len(fwd) >= 20 and len(bwd) >= 20
    # Rated against TF32 (cuDNN's default for fp32 on Hopper), stride and padding shown.
    assert all(o.dtype == "tf32" for o in fwd + bwd)
    assert any("TF32 peak" in n for n in r.notes)
    stem = next(o for o in fwd if o.shapes.startswith("[[64, 3, 224, 224]"))
    assert "stride [2, 2], padding [3, 3]" in stem.shapes
    assert stem.gflops_per_call == pytest.approx(2 * 64 * 112 * 112 * 9408 / 1e9)
    # Same input shapes, different strides: separate rows.
    down = [o for o in fwd if o.shapes.startswith("[[64, 256, 56, 56], [512, 256, 1, 1]")]
    assert len({o.gflops_per_call for o in down}) == len(down)
    # Convolutions are most of ResNet-50's GPU time: the rows now cover most of it.
    assert r.covered_pct[0] > 70


def test_roofline_on_a_trace_without_stride_and_padding(shared_traces: Path) -> None:
    """PyTorch 1.9 recorded no Concrete Inputs: forward convolutions are left out, and said
    so; backward ones need none. V100 has no TF32: rated against fp32, and 3x3 Winograd
    kernels beat the direct convolution's count (said, not hidden)."""
    r = perfcast.roofline(shared_traces / "resnet50_v100_nw0_2021.json.gz", top=1000)
    ops = {o.op for o in r.ops}
    assert "aten::cudnn_convolution_backward" in ops and "aten::cudnn_convolution" not in ops
    assert any("aten::cudnn_convolution: left out" in n for n in r.notes)
    assert all(o.dtype == "fp32" for o in r.ops if "conv" in o.op)
    if any((o.pct_peak_flops or 0) > 100 for o in r.ops):
        assert any("Winograd" in n for n in r.notes)


def test_amd_convolutions_are_not_rated_as_tf32(shared_traces: Path) -> None:
    r = perfcast.roofline(shared_traces / "tracelens_mi300x_resnet_act_ckpt_rank0.json.gz")
    convs = [o for o in r.ops if o.op == "aten::miopen_convolution"]
    assert convs and all(o.dtype == "bf16" for o in convs)
    assert all("stride" in o.shapes for o in convs)
