"""Where the time of each step goes: the `perfcast summary` result.

GPU time of a step window is split so the parts add up to the step time:
compute (any non-communication kernel running), communication not hidden by
compute, memory copies/sets hidden by neither, and idle (nothing on any stream).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from perfcast.analysis import intervals as iv
from perfcast.analysis.common import copy_rows, nearest_ancestor
from perfcast.analysis.notes import first_step_note, rank_notes
from perfcast.events import GPU_KINDS, NONE, EventTable, Kind
from perfcast.frames import Columns, Tables, dicts_to_columns, field_kinds
from perfcast.graph.phases import (
    PHASE_LABELS,
    Phase,
    collective_kernel_mask,
    enclosing_scopes,
    event_phases,
)
from perfcast.real import Correction

if TYPE_CHECKING:  # the simulator (numba) loads only when real steps are estimated
    from perfcast.analysis.real_step import RealWorld

NS_PER_MS = 1e6


@dataclass
class GpuBreakdown:
    """A step's GPU time, ms, split by time: compute_ms + communication_exposed_ms +
    memcpy_exposed_ms + idle_ms is the step; communication_ms counts it all, hidden or not,
    and busy_ms the time any GPU work ran."""

    compute_ms: float
    communication_exposed_ms: float
    memcpy_exposed_ms: float
    idle_ms: float
    communication_ms: float  # all communication, hidden or not
    communication_overlap_pct: float | None  # share of communication overlapped by compute
    busy_ms: float


@dataclass
class CpuBreakdown:
    """A step's CPU time by phase, ms as traced (the profiler's cost in), summed over the
    host threads (can exceed the step): each stretch of a thread goes to its innermost event."""

    dataloader_ms: float
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    communication_ms: float


@dataclass
class IterationSummary:
    """One step of one rank: its time as traced (`measured_ms`, also `traced_ms`), its start
    on the rank's clock, GPU and CPU breakdowns and kernels launched, and the step without
    the profiler (`real_ms`, estimated; None with `correct=False`), all in ms."""

    name: str
    measured_ms: float  # as traced
    start_ms: float
    gpu: GpuBreakdown | None
    cpu: CpuBreakdown
    kernels: int
    real_ms: float | None = None  # estimated without the profiler (see Summary.correction)
    measured_real_ms: float | None = None  # measured without the profiler, if the trace says
    source: str | None = None  # where the profiler-cost correction came from
    # The same as measured_ms, under the name every --json result uses for the traced step.
    traced_ms: float = field(init=False)

    def __post_init__(self) -> None:
        self.traced_ms = self.measured_ms


@dataclass
class NamedTime:
    """A top-list row: a kernel, op or scope by name, its count, total ms and share of its
    list's whole in % (kernels: of kernel time; ops: of outermost ops' CPU time; scopes: of
    the GPU time)."""

    name: str
    count: int
    total_ms: float
    pct: float


@dataclass
class RankSummary:
    """One rank: its device as the trace names it, file, steps and top lists (`summary(top=N)`
    long), GPU ms by phase over all steps, and notes about its input."""

    rank: int
    device: str | None
    path: str
    has_steps: bool
    truncated: bool
    iterations: list[IterationSummary]
    top_kernels: list[NamedTime]
    top_ops: list[NamedTime]
    # GPU time by the module / record_function scope that launched it, and by phase.
    top_scopes: list[NamedTime] = field(default_factory=list)
    gpu_ms_by_phase: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _gpu(name: str) -> Callable[[IterationSummary], object]:
    return lambda it: getattr(it.gpu, name) if it.gpu else None


def _cpu(name: str) -> Callable[[IterationSummary], object]:
    return lambda it: getattr(it.cpu, name)


# The columns of `Summary.to_pandas("steps")` (one row per rank and step) and how each is read
# from a step; one list, so an empty table keeps the same columns as a full one.
_STEP_COLUMNS: tuple[tuple[str, Callable[[IterationSummary], object]], ...] = (
    ("step", lambda it: it.name),
    ("traced_ms", lambda it: it.traced_ms),
    ("real_ms", lambda it: it.real_ms),
    ("measured_real_ms", lambda it: it.measured_real_ms),
    ("source", lambda it: it.source),
    ("gpu_compute_ms", _gpu("compute_ms")),
    ("comm_exposed_ms", _gpu("communication_exposed_ms")),
    ("copies_exposed_ms", _gpu("memcpy_exposed_ms")),
    ("gpu_idle_ms", _gpu("idle_ms")),
    ("gpu_busy_ms", _gpu("busy_ms")),  # what --json has: the step less its idle time
    ("comm_ms", _gpu("communication_ms")),
    ("comm_overlap_pct", _gpu("communication_overlap_pct")),
    ("cpu_dataloader_ms", _cpu("dataloader_ms")),
    ("cpu_forward_ms", _cpu("forward_ms")),
    ("cpu_backward_ms", _cpu("backward_ms")),
    ("cpu_optimizer_ms", _cpu("optimizer_ms")),
    ("cpu_comm_ms", _cpu("communication_ms")),
    ("kernels", lambda it: it.kernels),
)


@dataclass(repr=False)
class Summary(Tables):
    """Where each step's time goes, per rank. Tables (`to_pandas(name)`): steps (one row per
    rank and step), top_kernels, top_ops, top_scopes (one row per rank and name)."""

    RENDERER: ClassVar[tuple[str, str]] = ("perfcast.display", "render_summary")

    ranks: list[RankSummary]
    notes: list[str] = field(default_factory=list)
    correction: Correction | None = None  # how the steps without the profiler were estimated
    # With several ranks: the ranks whose late arrival at collectives made the others wait
    # most (analysis.stragglers). The rank with the longest step is usually a waiter, not one.
    stragglers: list[int] = field(default_factory=list)

    def _tables(self) -> dict[str, Columns]:
        steps = [
            {"rank": rs.rank} | {name: read(it) for name, read in _STEP_COLUMNS}
            for rs in self.ranks
            for it in rs.iterations
        ]
        columns = ("rank", *(name for name, _ in _STEP_COLUMNS))
        # Declared types: a column no step filled (measured_real_ms) or a table of no rows
        # (top_kernels of a CPU-only trace) keeps them in pandas, polars and Arrow.
        kinds = {name: "float" for name in columns if name.endswith(("_ms", "_pct"))}
        kinds |= {"rank": "int", "step": "str", "source": "str", "kernels": "int"}
        out = {"steps": dicts_to_columns(steps, columns, kinds)}
        for name in ("top_kernels", "top_ops", "top_scopes"):
            out[name] = dicts_to_columns(
                [
                    {
                        "rank": rs.rank,
                        "name": t.name,
                        "count": t.count,
                        "total_ms": t.total_ms,
                        "pct": t.pct,
                    }
                    for rs in self.ranks
                    for t in getattr(rs, name)
                ],
                ("rank", "name", "count", "total_ms", "pct"),
                {"rank": "int"} | field_kinds(NamedTime),
            )
        return out


def summarize(table: EventTable, top: int = 10, real: bool = True) -> Summary:
    """Where the time of each step goes, per rank. With `real` (the default) each step also
    carries its estimate without the profiler, from a replay of the corrected trace."""
    out = _summarize(table, top)
    if len(table.ranks) > 1:
        from perfcast.analysis.stragglers import stragglers

        late = stragglers(table)
        # HTA's candidates (latest on average) that were also the last to arrive somewhere: a
        # rank late on average but never last made nobody wait.
        caused = {r.rank: r.wait_caused_ms for r in late.by_rank}
        out.stragglers = [r for r in late.candidates if caused.get(r, 0.0) > 0]
    if real:
        from perfcast.analysis.real_step import real_world
        from perfcast.graph.build import build_graph

        add_real_steps(out, real_world(build_graph(table)))
    return out


def add_real_steps(out: Summary, world: RealWorld) -> None:
    """Fill each step's estimate without the profiler from an existing `real_world`."""
    by_key = {(e.rank, e.name): e for e in world.steps}
    for rs in out.ranks:
        for it in rs.iterations:
            est = by_key.get((rs.rank, it.name))
            if est is not None:
                it.real_ms, it.measured_real_ms, it.source = (
                    est.real_ms,
                    est.measured_real_ms,
                    est.source,
                )
    out.correction = world.correction
    out.notes.extend(first_step_note(world.steps, world.traced_graph.table))


