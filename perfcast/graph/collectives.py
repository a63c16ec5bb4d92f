"""Collectives matched across ranks, and the cross-rank waits they imply.

A collective cannot finish on any rank before every rank has arrived: its
measured kernel time on each rank is waiting for the last peer plus the
transfer itself. With several ranks loaded, the n-th collective of a kind
(all-reduce, send/recv, ...) in one process group is matched across ranks.
Each matched kernel is split into an arrival (zero time, where the kernel
started) and the transfer (the shortest duration among the ranks: the last
to arrive did not wait). The transfer starts when every rank has arrived.

Where the ranks hold different numbers of a collective (a killed job's trace cut short, or
ranks profiled over different steps), or pairing in order would pair collectives of
different sizes, they are matched step by step (ProfilerStep#N, by name): the n-th with the
n-th up to the fewest any rank holds in that step.

Rank clocks differ; they are aligned by the median end-time difference of
matched collectives (collectives end at about the same time everywhere).
"""

from __future__ import annotations

import enum
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perfcast.events import STEP_PREFIX, EventTable
from perfcast.graph.host_collectives import (
    SUBGROUPS_NOTE,
    host_collective_nodes,
    match_group,
    matchable_ranges,
)
from perfcast.graph.model import NONE, EdgeType, Graph, NodeKind, Source
from perfcast.graph.phases import host_collective_kind
from perfcast.hardware.classify import COLLECTIVE_KIND

_COMM = re.compile(r"nccl|rccl", re.IGNORECASE)


class PairedBy(enum.Enum):
    """How one kind of collective was paired across ranks."""

    IN_ORDER = "in order"  # every rank holds as many
    IN_ORDER_UP_TO_FEWEST = "in order up to the fewest"  # counts differ, no steps
    STEP_BY_STEP = "step by step"  # counts differ: the n-th with the n-th in each step


@dataclass
class Pairing:
    """One kind and group of collectives paired across ranks."""

    positions: np.ndarray  # (matched, ranks): each match's index into every rank's list
    left_out: int  # collectives left unmatched, summed over the ranks
    how: PairedBy

    @property
    def counts_differed(self) -> bool:
        return self.how is not PairedBy.IN_ORDER


def step_codes(table: EventTable, iteration: np.ndarray) -> np.ndarray:
    """A code per row for the step it belongs to, the same on every rank for the same step
    name (ProfilerStep#N); -1 outside every step, and in a trace without steps (its one
    window, the whole trace, is not a step to match another rank's by)."""

    def per_iteration() -> np.ndarray:
        code_of: dict[str, int] = {}
        return np.array(
            [
                code_of.setdefault(it.name, len(code_of)) if it.name.startswith(STEP_PREFIX) else -1
                for it in table.iterations
            ]
            + [-1],
            dtype=np.int64,
        )

    # Once per table: callers ask per rank, and each ask walked every rank's iterations.
    # Keyed by the list itself (a table made with dataclasses.replace shares the memo).
    its = table.iterations
    codes = table._derived(("step_codes", id(its), len(its)), (), per_iteration)
    # NONE (-1) indexes the trailing -1.
    return codes[np.where(iteration >= 0, iteration, -1)]


