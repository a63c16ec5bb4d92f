"""Where a what-if's predicted gain comes from, on the calling-context tree.

A prediction replays a transformed copy of the baseline graph: the nodes it keeps have the
same ids (what-ifs copy the graph and append), removed nodes are marked, and added nodes
(event = -1) carry the op they belong to. Each graph node is mapped to a node of the tree:
runtime calls and GPU work through their event row, CPU work between calls through the
innermost event on its thread that contains it, added nodes through their op.

Three measures per tree node:
  - step time saved (`path_saved_ns`): the time a node held on the critical path of each
    step (of the rank that sets it) in the baseline, less in the prediction. These add up
    to the step time saved: where the gain lands. Work that was hidden and now sets the
    step gets a negative share (the gain it gives back), and work the what-if did not
    touch gets a positive one when it left the path.
  - gain (`gain_ns`): the same, counted only at nodes the what-if changed (removed, added,
    or with a new duration): where the gain comes from. The call sites of a suggestion are
    ranked by it. A sped-up kernel that was hidden behind the CPU changed, but saves
    nothing, and gets nothing.
  - work saved (`gpu_saved_ns`, `cpu_saved_ns`): the GPU and CPU time the what-if removed
    there (graph durations), whether or not it set the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfcast.analysis.context import (
    ContextIndex,
    ContextTree,
    _aggregate,
    _sum_up,
)
from perfcast.analysis.context_views import TreeRow, sites
from perfcast.analysis.critical_path import critical_paths
from perfcast.arrays import combine_codes, split_by
from perfcast.events import NONE, EventTable
from perfcast.graph.model import Graph, NodeKind
from perfcast.sim.timeline import Timeline

GAIN_METRICS = ("path_saved_ns", "gain_ns", "gpu_saved_ns", "cpu_saved_ns")


@dataclass
class CallSite:
    """Where part of a gain lands: the module, the line of the user's code and the op."""

    module: str | None
    source: str | None  # "file.py:84 (forward)": the function's first line, as recorded
    op: str | None
    path: str  # the condensed call path of its largest node
    gain_ms: float  # its share of the step time saved, per step
    share: float


@dataclass
class GainAttribution:
    """A prediction's gain on the tree: `tree.excl`/`tree.incl` hold GAIN_METRICS (ns summed
    over steps); the totals and call sites are per step."""

    tree: ContextTree
    steps: int
    step_saved_ms: float  # change in critical-path length: the step time saved
    method: str  # how the call sites share the gain: "critical path" or "time removed"
    sites: list[CallSite] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Of step_saved_ms, the host's starting lead the predicted steps drain beyond the traced
    # ones: not kept by a running job, so not in the predicted step (sim.timeline).
    lead_not_kept_ms: float = 0.0


@dataclass
class SavedGainTree:
    """What `whatif --tree --json` saves of a gain tree: what `perfcast show` draws."""

    rows: list[TreeRow]
    sites: list[CallSite]
    step_saved_ms: float
    method: str
    steps: int = 1
    min_pct: float = 1.0
    lead_not_kept_ms: float = 0.0  # absent from results saved before it was added


@dataclass
class SavedWhatifTree:
    tree: SavedGainTree


def _innermost_rows(
    table: EventTable, rows: np.ndarray, a: np.ndarray, b: np.ndarray
) -> np.ndarray:
    """For each interval [a, b) of one thread, the innermost of `rows` (that thread's CPU
    events) containing it, or NONE."""
    out = np.full(a.shape[0], NONE, dtype=np.int64)
    if rows.size == 0 or a.size == 0:
        return out
    order = rows[np.lexsort((-table.dur[rows], table.ts[rows]))]
    ts = table.ts[order]
    end = table.ends()  # cached: this runs once per thread
    pos = np.searchsorted(ts, a, side="right") - 1
    cand = np.where(pos >= 0, order[np.maximum(pos, 0)], NONE).astype(np.int64)
    for _ in range(4096):  # climb out of siblings that ended before the interval did
        bad = np.flatnonzero((cand >= 0) & (end[np.maximum(cand, 0)] < b))
        if bad.size == 0:
            break
        cand[bad] = table.parent[cand[bad]]
    return cand