def _graph_replay_note(table: EventTable, phases: np.ndarray, gpu_rows: np.ndarray) -> str:
    """Say so when most GPU time replays from graphs launched outside any named phase: the
    trace shows the launch, not which forward, backward or optimizer op each kernel is."""
    total = float(table.dur[gpu_rows].sum())
    replayed = float(table.dur[gpu_rows][phases[gpu_rows] == Phase.GRAPH].sum())
    if total <= 0 or replayed < 0.5 * total:
        return ""
    return (
        f"{100 * replayed / total:.0f}% of the GPU time in the steps replays from CUDA graphs "
        "launched outside any named phase (cudaGraphLaunch): the trace cannot tell their "
        "forward, backward and optimizer kernels apart; profile the eager step to see them"
    )


def _summarize(table: EventTable, top: int) -> Summary:
    phases = event_phases(table)
    scopes = enclosing_scopes(table)
    coll = collective_kernel_mask(table)
    kind = table.kind
    is_gpu = table.kind_mask(GPU_KINDS)
    is_cpu = table.kind_mask(
        (Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON_FUNCTION, Kind.RUNTIME)
    )
    out = Summary(ranks=[])
    # 2021-era traces record their ranges (ProfilerStep#N, Optimizer.step#...) as CPU ops:
    # ranges, not ops, so the ops inside them stand in for them.
    is_op = (
        (table.kind == Kind.CPU_OP)
        & ~table.annotation_mask()
        & ~table.step_marker_names()[table.name]
    )
    copies = copy_rows(table)
    for info in table.ranks:
        rank = info.rank
        notes = [n for n in rank_notes(info) if n not in info.folder_notes]
        out.notes.extend(info.folder_notes)
        on_rank = table.rank_rows(rank)
        g = on_rank[is_gpu[on_rank]]
        g_start = table.ts[g]
        g_end = g_start + table.dur[g]
        g_coll = coll[g]
        g_copy = copies[g]
        cpu_rows = on_rank[is_cpu[on_rank]]
        its = []
        for it_idx, it in enumerate(table.iterations):
            if it.rank != rank:
                continue
            lo, hi = it.window_start_ns, it.end_ns
            gpu = None
            if g.size:
                gpu = _gpu_breakdown(g_start, g_end, g_coll, g_copy, lo, hi)
            # The host runs ahead of the GPU: within a step's GPU window it is already
            # running the next step's forward. CPU time goes to the step its ops belong to.
            # The step's own host span (its ProfilerStep), which also leaves out what the
            # profiler does after the last step.
            if info.has_steps:
                own = cpu_rows[table.iteration[cpu_rows] == it_idx]
                cpu = _cpu_breakdown(table, phases, own, it.start_ns, it.cpu_end_ns)
            else:
                cpu = _cpu_breakdown(table, phases, cpu_rows, lo, hi)
            n_kern = int(((kind[g] == Kind.KERNEL) & (table.iteration[g] == it_idx)).sum())
            its.append(
                IterationSummary(
                    name=it.name,
                    measured_ms=(hi - lo) / NS_PER_MS,
                    start_ms=lo / NS_PER_MS,
                    gpu=gpu,
                    cpu=cpu,
                    kernels=n_kern,
                )
            )
        in_steps = g[table.iteration[g] != NONE] if info.has_steps else g
        replayed = _graph_replay_note(table, phases, in_steps)
        if replayed:
            notes.append(replayed)
        kern = in_steps[kind[in_steps] == Kind.KERNEL]
        tops = _top_by_name(table, kern, top)
        ops = cpu_rows[is_op[cpu_rows] & (table.iteration[cpu_rows] != NONE)]
        # Outermost ops only: no op encloses them, however many Python frames or ranges lie
        # between (a direct-parent test counted nested calls twice where a frame sat
        # between them).
        outer = ops[nearest_ancestor(table, table.parent[ops], is_op) < 0]
        out.ranks.append(
            RankSummary(
                rank=rank,
                device=info.device_name,
                path=info.path,
                has_steps=info.has_steps,
                truncated=info.truncated,
                iterations=its,
                top_kernels=tops,
                top_ops=_top_by_name(table, outer, top),
                top_scopes=_top_by_scope(table, scopes, in_steps, top),
                gpu_ms_by_phase={
                    PHASE_LABELS[Phase(p)]: float(table.dur[in_steps][phases[in_steps] == p].sum())
                    / NS_PER_MS
                    for p in PHASE_LABELS
                    if (phases[in_steps] == p).any()
                },
                notes=notes,
            )
        )
    return out


