"""A host that began the trace ahead of the GPU: its lead is not a gain a prediction keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

import perfcast
from perfcast.whatif.registry import parse_spec
from perfcast.whatif.runner import lead_not_kept_ms, run_whatif
from tests.tracegen import TraceBuilder

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


def _ahead_of_the_gpu(tmp_path: Path, steps: int = 3) -> Path:
    """Each step: 10 ms of host work that launches one 20 ms kernel. 30 ms of GPU work left
    from before the trace (no launch in it) runs first, so the host starts 30 ms ahead and
    the GPU paces the steps: 20 ms each."""
    t = TraceBuilder()
    t.events.append(
        {
            "ph": "X",
            "cat": "kernel",
            "name": "earlier_kernel",
            "pid": 0,
            "tid": 7,
            "ts": 0.0,
            "dur": 30_000.0,
            "args": {"correlation": 1, "stream": 7, "device": 0},
        }
    )
    for i in range(steps):
        t0 = 10_000.0 * i
        t.step(i + 1, t0, 10_000.0)
        t.op("aten::mul", t0 + 100, 9_800.0)
        t.launch("step_kernel", t0 + 200, 10.0, 30_000.0 + 20_000.0 * i, 20_000.0)
    return t.write(tmp_path / "ahead.json")


def test_a_faster_gpu_gains_what_the_host_leaves_room_for(tmp_path: Path) -> None:
    """The replayed steps finish the queued work at the new GPU speed, 2 ms each, before the
    host has issued the next: a mean of 2 ms and 10x, where a running job is host-bound at
    10 ms per step (2x)."""
    table = perfcast.load(str(_ahead_of_the_gpu(tmp_path)))
    spec = parse_spec("faster-op:pattern=step_kernel,factor=10,where=gpu")
    result, base, predicted = run_whatif(table, [spec], correct=False)
    assert result.baseline_ms == pytest.approx(20.0, rel=0.01)
    replayed = [s / 1e6 for *_, s in predicted.iteration_ns()]
    assert max(replayed) < 3.0  # the replay itself drains the lead
    assert lead_not_kept_ms(base, predicted, []) == pytest.approx(8.0, rel=0.05)
    assert result.predicted_ms == pytest.approx(10.0, rel=0.03)
    assert result.speedup == pytest.approx(2.0, rel=0.03)
    assert any("ahead of the GPU" in a for a in result.assumptions)
    # Slower or unchanged GPU work drains nothing: the baseline's own pace stands.
    same, _, _ = run_whatif(table, [parse_spec("faster-op:pattern=step_kernel,factor=1")])
    assert same.predicted_ms == pytest.approx(same.baseline_ms)
    assert not any("ahead of the GPU" in a for a in same.assumptions)
    slower, _, _ = run_whatif(
        table, [parse_spec("faster-op:pattern=step_kernel,factor=0.5")], correct=False
    )
    assert slower.predicted_ms == pytest.approx(40.0, rel=0.02)


def test_the_advisor_times_a_drained_lead_as_whatif_does(tmp_path: Path) -> None:
    table = perfcast.load(str(_ahead_of_the_gpu(tmp_path)))
    spec = "faster-op:pattern=step_kernel,factor=10,where=gpu"
    advice = perfcast.advise(table, candidates=[spec], correct=False)
    whatif = perfcast.predict(table, spec, correct=False)
    (item,) = advice.suggestions + advice.uncertain
    assert item.predicted_ms == pytest.approx(whatif.predicted_ms)
    assert any("ahead of the GPU" in a for a in item.assumptions)


def test_a_gpu_ten_times_faster_is_paced_by_the_host_on_a_real_trace() -> None:
    """The MI300X ResNet trace's host ran 30 ms ahead of the GPU (18.8 ms steps): GPU work
    10x faster was predicted at 2.7 ms per step, below the host's ~10 ms per step."""
    path = SHARED / "tracelens_mi300x_resnet_act_ckpt_rank0.json.gz"
    if not path.exists():
        pytest.skip("shared traces not present")
    table = perfcast.load(str(path))
    result, _, predicted = run_whatif(
        table, [parse_spec("faster-op:pattern=.,factor=10,where=gpu")]
    )
    host_per_step = [(w.host_end - w.host_begin) / 1e6 for w in predicted.step_windows()]
    assert result.predicted_ms >= min(host_per_step)
    assert result.speedup < 2.0


def test_the_gain_tree_says_which_part_of_its_gain_is_the_lead(tmp_path: Path) -> None:
    """`whatif --tree` adds up the replay's critical paths: 18 ms per step saved here, where
    the prediction counts 10; the 8 ms of drained lead are named beside the total."""
    from perfcast.analysis.context import build_index
    from perfcast.analysis.context_gain import attribute_gain

    table = perfcast.load(str(_ahead_of_the_gpu(tmp_path)))
    spec = parse_spec("faster-op:pattern=step_kernel,factor=10,where=gpu")
    result, base, predicted = run_whatif(table, [spec], correct=False)
    gain = attribute_gain(build_index(table), base, predicted)
    assert gain.lead_not_kept_ms == pytest.approx(8.0, rel=0.05)
    kept = gain.step_saved_ms - gain.lead_not_kept_ms
    assert kept == pytest.approx(result.baseline_ms - result.predicted_ms, rel=0.05)


def test_each_rank_pays_its_own_lead() -> None:
    """On the 8-rank DLRM set the largest rank's add-back (rank 1) went onto the step set by
    another rank (rank 3): GPU work 10x faster predicted 14.455 ms against a 14.406 ms
    baseline, where each rank paying its own gives 14.389."""
    path = SHARED / "dlrm_v100_8rank"
    if not path.exists():
        pytest.skip("shared traces not present")
    table = perfcast.load(str(path))
    result = perfcast.predict(table, "faster-op:pattern=.,factor=10,where=gpu")
    assert result.predicted_ms <= result.baseline_ms


H100 = Path(__file__).resolve().parents[1] / "benchmarks/accuracy/recorded/traces/h100"


def test_the_profiled_prediction_is_never_below_the_unprofiled_one_and_rows_add_up() -> None:
    """Every task 4x faster on the H100 ResNet-50 (foreach Adam): the unprofiled world adds
    back 2.7 ms of host lead per step and the profiled one none, which put the profiled
    prediction at 10.5 ms under the unprofiled 13.2 ms; the profiler's cost is never
    negative. The step rows carry the add-back too (they left it out and did not average to
    the mean), and the assumption gives each world's figure."""
    r = perfcast.whatif(H100 / "r50_foreach.json.gz", "faster-op:factor=4,where=all")
    assert r.predicted_traced_ms >= r.predicted_ms
    rows = [it.predicted_ms for it in r.iterations]
    assert sum(rows) / len(rows) == pytest.approx(r.predicted_ms, rel=1e-6)
    lead = [a for a in r.assumptions if "ahead of the GPU" in a]
    assert lead and "with the profiler's cost left in" in lead[0]
    # Held where the replay put it below, each row too, and said.
    assert all(it.predicted_traced_ms >= it.predicted_ms for it in r.iterations)
    assert any("it is held at the latter" in a for a in r.assumptions)
