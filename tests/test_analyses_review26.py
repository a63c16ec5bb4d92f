"""Session-26 review of the trace analyses: figures checked against the raw events and across
the terminal, --json and the API."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import perfcast
from perfcast.cli.main import main
from tests.tracegen import linear_steps

STEP_KEYS = {"trace", "rank", "step", "traced_ms", "real_ms", "measured_real_ms", "source"}


def _slowest_mean(rows: list[dict], trace: str) -> float:
    by: dict[str, float] = {}
    for r in rows:
        if r["trace"] == trace:
            by[r["step"]] = max(by.get(r["step"], 0.0), r["traced_ms"])
    return float(np.mean(list(by.values())))


def test_diff_json_has_each_step_of_each_trace(tmp_path, capsys):
    # `diff --json` gave the steps' mean only; summary gives each step. Its rows now carry
    # each step of A and B under the names summary's steps table uses.
    a = linear_steps(2).write(tmp_path / "a.json")
    b = linear_steps(3).write(tmp_path / "b.json")
    assert main(["diff", str(a), str(b), "--json", "-q"]) == 0
    doc = json.loads(capsys.readouterr().out)
    steps = doc["steps"]
    assert [(r["trace"], r["step"]) for r in steps] == [
        ("A", "ProfilerStep#1"),
        ("A", "ProfilerStep#2"),
        ("B", "ProfilerStep#1"),
        ("B", "ProfilerStep#2"),
        ("B", "ProfilerStep#3"),
    ]
    assert all(set(r) == STEP_KEYS for r in steps)
    assert all(r["real_ms"] is not None for r in steps)
    # The step means are these rows' (per step name the slowest rank, then the mean).
    assert abs(doc["step"]["a_ms"] - _slowest_mean(steps, "A")) < 1e-9
    assert abs(doc["step"]["b_ms"] - _slowest_mean(steps, "B")) < 1e-9
    # The same rows as summary's.
    assert main(["summary", str(b), "--json", "-q"]) == 0
    summ = json.loads(capsys.readouterr().out)
    its = summ["ranks"][0]["iterations"]
    assert [r["traced_ms"] for r in steps if r["trace"] == "B"] == [i["traced_ms"] for i in its]
    assert [r["real_ms"] for r in steps if r["trace"] == "B"] == [i["real_ms"] for i in its]


def test_diff_steps_table_in_python_and_saved_result(tmp_path, capsys):
    a = linear_steps(2).write(tmp_path / "a.json")
    d = perfcast.diff(str(a), str(a), correct=False)
    cols = d.table("steps")
    assert cols["trace"] == ["A", "A", "B", "B"]
    assert cols["real_ms"] == [None] * 4  # no estimate asked for
    # An empty steps table keeps its columns, and a saved diff shows its steps again.
    assert main(["diff", str(a), str(a), "--json", "-q"]) == 0
    saved = tmp_path / "d.json"
    saved.write_text(capsys.readouterr().out)
    assert main(["show", str(saved)]) == 0
    assert "ProfilerStep#2" in capsys.readouterr().out


MLP_GRAPH = Path(__file__).parents[1] / "benchmarks/accuracy/recorded/traces/h100/mlp_graph.json.gz"


def test_launch_delays_are_the_calls_not_a_graphs_other_kernels():
    # Three cudaGraphLaunch calls replay 4,722 kernels; only each call's first has a launch
    # delay. Counting the others as delays of 0 put the mean launch delay at 1.5 µs and its
    # median at 0; over the trace's 6 launch calls they are 1,202 and 1,196 µs.
    from perfcast.analysis.launches import launch_stats

    table = perfcast.load(str(MLP_GRAPH))
    gpu = np.flatnonzero(table.is_gpu() & (table.launch >= 0))
    first: dict[int, int] = {}
    for row in gpu.tolist():
        call = int(table.launch[row])
        if call not in first or table.ts[row] < table.ts[first[call]]:
            first[call] = row
    delays = (
        np.array(
            [max(int(table.ts[r]) - int(table.ts[c] + table.dur[c]), 0) for c, r in first.items()]
        )
        / 1e3
    )
    r = launch_stats(table)
    s = r.summary[0]
    assert len(first) == 6 and s.launches == gpu.size  # GPU operations, as before
    assert s.mean_delay_us == pytest.approx(delays.mean())
    assert s.p50_delay_us == pytest.approx(np.percentile(delays, 50))
    assert s.p95_delay_us == pytest.approx(np.percentile(delays, 95))
    # A kernel the graph runs after its first has no launch delay: None, not 0.
    inner = [g for g in r.by_kernel if g.name.startswith("void at::native::vectorized")]
    assert inner and all(g.mean_delay_us is None and g.max_delay_us is None for g in inner)
    runtime = {g.name: g for g in r.by_runtime}
    assert runtime["cudaMemcpyAsync"].mean_delay_us == pytest.approx(delays[delays > 0].mean())


def test_a_graph_launch_is_one_queue_entry():
    # The queue counted each of a CUDA graph's kernels as a pending launch: 1,574 on a trace
    # whose 3 graph launches (and 3 copies) never had more than 2 pending, and a note blamed
    # a deeper queue on the device. The graph builder counts one entry per launch call.
    from perfcast.analysis.launch_queue import launch_queue

    r = launch_queue(perfcast.load(str(MLP_GRAPH)))
    (s,) = r.by_stream
    assert s.launches == 6 and s.max_length == 2
    assert r.depth_source == "HTA's default" and not r.notes


def test_queue_depth_is_the_graph_builders(shared_traces):
    # "read the way the graph builder reads it": on a trace with graph launches the analysis
    # said 962 pending launches where the replay's graph blocks at 908.
    from perfcast.analysis.launch_queue import launch_queue
    from perfcast.graph import build_graph
    from perfcast.graph.launches import queue_depth

    table = perfcast.load(shared_traces / "hta_a100_rank0_of16.json.gz")
    r = launch_queue(table)
    assert r.depth_source == "measured on this trace"
    assert (r.max_depth, True) == queue_depth(build_graph(table))


def test_summary_says_what_an_overlap_of_dash_means(tmp_path, capsys):
    # A step without communication shows "-" for its overlap (not 0%), and the table's
    # legend now says why; a CPU-only rank's "-" is no GPU work, and the legend says nothing.
    from tests.tracegen import TraceBuilder

    path = linear_steps(2).write(tmp_path / "t.json")
    assert main(["summary", str(path), "-q", "--keep-profiler-cost"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "- : the step has no communication, nothing to overlap" in out
    cpu = TraceBuilder(device=None)
    cpu.step(1, 0, 900)
    cpu.op("aten::mm", 10, 300)
    path = cpu.write(tmp_path / "cpu.json")
    assert main(["summary", str(path), "-q", "--keep-profiler-cost"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "split the step by time" in out and "nothing to overlap" not in out
