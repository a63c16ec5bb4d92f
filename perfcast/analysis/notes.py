"""What every result should say about its input: salvaged data, missing steps, warnings."""

from __future__ import annotations

import numpy as np

from perfcast.events import EventTable, Kind, RankInfo
from perfcast.graph.model import Graph, NodeKind

# A runtime call or launch whose own host time reaches this is not per-kernel dispatch cost
# but work a steady-state step does not repeat, or not per kernel: lazy CUDA initialization
# (seconds), module loading on a kernel's first launch, large allocations, pageable copies.
# Steady-state launches on the shared traces take 1-7 µs (median launch durations, 36 traces).
ONE_TIME_NS = 5_000_000
# The note is given when such calls hold this share of the steps' time.
ONE_TIME_NOTE_SHARE = 0.10


def rank_notes(info: RankInfo) -> list[str]:
    notes = list(info.warnings)
    if info.truncated:
        notes.append(f"truncated trace: {info.salvage_note}")
    if not info.has_steps:
        notes.append("no ProfilerStep#N in this trace: the whole trace is one window")
    return notes


def input_notes(table: EventTable) -> list[str]:
    """Notes for all ranks, each prefixed with its rank when there are several."""
    many = len(table.ranks) > 1
    return [
        f"rank {info.rank}: {note}" if many else note
        for info in table.ranks
        for note in rank_notes(info)
    ]


def one_time_calls(graph: Graph) -> np.ndarray:
    """Runtime calls and launches inside the steps whose own time as traced is at least
    ONE_TIME_NS (as traced: a what-if that sped the host up must not turn lazy
    initialisation into launch cost for the next one to remove)."""
    c = graph.cols
    return np.flatnonzero(
        np.isin(c["kind"], [NodeKind.RUNTIME, NodeKind.LAUNCH])
        & (c["iteration"] >= 0)
        & graph.alive
        & (c["dur_measured"] >= ONE_TIME_NS)
    )


def graph_notes(graph: Graph, step_ns: float) -> list[str]:
    """Notes about what the steps hold (`step_ns`: the steps' summed time, all ranks)."""
    calls = one_time_calls(graph)
    if calls.size == 0:
        return []
    durs = graph.cols["dur"][calls]
    total = float(durs.sum())
    if step_ns <= 0 or total < ONE_TIME_NOTE_SHARE * step_ns:
        return []
    longest = int(calls[int(np.argmax(durs))])
    return [
        f"{total / 1e6:,.1f} ms of the steps ({total / step_ns:.0%}) is {calls.size:,} runtime "
        f"call(s) of {ONE_TIME_NS / 1e6:g} ms or more (longest: {graph.name_of(longest)}, "
        f"{float(durs.max()) / 1e6:,.1f} ms): lazy initialization, module loading, allocation "
        "or pageable copies, not per-step launch cost; if these are a job's first steps, "
        "profile after a warm-up (torch.profiler.schedule(wait=1, warmup=1, active=3)) for "
        "steady-state predictions"
    ]


def refuse_counter_trace(table: EventTable, command: str) -> None:
    """Predictions from a CUPTI range-profiler trace (counters, no kernel times) are refused:
    its kernels were replayed once per counter pass inside their launch calls, so neither
    the GPU's nor the host's time is the real run's."""
    from perfcast.errors import NotApplicableError

    if (table.kind == Kind.GPU_COUNTERS).any() and not (table.kind == Kind.KERNEL).any():
        raise NotApplicableError(
            f"{command} needs kernel times, and this trace was recorded by CUPTI's range "
            "profiler (profiler_metrics): its kernels were replayed for counters inside their "
            "launch calls, not timed",
            hint="record another trace without profiler_metrics for predictions; "
            "`perfcast analyze --only counters` (perfcast.gpu_counters()) shows these counters",
        )
