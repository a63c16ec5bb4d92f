"""Metamorphic properties of the what-ifs: identities, composition order, repeated changes."""

from __future__ import annotations

from pathlib import Path

import pytest

import perfcast
from perfcast.errors import OptionError
from perfcast.whatif.registry import in_plan_order, parse_spec
from perfcast.whatif.runner import conflict

LIVE_H200 = (
    Path(__file__).resolve().parents[1] / "benchmarks/accuracy/recorded/traces/live-h200-2026-11-26"
)
CNN_NW0 = LIVE_H200 / "cnn.dataloader-workers.json.gz"  # DataLoader on the main thread


def _names(specs: list[str]) -> list[str]:
    return [str(s) for s in in_plan_order([parse_spec(s) for s in specs])]


def test_dataloader_overlap_is_applied_after_every_other_change() -> None:
    """Its wait for a batch is sized from the rest of the step as the graph has it then."""
    got = _names(["dataloader-overlap:workers=4", "device:target=h100", "cuda-graphs", "amp"])
    assert got == ["device:target=h100", "amp", "cuda-graphs", "dataloader-overlap:workers=4"]
    assert _names(["faster-op", "dataloader-overlap", "ddp"]) == [
        "faster-op",
        "ddp",
        "dataloader-overlap",
    ]


@pytest.fixture(scope="module")
def cnn() -> perfcast.EventTable:
    return perfcast.load(str(CNN_NW0))


def test_no_change_makes_a_step_shorter_than_the_workers_pace(cnn: perfcast.EventTable) -> None:
    """4 workers bound this step (workers=1..4 scale it 1.22, 2.44, 3.65, 4.87x); torch.compile
    applied after the overlap shortened the rest of the step again and predicted 5.55x."""
    alone = perfcast.predict(cnn, ["dataloader-overlap:workers=4"]).speedup
    both = perfcast.predict(cnn, ["dataloader-overlap:workers=4", "torch-compile"]).speedup
    assert both <= alone * 1.001
    # faster-op keeps its place among the others, the overlap still comes after it
    faster = perfcast.predict(cnn, ["dataloader-overlap:workers=4", "faster-op:pattern=gemm"])
    assert faster.speedup <= alone * 1.001


def test_identity_whatifs_predict_the_baseline(cnn: perfcast.EventTable) -> None:
    own = next(iter(perfcast.dependency_graph(cnn).device_names.values()))
    for spec in ("batch-size:factor=1", "faster-op:factor=1", f"device:target={own},host=1"):
        assert perfcast.predict(cnn, [spec]).speedup == 1.0, spec


def test_the_same_modules_checkpointed_twice_are_refused(cnn: perfcast.EventTable) -> None:
    """Recomputing the same forward twice predicted 0.63x against 0.77x once (r50_base)."""
    twice = [parse_spec("activation-checkpointing:module=layer1")] * 2
    assert "given twice" in (conflict(twice) or "")
    other = [
        parse_spec("activation-checkpointing:module=layer1"),
        parse_spec("activation-checkpointing:module=layer2"),
    ]
    assert conflict(other) is None
    with pytest.raises(OptionError, match="given twice"):
        perfcast.predict(cnn, ["activation-checkpointing:module=."] * 2)
    # Without module= it is all forward work: module=conv beside it recomputed the
    # convolutions twice (r50_base 0.71x against 0.77x for all forward work alone).
    whole = [
        parse_spec("activation-checkpointing:module=layer1"),
        parse_spec("activation-checkpointing"),
    ]
    assert "all forward work" in (conflict(whole) or "")
    # A pattern spelled "None" is a pattern, not the absent module=.
    named = [
        parse_spec("activation-checkpointing:module=None"),
        parse_spec("activation-checkpointing:module=layer1"),
    ]
    assert conflict(named) is None


def test_a_thread_whose_first_work_is_removed_still_waits_for_its_hand_off(
    tmp_path: Path,
) -> None:
    """The autograd thread's first node waits for the main thread (a hand-off edge); a
    what-if that removed that node dropped the edge, and the thread's next work started at
    the trace's start: torch-compile on a step repeated 3 times predicted the first 11.75 ms
    and the others 13.10 ms."""
    from perfcast.sim import simulate
    from perfcast.whatif import primitives as P
    from tests.tracegen import TraceBuilder

    b = TraceBuilder(device=None)
    b.step(1, 0, 3000)
    b.op("aten::mm", 10, 1000)
    b.op("worker_a", 1015, 100, tid=200)
    b.op("worker_b", 1115, 500, tid=200)
    graph = perfcast.dependency_graph(b.write(tmp_path / "handoff.json"), correct=False)
    main_end = simulate(graph).end[P.select(graph, kind="host", op="aten::mm")].max()
    P.remove(graph, P.select(graph, kind="host", op="worker_a"))
    tl = simulate(graph)
    assert tl.start[P.select(graph, kind="host", op="worker_b")].min() >= main_end
