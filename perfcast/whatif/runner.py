"""Apply optimization models in order, replay, and compare with the baseline replay."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from perfcast.analysis.critical_path import critical_paths
from perfcast.analysis.notes import input_notes
from perfcast.errors import PerfcastError
from perfcast.events import EventTable
from perfcast.graph.build import build_graph
from perfcast.graph.model import Graph, Source
from perfcast.sim.timeline import Timeline, simulate
from perfcast.whatif.registry import Spec, build_options, get_model


@dataclass
class AppliedModel:
    name: str
    options: dict[str, object]
    assumptions: list[str]


@dataclass
class IterationPrediction:
    rank: int
    name: str
    measured_ms: float
    baseline_ms: float
    predicted_ms: float


@dataclass
class WhatIfResult:
    baseline_ms: float  # mean simulated step time of the unmodified trace
    predicted_ms: float  # mean simulated step time after the optimizations
    speedup: float
    measured_ms: float  # mean step time the trace measured
    iterations: list[IterationPrediction]
    applied: list[AppliedModel]
    measured_share: float  # share of the predicted critical path with measured durations
    assumptions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # about the input (salvage, no steps)


def step_ms(tl: Timeline) -> tuple[float, float, list[tuple[int, str, float, float]]]:
    """(mean measured, mean simulated, per-iteration rows): the slowest rank sets each step."""
    rows = [(r, n, m / 1e6, s / 1e6) for r, n, m, s in tl.iteration_ns()]
    by_name: dict[str, list[tuple[float, float]]] = {}
    for _, name, m, s in rows:
        by_name.setdefault(name, []).append((m, s))
    if not by_name:
        return 0.0, 0.0, rows
    measured = float(np.mean([max(m for m, _ in v) for v in by_name.values()]))
    simulated = float(np.mean([max(s for _, s in v) for v in by_name.values()]))
    return measured, simulated, rows


def measured_share(tl: Timeline) -> float:
    """Fraction of the critical paths' time spent in nodes with measured durations."""
    src = tl.graph.cols["source"]
    total = 0
    measured = 0
    for cp in critical_paths(tl, keep_steps=False):
        total += int(cp.path_ns.sum())
        measured += int(cp.path_ns[src[cp.path_nodes] == Source.MEASURED].sum())
    return measured / total if total else 1.0


def apply_specs(graph: Graph, specs: list[Spec]) -> tuple[Graph, list[AppliedModel]]:
    g = graph
    applied = []
    for spec in specs:
        module = get_model(spec.name)
        options = build_options(spec.name, spec.options)
        before = len(g.assumptions)
        try:
            g = module.apply(g.copy(), options)
        except re.error as exc:  # a pattern option (pattern=, module=, op=) the user wrote
            raise PerfcastError(
                f"{spec}: an option is not a valid regular expression ({exc})"
            ) from None
        applied.append(AppliedModel(spec.name, dict(vars(options)), g.assumptions[before:]))
    return g, applied


def run_whatif(
    table: EventTable,
    specs: list[Spec],
    graph: Graph | None = None,
    baseline: Timeline | None = None,
) -> tuple[WhatIfResult, Timeline, Timeline]:
    graph = graph if graph is not None else build_graph(table)
    baseline = baseline if baseline is not None else simulate(graph)
    new_graph, applied = apply_specs(graph, specs)
    predicted = simulate(new_graph)
    m, b, base_rows = step_ms(baseline)
    _, p, pred_rows = step_ms(predicted)
    iterations = [
        IterationPrediction(rank=r, name=n, measured_ms=mm, baseline_ms=bs, predicted_ms=ps)
        for (r, n, mm, bs), (_, _, _, ps) in zip(base_rows, pred_rows)
    ]
    result = WhatIfResult(
        baseline_ms=b,
        predicted_ms=p,
        speedup=b / p if p > 0 else float("inf"),
        measured_ms=m,
        iterations=iterations,
        applied=applied,
        measured_share=measured_share(predicted),
        assumptions=list(graph.assumptions),
        notes=input_notes(table),
    )
    return result, baseline, predicted
