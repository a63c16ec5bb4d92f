"""Cut traces (session-26 ingest review): what the notes say about the steps a cut reached."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import perfcast
from perfcast.analysis.notes import first_step_note
from perfcast.real.estimate import StepEstimate
from tests.tracegen import TraceBuilder


def _gpu_bound_doc(order: tuple[int, ...] = (0, 1, 2)) -> dict[str, Any]:
    """3 steps of 1 ms on the CPU, each launching a 2 ms kernel: the GPU sets each step's
    end. As Kineto writes them: every CPU op first, then runtime calls and kernels, one
    step's at a time in `order` (its buffers are not in time order)."""
    b = TraceBuilder()
    for step in range(3):
        t0 = step * 1000
        b.step(step + 1, t0, 1000)
        b.op("aten::linear", t0 + 10, 300)
        b.launch("volta_sgemm_128x64_nn", t0 + 20, 5, 900 + step * 2000, 2000, stream=7)
    doc = b.doc()
    cpu = [e for e in doc["traceEvents"] if e.get("cat") in ("cpu_op", "user_annotation")]
    rest = [e for e in doc["traceEvents"] if e not in cpu]
    per_step = len(rest) // 3  # runtime call, kernel and the two flow ends of each step
    groups = [rest[i * per_step : (i + 1) * per_step] for i in range(3)]
    doc["traceEvents"] = cpu + [e for k in order for e in groups[k]]
    return doc


def _cut_in_kernel(doc: dict[str, Any], nth: int, path: Path) -> Path:
    """`doc` written to `path` and cut inside its `nth` kernel event (0: the first)."""
    data = json.dumps(doc).encode()
    at = -1
    for _ in range(nth + 1):
        at = data.index(b'"volta_sgemm_128x64_nn"', at + 1)
    path.write_bytes(data[: at + 5])
    return path


def test_a_step_the_cut_took_the_gpu_side_of_is_not_blamed_on_the_clocks(tmp_path: Path) -> None:
    """Step 2's launch and kernel were lost at the cut (Kineto wrote step 3's first), so it
    ended before step 1 and was counted as 0 ms, with a note blaming "GPU times out of order
    with their launches" (the MI300X ResNet trace cut at 90%: ProfilerStep#16 0 ms)."""
    cut = perfcast.load(_cut_in_kernel(_gpu_bound_doc((0, 2, 1)), 2, tmp_path / "cut.json"))
    notes = " | ".join(cut.ranks[0].warnings)
    assert "1 step(s) completed before the step before them" in notes
    assert "the cut lost their GPU work?" in notes
    assert "out of order" not in notes
    # The note on the step the cut fell in says its time, not only its GPU time, may be low.
    assert "ProfilerStep#2 and the 1 step after it may be missing events" in notes
    assert "their step time, GPU time and predictions" in notes
    assert cut.ranks[0].cut_steps == ["ProfilerStep#2", "ProfilerStep#3"]


def test_steps_at_the_cut_do_not_make_the_first_step_stand_out(tmp_path: Path) -> None:
    """A cut 99% into the MI300X ResNet trace read its last step 5.07 ms against 18.55: the
    first step (18.98 ms) was said to stand out against a median 12.03 ms for the others,
    a note the whole trace (18.98, 18.98, 18.55 ms) does not give."""
    cut = perfcast.load(_cut_in_kernel(_gpu_bound_doc((0, 2, 1)), 2, tmp_path / "cut.json"))
    steps = [
        StepEstimate(0, "ProfilerStep#1", 18.98, 18.98, None, "default"),
        StepEstimate(0, "ProfilerStep#2", 5.07, 5.07, None, "default"),
        StepEstimate(0, "ProfilerStep#3", 5.07, 5.07, None, "default"),
    ]
    assert first_step_note(steps)  # as before, without the table: the others read low
    assert first_step_note(steps, cut) == []
    # A whole trace's steps still count.
    whole_path = tmp_path / "whole.json"
    whole_path.write_text(json.dumps(_gpu_bound_doc()))
    whole = perfcast.load(whole_path)
    assert whole.ranks[0].cut_steps == []
    assert first_step_note(steps, whole)


def _three_steps(extra: Any) -> TraceBuilder:
    b = TraceBuilder()
    for n, t0 in ((1, 0), (2, 1000), (3, 2000)):
        b.step(n, t0, 1000 if n != 1 else extra)
        b.launch("sm80_xmma_gemm_f32f32", t0 + 10, 5, t0 + 20, 300)
    return b


def test_a_step_range_that_runs_into_the_next_is_cut_there_and_said(tmp_path: Path) -> None:
    # ProfilerStep#1 lengthened by 500 us into #2 (an edited or merged trace): it read
    # 1,500 us with no word.
    table = perfcast.load(_three_steps(1500).write(tmp_path / "t.json"))
    its = [(it.name, (it.end_ns - it.start_ns) / 1000) for it in table.iterations]
    assert its[0] == ("ProfilerStep#1", 1000.0)
    notes = [w for info in table.ranks for w in info.warnings]
    assert any("ProfilerStep#1 runs 0.50 ms into ProfilerStep#2" in w for w in notes)


def test_a_step_range_inside_a_step_is_no_step(tmp_path: Path) -> None:
    # A ProfilerStep#99 inside #2 split it (#2 read short with no kernels) and the note
    # blamed the clocks.
    b = _three_steps(1000)
    b.step(99, 1100, 500)
    table = perfcast.load(b.write(tmp_path / "t.json"))
    assert [it.name for it in table.iterations] == [f"ProfilerStep#{n}" for n in (1, 2, 3)]
    notes = [w for info in table.ranks for w in info.warnings]
    assert any("ProfilerStep#99 (0.50 ms) lies inside ProfilerStep#2" in w for w in notes)
    assert not any("out of order" in w for w in notes)


def test_a_file_cut_inside_its_header_says_so(tmp_path: Path) -> None:
    # "is not valid JSON and nothing could be salvaged (Input data was truncated)": the
    # parser's words, neither where the file ends nor why.
    import gzip

    import pytest

    from perfcast.errors import PerfcastError

    whole = _three_steps(1000).write(tmp_path / "t.json").read_bytes()
    head = whole[: whole.index(b'"traceEvents"') - 5]
    for name, data in (("cut.json", head), ("cut.json.gz", gzip.compress(head))):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(PerfcastError) as exc:
            perfcast.load(str(tmp_path / name))
        text = str(exc.value)
        assert "ends inside its header, before its event list began" in text, text
        assert f"{len(head):,} bytes of JSON" in text and "killed job" in text