def pair_across_ranks(
    lists: Sequence[np.ndarray],
    steps: Sequence[np.ndarray],
    sizes: Sequence[np.ndarray] | None = None,
) -> Pairing:
    """Pair one kind and group of collectives across ranks: `lists[j]` holds rank j's in start
    order, `steps[j]` the step code of each (`step_codes`), `sizes[j]` (optional) what each
    moves as a code (`message_codes`, -1 where the trace does not say).

    Where every rank holds as many, the n-th pairs with the n-th (a collective straddling a
    step boundary differently on two ranks is still the same one), unless that pairs
    collectives of different sizes and pairing step by step pairs fewer such: then one rank
    lost one and holds another the others lack (outside the steps), and equal counts hid it.
    Otherwise step by step, in the steps every rank holds, the n-th with the n-th up to the
    fewest any rank holds there: a collective needs every rank of its group, so fewer on one
    rank means events lost, and a cut loses each stream's latest events (the kernels Kineto
    writes are in time order per stream); nothing outside steps is paired then. Traces
    without steps pair in order up to the fewest (a cut loses the end)."""
    counts = [int(x.size) for x in lists]
    n_ranks = len(lists)
    fewest = min(counts)
    in_order = np.repeat(np.arange(fewest)[:, None], n_ranks, axis=1)
    no_steps = all((s < 0).all() for s in steps)
    if len(set(counts)) == 1:
        if sizes is not None and not no_steps:
            wrong = _size_mismatches(in_order, sizes)
            if wrong:
                stepwise = _pair_step_by_step(steps, n_ranks)
                if _size_mismatches(stepwise, sizes) < wrong:
                    left = sum(counts) - stepwise.shape[0] * n_ranks
                    return Pairing(stepwise, left, PairedBy.STEP_BY_STEP)
        return Pairing(in_order, 0, PairedBy.IN_ORDER)
    if no_steps:
        return Pairing(in_order, sum(counts) - fewest * n_ranks, PairedBy.IN_ORDER_UP_TO_FEWEST)
    positions = _pair_step_by_step(steps, n_ranks)
    return Pairing(positions, sum(counts) - positions.shape[0] * n_ranks, PairedBy.STEP_BY_STEP)


def _pair_step_by_step(steps: Sequence[np.ndarray], n_ranks: int) -> np.ndarray:
    """(matched, ranks) positions: in each step every rank holds, the n-th with the n-th up to
    the fewest there; in the first rank's order."""
    common = set.intersection(*(set(s[s >= 0].tolist()) for s in steps))
    blocks = []
    for code in common:
        pos = [np.flatnonzero(s == code) for s in steps]
        k = min(p.size for p in pos)
        blocks.append(np.stack([p[:k] for p in pos], axis=1))
    blocks.sort(key=lambda b: int(b[0, 0]) if b.size else -1)
    return np.concatenate(blocks) if blocks else np.zeros((0, n_ranks), dtype=np.int64)


def _size_mismatches(positions: np.ndarray, sizes: Sequence[np.ndarray]) -> int:
    """Matches whose ranks' collectives are known to move different sizes."""
    if not positions.size:
        return 0
    codes = np.stack([sizes[j][positions[:, j]] for j in range(positions.shape[1])], axis=1)
    known = (codes >= 0).all(axis=1)
    differ = (codes != codes[:, :1]).any(axis=1)
    return int((known & differ).sum())


def message_codes(table: EventTable, rows: np.ndarray) -> np.ndarray:
    """What each collective row moves (input elements and dtype) as one code; -1 where the
    trace records no size (older PyTorch, a host collective)."""
    rows = np.asarray(rows, dtype=np.int64)
    out = np.full(rows.size, -1, dtype=np.int64)
    ok = rows >= 0
    nel = table.coll_in[rows[ok]]
    dtype = table.coll_dtype[rows[ok]].astype(np.int64)
    # Element counts stay far below 2**47; the dtype's name index goes in the low 16 bits.
    out[ok] = np.where(nel >= 0, (nel << 16) | (dtype & 0xFFFF), -1)
    return out


