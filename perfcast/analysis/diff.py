"""`perfcast diff A B`: what changed between two traces of the same program, and (with
`apply`) how well a prediction made from A matches B.

Everything is per step, so traces with different numbers of steps compare: counts and times
are summed over the steps of all ranks and divided by the number of steps. A step's time is
the slowest rank's (the mean over steps), as the what-if results count it. Rows are sorted by
the size of their change, largest first; `share_pct` is the change as a share of the step
time's change (GPU work overlaps, so shares need not add up to 100).

`compare_prediction` puts a what-if prediction made from A (run by the API or the CLI, never
here: an analysis runs no model) next to B: the predicted step, and the GPU time per kernel
and per launching op, against what B measured. Predict, apply, measure: the loop closed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from perfcast.analysis.common import NS_PER_MS, launching_op
from perfcast.analysis.notes import input_notes, slowest_per_step
from perfcast.events import NONE, EventTable, Kind
from perfcast.frames import Tables, plain

if TYPE_CHECKING:
    from perfcast.analysis.summary import Summary
    from perfcast.sim.timeline import Timeline
    from perfcast.whatif.runner import WhatIfResult


@dataclass
class StepDelta:
    """The mean step of A and B, ms as traced, their difference (ms and % of A) and speedup
    A / B; the same steps without the profiler (`a_real_ms`, `b_real_ms`, `real_speedup`;
    None with `correct=False`)."""

    a_ms: float
    b_ms: float
    delta_ms: float
    delta_pct: float
    speedup: float  # A / B
    a_steps: int
    b_steps: int
    # The same steps without the profiler (estimated as `summary` does, each trace corrected
    # for its own profiler cost): what the change is worth in the run the user will see.
    a_real_ms: float | None = None
    b_real_ms: float | None = None
    real_speedup: float | None = None
    real_source: str | None = None  # "A: default, B: fit"
    # Each trace's alone: "measured" (unprofiled steps it carries) or a correction's source.
    a_real_source: str | None = None
    b_real_source: str | None = None


@dataclass
class DeltaRow:
    """An op, kernel or phase in A and B: count and ms per step, the change in ms and its
    share of the step's change in %."""

    kind: str  # "op" (CPU time of the op), "kernel", "phase"
    name: str
    a_count: float | None  # per step; None for phases (a phase is no count of things)
    b_count: float | None
    a_ms: float  # per step
    b_ms: float
    delta_ms: float
    share_pct: float | None  # delta / step delta


@dataclass
class StepRow:
    """One step of one rank of A or B (`trace`), under the names `summary`'s steps table
    uses: ms as traced, and without the profiler (`real_ms` estimated, `measured_real_ms`
    from unprofiled steps the trace carries; None with `correct=False`). `StepDelta`'s
    means are read from these rows: per step name the slowest rank, then the mean."""

    trace: str  # "A" or "B"
    rank: int
    step: str
    traced_ms: float
    real_ms: float | None
    measured_real_ms: float | None
    source: str | None


@dataclass
class PredictedRow:
    """A kernel or op's GPU ms per step: measured in A, predicted from A after the what-ifs,
    measured in B, and the prediction's error (predicted - B, ms)."""

    kind: str  # "kernel" or "op" (GPU time launched by the op)
    name: str
    a_ms: float  # measured in A, per step
    predicted_ms: float  # A after the what-ifs, replayed
    b_ms: float  # measured in B
    error_ms: float  # predicted − B


