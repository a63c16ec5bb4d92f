"""The step as traced, and as it runs without the profiler: the world predictions start from.

`real_world(graph)` chooses the profiler cost to take out (fit to unprofiled steps the trace
carries > calibration of the machine that took it > documented default), takes it out of
the graph (perfcast.real), and replays both graphs. Every prediction applies its what-if to
the corrected graph and compares with the corrected baseline; the traced figures stay beside.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from perfcast.graph.model import Graph
from perfcast.real import (
    OFF,
    Correction,
    ProfilerCost,
    ProfilerSettings,
    Removed,
    StepEstimate,
    default_cost,
    estimate,
    measured_real_steps,
    remove_profiler_cost,
)
from perfcast.sim.timeline import Timeline, simulate

FIT_MAX_SCALE = 8.0  # a fit may scale the base costs up to this much
# A fit at its bound that leaves the step longer than measured by more than this says so.
FIT_BOUND_GAP = 0.05
FIT_MIN_RESPONSE = 0.01  # a step moving less than this over the whole range does not fit
# The profiler never makes a step faster: unprofiled steps measured more than this much
# slower than the traced ones were disturbed (6 of the 36 H200 traces: 15-25% slower, with
# the same configuration's other rows measured below the traced step), and are set aside.
FIT_CONTRADICTION = 0.05


@dataclass
class RealWorld:
    traced_graph: Graph  # the graph of the trace, profiler cost included
    graph: Graph  # the same, the profiler's cost taken out (== traced_graph when off)
    traced: Timeline
    real: Timeline
    cost: ProfilerCost
    settings: ProfilerSettings
    removed: Removed
    correction: Correction
    steps: list[StepEstimate]

    @property
    def measured_real_ms(self) -> float | None:
        """Mean of the unprofiled steps the trace carries (over its ranks), if any."""
        measured = [s.measured_real_ms for s in self.steps if s.measured_real_ms is not None]
        return float(np.mean(measured)) if measured else None


def real_world(
    graph: Graph,
    correct: bool = True,
    calibration: ProfilerCost | None = None,
    traced: Timeline | None = None,
    fit: bool = True,
) -> RealWorld:
    """The traced and the corrected graph of a trace, replayed (see module docstring).

    `fit=False` ignores the unprofiled steps the trace carries when choosing the cost (they
    are still reported): a held-out check of the calibration or default against them."""
    table = graph.table
    settings = (
        ProfilerSettings.of(table)
        if table is not None
        else ProfilerSettings(False, False, False, False)
    )
    traced = traced if traced is not None else simulate(graph)
    measured = measured_real_steps(table) if table is not None else {}
    if not correct:
        cost = OFF
    else:
        unused = ""
        if calibration is None and table is not None:
            calibration, unused = calibrated_cost(table, settings)
        cost = calibration if calibration is not None else default_cost(settings)
        if unused and calibration is None:
            # A calibration exists but is not this machine's: the default says why.
            cost = replace(cost, note="; ".join(x for x in (cost.note, unused) if x))
        if measured and fit:
            cost = _fit(graph, cost, measured)
    if cost.is_off:
        corrected, removed, real = graph, Removed(0), traced
    else:
        corrected, removed = remove_profiler_cost(graph, cost)
        real = simulate(corrected)
    steps = [
        StepEstimate(
            rank=r,
            name=n,
            traced_ms=t / 1e6,
            real_ms=s / 1e6,
            measured_real_ms=measured.get(r),
            source=cost.source,
        )
        for (r, n, t, _), (_, _, _, s) in zip(traced.iteration_ns(), real.iteration_ns())
    ]
    correction = Correction.of(cost, settings, removed, len(graph.iterations))
    if corrected is not graph:
        corrected.assumptions.append(correction.assumption())
    return RealWorld(graph, corrected, traced, real, cost, settings, removed, correction, steps)


def calibrated_cost(table: object, settings: ProfilerSettings) -> tuple[ProfilerCost | None, str]:
    """The profiler costs `perfcast calibrate` measured, when the trace comes from that
    machine (runtime calls: the default when the calibration had no GPU); else None and,
    when a calibration exists, why it is not used."""
    from perfcast import calibration

    cal, fits, sentence = calibration.matches_trace(table)
    if cal is None:
        return None, sentence  # a calibration of another host says so; none says nothing
    if cal.profiler is None:
        return None, f"{cal.source()}: it holds no profiler costs (calibrate measures them)"
    if not fits:
        return None, (
            f"{sentence}; so it is not used for the profiler's costs, which are per machine"
        )
    p = cal.profiler
    base = default_cost(settings)
    share = p.work_share if p.work_share is not None else estimate.CALIBRATION_WORK_SHARE
    cost = ProfilerCost(
        op_ns=p.op_ns if settings.record_shapes else p.op_no_shapes_ns,
        input_ns=p.input_ns if settings.record_shapes else 0.0,
        runtime_ns=p.runtime_ns if p.runtime_ns is not None else base.runtime_ns,
        python_ns=p.python_ns if (settings.with_stack or settings.with_modules) else 0.0,
        memory_ns=p.memory_ns if settings.profile_memory else 0.0,
        task_ns=base.task_ns,
        work_share=share,
        source="calibration",
        uncertainty=0.2,
        note=sentence
        + ("" if p.runtime_ns is not None else "; runtime calls at the default (no GPU then)")
        + (f"; its costs look disturbed ({p.noisy()}: a busy machine?)" if p.noisy() else "")
        + f"; the ops' own work {100 * share:.1f}% slower traced, measured "
        + (
            "by calibrate on a reference training step"
            if p.work_share is not None
            else "on the project's CPU machine (this calibration predates that measurement)"
        ),
    )
    return cost, ""


def _rank_steps(graph: Graph) -> dict[int, float]:
    out: dict[int, list[float]] = {}
    for rank, _, _, sim in simulate(graph).iteration_ns():
        out.setdefault(rank, []).append(sim / 1e6)
    return {r: float(np.mean(v)) for r, v in out.items()}


def _fit(graph: Graph, base: ProfilerCost, measured: dict[int, float]) -> ProfilerCost:
    """`base` scaled so the corrected replay's mean step matches the measured one.

    Bisection: the step shrinks as the cost grows. When the step does not respond to the
    cost (a GPU-bound step: any correction fits it), the base stays, with a note saying so.
    """

    def error(scale: float) -> float:
        g, _ = remove_profiler_cost(graph, base.scaled(scale))
        steps = _rank_steps(g)
        rel = [(steps[r] - m) / m for r, m in measured.items() if r in steps]
        return float(np.mean(rel)) if rel else 0.0

    lo_err, hi_err = error(0.0), error(FIT_MAX_SCALE)
    # Steps measured slower than the traced ones are no fit's business, whether or not the
    # step responds to the cost: said first.
    if lo_err < -FIT_CONTRADICTION:
        slower = -lo_err / (1 + lo_err)
        aside = (
            f"the unprofiled steps the trace carries ran {slower:.0%} slower than the traced "
            "ones, which the profiler cannot cause: they are set aside"
        )
        return replace(base, note="; ".join(x for x in (base.note, aside) if x))
    if lo_err - hi_err < FIT_MIN_RESPONSE:
        # Said, so that a trace carrying measured steps does not fall back in silence.
        aside = (
            "the unprofiled steps the trace carries were not fitted: the replayed step moves "
            f"less than {FIT_MIN_RESPONSE:.0%} over the whole range of the profiler's cost "
            f"(x0 to x{FIT_MAX_SCALE:g}), so any cost fits them"
        )
        return replace(base, note="; ".join(x for x in (base.note, aside) if x))
    if lo_err <= 0:
        return replace(
            base.scaled(0.0),
            source="fit",
            uncertainty=0.0,
            note="the unprofiled step measured no faster than the traced one: nothing is taken out",
        )
    lo, hi = 0.0, FIT_MAX_SCALE
    if hi_err > FIT_BOUND_GAP:
        # Even the most the fit allows leaves the step longer than measured: say so, and
        # carry the gap as the estimate's uncertainty rather than a fit's 5%.
        return replace(
            base.scaled(FIT_MAX_SCALE),
            source="fit",
            uncertainty=max(0.05, hi_err),
            note=f"the {base.source} costs x{FIT_MAX_SCALE:.2f}, the most the fit allows, still "
            f"leave the step {hi_err:.0%} longer than the unprofiled steps the trace carries: "
            "the traced and unprofiled steps differ by more than the profiler's cost explains",
        )
    if hi_err > 0:  # the bound leaves the step within FIT_BOUND_GAP of it: a fit
        scale = FIT_MAX_SCALE
    else:
        for _ in range(16):
            mid = (lo + hi) / 2
            if error(mid) > 0:
                lo = mid
            else:
                hi = mid
        scale = (lo + hi) / 2
    return replace(
        base.scaled(scale),
        source="fit",
        uncertainty=0.05,
        note=f"the {base.source} costs x{scale:.2f}, fitted to the unprofiled steps the trace "
        "carries",
    )
