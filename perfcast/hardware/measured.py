"""Kernel speed ratios between two GPUs, measured rather than read off datasheets.

Where the project has measured the same workloads on both parts, these replace the
datasheet ratios (peak FLOPS, DRAM bandwidth) in the device model. A ratio is the new part's
speed relative to the old one (old time / new time) for a class of kernels.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MeasuredRatio:
    memory: float  # memory-bound kernels (elementwise, reductions, norms, copies, ...)
    compute: float  # matmul / convolution / attention kernels
    source: str


# H100 -> H200: the datasheet bandwidth ratio is 4.8 / 3.35 = 1.43, but the four GPU-bound
# ResNet-50 configurations of the recorded set (batch 128 and the foreach / fused Adam and
# 4-worker runs, benchmarks/accuracy/recorded) ran 1.17-1.18x faster on the H200, which the
# per-kernel scaling reproduces with memory-bound kernels 1.30x faster and compute-bound ones
# unchanged (same GH100 die, SM count and clocks).
_TABLE: dict[tuple[str, str], MeasuredRatio] = {
    ("H100-SXM5-80GB", "H200-SXM-141GB"): MeasuredRatio(
        memory=1.30,
        compute=1.0,
        source="measured: 4 GPU-bound ResNet-50 steps on an H100 and an H200, Nov 2026",
    ),
}


def measured_ratio(old: str, new: str) -> MeasuredRatio | None:
    """The measured ratio for moving from `old` to `new` (canonical device names), if any."""
    found = _TABLE.get((old, new))
    if found is not None:
        return found
    back = _TABLE.get((new, old))
    if back is not None:
        return MeasuredRatio(1 / back.memory, 1 / back.compute, back.source + " (inverse)")
    return None


@dataclass(frozen=True)
class AchievedGemm:
    efficiency: float  # share of the part's dtype peak that large dense GEMMs reached
    source: str


# What large dense GEMMs (aten::mm / addmm of 50+ GFLOP per call) reached of the part's bf16
# peak in the shared traces, by the roofline analysis (`perfcast analyze --only roofline`;
# tests/test_device_efficiency.py recomputes them). Where both parts of a move have an entry
# and the project measured no pair ratio, compute-bound kernels scale by achieved rather than
# datasheet FLOPS: datasheets say an MI300X runs bf16 GEMMs 1.32x as fast as an H100, the
# traces say it reaches 41.5% of its peak where the H100 reaches 73.2%.
_GEMM_EFFICIENCY: dict[str, AchievedGemm] = {
    "H100-SXM5-80GB": AchievedGemm(
        efficiency=0.732,
        source="H100: median of 4 bf16 GEMMs of 89-118 GFLOP, tracelens_h100_timesformer",
    ),
    "MI300X": AchievedGemm(
        efficiency=0.415,
        source="MI300X: median of 7 bf16 GEMMs of 275-3092 GFLOP, "
        "tracelens_mi300x_sglang_qwen3_8b and tracelens_mi300x_torch_compile_triton",
    ),
}


def achieved_gemm(part: str) -> AchievedGemm | None:
    """The measured large-GEMM efficiency of a part (canonical device name), if any."""
    return _GEMM_EFFICIENCY.get(part)


# Which measured part stands in for an unmeasured one of the same vendor. The H200 is the
# H100's GH100 die with the same SMs and clocks (the recorded H100 -> H200 ResNet-50 steps ran
# their compute-bound kernels at the same speed); other parts are a nearer guess than the
# datasheet's implied 100% of peak.
_VENDOR_STAND_IN = {"NVIDIA": "H100-SXM5-80GB", "AMD": "MI300X"}


def achieved_gemm_or_stand_in(part: str, vendor: str) -> AchievedGemm | None:
    """`achieved_gemm(part)`, else the same vendor's measured part, said so in its source."""
    own = achieved_gemm(part)
    if own is not None:
        return own
    stand_in = _VENDOR_STAND_IN.get(vendor)
    found = _GEMM_EFFICIENCY.get(stand_in) if stand_in else None
    if found is None:
        return None
    return AchievedGemm(
        efficiency=found.efficiency,
        source=f"{part}: not measured, taken as the {stand_in}'s {found.efficiency:.1%}",
    )
