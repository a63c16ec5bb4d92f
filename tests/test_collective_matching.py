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
from perfcast.graph.collectives import PairedBy, message_codes, pair_across_ranks, step_codes
from tests.tracegen import TraceBuilder

SEED = Path(__file__).parent / "data" / "fuzz" / "seeds" / "gloo_ddp_2rank"


def _a(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int64)


def test_equal_counts_in_the_same_steps_pair_in_order() -> None:
    p = pair_across_ranks([_a(10, 11, 12), _a(20, 21, 22)], [_a(0, 0, 1), _a(0, 0, 1)])
    assert p.how is PairedBy.IN_ORDER and p.left_out == 0
    assert p.positions.tolist() == [[0, 0], [1, 1], [2, 2]]
    # Traces without steps (every code -1) pair in order too.
    p = pair_across_ranks([_a(1, 2), _a(3, 4)], [_a(-1, -1), _a(-1, -1)])
    assert p.how is PairedBy.IN_ORDER and p.positions.tolist() == [[0, 0], [1, 1]]


def test_equal_counts_pair_in_order_across_a_step_boundary() -> None:
    # One collective labelled with the next step on rank 1 (its launch link dropped, placed
    # by time): with equal counts it is still the same collective.
    p = pair_across_ranks([_a(1, 2, 3, 4), _a(1, 2, 3, 4)], [_a(0, 0, 1, 1), _a(0, 1, 1, 1)])
    assert p.how is PairedBy.IN_ORDER and p.positions.tolist() == [[0, 0], [1, 1], [2, 2], [3, 3]]


def test_equal_counts_in_steps_no_rank_shares_pair_in_order() -> None:
    # Ranks that number their steps differently: position is all there is to go by.
    p = pair_across_ranks([_a(1, 2), _a(3, 4)], [_a(0, 1), _a(2, 3)])
    assert p.how is PairedBy.IN_ORDER and p.positions.tolist() == [[0, 0], [1, 1]]


def test_equal_counts_hiding_a_lost_and_an_extra_collective_pair_by_size() -> None:
    # Rank 1 lost step 1's second all-reduce (size 7) and holds one outside every step (size
    # 9) that rank 0 lacks: the counts are equal, but in order the sizes disagree from the
    # loss on. Step by step they all agree.
    lists = [_a(1, 2, 3, 4), _a(1, 2, 3, 4)]
    steps = [_a(0, 0, 1, 1), _a(0, 0, 1, -1)]
    sizes = [_a(5, 6, 5, 7), _a(5, 6, 5, 9)]
    p = pair_across_ranks(lists, steps, sizes)
    assert p.how is PairedBy.STEP_BY_STEP
    assert p.positions.tolist() == [[0, 0], [1, 1], [2, 2]] and p.left_out == 2
    # The same counts without sizes, or with sizes that agree in order, pair in order.
    assert pair_across_ranks(lists, steps).how is PairedBy.IN_ORDER
    same = [_a(5, 6, 5, 7), _a(5, 6, 5, 7)]
    assert pair_across_ranks(lists, steps, same).how is PairedBy.IN_ORDER
    # Unknown sizes (-1) never count as a disagreement.
    unknown = [_a(5, 6, 5, -1), _a(5, 6, 5, 9)]
    assert pair_across_ranks(lists, steps, unknown).how is PairedBy.IN_ORDER


def test_sizes_that_disagree_either_way_keep_the_order() -> None:
    # A collective across a step boundary on rank 1 (equal counts): step by step pairs no
    # fewer mismatched sizes than in order, so in order stays.
    lists = [_a(1, 2, 3, 4), _a(1, 2, 3, 4)]
    steps = [_a(0, 0, 1, 1), _a(0, 1, 1, 1)]
    sizes = [_a(5, 6, 5, 6), _a(5, 6, 5, 7)]
    assert pair_across_ranks(lists, steps, sizes).how is PairedBy.IN_ORDER


def test_a_trace_without_steps_pairs_in_order_up_to_the_fewest(write_trace) -> None:
    # Rank 1's file lost its last collective (a cut): without steps, in order up to the fewest.
    docs = []
    for rank, starts in ((0, (1000.0, 2000.0, 3000.0)), (1, (1000.0, 2000.0))):
        b = TraceBuilder()
        for t in starts:
            b.launch("ncclKernel_AllReduce_RING_LL_Sum_float", t - 20, 5, t, 100, 9)
        d = b.doc()
        d["distributedInfo"] = {"rank": rank, "world_size": 2}
        docs.append(d)
    write_trace(docs[0], "nosteps/rank0.json")
    folder = write_trace(docs[1], "nosteps/rank1.json").parent
    table = perfcast.load(folder)
    codes = step_codes(table, table.iteration)
    assert (codes == -1).all()
    result = stragglers(table)
    assert result.matched == 2
    assert any("matched in order up to the fewest" in n for n in result.notes), result.notes
    p = pair_across_ranks([_a(1, 2, 3), _a(1, 2)], [_a(-1, -1, -1), _a(-1, -1)])
    assert p.how is PairedBy.IN_ORDER_UP_TO_FEWEST and p.left_out == 1


def test_unequal_counts_pair_within_each_step_up_to_the_fewest() -> None:
    # Rank 1 lost step 1's second collective and holds no step 2; -1 is outside every step.
    p = pair_across_ranks(
        [_a(1, 2, 3, 4, 5, 6), _a(1, 2, 3, 4)],
        [_a(-1, 0, 0, 1, 1, 2), _a(-1, 0, 0, 1)],
    )
    assert p.how is PairedBy.STEP_BY_STEP
    assert p.positions.tolist() == [[1, 1], [2, 2], [3, 3]]
    assert p.left_out == 4  # rank 0's outside, step 1's second and step 2's; rank 1's outside


def test_nothing_in_common_pairs_nothing() -> None:
    p = pair_across_ranks([_a(1, 2), _a(1)], [_a(0, 0), _a(1)])
    assert p.positions.shape == (0, 2) and p.left_out == 3


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
    said = "3 matched on every rank, 1 "
    assert any("counts or steps differ" in n and said in n for n in r.notes)
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
        pairing = pair_across_ranks(
            per,
            [step_codes(table, table.iteration[p]) for p in per],
            [message_codes(table, p) for p in per],
        )
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


def test_step_codes_follow_a_table_made_with_new_iterations() -> None:
    """The step codes are computed once per table (a thousand ranks asked once per rank);
    a table made with dataclasses.replace shares the memo, and must not get the old codes."""
    import dataclasses
    from pathlib import Path

    example = Path(__file__).parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"
    table = perfcast.load(example)
    before = step_codes(table, table.iteration)
    assert sorted(set(before.tolist()) - {-1}) == [0, 1, 2]
    same = [dataclasses.replace(it, name="ProfilerStep#1") for it in table.iterations]
    other = dataclasses.replace(table, iterations=same)
    assert set(step_codes(other, other.iteration).tolist()) - {-1} == {0}
    assert (step_codes(table, table.iteration) == before).all()


def test_write_output_takes_bytes_like_and_chunks(tmp_path) -> None:
    from perfcast.paths import write_output

    for data in (b"ab", bytearray(b"ab"), memoryview(b"ab"), iter([b"a", b"b"])):
        write_output(tmp_path / "out.txt", data)
        assert (tmp_path / "out.txt").read_bytes() == b"ab"
