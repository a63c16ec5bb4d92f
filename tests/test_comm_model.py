"""The scale-out what-ifs price collectives with the cluster model `perfcast plan` uses: the
bus bandwidth a trace's own large collectives reached replaces the 80%-of-peak default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import perfcast
from perfcast.hardware import lookup_link
from perfcast.whatif.registry import parse_spec
from perfcast.whatif.runner import run_whatif
from tests.test_models_graph import GPU_PID, MIB, PID, TID, _x, predict, training_step

RECORDED = Path(__file__).parents[1] / "benchmarks" / "accuracy" / "recorded" / "traces" / "h100"
NBYTES = 64 * MIB  # a 64 MiB fp32 all-reduce over 2 GPUs in 300 µs


def _with_measured_allreduce(path: Path, dur_us: float = 300) -> Path:
    t = training_step()
    t.op("record_param_comms", 64, 5)
    t.corr += 1
    t.events.append(
        _x("cuda_runtime", "cudaLaunchKernel", PID, TID, 66, 2, {"correlation": t.corr})
    )
    args = {
        "correlation": t.corr,
        "stream": 20,
        "device": 0,
        "Collective name": "allreduce",
        "In msg nelems": NBYTES // 4,
        "Out msg nelems": NBYTES // 4,
        "Group size": 2,
        "dtype": "Float",
    }
    t.events.append(
        _x("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float", GPU_PID, 20, 690, dur_us, args)
    )
    return t.write(path)


def test_the_traces_own_collective_sets_the_bus_bandwidth(tmp_path: Path) -> None:
    path = _with_measured_allreduce(tmp_path / "measured.json")
    result, _ = predict(path, "ddp:gpus=8")
    text = result.applied[0].assumptions[0]
    # algbw = 64 MiB / 300 µs = 223.7 GB/s; busbw = algbw x 2(n-1)/n = algbw for n = 2.
    busbw = NBYTES / 300e-6 / 1e9
    assert "measured on the trace's allreduce of 64 MiB over 2 GPUs" in text
    assert f"{busbw:.0f} GB/s" in text
    # The two modelled buckets (4 MiB each) are priced at the measured bus bandwidth.
    link = lookup_link("nvlink3")
    assert link is not None
    one = 10.0 + 14 * link.latency_us + 1.75 * 4 * MIB / (busbw * 1e3)
    per_step = float(re.search(r"([\d.]+) ms of all-reduce per step", text).group(1))
    assert per_step == pytest.approx(2 * one / 1e3, abs=0.006)


def test_without_measured_collectives_the_default_share_of_peak_is_said(tmp_path: Path) -> None:
    result, _ = predict(
        training_step().write(tmp_path / "plain.json"), "zero:gpus=4,stage=2,params_mb=8"
    )
    text = " ".join(result.applied[0].assumptions)
    assert "80% of it = 240 GB/s, NVIDIA's nccl-tests figures" in text
    assert "10 µs per collective" in text


def test_a_measured_bandwidth_far_below_the_link_is_not_used_and_said(tmp_path: Path) -> None:
    # 64 MiB in 10 ms: 6.7 GB/s, 2% of NVLink 3 -- waits for another rank, or a slower link.
    path = _with_measured_allreduce(tmp_path / "slow.json", dur_us=10_000)
    result, _ = predict(path, "ddp:gpus=8")
    text = result.applied[0].assumptions[0]
    assert "80% of it = 240 GB/s" in text
    assert "own collectives: 7 GB/s measured on the trace's allreduce of 64 MiB" in text
    assert "2% of nvlink3's peak, under 25%: not used" in text and "name it" in text


def test_a_named_link_is_not_overridden_by_the_traces_own(tmp_path: Path) -> None:
    # Measured over the A100's NVLink 3 (224 GB/s): asking for NVLink 4 or PCIe must price
    # that link, not the measurement.
    path = _with_measured_allreduce(tmp_path / "measured.json")
    # nccl-tests publishes NVLink figures only: PCIe's 80% is said to be an assumption.
    for link, busbw, why in (
        ("nvlink4", 0.8 * 450, "NVIDIA's nccl-tests figures"),
        ("pcie4", 0.8 * 31.5, "an assumption (nccl-tests figures are published for NVLink"),
    ):
        result, _ = predict(path, f"ddp:gpus=8,link={link}")
        text = result.applied[0].assumptions[0]
        assert f"80% of it = {busbw:.0f} GB/s, {why}" in text
        assert f"over nvlink3: not used for {link}" in text
    faster, _ = predict(path, "ddp:gpus=8,link=nvlink4")
    measured, _ = predict(path, "ddp:gpus=8")
    slower, _ = predict(path, "ddp:gpus=8,link=pcie4")
    assert faster.predicted_ms <= measured.predicted_ms < slower.predicted_ms


def test_tensor_parallel_beyond_a_node_crosses_the_network() -> None:
    table = perfcast.load(RECORDED / "mlp_base.json.gz")  # an H100 MLP with linear layers
    eight, _, _ = run_whatif(table, [parse_spec("tensor-parallel:tp=8")], correct=False)
    sixteen, _, _ = run_whatif(table, [parse_spec("tensor-parallel:tp=16")], correct=False)
    assert "16 GPUs span nodes of 8" in " ".join(sixteen.applied[0].assumptions)
    assert "span nodes" not in " ".join(eight.applied[0].assumptions)
