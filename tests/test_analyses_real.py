"""The analyses on the shared real traces: each runs on every trace, known answers hold, and
numbers HTA 0.5.0 reports agree within 1%. Skipped where /work/shared is absent (CI).

The HTA numbers below were produced by HolisticTraceAnalysis 0.5.0 (`TraceAnalysis` on a
folder holding only that file; `get_gpu_kernel_breakdown(include_memory_kernels=True)`,
`get_idle_time_breakdown`, `get_cuda_kernel_launch_stats`, `get_queue_length_summary`,
`get_memory_bw_summary`, `get_gpu_user_annotation_breakdown(use_gpu_annotation=False)`,
`get_potential_stragglers`). HTA reports microseconds. Traces without ProfilerStep are used
for the single-rank checks because HTA drops a trace's last step and perfcast does not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import perfcast
from perfcast.analysis.battery import ANALYSES, analyze

pytestmark = pytest.mark.slow

ONE_RANK = sorted(
    p.name for p in (Path(__file__).parents[2] / "shared" / "traces").glob("*.json.gz")
)
FOLDERS = ["dlrm_v100_8rank", "hta_sampled_128rank"]
GPU_TRUTH = Path(__file__).parents[2] / "shared" / "gpu-truth" / "traces" / "h100"


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 0.01 * abs(b)


@pytest.mark.parametrize("name", ONE_RANK + FOLDERS)
def test_every_analysis_runs_on_every_shared_trace(shared_traces: Path, name: str) -> None:
    import msgspec

    result = analyze(perfcast.load(shared_traces / name))
    assert msgspec.json.encode(result)
    assert len(result.results()) == len(ANALYSES)


def test_stragglers_dlrm_ranks_2_and_7(shared_traces: Path) -> None:
    # HTA's get_potential_stragglers() names ranks 2 and 7 on this set.
    r = perfcast.stragglers(shared_traces / "dlrm_v100_8rank")
    assert sorted(r.candidates) == [2, 7]
    assert r.matched == 8
    # Rank 2 is late on average but never the last: the text says it held no one up.
    from rich.console import Console

    from perfcast.report.analyses_terminal import render_analyses

    console = Console(width=400, record=True)
    render_analyses(perfcast.analyze(shared_traces / "dlrm_v100_8rank", only="stragglers"), console)
    text = console.export_text()
    assert "2 (426 µs late on average, last at 0 collectives" in text
    assert "never the last, so it held no one up" in text
    # Named as the collectives analysis names them: NCCL runs DLRM's all-to-all as SendRecv.
    by_op = {g.op for g in perfcast.collectives(shared_traces / "dlrm_v100_8rank").by_op}
    assert {w.kind for w in r.worst} <= by_op and "alltoall" in {w.kind for w in r.worst}


def test_hta_param_resnet(shared_traces: Path) -> None:
    t = perfcast.load(shared_traces / "param_resnet_rtx2080ti.json.gz")
    kb = {r.kinds: r.time_ms * 1000 for r in perfcast.kernel_breakdown(t).overlap}
    assert close(kb["computation"], 4103141) and close(kb["memory"], 630681)
    s7 = next(s for s in perfcast.idle_time(t).by_stream if s.stream == 7)
    assert close(s7.host_wait_ms * 1000, 9777580) and close(s7.kernel_wait_ms * 1000, 11515)
    ls = perfcast.launch_stats(t).summary[0]
    assert ls.launches == 10113
    assert close(ls.mean_delay_us, 43516.80)
    assert close(ls.mean_cpu_us, 292.938) and close(ls.mean_gpu_us, 468.093)
    q7 = next(s for s in perfcast.launch_queue(t).by_stream if s.stream == 7)
    assert close(q7.max_length, 315)
    copies = {c.kind: c for c in perfcast.memory(t).copies}
    # The file holds 62 DtoD and 61 HtoD copies (HTA's bandwidth summary counts points of its
    # time series instead, 63 and 61).
    assert copies["Memcpy DtoD"].count == 62 and copies["Memcpy HtoD"].count == 61
    annotations = {s.name: s for s in perfcast.scopes(t).scopes if s.kind == "annotation"}
    assert close(annotations["Optimizer.step#SGD.step"].total_ms * 1000, 66237)
    assert close(annotations["Optimizer.zero_grad#SGD.zero_grad"].max_us, 438)


def test_hta_alexnet(shared_traces: Path) -> None:
    t = perfcast.load(shared_traces / "hta_alexnet_a100_cuda_sync.json.gz")
    kb = {r.kinds: r.time_ms * 1000 for r in perfcast.kernel_breakdown(t).overlap}
    assert close(kb["memory"], 55511) and close(kb["computation"], 10637)
    idle = {s.stream: s for s in perfcast.idle_time(t).by_stream}
    assert close(idle[7].host_wait_ms * 1000, 12855007)
    assert close(idle[20].host_wait_ms * 1000, 12011718)
    ls = perfcast.launch_stats(t).summary[0]
    assert ls.launches == 98 and close(ls.mean_delay_us, 400.847)
    annotations = {s.name: s for s in perfcast.scopes(t).scopes if s.kind == "annotation"}
    assert close(annotations["[param|clear_cache]"].total_ms * 1000, 56408)
    copies = {c.kind: c for c in perfcast.memory(t).copies}
    assert copies["Memcpy HtoD"].count == 16
    assert close(copies["Memcpy HtoD"].max_gbs, 11.14669)


def test_memory_timeline_ddp(shared_traces: Path) -> None:
    r = perfcast.memory(shared_traces / "hta_ddp_v100_rank1_memory.json.gz")
    gpu = r.allocators[0]
    # Checked against the file's own fields: 26,770 CUDA events (Device Type 1), peak
    # Total Allocated 6,629,508,096 bytes; 1,240 CPU events.
    assert gpu.events == 26770 and gpu.peak_mb == pytest.approx(6629.508096)
    assert r.allocators[1].events == 1240
    assert (gpu.device, r.allocators[1].device) == ("GPU 1", "CPU")
    assert len(r.by_step) == 5


def test_memory_timeline_rebuilt_on_a_2021_trace(shared_traces: Path) -> None:
    """Its [memory] events carry Device Type, Device Id and Bytes, no Total Allocated."""
    r = perfcast.memory(shared_traces / "resnet50_v100_nw0_2021.json.gz")
    gpu, cpu = r.allocators
    # Counted in the file: 8,220 events of Device Type 1 (Device Id 0), 4,618 of type 0.
    assert (gpu.device, gpu.events, cpu.device, cpu.events) == ("GPU 0", 8220, "CPU", 4618)
    assert gpu.totals == "lower bound" and gpu.min_mb == 0
    # Every step allocates and frees the same (the steady state), and the window's level
    # returns to where each step began.
    steps = r.by_step
    assert len(steps) == 6 and len({round(s.allocated_mb, 3) for s in steps}) == 1
    assert all(s.allocated_mb == pytest.approx(s.freed_mb) for s in steps)
    assert r.timeline and any("lower bounds" in n for n in r.notes)


def test_roofline_h100_mlp() -> None:
    path = GPU_TRUTH / "mlp_base.json.gz"
    if not path.is_file():
        pytest.skip(f"no {path}")
    r = perfcast.roofline(path)
    mm = next(o for o in r.ops if o.op == "aten::mm" and o.shapes.startswith("[[64, 256]"))
    assert mm.gflops_per_call == pytest.approx(2 * 64 * 256 * 256 / 1e9)
    assert mm.peak_tflops == pytest.approx(67.0)  # H100 SXM fp32
    assert 0 < mm.pct_peak_flops < 100


def test_diff_on_a_measured_pair() -> None:
    a, b = GPU_TRUTH / "mlp_base.json.gz", GPU_TRUTH / "mlp_fused.json.gz"
    if not (a.is_file() and b.is_file()):
        pytest.skip("no gpu-truth traces")
    d = perfcast.diff(a, b, apply="fused-optimizer:kind=fused")
    assert d.step.b_ms < d.step.a_ms  # the fused optimizer made the traced step faster
    # The for-loop Adam's many small kernels are what went away.
    gone = [k for k in d.kernels if k.delta_ms < 0]
    assert gone and gone[0].b_count < gone[0].a_count
    assert d.prediction is not None
    assert d.prediction.predicted_ms < d.prediction.baseline_ms
    assert any(row.kind == "kernel" for row in d.predicted)
    # A phase is no count of things: its rows carry none (they printed 0 before).
    assert d.phases and all(r.a_count is None and r.b_count is None for r in d.phases)


def test_diff_says_the_speedup_without_the_profiler() -> None:
    """ResNet-50, for-loop -> fused Adam on an H100: traced 1.50x, measured without the
    profiler 1.07x (gpu-truth). diff puts the de-profiled estimate beside the traced one."""
    a, b = GPU_TRUTH / "r50_base.json.gz", GPU_TRUTH / "r50_fused.json.gz"
    if not (a.is_file() and b.is_file()):
        pytest.skip("no gpu-truth traces")
    d = perfcast.diff(a, b)
    assert d.step.speedup == pytest.approx(1.50, abs=0.02)
    assert d.step.real_speedup is not None and 1.0 < d.step.real_speedup < 1.2
    assert d.step.real_source == "A: default, B: default"
    # Against B's own estimate, the gap is two estimates, not a measured error.
    d = perfcast.diff(a, b, apply=["fused-optimizer:kind=fused"])
    text = " ".join(d.text(200).split())
    assert "two estimates, not a measured error" in text
    assert "estimated (default): error" not in text


def test_roofline_reads_the_ops_own_input_dtype(shared_traces: Path) -> None:
    """The op's "Input type" (bf16 here) wins over a guess from kernel names, and flash-attn's
    (batch, seq, heads, dim) layout gives 4 B H S^2 D FLOPs per call."""
    r = perfcast.roofline(shared_traces / "tracelens_mi300x_torch_compile_triton.json.gz")
    fa = next(o for o in r.ops if o.op == "aten::_flash_attention_forward")
    assert fa.dtype == "bf16" and not fa.dtype_assumed
    assert fa.gflops_per_call == pytest.approx(4 * 8 * 16 * 4096**2 * 128 / 1e9)
    assert all((o.pct_peak_bw or 0) <= 100 for o in r.ops)


def test_collectives_sized_from_their_ranges_without_collective_arguments(
    shared_traces: Path,
) -> None:
    """The 2023 DLRM traces carry no collective arguments; their all-to-alls run as NCCL
    SendRecv kernels. The enclosing nccl:all_to_all range names the op and
    record_param_comms' shapes and input type give the size (6,144 floats). DDP's
    c10d::allreduce_ records a TensorList without dims: the nccl:all_reduce range inside it
    records each bucket (394,241, 112 and 226,960 floats, read from the file)."""
    r = perfcast.collectives(shared_traces / "dlrm_v100_8rank")
    ops = {row.op for row in r.by_op}
    assert "alltoall" in ops and "sendrecv" not in ops
    assert any(row.op == "alltoall" and row.size_bytes == 6144 * 4 for row in r.by_op)
    reduced = {row.size_bytes for row in r.by_op if row.op == "allreduce"}
    assert reduced == {394241 * 4, 112 * 4, 226960 * 4}
    assert all(row.busbw_gbs for row in r.by_op if row.op == "allreduce")
    assert not any("carry no size" in n for n in r.notes)


def test_diff_says_when_the_gpu_or_the_batch_differ(shared_traces: Path) -> None:
    a = GPU_TRUTH / "r50_base.json.gz"
    if not a.is_file():
        pytest.skip("no gpu-truth traces")
    d = perfcast.diff(a, shared_traces / "resnet50_v100_nw0_2021.json.gz", correct=False)
    notes = " ".join(d.notes)
    assert "B on Tesla V100-DGXS-32GB" in notes and "the batch differs (A 64, B 32" in notes
    same = perfcast.diff(a, GPU_TRUTH / "r50_fused.json.gz", correct=False)
    assert not any("differs" in n or "two GPUs" in n for n in same.notes)


def test_a_graph_launch_is_counted_once() -> None:
    """A cudaGraphLaunch replays thousands of kernels: each carries its share of the call's
    CPU time (the 14 ms CUDA-graph MLP trace reported 10,253 ms of launch CPU time, and
    4,722 runtime outliers for its 3 graph launches)."""
    import numpy as np

    from perfcast.analysis.launches import launch_stats

    path = Path(__file__).parents[1] / "benchmarks/accuracy/recorded/traces/h100/mlp_graph.json.gz"
    table = perfcast.load(str(path))
    s = launch_stats(table).summary[0]
    calls = np.unique(table.launch[table.is_gpu() & (table.launch >= 0)])
    assert s.cpu_ms == pytest.approx(table.dur[calls].sum() / 1e6)
    assert s.runtime_outliers <= calls.size < 10


def test_summary_cpu_phases_follow_each_steps_own_ops(shared_traces: Path) -> None:
    """On the MI300X ResNet trace the host runs a step ahead of the GPU and backward runs on
    the autograd thread: each step's CPU time by phase comes from its own ops (each step has
    its backward), the innermost event's phase (the train_step frame spanning forward and
    backward is not forward time), and stops where its ProfilerStep does (the profiler's
    flush after the last step is not forward time)."""
    s = perfcast.summary(
        shared_traces / "tracelens_mi300x_resnet_act_ckpt_rank0.json.gz", correct=False
    )
    cpus = [it.cpu for it in s.ranks[0].iterations]
    assert len(cpus) == 3
    for c in cpus:
        assert c.backward_ms > 15 and c.optimizer_ms > 0.2
        assert 3 < c.forward_ms < 10  # about 6 ms; the whole ProfilerStep is about 16 ms


def test_summary_marks_only_stragglers_that_made_others_wait(shared_traces: Path) -> None:
    """HTA's candidates on the DLRM set are ranks 7 and 2, but rank 2 was never the last to
    arrive: the summary labels rank 7 only."""
    s = perfcast.summary(shared_traces / "dlrm_v100_8rank", correct=False)
    assert s.stragglers == [7]


def test_a_profiled_prediction_is_never_faster_than_the_unprofiled_one() -> None:
    # remove-host-sync lets a CUDA-graph step overlap the next: both predictions are steady
    # states, each scaled by its own world's ratio (the profiled one came out 2.70 ms
    # against 2.71 ms without the profiler).
    path = GPU_TRUTH / "mlp_graph.json.gz"
    if not path.is_file():
        pytest.skip("no gpu-truth traces")
    r = perfcast.predict(path, "remove-host-sync")
    assert r.predicted_traced_ms >= r.predicted_ms


def test_diff_notes_two_traces_of_different_programs() -> None:
    from perfcast.analysis.diff import diff

    names = ("mlp_base", "r50_base", "mlp_graph", "r50_amp_bf16")
    if not all((GPU_TRUTH / f"{n}.json.gz").is_file() for n in names):
        pytest.skip("no gpu-truth traces")
    t = {n: perfcast.load(GPU_TRUTH / f"{n}.json.gz") for n in names}

    def noted(a: str, b: str) -> bool:
        d = diff(t[a], t[b], real=False)
        said = any("different programs" in n for n in d.notes)
        assert d.different_programs == said
        return said

    assert noted("mlp_base", "r50_base")
    # With --apply, the error against B is flagged as unlike programs, not a bad prediction.
    d = perfcast.diff(t["r50_base"], t["mlp_base"], apply="remove-host-sync", correct=False)
    assert d.different_programs and "measures how unlike they are" in d.text()
    # A whole-step CUDA graph keeps its kernels; bf16 autocast keeps its ops.
    assert not noted("mlp_base", "mlp_graph") and not noted("r50_base", "r50_amp_bf16")


def test_an_all_gather_without_arguments_is_sized_by_its_output(shared_traces: Path) -> None:
    """c10d::_allgather_base_ records (output, input); the nccl: range inside it only the
    input, which was taken as the size (nccl-tests counts the output) with the world as the
    group: bandwidth 64x too low on HTA's 128-rank sample."""
    r = perfcast.collectives(shared_traces / "hta_sampled_128rank")
    gathers = [row for row in r.by_op if row.op == "allgather" and row.rank == 0]
    assert gathers and gathers[0].size_bytes == 1_073_741_824 and gathers[0].group_size == 64
    assert gathers[0].busbw_gbs == pytest.approx(19.9, rel=0.01)
