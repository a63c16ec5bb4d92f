"""`perfcast replay`: does the simulator reproduce what the trace measured?"""

from __future__ import annotations

from dataclasses import dataclass, field

from perfcast.analysis.critical_path import CriticalPath, critical_paths
from perfcast.analysis.notes import input_notes
from perfcast.sim.timeline import Timeline


@dataclass
class IterationReplay:
    name: str
    measured_ms: float
    simulated_ms: float
    error_pct: float


@dataclass
class RankReplay:
    rank: int
    device: str | None
    iterations: list[IterationReplay]


@dataclass
class CriticalPathSummary:
    rank: int
    iteration: str
    total_ms: float
    by_category_ms: dict[str, float]
    top_items: list[tuple[str, str, float]]


@dataclass
class ReplayResult:
    ranks: list[RankReplay]
    unresolved_dependencies: int
    unresolved_by_kind: dict[str, int]
    nodes: int
    max_abs_error_pct: float
    critical_paths: list[CriticalPathSummary]
    assumptions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # about the input (salvage, no steps)


def replay_result(tl: Timeline, with_critical_path: bool = True) -> ReplayResult:
    g = tl.graph
    by_rank: dict[int, list[IterationReplay]] = {}
    worst = 0.0
    for rank, name, measured, sim in tl.iteration_ns():
        err = 100.0 * (sim - measured) / measured if measured else 0.0
        worst = max(worst, abs(err))
        by_rank.setdefault(rank, []).append(IterationReplay(name, measured / 1e6, sim / 1e6, err))
    paths: list[CriticalPath] = critical_paths(tl) if with_critical_path else []
    return ReplayResult(
        ranks=[
            RankReplay(rank=r, device=g.device_names.get(r), iterations=its)
            for r, its in sorted(by_rank.items())
        ],
        unresolved_dependencies=int(sum(g.unresolved.values())),
        unresolved_by_kind=dict(g.unresolved),
        nodes=int(g.alive.sum()),
        max_abs_error_pct=worst,
        critical_paths=[
            CriticalPathSummary(p.rank, p.iteration, p.total_ms, p.by_category_ms, p.top_items)
            for p in paths
        ],
        assumptions=list(g.assumptions),
        notes=input_notes(g.table) if g.table is not None else [],
    )
