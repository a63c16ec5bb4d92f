"""The whole battery of trace analyses in one call: `analyze(table)` (`perfcast analyze`).

Each analysis is a pure function of the EventTable in its own module; this one only runs the
chosen ones and keeps their results side by side, JSON-serializable and tabular.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from perfcast.analysis.catalog import TITLES
from perfcast.analysis.comms import Collectives, collectives
from perfcast.analysis.counters import GpuCounters, gpu_counters
from perfcast.analysis.idle import IdleTime, idle_time
from perfcast.analysis.kernels import KernelBreakdown, kernel_breakdown
from perfcast.analysis.launch_queue import LaunchQueue, launch_queue
from perfcast.analysis.launches import LaunchStats, launch_stats
from perfcast.analysis.memory import Memory, memory
from perfcast.analysis.notes import input_notes, no_gpu_work
from perfcast.analysis.op_kernels import OpKernelResult, op_kernels
from perfcast.analysis.roofline import Roofline, roofline
from perfcast.analysis.scopes import Scopes, scopes
from perfcast.analysis.stragglers import Stragglers, stragglers
from perfcast.errors import OptionError
from perfcast.events import EventTable
from perfcast.frames import Tables, result_tables, scalar_columns

# name -> (function(table, top) -> result, one-line title). Order is the report's order.
_RUN: dict[str, Callable[[EventTable, int], Any]] = {
    "kernels": lambda t, top: kernel_breakdown(t, top=top),
    "idle": lambda t, top: idle_time(t),
    "launches": lambda t, top: launch_stats(t, top=top),
    "queue": lambda t, top: launch_queue(t),
    "memory": lambda t, top: memory(t),
    "stragglers": lambda t, top: stragglers(t, top=top),
    "collectives": lambda t, top: collectives(t),
    "roofline": lambda t, top: roofline(t, top=top),
    "scopes": lambda t, top: scopes(t, top=top),
    "ops": lambda t, top: op_kernels(t, top=top),
    "counters": lambda t, top: gpu_counters(t, top=top),
}
ANALYSES: dict[str, tuple[Callable[[EventTable, int], Any], str]] = {
    name: (_RUN[name], title) for name, title in TITLES.items()
}


@dataclass(repr=False)
class Analyses(Tables):
    """Results of `analyze`; an analysis not run is None. Every table of every result is
    named `analysis.table`, as `--csv` names its files: `a.to_pandas("idle.by_stream")`."""

    RENDERER: ClassVar[tuple[str, str]] = ("perfcast.report.analyses_terminal", "render_analyses")

    kernels: KernelBreakdown | None = None
    idle: IdleTime | None = None
    launches: LaunchStats | None = None
    queue: LaunchQueue | None = None
    memory: Memory | None = None
    stragglers: Stragglers | None = None
    collectives: Collectives | None = None
    roofline: Roofline | None = None
    scopes: Scopes | None = None
    ops: OpKernelResult | None = None
    counters: GpuCounters | None = None
    ranks: list[int] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def results(self) -> dict[str, Any]:
        """The results that were computed, by analysis name."""
        return {name: getattr(self, name) for name in ANALYSES if getattr(self, name) is not None}

    def tables(self) -> dict[str, dict[str, Any]]:
        """Every table of every result, named `analysis.table` (as `--csv` writes them), and
        each result's own figures (stragglers' candidates, ...) as `analysis.figures`."""
        out: dict[str, dict[str, Any]] = {}
        for name, res in self.results().items():
            for tname, cols in result_tables(res).items():
                out[f"{name}.{tname}"] = cols
            figures = scalar_columns(res)
            if figures is not None and f"{name}.figures" not in out:
                out[f"{name}.figures"] = figures
        return out

    def _tables(self) -> dict[str, dict[str, Any]]:
        return self.tables()

    def __repr__(self) -> str:
        return f"Analyses({', '.join(repr(r) for r in self.results().values())})"


def parse_only(only: str | list[str] | None) -> list[str]:
    """Analysis names from "a,b" or a list; every analysis when None."""
    if only is None:
        return list(ANALYSES)
    items = only.split(",") if isinstance(only, str) else list(only)
    names = [s.strip() for s in items if s.strip()]
    if not names:  # `--only ""` asked for some and named none: not a request for all
        raise OptionError(
            f"only={only!r} names no analysis", hint=f"choose from {', '.join(ANALYSES)}"
        )
    unknown = [n for n in names if n not in ANALYSES]
    if unknown:
        raise OptionError(
            f"unknown analysis {unknown[0]!r}", hint=f"choose from {', '.join(ANALYSES)}"
        )
    return names


def analyze(table: EventTable, only: str | list[str] | None = None, top: int = 10) -> Analyses:
    """Run the chosen analyses (all by default) on every rank of `table`.

    >>> import perfcast
    >>> a = analyze(perfcast.load("perfcast/examples/ddp_a100_rank0.json.gz"), only="idle")
    >>> a.idle.by_stream[0].idle_ms >= 0                               # doctest: +SKIP
    True
    """
    out = Analyses(
        ranks=table.rank_ids(), files=[r.path for r in table.ranks], notes=input_notes(table)
    )
    for name in parse_only(only):
        fn, _ = ANALYSES[name]
        res = fn(table, top)
        res.notes = [n for n in res.notes if n not in out.notes]  # input notes once, at the top
        setattr(out, name, said_when_empty(table, res))
    return out


class _HasNotes(Protocol):
    notes: list[str]


_R = TypeVar("_R", bound=_HasNotes)


def said_when_empty(table: EventTable, result: _R) -> _R:
    """`result`, with a note saying why when none of its tables has a row and nothing else
    says so (a CPU-only trace printed nothing at all)."""
    if not result.notes and _all_empty(result):
        result.notes.append(
            f"nothing to report: {no_gpu_work(table)}"
            if not table.is_gpu().any()
            else "nothing to report for this trace"
        )
    return result


def _all_empty(result: object) -> bool:
    """Every table of an analysis' result without a row."""
    from perfcast.frames import result_tables

    tables = result_tables(result)
    return bool(tables) and all(
        not any(len(col) for col in cols.values()) for cols in tables.values()
    )
