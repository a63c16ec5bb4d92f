"""The accuracy benchmark's variants, built and stepped on the CPU where PyTorch allows it.

`live --device cuda` has its own code paths (bf16 autocast, fused Adam, channels-last, CUDA
graphs, torch.compile) that a CPU run never takes, because those optimizations need CUDA
there. Most of them also run on the CPU, so a mistake in how a variant is built shows here
first and not on a borrowed GPU. Not run: torch.compile (compiling takes minutes here; the
wrapper is only built) and CUDA graph capture (CUDA only; its static-input path is checked
with the capture itself stubbed).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from benchmarks.accuracy.workloads import (  # noqa: E402
    OPTIMIZATIONS,
    WORKLOADS,
    TrainConfig,
    Trainer,
)

BASE = TrainConfig(device="cpu", preset="quick")
# The CUDA-only optimizations whose variant steps on the CPU too.
STEPPED_ON_CPU = ("amp", "fused-adam", "channels-last")


def _pairs(names: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(w, o) for o in names for w in WORKLOADS if OPTIMIZATIONS[o].applies_to(w, "cuda")]


def _params(trainer: Trainer) -> list[Any]:
    return [p.detach().clone() for p in trainer.model.parameters()]


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_cuda_only_optimizations_are_marked_so() -> None:
    cuda_only = {n for n, o in OPTIMIZATIONS.items() if o.needs_cuda}
    assert cuda_only == {"amp", "cuda-graphs", "fused-adam", "torch-compile", "channels-last"}
    for name in cuda_only:
        assert not OPTIMIZATIONS[name].applies_to("cnn", "cpu")
    assert [w for w in WORKLOADS if OPTIMIZATIONS["channels-last"].applies_to(w, "cuda")] == ["cnn"]


@pytest.mark.parametrize(("workload", "optimization"), _pairs(STEPPED_ON_CPU))
def test_variant_trains_on_cpu(workload: str, optimization: str) -> None:
    cfg = OPTIMIZATIONS[optimization].apply(BASE)
    trainer = Trainer(workload, cfg)
    try:
        before = _params(trainer)
        trainer.step()
        trainer.step()
        trainer.synchronize()
        loss = trainer.last_loss
        assert loss is not None and math.isfinite(loss)
        after = _params(trainer)
        assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
        if optimization == "fused-adam":
            assert trainer.optimizer.defaults["fused"] is True
        if optimization == "amp":
            # The forward runs in bf16 under autocast on the trainer's own device type.
            with trainer._autocast():
                assert torch.get_autocast_dtype("cpu") == torch.bfloat16
                assert torch.is_autocast_enabled("cpu")
        if optimization == "channels-last":
            conv = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.Conv2d))
            assert conv.weight.is_contiguous(memory_format=torch.channels_last)
            images = trainer._next_batch()[0]
            assert images.is_contiguous(memory_format=torch.channels_last)
    finally:
        trainer.close()


@pytest.mark.parametrize("workload", WORKLOADS)
def test_variant_starts_from_the_baselines_weights(workload: str) -> None:
    # Baseline and variant are compared step for step: the same model, the same data.
    base = Trainer(workload, BASE)
    amp = Trainer(workload, OPTIMIZATIONS["amp"].apply(BASE))
    try:
        for a, b in zip(_params(base), _params(amp), strict=True):
            assert torch.equal(a, b)
        for a, b in zip(base._next_batch(), amp._next_batch(), strict=True):
            assert torch.equal(a, b)
    finally:
        base.close()
        amp.close()


@pytest.mark.parametrize("workload", WORKLOADS)
def test_compile_variant_is_built_lazily(workload: str) -> None:
    trainer = Trainer(workload, OPTIMIZATIONS["torch-compile"].apply(BASE))
    try:
        # One compiled wrapper per trainer (so one compile per row), around its own model.
        assert trainer.forward is not trainer.model
        assert getattr(trainer.forward, "_orig_mod", None) is trainer.model
    finally:
        trainer.close()


@pytest.mark.parametrize("workload", WORKLOADS)
def test_cuda_graph_variant_feeds_static_inputs(
    workload: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA graphs cannot be captured on the CPU: with the capture stubbed (warm-up steps
    and one recorded step, run eagerly), check what the real capture relies on: capturable
    Adam, a capture once per trainer, and each fresh batch copied into the static inputs
    that the captured step reads."""
    trainer = Trainer(workload, OPTIMIZATIONS["cuda-graphs"].apply(BASE))
    assert trainer.optimizer.defaults["capturable"] is True
    assert trainer.cfg.adam == "single"  # capturable single-tensor Adam, as in the CUDA docs

    captures: list[int] = []
    seen: list[list[Any]] = []

    class Graph:
        def replay(self) -> None:  # the recorded step, run eagerly on the static inputs
            seen.append([t.clone() for t in trainer._static_batch])
            trainer._static_loss = trainer._loss(trainer._static_batch)
            trainer.optimizer.zero_grad(set_to_none=True)
            trainer._static_loss.backward()
            trainer.optimizer.step()

    def capture(batch: list[Any]) -> None:
        captures.append(1)
        trainer._static_batch = [t.clone() for t in batch]
        trainer._graph = Graph()

    monkeypatch.setattr(trainer, "_capture_graph", capture)
    # Adam(capturable=True) refuses CPU parameters; the graph's step has them on the GPU.
    trainer.optimizer.defaults["capturable"] = False
    for group in trainer.optimizer.param_groups:
        group["capturable"] = False
    fresh: list[list[Any]] = []
    real_next = trainer._next_batch

    def next_batch() -> list[Any]:
        batch = real_next()
        fresh.append([t.clone() for t in batch])
        return batch

    monkeypatch.setattr(trainer, "_next_batch", next_batch)
    try:
        for _ in range(3):
            trainer.step()
        assert captures == [1]
        assert len(seen) == 3
        for got, want in zip(seen, fresh, strict=True):
            for a, b in zip(got, want, strict=True):
                assert torch.equal(a, b)
        assert trainer.last_loss is not None and math.isfinite(trainer.last_loss)
    finally:
        trainer.close()
    assert trainer._graph is None