def graph_context(index: ContextIndex, graph: Graph, n_original: int | None = None) -> np.ndarray:
    """The tree node of every graph node (the root where nothing tells).

    `n_original`: how many leading nodes come from the trace (the baseline graph's size);
    later nodes were added by a what-if and are placed by their op.
    """
    table = index.table
    c = graph.cols
    n = len(graph)
    n_orig = n if n_original is None else min(n_original, n)
    out = np.zeros(n, dtype=np.int64)
    top = np.zeros(n, dtype=np.int64)
    if index.rank_nodes:
        lut = np.zeros(max(index.rank_nodes) + 1, dtype=np.int64)
        for r, node in index.rank_nodes.items():
            lut[r] = node
        top = lut[c["rank"]]
    out[:] = top
    ev = c["event"].astype(np.int64)
    op = c["op"].astype(np.int64)
    idx = np.arange(n)
    has_ev = (ev >= 0) & (ev < len(table))
    node_ev = np.where(has_ev, index.row_node[np.where(has_ev, ev, 0)], NONE)
    out = np.where(node_ev >= 0, node_ev, out)
    # CPU work between calls: the innermost event (frame, scope, op) around it.
    seg = np.flatnonzero(
        ~has_ev & (idx < n_orig) & np.isin(c["kind"], [NodeKind.CPU, NodeKind.WAIT])
    )
    seg = seg[c["dur_measured"][seg] > 0]  # zero-length markers have nothing to look up
    if seg.size:
        # Each thread's rows, grouped once (a whole-table mask per lane is O(lanes x rows)).
        cpu_rows = np.flatnonzero(index.on_tree & ~table.is_gpu())
        thread_code, threads = combine_codes(
            table.rank[cpu_rows], table.pid[cpu_rows], table.tid[cpu_rows]
        )
        rows_of = {
            tuple(threads[code].tolist()): cpu_rows[pos] for code, pos in split_by(thread_code)
        }
        for lane, pos in split_by(c["lane"][seg]):
            ln = graph.lanes[lane]
            nodes = seg[pos]
            rows = rows_of.get((ln.rank, ln.pid, ln.tid), cpu_rows[:0])
            origin = graph.rank_origin_ns.get(ln.rank, 0)
            a = c["start_measured"][nodes] + origin
            b = a + c["dur_measured"][nodes]
            inner = _innermost_rows(table, rows, a, b)
            found = inner >= 0
            node_in = np.where(found, index.row_node[np.maximum(inner, 0)], NONE)
            out[nodes[found & (node_in >= 0)]] = node_in[found & (node_in >= 0)]
    # Nodes without an event of their own (added by a what-if, or split off by the graph
    # builder, like the wait of a blocking copy): by the op they belong to.
    by_op = np.flatnonzero(~has_ev & ~np.isin(idx, seg) & (op >= 0) & (op < len(table)))
    if by_op.size:
        node_op = index.row_node[op[by_op]]
        ok = node_op >= 0
        out[by_op[ok]] = node_op[ok]
    return out


def _path_ns(tl: Timeline) -> np.ndarray:
    """Per graph node, time held on the critical path of the rank that sets each step."""
    per = np.zeros(len(tl.graph), dtype=np.float64)
    sim = {(r, name): s for r, name, _, s in tl.iteration_ns()}
    slowest: dict[str, tuple[int, int]] = {}
    for (r, name), s in sim.items():
        if name not in slowest or s > slowest[name][1]:
            slowest[name] = (r, s)
    for cp in critical_paths(tl, keep_steps=False):
        if slowest.get(cp.iteration, (None,))[0] != cp.rank:
            continue
        # A stretch can be charged twice where a dependency's measured slack is negative;
        # scale so a path's charges add up to its length.
        ns = cp.path_ns.astype(np.float64)
        total = ns.sum()
        if total > 0:
            ns *= cp.total_ms * 1e6 / total
        np.add.at(per, cp.path_nodes, ns)
    return per