@dataclass
class Prediction:
    """B predicted from A. Both traces are profiled runs, so the comparison is between
    profiled steps: the prediction keeps the profiler's cost in (`predicted_ms`); the same
    prediction without it, the step a user will see, is `predicted_real_ms`."""

    applied: list[str]
    predicted_ms: float  # A after the what-ifs, as a profiled run
    measured_ms: float  # B, as traced
    baseline_ms: float  # A replayed without changes, as traced
    predicted_speedup: float
    measured_speedup: float
    error_pct: float  # (predicted − measured) / measured
    predicted_real_ms: float | None = None  # A after the what-ifs, without the profiler
    real_speedup: float | None = None  # the predicted speedup without the profiler
    # B without the profiler (measured when B carries unprofiled steps, else estimated), the
    # speedup that makes, and the error of `predicted_real_ms` against it: the comparison in
    # the run the user will see, beside the profiled one above.
    measured_real_ms: float | None = None
    measured_real_source: str | None = None
    measured_real_speedup: float | None = None
    real_error_pct: float | None = None
    assumptions: list[str] = field(default_factory=list)


@dataclass(repr=False)
class TraceDiff(Tables):
    """Result of `diff`; tables: ops, kernels, phases, steps (each step of each rank of A
    and B), predicted (with `apply`)."""

    RENDERER: ClassVar[tuple[str, str]] = ("perfcast.report.analyses_terminal", "render_diff")

    step: StepDelta
    ops: list[DeltaRow]
    kernels: list[DeltaRow]
    phases: list[DeltaRow]
    predicted: list[PredictedRow] = field(default_factory=list)
    prediction: Prediction | None = None
    steps: list[StepRow] = field(default_factory=list)
    a_files: list[str] = field(default_factory=list)
    b_files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # A and B share few op and kernel names: their deltas, and a prediction's error against
    # B, compare unrelated work (the note says by how much).
    different_programs: bool = False

    ROW_TYPES = {  # noqa: RUF012
        "ops": DeltaRow,
        "kernels": DeltaRow,
        "phases": DeltaRow,
        "predicted": PredictedRow,
        "steps": StepRow,
    }


def step_time_ms(table: EventTable) -> tuple[float, int]:
    """(mean step time in ms, steps): per step name the slowest rank, then the mean."""
    by_name = slowest_per_step((it.name, it.dur_ns) for it in table.iterations)
    if not by_name:
        return 0.0, 0
    return float(np.mean(list(by_name.values()))) / NS_PER_MS, len(by_name)


def _setup_notes(a: EventTable, b: EventTable) -> list[str]:
    """What differs between the two runs besides the code: the GPU, the batch. A step time
    compared across them is not the change's alone."""
    from perfcast.memory_model.facts import trace_facts

    notes = []
    dev_a = sorted({r.device_name for r in a.ranks if r.device_name})
    dev_b = sorted({r.device_name for r in b.ranks if r.device_name})
    if dev_a and dev_b and dev_a != dev_b:
        notes.append(
            f"A ran on {', '.join(dev_a)}, B on {', '.join(dev_b)}: the step times compare "
            "two GPUs as well as the change"
        )
    try:
        batch_a, batch_b = trace_facts(a).batch, trace_facts(b).batch
    except Exception:  # a note only: a trace too odd for the facts gets none
        return notes
    if batch_a and batch_b and batch_a != batch_b:
        notes.append(
            f"the batch differs (A {batch_a}, B {batch_b}, the first forward layer's input): "
            "compare throughput per sample, not step time"
        )
    return notes


def real_step_time_ms(summary: Summary) -> tuple[float | None, str]:
    """(mean step time without the profiler in ms, where the correction came from), from a
    summary made with `real=True`, taken per step name as the slowest rank, like
    `step_time_ms`; measured unprofiled steps the trace carries win over the estimate."""
    values: list[tuple[str, float]] = []
    sources: set[str] = set()
    for rs in summary.ranks:
        for it in rs.iterations:
            ms = it.measured_real_ms if it.measured_real_ms is not None else it.real_ms
            if ms is None:
                continue
            values.append((it.name, ms))
            sources.add("measured" if it.measured_real_ms is not None else it.source or "?")
    by_name = slowest_per_step(values)
    if not by_name:
        return None, ""
    return float(np.mean(list(by_name.values()))), "/".join(sorted(sources))


