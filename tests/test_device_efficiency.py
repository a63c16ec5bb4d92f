"""The achieved large-GEMM efficiencies the device model uses come from the shared traces
(recomputed here with the roofline analysis), and scale compute-bound kernels between parts
that have them."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import pytest

import perfcast
from perfcast.graph.model import NodeKind
from perfcast.hardware import KernelClass
from perfcast.hardware.measured import achieved_gemm
from perfcast.whatif.registry import parse_spec
from perfcast.whatif.runner import run_whatif

GEMM_OPS = {"aten::mm", "aten::addmm", "aten::matmul", "aten::linear"}
SOURCES = {
    "H100-SXM5-80GB": ["tracelens_h100_timesformer.json.gz"],
    "MI300X": [
        "tracelens_mi300x_sglang_qwen3_8b.json.gz",
        "tracelens_mi300x_torch_compile_triton.json.gz",
    ],
}
RECORDED = Path(__file__).parents[1] / "benchmarks/accuracy/recorded/traces/h100"


def _large_gemm_pct(path: Path) -> list[float]:
    roof = perfcast.roofline(str(path), top=1000)
    out = []
    for row in roof.ops:
        if row.op in GEMM_OPS and row.gflops_per_call >= 50:
            assert row.dtype == "bf16"
            out.append(float(row.pct_peak_flops))
    return out


@pytest.mark.parametrize("part", sorted(SOURCES))
def test_table_is_what_the_traces_show(shared_traces: Path, part: str) -> None:
    pct = [p for name in SOURCES[part] for p in _large_gemm_pct(shared_traces / name)]
    assert len(pct) >= 4
    entry = achieved_gemm(part)
    assert entry is not None
    assert statistics.median(pct) / 100 == pytest.approx(entry.efficiency, abs=0.001)


def test_h100_to_mi300x_scales_compute_by_achieved_flops() -> None:
    table = perfcast.load(str(RECORDED / "r50_bs128.json.gz"))
    _, base, pred = run_whatif(table, [parse_spec("device:target=mi300x")], correct=False)
    g = pred.graph
    said = " ".join(g.assumptions)
    assert "achieved, not peak, FLOPS" in said
    # Compute-bound kernels got slower (datasheets alone would make them 1.32x faster):
    # their summed time grew, while memory-bound ones (bandwidth 1.58x) shrank.
    c0, c1 = base.graph.cols, g.cols
    conv = [i for i, n in enumerate(g.names) if "conv" in n.lower() or "gemm" in n.lower()]
    k0 = np.flatnonzero((c0["kind"] == NodeKind.GPU) & np.isin(c0["name"], conv))
    assert c1["dur"][k0].sum() > c0["dur"][k0].sum()


def test_a_move_is_judged_by_achieved_flops_on_both_sides(shared_traces: Path) -> None:
    """MI300X -> H200 (no figure of its own: the H100's, same die) gains at least what
    MI300X -> H100 gains; it once lost 37% by comparing achieved against datasheet FLOPS."""
    table = perfcast.load(str(shared_traces / "tracelens_mi300x_torch_compile_triton.json.gz"))
    to_h100, _, _ = run_whatif(table, [parse_spec("device:target=h100")], correct=False)
    to_h200, _, pred = run_whatif(table, [parse_spec("device:target=h200")], correct=False)
    assert to_h200.predicted_ms <= to_h100.predicted_ms
    said = " ".join(pred.graph.assumptions)
    assert "H200-SXM-141GB: not measured, taken as the H100-SXM5-80GB's 73.2%" in said


def test_a_faster_gpu_never_lengthens_the_step_through_the_window_start() -> None:
    """The GPU work left from before the window keeps its traced time: sped up, it moved the
    first step's start earlier and lengthened this host-bound window's mean step (+0.6%).
    The host paces this window once its starting lead is gone: the faster GPU gains nothing
    (tests/test_host_lead.py)."""
    table = perfcast.load(str(RECORDED / "r50_nw8.json.gz"))
    same, _, _ = run_whatif(table, [parse_spec("device:target=h100")])
    faster, _, _ = run_whatif(table, [parse_spec("device:target=h200")])
    assert same.predicted_ms == pytest.approx(same.baseline_ms)
    assert faster.predicted_ms <= same.predicted_ms * (1 + 1e-12)


def test_a_move_to_a_pcie_part_slows_its_collectives() -> None:
    """Collectives were scaled only between two NVLink parts: the A100 DDP example moved to
    a V100-PCIe (PCIe 3) kept its NVLink collective times and came out faster than on a
    V100-SXM2, a faster part on every count; A100-PCIe tied A100-SXM4. The collectives'
    transfers (not their waits) are what a PCIe part lengthens: on A100 they stay hidden
    behind backward, so the step ties while the collectives grow."""
    import perfcast

    example = Path(__file__).parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"
    table = perfcast.load(example)

    def ms(target: str) -> float:
        return perfcast.predict(table, f"device:target={target}").predicted_ms

    def comm_ns(target: str) -> int:
        _, _, pred = run_whatif(table, [parse_spec(f"device:target={target}")])
        c = pred.graph.cols
        comm = (c["kind"] == NodeKind.GPU) & (c["klass"] == KernelClass.COMMUNICATION)
        return int(c["dur"][comm & pred.graph.alive].sum())

    assert ms("V100-SXM2-32GB") < ms("V100-PCIe-32GB")
    assert ms("A100-SXM4-40GB") <= ms("A100-PCIe-40GB")
    assert comm_ns("A100-SXM4-40GB") < comm_ns("A100-PCIe-40GB")


def test_a_multi_node_jobs_collectives_stay_with_the_network(shared_traces) -> None:
    """128 ranks: the collectives cross nodes; an intra-node link ratio (NVLink 3 -> PCIe 4)
    made an L4 move 0.37x where the GPU change alone gives 0.61x."""
    import perfcast

    table = perfcast.load(shared_traces / "hta_sampled_128rank")
    r = perfcast.predict(table, "device:target=l4,source=a100-sxm4-80gb")
    said = " ".join(a for ap in r.applied for a in ap.assumptions)
    assert "communication kernels unchanged: the job has 128 ranks" in said


def test_collectives_scale_only_their_transfer_and_kernels_keep_their_ops_dtype(
    shared_traces: Path,
) -> None:
    """MI300X -> B200: the RCCL all-reduces reach 0.6% of the link's peak (waiting for the
    other ranks): scaling them whole by the link ratio made the step 1.36x faster. And a
    Triton attention kernel whose name says no dtype was read as fp32 (its op's inputs are
    bf16) and predicted slower on B200 (3,683 -> 4,252 µs)."""
    table = perfcast.load(str(shared_traces / "tracelens_mi300x_resnet_act_ckpt_rank0.json.gz"))
    result, base, pred = run_whatif(table, [parse_spec("device:target=b200")])
    assert result.speedup < 1.15
    said = " ".join(pred.graph.assumptions)
    assert "latency and waiting for other ranks kept" in said
    table = perfcast.load(str(shared_traces / "tracelens_mi300x_torch_compile_triton.json.gz"))
    _, base, pred = run_whatif(table, [parse_spec("device:target=b200")], correct=False)
    c0, c1 = base.graph.cols, pred.graph.cols
    attn = [i for i, n in enumerate(pred.graph.names) if n.startswith("attn_fwd")]
    k = np.flatnonzero((c0["kind"] == NodeKind.GPU) & np.isin(c0["name"], attn))
    assert k.size and c1["dur"][k].sum() < c0["dur"][k].sum()
