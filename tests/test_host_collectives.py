"""A CPU backend's collectives (gloo): the graph, the replay and the analyses.

gloo runs each collective on a worker thread of its own under a `gloo:<op>` range, which the
training thread enqueued with a `c10d::` call and later waits for with no op of its own.
The traces here are built by hand: two ranks of a DDP step where rank 1 does 3 ms of extra
work (an SVD) before its forward, so rank 0 waits for it in every all-reduce.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import perfcast
from perfcast.graph.build import build_graph
from perfcast.graph.model import EdgeType, NodeKind
from perfcast.sim.timeline import simulate
from perfcast.whatif import primitives as P
from tests.tracegen import TraceBuilder

STEP_US = 9000.0
EXTRA_US = 3000.0  # rank 1's extra work before each forward
TRANSFER_US = 1000.0  # the all-reduce once both ranks have arrived
BUCKET = 262_144  # floats in the one gradient bucket


def _rank(rank: int, steps: int = 3) -> dict:
    b = TraceBuilder(pid=100 + rank, tid=1, device=None)
    gloo_tid = 7
    for k in range(steps):
        t = k * STEP_US
        b.step(k + 1, t, STEP_US - 100)
        cur = t + 100
        if rank == 1:
            b.op("aten::linalg_svd", cur, EXTRA_US)
            cur += EXTRA_US
        b.op("aten::addmm", cur, 2000)
        b.op("autograd::engine::evaluate_function: AddmmBackward0", cur + 2000, 2000)
        b.op("aten::mm", cur + 2000, 2000)
        call = cur + 4000
        b.op(
            "c10d::allreduce_",
            call,
            50,
            **{
                "Input Dims": [[[BUCKET]], [], [], [], [], []],
                "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"],
            },
        )
        # Both ranks' ranges end together, when the last one (rank 1) has arrived.
        arrive = call + 20
        done = t + 100 + EXTRA_US + 4000 + 20 + TRANSFER_US
        b.op(
            "gloo:all_reduce",
            arrive,
            done - arrive,
            tid=gloo_tid,
            cat="user_annotation",
            **{"Input Dims": [[BUCKET]], "Input type": ["float"]},
        )
        # The training thread waits (no op) and copies the result back.
        b.op("torch.distributed.ddp.reducer::copy_bucket_to_grad", done + 30, 200)
        b.op("Optimizer.step#SGD.step", done + 230, 500)
    doc = b.doc()
    doc["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": 2}
    return doc


@pytest.fixture
def gloo_dir(tmp_path: Path) -> Path:
    import json

    out = tmp_path / "gloo"
    out.mkdir()
    for r in (0, 1):
        (out / f"rank{r}.json").write_text(json.dumps(_rank(r)))
    return out


def _steps(graph) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for rank, _, _, sim in simulate(graph).iteration_ns():
        out.setdefault(rank, []).append(sim)
    return out


def test_the_replay_reproduces_every_step_and_resolves_the_waits(gloo_dir: Path) -> None:
    table = perfcast.load(str(gloo_dir))
    g = build_graph(table)
    measured = {r: [it.measured_ns for it in g.iterations if it.rank == r] for r in (0, 1)}
    assert _steps(g) == measured
    c = g.cols
    # Rank 0's training thread waited ~4 ms per step for the all-reduce: a wait, not time.
    waits = np.flatnonzero((c["kind"] == NodeKind.WAIT) & (c["rank"] == 0))
    assert waits.size >= 3
    # No CPU time on rank 0 is longer than its ops (2 ms): the 4 ms waits are gone.
    cpu = (c["kind"] == NodeKind.CPU) & (c["rank"] == 0) & g.alive
    assert int(c["dur"][cpu].max()) <= 2_000_000
    assert any("collectives matched across 2 ranks" in a for a in g.assumptions)
    assert any("gloo" in a and "enqueued" in a for a in g.assumptions)
    assert (g.edge_type == EdgeType.COLLECTIVE).any()


def test_the_late_rank_sets_every_rank_step(gloo_dir: Path) -> None:
    """Removing the late rank's extra work shortens the waiting rank's step too; slowing the
    waiting rank's host work makes the late rank wait in turn."""
    g = build_graph(perfcast.load(str(gloo_dir)))
    base = _steps(g)
    g2 = g.copy()
    svd = P.select(g2, kind="host", rank=1)
    svd = svd[[g2.names[g2.cols["op_name"][n]] == "aten::linalg_svd" for n in svd.tolist()]]
    assert svd.size
    P.set_duration(g2, svd, 0)
    fast = _steps(g2)
    for r in (0, 1):
        for before, after in zip(base[r][1:], fast[r][1:]):
            assert after < before - 0.8 * EXTRA_US * 1000, (r, before, after)
    g3 = g.copy()
    P.scale(g3, P.select(g3, kind="host", rank=0), 3.0)
    slow = _steps(g3)
    assert sum(slow[1]) > sum(base[1])
    # Never a slowdown from a speed-up: any host work of either rank twice as fast.
    for r in (0, 1):
        g4 = g.copy()
        P.scale(g4, P.select(g4, kind="host", rank=r), 0.5)
        quick = _steps(g4)
        assert all(sum(quick[k]) <= sum(base[k]) for k in (0, 1))


