"""Session 25's review of the Python API as a notebook uses it: each test names the fault."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import perfcast

EXAMPLE = Path(__file__).resolve().parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"


def test_replay_without_the_correction_has_no_step_without_the_profiler() -> None:
    """replay(correct=False) gave each step a real_ms ("estimated without the profiler")
    equal to its traced time (222.44 ms on the example), in the API, its DataFrame and
    --json, while its docstring says none and summary and diff leave it None."""
    table = perfcast.load(EXAMPLE)
    kept = perfcast.replay(table, correct=False)
    steps = kept.ranks[0].iterations
    assert steps and all(it.real_ms is None for it in steps)
    assert all(it.source == "off" for it in steps)  # still says how it was run
    assert kept.to_pandas("steps")["real_ms"].isna().all()
    assert all(
        it.real_ms is None for it in perfcast.summary(table, correct=False).ranks[0].iterations
    )
    # With the correction the estimate is there, below the traced step.
    corrected = perfcast.replay(table).ranks[0].iterations[0]
    assert corrected.real_ms is not None and corrected.real_ms < corrected.traced_ms


def test_replay_json_keeping_the_profiler_cost_has_no_real_ms(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from perfcast.cli.main import main

    assert main(["replay", str(EXAMPLE), "--keep-profiler-cost", "-q", "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["ranks"][0]["iterations"]
    assert [it["real_ms"] for it in steps] == [None] * 3


def test_plan_of_an_empty_trace_says_it_is_empty(tmp_path: Path) -> None:
    """perfcast.plan on a trace with no events said "the trace has no GPU work (CPU-only)";
    `perfcast plan` and every other API function say it holds no events."""
    path = tmp_path / "empty.json"
    path.write_text('{"traceEvents": []}')
    for trace in (str(path), perfcast.load(path)):
        with pytest.raises(perfcast.TraceFormatError, match="holds no complete events"):
            perfcast.plan(trace, gpus=8)


def test_tables_trees_and_graphs_compare_with_equals() -> None:
    """`perfcast.load(p) == perfcast.load(p)`, two trees or two graphs compared with == raised
    ValueError ("the truth value of an array ... is ambiguous"): the dataclasses' generated
    __eq__ compared their NumPy columns into arrays. Checking that the same call twice gives
    the same result is what a notebook does."""
    a, b = perfcast.load(EXAMPLE), perfcast.load(EXAMPLE)
    assert a == b
    assert perfcast.tree(a) == perfcast.tree(b)
    assert perfcast.tree(a) != perfcast.tree(a, phase="backward")
    ga, gb = (
        perfcast.dependency_graph(a, correct=False),
        perfcast.dependency_graph(b, correct=False),
    )
    assert ga == gb
    gb.cols["dur"][0] += 1
    assert ga != gb
    b.dur[0] += 1
    assert a != b and a != "not a table"


def test_the_same_plan_twice_compares_equal() -> None:
    """Two perfcast.plan calls with the same arguments compared unequal: the result holds
    the time its search took (search_ms), which differs from run to run."""
    table = perfcast.load(EXAMPLE)
    first, second = perfcast.plan(table, gpus=8), perfcast.plan(table, gpus=8)
    second.search_ms = first.search_ms + 5.0
    assert first == second
    assert first != perfcast.plan(table, gpus=16)