def _gpu_breakdown(
    g_start: np.ndarray, g_end: np.ndarray, g_coll: np.ndarray, g_copy: np.ndarray, lo: int, hi: int
) -> GpuBreakdown:
    window = hi - lo
    comp_s, comp_e = iv.clip(g_start[~g_coll & ~g_copy], g_end[~g_coll & ~g_copy], lo, hi)
    comm_s, comm_e = iv.clip(g_start[g_coll], g_end[g_coll], lo, hi)
    copy_s, copy_e = iv.clip(g_start[g_copy & ~g_coll], g_end[g_copy & ~g_coll], lo, hi)
    compute = iv.union_length(comp_s, comp_e)
    comm = iv.union_length(comm_s, comm_e)
    comp_comm = iv.union_length(np.concatenate([comp_s, comm_s]), np.concatenate([comp_e, comm_e]))
    busy = iv.union_length(
        np.concatenate([comp_s, comm_s, copy_s]), np.concatenate([comp_e, comm_e, copy_e])
    )
    overlap = compute + comm - comp_comm
    return GpuBreakdown(
        compute_ms=compute / NS_PER_MS,
        communication_exposed_ms=(comp_comm - compute) / NS_PER_MS,
        memcpy_exposed_ms=(busy - comp_comm) / NS_PER_MS,
        idle_ms=(window - busy) / NS_PER_MS,
        communication_ms=comm / NS_PER_MS,
        communication_overlap_pct=(100.0 * overlap / comm) if comm else None,
        busy_ms=busy / NS_PER_MS,
    )


