"""The Python API for notebooks and scripts.

import perfcast
table = perfcast.load("traces/")                       # EventTable
perfcast.summary(table)                                # where the time goes
perfcast.replay(table).max_abs_error_pct               # does the replay match?
r = perfcast.predict(table, apply=["amp", "cuda-graphs"])  # or perfcast.whatif(...)
r.baseline_ms, r.predicted_ms, r.speedup
perfcast.advise(table).to_pandas()                     # one row per optimization
perfcast.plan(table, gpus=64).to_pandas()              # one row per plan
perfcast.tree(table).to_pandas()                       # one row per call path
print(perfcast.summary(table))                         # as the command line prints it
"""

from __future__ import annotations

import os
from typing import cast

from perfcast.advisor.advisor import Advice
from perfcast.analysis.battery import Analyses, said_when_empty
from perfcast.analysis.comms import Collectives
from perfcast.analysis.context import ContextTree
from perfcast.analysis.counters import GpuCounters
from perfcast.analysis.diff import TraceDiff
from perfcast.analysis.idle import IdleTime
from perfcast.analysis.kernels import KernelBreakdown
from perfcast.analysis.launch_queue import LaunchQueue
from perfcast.analysis.launches import LaunchStats
from perfcast.analysis.memory import Memory
from perfcast.analysis.op_kernels import OpKernelResult
from perfcast.analysis.replay import ReplayResult
from perfcast.analysis.roofline import Roofline
from perfcast.analysis.scopes import Scopes
from perfcast.analysis.stragglers import Stragglers
from perfcast.analysis.summary import Summary
from perfcast.errors import OptionError, PerfcastError, whole_number
from perfcast.events import EventTable
from perfcast.graph.model import Graph
from perfcast.ingest import load
from perfcast.whatif.runner import WhatIfResult

TraceLike = EventTable | str | os.PathLike[str]


def _table(trace: TraceLike, name: str = "trace") -> EventTable:
    """The loaded trace, refused (as the command line refuses it) when it holds no event."""
    if isinstance(trace, EventTable):
        return trace.require_events()
    if not isinstance(trace, (str, os.PathLike)):
        raise OptionError(
            f"{name} must be a path (str or pathlib.Path) or a loaded EventTable, not "
            f"{type(trace).__name__}"
        )
    return load(trace).require_events()


def _flag(name: str, value: object) -> bool:
    """A yes/no argument: True or False (correct="no" read as true, silently)."""
    import numpy as np

    if not isinstance(value, (bool, np.bool_)):
        raise OptionError(f"{name} must be True or False, not {value!r}")
    return bool(value)


def _name_or_none(name: str, value: object) -> None:
    """A name argument (a phase, a link) is a string, or None for the default."""
    if value is not None and not isinstance(value, str):
        raise OptionError(f"{name} must be a name (a string) or None, not {value!r}")


def _strings(value: object) -> bool:
    """One string, or a list or tuple of strings."""
    return isinstance(value, str) or (
        isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value)
    )


def _specs(value: object, name: str, allow_empty: bool = False) -> list[str]:
    """What-if specs given as one string or a list of strings; at least one unless
    `allow_empty`."""
    if not _strings(value):
        raise OptionError(
            f'{name} must be a what-if spec or a list of them (e.g. "amp:dtype=bf16"), '
            f"not {value!r}"
        )
    items = [value] if isinstance(value, str) else list(cast("list[str]", value))
    if not items and not allow_empty:
        from perfcast.whatif.registry import MODEL_MODULES

        raise OptionError(f"{name} is empty: name at least one of {', '.join(MODEL_MODULES)}")
    return items


def summary(trace: TraceLike, top: int = 10, correct: bool = True) -> Summary:
    """Where the time of each step goes, per rank; each step also estimated without the
    profiler (`correct=False` skips that, and the replay it needs).

    >>> perfcast.summary("trace.json.gz").ranks[0].iterations[0].real_ms    # doctest: +SKIP
    """
    from perfcast.analysis.summary import summarize

    top = whole_number("top", top)
    correct = _flag("correct", correct)
    return summarize(_table(trace), top=top, real=correct)


