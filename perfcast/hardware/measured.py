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
