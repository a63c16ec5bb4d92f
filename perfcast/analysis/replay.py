"""`perfcast replay`: does the simulator reproduce what the trace measured?"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from perfcast.analysis.critical_path import CriticalPath, critical_paths
from perfcast.analysis.notes import first_step_note, input_notes
from perfcast.analysis.real_step import RealWorld
from perfcast.frames import Columns, Tables, dicts_to_columns, field_kinds
from perfcast.graph.model import Graph
from perfcast.real import Correction
from perfcast.sim.timeline import Timeline


@dataclass
class IterationReplay:
    """One step of one rank: as traced and as replayed (ms), their difference in % of the
    traced step, and the step without the profiler (ms; None with `correct=False`)."""

    name: str
    measured_ms: float  # as traced
    simulated_ms: float  # the replay of the trace
    error_pct: float
    real_ms: float | None = None  # estimated without the profiler (None: correction off)
    measured_real_ms: float | None = None  # measured without the profiler, if the trace says
    source: str | None = None  # where the profiler-cost correction came from
    # The same as measured_ms, under the name every --json result uses for the traced step.
    traced_ms: float = field(init=False)

    def __post_init__(self) -> None:
        self.traced_ms = self.measured_ms


@dataclass
class RankReplay:
    """One rank's replayed steps, and its device as the trace names it."""

    rank: int
    device: str | None  # as the trace names it (summary's and the report's device)
    iterations: list[IterationReplay]
    # The part of perfcast's device table the name was read as (its figures the models'),
    # e.g. "A100-SXM4-40GB" for "NVIDIA A100-PG509-200"; None when unknown.
    device_model: str | None = None


@dataclass
class CriticalPathSummary:
    """A step's critical path: its length and ms per category (cpu, launch, gpu compute,
    ...), its longest items (category, name, ms) and the bottleneck they name."""

    rank: int
    iteration: str
    total_ms: float
    by_category_ms: dict[str, float]
    top_items: list[tuple[str, str, float]]
    bottleneck: str = ""


@dataclass(repr=False)
class ReplayResult(Tables):
    """The replay against the trace. Tables (`to_pandas(name)`): steps (one row per rank and
    step), critical_path (one row per rank, step and category of the path)."""

    RENDERER: ClassVar[tuple[str, str]] = ("perfcast.report.terminal", "render_replay")

    ranks: list[RankReplay]
    unresolved_dependencies: int
    unresolved_by_kind: dict[str, int]
    nodes: int
    max_abs_error_pct: float
    critical_paths: list[CriticalPathSummary]
    correction: Correction | None = None
    assumptions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # about the input (salvage, no steps)

    def _tables(self) -> dict[str, Columns]:
        keys = ("traced_ms", "simulated_ms", "error_pct", "real_ms", "measured_real_ms", "source")
        steps = [
            {"rank": rr.rank, "step": it.name, **{k: getattr(it, k) for k in keys}}
            for rr in self.ranks
            for it in rr.iterations
        ]
        path = [
            {
                "rank": cp.rank,
                "step": cp.iteration,
                "bottleneck": cp.bottleneck,
                "category": cat,
                "ms": ms,
            }
            for cp in self.critical_paths
            for cat, ms in cp.by_category_ms.items()
        ]
        return {
            "steps": dicts_to_columns(
                steps,
                ("rank", "step", *keys),
                {"rank": "int", "step": "str"}
                | {k: kind for k, kind in field_kinds(IterationReplay).items() if k in keys},
            ),
            "critical_path": dicts_to_columns(
                path,
                ("rank", "step", "bottleneck", "category", "ms"),
                {"rank": "int", "step": "str", "bottleneck": "str", "category": "str"}
                | {"ms": "float"},
            ),
        }


def replay_result(
    tl: Timeline, world: RealWorld | None = None, with_critical_path: bool = True
) -> ReplayResult:
    """How the replay of `tl` (the trace's own graph) matches the trace; with `world`, each step
    also carries its estimate without the profiler, and the critical paths (and the bottleneck
    they name) are those of the run without the profiler."""
    g = tl.graph
    by_rank: dict[int, list[IterationReplay]] = {}
    worst = 0.0
    estimates = world.steps if world is not None else [None] * len(tl.iteration_ns())
    for (rank, name, measured, sim), est in zip(tl.iteration_ns(), estimates):
        err = 100.0 * (sim - measured) / measured if measured else 0.0
        worst = max(worst, abs(err))
        it = IterationReplay(name, measured / 1e6, sim / 1e6, err)
        if est is not None:
            it.measured_real_ms, it.source = est.measured_real_ms, est.source
            # With the correction off the "estimate" is the traced step: none, as summary,
            # diff and the report give none (the JSON and DataFrames read it as one).
            it.real_ms = None if world is not None and world.cost.is_off else est.real_ms
        by_rank.setdefault(rank, []).append(it)
    path_tl = world.real if world is not None else tl
    paths: list[CriticalPath] = critical_paths(path_tl) if with_critical_path else []
    return ReplayResult(
        ranks=[
            RankReplay(
                rank=r,
                device=_traced_device(g, r),
                iterations=its,
                device_model=g.device_names.get(r),
            )
            for r, its in sorted(by_rank.items())
        ],
        unresolved_dependencies=int(sum(g.unresolved.values())),
        unresolved_by_kind=dict(g.unresolved),
        nodes=int(g.alive.sum()),
        max_abs_error_pct=worst,
        critical_paths=[
            CriticalPathSummary(
                p.rank, p.iteration, p.total_ms, p.by_category_ms, p.top_items, p.bottleneck
            )
            for p in paths
        ],
        correction=world.correction if world is not None else None,
        assumptions=list(g.assumptions),
        notes=(input_notes(g.table) if g.table is not None else [])
        + (first_step_note(world.steps, g.table) if world is not None else []),
    )


def _traced_device(graph: Graph, rank: int) -> str | None:
    """The device name rank's trace records (what summary shows), or the table's match."""
    table = graph.table
    try:
        name = table.rank_info(rank).device_name if table is not None else None
    except KeyError:  # a rank the graph has and the table not: none so far
        name = None
    return name or graph.device_names.get(rank)