def replay(trace: TraceLike, correct: bool = True) -> ReplayResult:
    """Does the replay reproduce the trace? Each step also carries its estimate without the
    profiler (`correct=False`: none).

    >>> perfcast.replay("trace.json.gz").ranks[0].iterations[0].real_ms   # doctest: +SKIP
    """
    from perfcast.analysis.real_step import real_world
    from perfcast.analysis.replay import replay_result
    from perfcast.graph import build_graph

    correct = _flag("correct", correct)
    world = real_world(build_graph(_table(trace)), correct=correct)
    return replay_result(world.traced, world)


def dependency_graph(trace: TraceLike, correct: bool = True) -> Graph:
    """The dependency graph of a trace, for custom what-ifs with `perfcast.whatif.primitives`
    and `perfcast.sim.simulate`. With `correct` (the default) the profiler's own host cost
    is taken out first, as every prediction does: on a host-bound trace the graph as traced
    can hide any GPU gain behind the profiler's overhead. `correct=False`: as traced.
    Returns a copy, so a custom what-if can change it freely.

    >>> g = perfcast.dependency_graph("trace.json.gz")                       # doctest: +SKIP
    """
    from perfcast.analysis.real_step import real_world
    from perfcast.graph import build_graph

    correct = _flag("correct", correct)
    built = build_graph(_table(trace))
    if not correct:
        return built.copy()
    return real_world(built, correct=True).graph.copy()


def predict(trace: TraceLike, apply: list[str] | str, correct: bool = True) -> WhatIfResult:
    """Predicted step time after the optimizations in `apply`, composed. Code changes apply
    in one fixed order whatever the list's (batch size, fused optimizer, amp, checkpointing,
    sync removal, fusion, torch.compile, then CUDA graphs; DataLoader overlap after every
    other change), as the changed program would run them; `result.applied` lists the order
    used. `perfcast.whatif` is the
    same function, by the command line's name.

    Each item is `NAME[:key=value,...]`, e.g. "fused-optimizer:kind=foreach". The prediction
    is for the run without the profiler (its cost estimated and taken out of the trace; the
    result's `correction` says how); `predicted_traced_ms` keeps the profiler's cost in, and
    `correct=False` predicts the profiled run only. An empty list is the baseline: the
    same result with nothing applied.

    >>> r = perfcast.predict("trace.json.gz", "fused-optimizer:kind=fused")  # doctest: +SKIP
    >>> r.baseline_ms, r.predicted_ms, r.speedup, r.correction.source       # doctest: +SKIP
    """
    from perfcast.whatif.registry import checked_specs
    from perfcast.whatif.runner import run_whatif

    specs = checked_specs(_specs(apply, "apply", allow_empty=True))  # before any load
    correct = _flag("correct", correct)
    result, _, _ = run_whatif(_table(trace), specs, correct=correct)
    return result


def advise(
    trace: TraceLike,
    device: str | None = None,
    correct: bool = True,
    candidates: list[str] | str | None = None,
) -> Advice:
    """Every applicable optimization (or the `candidates` specs), ranked by predicted step
    time without the profiler; gains within a model's measured error are listed unranked.
    An unknown candidate name or option, or an unknown `device`, raises before any work.

    >>> perfcast.advise("trace.json.gz").suggestions[0].name              # doctest: +SKIP
    """
    from perfcast.advisor.advisor import advise as _advise
    from perfcast.whatif.registry import checked_specs

    correct = _flag("correct", correct)
    named = None
    if candidates is not None:
        named = list(dict.fromkeys(_specs(candidates, "candidates")))  # each once
        try:
            checked_specs(named)
        except PerfcastError as e:
            raise OptionError(f"candidates: {e}") from None
    _name_or_none("device", device)
    if device:  # None or "": the trace's own GPU
        from perfcast.whatif.kernels import check_device_name

        check_device_name(device, "device=")
    return _advise(_table(trace), target_device=device, correct=correct, candidates=named)


