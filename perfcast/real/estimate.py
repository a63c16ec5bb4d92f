"""The profiler costs perfcast knows without measuring (defaults), and how results report a
correction and the steps it leaves (traced, real, measured).

Costs are chosen, in order of preference (see analysis.real_step, which replays to fit):
"fit" to unprofiled steps the trace carries, "calibration" from `perfcast calibrate` on the
machine that took the trace, else the "default" below; "off" leaves the profiler's cost in.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from perfcast.events import EventTable
from perfcast.real.profiler_cost import (
    ENTER_SHARE,
    MIN_RUNTIME_NS,
    OFF,
    ProfilerCost,
    ProfilerSettings,
    Removed,
)

# Fitted to the project's measured GPU set (benchmarks/accuracy/recorded: 13 configurations on
# an H100 80GB HBM3 with a 16-core host, PyTorch 2.11, CUDA 13, record_shapes=True; each
# timed without the profiler and traced with it): the per-event costs that make the
# corrected replays match the unprofiled steps (median error 2%; the two CPU-bound
# configurations whose unprofiled windows spread 8-22% miss by 21-26%). They are effective
# costs: besides the bookkeeping visible between nested ops (~0.8 µs per op on that host),
# they carry what the profiler costs the CPU in between (caches, Python-side hooks).
DEFAULT_OP_NS = 2250.0
DEFAULT_INPUT_NS = 260.0
DEFAULT_RUNTIME_NS = 4500.0
DEFAULT_TASK_NS = 1150.0
# Without record_shapes an op costs about a quarter as much (the ratio measured by
# `perfcast calibrate` on the project's CPU machine: 0.40 against 1.58 µs per op).
NO_SHAPES_SHARE = 0.25
# with_stack / with_modules: per Python frame; profile_memory: per [memory] event (measured
# on the project's 2-core CPU machine; no GPU-host measurement yet).
DEFAULT_PYTHON_NS = 1000.0
DEFAULT_MEMORY_NS = 300.0
DEFAULT_UNCERTAINTY = 0.5
# What `perfcast calibrate`'s microbenchmarks miss: inside a training step the profiler also
# slows the ops' own work. On the project's 2-core CPU machine (20 baselines of four
# workloads without DataLoader workers, live-cpu-2026-11 and -24) the traced step's excess
# over the unprofiled one, less the calibrated per-event costs, is 6.2% of the time inside
# top-level ops (regression; residual rms 0.39 ms on excesses of 0.85-3.25 ms). The
# correction takes the share from the ops' own CPU segments only, after the per-event costs,
# and a replay gains only what is on its critical path, so the constant is fitted through
# the correction itself: 10.4% makes the corrected replays' median error zero. Refitted on
# three workloads (9.2-11.6%) and applied to the fourth, the calibration-only estimate of
# the unprofiled step is within a median 1.7%, max 5.5% of the measured one (6.4% / 9.2%
# without it); 16.6% at most with the DataLoader-worker baselines (21% without)
# (`python -m benchmarks.accuracy.work_share`). Microbenchmarks of single ops cannot see it
# (a lone large op runs 2-3.5% slower); `perfcast calibrate` measures it on a reference
# training step (perfcast.real.measure.measure_work_share: 4.7-6.7% on that machine), and
# this constant stands in for calibrations written before it did. The default's per-op
# cost, fitted on whole steps, holds it already.
CALIBRATION_WORK_SHARE = 0.104


def default_cost(settings: ProfilerSettings) -> ProfilerCost:
    """The documented default for a trace recorded with these settings."""
    op = DEFAULT_OP_NS if settings.record_shapes else DEFAULT_OP_NS * NO_SHAPES_SHARE
    return ProfilerCost(
        op_ns=op,
        input_ns=DEFAULT_INPUT_NS if settings.record_shapes else 0.0,
        runtime_ns=DEFAULT_RUNTIME_NS,
        python_ns=DEFAULT_PYTHON_NS if (settings.with_stack or settings.with_modules) else 0.0,
        memory_ns=DEFAULT_MEMORY_NS if settings.profile_memory else 0.0,
        task_ns=DEFAULT_TASK_NS,
        source="default",
        uncertainty=DEFAULT_UNCERTAINTY,
        note="per-event costs fitted on an H100 host (PyTorch 2.11); not measured on the "
        "machine that took this trace",
    )


@dataclass
class StepEstimate:
    """One step: as traced, as it would run without the profiler, and as measured so."""

    rank: int
    name: str
    traced_ms: float  # the step as traced (what the replay of the trace reproduces)
    real_ms: float  # estimated without the profiler
    measured_real_ms: float | None  # measured without the profiler, when the trace says
    source: str  # where the correction came from: fit, calibration, default or off


@dataclass
class Correction:
    """The correction applied to a trace, as results report it (times in µs)."""

    source: str
    settings: str
    op_us: float
    input_us: float
    runtime_us: float
    task_us: float
    python_us: float
    memory_us: float
    uncertainty_pct: float
    work_pct: float  # the ops' own work lengthened by this much under the profiler
    removed_ms_per_step: float  # host time taken out, per step (not all of it was critical)
    note: str
    # Whether the trace has runtime calls (CUDA/HIP API) for the per-call costs to apply to:
    # a CPU-only trace's note listed them, fitted, as if they had been taken out.
    runtime_calls: bool = True

    @classmethod
    def of(cls, cost: ProfilerCost, settings: ProfilerSettings, removed: Removed, steps: int):
        return cls(
            source=cost.source,
            settings=settings.label(),
            op_us=cost.op_ns / 1e3,
            input_us=cost.input_ns / 1e3,
            runtime_us=cost.runtime_ns / 1e3,
            task_us=cost.task_ns / 1e3,
            python_us=cost.python_ns / 1e3,
            memory_us=cost.memory_ns / 1e3,
            work_pct=100.0 * cost.work_share,
            uncertainty_pct=100.0 * cost.uncertainty,
            removed_ms_per_step=removed.total_ns / 1e6 / max(steps, 1),
            note=cost.note,
            runtime_calls="runtime calls" in removed.per_kind_ns
            or not (cost.runtime_ns or cost.task_ns),
        )

    def assumption(self) -> str:
        if self.source == "off":
            return "the profiler's own cost is left in: predictions are for the profiled run"
        extra = "".join(
            f", {us:.2f} µs {what}"
            for us, what in (
                (
                    self.task_us if self.runtime_calls else 0.0,
                    "per GPU task a runtime call launches beyond its first",
                ),
                (self.python_us, "per Python frame"),
                (self.memory_us, "per [memory] event"),
            )
            if us > 0
        )
        if self.work_pct > 0:
            extra += f", and the ops' own CPU work taken as {self.work_pct:.1f}% longer traced"
        return (
            f"the profiler's own host cost is taken out ({self.source}: {self.op_us:.2f} µs per "
            f"op"
            + (f" + {self.input_us:.2f} µs per recorded input" if self.input_us >= 0.005 else "")
            + (f", {self.runtime_us:.2f} µs per runtime call" if self.runtime_calls else "")
            + f"{extra}, ±{self.uncertainty_pct:.0f}%; {self.note}; an op's cost taken "
            f"{ENTER_SHARE:.0%} from the CPU time before it and the rest after, never more than "
            "that time"
            + (
                f", a runtime call keeping at least {MIN_RUNTIME_NS / 1e3:g} µs"
                if self.runtime_calls
                else "; no runtime calls in the trace"
            )
            + "; "
            f"{self.removed_ms_per_step:.2f} ms of host time per step): predictions are for the "
            "run without the profiler"
        )


def measured_real_steps(table: EventTable) -> dict[int, float]:
    """Per rank: the median unprofiled step the trace carries (ms), where it carries one:
    the windows before and after the traced one together."""
    out = {}
    for info in table.ranks:
        steps = [*info.unprofiled_step_ms, *info.unprofiled_after_step_ms]
        if steps:
            out[info.rank] = float(statistics.median(steps))
    return out


__all__ = [
    "CALIBRATION_WORK_SHARE",
    "OFF",
    "Correction",
    "StepEstimate",
    "default_cost",
    "measured_real_steps",
]
