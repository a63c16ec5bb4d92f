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
    assert advice.bottleneck.startswith("CPU-only trace: the host sets the step time (")
    assert all(part in advice.bottleneck for part in ("collectives (gloo)", "other ranks"))
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


def _write(tmp_path: Path, docs: list[dict], name: str = "run") -> Path:
    import json

    out = tmp_path / name
    out.mkdir()
    for r, doc in enumerate(docs):
        (out / f"rank{r}.json").write_text(json.dumps(doc))
    return out


def test_ranges_pair_with_their_own_call_by_kind_and_shape(tmp_path: Path) -> None:
    """Calls of two groups interleave, gloo runs a reduce-scatter as an all-reduce, a
    monitored barrier and an NCCL call (it launched a kernel) leave no range: each range
    still pairs with the call that made it."""
    from perfcast.graph.host_collectives import _pairs, _queued_calls, host_collective_nodes

    b = TraceBuilder(pid=100, tid=1, device=None)
    b.step(1, 0, 5000)
    b.op("c10d::monitored_barrier_", 50, 20)
    b.op("c10d::allreduce_", 100, 20, **{"Input Dims": [[[1000]], []]})
    b.op("c10d::allreduce_", 130, 20, **{"Input Dims": [[[500]], []]})
    # NCCL's (it launches a kernel): of the range's kind and size, but not gloo's work.
    b.op("c10d::allreduce_", 152, 6, **{"Input Dims": [[[500]], []]})
    b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 153, 4, 300, 100)
    b.op("c10d::_reduce_scatter_base_", 160, 20, **{"Input Dims": [[250], [500], []]})
    # The worker threads take the second group's call first.
    b.op("gloo:all_reduce", 140, 300, tid=8, cat="user_annotation", **{"Input Dims": [[500]]})
    b.op("gloo:all_reduce", 150, 400, tid=7, cat="user_annotation", **{"Input Dims": [[1000]]})
    b.op("gloo:all_reduce", 600, 100, tid=8, cat="user_annotation", **{"Input Dims": [[500]]})
    doc = b.doc()
    doc["distributedInfo"] = {"backend": "gloo", "rank": 0, "world_size": 2}
    path = _write(tmp_path, [doc])
    table = perfcast.load(str(path))
    g = build_graph(table)
    ranges = g.cols["op"][host_collective_nodes(g)].tolist()
    pairs = _pairs(table, _queued_calls(table), ranges)
    named = {
        (table.names[table.name[r]], int(table.ts[r]) // 1000): (
            table.names[table.name[c]],
            int(table.ts[c]) // 1000,
        )
        for r, c in pairs.items()
    }
    assert named == {
        ("gloo:all_reduce", 140): ("c10d::allreduce_", 130),
        ("gloo:all_reduce", 150): ("c10d::allreduce_", 100),
        ("gloo:all_reduce", 600): ("c10d::_reduce_scatter_base_", 160),
    }
    assert _steps(g)[0] == [it.measured_ns for it in g.iterations]


def test_groups_smaller_than_the_world_are_not_matched(tmp_path: Path) -> None:
    docs = [_rank(0), _rank(1)]
    for d in docs:
        d["distributedInfo"]["pg_config"] = [
            {"pg_name": "0", "backend_config": "cpu:gloo", "pg_size": 2, "ranks": [0, 1]},
            {"pg_name": "1", "backend_config": "cpu:gloo", "pg_size": 1, "ranks": [0]},
        ]
    path = _write(tmp_path, docs)
    table = perfcast.load(str(path))
    g = build_graph(table)
    assert any("not matched across ranks" in a for a in g.assumptions)
    assert not (g.edge_type == EdgeType.COLLECTIVE).any()
    rows = perfcast.collectives(table)
    assert all(r.group_size == 0 for r in rows.by_op)
    assert any("smaller than the world" in n for n in rows.notes)


