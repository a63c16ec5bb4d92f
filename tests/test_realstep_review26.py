"""Session-26 review of the step without the profiler and its calibration files."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfcast import calibration
from perfcast.errors import PerfcastError


def test_calibration_nested_too_deeply_is_a_clear_error(tmp_path: Path) -> None:
    # json.loads raises RecursionError past the interpreter's limit: that escaped load()
    # and the CLI reported an internal error about the trace, not the calibration file.
    path = tmp_path / "cal.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(PerfcastError, match="nested too deeply"):
        calibration.load(path)


def _profiler(op_ns: float, input_ns: float, plain_ns: float) -> calibration.ProfilerCosts:
    return calibration.ProfilerCosts(
        op_ns=op_ns,
        input_ns=input_ns,
        op_no_shapes_ns=plain_ns,
        python_ns=400.0,
        memory_ns=100.0,
        runtime_ns=None,
    )


# Two `perfcast calibrate --quick` runs on this project's 2-core VM while other jobs loaded it
# (29 Nov): 10,467 ns per op with shapes against 327 without, then 83 + 182 against 405.
BUSY = [_profiler(10466.7, 0.0, 327.2), _profiler(82.7, 182.1, 404.9)]
# The recorded calibrations (benchmarks/accuracy/recorded/calibrations): 1.0-1.8x.
IDLE = [
    _profiler(633.4, 30.1, 517.0),
    _profiler(457.9, 87.8, 463.2),
    _profiler(1612.9, 185.8, 1799.1),
    _profiler(2231.8, 0.0, 1248.4),
    _profiler(903.6, 131.8, 943.2),
]


def test_disturbed_profiler_costs_are_flagged() -> None:
    assert [bool(p.noisy()) for p in BUSY] == [True, True]
    assert [p.noisy() for p in IDLE] == [""] * len(IDLE)


def test_calibrate_and_the_correction_say_the_costs_look_disturbed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """calibrate printed a per-op cost 32x its own no-shapes cost without a word, and every
    correction then took 10.5 µs per op out of traces of that machine as if measured."""
    from dataclasses import replace

    from rich.console import Console

    from perfcast.analysis.real_step import calibrated_cost
    from perfcast.real import ProfilerSettings
    from perfcast.report import terminal

    cal = calibration.Calibration(
        machine={"hostname": "vm"},
        created="2026-11-29T23:00:00Z",
        dataloader=None,
        checkpoint=None,
        path=str(tmp_path / "cal.json"),
        profiler=BUSY[0],
    )
    console = Console(record=True, width=300)
    terminal.calibration(cal, console)
    assert "32x as costly with record_shapes" in console.export_text()

    calibration.save(replace(cal, path=""), tmp_path / "cal.json")
    monkeypatch.setenv(calibration.ENV, str(tmp_path / "cal.json"))
    cost, _ = calibrated_cost(object(), ProfilerSettings(True, False, False, False))
    assert cost is not None and cost.op_ns == pytest.approx(10466.7)  # used as measured
    assert "look disturbed" in cost.note


@pytest.mark.parametrize("before", [[0.0], [-1.0], ["x"], [1e30]])
def test_unreadable_unprofiled_steps_are_said_once_naming_the_field(
    tmp_path: Path, before: list
) -> None:
    """A step time that is not one (0, negative, text, 1e30) is not fitted to, and the note
    says which field; an empty list of steps after the trace (none timed) is no fault: it
    was reported as unreadable too, so the note came twice. (NaN is not JSON: the capture
    never writes it.)"""
    import json

    import perfcast
    from tests.tracegen import TraceBuilder

    b = TraceBuilder()
    b.step(1, 0, 200)
    b.launch("sm80_xmma_gemm_f32f32", 12, 3, 40, 10)
    doc = b.doc()
    doc["perfcast_unprofiled_step_ms"] = before
    doc["perfcast_unprofiled_after_step_ms"] = []
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    notes = [n for n in perfcast.predict(str(path), []).notes if "unreadable" in n]
    assert len(notes) == 1 and "perfcast_unprofiled_step_ms" in notes[0]
    doc["perfcast_unprofiled_step_ms"] = [1.0]
    path.write_text(json.dumps(doc))
    assert not [n for n in perfcast.predict(str(path), []).notes if "unreadable" in n]


def test_a_cpu_only_trace_lists_no_runtime_call_costs(tmp_path: Path) -> None:
    """A CPU-only trace has no runtime calls: its correction's note listed "18.69 µs per
    runtime call, 4.78 µs per GPU task ..." (the fitted scale of the defaults) as if they had
    been taken out. A trace with launches still lists them."""
    import perfcast
    from tests.tracegen import TraceBuilder

    cpu = TraceBuilder()
    cpu.step(1, 0, 300)
    cpu.op("aten::mm", 10, 100)
    gpu = TraceBuilder()
    gpu.step(1, 0, 300)
    gpu.launch("sm80_xmma_gemm_f32f32", 12, 3, 40, 10)
    said_cpu = perfcast.predict(cpu.write(tmp_path / "c.json"), []).correction.assumption()
    said_gpu = perfcast.predict(gpu.write(tmp_path / "g.json"), []).correction.assumption()
    assert "per runtime call" not in said_cpu and "no runtime calls in the trace" in said_cpu
    assert "per runtime call" in said_gpu and "per GPU task" in said_gpu
