"""The Python API for notebooks and scripts.

import perfcast
table = perfcast.load("traces/")                       # EventTable
perfcast.summary(table)                                # where the time goes
perfcast.replay(table).max_abs_error_pct               # does the replay match?
r = perfcast.predict(table, apply=["amp", "cuda-graphs"])
r.baseline_ms, r.predicted_ms, r.speedup
perfcast.advise(table).suggestions[0]
perfcast.tree(table).incl["gpu_ns"][0]                # GPU time per call path (node 0: all)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from perfcast.events import EventTable
from perfcast.ingest import load

if TYPE_CHECKING:
    from perfcast.advisor.advisor import Advice
    from perfcast.analysis.context import ContextTree
    from perfcast.analysis.replay import ReplayResult
    from perfcast.analysis.summary import Summary
    from perfcast.whatif.runner import WhatIfResult

TraceLike = EventTable | str | os.PathLike[str]


def _table(trace: TraceLike) -> EventTable:
    return trace if isinstance(trace, EventTable) else load(trace)


def summary(trace: TraceLike, top: int = 10) -> Summary:
    from perfcast.analysis.summary import summarize

    return summarize(_table(trace), top=top)


def replay(trace: TraceLike) -> ReplayResult:
    from perfcast.analysis.replay import replay_result
    from perfcast.graph import build_graph
    from perfcast.sim import simulate

    return replay_result(simulate(build_graph(_table(trace))))


def predict(trace: TraceLike, apply: list[str] | str) -> WhatIfResult:
    """Predicted step time after the optimizations in `apply` (composed in order).

    Each item is `NAME[:key=value,...]`, e.g. "fused-optimizer:kind=foreach".
    """
    from perfcast.whatif.registry import parse_spec
    from perfcast.whatif.runner import run_whatif

    specs = [parse_spec(s) for s in ([apply] if isinstance(apply, str) else apply)]
    result, _, _ = run_whatif(_table(trace), specs)
    return result


def advise(trace: TraceLike, device: str | None = None) -> Advice:
    from perfcast.advisor.advisor import advise as _advise

    return _advise(_table(trace), target_device=device)


def tree(
    trace: TraceLike,
    rank: int | None = None,
    phase: str | None = None,
    step: str | int | None = None,
) -> ContextTree:
    """The calling-context tree: GPU and CPU time (and calls, launches, kernels, FLOPs,
    bytes) per call path, from the Python frames through modules and ops to the kernels.

    `tree.index` holds the nodes (`parent`, `label`/`labels`, `kind`; node 0 is the root),
    `tree.incl` / `tree.excl` the inclusive and exclusive values per node, and
    `tree.coverage` how much GPU time reached a Python frame. Filter by rank, phase
    ("forward", "backward", "optimizer", ...) or step ("ProfilerStep#3" or 3).
    """
    from perfcast.analysis.context import context_tree

    return context_tree(_table(trace), rank=rank, phase=phase, step=step)