def test_collectives_and_stragglers_read_the_gloo_ranges(gloo_dir: Path) -> None:
    result = perfcast.analyze(str(gloo_dir), only=["collectives", "stragglers"])
    rows = result.collectives.by_op
    assert {(r.rank, r.op, r.size_bytes, r.group_size, r.count) for r in rows} == {
        (0, "allreduce", BUCKET * 4, 2, 3),
        (1, "allreduce", BUCKET * 4, 2, 3),
    }
    # No GPU link to compare a CPU backend with.
    assert all(r.link == "" and r.pct_of_peak is None for r in rows)
    # The late rank's range is the transfer alone: 1 MiB in 1 ms, both directions of a ring.
    late = next(r for r in rows if r.rank == 1)
    assert late.busbw_gbs == pytest.approx(BUCKET * 4 / (TRANSFER_US * 1000) * 1.0, rel=1e-6)
    s = result.stragglers
    assert s.candidates == [1] and s.matched == 3
    late_rank = next(r for r in s.by_rank if r.rank == 1)
    assert late_rank.times_last == 3 and late_rank.wait_caused_ms == pytest.approx(9.0, rel=0.01)


def test_advice_names_the_rank_the_others_wait_for(gloo_dir: Path) -> None:
    advice = perfcast.advise(str(gloo_dir))
    assert advice.bottleneck.startswith("CPU-only trace")
    text = " ".join(advice.findings)
    assert "of the critical path" in text and "rank 1 arrived last at 3 of its 3" in text


def test_a_call_enqueued_before_the_trace_is_not_paired(tmp_path: Path) -> None:
    """A range whose call the trace does not hold (made before the profiler started) keeps its
    measured start; the later ranges still pair with their own calls."""
    import json

    doc = _rank(0)
    first_call = next(e for e in doc["traceEvents"] if e["name"] == "c10d::allreduce_")
    doc["traceEvents"].remove(first_call)
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    g = build_graph(perfcast.load(str(path)))
    assert any("2 collective(s) of a CPU backend" in a for a in g.assumptions)
    assert _steps(g)[0] == [it.measured_ns for it in g.iterations]


def test_one_rank_waiting_is_a_finding_even_when_the_mean_is_low(gloo_dir: Path) -> None:
    """With one late rank among few, the mean share of waiting hides it: the rank that waits
    most is named with its own share."""
    from perfcast.advisor.advisor import _waiting_findings

    table = perfcast.load(str(gloo_dir))
    facts = {"ranks_critical_pct": 12.0, "ranks_critical_max_pct": 30.0}
    facts["ranks_critical_max_rank"] = 0.0
    (text,) = _waiting_findings(table, facts)
    assert text.startswith("rank 0 spends 30% of its critical path waiting for other ranks")
    assert "rank 1 arrived last" in text
    facts["ranks_critical_max_pct"] = 20.0
    assert _waiting_findings(table, facts) == []


def test_collectives_without_a_link_are_not_called_unsized(gloo_dir: Path) -> None:
    """gloo's collectives have sizes but no link to compare with: the finding says which."""
    from perfcast.advisor.advisor import _communication_findings

    table = perfcast.load(str(gloo_dir))
    (text,) = _communication_findings(table, {"comm_critical_pct": 50.0})
    assert "no link to compare their bandwidth with" in text
    assert "carries no collective sizes" not in text


def test_summary_names_the_straggler_of_a_few_ranks(gloo_dir: Path, capsys) -> None:
    """With 2 to 4 ranks (no overview table) the summary still says which rank is late."""
    from perfcast.cli.main import main

    assert main(["summary", str(gloo_dir)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--only stragglers): 1" in out and "rank 1 (straggler)" in out
    assert "rank 0 (straggler)" not in out
