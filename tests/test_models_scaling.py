"""The scaling what-ifs (amp, device, batch-size, fuse-elementwise) on tiny hand-made traces
with hand-computed predictions, their refusals, composition, and a sanity run on real traces."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import perfcast
from perfcast.errors import NotApplicableError, OptionError, PerfcastError
from perfcast.graph import build_graph
from perfcast.graph.model import NodeKind, Source
from perfcast.sim.timeline import simulate
from perfcast.whatif.registry import build_options, get_model, parse_spec
from perfcast.whatif.runner import apply_specs, run_whatif, step_ms

CPU_PID, CPU_TID = 4242, 4243
T0 = 1_000_000.0  # µs; a Kineto-like absolute timestamp
A100 = "NVIDIA A100-SXM4-80GB"
RECORDED_H100 = (
    Path(__file__).resolve().parents[1] / "benchmarks" / "accuracy" / "recorded" / "traces" / "h100"
)

ADD = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char*, 3>)"
)
RELU = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
    "launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, "
    "at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::"
    "operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, float)"
)
SUM = (
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
    "at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::"
    "operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >"
    "(at::native::ReduceOp<float, float>)"
)
SGEMM = "ampere_sgemm_128x64_nn"
BF16_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_cublas"
SQUARE = [[1024, 1024], [1024, 1024], []]


def ev(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": CPU_PID,
        "tid": CPU_TID,
        "ts": T0 + ts,
        "dur": dur,
    }
    if args:
        e["args"] = args
    return e


def kernel(name: str, dur: float, op: str, dims: list | None = None, **kw: Any) -> dict:
    return {"name": name, "dur": dur, "op": op, "dims": dims, **kw}


def gpu_trace(kernels: list[dict], device: str | None = A100, first: float = 50.0) -> dict:
    """One step: op i (7 µs at 2 + 8i) launches kernel i (4 µs launch at op + 1) on stream 7.

    Kernel 0 starts at `first` µs, the others back to back with 1 µs gaps, so the step is
    GPU-bound: baseline = first + sum(durations) + (n - 1) µs.
    """
    events = []
    t_gpu = first
    for i, k in enumerate(kernels):
        t_op = 2.0 + 8 * i
        op_args = {"Input Dims": k["dims"]} if k["dims"] is not None else {}
        events.append(ev("cpu_op", k["op"], t_op, 7.0, **op_args))
        events.append(ev("cuda_runtime", "cudaLaunchKernel", t_op + 1, 4.0, correlation=100 + i))
        args: dict[str, Any] = {"device": 0, "stream": 7, "correlation": 100 + i}
        for key in ("grid", "block"):
            if key in k:
                args[key] = k[key]
        e = ev("kernel", k["name"], t_gpu, k["dur"], **args)
        e.update(pid=0, tid=7)
        events.append(e)
        t_gpu += k["dur"] + 1.0
    events.insert(0, ev("user_annotation", "ProfilerStep#1", 0.0, 8.0 * len(kernels) + 4))
    trace: dict[str, Any] = {"schemaVersion": 1, "traceEvents": events, "displayTimeUnit": "ms"}
    if device is not None:
        trace["deviceProperties"] = [{"id": 0, "name": device, "numSms": 108}]
    return trace


def load(write_trace, trace: dict, name: str = "trace.json") -> perfcast.EventTable:
    return perfcast.load(write_trace(trace, name))


def predict(table, *specs: str) -> tuple[float, float, Any]:
    """(baseline µs, predicted µs, predicted graph)."""
    result, _, predicted = run_whatif(table, [parse_spec(s) for s in specs], correct=False)
    return result.baseline_ms * 1000, result.predicted_ms * 1000, predicted.graph


def gpu_durs(graph) -> list[tuple[str, int]]:
    """(name, duration ns) of live GPU nodes in stream order."""
    c = graph.cols
    gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & graph.alive)
    gpu = gpu[np.argsort(c["order"][gpu], kind="stable")]
    return [(graph.name_of(n), int(c["dur"][n])) for n in gpu.tolist()]


# A GPU-bound step on an A100 80GB: fixed cost = 5th percentile of [4, 100, 100, 20, 4] µs = 4 µs.
MIXED = [
    kernel(ADD, 4.0, "aten::add"),
    kernel(SGEMM, 100.0, "aten::mm"),  # no shapes: peak ratio
    kernel(SGEMM, 100.0, "aten::mm", [[32, 512], [512, 512]]),  # shapes: roofline
    kernel(ADD, 20.0, "aten::add", SQUARE),
    kernel(ADD, 4.0, "aten::add"),
]
MIXED_BASELINE_US = 50 + (4 + 100 + 100 + 20 + 4) + 4
CPU_ONLY = {
    "traceEvents": [
        ev("user_annotation", "ProfilerStep#1", 0, 50),
        ev("cpu_op", "aten::add", 5, 10),
    ]
}


def test_identity_reproduces_the_trace(write_trace):
    table = load(write_trace, gpu_trace(MIXED))
    result, base, pred = run_whatif(table, [], correct=False)
    assert result.baseline_ms == pytest.approx(MIXED_BASELINE_US / 1000, abs=1e-6)
    assert result.traced_ms == pytest.approx(result.baseline_ms, abs=1e-6)
    assert result.predicted_ms == result.baseline_ms
    assert (pred.start == base.start).all()


BN_FWD = (
    "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(cudnnTensorStruct, "
    "float const*, cudnnTensorStruct, float*, float const*, float const*, float, float, "
    "float*, float*, float*, float*, float, float)"
)


def test_amp_bf16_batch_norm_runs_three_native_kernels(write_trace):
    # fixed = 5th percentile of [4, 4, 4, 100, 60] µs = 4 µs; batch norm's variable 56 µs is
    # split 28 + 28 between the statistics and the transform.
    kernels = [
        *[kernel(ADD, 4.0, "aten::add")] * 3,
        kernel(SGEMM, 100.0, "aten::mm"),
        kernel(BN_FWD, 60.0, "aten::cudnn_batch_norm"),
    ]
    table = load(write_trace, gpu_trace(kernels))
    _, _, g = predict(table, "amp")
    durs = gpu_durs(g)
    assert [n for n, _ in durs][-3:] == [
        BN_FWD,
        "batch_norm_update_stats (native bf16, modelled)",
        "batch_norm_transform (native bf16, modelled)",
    ]
    # Statistics and transform share the cuDNN kernel's variable time; each pays the fixed
    # cost, as does the update kernel.
    assert [d for _, d in durs][-3:] == [4_000 + 28_000, 4_000, 4_000 + 28_000]
    c = g.cols
    launches = np.flatnonzero((c["kind"] == NodeKind.LAUNCH) & g.alive)
    # The three adds, the matmul, its weight cast, and three for the batch norm.
    assert launches.size == 8
    assert g.check_invariants() == []
    # fp16 keeps cuDNN's batch norm (one kernel, half the bytes).
    _, _, g16 = predict(table, "amp:dtype=fp16")
    assert [n for n, _ in gpu_durs(g16)][-1] == BN_FWD


def test_amp_gpu_bound(write_trace):
    table = load(write_trace, gpu_trace(MIXED))
    base_us, pred_us, g = predict(table, "amp")
    cast = "autocast cast fp32 -> bf16 (modelled)"
    sgemm = f"autocast[bf16] {SGEMM}"
    assert gpu_durs(g) == [
        (ADD, 4_000),  # all fixed cost: unchanged
        (cast, 4_000),  # no shapes: the fixed cost
        # 4 µs fixed + 96 µs x 19.5/312 (A100 fp32 vs bf16 peak TFLOPS)
        (sgemm, 10_000),
        # 4 µs + 512x512 fp32 weight read (4 B) and written in bf16 (2 B) at 2039 GB/s
        (cast, 4_771),
        # roofline of 32x512x512: fp32 0.86037 µs (compute) -> bf16 0.28927 µs (memory)
        (sgemm, 36_277),  # 4 µs + 96 µs x 0.336217
        (ADD, 12_000),  # memory-bound: 4 µs + 16 µs / 2
        (ADD, 4_000),
    ]
    assert base_us == pytest.approx(MIXED_BASELINE_US, abs=1e-3)
    # Back to back from 50 µs with 1 µs gaps: 50 + 75.048 + 6.
    assert pred_us == pytest.approx(131.048, abs=2e-3)
    c = g.cols
    gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & g.alive)
    src = {g.name_of(n): int(c["source"][n]) for n in gpu.tolist()}
    assert src[cast] == Source.MODELLED and src[sgemm] == Source.SCALED
    # Each cast has its own launch right before the matmul's, on the same thread.
    launches = np.flatnonzero((c["kind"] == NodeKind.LAUNCH) & g.alive)
    assert launches.size == len(MIXED) + 2
    assert any(a.startswith("amp (bf16)") for a in g.assumptions)
    assert g.check_invariants() == []


def test_amp_gemm_no_faster_than_the_parts_measured_16_bit_gemms(write_trace):
    """An fp32 GEMM near its FMA peak does not keep that efficiency on tensor cores: it is
    held at what the H100's large bf16 GEMMs reach in real traces (73.2%); a slow one keeps
    its own, lower efficiency."""
    from perfcast.hardware import gemm_flops_bytes
    from perfcast.hardware.measured import achieved_gemm

    big = [[4096, 4096], [4096, 4096]]
    kernels = [
        kernel(ADD, 4.0, "aten::add"),
        kernel(SGEMM, 2_300.0, "aten::mm", big),  # 89% of the H100's 67 fp32 TFLOPS
        kernel(SGEMM, 20_000.0, "aten::mm", big),  # 10%
        kernel(ADD, 4.0, "aten::add"),
    ]
    table = load(write_trace, gpu_trace(kernels, device="NVIDIA H100 80GB HBM3"))
    _, _, g = predict(table, "amp")
    flops, nbytes = gemm_flops_bytes(4096, 4096, 4096, 2, 1)
    new_us = max(flops / 989.5e6, nbytes / 3350e3)
    old_us = flops / 67e6
    best = achieved_gemm("H100-SXM5-80GB")
    assert best is not None and best.efficiency == pytest.approx(0.732)
    durs = [d for name, d in gpu_durs(g) if name.startswith("autocast[bf16]")]
    assert durs[0] == pytest.approx(4_000 + new_us * 1000 / best.efficiency, abs=2)
    assert durs[1] == pytest.approx(4_000 + 19_996_000 * new_us / old_us, abs=2)
    said = " ".join(g.assumptions)
    assert "1 of them no faster than the part's large 16-bit GEMMs reach" in said
    assert "H100-SXM5-80GB 73.2% of its bf16 peak" in said


def test_amp_refusals(write_trace):
    with pytest.raises(NotApplicableError, match="no GPU work"):
        predict(load(write_trace, CPU_ONLY, "cpu.json"), "amp")
    unknown = load(write_trace, gpu_trace(MIXED, device="Mystery GPU 9000"), "unknown.json")
    with pytest.raises(NotApplicableError, match="unknown"):
        predict(unknown, "amp")
    _, pred_us, _ = predict(unknown, "amp:device=a100-80gb")
    assert pred_us == pytest.approx(131.048, abs=2e-3)
    bf16 = load(write_trace, gpu_trace([kernel(BF16_GEMM, 100.0, "aten::mm")]), "bf16.json")
    with pytest.raises(NotApplicableError, match="16 bits"):
        predict(bf16, "amp")
    with pytest.raises(OptionError, match="amp is given twice"):
        predict(load(write_trace, gpu_trace(MIXED)), "amp", "amp")
    with pytest.raises(NotApplicableError, match="dtype"):
        predict(load(write_trace, gpu_trace(MIXED)), "amp:dtype=fp8")


def test_device_a100_to_h100(write_trace):
    table = load(write_trace, gpu_trace(MIXED))
    _, pred_us, g = predict(table, "device:target=h100")
    assert gpu_durs(g) == [
        (ADD, 4_000),
        (SGEMM, 31_940),  # 4 µs + 96 µs x 19.5/67 (fp32 peak A100 80GB -> H100 SXM)
        (SGEMM, 31_940),
        (ADD, 13_739),  # 4 µs + 16 µs x 2039/3350 (DRAM GB/s)
        (ADD, 4_000),
    ]
    assert pred_us == pytest.approx(50 + 85.619 + 4, abs=2e-3)


def test_device_refusals(write_trace):
    with pytest.raises(NotApplicableError, match="no GPU work"):
        predict(load(write_trace, CPU_ONLY, "cpu.json"), "device:target=h100")
    unknown = load(write_trace, gpu_trace(MIXED, device=None), "nodevice.json")
    with pytest.raises(NotApplicableError, match="unknown"):
        predict(unknown, "device:target=h100")
    _, pred_us, _ = predict(unknown, "device:target=h100,source=a100-80gb")
    assert pred_us == pytest.approx(139.619, abs=2e-3)
    with pytest.raises(NotApplicableError, match="unknown device"):
        predict(unknown, "device:target=tpu-v9,source=a100-80gb")
    with pytest.raises(PerfcastError, match="target"):
        predict(unknown, "device")


def _calibration_file(path, host_op_ns):
    from perfcast import calibration

    costs = calibration.ProfilerCosts(
        op_ns=500.0,
        input_ns=0.0,
        op_no_shapes_ns=400.0,
        python_ns=600.0,
        memory_ns=50.0,
        runtime_ns=None,
        host_op_ns=host_op_ns,
    )
    machine = {"hostname": path.stem, "cpu_model": "test CPU", "cores": 2}
    cal = calibration.Calibration(machine, "2026-11-23", None, None, profiler=costs)
    return calibration.save(cal, path)


def test_device_host_speed_from_the_new_machines_calibration(write_trace, tmp_path, monkeypatch):
    table = load(write_trace, gpu_trace(MIXED))
    _, same_us, _ = predict(table, "device:target=h100")
    _, twice_us, _ = predict(table, "device:target=h100,host=2")
    assert twice_us < same_us  # 50 µs of host work ahead of the GPU's
    new = _calibration_file(tmp_path / "new.json", 500.0)
    old = _calibration_file(tmp_path / "old.json", 1000.0)
    # The traced machine's calibration is needed too: here, none is known.
    monkeypatch.setenv("PERFCAST_CALIBRATION", "off")
    with pytest.raises(PerfcastError, match="no calibration with a host speed"):
        predict(table, f"device:target=h100,host={new}")
    # Named by the user, the old one is the traced machine's: 1000 / 500 ns = 2x.
    monkeypatch.setenv("PERFCAST_CALIBRATION", str(old))
    _, from_files_us, g = predict(table, f"device:target=h100,host={new}")
    assert from_files_us == pytest.approx(twice_us, abs=1e-6)
    assert any("taken as 2x as fast (host=new.json: 500 ns" in a for a in g.assumptions)
    # A calibration from before the host speed was measured, and a path that is not there.
    legacy = _calibration_file(tmp_path / "legacy.json", None)
    with pytest.raises(PerfcastError, match="no usable host speed"):
        predict(table, f"device:target=h100,host={legacy}")
    with pytest.raises(PerfcastError, match="neither a number nor a file"):
        predict(table, f"device:target=h100,host={tmp_path / 'missing.json'}")
    for bad in ("0", "-1", "inf", "nan", "1e-300"):
        with pytest.raises(PerfcastError, match="positive speed ratio"):
            predict(table, f"device:target=h100,host={bad}")
    # Edited or damaged files, and names no file system takes: one-line errors.
    import json

    for value in ("abc", float("inf"), -500.0, float("nan"), True):
        doc = json.loads(new.read_text())
        doc["profiler"]["host_op_ns"] = value
        edited = tmp_path / "edited.json"
        edited.write_text(json.dumps(doc))
        # Refused as it is read (the value is checked on load), or as unusable.
        with pytest.raises(
            PerfcastError, match=r"not a perfcast calibration file|no usable host speed"
        ):
            predict(table, f"device:target=h100,host={edited}")
    doc = json.loads(new.read_text())
    doc["profiler"]["host_op_ns"] = 1e-300
    (tmp_path / "tiny.json").write_text(json.dumps(doc))
    with pytest.raises(PerfcastError, match="out of range"):
        predict(table, f"device:target=h100,host={tmp_path / 'tiny.json'}")
    (tmp_path / "junk.json").write_text("[1, 2]")
    with pytest.raises(PerfcastError, match="not a perfcast calibration file"):
        predict(table, f"device:target=h100,host={tmp_path / 'junk.json'}")
    with pytest.raises(PerfcastError, match="neither a number nor a file"):
        predict(table, "device:target=h100,host=" + "a" * 5000)


def test_amp_then_device(write_trace):
    table = load(write_trace, gpu_trace(MIXED))
    _, pred_us, g = predict(table, "amp", "device:target=h100")
    cast = "autocast cast fp32 -> bf16 (modelled)"
    sgemm = f"autocast[bf16] {SGEMM}"
    # After amp the matmuls run in bf16: 312 -> 989.5 TFLOPS; the rest by 2039 -> 3350 GB/s.
    assert gpu_durs(g) == [
        (ADD, 4_000),
        (cast, 4_000),
        (sgemm, 5_892),  # 4 µs + 6 µs x 312/989.5
        (cast, 4_469),  # 4 µs + 0.771 µs x 2039/3350
        (sgemm, 14_177),  # 4 µs + 32.277 µs x 312/989.5
        (ADD, 8_869),  # 4 µs + 8 µs x 2039/3350
        (ADD, 4_000),
    ]
    assert pred_us == pytest.approx(50 + 45.407 + 6, abs=2e-3)
    assert g.device_names == {0: "H100-SXM5-80GB"}
    # The other order: amp sees the H100. First mm (peak ratio): 4 + 27.94 µs x 67/989.5;
    # second (roofline on the H100: fp32 0.35213 µs, memory-bound -> bf16 0.17607 µs): x0.5.
    _, _, g_rev = predict(table, "device:target=h100", "amp")
    assert [d for name, d in gpu_durs(g_rev) if name == sgemm] == [5_892, 17_970]
    # The same as applying one after the other by hand.
    graph = build_graph(table)
    g1 = get_model("amp").apply(graph.copy(), build_options("amp", {}))
    g2 = get_model("device").apply(g1.copy(), build_options("device", {"target": "h100"}))
    assert step_ms(simulate(g2))[1] * 1000 == pytest.approx(pred_us, abs=1e-6)


def test_batch_size_waves(write_trace):
    kernels = [
        kernel(ADD, 4.0, "aten::add", grid=[1, 1, 1], block=[128, 1, 1]),
        # A wave is one block per SM (108 on an A100): 1000 -> 2000 blocks, 10 -> 19 waves
        kernel(SGEMM, 100.0, "aten::mm", grid=[1000, 1, 1], block=[256, 1, 1]),
        # 50 -> 100 blocks stay in one wave: as fast as before
        kernel(SGEMM, 100.0, "aten::mm", grid=[25, 2, 1], block=[256, 1, 1]),
        kernel(ADD, 20.0, "aten::add"),  # no grid: x factor
        kernel(ADD, 4.0, "aten::add", grid=[1, 1, 1], block=[128, 1, 1]),
    ]
    table = load(write_trace, gpu_trace(kernels))
    _, pred_us, g = predict(table, "batch-size:factor=2")
    assert [d for _, d in gpu_durs(g)] == [
        4_000,
        186_400,  # 4 µs + 96 µs x 19/10
        100_000,
        36_000,  # 4 µs + 16 µs x 2
        4_000,
    ]
    assert pred_us == pytest.approx(50 + 330.4 + 4, abs=2e-3)
    assert any("per-sample throughput = 2 x" in a for a in g.assumptions)


def test_batch_size_names_the_sm_count_and_survives_an_unknown_device(write_trace):
    kernels = [kernel(SGEMM, 100.0, "aten::mm", grid=[1000, 1, 1], block=[256, 1, 1])]
    _, _, g = predict(load(write_trace, gpu_trace(kernels)), "batch-size:factor=2")
    assert any("one resident block per SM (A100-SXM4-80GB 108 SMs" in a for a in g.assumptions)
    # No device name at all (the fuzz campaign's case): no wave rule, and no crash sorting
    # device names.
    _, pred_us, g = predict(
        load(write_trace, gpu_trace(kernels, device=None), "nodev.json"), "batch-size:factor=2"
    )
    assert pred_us > 0
    assert any("device SM count unknown" in a for a in g.assumptions)


def test_batch_size_cpu_only(write_trace):
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    events = [
        ev("user_annotation", "ProfilerStep#1", 0, 400),
        ev("user_annotation", loader, 10, 100),
        *(ev("cpu_op", "aten::add", 120 + 10 * i, 2) for i in range(4)),
        ev("cpu_op", "aten::mm", 160, 50),
        ev("cpu_op", "aten::mm", 220, 100),
    ]
    table = load(write_trace, {"traceEvents": events}, "cpu.json")
    base_us, pred_us, _ = predict(table, "batch-size")
    assert base_us == pytest.approx(400, abs=1e-3)
    # fixed = 5th percentile of [2, 2, 2, 2, 50, 100] µs = 2 µs; mm: 2 + 48 x 2 and
    # 2 + 98 x 2; the adds stay; data loading 100 -> 200 µs: 400 + 48 + 98 + 100.
    assert pred_us == pytest.approx(646, abs=1e-3)


def test_batch_size_refusals_say_how_phases_are_found(write_trace):
    # GPU work only in the optimizer: nothing the batch scales.
    events = [
        ev("user_annotation", "ProfilerStep#1", 0, 100),
        ev("user_annotation", "Optimizer.step#Adam.step", 10, 50),
        ev("cpu_op", "aten::add_", 12, 20),
        ev("cuda_runtime", "cudaLaunchKernel", 14, 4, correlation=100),
    ]
    k = ev("kernel", ADD, 30, 10, device=0, stream=7, correlation=100)
    k.update(pid=0, tid=7)
    table = load(write_trace, {"traceEvents": [*events, k]}, "optimizer_only.json")
    with pytest.raises(NotApplicableError) as info:
        predict(table, "batch-size")
    text = str(info.value)
    assert "no forward/backward GPU work to scale" in text
    assert "GPU work (1 task) is all in the optimizer phase" in text
    assert "ProfilerStep#N range" in text and "Optimizer.step" in text and "Backward" in text
    assert "phase of the op that launched it" in text
    assert info.value.hint and "prof.step() once per iteration" in info.value.hint
    # CPU-only, every op loads data or steps the optimizer.
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    events = [
        ev("user_annotation", "ProfilerStep#1", 0, 200),
        ev("user_annotation", loader, 2, 20),
        ev("user_annotation", "Optimizer.step#Adam.step", 30, 100),
        ev("cpu_op", "aten::add_", 40, 20),
    ]
    table = load(write_trace, {"traceEvents": events}, "cpu_no_forward.json")
    with pytest.raises(NotApplicableError) as info:
        predict(table, "batch-size")
    text = str(info.value)
    assert "no forward/backward work to scale in this CPU-only trace" in text
    assert "CPU ops are all in the dataloader and optimizer phases" in text
    assert "forward is the CPU work inside a step" in text
    assert info.value.hint and "whole training or inference steps" in info.value.hint


def test_fuse_elementwise(write_trace):
    kernels = [
        kernel(ADD, 4.0, "aten::add", SQUARE),
        kernel(SGEMM, 100.0, "aten::mm"),
        kernel(ADD, 20.0, "aten::add", SQUARE),  # 2 inputs: 3 passes unfused
        kernel(RELU, 20.0, "aten::relu", [[1024, 1024]]),  # 1 input: 2 passes
        kernel(SUM, 10.0, "aten::sum", [[1024, 1024], [], [], []]),  # reduction: 1 read
        kernel(ADD, 4.0, "aten::add", SQUARE),
    ]
    table = load(write_trace, gpu_trace(kernels))
    base_us, pred_us, g = predict(table, "fuse-elementwise")
    assert base_us == pytest.approx(50 + 158 + 5, abs=1e-3)
    # Fused: 2 input reads, no full-size write, of 6 unfused passes; fixed 4 µs paid once:
    # 4 + (16 + 16 + 6) x 2/6 = 16.667 µs.
    assert [d for _, d in gpu_durs(g)] == [4_000, 100_000, 16_667, 4_000]
    assert gpu_durs(g)[2][0] == "fused 3 elementwise kernels + reduction"
    assert pred_us == pytest.approx(50 + 124.667 + 3, abs=2e-3)
    # The fused kernels' launches went with them.
    c = g.cols
    assert int(((c["kind"] == NodeKind.LAUNCH) & g.alive).sum()) == len(kernels) - 2


def test_fuse_elementwise_refusals(write_trace):
    alternating = [kernel(ADD, 4.0, "aten::add"), kernel(SGEMM, 100.0, "aten::mm")] * 2
    table = load(write_trace, gpu_trace(alternating))  # no two elementwise kernels adjacent
    with pytest.raises(NotApplicableError, match="no chain"):
        predict(table, "fuse-elementwise")
    with pytest.raises(NotApplicableError):
        predict(load(write_trace, CPU_ONLY, "cpu.json"), "fuse-elementwise")


def test_fuse_elementwise_leaves_the_optimizer_to_fused_optimizer() -> None:
    """torch.compile(model) compiles forward and backward; a for-loop Adam's kernels each
    update another parameter. Fused by default they were 94% of ResNet-50's 'fused' kernels
    (predicted 1.12x where torch.compile measured 0.83x)."""
    trace = RECORDED_H100 / "r50_base.json.gz"
    table = perfcast.load(str(trace))
    _, _, default = run_whatif(table, [parse_spec("fuse-elementwise")], correct=False)
    said = " ".join(default.graph.assumptions)
    assert (
        "fuse-elementwise (forward+backward), per step (mean of 3 steps): 33 chains of 67" in said
    )
    everything = parse_spec("fuse-elementwise:phases=forward+backward+optimizer")
    _, _, wide = run_whatif(table, [everything], correct=False)
    assert "1,194 elementwise kernels" in " ".join(wide.graph.assumptions)
    with pytest.raises(NotApplicableError, match="names no phase"):
        run_whatif(table, [parse_spec("fuse-elementwise:phases=sideways")], correct=False)


REAL_TRACES = {
    "hta_ddp_a100_rank0_nccl_args.json.gz": [
        "amp",
        "amp:dtype=fp16",
        "device:target=h100",
        "device:target=v100",
        "batch-size",
        "batch-size:factor=0.5",
        "fuse-elementwise",
        "amp|device:target=h100",
    ],
    "tracelens_h100_bert_small.json.gz": [
        "device:target=a100-80gb",
        "device:target=l4",
        "batch-size:factor=4",
        "fuse-elementwise",
    ],
}
# The BERT trace already runs its matmuls in bf16.
REAL_REFUSED = {("tracelens_h100_bert_small.json.gz", "amp")}


@pytest.fixture(scope="module", params=sorted(REAL_TRACES))
def real(request, shared_traces):
    table = perfcast.load(str(shared_traces / request.param))
    graph = build_graph(table)
    return request.param, table, graph, simulate(graph)


def test_real_traces_sanity(real):
    name, table, graph, _ = real
    for spec in [*REAL_TRACES[name], *(s for t, s in REAL_REFUSED if t == name)]:
        specs = [parse_spec(s) for s in spec.split("|")]
        if (name, spec) in REAL_REFUSED:
            with pytest.raises(NotApplicableError):
                apply_specs(graph, specs)
            continue
        result, _, pred = run_whatif(table, specs, graph=graph, correct=False)
        assert math.isfinite(result.speedup) and result.speedup > 0, spec
        assert 0.1 <= result.predicted_ms / result.baseline_ms <= 10, spec
        assert pred.graph.check_invariants() == [], spec
        assert len(pred.graph.assumptions) > len(graph.assumptions), spec


def test_one_worker_cannot_make_batches_faster_than_it_loads_them() -> None:
    """H100 ResNet-50 with num_workers=0: loading takes 72.37 ms a batch (profiler cost
    out). One worker hands over at most one batch per 72.37 ms, but the main thread's wait
    hid under the previous step's GPU work and the model predicted 59.23 ms steps."""
    import perfcast

    path = Path(__file__).parents[1] / "benchmarks/accuracy/recorded/traces/h100/r50_nw0.json.gz"
    table = perfcast.load(path)
    one = perfcast.predict(table, "dataloader-overlap:workers=1")
    assert one.predicted_ms >= 72.3
    two = perfcast.predict(table, "dataloader-overlap:workers=2,cores=2")
    assert two.predicted_ms >= 46.3  # 72.37 x 1.28 (two workers and the main thread on 2 cores) / 2
    four = perfcast.predict(table, "dataloader-overlap:workers=4")
    assert four.predicted_ms < two.predicted_ms < one.predicted_ms