def _step_rows(trace: str, summary: Summary) -> list[StepRow]:
    """Each step of each rank in `summary`, as `TraceDiff.steps` holds it."""
    return [
        StepRow(
            trace,
            rs.rank,
            it.name,
            it.traced_ms,
            it.real_ms,
            it.measured_real_ms,
            it.source,
        )
        for rs in summary.ranks
        for it in rs.iterations
    ]


def _in_steps(table: EventTable) -> np.ndarray:
    """Rows inside a step (all rows of ranks without steps)."""
    no_steps = np.array([not info.has_steps for info in table.ranks], dtype=bool)
    ranks = np.array(table.rank_ids(), dtype=np.int64)
    whole = np.isin(table.rank, ranks[no_steps]) if no_steps.any() else np.zeros(len(table), bool)
    return (table.iteration != NONE) | whole


def _steps(table: EventTable) -> int:
    """Steps summed over ranks (a rank without steps counts one)."""
    n = sum(1 for _ in table.iterations)
    return max(n, 1)


@dataclass
class _Profile:
    steps: int
    op_count: dict[str, float]
    op_ms: dict[str, float]
    op_gpu_ms: dict[str, float]
    kernel_count: dict[str, float]
    kernel_ms: dict[str, float]
    phase_ms: dict[str, float]


def _per_name(table: EventTable, rows: np.ndarray, names: np.ndarray, steps: int):
    if rows.size == 0:
        return {}, {}
    uniq, inv = np.unique(names, return_inverse=True)
    counts = np.bincount(inv) / steps
    total = np.bincount(inv, weights=table.dur[rows]) / steps / NS_PER_MS
    keys = [table.names[i] for i in uniq.tolist()]
    return dict(zip(keys, counts.tolist())), dict(zip(keys, total.tolist()))


def _profile(table: EventTable, summary: Summary | None = None) -> _Profile:
    """Per-step op, kernel and phase times; `summary` is the table's own, if made already."""
    from perfcast.analysis.summary import summarize

    steps = _steps(table)
    inside = _in_steps(table)
    ops = np.flatnonzero(inside & (table.kind == Kind.CPU_OP))
    # 2021-era traces record the ProfilerStep#N ranges as CPU ops: each is a whole step, and
    # its name differs between the traces (so it read as an op gone and another new).
    marker = table.step_marker_names()
    ops = ops[~marker[table.name[ops]]]
    op_count, op_ms = _per_name(table, ops, table.name[ops], steps)
    gpu = np.flatnonzero(inside & table.is_gpu())
    k_count, k_ms = _per_name(table, gpu, table.name[gpu], steps)
    launched = gpu[table.launch[gpu] >= 0]
    op = launching_op(table, launched, aten_first=False)
    has = op >= 0
    _, op_gpu = _per_name(table, launched[has], table.name[op[has]], steps)
    phase: dict[str, float] = {}
    for rs in (summary or summarize(table, top=1, real=False)).ranks:
        for k, v in rs.gpu_ms_by_phase.items():
            phase[f"GPU {k}"] = phase.get(f"GPU {k}", 0.0) + v / steps
        for it in rs.iterations:
            c = it.cpu
            for k, v in (("data loading", c.dataloader_ms), ("forward", c.forward_ms),
                         ("backward", c.backward_ms), ("optimizer", c.optimizer_ms),
                         ("communication", c.communication_ms)):  # fmt: skip
                phase[f"CPU {k}"] = phase.get(f"CPU {k}", 0.0) + v / steps
    return _Profile(steps, op_count, op_ms, op_gpu, k_count, k_ms, phase)


