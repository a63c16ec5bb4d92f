"""Graph and replay: hand-built timelines whose answer is known, invariants, real traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import perfcast
from perfcast.graph import build_graph
from perfcast.graph.model import NodeKind
from perfcast.sim import simulate
from perfcast.whatif import primitives as P
from tests.tracegen import TraceBuilder

US = 1000  # ns per µs


def _steps_us(path: Path, graph_fn=None) -> list[float]:
    table = perfcast.load(path)
    g = build_graph(table)
    if graph_fn is not None:
        g = g.copy()
        graph_fn(g)
    tl = simulate(g)
    return [sim / US for _, _, _, sim in tl.iteration_ns()]


def _launch_bound(tmp_path: Path) -> Path:
    b = TraceBuilder()
    b.step(1, 0, 100)
    b.op("aten::relu", 5, 90)
    for t in (10, 40, 70):
        b.launch("void at::native::vectorized_elementwise_kernel<4>", t, 5, t + 8, 5)
    return b.write(tmp_path / "launch_bound.json")


def _gpu_bound(tmp_path: Path) -> Path:
    b = TraceBuilder()
    b.step(1, 0, 330)
    b.op("aten::mm", 5, 20)
    b.launch("volta_sgemm_128x64_nn", 10, 3, 18, 100)
    b.launch("volta_sgemm_128x64_nn", 15, 3, 118, 100)
    b.launch("volta_sgemm_128x64_nn", 20, 3, 218, 100)
    b.runtime("cudaDeviceSynchronize", 25, 295)  # returns 2 µs after the last kernel
    return b.write(tmp_path / "gpu_bound.json")


def test_launch_bound_step_is_cpu_time(tmp_path):
    path = _launch_bound(tmp_path)
    assert _steps_us(path) == pytest.approx([100.0])

    # Kernels twice as fast change nothing: the CPU sets the pace.
    def faster_gpu(g):
        P.scale(g, P.select(g, kind="gpu"), 0.5)

    assert _steps_us(path, faster_gpu) == pytest.approx([100.0])


def test_gpu_bound_step_follows_kernels_through_the_sync(tmp_path):
    path = _gpu_bound(tmp_path)
    assert _steps_us(path) == pytest.approx([330.0])

    def faster_gpu(g):
        P.scale(g, P.select(g, kind="gpu"), 0.5)

    # k1 18-68, k2 68-118, k3 118-168; the sync returns 2 µs later (170), then 10 µs of
    # CPU to the end of the step: 180 µs.
    assert _steps_us(path, faster_gpu) == pytest.approx([180.0])


def test_sync_waits_for_what_is_last_after_a_transformation(tmp_path):
    path = _gpu_bound(tmp_path)

    def drop_last_kernel(g):
        gpu = P.select(g, kind="gpu")
        last = gpu[np.argmax(g.cols["order"][gpu])]
        P.remove_gpu_work(g, np.array([last]))

    # Without k3 the sync waits for k2 (ends 218) + 2 µs, then 10 µs: 230.
    assert _steps_us(path, drop_last_kernel) == pytest.approx([230.0])


def test_cross_stream_wait_from_event_record(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 200)
    b.launch("volta_sgemm_128x64_nn", 10, 5, 20, 100, stream=7)
    b.runtime("cudaEventRecord", 16, 2)
    b.runtime("cudaStreamWaitEvent", 19, 2)
    b.launch("void at::native::vectorized_elementwise_kernel<4>", 22, 5, 121, 10, stream=8)
    b.runtime("cudaDeviceSynchronize", 30, 103)  # until 133 = k2 end + 2
    path = b.write(tmp_path / "xstream.json")
    table = perfcast.load(path)
    g = build_graph(table)
    assert g.edge_src.size == 1, "the wait on stream 8 should depend on stream 7's kernel"
    assert _steps_us(path) == pytest.approx([200.0])

    def faster_first(g):
        P.scale(g, P.select(g, name="sgemm"), 0.5)

    # k1 20-70, k2 waits for it: 71-81, sync ends 83, 67 µs of CPU after: 150.
    assert _steps_us(path, faster_first) == pytest.approx([150.0])


def test_blocking_copy_is_a_launch_then_a_wait(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 150)
    b.launch("volta_sgemm_128x64_nn", 10, 5, 20, 100)
    # .item(): a device-to-host copy that returns once the copy is done.
    b.launch(
        "Memcpy DtoH (Device -> Pageable)",
        20,
        103,
        120,
        2,
        cat="gpu_memcpy",
        name="cudaMemcpyAsync",
    )
    path = b.write(tmp_path / "item.json")
    g = build_graph(perfcast.load(path))
    assert (g.cols["kind"] == NodeKind.SYNC).sum() == 1
    assert _steps_us(path) == pytest.approx([150.0])

    def faster(g):
        P.scale(g, P.select(g, name="sgemm"), 0.5)

    # Kernel 20-70, copy 70-72, the wait returns 1 µs after, then 27 µs of CPU: 100.
    assert _steps_us(path, faster) == pytest.approx([100.0])


def test_reference_and_fast_engines_agree(tmp_path):
    for path in (_launch_bound(tmp_path), _gpu_bound(tmp_path)):
        g = build_graph(perfcast.load(path))
        a, b = simulate(g, engine="reference"), simulate(g, engine="fast")
        assert np.array_equal(a.start, b.start) and np.array_equal(a.end, b.end)


def _real_traces(root: Path) -> list[Path]:
    files = sorted(root.glob("*.json.gz"))
    return [*files, root / "hta_sampled_128rank", root / "dlrm_v100_8rank"]


def test_every_shared_trace_replays_within_one_percent(shared_traces):
    for path in _real_traces(shared_traces):
        table = perfcast.load(path)
        g = build_graph(table)
        assert not g.check_invariants(), path
        tl = simulate(g)
        for rank, name, measured, sim in tl.iteration_ns():
            assert measured > 0, (path, rank, name)
            err = abs(sim - measured) / measured
            assert err <= 0.01, f"{path.name} rank {rank} {name}: {100 * err:.2f}% off"


def test_graph_invariants_hold(shared_traces):
    table = perfcast.load(shared_traces / "hta_ddp_a100_rank0_nccl_args.json.gz")
    g = build_graph(table)
    c = g.cols
    assert (c["dur"] >= 0).all()
    tl = simulate(g)
    # No GPU task starts before the call that launched it.
    gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & (c["launch"] >= 0))
    assert (tl.start[gpu] >= tl.start[c["launch"][gpu]]).all()
    # Stream order kept: on each lane, replayed starts follow the lane order.
    for lane in np.unique(c["lane"][gpu]):
        nodes = np.flatnonzero(c["lane"] == lane)
        nodes = nodes[np.argsort(c["order"][nodes])]
        assert (np.diff(tl.start[nodes]) >= 0).all()
        assert (tl.start[nodes][1:] >= tl.end[nodes][:-1]).all()


def test_fast_engine_matches_reference_on_a_real_trace(shared_traces):
    table = perfcast.load(shared_traces / "hta_ddp_a100_rank0_nccl_args.json.gz")
    g = build_graph(table)
    g2 = g.copy()
    P.scale(g2, P.select(g2, kind="gpu"), 0.5)
    for graph in (g, g2):
        a, b = simulate(graph, engine="reference"), simulate(graph, engine="fast")
        assert np.array_equal(a.start, b.start) and np.array_equal(a.end, b.end)


def test_collectives_couple_ranks(shared_traces):
    """A slower rank delays its peers through the collectives they share."""
    table = perfcast.load(shared_traces / "dlrm_v100_8rank")
    g = build_graph(table)
    from perfcast.graph.model import EdgeType

    # Every arrival to one barrier, the barrier to every transfer: 2 (n - 1) per collective,
    # linear in the ranks (pairwise waits were n (n - 1)).
    matched = sum("collectives matched" in a for a in g.assumptions)
    n_coll = int(next(a for a in g.assumptions if "collectives matched" in a).split()[0])
    assert matched == 1 and (g.edge_type == EdgeType.COLLECTIVE).sum() == 2 * 7 * n_coll
    base = {r: s for r, _, _, s in simulate(g).iteration_ns()}
    g2 = g.copy()
    P.scale(g2, P.select(g2, kind="host", rank=0), 2.0)
    slow = {r: s for r, _, _, s in simulate(g2).iteration_ns()}
    assert slow[0] > base[0]
    assert all(slow[r] > base[r] for r in range(1, 8)), "peers should wait for rank 0"


def test_edges_from_removed_nodes_pass_to_the_lane_predecessor(shared_traces):
    from perfcast.graph.lower import _redirect_removed

    g = build_graph(perfcast.load(shared_traces / "hta_ddp_a100_rank0_nccl_args.json.gz"))
    rng = np.random.default_rng(0)
    P.remove(g, rng.choice(len(g), size=len(g) // 3, replace=False))
    alive = g.alive
    src = g.edge_src.astype(np.int64)
    got = _redirect_removed(g, src, alive)
    c = g.cols
    for s, r in zip(src.tolist(), got.tolist()):
        if alive[s]:
            assert r == s
            continue
        same = np.flatnonzero((c["lane"] == c["lane"][s]) & alive & (c["order"] < c["order"][s]))
        expected = int(same[np.argmax(c["order"][same])]) if same.size else -1
        assert r == expected


def test_a_busy_thread_with_many_idle_gaps_builds_in_linear_time(tmp_path):
    """30k ops with idle gaps on one thread: the hand-off search was quadratic (44 s)."""
    import time

    # Compiled code first (numba, on a cold CI worker: seconds under load), so only the
    # build and the replay are timed.
    warm = TraceBuilder(device=None)
    for i in range(10):
        warm.op("aten::add", i * 40, 10)
    simulate(build_graph(perfcast.load(warm.write(tmp_path / "warm.json"))))
    b = TraceBuilder(device=None)
    for i in range(30_000):
        b.op("aten::add", i * 40, 10)
    table = perfcast.load(b.write(tmp_path / "gaps.json"))
    start = time.perf_counter()
    tl = simulate(build_graph(table))
    assert time.perf_counter() - start < 10
    assert [sim for *_, sim in tl.iteration_ns()] == [(29_999 * 40 + 10) * US]


def test_a_thread_woken_late_still_waited_for_the_hand_off(tmp_path):
    """The autograd thread wakes 700 µs after the main thread hands backward over (the H200
    host took up to 743 µs): a wait the replay resolves, not fixed idle time, so a faster
    forward moves backward and the step earlier."""
    b = TraceBuilder(device=None)
    b.step(1, 0, 1600)
    b.op("autograd::engine::evaluate_function: AddBackward0", 0, 5, tid=2)
    b.op("aten::ones_like", 10, 100)  # main thread, ends at 110, then idles
    b.op("autograd::engine::evaluate_function: MulBackward0", 810, 590, tid=2)  # to 1400
    b.op("aten::add", 1500, 50)
    path = b.write(tmp_path / "late_wake.json")
    assert _steps_us(path) == pytest.approx([1600.0])

    def faster_forward(g):
        P.scale(g, P.select(g, name="ones_like"), 0.5)

    assert _steps_us(path, faster_forward) == pytest.approx([1550.0])


@pytest.mark.parametrize("later", [False, True])
def test_removed_sources_go_to_the_nearest_live_node_of_their_lane(later: bool) -> None:
    """lower._redirect_removed against a plain per-node search, on many lanes with ties in
    order (a searched lane at a time rescanned every removed node per lane)."""
    from types import SimpleNamespace

    from perfcast.graph.lower import _redirect_removed

    rng = np.random.default_rng(7)
    n = 3000
    lane = rng.integers(0, 200, n).astype(np.int32)
    order = rng.integers(0, 40, n).astype(np.float64) / 2  # ties within a lane
    alive = rng.random(n) < 0.6
    alive[lane == 5] = False  # a lane with no live node: -1
    src = rng.integers(0, n, 5000)
    graph = SimpleNamespace(cols={"lane": lane, "order": order})
    got = _redirect_removed(graph, src, alive, later=later)  # type: ignore[arg-type]
    for s, g in zip(src.tolist(), got.tolist(), strict=True):
        if alive[s]:
            assert g == s
            continue
        same = np.flatnonzero(alive & (lane == lane[s]))
        near = same[order[same] > order[s]] if later else same[order[same] < order[s]]
        if near.size == 0:
            assert g == -1
        else:
            best = order[near].min() if later else order[near].max()
            assert g in near and order[g] == best


def test_step_boundaries_follow_the_graphs_own_iterations() -> None:
    """Graph.step_boundaries is cached per iterations list: a copy with other steps, or a
    list that grew, gets its own."""
    import dataclasses

    import perfcast

    example = Path(__file__).parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"
    g = build_graph(perfcast.load(example))
    ids = {s.start_node for s in g.iterations} | {s.end_node for s in g.iterations}
    assert g.step_boundaries().tolist() == sorted(i for i in ids if i >= 0)
    h = g.copy()
    h.iterations = h.iterations[:1]
    first = h.iterations[0]
    assert h.step_boundaries().tolist() == sorted({first.start_node, first.end_node})
    h.iterations.append(dataclasses.replace(g.iterations[1]))
    assert h.step_boundaries().size == 4 and g.step_boundaries().tolist() == sorted(ids)
