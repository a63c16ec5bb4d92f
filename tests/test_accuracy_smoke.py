"""End-to-end smoke test of the accuracy benchmark on one tiny slice (no accuracy asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_one_row_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "accuracy.json"
    traces = tmp_path / "traces"
    # A subprocess, as a user runs it: the benchmark sets global torch state (threads, seeds)
    # and forks DataLoader workers, which should not leak into the test process.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.accuracy",
            "live",
            "--quick",
            "--device",
            "cpu",
            "--workloads",
            "mlp",
            "--optimizations",
            "foreach-adam",
            "--out",
            str(out),
            "--traces-dir",
            str(traces),
            "--record",
            "smoke",
            "--recorded-dir",
            str(tmp_path / "recorded"),
        ],
        cwd=REPO_ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,  # a guard against a hang only: 17 s idle, 49 s on a loaded 2-core VM
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["torch_version"]
    [row] = doc["rows"]
    assert (row["workload"], row["optimization"], row["device"]) == ("mlp", "foreach-adam", "cpu")
    assert row["baseline_measured_ms"] > 0 and row["optimized_measured_ms"] > 0
    assert row["measured_speedup"] > 0
    if row["predicted_ms"] is None:
        assert row["note"]  # why there is no prediction
    else:
        assert row["predicted_speedup"] > 0 and row["error"] is not None
    # The row's own baseline trace, taken between its middle rounds, bracketed by steps
    # timed without the profiler.
    [trace] = traces.glob("cpu/mlp/foreach-adam/rank0.json.gz")
    import perfcast

    info = perfcast.load(trace).ranks[0]
    assert len(info.unprofiled_step_ms) == 3 and len(info.unprofiled_after_step_ms) == 1
    assert "| mlp | foreach-adam | cpu |" in proc.stdout
    # The same row in the recorded format, with its trace, scorable later without a rerun.
    from benchmarks.accuracy.recorded_rows import load_rows

    [rec] = load_rows(root=tmp_path / "recorded")
    assert rec.id == "smoke/mlp/foreach-adam" and rec.measured == "unprofiled"
    assert rec.baseline_ms == row["baseline_measured_ms"] and rec.spec == row["spec"]
    assert len(rec.baseline_windows_ms) >= 4 and rec.baseline_traced_ms > 0
    assert rec.baseline_trace == "traces/smoke/mlp.foreach-adam.json.gz"


@pytest.mark.parametrize("workload", ["cnn", "transformer", "dlrm", "mlp"])
def test_checkpoint_regions_match_the_models(
    workload: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The regions=N the benchmark passes perfcast must be what the model really does.
    from benchmarks.accuracy import workloads
    from benchmarks.accuracy.workloads import TrainConfig, Trainer

    calls = []
    real = workloads._maybe_checkpoint

    def counting(block, x, enabled):  # type: ignore[no-untyped-def]
        if enabled:
            calls.append(1)
        return real(block, x, enabled)

    monkeypatch.setattr(workloads, "_maybe_checkpoint", counting)
    trainer = Trainer(workload, TrainConfig(device="cpu", preset="quick", checkpointing=True))
    try:
        trainer._loss(trainer._next_batch())
    finally:
        trainer.close()
    assert len(calls) == workloads.checkpoint_regions(workload, "quick")