# ---------------------------------------------------------------------------------------------
# Trace analyses (HTA / TraceLens parity) and trace comparison. Every result has
# `.to_pandas(table)`, `.to_polars(table)`, `.to_arrow(table)` and `.table_names()`.


def analyze(trace: TraceLike, only: str | list[str] | None = None, top: int = 10) -> Analyses:
    """Every trace analysis (or those named in `only`), on every rank.

    >>> import perfcast
    >>> a = perfcast.analyze("traces/", only=["idle", "stragglers"])      # doctest: +SKIP
    >>> a.stragglers.candidates, a.idle.to_pandas("by_stream")            # doctest: +SKIP
    """
    from perfcast.analysis.battery import analyze as _analyze

    top = whole_number("top", top)
    if only is not None and not _strings(only):
        raise OptionError(f"only must be an analysis name or a list of them, not {only!r}")
    return _analyze(_table(trace), only=only, top=top)


def kernel_breakdown(trace: TraceLike, top: int = 10) -> KernelBreakdown:
    """GPU time by kind (computation / communication / memory) and the top kernels per rank.

    >>> perfcast.kernel_breakdown("trace.json.gz").to_pandas("by_kind")    # doctest: +SKIP
    """
    from perfcast.analysis.kernels import kernel_breakdown as fn

    top = whole_number("top", top)
    table = _table(trace)
    return said_when_empty(table, fn(table, top=top))


def idle_time(trace: TraceLike, kernel_gap_ns: int = 30_000) -> IdleTime:
    """GPU idle time per stream: host wait, kernel-to-kernel wait, other.

    >>> perfcast.idle_time("trace.json.gz").by_stream[0].host_wait_ms     # doctest: +SKIP
    """
    from perfcast.analysis.idle import idle_time as fn

    kernel_gap_ns = whole_number("kernel_gap_ns", kernel_gap_ns, minimum=0)
    table = _table(trace)
    return said_when_empty(table, fn(table, kernel_gap_ns=kernel_gap_ns))


def launch_stats(trace: TraceLike, top: int = 20) -> LaunchStats:
    """Launch CPU time, GPU time and launch delay per kernel, op and runtime call; outliers.

    >>> perfcast.launch_stats("trace.json.gz").summary[0].mean_delay_us    # doctest: +SKIP
    """
    from perfcast.analysis.launches import launch_stats as fn

    top = whole_number("top", top)
    table = _table(trace)
    return said_when_empty(table, fn(table, top=top))


def launch_queue(trace: TraceLike, max_depth: int | None = None) -> LaunchQueue:
    """Launch-queue length per stream over time and time blocked on a full queue.

    >>> perfcast.launch_queue("trace.json.gz").by_stream[0].max_length    # doctest: +SKIP
    """
    from perfcast.analysis.launch_queue import launch_queue as fn

    if max_depth is not None:
        max_depth = whole_number("max_depth", max_depth)
    table = _table(trace)
    return said_when_empty(table, fn(table, max_depth=max_depth))


def memory(trace: TraceLike) -> Memory:
    """Allocation timeline (peak, per step, per phase) and memcpy/memset bandwidth.

    >>> max(a.peak_mb for a in perfcast.memory("trace.json.gz").allocators)  # doctest: +SKIP
    """
    from perfcast.analysis.memory import memory as fn

    table = _table(trace)
    return said_when_empty(table, fn(table))


def stragglers(trace: TraceLike, candidates: int = 2) -> Stragglers:
    """Which ranks arrive last at collectives, and how long the others wait for them.

    >>> perfcast.stragglers("traces/").candidates                           # doctest: +SKIP
    """
    from perfcast.analysis.stragglers import stragglers as fn

    candidates = whole_number("candidates", candidates)
    table = _table(trace)
    return said_when_empty(table, fn(table, candidates=candidates))


def collectives(trace: TraceLike, link: str | None = None) -> Collectives:
    """Per collective op and size: algorithm, bus bandwidth, % of the link's peak.

    >>> perfcast.collectives("trace.json.gz", link="nvlink4").to_pandas()   # doctest: +SKIP
    """
    from perfcast.analysis.comms import collectives as fn

    _name_or_none("link", link)
    table = _table(trace)
    return said_when_empty(table, fn(table, link=link))