def test_a_range_cut_by_child_ops_keeps_its_wait_in_the_matched_piece(tmp_path: Path) -> None:
    """gloo's all_gather starts with small ops (views, empties) inside its range: the piece
    that holds the wait is the one matched across ranks, so the late rank still sets both."""
    docs = [_rank(0), _rank(1)]
    for d in docs:
        pid = d["traceEvents"][0]["pid"]
        for e in [e for e in d["traceEvents"] if e["name"] == "gloo:all_reduce"]:
            e["name"] = "gloo:all_gather"
            child = {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": pid, "tid": 7}
            d["traceEvents"].append({**child, "ts": e["ts"] + 2, "dur": 8, "args": {}})
        for e in [e for e in d["traceEvents"] if e["name"] == "c10d::allreduce_"]:
            e["name"] = "c10d::allgather_"
    path = _write(tmp_path, docs)
    g = build_graph(perfcast.load(str(path)))
    base = _steps(g)
    g2 = g.copy()
    svd = P.select(g2, kind="host", rank=1)
    svd = svd[[g2.names[g2.cols["op_name"][n]] == "aten::linalg_svd" for n in svd.tolist()]]
    P.set_duration(g2, svd, 0)
    fast = _steps(g2)
    assert all(a < b - 0.8 * EXTRA_US * 1000 for a, b in zip(fast[0][1:], base[0][1:]))
    sizes = {r.size_bytes for r in perfcast.collectives(str(path)).by_op}
    assert sizes == {BUCKET * 4 * 2}  # one rank's input, times the two ranks


def test_the_report_timeline_draws_gloo_ranges_as_communication(gloo_dir: Path) -> None:
    from perfcast.report import html as report_html

    tl = report_html.report_data(perfcast.load(str(gloo_dir)))["timeline"]
    comm = report_html.CATEGORIES.index("communication")
    for group in ("measured", "simulated"):
        drawn = {tl["names"][n] for n, c in zip(tl[group]["name"], tl[group]["cat"]) if c == comm}
        assert drawn == {"gloo:all_reduce"}, group


def _back_to_back(rank: int, cuda_copy: bool = False) -> dict:
    """Two collectives a step: the training thread waits for the first (a wait replayed at
    zero length), then makes the second call, whose range starts before the call returns."""
    b = TraceBuilder(pid=100 + rank, tid=1, device=None)
    for k in range(3):
        t = k * 5000.0
        b.step(k + 1, t, 4900)
        b.op("aten::mm", t + 10, 500 + 300 * rank)
        call = t + 810
        b.op("c10d::allreduce_", call, 30, **{"Input Dims": [[[1000]], []]})
        if cuda_copy:  # gloo on CUDA tensors copies them to the host inside the call
            b.launch("Memcpy DtoH (Device -> Pinned)", call + 5, 10, call + 8, 5, cat="gpu_memcpy")
        b.op("gloo:all_reduce", call + 20, 1000, tid=7, cat="user_annotation",
             **{"Input Dims": [[1000]]})  # fmt: skip
        second = call + 1100  # after waiting for the first
        b.op("c10d::allreduce_", second, 200, **{"Input Dims": [[[2000]], []]})
        b.op("gloo:all_reduce", second + 50, 800, tid=8, cat="user_annotation",
             **{"Input Dims": [[2000]]})  # fmt: skip
        b.op("aten::copy_", second + 900, 100)
    doc = b.doc()
    doc["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": 2}
    return doc


def test_a_range_started_inside_its_call_after_a_wait_replays_exactly(tmp_path: Path) -> None:
    path = _write(tmp_path, [_back_to_back(0), _back_to_back(1)])
    g = build_graph(perfcast.load(str(path)))
    assert any(a.startswith("12 collective(s) of a CPU backend") for a in g.assumptions)
    got = _steps(g)
    assert got == {r: [it.measured_ns for it in g.iterations if it.rank == r] for r in (0, 1)}


def test_gloo_on_cuda_tensors_still_pairs(tmp_path: Path) -> None:
    """A call that launches only copies (gloo staging CUDA tensors) is gloo's; one that
    launched a collective kernel would be NCCL's."""
    from perfcast.graph.host_collectives import _queued_calls

    path = _write(tmp_path, [_back_to_back(0, cuda_copy=True)])
    assert _queued_calls(perfcast.load(str(path))).size == 6


def test_subgroups_are_found_without_a_world_size(tmp_path: Path) -> None:
    docs = [_rank(0), _rank(1)]
    for d in docs:
        del d["distributedInfo"]["world_size"]
        d["distributedInfo"]["pg_config"] = {
            "0": {"backend_config": "cpu:gloo", "pg_size": 2},
            "1": {"backend_config": "cpu:gloo", "pg_size": 1},
        }
    table = perfcast.load(str(_write(tmp_path, docs)))
    assert all(info.gloo_subgroups for info in table.ranks)
    s = perfcast.stragglers(table)
    assert s.matched == 0 and any("not matched across ranks" in n for n in s.notes)
