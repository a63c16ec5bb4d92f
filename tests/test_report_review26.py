"""Session-26 review of the HTML report: its figures and captions say what the CLI says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import perfcast
from perfcast.analysis.context_views import CPU_AS_TRACED
from perfcast.cli.main import main as cli_main
from perfcast.report.flame import flame_data
from tests.tracegen import TraceBuilder, linear_steps


def _with_frames(tmp_path: Path) -> Path:
    b = TraceBuilder()
    b.step(1, 0, 900)
    b.op("train.py(20): train_step", 5, 400, cat="python_function")
    b.op("aten::linear", 10, 300)
    b.launch("volta_sgemm_128x64_nn", 20, 5, 30, 200, stream=7)
    return b.write(tmp_path / "frames.json")


def test_icicle_says_no_python_frames_were_recorded(tmp_path: Path) -> None:
    # No with_stack: the page said "GPU time not attributed to a Python frame: 100.00%", as
    # if attribution had failed; `perfcast tree` says no frames were recorded.
    data = flame_data(perfcast.load(str(linear_steps(2).write(tmp_path / "t.json"))))
    assert data is not None
    assert data["coverage_text"].endswith("no Python frames recorded")
    assert "not attributed" not in data["coverage_text"]
    framed = flame_data(perfcast.load(str(_with_frames(tmp_path))))
    assert framed is not None
    assert "not attributed to a Python frame: 0.00%" in framed["coverage_text"]


def test_icicle_says_its_cpu_times_keep_the_profiler_cost(tmp_path: Path) -> None:
    # The page's other figures are without the profiler; the icicle's CPU times are as
    # traced, which `perfcast tree` notes and the page did not.
    data = flame_data(perfcast.load(str(linear_steps(2).write(tmp_path / "t.json"))))
    assert data is not None
    assert CPU_AS_TRACED in data["notes"][1:]  # the page shows the notes after the first


def test_page_draws_the_coverage_caption_from_the_data() -> None:
    from perfcast.report.html import _page_js

    js = _page_js()
    assert "C.coverage_text" in js
    assert "GPU time not attributed to a Python frame" not in js


def test_report_json_carries_the_caveats_the_notes_say(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `report -q --json` printed only the output path: the caveats the page's first card
    # shows (here: no ProfilerStep, the whole trace is one window) reached no one.
    b = TraceBuilder()
    b.op("aten::mm", 10, 100)
    b.launch("volta_sgemm_128x64_nn", 20, 5, 30, 50, stream=7)
    trace = b.write(tmp_path / "nostep.json")
    out = tmp_path / "r.html"
    assert cli_main(["report", "-q", "--json", str(trace), "-o", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["output"] == str(out)
    assert any("no ProfilerStep" in c for c in doc["caveats"]), doc


def test_page_says_its_cpu_times_are_as_traced() -> None:
    # The CPU-by-phase chart and the top CPU ops are the profiled run's times, as `perfcast
    # summary` notes ("ms as traced, the profiler's own cost included"); the page, whose
    # step figures are without the profiler, did not say so.
    from perfcast.report.html import _page_js

    js = _page_js()
    assert js.count("the profiler's own cost is included") == 1
    assert "% of their CPU time, as traced" in js
