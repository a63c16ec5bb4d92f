"""Collectives paired across ranks when the ranks hold different numbers of them (a killed
job's trace cut short): step by step, never across steps."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest

import perfcast
from perfcast.analysis.stragglers import _collective_lists, stragglers
from perfcast.graph.collectives import pair_across_ranks, step_codes
from tests.tracegen import TraceBuilder

SEED = Path(__file__).parent / "data" / "fuzz" / "seeds" / "gloo_ddp_2rank"


def _a(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int64)


def test_equal_counts_pair_in_order_across_steps() -> None:
    p = pair_across_ranks([_a(10, 11, 12), _a(20, 21, 22)], [_a(0, 0, 1), _a(0, 1, 1)])
    assert not p.by_step and p.left_out == 0
    assert p.positions.tolist() == [[0, 0], [1, 1], [2, 2]]


def test_unequal_counts_pair_within_each_step_up_to_the_fewest() -> None:
    # Rank 1 lost step 1's second collective and holds no step 2; -1 is outside every step.
    p = pair_across_ranks(
        [_a(1, 2, 3, 4, 5, 6), _a(1, 2, 3, 4)],
        [_a(-1, 0, 0, 1, 1, 2), _a(-1, 0, 0, 1)],
    )
    assert p.by_step
    assert p.positions.tolist() == [[1, 1], [2, 2], [3, 3]]
    assert p.left_out == 3


def test_nothing_in_common_pairs_nothing() -> None:
    p = pair_across_ranks([_a(1, 2), _a(1)], [_a(0, 0), _a(1)])
    assert p.positions.shape == (0, 2) and p.left_out == 2


def _rank(rank: int, late_us: float, steps: int, lost_last: bool) -> dict:
    b = TraceBuilder()
    for k in range(steps):
        t = k * 1000.0
        b.step(k + 1, t, 900)
        for i, at in enumerate((100.0, 400.0)):
            if lost_last and k == steps - 1 and i == 1:
                continue  # the cut lost it
            start = t + at + late_us
            end = t + at + 200
            b.launch("ncclKernel_AllReduce_RING_LL_Sum_float", start - 20, 5, start, end - start, 9)
    d = b.doc()
    d["distributedInfo"] = {"rank": rank, "world_size": 2}
    return d


def test_a_cut_rank_still_pairs_its_complete_steps(write_trace) -> None:
    write_trace(_rank(0, 0.0, 2, False), "run/rank0.json")
    path = write_trace(_rank(1, 50.0, 2, True), "run/rank1.json")
    folder = path.parent
    r = stragglers(perfcast.load(folder))
    assert r.matched == 3 and r.candidates == [1]
    assert any("counts differ" in n and "3 matched, 1 not" in n for n in r.notes)
    by = {x.rank: x for x in r.by_rank}
    assert by[1].times_last == 3
    graph = perfcast.dependency_graph(folder)
    assert any("step by step" in a for a in graph.assumptions)
    assert any(a.startswith("3 collectives matched across 2 ranks") for a in graph.assumptions)
    assert perfcast.replay(folder).max_abs_error_pct == pytest.approx(0.0, abs=0.01)


def _pairs(folder: Path) -> set[tuple]:
    """Every pair of a trace folder's collectives, by (rank, absolute start, name)."""
    table = perfcast.load(folder)
    lists = _collective_lists(table)
    ranks = table.rank_ids()
    out = set()
    for key in set.intersection(*(set(lists[r]) for r in ranks)):
        per = [lists[r][key] for r in ranks]
        pairing = pair_across_ranks(per, [step_codes(table, table.iteration[p]) for p in per])
        for pos in pairing.positions.tolist():
            out.add(
                tuple(
                    (r, int(table.ts[per[j][p]]) + table.rank_info(r).base_ns)
                    for j, (r, p) in enumerate(zip(ranks, pos))
                )
            )
    return out


def test_a_real_cut_pairs_only_what_the_whole_trace_pairs(tmp_path: Path) -> None:
    # A real 2-rank gloo capture (3 steps, 21 collectives), rank 1's file cut at 85%: it keeps
    # 3 pairs where every rank still holds each kind's whole count, 11 step by step.
    full = _pairs(SEED)
    cut = tmp_path / "cut"
    cut.mkdir()
    shutil.copy(SEED / "rank0.json.gz", cut)
    raw = gzip.decompress((SEED / "rank1.json.gz").read_bytes())
    (cut / "rank1.json").write_bytes(raw[: int(len(raw) * 0.85)])
    got = _pairs(cut)
    assert len(full) == 21
    assert len(got) == 11 and got <= full
    assert stragglers(perfcast.load(cut)).matched == 11
