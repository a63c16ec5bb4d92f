"""Calling-context tree: paths and times checked by hand on a small built trace, on a real
CPU trace recorded here with torch.profiler(with_stack=True), and its exports."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import perfcast
from perfcast.analysis.context import (
    EARLY_LAUNCH_LABEL,
    NO_LAUNCH_LABEL,
    STEP_GAP_LABEL,
    ContextTree,
    build_index,
    context_tree,
    inductor_fused_ops,
    is_library_frame,
    normalize_label,
    op_flops,
)
from perfcast.analysis.context_views import focus, hot_spots, project, tree_result, tree_rows
from perfcast.cli.main import main
from perfcast.errors import PerfcastError
from perfcast.report.speedscope import folded_lines, speedscope_document

try:
    from tests.tracegen import TraceBuilder
except ImportError:  # tests/ not a package: its folder is on sys.path
    from tracegen import TraceBuilder  # type: ignore[no-redef]

US = 1000  # ns per µs: the built trace is written in µs, the tree counts ns


# ---------------------------------------------------------------------------------------------
# A trace built by hand (times in µs)
#
# thread 100, two steps of 100 µs, the second a copy of the first shifted by 100:
#   ProfilerStep#N                                    [0, 100)
#     train.py(10): main                              [1, 90)
#       model.py(5): forward                          [2, 60)
#         nn.Module: Linear_0                         [3, 40)
#           <built-in method linear ... at 0x..N>     [4, 39)   (address differs per step)
#             aten::linear                            [5, 38)
#               aten::addmm                           [6, 30)
#                 cudaLaunchKernel [10, 15) -> gemm_kernel 50 µs
#         model.py(7): helper                         [41, 59)
#           model.py(7): helper  (recursion)          [42, 58)
#             aten::relu                              [43, 50)
#               cudaLaunchKernel [44, 46) -> relu_kernel 5 µs
#       aten::copy_                                   [61, 70)
#         cudaMemcpyAsync [62, 64) -> Memcpy HtoD 10 µs, 4096 bytes
# thread 200 (autograd), backward of step 1's addmm (fwdbwd flow):
#   autograd::engine::evaluate_function: AddmmBackward0  [75, 95)
#     AddmmBackward0                                  [76, 94)
#       aten::mm                                      [77, 93)
#         cudaLaunchKernel [78, 80) -> mm_bwd_kernel 20 µs
# and a kernel whose launch is not in the trace: orphan_kernel 7 µs.


def hand_trace(path: Path, stacks: bool = True) -> Path:
    b = TraceBuilder()

    def frame(name: str, ts: float, dur: float) -> None:
        if stacks:
            b.op(name, ts, dur, cat="python_function")

    for step, t0 in ((1, 0), (2, 100)):
        b.step(step, t0, 100)
        frame("train.py(10): main", t0 + 1, 89)
        frame("model.py(5): forward", t0 + 2, 58)
        frame("nn.Module: Linear_0", t0 + 3, 37)
        frame(f"<built-in method linear of PyCapsule object at 0x7f00{step}>", t0 + 4, 35)
        b.op("aten::linear", t0 + 5, 33, **{"Input Dims": [[8, 16], [32, 16], [32]]})
        b.op("aten::addmm", t0 + 6, 24, **{"Input Dims": [[32], [8, 16], [16, 32]]})
        b.launch("gemm_kernel", t0 + 10, 5, t0 + 20, 50)
        frame("model.py(7): helper", t0 + 41, 18)
        frame("model.py(7): helper", t0 + 42, 16)
        b.op("aten::relu", t0 + 43, 7)
        b.launch("relu_kernel", t0 + 44, 2, t0 + 80, 5)
        b.op("aten::copy_", t0 + 61, 9)
        b.launch(
            "Memcpy HtoD (Pageable -> Device)",
            t0 + 62,
            2,
            t0 + 71,
            10,
            cat="gpu_memcpy",
            name="cudaMemcpyAsync",
            stream=8,  # a copy stream: on stream 7 it would run ahead of the earlier relu
            bytes=4096,
        )
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 75, 20, tid=200)
    b.op("AddmmBackward0", 76, 18, tid=200)
    b.op("aten::mm", 77, 16, tid=200, **{"Input Dims": [[8, 32], [32, 16]]})
    b.launch("mm_bwd_kernel", 78, 2, 96, 20, tid=200)
    for ph, ts, tid in (("s", 6, 100), ("f", 76, 200)):
        b.events.append(
            {"ph": ph, "id": 7, "pid": 100, "tid": tid, "ts": ts, "cat": "fwdbwd", "name": "fwdbwd"}
        )
    b.events.append(  # launched by a call the trace does not hold
        {
            "ph": "X",
            "cat": "kernel",
            "name": "orphan_kernel",
            "pid": 0,
            "tid": 7,
            "ts": 150,
            "dur": 7,
            "args": {"correlation": 99999, "stream": 7, "device": 0},
        }
    )
    return b.write(path)


@pytest.fixture
def hand(tmp_path: Path) -> ContextTree:
    return context_tree(perfcast.load(hand_trace(tmp_path / "hand.json")))


def node_at(tree: ContextTree, *names: str) -> int:
    """The node reached from the root through children with these names."""
    index = tree.index
    node = 0
    for name in names:
        kids = np.flatnonzero(index.parent == node)
        hit = [int(k) for k in kids if index.name(int(k)) == name]
        assert hit, f"no child {name!r} under {index.name(node)!r}: " + ", ".join(
            index.name(int(k)) for k in kids
        )
        node = hit[0]
    return node


GEMM_PATH = (
    "train.py(10): main",
    "model.py(5): forward",
    "nn.Module: Linear_0",
    "<built-in method linear of PyCapsule object>",
    "aten::linear",
    "aten::addmm",
)


def test_paths_and_times_by_hand(hand: ContextTree) -> None:
    t = hand
    addmm = node_at(t, *GEMM_PATH)
    kernel = node_at(t, *GEMM_PATH, "cudaLaunchKernel", "gemm_kernel")
    # Both steps (and both addresses of the built-in) merge into one path.
    assert t.excl["gpu_ns"][kernel] == 2 * 50 * US
    assert t.excl["calls"][kernel] == 2
    assert t.excl["kernels"][kernel] == 2
    # The backward kernel hangs under the forward op it differentiates.
    bwd = node_at(
        t,
        *GEMM_PATH,
        "autograd::engine::evaluate_function: AddmmBackward0",
        "AddmmBackward0",
        "aten::mm",
        "cudaLaunchKernel",
        "mm_bwd_kernel",
    )
    assert t.excl["gpu_ns"][bwd] == 20 * US
    assert t.incl["gpu_ns"][addmm] == (2 * 50 + 20) * US
    # CPU self times: addmm 24 - 5 (its launch) per step; linear 33 - 24; the module 37 - 35.
    assert t.excl["cpu_ns"][addmm] == 2 * 19 * US
    assert t.excl["cpu_ns"][node_at(t, *GEMM_PATH[:5])] == 2 * 9 * US
    assert t.excl["cpu_ns"][node_at(t, *GEMM_PATH[:3])] == 2 * 2 * US
    assert t.excl["cpu_ns"][node_at(t, *GEMM_PATH[:2])] == 2 * (58 - 37 - 18) * US
    # Inclusive CPU of the addmm: its own events (24 µs each) and its backward (20 µs).
    assert t.incl["cpu_ns"][addmm] == (2 * 24 + 20) * US
    # Launch counts: one per step below the module, and the backward's.
    assert t.incl["launches"][node_at(t, *GEMM_PATH[:3])] == 2 + 1
    # Recursion keeps one node per level of the recursive call.
    relu = node_at(t, *GEMM_PATH[:2], "model.py(7): helper", "model.py(7): helper", "aten::relu")
    assert t.incl["gpu_ns"][relu] == 2 * 5 * US
    # Copies: time, count and bytes.
    copy = node_at(t, "train.py(10): main", "aten::copy_")
    assert t.incl["gpu_ns"][copy] == 2 * 10 * US
    assert t.incl["copies"][copy] == 2 and t.incl["bytes"][copy] == 2 * 4096
    # FLOPs once per matrix product: at addmm (not linear around it), and the backward mm.
    assert t.excl["flops"][node_at(t, *GEMM_PATH[:5])] == 0
    assert t.incl["flops"][addmm] == 2 * (2 * 8 * 16 * 32) + 2 * 8 * 32 * 16
    # The root: every kernel and copy (2 x 65 + 20 + 7 µs), every CPU µs of both threads.
    assert t.incl["gpu_ns"][0] == t.coverage.gpu_ns == 157 * US
    assert t.incl["cpu_ns"][0] == (2 * 100 + 20) * US
    # ProfilerStep's own time (no path of its own) under a node that says what it is.
    assert t.excl["cpu_ns"][0] == 0
    assert t.excl["cpu_ns"][node_at(t, STEP_GAP_LABEL)] == 2 * 11 * US


def test_coverage_and_work_without_a_launch(hand: ContextTree) -> None:
    cov = hand.coverage
    assert cov.no_launch_ns == 7 * US
    assert cov.with_frame_ns == 150 * US
    assert cov.unattributed_pct == pytest.approx(100 * 7 / 157)
    assert cov.unattributed_launched_pct == 0.0
    node = node_at(hand, NO_LAUNCH_LABEL, "orphan_kernel")
    assert hand.incl["gpu_ns"][node] == 7 * US
    assert hand.level == "python"
    assert any("1 backward ops" in n for n in hand.notes)


def test_selection_by_phase_step_and_rank(tmp_path: Path) -> None:
    table = perfcast.load(hand_trace(tmp_path / "hand.json"))
    index = build_index(table)
    bwd = context_tree(index, phase="backward")
    assert bwd.coverage.gpu_ns == 20 * US
    fwd = context_tree(index, phase="forward")
    assert fwd.coverage.gpu_ns + bwd.coverage.gpu_ns == 157 * US
    step2 = context_tree(index, step=2)
    assert step2.selection["step"] == "ProfilerStep#2"
    assert step2.incl["gpu_ns"][0] == (65 + 7) * US  # the orphan ran during step 2
    assert context_tree(index, rank=0).incl["gpu_ns"][0] == 157 * US
    for bad in ({"rank": 3}, {"phase": "sideways"}, {"step": 9}):
        with pytest.raises(PerfcastError):
            context_tree(index, **bad)  # type: ignore[arg-type]


def test_autograd_thread_work_goes_under_the_backward_call(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.op("train.py(20): train_step", 0, 100, cat="python_function")
    b.op("torch/autograd/graph.py(824): _engine_run_backward", 10, 80, cat="python_function")
    acc = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
    b.op(acc, 20, 10, tid=200)
    b.launch("acc_kernel", 21, 2, 30, 3, tid=200)
    b.op("aten::copy_", 40, 10, tid=300)  # another thread that is not autograd's
    t = context_tree(perfcast.load(b.write(tmp_path / "bwd.json")))
    frames = ("train.py(20): train_step", "torch/autograd/graph.py(824): _engine_run_backward")
    kernel = node_at(t, *frames, acc, "cudaLaunchKernel", "acc_kernel")
    assert t.incl["gpu_ns"][kernel] == 3 * US
    assert t.index.handed_to_caller == 1
    assert t.incl["cpu_ns"][node_at(t, "aten::copy_")] == 10 * US


def test_fallback_levels_without_stacks(tmp_path: Path) -> None:
    table = perfcast.load(hand_trace(tmp_path / "ops.json", stacks=False))
    t = context_tree(table)
    assert t.level == "op"
    assert any("op nesting only" in n for n in t.notes)
    assert t.incl["gpu_ns"][0] == 157 * US
    assert t.coverage.with_frame_ns == 0
    node_at(t, "aten::linear", "aten::addmm", "cudaLaunchKernel", "gemm_kernel")
    b = TraceBuilder()
    b.op("## forward ##", 0, 50, cat="user_annotation")
    b.op("aten::mm", 1, 10)
    assert context_tree(perfcast.load(b.write(tmp_path / "ann.json"))).level == "module"


def test_early_launch_and_empty_trace(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.op("aten::mm", 0, 10)
    b.launch("k", 1, 2, 5, 3)
    b.events.append(
        {
            "ph": "X",
            "cat": "kernel",
            "name": "late",
            "pid": 0,
            "tid": 7,
            "ts": 0,
            "dur": 4,
            "args": {"correlation": 5, "stream": 7, "device": 0},  # before the first launch
        }
    )
    t = context_tree(perfcast.load(b.write(tmp_path / "early.json")))
    assert t.incl["gpu_ns"][node_at(t, EARLY_LAUNCH_LABEL)] == 4 * US
    assert t.coverage.early_ns == 4 * US
    empty = context_tree(perfcast.load(TraceBuilder().write(tmp_path / "empty.json")))
    assert len(empty.index) == 1 and empty.coverage.gpu_ns == 0


def test_views_project_focus_rows_and_hot_spots(hand: ContextTree) -> None:
    lib = np.zeros(len(hand.index), dtype=bool)
    lib[node_at(hand, *GEMM_PATH[:4])] = True  # elide the built-in frame
    p = project(hand, ~lib)
    assert p.incl["gpu_ns"][node_at(p, *GEMM_PATH[:3], "aten::linear")] == 120 * US
    assert p.incl["gpu_ns"][0] == hand.incl["gpu_ns"][0]
    f = focus(hand, r"helper")
    assert f.incl["gpu_ns"][0] == 10 * US  # relu's kernels only, the nested helper once
    rows = tree_rows(hand, "gpu_ns", min_pct=10.0)
    assert rows[0].name == "all" and rows[0].incl["gpu_ns"] == 157 * US
    assert all(r.incl["gpu_ns"] >= 15.7 * US for r in rows)
    assert sum(r.hidden for r in rows) > 0
    spots = hot_spots(hand, "gpu_ns", top=2)
    kernels = [s for s in spots if s.kind == "kernel"]
    assert kernels[0].name == "gemm_kernel" and kernels[0].value == 100 * US
    assert "Linear_0" in kernels[0].paths[0].path and "aten::linear" in kernels[0].paths[0].path
    ops = [s for s in spots if s.kind == "op"]
    assert ops[0].name == "aten::linear" and ops[0].value == 120 * US and ops[0].calls == 2
    res = tree_result(hand, focus_re="gemm")
    assert res.rows[0].incl["gpu_ns"] == 100 * US
    # The CPU column is the profiled run's; the result says so (whatif takes the cost out).
    assert any("CPU ms are as traced" in n for n in res.notes)


def test_labels_flops_and_library_frames() -> None:
    assert normalize_label("<built-in method add of Tensor object at 0x7fab12>") == (
        "<built-in method add of Tensor object>"
    )
    assert op_flops("aten::mm", "[[4, 5], [5, 6]]") == 2 * 4 * 5 * 6
    assert op_flops("aten::addmm", "[[6], [4, 5], [5, 6]]") == 2 * 4 * 5 * 6
    assert op_flops("aten::bmm", "[[3, 4, 5], [3, 5, 6]]") == 2 * 3 * 4 * 5 * 6
    assert op_flops("aten::linear", "[[2, 3, 5], [7, 5], [7]]") == 2 * 6 * 5 * 7
    assert op_flops("aten::matmul", "[[2, 4, 5], [5, 6]]") == 2 * 2 * 4 * 5 * 6
    sdpa = "[[2, 3, 10, 8], [2, 3, 12, 8], [2, 3, 12, 8]]"
    assert op_flops("aten::_scaled_dot_product_flash_attention", sdpa) == 2 * 6 * 10 * 12 * 16
    # flash-attn's own op takes (batch, seq, heads, dim): BERT's q = [1, 141, 8, 64]
    flash = "[[1, 141, 8, 64], [1, 141, 8, 64], [1, 141, 8, 64]]"
    assert op_flops("aten::_flash_attention_forward", flash) == 4 * 1 * 8 * 141 * 141 * 64
    cpu = "aten::_scaled_dot_product_flash_attention_for_cpu"  # the CPU kernel's own op
    assert op_flops(cpu, sdpa) == 2 * 6 * 10 * 12 * 16
    # Backward takes the output's gradient first; five matmuls to forward's two: 2.5x.
    grad = "[[1, 141, 8, 64], " + flash[1:]
    assert op_flops("aten::_flash_attention_backward", grad) == 2.5 * 4 * 8 * 141 * 141 * 64
    sdpa_grad = "[[2, 3, 10, 8], " + sdpa[1:]
    assert op_flops("aten::_scaled_dot_product_flash_attention_backward", sdpa_grad) == (
        2.5 * 2 * 6 * 10 * 12 * 16
    )
    assert op_flops("aten::mm", "[[4, 5], [6, 7]]") == 0  # inner sizes disagree
    assert op_flops("aten::relu", "[[4, 5]]") == 0
    assert is_library_frame("torch/nn/modules/module.py(1743): _call_impl")
    assert is_library_frame("<built-in method relu of type object>")
    assert not is_library_frame("transformers/models/bert/modeling_bert.py(300): forward")
    # perfcast's own capture: its console script, CLI and step hooks
    assert is_library_frame("perfcast(6): <module>")
    assert is_library_frame("/work/main/perfcast/cli/main.py(286): entry")
    assert is_library_frame("/x/site-packages/perfcast/capture/profiler.py(331): _optimizer_hook")
    assert not is_library_frame("train.py(9): <module>")
    assert not is_library_frame("myperfcast/cli/run.py(3): main")
    assert inductor_fused_ops("triton_red_fused_add_mean_mul_pow_rsqrt_0") == [
        "add", "mean", "mul", "pow", "rsqrt"
    ]  # fmt: skip
    assert inductor_fused_ops("triton_poi_fused__unsafe_view_mul_silu_2") == [
        "_unsafe_view", "mul", "silu"
    ]  # fmt: skip
    assert inductor_fused_ops("triton_per_fused_native_layer_norm_3") == ["native_layer_norm"]
    assert inductor_fused_ops("ampere_sgemm_128x64_nn") is None


# ---------------------------------------------------------------------------------------------
# speedscope and folded stacks


UNITS = ("none", "nanoseconds", "microseconds", "milliseconds", "seconds", "bytes")


def check_speedscope(doc: dict[str, Any]) -> None:
    """The file against speedscope's published format (the fields and types its schema,
    https://www.speedscope.app/file-format-schema.json, requires), and what its importer
    relies on: frame indices in range, balanced open/close events in non-decreasing time."""
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    assert set(doc) <= {"$schema", "shared", "profiles", "name", "activeProfileIndex", "exporter"}
    frames = doc["shared"]["frames"]
    assert isinstance(frames, list)
    for f in frames:
        assert isinstance(f["name"], str)
        assert set(f) <= {"name", "file", "line", "col"}
        assert isinstance(f.get("file", ""), str)
        assert isinstance(f.get("line", 0), (int, float))
    assert isinstance(doc.get("name", ""), str) and isinstance(doc.get("exporter", ""), str)
    assert isinstance(doc.get("activeProfileIndex", 0), int)
    assert doc["profiles"]
    for p in doc["profiles"]:
        assert p["type"] in ("evented", "sampled")
        assert p["unit"] in UNITS
        assert isinstance(p["name"], str)
        assert isinstance(p["startValue"], (int, float)) and isinstance(p["endValue"], (int, float))
        assert p["endValue"] >= p["startValue"]
        if p["type"] == "sampled":
            assert len(p["samples"]) == len(p["weights"])
            continue
        stack: list[int] = []
        last = p["startValue"]
        for e in p["events"]:
            assert set(e) == {"type", "frame", "at"}
            assert e["type"] in ("O", "C")
            assert isinstance(e["frame"], int) and 0 <= e["frame"] < len(frames)
            assert e["at"] >= last
            last = e["at"]
            if e["type"] == "O":
                stack.append(e["frame"])
            else:
                assert stack.pop() == e["frame"]
        assert not stack
        assert last <= p["endValue"]


def test_speedscope_and_folded_exports(hand: ContextTree) -> None:
    doc = speedscope_document(hand, name="hand")
    check_speedscope(json.loads(json.dumps(doc)))
    names = [f["name"] for f in doc["shared"]["frames"]]
    assert "gemm_kernel" in names
    line = next(f for f in doc["shared"]["frames"] if f["name"] == "model.py(5): forward")
    assert line["file"] == "model.py" and line["line"] == 5
    gpu, cpu = doc["profiles"]
    assert gpu["endValue"] == 157 * US and cpu["endValue"] == 220 * US
    # The top-level frames close at the end: their spans add up to the total.
    lines = folded_lines(hand, "gpu_ns")
    assert sum(int(x.rsplit(" ", 1)[1]) for x in lines) == 157 * US
    gemm = ";".join(GEMM_PATH) + ";cudaLaunchKernel;gemm_kernel " + str(100 * US)
    assert gemm in lines
    assert all(";" not in x.rsplit(" ", 1)[0].split(";")[0] for x in lines)


# ---------------------------------------------------------------------------------------------
# The command


def test_tree_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # wide enough for whole names
    trace = hand_trace(tmp_path / "hand.json")
    assert main(["tree", str(trace), "--all-frames", "--min-pct", "0"]) == 0
    out = capsys.readouterr().out
    assert "model.py(5): forward" in out and "gemm_kernel" in out
    assert main(["tree", str(trace), "--json", "--bottom-up", "--depth", "3"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["level"] == "python" and doc["rows"][0]["incl"]["gpu_ns"] == 157 * US
    assert max(r["depth"] for r in doc["rows"]) <= 3
    assert doc["coverage"]["no_launch_ns"] == 7 * US
    assert doc["bottom_up"][0]["name"] == "gemm_kernel"
    ss, fo = tmp_path / "t.speedscope.json", tmp_path / "t.folded"
    assert main(["tree", str(trace), "-q", "--speedscope", str(ss), "--folded", str(fo)]) == 0
    check_speedscope(json.loads(ss.read_text()))
    assert fo.read_text().strip()
    capsys.readouterr()
    for argv, needle in (
        (["--focus", "("], "bad regular expression"),
        (["--rank", "5"], f"no rank 5 in {trace}"),  # which trace: the option is at fault
        (["--step", "77"], f"no step '77' in {trace}"),
        (["--phase", "up"], "unknown phase"),
        (["--depth", "-1"], "--depth"),
        (["--folded", str(tmp_path / "nope" / "x.txt")], "output folder does not exist"),
    ):
        assert main(["tree", str(trace), *argv]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert main(["tree", str(tmp_path / "missing.json")]) == 2


def test_whatif_tree_puts_the_gain_where_the_work_was(capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(perfcast.__file__).parent / "examples" / "ddp_a100_rank0.json.gz"
    spec = "faster-op:pattern=batch_norm,factor=2,where=cpu"  # only batch norm's host work
    assert main(["whatif", str(example), "--apply", spec, "--tree", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    gain = doc["baseline_ms"] - doc["predicted_ms"]
    tree = doc["tree"]
    assert gain > 1.0
    # The critical-path shares add up to the predicted step time saved (3 steps summed).
    assert tree["step_saved_ms"] == pytest.approx(gain, rel=1e-9)
    assert tree["rows"][0]["incl"]["path_saved_ns"] / 3 / 1e6 == pytest.approx(gain, abs=1e-6)
    # ... and all of the gain comes from the op the what-if changed.
    assert [s["op"] for s in tree["sites"]] == ["aten::batch_norm"]
    assert tree["sites"][0]["share"] == pytest.approx(1.0)
    assert tree["sites"][0]["gain_ms"] == pytest.approx(gain, rel=1e-9)
    assert main(["whatif", str(example), "--apply", "cuda-graphs", "--tree"]) == 0
    assert "where the gain lands" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# A real CPU trace, recorded here with torch.profiler(with_stack=True, with_modules=True)

MODEL = textwrap.dedent(
    """\
    import sys
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule


    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(64, 64)

        def forward(self, x):
            return torch.relu(self.fc(x))


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = Block()
            self.b = Block()

        def forward(self, x):
            return self.b(self.a(x)).sum()


    def train_step(model, opt, x):
        loss = model(x)
        loss.backward()
        opt.step()
        opt.zero_grad()


    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 64)
    with profile(
        activities=[ProfilerActivity.CPU],
        with_stack=True,
        with_modules=True,
        record_shapes=True,
        schedule=schedule(wait=0, warmup=1, active=2),
        on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1]),
    ) as prof:
        for _ in range(3):
            train_step(model, opt, x)
            prof.step()
    """
)


def _def_line(text: str, nth: int = 0) -> int:
    """1-based line of the nth `def` line that starts with `text` (the profiler names a
    frame after its function's first line)."""
    lines = [i + 1 for i, ln in enumerate(MODEL.splitlines()) if ln.strip().startswith(text)]
    return lines[nth]


BLOCK_FORWARD_LINE = _def_line("def forward")  # Block.forward, the first one
STEP_LINE = _def_line("def train_step")


@pytest.fixture(scope="session")
def torch_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CPU trace with Python stacks, recorded with the installed torch (skip without)."""
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("torch_trace")
    script = folder / "cct_model.py"
    script.write_text(MODEL)
    out = folder / "trace.json"
    proc = subprocess.run(
        [sys.executable, str(script), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=folder,
    )
    if proc.returncode != 0 or not out.is_file():
        pytest.skip(f"torch.profiler could not record a trace here: {proc.stderr[-500:]}")
    return out


def _nested_self_us(events: list[dict[str, Any]]) -> dict[int, float]:
    """Self time of each complete event (index -> ns): its duration less that of the events
    directly inside it on its thread. A plain O(n^2) reference, independent of perfcast."""
    xs = [
        (i, e)
        for i, e in enumerate(events)
        if e.get("ph") == "X" and e.get("cat") in ("python_function", "cpu_op", "user_annotation")
    ]
    out = {}
    for i, e in xs:
        lo, hi = e["ts"], e["ts"] + e["dur"]
        inside = [
            (j, f)
            for j, f in xs
            if j != i
            and f["tid"] == e["tid"]
            and lo <= f["ts"]
            and f["ts"] + f["dur"] <= hi
            and (f["dur"] < e["dur"] or (f["dur"] == e["dur"] and j > i))
        ]
        direct = [
            f
            for j, f in inside
            if not any(
                k != j
                and g["ts"] <= f["ts"]
                and f["ts"] + f["dur"] <= g["ts"] + g["dur"]
                and (g["dur"] > f["dur"] or (g["dur"] == f["dur"] and k < j))
                for k, g in inside
            )
        ]
        out[i] = e["dur"] - sum(f["dur"] for f in direct)
    return out


def test_real_cpu_trace_with_stacks(torch_trace: Path) -> None:
    trace_doc = json.loads(torch_trace.read_text())
    events = trace_doc["traceEvents"]
    # Whole nanoseconds, as the trace's µs decimals mean them (a float sum of µs can put a
    # child's end a nanosecond past its parent's).
    for e in events:
        if e.get("ph") == "X":
            e["ts"], e["dur"] = round(e["ts"] * 1000), round(e["dur"] * 1000)
    table = perfcast.load(torch_trace)
    t = context_tree(table)
    assert t.level == "python"
    index = t.index
    fwd = f"cct_model.py({BLOCK_FORWARD_LINE}): forward"
    mods = [
        int(n)
        for n in np.flatnonzero(index.kind == 3)  # CtxKind.MODULE
        if index.name(int(n)) == "nn.Module: Linear_0"
    ]
    assert len(mods) == 1
    linear_mod = mods[0]
    path = [index.name(p) for p in index.path(linear_mod)]
    assert path[-2].endswith(fwd), path  # the line in Block.forward that calls self.fc
    assert any(p.endswith(f"cct_model.py({STEP_LINE}): train_step") for p in path), path
    assert "nn.Module: Block_0" in path and "nn.Module: Net_0" in path
    # By hand from the JSON: the module's events (one per profiled step), their self time.
    selfs = _nested_self_us(events)
    mine = [i for i, e in enumerate(events) if e.get("name") == "nn.Module: Linear_0"]
    assert len(mine) == 2
    assert t.excl["calls"][linear_mod] == 2
    expect = sum(selfs[i] for i in mine)
    assert t.excl["cpu_ns"][linear_mod] == expect
    # aten::linear below it: its events, and their backward (attached by the fwdbwd flows).
    lin = [
        int(k)
        for k in range(len(index))
        if index.name(int(k)) == "aten::linear" and linear_mod in index.path(int(k))
    ]
    assert len(lin) == 1
    assert t.excl["calls"][lin[0]] == 2
    below = [index.name(int(k)) for k in np.flatnonzero(index.parent == int(lin[0]))]
    assert "aten::addmm" in below or "aten::matmul" in below
    assert t.coverage.backward_attached > 0
    # The root's CPU time is every CPU µs the profiled thread spent inside its outermost
    # events (ProfilerStep ranges included).
    top = [
        e
        for i, e in enumerate(events)
        if i in selfs
        and not any(
            j != i
            and f["tid"] == e["tid"]
            and f["ts"] <= e["ts"]
            and e["ts"] + e["dur"] <= f["ts"] + f["dur"]
            and (f["dur"] > e["dur"] or (f["dur"] == e["dur"] and j < i))
            for j, f in enumerate(events)
            if j in selfs
        )
    ]
    # Ranges the profiler's stop held open end where the rest of the trace ends (the loader
    # cuts them there, with a note): each as long as the loaded table has it.
    # Looked up by name and start within 2 ns (the loader converts whole and fractional µs
    # apart, so its nanosecond can differ by one from `round(ts * 1000)` above); the loaded
    # table's times plus base_ns are the JSON's plus baseTimeNanoseconds.
    base = table.rank_info(0).base_ns - int(trace_doc.get("baseTimeNanoseconds", 0))
    loaded: dict[str, list[tuple[int, int]]] = {}
    for r in range(len(table)):
        loaded.setdefault(table.name_of(r), []).append((int(table.ts[r]) + base, int(table.dur[r])))

    def loaded_dur(e: dict[str, Any]) -> int:
        near = [d for ts, d in loaded.get(e["name"], []) if abs(ts - e["ts"]) <= 2]
        assert len(near) == 1, (e["name"], e["ts"], near)
        return near[0]

    durs = [loaded_dur(e) for e in top]
    assert all(d <= e["dur"] + 2 for d, e in zip(durs, top))
    assert t.incl["cpu_ns"][0] == sum(durs)
    doc = speedscope_document(t)
    check_speedscope(doc)
    assert any(f.get("file", "").endswith("cct_model.py") for f in doc["shared"]["frames"])


# ---------------------------------------------------------------------------------------------
# The flame graph in the HTML report, in headless Chromium


def test_flame_graph_renders_and_finds_a_frame(torch_trace: Path, tmp_path: Path) -> None:
    try:
        from tests.browser import find_chromium, load_page, parse_dom
    except ImportError:
        from browser import find_chromium, load_page, parse_dom  # type: ignore[no-redef]
    if find_chromium() is None:
        pytest.skip("headless Chromium not installed (apt-get install -y chromium)")
    out = tmp_path / "report.html"
    assert main(["report", "-q", str(torch_trace), "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    frame = f"cct_model.py({BLOCK_FORWARD_LINE}): forward"
    # What a user does: type part of a frame's name into the search box.
    driver = (
        "<script>window.addEventListener('load',function(){"
        "var s=document.getElementById('flame-search');"
        "s.value='cct_model.py(" + str(BLOCK_FORWARD_LINE) + ")';"
        "s.dispatchEvent(new Event('input'));});</script>"
    )
    cut = text.rfind("</body>")
    page_file = tmp_path / "driven.html"
    page_file.write_text(text[:cut] + driver + text[cut:], encoding="utf-8")
    page = load_page(page_file)
    assert page.console_lines() == [], page.console_lines()
    root = parse_dom(page.dom)
    errors = root.by_id("perfcast-errors")
    assert errors is not None and errors.text_content().strip() == ""
    section = root.by_id("context")
    assert section is not None and "failed to render" not in section.text_content()
    canvas = root.by_id("flame-canvas")
    assert canvas is not None and int(canvas.attrs["data-boxes"]) > 10
    hits = root.by_id("flame-matches")
    assert hits is not None
    names = [li.find_all("span")[0].text_content() for li in hits.find_all("li")]
    assert frame in names, names
    summary = root.by_id("flame-match-summary")
    assert summary is not None and "matching paths" in summary.text_content()


# ---------------------------------------------------------------------------------------------
# Critical paths over a step's whole window, which the gain attribution relies on


def test_critical_paths_from_completion_add_up_to_step_times() -> None:
    from perfcast.analysis.critical_path import critical_paths
    from perfcast.whatif.registry import parse_spec
    from perfcast.whatif.runner import run_whatif

    example = Path(perfcast.__file__).parent / "examples" / "ddp_a100_rank0.json.gz"
    table = perfcast.load(example)
    _, base, pred = run_whatif(table, [parse_spec("cuda-graphs")])
    for tl in (base, pred):
        steps = {(r, n): s for r, n, _, s in tl.iteration_ns()}
        for cp in critical_paths(tl, keep_steps=False):
            assert cp.total_ms * 1e6 == pytest.approx(steps[(cp.rank, cp.iteration)], abs=1)


def test_an_empty_selection_says_so() -> None:
    """A phase the trace does not hold (no CUDA graph replays in the example) drew an empty
    tree with no word on why."""
    example = Path(perfcast.__file__).parent / "examples" / "ddp_a100_rank0.json.gz"
    notes = perfcast.tree(example, phase="graph").notes
    assert any("no events in the selection (phase CUDA graph replay)" in n for n in notes), notes
    assert not any("no events in the selection" in n for n in perfcast.tree(example).notes)


def test_exports_keep_the_roots_own_time(hand: ContextTree) -> None:
    """With a top-level frame hidden (library frames are, by default), its own time lands
    on the root: folded stacks and speedscope still add up to the root's total."""
    lib = np.zeros(len(hand.index), dtype=bool)
    lib[hand.index.parent == 0] = True  # every top-level frame hidden
    p = project(hand, ~lib)
    for metric in ("gpu_ns", "cpu_ns"):
        total = int(p.incl[metric][0])
        lines = folded_lines(p, metric)
        assert sum(int(x.rsplit(" ", 1)[1]) for x in lines) == total
    assert any(int(p.excl[m][0]) > 0 for m in ("gpu_ns", "cpu_ns"))
    doc = speedscope_document(p)
    check_speedscope(json.loads(json.dumps(doc)))
    for prof in doc["profiles"]:
        depth, covered, opened = 0, 0, 0
        for e in prof["events"]:
            if e["type"] == "O":
                if depth == 0:
                    opened = e["at"]
                depth += 1
            else:
                depth -= 1
                if depth == 0:
                    covered += e["at"] - opened
        assert covered == prof["endValue"]


def _layers_trace(path: Path, layers: int) -> Path:
    """One step: a Net_0 scope holding `layers` Block_i scopes, each holding a Linear_j and a
    GELU_j, each op launching one kernel (its duration tells the layers apart)."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.op("nn.Module: Net_0", 1, 900, cat="python_function")
    t = 2.0
    for i in range(layers):
        b.op(f"nn.Module: Block_{i}", t, 60, cat="python_function")
        b.op(f"nn.Module: Linear_{i}", t + 1, 25, cat="python_function")
        b.op("aten::addmm", t + 2, 20)
        b.launch("gemm_kernel", t + 3, 2, t + 5, 10 + i)
        b.op(f"nn.Module: GELU_{i}", t + 30, 25, cat="python_function")
        b.op("aten::gelu", t + 31, 20)
        b.launch("gelu_kernel", t + 32, 2, t + 40, 1)
        t += 70
    return b.write(path)


def test_repeated_module_instances_fold_by_class(tmp_path: Path) -> None:
    """36 decoder layers were 36 subtrees (`tree` printed 781 lines on the SGLang trace); three
    or more instances of a class under one parent now fold into one node, times added."""
    from perfcast.analysis.context_views import fold_repeated, tree_result

    tree = context_tree(perfcast.load(_layers_trace(tmp_path / "layers.json", 4)))
    folded, n = fold_repeated(tree)
    assert n == 12  # 4 blocks, then their 4 Linears and 4 GELUs
    block = node_at(folded, "nn.Module: Net_0", "nn.Module: Block ×4")
    linear = node_at(folded, "nn.Module: Net_0", "nn.Module: Block ×4", "nn.Module: Linear ×4")
    assert folded.incl["gpu_ns"][block] == tree.incl["gpu_ns"][0] == 4 * 1000 + 46_000
    assert folded.incl["gpu_ns"][linear] == (10 + 11 + 12 + 13) * 1000
    assert folded.incl["kernels"][linear] == 4
    # Two instances stay apart, and the view can keep every instance.
    two = context_tree(perfcast.load(_layers_trace(tmp_path / "two.json", 2)))
    assert fold_repeated(two)[1] == 0
    result = tree_result(tree, fold=False)
    assert result.instances_folded == 0
    assert any(r.name == "nn.Module: Block_3" for r in result.rows)
    shown = tree_result(tree)
    assert shown.instances_folded == 12
    assert any(r.name == "nn.Module: Block ×4" for r in shown.rows)


def test_nested_instances_fold_once_their_parents_merged(tmp_path: Path) -> None:
    """Blocks of 3, 3, 3 and 4 Linears folded both levels in one pass: under 'Block ×4' a
    'Linear ×3' held 9 instances beside a separate 'Linear ×4'. Now one 'Linear ×13'."""
    from perfcast.analysis.context_views import fold_repeated

    b = TraceBuilder()
    b.step(1, 0, 5000)
    b.op("nn.Module: Net_0", 1, 4900, cat="python_function")
    t, k = 2.0, 0
    for i, n in enumerate((3, 3, 3, 4)):
        b.op(f"nn.Module: Block_{i}", t, 40 * n + 5, cat="python_function")
        for _ in range(n):
            b.op(f"nn.Module: Linear_{k}", t + 1, 30, cat="python_function")
            b.op("aten::addmm", t + 2, 20)
            b.launch("gemm_kernel", t + 3, 2, t + 5, 10)
            t, k = t + 40, k + 1
        t += 10
    tree = context_tree(perfcast.load(b.write(tmp_path / "nested.json")))
    folded, n = fold_repeated(tree)
    assert n == 4 + 13
    linear = node_at(folded, "nn.Module: Net_0", "nn.Module: Block ×4", "nn.Module: Linear ×13")
    assert folded.incl["kernels"][linear] == 13
    assert folded.incl["gpu_ns"][0] == tree.incl["gpu_ns"][0]


# ---------------------------------------------------------------------------------------------
# 2021-era traces (PyTorch 1.8-1.10): stacks as op arguments, no fwdbwd flows


def _trace_2021(path: Path) -> Path:
    """A BatchNorm forward and its backward as PyTorch 1.9 wrote them: `Operator` events with
    "Call stack" (innermost first, absolute paths) and "Fwd thread id" 0 on forward ops, 1 on
    the backward node; `aten::add_` (num_batches_tracked) shares the node's sequence number."""
    site = "/home/u/env/lib/python3.7/site-packages"
    fwd_stack = (
        f"{site}/torch/nn/functional.py(2263): batch_norm;"
        f"{site}/torch/nn/modules/batchnorm.py(178): forward;"
        "train.py(40): <module>"
    )
    b = TraceBuilder()
    b.op("ProfilerStep#1", 0, 200, cat="Operator", **{"Call stack": "train.py(38): <module>"})
    b.op(
        "Optimizer.step#SGD.step",
        150,
        40,
        cat="Operator",
        **{"Call stack": f"{site}/torch/optim/optimizer.py(88): wrapper;train.py(44): <module>"},
    )
    b.op(
        "aten::add_",
        152,
        5,
        cat="Operator",
        **{
            "Call stack": f"{site}/torch/optim/sgd.py(110): step;"
            f"{site}/torch/optim/optimizer.py(89): wrapper;train.py(44): <module>"
        },
    )
    common = {"Sequence number": 11, "Fwd thread id": 0}
    b.op("aten::add_", 2, 5, cat="Operator", **common, **{"Call stack": fwd_stack})
    b.op("aten::batch_norm", 10, 40, cat="Operator", **common, **{"Call stack": fwd_stack})
    b.op("aten::cudnn_batch_norm", 12, 36, cat="Operator", **common, **{"Call stack": fwd_stack})
    b.launch("bn_fwd_kernel", 14, 4, 20, 10)
    b.op(
        "autograd::engine::evaluate_function: CudnnBatchNormBackward",
        100,
        30,
        tid=200,
        cat="Operator",
        **{"Sequence number": 11, "Fwd thread id": 1},
    )
    b.op("CudnnBatchNormBackward", 101, 28, tid=200, cat="Operator", **{
        "Sequence number": 11, "Fwd thread id": 1})  # fmt: skip
    b.launch("bn_bwd_kernel", 102, 3, 110, 12, tid=200)
    return b.write(path)


def test_2021_backward_ops_link_to_the_forward_op_that_made_their_node(tmp_path: Path) -> None:
    table = perfcast.load(_trace_2021(tmp_path / "t2021.json"))
    assert table.fwd_bwd.shape == (1, 2)
    f, b = table.fwd_bwd[0].tolist()
    # Kineto's flows run from the latest forward op with the number (not the add_ before the
    # batch norm) to the node (not the engine's evaluate_function wrapper).
    assert table.name_of(f) == "aten::cudnn_batch_norm"
    assert table.name_of(b) == "CudnnBatchNormBackward"
    t = context_tree(table)
    assert t.index.backward_attached == 1


def test_2021_call_stacks_become_frames(tmp_path: Path) -> None:
    t = context_tree(perfcast.load(_trace_2021(tmp_path / "t2021.json")))
    assert t.level == "python"
    # Absolute install paths are cut as later PyTorch versions write them.
    fwd = (
        "train.py(40): <module>",
        "torch/nn/modules/batchnorm.py(178): forward",
        "torch/nn/functional.py(2263): batch_norm",
    )
    bn = node_at(t, *fwd, "aten::batch_norm")
    assert node_at(t, *fwd, "aten::add_") != bn
    # The backward node sits under its forward op, with its kernel.
    bwd = node_at(
        t,
        *fwd,
        "aten::batch_norm",
        "aten::cudnn_batch_norm",
        "autograd::engine::evaluate_function: CudnnBatchNormBackward",
        "CudnnBatchNormBackward",
        "cudaLaunchKernel",
        "bn_bwd_kernel",
    )
    assert t.incl["gpu_ns"][bwd] == 12 * US
    assert t.incl["gpu_ns"][node_at(t, "train.py(40): <module>")] == 22 * US
    # Under a range with a stack of its own, only the frames below the range's: the op's
    # stack shares the range's outermost frame (train.py(44)), not the wrapper's line.
    node_at(
        t,
        "train.py(44): <module>",
        "torch/optim/optimizer.py(88): wrapper",
        "Optimizer.step#SGD.step",
        "torch/optim/optimizer.py(89): wrapper",
        "torch/optim/sgd.py(110): step",
        "aten::add_",
    )
    assert is_library_frame("torch/optim/sgd.py(110): step")


def test_folded_instances_keep_one_label_across_passes(tmp_path: Path) -> None:
    from perfcast.analysis.context_views import FOLD_MIN, fold_repeated, sites

    n = max(FOLD_MIN, 2)
    b = TraceBuilder()
    t = 0.0

    def conv(i: int, ts: float) -> None:
        b.op(f"nn.Module: Conv2d_{i}", ts, 20, cat="python_function")
        b.op("aten::conv2d", ts + 1, 18)
        b.launch("conv_kernel", ts + 2, 2, ts + 5, 10)

    # n convolutions at the top (folded in the first pass), and n blocks holding n
    # convolutions between them (the blocks fold first, their convolutions in the second
    # pass): both groups read "Conv2d ×n", one label, so one site without "instances".
    for i in range(n):
        conv(i, t)
        t += 30
    for block in range(n):
        b.op(f"nn.Module: Block_{block}", t, 25 * n, cat="python_function")
        conv(n + block, t + 1)
        t += 25 * n + 5
    tree = context_tree(perfcast.load(b.write(tmp_path / "blocks.json")))
    folded, count = fold_repeated(tree)
    assert count > 0
    labels = {folded.index.labels[i] for i in folded.index.label.tolist()}
    assert f"nn.Module: Conv2d ×{n}" in labels
    found = sites(folded.index, folded.excl["gpu_ns"], top=5, min_share=0.0)
    mods = [s.module for s in found if s.module]
    assert mods and all("instances" not in m for m in mods), mods


def test_2021_frames_leave_work_without_a_launch_under_its_own_node(tmp_path: Path) -> None:
    """The frame items were appended before the node for GPU work without a launch, which
    still numbered itself from the rows: an orphan kernel landed under a source line."""
    b = TraceBuilder()
    b.op("aten::mm", 10, 40, cat="Operator", **{"Call stack": "train.py(40): <module>"})
    b.launch("mm_kernel", 12, 4, 20, 10)
    b.events.append(
        {
            "ph": "X",
            "cat": "kernel",
            "name": "orphan_kernel",
            "pid": 0,
            "tid": 7,
            "ts": 90,
            "dur": 30,
            "args": {"correlation": 99999, "stream": 7, "device": 0},
        }
    )
    t = context_tree(perfcast.load(b.write(tmp_path / "orphan.json")))
    assert t.incl["gpu_ns"][node_at(t, NO_LAUNCH_LABEL, "orphan_kernel")] == 30 * US
    assert t.incl["gpu_ns"][node_at(t, "train.py(40): <module>")] == 10 * US