def test_gradient_accumulation_on_2021_traces_is_backward_and_not_batch_sized(
    shared_traces: Path,
) -> None:
    """PyTorch 1.9's autograd thread: backward nodes are named by themselves, and
    AccumulateGrad -> aten::add_ named no phase, so 161 kernels a step went to forward
    (checkpointing recomputed them, amp halved them); batch-size's exclusion of
    AccumulateGrad read only the innermost op (aten::add_) and scaled them with the batch."""
    from perfcast.events import Kind
    from perfcast.graph.phases import Phase, event_phases

    table = perfcast.load(shared_traces / "resnet50_v100_nw0_2021.json.gz")
    phase = event_phases(table)
    kernels = (table.kind == Kind.KERNEL) & (table.iteration >= 0)
    steps = len(table.iterations)
    assert ((phase == Phase.FORWARD) & kernels).sum() == 280 * steps  # by hand from the JSON
    r = perfcast.predict(table, "batch-size")
    said = " ".join(a for row in r.applied for a in row.assumptions)
    assert "657 forward/backward kernels x2" in said  # 818 with gradient accumulation


def test_the_autograd_thread_rule_needs_the_training_loops_steps(tmp_path: Path) -> None:
    """Without ProfilerStep markers the loop's thread cannot be told from autograd's: a main
    thread with a record_function('backward') range had all its forward work called
    backward (checkpointing was refused, amp added no casts)."""
    from perfcast.events import Kind
    from perfcast.graph.phases import Phase, event_phases
    from tests.tracegen import TraceBuilder

    b = TraceBuilder()
    b.op("aten::linear", 0, 100)
    b.op("backward", 200, 300, cat="user_annotation")
    b.op("aten::mm", 210, 50)
    b.op("AddmmBackward", 220, 50, tid=200)
    b.op("aten::add_", 230, 10, tid=200)
    table = perfcast.load(b.write(tmp_path / "t.json"))
    phase = event_phases(table)
    linear = [r for r in range(len(table)) if table.name_of(r) == "aten::linear"]
    assert table.kind[linear[0]] == Kind.CPU_OP and phase[linear[0]] == Phase.FORWARD