def _cpu_breakdown(
    table: EventTable, phases: np.ndarray, cpu_rows: np.ndarray, lo: int, hi: int
) -> CpuBreakdown:
    """CPU time per phase: every stretch of a thread's time goes to the phase of the innermost
    event covering it (an event's self time: its span less its children's, clipped to the
    window), so a Python frame spanning forward and backward counts only its own time. An
    event that outlives its parent is not nested by the loader and counts in full beside it
    (at most a few percent of a phase on the traces checked)."""
    s = table.ts[cpu_rows]
    e = s + table.dur[cpu_rows]
    inside = (s < hi) & (e > lo)
    rows = cpu_rows[inside]
    st = np.maximum(s[inside], lo)
    # Integer nanoseconds throughout: epoch timestamps (~1.6e18 ns) hold only multiples of
    # 256 ns as doubles, which moved phase times by up to 70 µs on 2021-era traces.
    en = np.minimum(e[inside], hi)
    span = en - st
    # Children's clipped spans, subtracted from their direct parent when it is in the window
    # (found by a sorted search: a table-sized index per step would cost ranks x steps x
    # events on a large folder).
    order = np.argsort(rows, kind="stable")
    srt = rows[order]
    parent = table.parent[rows]
    hit = np.searchsorted(srt, parent)
    hit_ok = (parent >= 0) & (hit < srt.size)
    hit_ok[hit_ok] = srt[hit[hit_ok]] == parent[hit_ok]
    at = np.where(hit_ok, order[np.minimum(hit, srt.size - 1)], -1)
    has = at >= 0
    # Only the part of a child inside its parent comes off the parent (a child that outlives
    # it, as damaged or reordered traces have, would otherwise take more than it covers).
    kid = np.flatnonzero(has)
    inner = np.minimum(en[kid], en[at[kid]]) - np.maximum(st[kid], st[at[kid]])
    # Durations (not timestamps) are exact as doubles up to 2^53 ns.
    children = np.bincount(at[kid], weights=np.maximum(inner, 0), minlength=rows.size).astype(
        np.int64
    )
    own = np.maximum(span - children, 0)
    ph = phases[rows]
    result = {
        p: int(own[ph == p].sum()) / NS_PER_MS
        for p in (
            Phase.DATALOADER,
            Phase.FORWARD,
            Phase.BACKWARD,
            Phase.OPTIMIZER,
            Phase.COMMUNICATION,
        )
    }
    return CpuBreakdown(
        dataloader_ms=result[Phase.DATALOADER],
        forward_ms=result[Phase.FORWARD],
        backward_ms=result[Phase.BACKWARD],
        optimizer_ms=result[Phase.OPTIMIZER],
        communication_ms=result[Phase.COMMUNICATION],
    )


def _top_by_name(table: EventTable, rows: np.ndarray, top: int) -> list[NamedTime]:
    if rows.size == 0:
        return []
    names = table.name[rows]
    durs = table.dur[rows]
    uniq, inv = np.unique(names, return_inverse=True)
    totals = np.bincount(inv, weights=durs)
    counts = np.bincount(inv)
    grand = float(totals.sum()) or 1.0
    # Equal totals in name order: the loader numbers names in sorted order, and np.unique
    # sorts the ids (a folder's other files no longer reorder a rank's ties).
    order = np.argsort(-totals, kind="stable")[:top].tolist()
    return [
        NamedTime(
            name=table.names[int(uniq[i])],
            count=int(counts[i]),
            total_ms=float(totals[i]) / NS_PER_MS,
            pct=100.0 * float(totals[i]) / grand,
        )
        for i in order
    ]


def _top_by_scope(
    table: EventTable, scopes: np.ndarray, rows: np.ndarray, top: int
) -> list[NamedTime]:
    """GPU time per enclosing module / record_function scope (the calling context), each a
    share of all the GPU time in `rows` (work outside every scope counts in the whole)."""
    grand = float(table.dur[rows].sum()) or 1.0
    rows = rows[scopes[rows] >= 0]
    if rows.size == 0:
        return []
    uniq, inv = np.unique(scopes[rows], return_inverse=True)
    totals = np.bincount(inv, weights=table.dur[rows])
    counts = np.bincount(inv)
    return [
        NamedTime(
            table.names[int(uniq[i])],
            int(counts[i]),
            float(totals[i]) / NS_PER_MS,
            100.0 * float(totals[i]) / grand,
        )
        for i in np.argsort(-totals, kind="stable")[:top].tolist()  # ties by name
    ]