def _rows(
    kind: str,
    a_n: dict[str, float] | None,
    a_t: dict[str, float],
    b_n: dict[str, float] | None,
    b_t: dict[str, float],
    step_delta: float,
    top: int,
) -> list[DeltaRow]:
    names = set(a_t) | set(b_t)
    rows = []
    for nm in names:
        a, b = a_t.get(nm, 0.0), b_t.get(nm, 0.0)
        rows.append(
            DeltaRow(
                kind=kind,
                name=nm,
                a_count=None if a_n is None else a_n.get(nm, 0.0),
                b_count=None if b_n is None else b_n.get(nm, 0.0),
                a_ms=a,
                b_ms=b,
                delta_ms=b - a,
                share_pct=100.0 * (b - a) / step_delta if step_delta else None,
            )
        )
    rows.sort(key=lambda r: (-abs(r.delta_ms), -abs((r.b_count or 0) - (r.a_count or 0)), r.name))
    return rows[:top]


# Below these shares of names in common (of all names in either trace), two traces look like
# different programs. Measured on the recorded pairs: a change keeps its ops' names (op
# Jaccard 0.71-1.00; a whole-step CUDA graph 0.04, but it keeps its kernels, 0.77) or its
# kernels' (bf16 autocast renames every kernel, 0.09, and keeps its ops, 0.89); the MLP
# against ResNet-50 share 0.52 of op names and 0.16 of kernel names; the CPU benchmark's
# unrelated models 0.37-0.65 of op names, so a CPU-only pair is told apart less well (cnn
# against mlp, 0.65, is not).
_SAME_PROGRAM_OPS = 0.6
_SAME_PROGRAM_KERNELS = 0.3


def _different_programs_note(pa: _Profile, pb: _Profile) -> list[str]:
    """A note when A and B share few op names and few kernel names: their deltas then
    compare unrelated work, not a change to one program."""

    def jaccard(x: dict[str, float], y: dict[str, float]) -> float | None:
        union = set(x) | set(y)
        return len(set(x) & set(y)) / len(union) if union else None

    ops = jaccard(pa.op_ms, pb.op_ms)
    kernels = jaccard(pa.kernel_ms, pb.kernel_ms)
    if ops is None or ops >= _SAME_PROGRAM_OPS:
        return []
    if kernels is not None and kernels >= _SAME_PROGRAM_KERNELS:
        return []
    kernel_text = f" and {kernels:.0%} of kernel names" if kernels is not None else ""
    return [
        f"A and B share {ops:.0%} of op names{kernel_text}: if they are different programs, "
        "these deltas compare unrelated work, not a change"
    ]


