"""Replayed timelines as a Chrome/Perfetto trace: one process per timeline and rank.

Baseline and prediction go side by side as separate processes; launch -> kernel and the
dependencies the replay resolved are drawn as flow arrows, each GPU stream gets a counter
track of its launch queue (operations launched and not yet finished), so a prediction shows
where the queue fills or drains, and each rank a track of its steps as the replay times them.

Perfetto's JSON importer binds an arrow's end to the slice on top of its track's stack when
it reads the end, and pops a finished slice only when the next one begins, so an end placed
by time alone can land on a child that has already finished. Each arrow is therefore given
at the start of both its slices (Perfetto reads the slices that start at a time before the
arrows there), or, where a slice's first child starts with it and would be on top, carried
on the two slices themselves (flow v2: "bind_id" with "flow_out"/"flow_in"; one per slice).
Perfetto draws an arrow from the end of the slice it reads first to the start of the other,
whatever the direction given: an arrow that would point back in time is left out, and the
document's otherData counts what was left out and why.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from perfcast.arrays import sorted_unique, split_by
from perfcast.events import Kind
from perfcast.graph.model import NONE as NONE_NODE
from perfcast.graph.model import EdgeType, NodeKind, Source
from perfcast.paths import write_output
from perfcast.sim.timeline import Timeline

_EDGE_LABEL = {
    int(EdgeType.CROSS_STREAM): "cross-stream wait",
    int(EdgeType.CROSS_THREAD): "thread hand-off",
    int(EdgeType.COLLECTIVE): "collective",
    int(EdgeType.DATA): "dependency",
}
QUEUE_COUNTER_POINTS = 2_000  # samples per stream's launch-queue counter track, at most
QUEUE_COUNTER_BUDGET = 200_000  # samples over all streams of one timeline
EXPORT_BATCH = 100_000  # events encoded and written at a time
_SOURCE_LABEL = {
    int(Source.MEASURED): "measured",
    int(Source.CORRECTED): "measured less the profiler's cost",
    int(Source.SCALED): "scaled",
    int(Source.MODELLED): "modelled",
}
_OP_KINDS = (Kind.CPU_OP, Kind.USER_ANNOTATION)
_NO_TIME = np.iinfo(np.int64).max
# Flow v2 ids start here: Perfetto numbers v1 arrows (s/f events) from 0 in the same space.
V2_FLOW_ID_BASE = 1 << 32
STEPS_TRACK = "steps (as the replay times them)"
# Tracks are numbered from 1: Perfetto reads tid 0 as the process's own id (json_trace_
# tokenizer.cc), which with 1,000 lanes was rank 0's steps track, merging the two.
TID_BASE = 1


def _clock_shift(g: Any) -> dict[int, int]:
    """Per rank, ns to add so that every rank is on one clock: the ranks' replays start at 0
    each, and the offsets that aligned their collectives put them on a common one."""
    shift = g.rank_clock_ns
    if not shift:
        return {}
    base = min(shift.values())
    return {int(r): int(x - base) for r, x in shift.items()}


def _per_node(g: Any, per_rank: dict[int, int]) -> np.ndarray:
    c = g.cols
    if not per_rank or len(g) == 0:
        return np.zeros(len(g), dtype=np.int64)
    table = np.zeros(max(int(c["rank"].max()), max(per_rank)) + 1, dtype=np.int64)
    for r, x in per_rank.items():
        table[r] = x
    return table[c["rank"]]


def _as_traced(tl: Timeline) -> bool:
    """Whether the timeline is the trace replayed as it ran: every node where it was
    measured (the replay of an unchanged graph reproduces the trace)."""
    g = tl.graph
    c = g.cols
    if g.table is None or (g.removed is not None and bool(g.removed.any())):
        return False
    start = c["start_measured"]
    same_start = np.array_equal(tl.start, start)
    return bool(same_start and np.array_equal(tl.end, start + c["dur_measured"]))


def _climb(parent: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`rows` and all their ancestors, each once, ascending."""
    seen = np.zeros(parent.size, dtype=bool)
    frontier = sorted_unique(np.asarray(rows, dtype=np.int64))
    while frontier.size:
        seen[frontier] = True
        up = parent[frontier].astype(np.int64)
        up = up[up >= 0]
        frontier = sorted_unique(up[~seen[up]])
    return np.flatnonzero(seen)


