"""The profiler's own cost, taken out of host work: the graph every prediction starts from.

A trace is a run with the profiler on, and the profiler costs host time for every event it
records. Where that time lands (torch/csrc/profiler/collection.cpp, PyTorch 2.x):

- a CPU op or `record_function` range: RecordFunction's callbacks run on entry, recording the
  inputs' shapes and dtypes when `record_shapes` is on, and only then take the start time;
  on exit they take the end time first. So the cost sits *outside* the op: in the CPU time
  just before its start and just after its end (its parent's self time, or the Python time
  between top-level ops);
- a CUDA/HIP runtime call: CUPTI's activity and callback bookkeeping runs inside the call
  (launches took ~7 µs traced against ~3-4 µs typical unprofiled on the H100 host here);
- a Python frame (`with_stack`, `with_modules`): the Python tracer's enter/exit, outside the
  frame's own range like an op's;
- a `[memory]` event (`profile_memory`): recorded inside the allocation, in its op.

`remove_profiler_cost` subtracts a per-event cost from the CPU segment before and after each
op and frame and from each runtime call, never below zero (a segment never gives more than
its own time) and never touching GPU work. Replaying the result predicts the step as it runs
without the profiler: CPU-bound steps shrink, GPU-bound ones barely move, because the CPU
then waits longer for the GPU, and waits are dependencies, not durations.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from perfcast.arrays import split_by
from perfcast.events import EventTable, Kind
from perfcast.graph.model import Graph, NodeKind, Source
from perfcast.ingest.input_dims import parse_input_dims

# Share of an op's cost paid before its start: RecordFunction's entry callbacks (shape and
# dtype capture) run before the start time is taken, its exit ones after the end (see above);
# measured on this project's traces as the head and tail gaps of nested ops.
ENTER_SHARE = 0.7
# A runtime call keeps at least this much (or its whole time if less): cudaLaunchKernel's own
# unprofiled cost is ~3-4 µs on the H100 host, so the correction never takes it near zero.
MIN_RUNTIME_NS = 500


@dataclass(frozen=True)
class ProfilerSettings:
    """What the profiler recorded, as the trace shows it."""

    record_shapes: bool
    with_stack: bool
    with_modules: bool
    profile_memory: bool

    @classmethod
    def of(cls, table: EventTable) -> ProfilerSettings:
        py = table.kind == Kind.PYTHON_FUNCTION
        modules = False
        if py.any():
            is_module = np.array([n.startswith("nn.Module: ") for n in table.names], dtype=bool)
            modules = bool(is_module[table.name[py]].any())
        return cls(
            record_shapes=bool((table.shapes >= 0).any()),
            with_stack=bool(py.any()),
            with_modules=modules,
            profile_memory=bool((table.kind == Kind.MEMORY).any()),
        )

    def label(self) -> str:
        on = [
            name
            for name, flag in (
                ("record_shapes", self.record_shapes),
                ("with_stack", self.with_stack),
                ("with_modules", self.with_modules),
                ("profile_memory", self.profile_memory),
            )
            if flag
        ]
        return ", ".join(on) if on else "no extra recording"


@dataclass(frozen=True)
class ProfilerCost:
    """Host time the profiler adds per recorded event, in nanoseconds."""

    op_ns: float  # per CPU op or record_function range: entry and exit bookkeeping
    input_ns: float  # per recorded input of an op, with record_shapes
    runtime_ns: float  # per runtime call (CUPTI), inside the call
    python_ns: float  # per Python frame or module scope, with with_stack / with_modules
    memory_ns: float  # per [memory] event, with profile_memory
    source: str  # "fit", "calibration", "default" or "off"
    uncertainty: float  # relative: the cost is known to about +-this share
    note: str = ""
    # Per GPU task beyond the first that one launch call enqueues: CUPTI instruments every
    # kernel of a CUDA graph at launch (measured: cudaGraphLaunch of a 1,575-kernel graph took
    # 2.14 ms traced, ~1.36 µs per kernel, against a few µs unprofiled).
    task_ns: float = 0.0
    # Share by which the profiler lengthens the CPU work inside ops beyond its per-event
    # bookkeeping: traced time inside an op = (1 + work_share) x unprofiled (see
    # perfcast.real.estimate.CALIBRATION_WORK_SHARE for the measurement).
    work_share: float = 0.0

    def scaled(self, factor: float, **changes: object) -> ProfilerCost:
        return replace(
            self,
            op_ns=self.op_ns * factor,
            input_ns=self.input_ns * factor,
            runtime_ns=self.runtime_ns * factor,
            python_ns=self.python_ns * factor,
            memory_ns=self.memory_ns * factor,
            task_ns=self.task_ns * factor,
            work_share=self.work_share * factor,
            **changes,  # type: ignore[arg-type]
        )

    @property
    def is_off(self) -> bool:
        return self.source == "off"


OFF = ProfilerCost(0.0, 0.0, 0.0, 0.0, 0.0, source="off", uncertainty=0.0)


@dataclass
class Removed:
    """What the correction took out of one graph."""

    total_ns: int  # host time removed over the whole trace
    per_kind_ns: dict[str, int] = field(default_factory=dict)
    nodes: int = 0  # nodes whose duration changed


def input_counts(table: EventTable) -> np.ndarray:
    """Recorded inputs per row (0 without record_shapes): top-level entries of "Input Dims"."""
    counts = np.zeros(len(table), dtype=np.int32)
    has = np.flatnonzero(table.shapes >= 0)
    if has.size == 0:
        return counts
    per_name = {}
    for idx in np.unique(table.shapes[has]).tolist():
        per_name[idx] = len(parse_input_dims(table.names[idx]) or ())
    lookup = np.zeros(int(table.shapes[has].max()) + 1, dtype=np.int32)
    for idx, n in per_name.items():
        lookup[idx] = n
    counts[has] = lookup[table.shapes[has]]
    return counts


def remove_profiler_cost(graph: Graph, cost: ProfilerCost) -> tuple[Graph, Removed]:
    """A copy of the graph with the profiler's host cost taken out (see module docstring)."""
    # Only durations and sources change: the rest is shared (read-only) with the trace's graph.
    g = graph.copy(writable=("dur", "source"))
    if cost.is_off or graph.table is None:
        return g, Removed(0)
    table: EventTable = graph.table
    c = g.cols
    n = len(g)
    cut = np.zeros(n, dtype=np.float64)
    per_kind: dict[str, float] = {}

    # Nodes of each CPU lane in order, to find the segments around an event's boundaries.
    host = np.flatnonzero((c["kind"] != NodeKind.GPU) & g.alive)
    host = host[np.lexsort((c["order"][host], c["lane"][host]))]
    row_lane = g.cpu_lanes_of(table.rank, table.pid, table.tid)
    origin = np.array([g.rank_origin_ns.get(r, 0) for r in range(_max_rank(table) + 1)])

    def boundary_cuts(rows: np.ndarray, enter_ns: np.ndarray, exit_ns: np.ndarray, kind: str):
        """Charge each row's entry cost to the CPU segment ending at its start, its exit cost
        to the segment starting at its end (on its own thread)."""
        if rows.size == 0:
            return
        lane = row_lane[rows]
        ok = lane >= 0
        rows, lane, enter_ns, exit_ns = rows[ok], lane[ok], enter_ns[ok], exit_ns[ok]
        t0 = table.ts[rows] - origin[table.rank[rows]]
        t1 = t0 + table.dur[rows]
        hl = c["lane"][host]
        hs = c["start_measured"][host]
        he = hs + c["dur_measured"][host]
        for ln, sel in split_by(lane):  # one sort, not a mask per lane
            lo, hi = np.searchsorted(hl, np.array([ln, ln + 1], dtype=hl.dtype))
            if lo == hi:
                continue
            nodes, starts, ends = host[lo:hi], hs[lo:hi], he[lo:hi]
            # The node that ends exactly at the start (the last one starting before it).
            i = np.searchsorted(starts, t0[sel], side="left") - 1
            good = (i >= 0) & (ends[np.maximum(i, 0)] == t0[sel])
            np.add.at(cut, nodes[i[good]], enter_ns[sel][good])
            j = np.searchsorted(starts, t1[sel], side="left")
            good = (j < nodes.size) & (starts[np.minimum(j, nodes.size - 1)] == t1[sel])
            np.add.at(cut, nodes[j[good]], exit_ns[sel][good])
        per_kind[kind] = per_kind.get(kind, 0.0) + float(enter_ns.sum() + exit_ns.sum())

    ops = np.flatnonzero(np.isin(table.kind, [Kind.CPU_OP, Kind.USER_ANNOTATION]))
    if ops.size and (cost.op_ns or cost.input_ns):
        inputs = input_counts(table)[ops]
        enter = cost.op_ns * ENTER_SHARE + cost.input_ns * inputs
        exit_ = np.full(ops.size, cost.op_ns * (1 - ENTER_SHARE))
        boundary_cuts(ops, enter, exit_, "ops")
    py = np.flatnonzero(table.kind == Kind.PYTHON_FUNCTION)
    if py.size and cost.python_ns:
        half = np.full(py.size, cost.python_ns / 2)
        boundary_cuts(py, half, half, "python frames")

    # Only CPU segments give time back; runtime calls are corrected on their own below.
    is_segment = c["kind"] == NodeKind.CPU
    cut[~is_segment] = 0.0
    if cost.work_share > 0:
        # The ops' own work ran slower under the profiler: CPU segments whose innermost
        # enclosing event is an op (not Python between ops, not a user annotation or a
        # record_function range, where the CPU may be waiting) give back that share of what
        # is left.
        op = c["op"]
        row = np.maximum(op, 0)
        # record_function ranges ("ProfilerStep#3", "Optimizer.step#Adam.step",
        # "enumerate(DataLoader)#...") are CPU ops in 2021-era traces; their self time is
        # Python or waiting, not an op's work. ATen and custom op names hold no '#'.
        marker = np.fromiter(("#" in n for n in table.names), dtype=bool, count=len(table.names))
        inside = is_segment & g.alive & (op >= 0) & (table.kind[row] == Kind.CPU_OP)
        inside &= ~marker[table.name[row]]
        rest = np.maximum(c["dur"][inside] - cut[inside], 0.0)
        extra = rest * cost.work_share / (1.0 + cost.work_share)
        cut[inside] += extra
        per_kind["op work"] = float(extra.sum())

    rt = np.flatnonzero(
        np.isin(c["kind"], [NodeKind.LAUNCH, NodeKind.RUNTIME, NodeKind.SYNC]) & g.alive
    )
    if rt.size and (cost.runtime_ns or cost.task_ns):
        d = c["dur"][rt]
        keep = np.minimum(d, MIN_RUNTIME_NS)
        tasks = np.zeros(len(g), dtype=np.int64)
        launched = np.flatnonzero((c["kind"] == NodeKind.GPU) & (c["launch"] >= 0) & g.alive)
        np.add.at(tasks, c["launch"][launched], 1)
        want = cost.runtime_ns + cost.task_ns * np.maximum(tasks[rt] - 1, 0)
        cut[rt] = np.minimum(want, np.maximum(d - keep, 0))
        per_kind["runtime calls"] = float(cut[rt].sum())

    mem = np.flatnonzero(table.kind == Kind.MEMORY)
    if mem.size and cost.memory_ns:
        _memory_cuts(g, table, mem, cost.memory_ns, host, cut, origin, row_lane[mem])
        per_kind["memory events"] = float(mem.size * cost.memory_ns)

    new = np.maximum(c["dur"] - np.rint(cut).astype(np.int64), 0)
    # What one op record cost and was taken out: models that add ops by analogy with the
    # trace's (amp's casts) take it out of what they add too.
    g.nominal["profiler_op_ns"] = round(cost.op_ns)
    changed = new != c["dur"]
    removed = int((c["dur"] - new).sum())
    c["dur"] = new
    c["source"][changed & (c["source"] == Source.MEASURED)] = Source.CORRECTED
    return g, Removed(
        total_ns=removed,
        per_kind_ns={k: int(v) for k, v in per_kind.items()},
        nodes=int(changed.sum()),
    )


def _memory_cuts(
    g: Graph,
    table: EventTable,
    rows: np.ndarray,
    cost_ns: float,
    host: np.ndarray,
    cut: np.ndarray,
    origin: np.ndarray,
    lane: np.ndarray,
) -> None:
    """Each [memory] event costs the CPU segment it falls in (`lane`: each row's lane)."""
    c = g.cols
    t = table.ts[rows] - origin[table.rank[rows]]
    hl = c["lane"][host]
    hs = c["start_measured"][host]
    for ln, sel in split_by(lane):
        if ln < 0:
            continue
        lo, hi = np.searchsorted(hl, np.array([ln, ln + 1], dtype=hl.dtype))
        if lo == hi:
            continue
        i = np.searchsorted(hs[lo:hi], t[sel], side="right") - 1
        i = i[i >= 0]
        np.add.at(cut, host[lo:hi][i], cost_ns)


def _max_rank(table: EventTable) -> int:
    return int(table.rank.max()) if len(table) else 0