def test_rows_left_when_time_is_up(tmp_path: Any) -> None:
    # A run whose deadline has passed starts no row and says how many are left to resume.
    import time

    from benchmarks.accuracy.runner import run

    doc = run(
        WORKLOADS,
        ["foreach-adam", "amp"],  # amp needs CUDA: not applicable on the CPU, not left
        device="cpu",
        quick=True,
        traces_dir=tmp_path,
        deadline=time.monotonic() - 1,
    )
    assert doc["rows"] == []
    assert doc["config"]["rows_left"] == len(WORKLOADS)
    assert doc["config"]["rows_failed"] == 0


def test_import_live_copies_a_recorded_source(tmp_path: Any, monkeypatch: Any) -> None:
    # What a GPU run leaves in its --recorded-dir goes into the project's recorded rows
    # byte-identical, and never over a source the project already has.
    from benchmarks.accuracy import import_recorded
    from benchmarks.accuracy.recorded_rows import RecordedRow, load_rows, write_rows

    run_dir, project = tmp_path / "run", tmp_path / "project"
    trace, cal = "traces/gpu-x/mlp.amp.json.gz", "calibrations/gpu-x.json"
    for rel, data in ((trace, b"\x1f\x8b trace"), (cal, b"{}")):
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / rel).write_bytes(data)
    row = RecordedRow(
        id="gpu-x/mlp/amp",
        source="gpu-x",
        device="NVIDIA H100 80GB HBM3",
        processor="gpu",
        workload="mlp",
        baseline="mlp baseline",
        variant="amp",
        change="amp",
        spec="amp",
        baseline_trace=trace,
        measured="unprofiled",
        baseline_ms=2.0,
        variant_ms=1.0,
        calibration=cal,
    )
    write_rows(run_dir / "rows" / "gpu-x.jsonl", [row])
    monkeypatch.setattr(import_recorded, "RECORDED_DIR", project)
    monkeypatch.setattr(import_recorded, "ROWS_DIR", project / "rows")
    assert import_recorded.main(["live", str(run_dir)]) == 0
    assert load_rows(root=project) == [row]
    for rel in (trace, cal, "rows/gpu-x.jsonl"):
        assert (project / rel).read_bytes() == (run_dir / rel).read_bytes()
    assert import_recorded.main(["live", str(run_dir)]) == 2  # already there: refused


def test_a_resumed_run_keeps_the_first_calls_calibration(tmp_path: Any) -> None:
    # Each call of a resumed GPU run calibrates again; the rows of the first call name the
    # first calibration, so the second must not overwrite it (it did on 26 November 2026).
    from benchmarks.accuracy.runner import Recorder

    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text('{"call": 1}')
    second.write_text('{"call": 2}')
    Recorder("gpu-x", "NVIDIA H100 80GB HBM3", tmp_path / "rec").save_calibration(first)
    resumed = Recorder("gpu-x", "NVIDIA H100 80GB HBM3", tmp_path / "rec")
    resumed.save_calibration(second)
    assert resumed.calibration == "calibrations/gpu-xb.json"
    assert (tmp_path / "rec" / "calibrations" / "gpu-x.json").read_text() == '{"call": 1}'
    assert (tmp_path / "rec" / resumed.calibration).read_text() == '{"call": 2}'


class _FakeTrainer:
    """Steps that take no time; only the DataLoader worker count matters here."""

    def __init__(self, num_workers: int) -> None:
        self.cfg = type("Cfg", (), {"num_workers": num_workers, "device": "cpu"})()
        self.steps = 0

    def step(self) -> None:
        self.steps += 1

    def synchronize(self) -> None:
        pass


def test_the_other_side_waits_for_a_sides_workers(monkeypatch: Any) -> None:
    """A side with DataLoader workers leaves them building its prefetched batches; the other
    side must not be timed while they do (it ran up to 18% slower on the 2-core machine)."""
    from benchmarks.accuracy import runner

    events: list[tuple[str, float]] = []
    monkeypatch.setattr(runner.time, "sleep", lambda s: events.append(("sleep", s)))
    baseline, variant = _FakeTrainer(0), _FakeTrainer(2)
    real_windows = runner._time_windows

    def windows(trainer: Any, timing: Any, warmup: int) -> list[float]:
        events.append(("workers" if trainer is variant else "none", 0.0))
        real_windows(trainer, timing, warmup)
        return [20.0] * timing.windows  # 20 ms steps

    monkeypatch.setattr(runner, "_time_windows", windows)
    timing = runner.Timing(warmup=1, rounds=4, windows=2, window=2, profile_warmup=1)
    runner.measure_pair(baseline, variant, timing)
    kinds = [k for k, _ in events]
    # The worker side is always followed by a wait (the warm-up too), and only it is.
    assert kinds[0] == "sleep"
    for before, after in itertools.pairwise(kinds):
        assert (before == "workers") == (after == "sleep")
    assert kinds.count("none") == kinds.count("workers") == 4
    # 2 batches ahead per worker, at most `workers` steps each: 2 * 2 * 2 * 20 ms.
    assert [s for k, s in events if k == "sleep"][1:] == [pytest.approx(0.16)] * 4