def diff(a: EventTable, b: EventTable, top: int = 20, real: bool = True) -> TraceDiff:
    """Step, op, kernel and phase deltas from trace A to trace B.

    `perfcast.diff(a, b, apply=[...])` (the API) also predicts B from A; this analysis only
    measures.

    >>> import perfcast
    >>> d = diff(perfcast.load("base.json.gz"), perfcast.load("fused.json.gz"))  # doctest: +SKIP
    >>> d.step.speedup, d.kernels[0].name                                        # doctest: +SKIP
    """
    a_ms, a_steps = step_time_ms(a)
    b_ms, b_steps = step_time_ms(b)
    from perfcast.analysis.summary import summarize

    # One summary per trace serves the phase times and, with `real`, the steps without the
    # profiler (that replay is the costly part).
    sa, sb = summarize(a, top=1, real=real), summarize(b, top=1, real=real)
    pa, pb = _profile(a, sa), _profile(b, sb)
    delta = b_ms - a_ms
    out = TraceDiff(
        step=StepDelta(
            a_ms=a_ms,
            b_ms=b_ms,
            delta_ms=delta,
            delta_pct=100.0 * delta / a_ms if a_ms else 0.0,
            speedup=a_ms / b_ms if b_ms else 0.0,
            a_steps=a_steps,
            b_steps=b_steps,
        ),
        ops=_rows("op", pa.op_count, pa.op_ms, pb.op_count, pb.op_ms, delta, top),
        kernels=_rows(
            "kernel", pa.kernel_count, pa.kernel_ms, pb.kernel_count, pb.kernel_ms, delta, top
        ),
        phases=_rows("phase", None, pa.phase_ms, None, pb.phase_ms, delta, top),
        steps=_step_rows("A", sa) + _step_rows("B", sb),
        a_files=[r.path for r in a.ranks],
        b_files=[r.path for r in b.ranks],
        notes=[f"A: {n}" for n in input_notes(a)] + [f"B: {n}" for n in input_notes(b)],
    )
    ra, rb = a.rank_ids(), b.rank_ids()
    if len(ra) != len(rb):
        out.notes.append(
            f"A has {len(ra)} rank(s), B {len(rb)}: the step times are each trace's slowest "
            "rank's, and ops, kernels and phases are per rank and step, so the ranks compared "
            "differ"
        )
    elif ra != rb:
        shown = ", ".join(map(str, ra[:4])) + (", ..." if len(ra) > 4 else "")
        other = ", ".join(map(str, rb[:4])) + (", ..." if len(rb) > 4 else "")
        out.notes.append(
            f"A holds ranks {shown}, B ranks {other}: different ranks of the job are compared"
        )
    out.notes.extend(_setup_notes(a, b))
    unrelated = _different_programs_note(pa, pb)
    out.notes.extend(unrelated)
    out.different_programs = bool(unrelated)
    if real:
        (a_real, a_src), (b_real, b_src) = real_step_time_ms(sa), real_step_time_ms(sb)
        if a_real and b_real:
            st = out.step
            st.a_real_ms, st.b_real_ms = a_real, b_real
            st.real_speedup = a_real / b_real
            st.real_source = f"A: {a_src}, B: {b_src}"
            st.a_real_source, st.b_real_source = a_src, b_src
    return plain(out)


def _predicted_gpu(tl: Timeline, steps: int) -> tuple[dict[str, float], dict[str, float]]:
    """GPU ms per step by kernel name and by launching op name, in a replayed timeline."""
    from perfcast.graph.model import NodeKind

    g = tl.graph
    c = g.cols
    sel = np.flatnonzero((c["kind"] == NodeKind.GPU) & g.alive & (c["iteration"] >= 0))
    if sel.size == 0:  # traces without steps: every GPU node
        sel = np.flatnonzero((c["kind"] == NodeKind.GPU) & g.alive)
    dur = (tl.end[sel] - tl.start[sel]).astype(np.float64)

    def by(col: np.ndarray) -> dict[str, float]:
        ok = col >= 0
        if not ok.any():
            return {}
        uniq, inv = np.unique(col[ok], return_inverse=True)
        tot = np.bincount(inv, weights=dur[ok]) / steps / NS_PER_MS
        return {g.names[i]: t for i, t in zip(uniq.tolist(), tot.tolist())}

    # Per op as the measured side attributes it (`launching_op`, any op's name: DDP's
    # all-reduce under record_param_comms, not the nccl: range inside it); work a model
    # added, with no trace row, by the graph's own op.
    op_name = c["op_name"][sel].astype(np.int64)
    table = g.table
    ev = c["event"][sel].astype(np.int64)
    traced = np.flatnonzero(ev >= 0)
    if table is not None and traced.size:
        rows = ev[traced]
        launched = table.launch[rows] >= 0
        op_rows = np.full(rows.size, NONE, dtype=np.int64)
        op_rows[launched] = launching_op(table, rows[launched], aten_first=False)
        known = op_rows >= 0
        ids = np.full(rows.size, -1, dtype=np.int64)
        if known.any():
            # The trace's names into the graph's name table, once per distinct name.
            uniq, inv = np.unique(table.name[op_rows[known]], return_inverse=True)
            mapped = np.array([g.intern(table.names[i]) for i in uniq.tolist()], dtype=np.int64)
            ids[known] = mapped[inv.reshape(-1)]
        op_name[traced] = ids
    return by(c["name"][sel]), by(op_name)