def _work(tl: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """(GPU work, CPU work) per graph node, from the durations the replay was given (a
    synchronization's own cost, not the wait the replay adds)."""
    g = tl.graph
    dur = np.where(g.alive, g.cols["dur"], 0).astype(np.float64)
    gpu = g.cols["kind"] == NodeKind.GPU
    return np.where(gpu, dur, 0.0), np.where(gpu, 0.0, dur)


@dataclass
class BaselineContext:
    """What every prediction against one baseline shares: the tree, where each baseline
    node sits on it, and the baseline's critical-path and replayed times per node."""

    index: ContextIndex
    baseline: Timeline
    ctx: np.ndarray
    path_ns: np.ndarray
    span_ns: np.ndarray
    tree: ContextTree

    @classmethod
    def of(cls, index: ContextIndex, baseline: Timeline) -> BaselineContext:
        steps = max(len({s.name for s in baseline.graph.iterations}), 1)
        return cls(
            index=index,
            baseline=baseline,
            ctx=graph_context(index, baseline.graph),
            path_ns=_path_ns(baseline),
            span_ns=_span(baseline),
            tree=_aggregate(index, np.ones(len(index.table), dtype=bool), {}, steps),
        )


def _added_context(index: ContextIndex, graph: Graph, start: int) -> np.ndarray:
    """Tree nodes of graph nodes from `start` on (added by a what-if): by event, else op."""
    c = graph.cols
    n_rows = len(index.table)
    out = np.zeros(len(graph) - start, dtype=np.int64)
    if index.rank_nodes:
        lut = np.zeros(max(index.rank_nodes) + 1, dtype=np.int64)
        for r, top in index.rank_nodes.items():
            lut[r] = top
        out[:] = lut[c["rank"][start:]]
    for col in ("op", "event"):  # the event, where there is one, wins
        rows = c[col][start:].astype(np.int64)
        ok = (rows >= 0) & (rows < n_rows)
        found = np.where(ok, index.row_node[np.where(ok, rows, 0)], NONE)
        out = np.where(found >= 0, found, out)
    return out


def attribute_gain(
    index: ContextIndex,
    baseline: Timeline,
    predicted: Timeline,
    top: int = 5,
    base: BaselineContext | None = None,
) -> GainAttribution:
    """The predicted gain of `predicted` over `baseline`, per node of the tree. Pass `base`
    (BaselineContext.of) to share the baseline's work among many predictions."""
    if base is None or base.baseline is not baseline or base.index is not index:
        base = BaselineContext.of(index, baseline)
    gb, gp = baseline.graph, predicted.graph
    n_base = len(gb)
    notes: list[str] = []
    same_nodes = len(gp) >= n_base and bool(
        np.array_equal(gp.cols["event"][:n_base], gb.cols["event"])
    )
    ctx_b = base.ctx
    if same_nodes:
        ctx_p = np.concatenate([ctx_b, _added_context(index, gp, n_base)])
    else:  # a model that rebuilt the graph: only events and ops place its nodes
        notes.append("the prediction renumbered the graph: its nodes are placed by event only")
        ctx_p = graph_context(index, gp, 0)
    steps = max(len({s.name for s in gb.iterations}), 1)
    n_nodes = len(index)

    def on_tree(ctx: np.ndarray, values: np.ndarray) -> np.ndarray:
        return np.bincount(ctx, weights=values, minlength=n_nodes)

    # Changed nodes: removed, added, or with another duration.
    alive_b = gb.alive
    alive_p = gp.alive
    changed_b = np.ones(n_base, dtype=bool)
    changed_p = np.ones(len(gp), dtype=bool)
    if same_nodes:
        kept = alive_b & alive_p[:n_base]
        same = kept & (gb.cols["dur"] == gp.cols["dur"][:n_base])
        changed_b = ~same
        changed_p[:n_base] = ~same
    gpu_b, cpu_b = _work(baseline)
    gpu_p, cpu_p = _work(predicted)
    # Unchanged nodes cancel exactly; leaving them out keeps rounding out of the sums.
    gpu_saved = on_tree(ctx_b[changed_b], gpu_b[changed_b]) - on_tree(
        ctx_p[changed_p], gpu_p[changed_p]
    )
    cpu_saved = on_tree(ctx_b[changed_b], cpu_b[changed_b]) - on_tree(
        ctx_p[changed_p], cpu_p[changed_p]
    )
    path_b, path_p = base.path_ns, _path_ns(predicted)
    path_saved = on_tree(ctx_b, path_b) - on_tree(ctx_p, path_p)
    gain = on_tree(ctx_b[changed_b], path_b[changed_b]) - on_tree(
        ctx_p[changed_p], path_p[changed_p]
    )
    step_saved = float(path_saved.sum())
    # Where the gain comes from. Usually the changed nodes held the time the step saves
    # (kernels sped up on the path, launches removed from it). A removed synchronization
    # is the exception: the time it frees shows up at the unchanged work that may now start
    # earlier. Where the changed nodes explain less than half the gain, the changed nodes
    # are weighted by the replayed time they no longer take (a sync's wait) instead.
    method = "critical path"
    weights = gain
    if step_saved > 0 and float(gain[gain > 0].sum()) < 0.5 * step_saved:
        span_b, span_p = base.span_ns, _span(predicted)
        weights = on_tree(ctx_b[changed_b], span_b[changed_b]) - on_tree(
            ctx_p[changed_p], span_p[changed_p]
        )
        method = "time removed"
    excl = {
        "path_saved_ns": np.rint(path_saved).astype(np.int64),
        "gain_ns": np.rint(gain).astype(np.int64),
        "gpu_saved_ns": np.rint(gpu_saved).astype(np.int64),
        "cpu_saved_ns": np.rint(cpu_saved).astype(np.int64),
    }
    incl = {k: _sum_up(index.parent, index.level_start, v) for k, v in excl.items()}
    tree = ContextTree(
        index=index,
        excl=excl,
        incl=incl,
        coverage=base.tree.coverage,
        compiled=base.tree.compiled,
        selection={},
        steps=steps,
        notes=list(base.tree.notes) + notes,
    )
    return GainAttribution(
        tree=tree,
        steps=steps,
        step_saved_ms=step_saved / 1e6 / steps,
        method=method,
        sites=call_sites(index, weights, step_saved / steps, top=top),
        notes=notes,
        lead_not_kept_ms=_lead_not_kept_ms(baseline, predicted),
    )


def _lead_not_kept_ms(baseline: Timeline, predicted: Timeline) -> float:
    """Per step, the host lead the prediction does not count (whatif.runner: over all steps,
    as the tree sums them)."""
    from perfcast.whatif.runner import lead_not_kept_ms

    return lead_not_kept_ms(baseline, predicted, [])


def _span(tl: Timeline) -> np.ndarray:
    """Replayed time of each graph node (end - start; a synchronization's includes its wait)."""
    ok = tl.graph.alive & (tl.start >= 0)
    return np.where(ok, tl.end - tl.start, 0).astype(np.float64)


def call_sites(
    index: ContextIndex,
    weights: np.ndarray,
    total_ns: float,
    top: int = 5,
    min_share: float = 0.01,
) -> list[CallSite]:
    """The `top` call sites of a gain of `total_ns`, shared out by `weights` (per tree node,
    exclusive; only positive weights count), grouped as `context_views.sites` does."""
    if total_ns <= 0:
        return []
    return [
        CallSite(
            module=s.module,
            source=s.source,
            op=s.op,
            path=s.path,
            gain_ms=s.share * total_ns / 1e6,
            share=s.share,
        )
        for s in sites(index, weights, top=top, min_share=min_share)
    ]


class SiteFinder:
    """The call sites of many predictions against one baseline, for the advisor: the tree
    and the baseline's share of the work are computed once, on first use."""

    def __init__(self, table: EventTable, baseline: Timeline, top: int = 5) -> None:
        self.table = table
        self.baseline = baseline
        self.top = top
        self._base: BaselineContext | None = None

    def __call__(self, predicted: Timeline) -> list[CallSite]:
        if self._base is None:
            from perfcast.analysis.context import build_index

            self._base = BaselineContext.of(build_index(self.table), self.baseline)
        base = self._base
        return attribute_gain(base.index, base.baseline, predicted, self.top, base).sites