def roofline(trace: TraceLike, top: int = 30) -> Roofline:
    """Per-op FLOPs, bytes, achieved TFLOP/s and GB/s against the device's peak.

    >>> perfcast.roofline("trace.json.gz").to_pandas()                      # doctest: +SKIP
    """
    from perfcast.analysis.roofline import roofline as fn

    top = whole_number("top", top)
    table = _table(trace)
    return said_when_empty(table, fn(table, top=top))


def scopes(trace: TraceLike, top: int = 30) -> Scopes:
    """Time per record_function annotation, nn.Module scope and GPU annotation.

    >>> perfcast.scopes("trace.json.gz").to_pandas()                        # doctest: +SKIP
    """
    from perfcast.analysis.scopes import scopes as fn

    top = whole_number("top", top)
    table = _table(trace)
    return said_when_empty(table, fn(table, top=top))


def gpu_counters(trace: TraceLike, top: int = 30) -> GpuCounters:
    """GPU performance counters (CUPTI range profiler) per kernel, launching op and metric.

    >>> perfcast.gpu_counters("counters.json.gz").to_pandas("by_op")         # doctest: +SKIP
    """
    from perfcast.analysis.counters import gpu_counters as fn

    top = whole_number("top", top)
    table = _table(trace)
    return said_when_empty(table, fn(table, top=top))


def op_kernels(trace: TraceLike, top: int = 30) -> OpKernelResult:
    """Kernels grouped by the ATen op that launched them, with op-to-kernel delays.

    >>> perfcast.op_kernels("trace.json.gz").to_pandas("sequences")        # doctest: +SKIP
    """
    from perfcast.analysis.op_kernels import op_kernels as fn

    top = whole_number("top", top)
    table = _table(trace)
    return said_when_empty(table, fn(table, top=top))


def diff(
    a: TraceLike,
    b: TraceLike,
    apply: list[str] | str | None = None,
    top: int = 20,
    correct: bool | None = None,
    real: bool | None = None,
) -> TraceDiff:
    """What changed from trace A to trace B, per step, op, kernel and phase; with `apply`
    (what-if specs) also the prediction from A next to what B measured. With `correct` (the
    default, as in every other function) the step times without the profiler are estimated
    too (`step.real_speedup`), which replays both traces; `correct=False` skips that, and
    the prediction's own estimate. `real` is the old name of `correct`.

    >>> d = perfcast.diff("mlp_base.json.gz", "mlp_fused.json.gz",
    ...                   apply="fused-optimizer:kind=fused")             # doctest: +SKIP
    >>> d.prediction.error_pct                                             # doctest: +SKIP
    """
    from perfcast.analysis.diff import compare_prediction
    from perfcast.analysis.diff import diff as _diff

    top = whole_number("top", top)
    from perfcast.whatif.registry import checked_specs

    specs = [] if apply is None else _specs(apply, "apply", allow_empty=True)
    checked = checked_specs(specs)  # an unknown name or option fails before any load
    if real is not None:  # the old name
        real = _flag("real", real)
        if correct is not None and _flag("correct", correct) != real:
            raise OptionError("diff: give correct= (real= is its old name), not both")
        correct = real
    correct = True if correct is None else _flag("correct", correct)
    ta, tb = _table(a, "a"), _table(b, "b")
    out = _diff(ta, tb, top=top, real=correct)
    if specs:
        from perfcast.whatif.runner import run_whatif

        result, _, predicted = run_whatif(ta, checked, correct=correct)
        compare_prediction(out, ta, tb, specs, result, predicted, top=top)
    return out


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

    if rank is not None:
        whole_number("rank", rank, minimum=None)
    _name_or_none("phase", phase)
    if step is not None and not isinstance(step, str):
        whole_number("step", step, minimum=None)  # 4.0 or [4] said "no step 4.0"
    return context_tree(_table(trace), rank=rank, phase=phase, step=step)
