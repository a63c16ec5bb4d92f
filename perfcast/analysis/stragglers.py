"""Stragglers across ranks: which rank's late arrival at each collective makes the others wait.

The n-th collective of a kind in one process group is matched across ranks (as the graph
builder matches them; where the counts differ, step by step). A
collective ends at about the same moment everywhere, so rank clocks are aligned on the median
difference of matched end times. A rank's arrival is its kernel's start on the aligned clock;
the last rank to arrive is that collective's straggler, and every
other rank waits (last arrival − its own arrival) for it.

Per rank: how often it arrived last, the waiting it caused (summed over the ranks that
waited) and its mean lateness (arrival − median arrival). The candidates are the top
`candidates` ranks by mean lateness, the ranks late most consistently, as HTA's
`get_potential_stragglers` ranks them (two by default); the waiting each caused is reported
beside it, since a rank can be late on average yet never the last to arrive.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from perfcast.analysis.common import NS_PER_MS, NS_PER_US
from perfcast.analysis.comms import collective_ops, enclosing_op_args
from perfcast.analysis.notes import input_notes
from perfcast.events import EventTable
from perfcast.frames import Tables, plain
from perfcast.graph.collectives import message_codes, pair_across_ranks, step_codes
from perfcast.graph.host_collectives import SUBGROUPS_NOTE, match_group, matchable_ranges
from perfcast.graph.phases import (
    collective_kernel_mask,
    host_collective_kind,
    host_collective_mask,
)
from perfcast.hardware.classify import COLLECTIVE_KIND


@dataclass
class RankLateness:
    """How late a rank arrives at collectives: times last, mean lateness (µs), the others'
    wait it caused (ms) and its clock offset."""

    rank: int
    collectives: int  # matched collectives it took part in
    times_last: int
    last_pct: float
    wait_caused_ms: float  # summed over the ranks that waited for it
    mean_lateness_us: float  # arrival − median arrival, averaged over collectives
    clock_offset_us: float  # added to this rank's clock to align it
    candidate: bool


@dataclass
class LateCollective:
    """One collective with a long wait: the last rank, its wait (µs, last less first
    arrival) and the wait it caused (ms)."""

    nth_of_kind: int  # its place (from 0) among the matched collectives of its kind and group
    kind: str
    group: str  # the process group's ranks as the trace names them; "(default)" if unnamed
    last_rank: int
    max_wait_us: float  # last arrival − first arrival
    wait_caused_ms: float  # summed over the other ranks
    start_ms: float  # last arrival, aligned clock, from the first matched collective


@dataclass(repr=False)
class Stragglers(Tables):
    """Result of `stragglers`; tables: by_rank, worst (the collectives with the longest waits)."""

    by_rank: list[RankLateness]
    worst: list[LateCollective]
    candidates: list[int]  # latest on average, latest first (HTA's potential stragglers)
    matched: int  # collectives matched across all ranks
    notes: list[str] = field(default_factory=list)

    ROW_TYPES = {"by_rank": RankLateness, "worst": LateCollective}  # noqa: RUF012


def _collective_lists(table: EventTable) -> dict[int, dict[tuple[str, str], np.ndarray]]:
    """Per rank, per (kind, group): its collective kernel rows (or gloo ranges) in start
    order."""
    # gloo's ranges (on its worker threads) as the graph matches them: by kind and shapes.
    host = matchable_ranges(table)
    rows = np.flatnonzero(collective_kernel_mask(table) | host)
    kind_of = {}
    for i in np.unique(table.name[rows]).tolist():
        m = COLLECTIVE_KIND.search(table.names[i])
        on_host = host_collective_kind(table.names[i])
        kind_of[i] = on_host or (m.group(1).lower() if m else "collective")
    out: dict[int, dict[tuple[str, str], list[int]]] = defaultdict(lambda: defaultdict(list))
    rows = rows[np.argsort(table.ts[rows], kind="stable")]
    groups = table.coll_ranks[rows]
    # The collective each kernel runs where its arguments or its `nccl:<op>` range say: NCCL
    # runs all-to-alls and all-reduces alike as SendRecv kernels, and pairing those in order
    # paired an all-to-all on one rank with an all-reduce on another.
    ops = collective_ops(table, rows)
    for r, nm, rk, gr, op in zip(
        rows.tolist(),
        table.name[rows].tolist(),
        table.rank[rows].tolist(),
        groups.tolist(),
        ops,
        strict=True,
    ):
        group = table.names[gr] if gr >= 0 else (match_group(table, r) if host[r] else "")
        out[rk][(op or kind_of[nm], group)].append(r)
    return {rk: {k: np.array(v) for k, v in d.items()} for rk, d in out.items()}


# Collectives whose ranks may move different sizes (an all-to-all's splits, a send and its
# receive are one size but each rank may hold either).
_UNEVEN_KINDS = frozenset({"alltoall", "sendrecv", "collective"})


def _unequal_sizes(table: EventTable, mat: np.ndarray) -> int:
    """Matches (rows: collectives, columns: ranks) whose ranks' sizes are known and differ:
    the kernel's own arguments, else its enclosing op's shapes (older traces)."""
    if mat.size == 0:
        return 0
    codes = message_codes(table, mat.ravel())
    missing = np.flatnonzero(codes < 0)
    if missing.size:
        _, _, elems = enclosing_op_args(table, mat.ravel()[missing])
        codes[missing] = np.where(np.array(elems) > 0, np.array(elems, dtype=np.int64), -1)
    codes = codes.reshape(mat.shape)
    known = (codes >= 0).all(axis=1)
    return int((known & (codes != codes[:, :1]).any(axis=1)).sum())


def stragglers(table: EventTable, candidates: int = 2, top: int = 20) -> Stragglers:
    """Which ranks arrive last at collectives, and how long the others wait for them.

    >>> import perfcast
    >>> r = stragglers(perfcast.load("traces/dlrm_8_ranks/"))        # doctest: +SKIP
    >>> r.candidates                                                  # doctest: +SKIP
    [7, 2]
    """
    out = Stragglers([], [], [], 0, notes=input_notes(table))
    ranks = table.rank_ids()
    if len(ranks) < 2:
        out.notes.append("one rank: stragglers need the traces of several ranks")
        return out
    lists = _collective_lists(table)
    if host_collective_mask(table).any() and any(i.gloo_subgroups for i in table.ranks):
        out.notes.append(SUBGROUPS_NOTE)
    # A rank with no collective at all (a file cut before its GPU work) would leave nothing
    # present on every rank: it is left out, and said so.
    bare = [r for r in ranks if not lists.get(r)]
    if bare and len(bare) < len(ranks):
        shown = ", ".join(map(str, bare[:5])) + (", ..." if len(bare) > 5 else "")
        out.notes.append(
            f"rank{'s' if len(bare) > 1 else ''} {shown} hold{'' if len(bare) > 1 else 's'} no "
            "collective (a file cut before its GPU work?): left out; the others are compared"
        )
        ranks = [r for r in ranks if lists.get(r)]
        if len(ranks) < 2:
            out.notes.append("fewer than two ranks hold collectives: nothing to compare")
            return out
    keys = set.intersection(*(set(lists.get(r, {})) for r in ranks)) if lists else set()
    matched: list[tuple[str, str, int, np.ndarray]] = []  # (kind, group, index, rows per rank)
    for key in sorted(keys):
        per = [lists[r][key] for r in ranks]
        pairing = pair_across_ranks(
            per,
            [step_codes(table, table.iteration[p]) for p in per],
            [message_codes(table, p) for p in per],
        )
        # (collectives, ranks): the rows of each match
        mat = np.stack([p[pairing.positions[:, j]] for j, p in enumerate(per)], axis=1)
        if pairing.counts_differed:
            out.notes.append(
                f"{key[0]} collectives in group {key[1] or '(default)'}: counts or steps "
                f"differ across ranks (a trace cut short?); matched {pairing.how.value}: "
                f"{mat.shape[0]:,} matched on every rank, {pairing.left_out:,} (summed over "
                "the ranks) not"
            )
        unequal = _unequal_sizes(table, mat) if key[0] not in _UNEVEN_KINDS else 0
        if unequal:
            out.notes.append(
                f"{unequal:,} of the {mat.shape[0]:,} {key[0]} collectives matched in group "
                f"{key[1] or '(default)'} move different sizes on different ranks: the ranks "
                "run them in process groups the trace does not name, so which ones pair up, "
                "and the waits read from them, are uncertain"
            )
        matched.extend((key[0], key[1], i, mat[i]) for i in range(mat.shape[0]))
    if not matched:
        out.notes.append("no collective is present on every rank: nothing to compare")
        return out
    rows = np.stack([m[3] for m in matched])  # (n, ranks)
    base = np.array([table.rank_info(r).base_ns for r in ranks], dtype=np.int64)
    start = table.ts[rows] + base
    # From the earliest start, in integer ns: epoch ns (~1.7e18) in float64 are multiples
    # of 256, which rounded every wait below.
    start = start - start.min()
    end = start + table.dur[rows]
    offset = np.median(end - end[:, :1], axis=0)  # align every rank to the first
    arrive = start - offset
    last = np.argmax(arrive, axis=1)
    latest = arrive.max(axis=1)
    waits = latest[:, None] - arrive  # each rank's wait for the last one
    caused = waits.sum(axis=1)
    lateness = arrive - np.median(arrive, axis=1, keepdims=True)
    n = rows.shape[0]
    out.matched = n
    caused_by_rank = np.bincount(last, weights=caused, minlength=len(ranks))
    times_last = np.bincount(last, minlength=len(ranks))
    # Candidates: the ranks that are late most consistently (mean lateness), not the one that
    # caused the single longest wait; the waits they caused are reported beside it.
    mean_late = lateness.mean(axis=0)
    order = np.argsort(-mean_late, kind="stable")
    cand = [ranks[i] for i in order[:candidates].tolist() if mean_late[i] > 0]
    out.candidates = cand
    for j, r in enumerate(ranks):
        out.by_rank.append(
            RankLateness(
                rank=r,
                collectives=n,
                times_last=int(times_last[j]),
                last_pct=100.0 * times_last[j] / n,
                wait_caused_ms=caused_by_rank[j] / NS_PER_MS,
                mean_lateness_us=float(lateness[:, j].mean()) / NS_PER_US,
                clock_offset_us=(0.0 - float(offset[j])) / NS_PER_US,  # never -0.0
                candidate=r in cand,
            )
        )
    t0 = float(arrive.min())
    worst = np.argsort(-caused, kind="stable")[:top]
    # Named as the collectives analysis names them (NCCL runs an all-to-all as SendRecv
    # kernels), where the trace's arguments or ranges say.
    said = collective_ops(table, rows[worst, 0])
    for i, named in zip(worst.tolist(), said, strict=True):
        kind, group, idx, _ = matched[i]
        kind = named or kind
        out.worst.append(
            LateCollective(
                nth_of_kind=idx,
                kind=kind,
                group=group or "(default)",
                last_rank=ranks[int(last[i])],
                max_wait_us=float(latest[i] - arrive[i].min()) / NS_PER_US,
                wait_caused_ms=float(caused[i]) / NS_PER_MS,
                start_ms=(float(latest[i]) - t0) / NS_PER_MS,
            )
        )
    return plain(out)