def _depth(parent: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """How many ancestors each row has."""
    depth = np.zeros(rows.size, dtype=np.int64)
    cur = parent[rows].astype(np.int64)
    while (more := cur >= 0).any():
        depth += more
        cur[more] = parent[cur[more]]
    return depth


def _rank_origins(g: Any) -> np.ndarray:
    """Per lane, its rank's clock origin (ns on the trace's clock)."""
    return np.array([g.rank_origin_ns.get(int(ln.rank), 0) for ln in g.lanes], dtype=np.int64)


def _traced_op_spans(g: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every op on a thread of the graph, and the frames and ranges around ops, with the
    extents the trace gives them: (rows, lane, start, end) on the rank's replay clock. A frame
    entered before the replay's first node (the script's own frames around the profiled
    steps) starts at 0, as a replayed world draws it: Perfetto keeps no time before 0."""
    table = g.table
    ops = np.flatnonzero(table.kind_mask(_OP_KINDS))
    lane = g.cpu_lanes_of(table.rank[ops], table.pid[ops], table.tid[ops])
    rows = _climb(table.parent, ops[lane >= 0])
    lane = g.cpu_lanes_of(table.rank[rows], table.pid[rows], table.tid[rows])
    rows, lane = rows[lane >= 0], lane[lane >= 0]
    lo = table.ts[rows].astype(np.int64) - _rank_origins(g)[lane]
    return rows, lane, np.maximum(lo, 0), lo + table.dur[rows].astype(np.int64)


def _warp(tl: Timeline, lanes: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Traced times (ns from the rank's origin) on CPU lanes, carried onto the timeline: a
    time inside a node lands as far into the node's replayed run (in proportion); -1 on a
    lane with no node left."""
    g = tl.graph
    c = g.cols
    out = np.full(t.size, -1, dtype=np.int64)
    alive = np.flatnonzero(g.alive)
    alive = alive[np.isin(c["lane"][alive], lanes)]
    on_lane = {ln: alive[pos] for ln, pos in split_by(c["lane"][alive], c["order"][alive])}
    for ln, pos in split_by(lanes):
        nodes = on_lane.get(ln)
        if nodes is None:
            continue
        order = c["order"][nodes]
        k = np.searchsorted(order, t[pos], side="right") - 1
        at = nodes[np.maximum(k, 0)]
        measured = np.maximum(c["dur_measured"][at], 1).astype(np.float64)
        frac = np.clip((t[pos] - order[np.maximum(k, 0)]) / measured, 0.0, 1.0)
        frac[k < 0] = 0.0
        s, e = tl.start[at], tl.end[at]
        out[pos] = s + np.rint(frac * (e - s)).astype(np.int64)
    return out


def _simulated_op_spans(
    tl: Timeline, pieces: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One slice per op from its self-time pieces: (op rows, lane, start, end, pieces left
    to draw one by one). An op spans its own pieces and every descendant op's (host nodes:
    CPU pieces, runtime calls), so ops nest as they ran and a step is one slice; one with no
    time of its own (a wrapper its child fills) spans its children. An op with no node at all
    in the graph (one that took no time) sits where its traced time lands on the replay; one
    whose nodes a what-if removed is left out. An op whose pieces a what-if put on more than
    one lane is drawn as its pieces, and so is a piece a what-if placed outside its op's
    traced run (activation-checkpointing's recomputed forward, in backward): spanning both,
    its op's slice crossed everything between them."""
    g = tl.graph
    c = g.cols
    table = g.table
    start, end = tl.start, tl.end
    n = len(table)
    parent = table.parent
    op = c["op"][pieces].astype(np.int64)
    lane = c["lane"][pieces].astype(np.int64)
    moved = _moved_pieces(g, pieces)
    lane_lo = np.full(n, _NO_TIME, dtype=np.int64)
    lane_hi = np.full(n, -1, dtype=np.int64)
    np.minimum.at(lane_lo, op[~moved], lane[~moved])
    np.maximum.at(lane_hi, op[~moved], lane[~moved])
    # An op with no piece of its own (lane_hi -1) is not split: it takes its children's.
    split = (lane_hi >= 0) & (lane_lo != lane_hi)
    one_lane = ~split[op] & ~moved
    lo = np.full(n, _NO_TIME, dtype=np.int64)
    hi = np.full(n, -_NO_TIME, dtype=np.int64)
    np.minimum.at(lo, op[one_lane], start[pieces][one_lane])
    np.maximum.at(hi, op[one_lane], end[pieces][one_lane])
    lane_of = np.where(split, -1, lane_hi)
    # Bounds climb the op tree one level per pass (a parent may have no piece of its own);
    # a row updated in a pass passes its bounds on in the next.
    frontier = sorted_unique(op[one_lane])
    while frontier.size:
        up = parent[frontier].astype(np.int64)
        ok = up >= 0
        child, up = frontier[ok], up[ok]
        same = ((lane_of[up] < 0) | (lane_of[up] == lane_of[child])) & ~split[up]
        child, up = child[same], up[same]
        lane_of[up] = lane_of[child]
        before_lo, before_hi = lo[up].copy(), hi[up].copy()
        np.minimum.at(lo, up, lo[child])
        np.maximum.at(hi, up, hi[child])
        frontier = sorted_unique(up[(lo[up] < before_lo) | (hi[up] > before_hi)])
    drawn = (lo <= hi) & (lane_of >= 0)
    _place_timeless_ops(tl, lo, hi, lane_of, drawn)
    _widen_frames(tl, lo, hi, lane_of, drawn)
    rows = np.flatnonzero(drawn)
    return rows, lane_of[rows], lo[rows], hi[rows], pieces[~one_lane]


def _moved_pieces(g: Any, pieces: np.ndarray) -> np.ndarray:
    """Which host pieces sit outside their op's traced run on their lane's order (a time on
    the rank's clock, as the trace's): copies a what-if inserted elsewhere. The trace's own
    pieces are all inside their op."""
    c = g.cols
    table = g.table
    op = c["op"][pieces].astype(np.int64)
    lo = table.ts[op].astype(np.int64) - _rank_origins(g)[c["lane"][pieces]]
    at = c["order"][pieces]
    return (at < lo) | (at > lo + table.dur[op].astype(np.int64))


def _place_timeless_ops(
    tl: Timeline, lo: np.ndarray, hi: np.ndarray, lane_of: np.ndarray, drawn: np.ndarray
) -> None:
    """Ops with no node in the graph (zero-length ones; the frames around nothing else)
    placed, in place, where their traced times land on the replay, inside the nearest
    enclosing op that has nodes. Under an op a what-if removed they stay out."""
    g = tl.graph
    c = g.cols
    table = g.table
    parent = table.parent
    host = (c["kind"] != NodeKind.GPU) & (c["op"] >= 0)
    had = np.zeros(len(table), dtype=bool)
    had[_climb(parent, c["op"][host])] = True
    ops = np.flatnonzero(table.kind_mask(_OP_KINDS) & ~had)
    if ops.size == 0:
        return
    rows = _climb(parent, ops)
    rows = rows[~had[rows]]
    anchor = parent[rows].astype(np.int64)
    while (up := (anchor >= 0) & ~had[np.maximum(anchor, 0)]).any():
        anchor[up] = parent[anchor[up]]
    lane = g.cpu_lanes_of(table.rank[rows], table.pid[rows], table.tid[rows])
    keep = (lane >= 0) & ((anchor < 0) | drawn[np.maximum(anchor, 0)])
    rows, anchor, lane = rows[keep], anchor[keep], lane[keep]
    origin = _rank_origins(g)[lane]
    t0 = table.ts[rows].astype(np.int64) - origin
    a = _warp(tl, lane, t0)
    b = np.maximum(_warp(tl, lane, t0 + table.dur[rows].astype(np.int64)), a)
    ok = a >= 0
    inside = ok & (anchor >= 0)
    inside[inside] = lane_of[anchor[inside]] == lane[inside]
    up = anchor[inside]
    a[inside] = np.clip(a[inside], lo[up], hi[up])
    b[inside] = np.clip(b[inside], lo[up], hi[up])
    lo[rows[ok]], hi[rows[ok]], lane_of[rows[ok]] = a[ok], b[ok], lane[ok]
    drawn[rows[ok]] = True


def _widen_frames(
    tl: Timeline, lo: np.ndarray, hi: np.ndarray, lane_of: np.ndarray, drawn: np.ndarray
) -> None:
    """Python frames (and ranges that are not ops) span their traced times carried onto the
    replay, not only their ops': their own CPU time is their enclosing op's, so their
    pieces say nothing of where they begin and end. Kept inside that op's slice."""
    g = tl.graph
    table = g.table
    rows = np.flatnonzero(drawn & ~table.kind_mask(_OP_KINDS))
    if rows.size == 0:
        return
    is_op = drawn & table.kind_mask(_OP_KINDS)
    parent = table.parent
    anchor = parent[rows].astype(np.int64)
    while (up := (anchor >= 0) & ~is_op[np.maximum(anchor, 0)]).any():
        anchor[up] = parent[anchor[up]]
    lane = lane_of[rows]
    t0 = table.ts[rows].astype(np.int64) - _rank_origins(g)[lane]
    a = _warp(tl, lane, t0)
    b = _warp(tl, lane, t0 + table.dur[rows].astype(np.int64))
    a = np.where(a >= 0, np.minimum(a, lo[rows]), lo[rows])
    b = np.where(b >= 0, np.maximum(b, hi[rows]), hi[rows])
    inside = anchor >= 0
    inside[inside] = lane_of[anchor[inside]] == lane[inside]
    up = anchor[inside]
    a[inside] = np.clip(a[inside], lo[up], hi[up])
    b[inside] = np.clip(b[inside], lo[up], hi[up])
    lo[rows], hi[rows] = a, b


def _gpu_overlap_tracks(
    g: Any, gpu: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray
) -> np.ndarray:
    """Per node, the track (tid) it is drawn on: its lane, or for GPU work that starts
    before its stream predecessor ends (programmatic dependent launch on Blackwell: the
    B200 trace has 74 such pairs) an extra track of that lane, since a viewer cannot draw
    partly overlapping slices on one track."""
    c = g.cols
    tid = c["lane"].astype(np.int64)
    if gpu.size < 2:
        return tid
    order = gpu[np.lexsort((start_ns[gpu], c["lane"][gpu]))]
    lane = c["lane"][order]
    same = np.r_[False, lane[1:] == lane[:-1]]
    # The latest end so far on the lane, before each node (ends are per lane: restart the
    # running maximum where the lane changes by offsetting each lane's block).
    ends = end_ns[order].astype(np.float64)
    block = np.cumsum(~same)
    offset = block * (float(end_ns.max()) + 1.0)
    running = np.maximum.accumulate(ends + offset) - offset
    before = np.r_[-np.inf, running[:-1]]
    overlap = same & (start_ns[order] < before)
    # The overlapping ones (few) share extra tracks per lane, each on the first whose last
    # slice has ended: track k of lane l is tid k * len(lanes) + l.
    last_end: dict[tuple[int, int], int] = {}
    for node in order[overlap].tolist():
        ln, k = int(c["lane"][node]), 1
        while (ln, k) in last_end and last_end[(ln, k)] > start_ns[node]:
            k += 1
        last_end[(ln, k)] = int(end_ns[node])
        tid[node] = k * len(g.lanes) + ln
    return tid


def _crossing_tracks(
    cpu_lane: np.ndarray,
    op_lane: np.ndarray,
    op_lo: np.ndarray,
    op_hi: np.ndarray,
    node_tid: np.ndarray,
    node_lo: np.ndarray,
    node_hi: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, int]:
    """The tracks of the ops' slices and the nodes' (op slices first, as written), with each
    slice on a thread (`cpu_lane`: per lane, whether it is one) that would cross one still
    open there moved to an extra track of its thread (track k of lane l: tid k * lanes + l),
    and how many were moved. Perfetto nests
    a slice under the one open on its track and cannot end it after its parent: a wait the
    replay counts as its op's time outlasting the Python frame it began in (the MI300X
    trace), a frame the trace itself has straddling a step's end (the H100 BERT trace). The
    slices are walked in Perfetto's read order with its stack rule (tests/perfetto_import.py);
    GPU work has its own tracks already (_gpu_overlap_tracks)."""
    tid = np.concatenate([op_lane, node_tid]).astype(np.int64)
    start = np.concatenate([op_lo, node_lo]).astype(np.int64)
    end = np.concatenate([op_hi, node_hi]).astype(np.int64)
    n_lanes = cpu_lane.size
    cpu = np.flatnonzero(tid < n_lanes)
    cpu = cpu[cpu_lane[tid[cpu]]]
    order = cpu[np.lexsort((cpu, start[cpu] - end[cpu], start[cpu], tid[cpu]))]
    stack: list[tuple[int, int]] = []
    track = -1
    last_end: dict[tuple[int, int], int] = {}
    moved = 0
    for i, t, s, e in zip(
        order.tolist(), tid[order].tolist(), start[order].tolist(), end[order].tolist(), strict=True
    ):
        if t != track:
            stack, track = [], t
        while stack:
            s0, e0 = stack[-1]
            # Perfetto closes a slice once one begins after its end (or at it, unless both
            # are instants at one time).
            if e0 < s or (e0 == s and not (e0 == s0 and e == s)):
                stack.pop()
                continue
            break
        if stack and s < stack[-1][1] < e:
            k = 1
            while last_end.get((t, k), s) > s:
                k += 1
            last_end[(t, k)] = e
            tid[i] = k * n_lanes + t
            moved += 1
            continue
        stack.append((s, e))
    return tid[: op_lane.size], tid[op_lane.size :], moved


def _collective_arrivals(g: Any) -> np.ndarray:
    """Per node, the collective transfer it is drawn inside (NONE for most): matched
    collectives are replayed as a zero-length arrival (and, on the last rank to arrive, a
    zero-length barrier) before the transfer, which a viewer showed as a 0 µs slice and a
    short one under the kernel's name, twice as many collective slices as the trace had. The
    arrivals and barriers are the zero-length nodes the collective edges join, and the
    zero-length copy just before a barrier on its stream (the last arriver's arrival)."""
    c = g.cols
    into = np.full(len(g), NONE_NODE, dtype=np.int64)
    coll = (g.edge_type == int(EdgeType.COLLECTIVE)) & g.alive[g.edge_src] & g.alive[g.edge_dst]
    if not coll.any():
        return into
    src, dst = g.edge_src[coll], g.edge_dst[coll]
    zero = (c["dur_measured"] == 0) & (c["event"] < 0) & g.alive
    hubs = np.intersect1d(src, dst)  # barriers: both ends of collective edges
    marks = np.zeros(len(g), dtype=bool)
    marks[src[zero[src]]] = True  # arrivals and barriers (every barrier is a source)
    alive = np.flatnonzero(g.alive)
    order = alive[np.lexsort((c["order"][alive], c["lane"][alive]))]
    lane = c["lane"][order]
    mark = marks[order]
    # The last arriver's own arrival: the zero-length copy right before its barrier.
    before_hub = np.zeros(order.size, dtype=bool)
    before_hub[:-1] = mark[1:] & np.isin(order[1:], hubs) & (lane[:-1] == lane[1:])
    mark |= before_hub & zero[order]
    # Each mark belongs to the next unmarked node on its lane.
    pos = np.arange(order.size)
    nxt = np.where(~mark, pos, order.size)
    nxt = np.minimum.accumulate(nxt[::-1])[::-1]
    ok = mark & (nxt < order.size)
    # Only into the collective it was copied from (the same name, on its lane): a what-if
    # that removed that transfer (ddp, zero) leaves its arrival to be drawn on its own.
    ok[ok] = (lane[nxt[ok]] == lane[ok]) & (c["name"][order[nxt[ok]]] == c["name"][order[ok]])
    into[order[ok]] = order[nxt[ok]]
    return into


@dataclass
class _Slices:
    """Every slice ("X" event) of a timeline, in the order they are written: ops, then nodes,
    then steps. Times in ns on the export's clock."""

    pid: np.ndarray
    tid: np.ndarray
    start: np.ndarray
    end: np.ndarray


@dataclass
class _Arrows:
    """Flow arrows: given as s/f events (`v1`: first slice, second slice, category) or
    carried on the slices (`bind`: the v2 id per slice, -1 for none; `out`: whether it
    starts there); `left_out`: how many arrows were left out, and why."""

    v1: list[tuple[int, int, str]] = field(default_factory=list)
    bind: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    out: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    left_out: dict[str, int] = field(default_factory=dict)

    def count(self, why: str, n: int = 1) -> None:
        self.left_out[why] = self.left_out.get(why, 0) + n


def _read_order(s: _Slices, by_track: bool = False) -> np.ndarray:
    """The slices in the order Perfetto reads them: by time, then the longest first, then as
    written (its sorter's key for complete events); `by_track`: each track's in turn."""
    keys: tuple[np.ndarray, ...] = (np.arange(s.start.size), s.start - s.end, s.start)
    return np.lexsort((*keys, s.tid, s.pid) if by_track else keys)


def _bind_arrows(
    s: _Slices,
    pos: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    cats: list[str],
    cat: np.ndarray,
    ids: Iterator[int],
) -> _Arrows:
    """How each arrow from slice a[i] to slice b[i] is given so that Perfetto binds it to
    those two slices (see the module's notes); `pos`: each slice's place in Perfetto's read
    order. Perfetto draws an arrow from the end of the slice it reads first to the start of
    the other: one whose source is read after its destination would point back in time and
    is left out, unless the two slices have an arrow the other way (a collective's arrival
    -> barrier and barrier -> transfer), which is drawn once."""
    n = s.start.size
    arrows = _Arrows(bind=np.full(n, -1, dtype=np.int64), out=np.zeros(n, dtype=bool))
    if a.size == 0:
        return arrows
    order = _read_order(s, by_track=True)
    # A v1 arrow given at a slice's start binds to it when no later-read slice of its track
    # starts at that time too (a child that starts with it would be on top).
    nxt = np.full(n, _NO_TIME, dtype=np.int64)
    track = (s.pid[order][1:] == s.pid[order][:-1]) & (s.tid[order][1:] == s.tid[order][:-1])
    nxt[order[:-1][track]] = s.start[order[1:][track]]
    alone = nxt > s.start
    backwards = pos[a] > pos[b]
    # Perfetto needs an arrow's first slice read before its second.
    first = np.where(pos[a] <= pos[b], a, b)
    second = np.where(pos[a] <= pos[b], b, a)
    # One arrow per two slices and category, a forward one where there is one.
    by = np.lexsort((backwards, cat, second, first))
    first, second, cat, backwards = first[by], second[by], cat[by], backwards[by]
    head = np.r_[True, (first[1:] != first[:-1]) | (second[1:] != second[:-1])]
    head[1:] |= cat[1:] != cat[:-1]
    first, second, cat, backwards = first[head], second[head], cat[head], backwards[head]
    for k, m in zip(*np.unique(cat[backwards], return_counts=True), strict=True):
        arrows.count(f"{cats[int(k)]} (would point back in time)", int(m))
    keep = np.flatnonzero(~backwards)
    keep = keep[np.argsort(pos[first[keep]], kind="stable")]
    first, second, cat = first[keep], second[keep], cat[keep]
    v1 = alone[first] & alone[second]
    arrows.v1 = list(
        zip(
            first[v1].tolist(),
            second[v1].tolist(),
            [cats[i] for i in cat[v1].tolist()],
            strict=True,
        )
    )
    bind, out = arrows.bind, arrows.out
    for f, t, k in zip(first[~v1].tolist(), second[~v1].tolist(), cat[~v1].tolist(), strict=True):
        # One v2 id per slice: an arrow in needs a free slice; an arrow out shares its
        # slice's id with the other arrows out of it.
        if bind[t] < 0 and (bind[f] < 0 or out[f]):
            if bind[f] < 0:
                bind[f], out[f] = V2_FLOW_ID_BASE + next(ids), True
            bind[t] = bind[f]
        else:
            arrows.count(f"{cats[k]} (a slice with an arrow already, that no time binds)")
    return arrows


def timeline_events(
    tl: Timeline,
    label: str,
    pid_base: int,
    flows: bool = True,
    flow_ids: Iterator[int] | None = None,
    notes: dict[str, Any] | None = None,
) -> Iterator[dict[str, Any]]:
    """The timeline's slices, launch-queue counters, steps and flow arrows, its ranks as
    processes numbered from `pid_base`; flow ids drawn from `flow_ids` (unique across
    timelines). What the export leaves out or shifts goes into `notes` when given. Yielded
    one by one: a thousand ranks make tens of millions of them."""
    ids = itertools.count(1) if flow_ids is None else flow_ids
    g = tl.graph
    c = g.cols
    alive = np.flatnonzero(g.alive)
    # CPU gaps outside any op are idle time: not drawn.
    drawn = alive[(c["kind"][alive] != NodeKind.CPU) | (c["op"][alive] >= 0)]
    ranks = sorted({ln.rank for ln in g.lanes})
    pid_of = {r: pid_base + i for i, r in enumerate(ranks)}
    shift_of = _clock_shift(g)
    for r in ranks:
        args: dict[str, Any] = {"name": f"{label} · rank {r}"}
        if shift_of:
            args["clock shift (µs)"] = shift_of.get(r, 0) / 1000.0
        yield {"ph": "M", "name": "process_name", "pid": pid_of[r], "tid": 0, "args": args}
        yield {
            "ph": "M",
            "name": "process_sort_index",
            "pid": pid_of[r],
            "tid": 0,
            "args": {"sort_index": pid_of[r]},
        }
    for i, ln in enumerate(g.lanes):
        yield {
            "ph": "M",
            "name": "thread_name",
            "pid": pid_of[ln.rank],
            "tid": i + TID_BASE,
            "args": {"name": ln.name},
        }
    names = g.names
    kind = c["kind"]
    shift = _per_node(g, shift_of)
    start_ns, end_ns = tl.start + shift, tl.end + shift
    table = g.table
    host = drawn[(kind[drawn] != NodeKind.GPU) & (c["op"][drawn] >= 0)]
    if table is None:
        op_rows = op_lane = op_lo = op_hi = np.zeros(0, dtype=np.int64)
        loose = host
    elif _as_traced(tl):
        # The trace itself: every op, frame and range keeps its traced extent.
        op_rows, op_lane, op_lo, op_hi = _traced_op_spans(g)
        loose = host[:0]
    else:
        op_rows, op_lane, op_lo, op_hi, loose = _simulated_op_spans(tl, host)
    lane_rank = np.array([ln.rank for ln in g.lanes], dtype=np.int64)
    lane_shift = np.array([shift_of.get(int(r), 0) for r in lane_rank], dtype=np.int64)
    op_lo, op_hi = op_lo + lane_shift[op_lane], op_hi + lane_shift[op_lane]
    # Parents before their children where they share both ends.
    if op_rows.size:
        depth = _depth(table.parent, op_rows)  # type: ignore[union-attr]
        o = np.lexsort((depth, op_lo - op_hi, op_lo, op_lane))
        op_rows, op_lane, op_lo, op_hi = op_rows[o], op_lane[o], op_lo[o], op_hi[o]
    # CPU self-time pieces are inside their op's slice; runtime calls and GPU work are drawn.
    drawn = np.union1d(drawn[kind[drawn] != NodeKind.CPU], loose)
    # A matched collective is one slice, from its arrival to its transfer's end.
    into = _collective_arrivals(g)
    marked = np.flatnonzero(into >= 0)
    first_ns = start_ns.copy()
    np.minimum.at(first_ns, into[marked], start_ns[marked])
    drawn = drawn[into[drawn] < 0]
    tid_of = _gpu_overlap_tracks(g, drawn[kind[drawn] == NodeKind.GPU], first_ns, end_ns)
    node_tid = tid_of[drawn]
    cpu_lane = np.array([not ln.is_gpu for ln in g.lanes], dtype=bool)
    op_tid, node_tid, moved = _crossing_tracks(
        cpu_lane, op_lane, op_lo, op_hi, node_tid, first_ns[drawn], end_ns[drawn]
    )
    if moved and notes is not None:
        notes.setdefault("slices moved to a track of their own", {})[label] = moved
    all_tids = np.r_[op_tid, node_tid]
    extra_tids = np.unique(all_tids[all_tids >= len(g.lanes)])
    for extra in extra_tids.tolist():
        k, lane = divmod(extra, len(g.lanes))
        ln = g.lanes[lane]
        why = (
            "work overlapping its predecessor"
            if ln.is_gpu
            else "slices that cross the thread's others"
        )
        yield {
            "ph": "M",
            "name": "thread_name",
            "pid": pid_of[ln.rank],
            "tid": extra + TID_BASE,
            "args": {"name": f"{ln.name} ({why}, {k})"},
        }
    # Each rank's steps on a track of their own, above its threads.
    windows = tl.step_windows()
    steps_tid = max([len(g.lanes), *[t + 1 for t in extra_tids.tolist()]])
    step_ranks = sorted({w.span.rank for w in windows if w.span.rank in pid_of})
    for r in step_ranks:
        yield {
            "ph": "M",
            "name": "thread_name",
            "pid": pid_of[r],
            "tid": steps_tid + TID_BASE,
            "args": {"name": STEPS_TRACK},
        }
        yield {
            "ph": "M",
            "name": "thread_sort_index",
            "pid": pid_of[r],
            "tid": steps_tid + TID_BASE,
            "args": {"sort_index": -1},
        }
    windows = [w for w in windows if w.span.rank in pid_of]
    step_rank = np.array([w.span.rank for w in windows], dtype=np.int64)
    step_lo = np.array([w.begin + shift_of.get(w.span.rank, 0) for w in windows], np.int64)
    step_hi = np.array([w.done + shift_of.get(w.span.rank, 0) for w in windows], np.int64)
    node_lo = first_ns[drawn]
    pid_by_rank = np.zeros(max(ranks, default=0) + 1, dtype=np.int64)
    pid_by_rank[ranks] = [pid_of[r] for r in ranks]
    slices = _Slices(
        pid=pid_by_rank[np.concatenate([lane_rank[op_lane], c["rank"][drawn], step_rank])],
        tid=np.concatenate([op_tid, node_tid, np.full(len(windows), steps_tid)]).astype(np.int64)
        + TID_BASE,
        start=np.concatenate([op_lo, node_lo, step_lo]).astype(np.int64),
        end=np.concatenate([op_hi, end_ns[drawn], step_hi]).astype(np.int64),
    )
    arrows = _Arrows(
        bind=np.full(slices.start.size, -1, dtype=np.int64),
        out=np.zeros(slices.start.size, dtype=bool),
    )
    if flows:
        arrows = _arrows(tl, slices, op_rows, drawn, into, ids)
        if notes is not None and arrows.left_out:
            notes.setdefault("arrows left out", {})[label] = arrows.left_out
    bind = arrows.bind.tolist()
    out = arrows.out.tolist()
    lo_us = (slices.start / 1000.0).tolist()
    dur_us = ((slices.end - slices.start) / 1000.0).tolist()
    pids, tids = slices.pid.tolist(), slices.tid.tolist()
    i = 0

    def with_flow(event: dict[str, Any], at: int) -> dict[str, Any]:
        if bind[at] >= 0:
            event["bind_id"] = bind[at]
            event["flow_out" if out[at] else "flow_in"] = True
        return event

    for row in op_rows.tolist():
        yield with_flow(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": table.names[int(table.name[row])],  # type: ignore[union-attr]
                "pid": pids[i],
                "tid": tids[i],
                "ts": lo_us[i],
                "dur": dur_us[i],
                "args": {"op": row},
            },
            i,
        )
        i += 1
    waited = first_ns < start_ns
    for node in drawn.tolist():
        nm_idx = int(c["name"][node])
        name = names[nm_idx] if nm_idx >= 0 else "cpu"
        k = NodeKind(int(kind[node]))
        if k == NodeKind.WAIT:
            # A thread's gap spent waiting on another, named by the op it falls in: a
            # ProfilerStep#15 slice 9.7 ms long beside the step's own read as the step.
            name = f"waiting ({name})"
        node_args: dict[str, Any] = {
            "duration source": _SOURCE_LABEL.get(int(c["source"][node]), "?"),
            "node": int(node),
        }
        if waited[node]:
            node_args["waiting for the other ranks (µs)"] = (
                int(start_ns[node] - first_ns[node]) / 1000.0
            )
            node_args["transfer (µs)"] = int(end_ns[node] - start_ns[node]) / 1000.0
        yield with_flow(
            {
                "ph": "X",
                "cat": k.name.lower(),
                "name": name,
                "pid": pids[i],
                "tid": tids[i],
                "ts": lo_us[i],
                "dur": dur_us[i],
                "args": node_args,
            },
            i,
        )
        i += 1
    for w in windows:
        yield with_flow(
            {
                "ph": "X",
                "cat": "step",
                "name": w.span.name,
                "pid": pids[i],
                "tid": tids[i],
                "ts": lo_us[i],
                "dur": dur_us[i],
                "args": {
                    "step (ms)": (w.done - w.begin) / 1e6,
                    "traced step (ms)": w.span.measured_ns / 1e6,
                },
            },
            i,
        )
        i += 1
    yield from _queue_counters(tl, pid_of, start_ns, end_ns, into)
    for first, second, cat in arrows.v1:
        fid = next(ids)
        yield {
            "ph": "s",
            "id": fid,
            "cat": cat,
            "name": cat,
            "pid": pids[first],
            "tid": tids[first],
            "ts": lo_us[first],
        }
        yield {
            "ph": "f",
            "bp": "e",
            "id": fid,
            "cat": cat,
            "name": cat,
            "pid": pids[second],
            "tid": tids[second],
            "ts": lo_us[second],
        }


def _arrows(
    tl: Timeline,
    slices: _Slices,
    op_rows: np.ndarray,
    drawn: np.ndarray,
    into: np.ndarray,
    ids: Iterator[int],
) -> _Arrows:
    """The launch arrows and the stored dependencies' (cross-stream waits, thread hand-offs,
    collectives), each between the slices its two nodes are drawn in: their own, the
    collective an arrival or barrier is drawn inside, or the op a CPU piece belongs to. One
    whose node is not drawn (idle time outside any op) is left out."""
    g = tl.graph
    c = g.cols
    live = g.alive
    slice_of = np.full(len(g), -1, dtype=np.int64)
    slice_of[drawn] = op_rows.size + np.arange(drawn.size)
    marked = np.flatnonzero(into >= 0)
    slice_of[marked] = slice_of[into[marked]]
    table = g.table
    if table is not None and op_rows.size:
        by_row = np.full(len(table), -1, dtype=np.int64)
        by_row[op_rows] = np.arange(op_rows.size)
        piece = live & (c["kind"] == NodeKind.CPU) & (c["op"] >= 0) & (slice_of < 0)
        slice_of[piece] = by_row[c["op"][piece]]
    gpu = np.flatnonzero(live & (c["kind"] == NodeKind.GPU) & (c["launch"] >= 0))
    gpu = gpu[live[c["launch"][gpu]]]
    edges = live[g.edge_src] & live[g.edge_dst]
    src = np.concatenate([c["launch"][gpu], g.edge_src[edges]]).astype(np.int64)
    dst = np.concatenate([gpu, g.edge_dst[edges]]).astype(np.int64)
    cats = ["launch", *dict.fromkeys(_EDGE_LABEL.values())]
    code = {name: i for i, name in enumerate(cats)}
    cat = np.concatenate(
        [
            np.zeros(gpu.size, dtype=np.int64),
            np.array(
                [code[_EDGE_LABEL.get(int(t), "dependency")] for t in g.edge_type[edges]],
                dtype=np.int64,
            ),
        ]
    )
    a, b = slice_of[src], slice_of[dst]
    # An arrow to the end of a destination that began before its source (a thread waiting
    # for another) goes to what the destination's lane ran next, when the wait was over.
    at_end = np.r_[np.zeros(gpu.size, dtype=bool), g.edge_at_end[edges]]
    pos = np.empty(slices.start.size, dtype=np.int64)
    pos[_read_order(slices)] = np.arange(slices.start.size)
    late = np.flatnonzero(at_end & (a >= 0) & (b >= 0))
    late = late[pos[a[late]] > pos[b[late]]]
    if late.size:
        after = slice_of[_next_on_lane(g, dst[late])]
        b[late] = np.where(after >= 0, after, b[late])
    ok = (a >= 0) & (b >= 0) & (a != b)
    arrows = _bind_arrows(slices, pos, a[ok], b[ok], cats, cat[ok], ids)
    undrawn = (a < 0) | (b < 0)
    for k, n in zip(*np.unique(cat[undrawn], return_counts=True), strict=True):
        arrows.count(f"{cats[int(k)]} (an end in idle time, not drawn)", int(n))
    return arrows


def _next_on_lane(g: Any, nodes: np.ndarray) -> np.ndarray:
    """The live node after each of `nodes` on its lane, NONE after the last."""
    c = g.cols
    alive = np.flatnonzero(g.alive)
    order = alive[np.lexsort((c["order"][alive], c["lane"][alive]))]
    pos = np.full(len(g), -1, dtype=np.int64)
    pos[order] = np.arange(order.size)
    at = pos[nodes] + 1
    ok = (pos[nodes] >= 0) & (at < order.size)
    out = np.full(nodes.size, NONE_NODE, dtype=np.int64)
    nxt = order[np.minimum(at[ok], order.size - 1)]
    same = c["lane"][nxt] == c["lane"][nodes[ok]]
    out[np.flatnonzero(ok)[same]] = nxt[same]
    return out


def _queue_counters(
    tl: Timeline,
    pid_of: dict[int, int],
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    into: np.ndarray,
) -> list[dict[str, Any]]:
    """A counter track per GPU stream: launches enqueued and not yet finished, as the
    timeline has them (HTA's queue length: +1 when the launch call starts, -1 when its work
    on the stream ends; one entry per call, as perfcast.analysis.launch_queue counts), cut
    to at most QUEUE_COUNTER_POINTS samples (fewer when many streams share
    QUEUE_COUNTER_BUDGET) keeping each bin's peak. A matched collective's launch is its
    arrival's; it finishes when its transfer does (`into`)."""
    from perfcast.analysis.common import downsample_steps
    from perfcast.graph.launches import queue_entries

    g = tl.graph
    # One entry per launch call and stream (a CUDA graph's launch is one, however many
    # kernels it replays), freed when its last task there ends: the replay's own queue
    # entries. Counting each kernel showed 1,574 pending where there were never over two.
    lanes, launch, last, _ = queue_entries(g)
    keep = launch >= 0
    keep[keep] = g.alive[launch[keep]]
    lanes, launch, last = lanes[keep], launch[keep], last[keep]
    finish = np.where(into[last] >= 0, end_ns[np.maximum(into[last], 0)], end_ns[last])
    out: list[dict[str, Any]] = []
    per_lane = split_by(lanes)
    # Many ranks: the tracks share a budget, so the counters never outweigh the timeline.
    points = max(50, min(QUEUE_COUNTER_POINTS, QUEUE_COUNTER_BUDGET // max(len(per_lane), 1)))
    for lane, pos in per_lane:
        t = np.r_[start_ns[launch[pos]], finish[pos]]
        d = np.r_[np.ones(pos.size, np.int64), -np.ones(pos.size, np.int64)]
        order = np.lexsort((d, t))  # at equal times the slot frees first
        t, q = t[order], np.cumsum(d[order])
        t, q = downsample_steps(t, q, points)
        ln = g.lanes[lane]
        name = f"launch queue · {ln.name}"
        pid = pid_of[ln.rank]
        out.extend(
            {"ph": "C", "name": name, "pid": pid, "ts": ts / 1000.0, "args": {"pending": n}}
            for ts, n in zip(t.tolist(), q.tolist(), strict=True)
        )
    return out


def export_timelines(timelines: list[tuple[str, Timeline]], path: str) -> None:
    """Write labelled timelines side by side to `path` (.json or .json.gz), encoded and
    written a batch of events at a time (a thousand ranks' export held 7 GB as one list).
    The document's otherData says how each rank's clock was shifted and which arrows were
    left out."""
    flow_ids = itertools.count(1)
    # Process ids: a block per timeline, wide enough for any number of ranks.
    ranks = max((len({ln.rank for ln in tl.graph.lanes}) for _, tl in timelines), default=1)
    width = max(10 ** len(str(ranks)), 1000)
    encoder = msgspec.json.Encoder()
    notes: dict[str, Any] = {}
    shifts = {label: _clock_shift(tl.graph) for label, tl in timelines}
    if any(shifts.values()):
        notes["clock shift (µs)"] = {
            label: {f"rank {r}": x / 1000.0 for r, x in sorted(per_rank.items())}
            for label, per_rank in shifts.items()
            if per_rank
        }
        notes["clocks"] = (
            "each rank's replay starts at 0 on its own clock; the shift puts the ranks on "
            "one clock, the offsets that made their matched collectives end together"
        )

    def document() -> Iterator[bytes]:
        yield b'{"traceEvents":['
        first = True
        for i, (label, tl) in enumerate(timelines):
            events = timeline_events(
                tl, label, pid_base=width * (i + 1), flow_ids=flow_ids, notes=notes
            )
            while batch := list(itertools.islice(events, EXPORT_BATCH)):
                # A JSON array's items, without its brackets: [a,b] -> a,b
                items = encoder.encode(batch)[1:-1]
                yield items if first else b"," + items
                first = False
        other = encoder.encode({"generator": "perfcast", **notes})
        yield b'],"displayTimeUnit":"ms","otherData":' + other + b"}"

    chunks = document()
    write_output(path, _gzipped(chunks) if path.lower().endswith(".gz") else chunks)


def _gzipped(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The chunks as one gzip stream, compressed as they come."""
    z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # 16+: a gzip header
    for chunk in chunks:
        out = z.compress(chunk)
        if out:
            yield out
    yield z.flush()