def match_collectives(graph: Graph) -> dict[tuple[str, str, int], dict[int, int]]:
    """(kind, group, index) -> {rank: node} for collectives present on every rank."""
    c = graph.cols
    ranks = sorted({ln.rank for ln in graph.lanes})
    if len(ranks) < 2:
        return {}
    names = graph.names
    gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & graph.alive)
    per_rank: dict[int, dict[tuple[str, str], list[int]]] = {r: defaultdict(list) for r in ranks}
    table = graph.table
    # The collective kind of each name, read once (not per node: 620k searches on 512 ranks).
    kind_of: dict[int, str] = {}
    for name_id in np.unique(c["name"][gpu]).tolist():
        nm = names[name_id]
        if _COMM.search(nm):
            m = COLLECTIVE_KIND.search(nm)
            kind_of[name_id] = m.group(1).lower() if m else "collective"
    comm = gpu[np.isin(c["name"][gpu], list(kind_of))]
    # A CPU backend's (gloo) collectives: ranges on its worker threads, told apart by their
    # shapes (a range names no group); none where the trace has smaller gloo groups.
    host = host_collective_nodes(graph)  # none without a table
    host_group: dict[int, str] = {}
    if host.size:
        assert table is not None
        ok = matchable_ranges(table)
        if not ok.any():
            graph.assumptions.append(
                SUBGROUPS_NOTE + " (each range keeps its measured wait for the other ranks)"
            )
        host = host[ok[c["op"][host]]]
        host_group = {n: match_group(table, int(c["op"][n])) for n in host.tolist()}
    for name_id in np.unique(c["name"][host]).tolist():
        kind_of[name_id] = host_collective_kind(names[name_id]) or "collective"
    comm = np.concatenate([comm, host]).astype(np.int64)
    for node in comm[np.argsort(c["start_measured"][comm], kind="stable")].tolist():
        kind = kind_of[int(c["name"][node])]
        group = host_group.get(node, "")
        row = int(c["event"][node])
        if table is not None and row >= 0 and table.coll_ranks[row] >= 0:
            group = table.names[int(table.coll_ranks[row])]
        per_rank[int(c["rank"][node])][(kind, group)].append(node)
    out: dict[tuple[str, str, int], dict[int, int]] = {}
    keys = set.intersection(*(set(d) for d in per_rank.values()))
    stepwise = left_out = 0
    for key in sorted(keys):  # not set order: the same trace gives the same graph
        lists = [np.array(per_rank[r][key], dtype=np.int64) for r in ranks]
        sizes: list[np.ndarray] | None = None
        if table is not None:
            steps = [step_codes(table, c["iteration"][lst]) for lst in lists]
            sizes = [message_codes(table, c["event"][lst]) for lst in lists]
        else:
            steps = [np.full(lst.size, -1, dtype=np.int64) for lst in lists]
        pairing = pair_across_ranks(lists, steps, sizes)
        stepwise += pairing.counts_differed
        left_out += pairing.left_out
        for i, pos in enumerate(pairing.positions.tolist()):
            out[(key[0], key[1], i)] = {
                r: int(lists[j][p]) for j, (r, p) in enumerate(zip(ranks, pos))
            }
    if stepwise:
        graph.assumptions.append(
            f"{stepwise} kind(s) of collective (per process group) are held a different number "
            "of times by different ranks, or in order would pair collectives of different "
            "sizes (a trace cut short, or ranks profiled over different steps): matched step "
            "by step (in order in a trace without steps), the n-th with the n-th up to the "
            "fewest any rank holds in the step; "
            f"{left_out} left unmatched (summed "
            "over the ranks) keep their measured waits for the other ranks"
        )
    return out


# The node columns add_collective_waits overwrites on the matched nodes (the matches'
# values); beside them it only appends nodes and edges, and redirects stored edges' ends.
COLLECTIVE_WRITES = ("launch", "release", "dur", "dur_measured", "start_measured", "stream_w")