def _pair_modelled(
    pred: dict[str, float], a_t: dict[str, float], b_t: dict[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """A's and B's kernel times with B's kernels that a modelled kernel stands for (a
    what-if's new `multi_tensor_apply_kernel<FusedAdamMathFunctor> (modelled)`) summed under
    the modelled name: B's real names carry template arguments no model can know."""
    b_t = dict(b_t)
    for name in pred:
        if not name.endswith("modelled)") or name in b_t:
            continue
        base = name.split(" (")[0]
        family, _, functor = base.partition("<")
        functor = functor.rstrip(">")
        mine = [n for n in b_t if n not in pred and family in n and (not functor or functor in n)]
        if mine:
            b_t[name] = sum(b_t.pop(n) for n in mine)
    return a_t, b_t


def compare_prediction(
    out: TraceDiff,
    a: EventTable,
    b: EventTable,
    applied: list[str],
    result: WhatIfResult,
    predicted: Timeline,
    top: int = 20,
) -> TraceDiff:
    """Put a what-if prediction made from A (its result and replayed timeline) next to what B
    measured: the step, and GPU time per kernel and per launching op. Returns `out`."""
    from perfcast.whatif.runner import LEAD_ASSUMPTION

    pa, pb = _profile(a), _profile(b)
    b_ms = out.step.b_ms
    pred_k, pred_op = _predicted_gpu(predicted, pa.steps)
    pred_ms = result.predicted_traced_ms
    corrected = result.correction.source != "off"
    out.prediction = Prediction(
        applied=list(applied),
        predicted_ms=pred_ms,
        measured_ms=b_ms,
        baseline_ms=result.traced_ms,
        predicted_speedup=result.speedup_traced,
        measured_speedup=out.step.speedup,
        error_pct=100.0 * (pred_ms - b_ms) / b_ms if b_ms else 0.0,
        # None when the profiler's cost was left in (correct=False): nothing to add.
        predicted_real_ms=result.predicted_ms if corrected else None,
        real_speedup=result.speedup if corrected else None,
        assumptions=[x for ap in result.applied for x in ap.assumptions]
        + [x for x in result.assumptions if x.startswith(LEAD_ASSUMPTION)],
    )
    p, st = out.prediction, out.step
    if p.predicted_real_ms is not None and st.b_real_ms:
        p.measured_real_ms, p.measured_real_source = st.b_real_ms, st.b_real_source
        p.measured_real_speedup = st.real_speedup
        p.real_error_pct = 100.0 * (p.predicted_real_ms - st.b_real_ms) / st.b_real_ms
    # A kernel amp renamed `autocast[bf16] <kernel>` is A's <kernel>.
    from perfcast.whatif.models.amp import traced_name

    rows: list[PredictedRow] = []
    for kind, pred, a_t, b_t in (
        ("kernel", pred_k, *_pair_modelled(pred_k, pa.kernel_ms, pb.kernel_ms)),
        ("op", pred_op, pa.op_gpu_ms, pb.op_gpu_ms),
    ):
        # A's work the change removed stays in the table, predicted 0 (it was left out, so
        # a reader could not see what the prediction took away).
        shown_a = {traced_name(nm) for nm in pred}
        part = [
            PredictedRow(
                kind,
                nm,
                a_t.get(nm, a_t.get(traced_name(nm), 0.0)),
                pred.get(nm, 0.0),
                b_t.get(nm, 0.0),
                pred.get(nm, 0.0) - b_t.get(nm, 0.0),
            )
            for nm in set(pred) | set(b_t) | (set(a_t) - shown_a)
        ]
        part.sort(key=lambda r: (-max(r.b_ms, r.predicted_ms, r.a_ms), r.name))
        rows.extend(part[:top])
    out.predicted = rows
    return plain(out)
