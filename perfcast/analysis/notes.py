"""What every result should say about its input: salvaged data, missing steps, warnings."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from perfcast.events import EventTable, Kind, RankInfo
from perfcast.graph.model import Graph, NodeKind

if TYPE_CHECKING:
    from perfcast.real import StepEstimate

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
        notes.append(
            f"{_DAMAGE_PREFIX.get(info.damage or '', 'damaged trace')}: {info.salvage_note}"
        )
    if not info.has_steps:
        notes.append(_no_steps(info))
    return notes


def no_gpu_work(table: EventTable | None) -> str:
    """Why a trace holds no GPU work, in words: a CPU-only job, or a GPU run whose file lost
    its GPU side to a cut or damage (Kineto writes GPU events after the CPU ops, so a cut
    file often keeps none; calling that CPU-only sent users looking for the wrong fault)."""
    damaged = [i for i in table.ranks if i.truncated] if table is not None else []
    gpu = next((i.device_name for i in damaged if i.device_name), None)
    launches = table is not None and bool((table.kind == Kind.RUNTIME).any())
    if not damaged or not (gpu or launches):
        # A damaged file with no sign of a GPU (no device named, no runtime call) is no
        # evidence of a lost GPU side: a cut CPU-only trace stays CPU-only.
        return "the trace has no GPU work (CPU-only)"
    run = f"this {gpu} run's" if gpu else "this"
    return (
        f"no GPU work survived in {run} damaged or cut-off file (Kineto writes the GPU events "
        "after the CPU ops; a complete trace of the run has them)"
    )


# How a salvage note is introduced, by what the loss came from (RankInfo.damage): only a file
# that ends early is "truncated".
_DAMAGE_PREFIX = {
    "cut": "truncated trace",
    "corrupt": "damaged trace",
    "invalid": "invalid values in the trace",
    "damaged": "damaged trace",
}


def _no_steps(info: RankInfo) -> str:
    """Why a rank is one window, not steps."""
    if info.untimed_steps:
        return (
            "no ProfilerStep#N with a duration in this trace (those written lack 'dur'): "
            "the whole trace is one window"
        )
    if info.truncated:
        # Whether the lost part held steps is unknown: not "the trace has none".
        lost = {"cut": "the cut", "invalid": "the skipped events (NaN or Infinity)"}.get(
            info.damage or "", "the damage"
        )
        return (
            f"no ProfilerStep#N in what survived {lost}: what was read is analysed as one "
            "window, not as training steps"
        )
    return "no ProfilerStep#N in this trace: the whole trace is one window"


def input_notes(table: EventTable) -> list[str]:
    """Notes for all ranks, each prefixed with its rank when there are several; notes about
    the whole folder (kept on its first rank) first and unprefixed: "rank 0: 1 file of the
    folder is empty" named the wrong culprit."""
    many = len(table.ranks) > 1
    folder = [note for info in table.ranks for note in info.folder_notes]
    return folder + [
        f"rank {info.rank}: {note}" if many else note
        for info in table.ranks
        for note in rank_notes(info)
        if note not in info.folder_notes
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


# The first step is said to stand out when it is this much above or below the others' median.
FIRST_STEP_OFF = 0.15


def slowest_per_step(values: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Per step name, in first-seen order, the largest of its ranks' values: the slowest
    rank sets each step, as the mean step has it."""
    out: dict[str, float] = {}
    for name, v in values:
        out[name] = max(out.get(name, v), v)
    return out


def first_step_note(steps: list[StepEstimate], table: EventTable | None = None) -> list[str]:
    """Say so when the trace's first step (the slowest rank setting each step, as the mean
    has it) stands out from the others: it pays what ran before the trace (a warm-up, GPU
    work still queued from an untraced step), and the mean step every what-if scales
    includes it. The traced figures are given beside: the same gap as traced says the run
    was slow there, not the estimate without the profiler. Steps a cut file may have lost
    the end of (`table`'s ranks say which) are no measure of the others: a cut 99% into
    the MI300X ResNet trace read its last step 5 ms against 19 and flagged the first."""
    cut = {n for r in table.ranks for n in r.cut_steps} if table is not None else set()
    steps = [e for e in steps if e.name not in cut]
    real = slowest_per_step((e.name, e.real_ms) for e in steps)
    traced = slowest_per_step((e.name, e.traced_ms) for e in steps)
    if len(real) < 2:
        return []
    names = list(real)
    first, others = real[names[0]], [real[n] for n in names[1:]]
    median = float(np.median(others))
    if median <= 0 or abs(first - median) < FIRST_STEP_OFF * median:
        return []
    traced_median = float(np.median([traced[n] for n in names[1:]]))
    return [
        f"the first step ({names[0]}) took {first:,.2f} ms without the profiler against a "
        f"median {median:,.2f} ms for the other {len(others)} ({traced[names[0]]:,.2f} "
        f"against {traced_median:,.2f} ms as traced): a trace's first step pays what ran "
        "before it (a warm-up, GPU work still queued); the mean step, which the what-ifs "
        f"scale, includes it ({float(np.mean([first, *others])):,.2f} ms; "
        f"{float(np.mean(others)):,.2f} over the others)"
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