def add_collective_waits(
    graph: Graph, matches: dict[tuple[str, str, int], dict[int, int]] | None = None
) -> int:
    """Split matched collectives (`match_collectives`' unless given) into arrival + transfer
    with cross-rank edges."""
    matches = match_collectives(graph) if matches is None else matches
    if not matches:
        return 0
    c = graph.cols
    origin = graph.rank_origin_ns
    start = c["start_measured"]
    end = start + c["dur_measured"]
    ranks = sorted({r for m in matches.values() for r in m})
    ref = ranks[0]
    # Clock offsets: collectives end together, so ends differ by the clock offset.
    offset = {ref: 0}
    for r in ranks[1:]:
        diffs = [(end[m[r]] + origin[r]) - (end[m[ref]] + origin[ref]) for m in matches.values()]
        offset[r] = int(np.median(diffs))

    graph.rank_clock_ns = {r: origin[r] - offset[r] for r in ranks}

    def aligned(node: int, t: int) -> int:
        r = int(c["rank"][node])
        return t + origin[r] - offset[r]

    # Every participant gets an arrival node (a zero-length copy of it, just before it on its
    # stream), all appended at once: one append per node would copy every column each time.
    parts = np.array([x for m in matches.values() for x in m.values()], dtype=np.int64)
    arrivals = _zero_length_copies(graph, parts, before=0.5)
    arrival_of = dict(zip(parts.tolist(), arrivals.tolist()))
    # What held a thread's collective back (its enqueue) holds back its arrival now; the
    # transfer waits for the arrivals. (A kernel's launch moves with the copied columns.)
    on_thread = parts[c["kind"][parts] != NodeKind.GPU]
    if on_thread.size:
        held = ~graph.edge_at_end & np.isin(graph.edge_dst, on_thread)
        for i in np.flatnonzero(held).tolist():
            graph.edge_dst[i] = arrival_of[int(graph.edge_dst[i])]
    # One barrier per collective, on the last arriver's stream between its arrival and its
    # transfer: every arrival -> barrier -> every transfer, 2n edges where a wait of every
    # transfer on every arrival was n^2 (262k per collective on 512 ranks).
    groups = [list(m.values()) for m in matches.values()]
    arrive_all = [{x: aligned(x, int(start[x])) for x in nodes} for nodes in groups]
    lasts = np.array([max(a, key=lambda x: (a[x], -x)) for a in arrive_all], dtype=np.int64)
    hubs = _zero_length_copies(graph, lasts, before=0.25)
    c = graph.cols
    c["launch"][hubs] = NONE
    c["release"][hubs] = np.iinfo(np.int64).min // 4
    c["stream_w"][hubs] = 0

    def shift(a: int, b: int) -> int:
        """Moves a time on a's rank clock onto b's (edge weights are in the target's clock)."""
        ra, rb = int(c["rank"][a]), int(c["rank"][b])
        return (origin[ra] - offset[ra]) - (origin[rb] - offset[rb])

    n_edges = 0
    src_all, dst_all, w_all = [], [], []
    for nodes, arrive, h, hub in zip(groups, arrive_all, lasts.tolist(), hubs.tolist()):
        transfer = int(min(c["dur_measured"][x] for x in nodes))
        last = arrive[h]
        for x in nodes:
            t_start = aligned(x, int(end[x])) - transfer  # when the transfer began
            c["launch"][x] = NONE
            c["release"][x] = np.iinfo(np.int64).min // 4
            c["dur"][x] = transfer
            c["dur_measured"][x] = transfer
            c["start_measured"][x] = int(end[x]) - transfer
            own_slack = t_start - arrive[x]
            if c["kind"][x] != NodeKind.GPU and x == h:
                # A thread has no stream slack: the last arriver's own latency is an edge.
                src_all.append(hub)
                dst_all.append(x)
                w_all.append(max(own_slack, 0))
                n_edges += 1
            # The last arriver's transfer follows the barrier on its stream.
            c["stream_w"][x] = own_slack if x == h else min(own_slack, 0)
            if x != h:
                src_all.append(arrival_of[x])
                dst_all.append(hub)
                w_all.append(shift(x, h))
                src_all.append(hub)
                dst_all.append(x)
                w_all.append(t_start - last + shift(h, x))
                n_edges += 2
    graph.add_edges(
        np.array(src_all), np.array(dst_all), np.array(w_all), EdgeType.COLLECTIVE, at_end=False
    )
    graph.assumptions.append(
        f"{len(matches)} collectives matched across {len(ranks)} ranks; a transfer starts when "
        "the last rank arrives and takes the shortest measured time among the ranks"
    )
    return n_edges


# What a zero-length copy of a collective's node keeps of it (its lane, step, names, ...).
_COPIED: tuple[str, ...] = (
    "lane",
    "launch_order",
    "op",
    "op_name",
    "scope",
    "phase",
    "iteration",
    "name",
)
_COPIED += ("gpu_kind", "klass", "launch", "launch_w", "stream_w", "release", "rank")


def _zero_length_copies(graph: Graph, nodes: np.ndarray, before: float) -> np.ndarray:
    """Zero-length copies of `nodes`, each `before` order units ahead of its node on its
    stream, appended at once; their ids."""
    c = graph.cols
    return graph.append(
        kind=np.where(c["kind"][nodes] == NodeKind.GPU, NodeKind.GPU, NodeKind.CPU),
        order=c["order"][nodes] - before,
        dur=0,
        dur_measured=0,
        start_measured=c["start_measured"][nodes],
        source=int(Source.MEASURED),
        event=NONE,
        **{k: c[k][nodes] for k in _COPIED},
    )
