"""The Perfetto export (`replay --export-trace`) as Perfetto's JSON importer reads it: one
slice per op, traced extents where the trace is replayed as it ran, arrows on the slices they
join, launch-queue counters and step slices as the replay has them."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import perfcast
from perfcast.analysis.real_step import real_world
from perfcast.cli.main import main
from perfcast.graph.model import NodeKind
from perfcast.report import perfetto
from perfcast.sim.timeline import Timeline, simulate
from tests.perfetto_import import import_trace, to_ns
from tests.tracegen import TraceBuilder

EXAMPLE = Path(__file__).resolve().parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"
OPS = ("ProfilerStep#1", "model.py(10): forward", "aten::linear", "aten::matmul", "aten::mm")


def _wrapped_ops_trace(path: Path) -> Path:
    """Two steps of: a Python frame wider than its op, aten::linear holding aten::matmul,
    which aten::mm fills exactly (matmul has no CPU time of its own), and a zero-length
    aten::empty."""
    b = TraceBuilder()
    for step in range(2):
        t0 = step * 1000
        b.step(step + 1, t0, 900)
        b.op("model.py(10): forward", t0 + 5, 400, cat="python_function")
        b.op("aten::linear", t0 + 10, 300)
        b.op("aten::matmul", t0 + 20, 180)
        b.op("aten::mm", t0 + 20, 180)
        b.launch("volta_sgemm_128x64_nn", t0 + 30, 5, t0 + 40, 200, stream=7)
        b.op("aten::empty", t0 + 250, 0)
    return b.write(path)


def _worlds(path: Path) -> list[tuple[str, Timeline]]:
    table = perfcast.load(path)
    tl = simulate(perfcast.dependency_graph(table, correct=False))
    return [("traced", tl), ("real", real_world(tl.graph, correct=True, traced=tl).real)]


def _events(tl: Timeline, flows: bool = True) -> list[dict[str, Any]]:
    return list(perfetto.timeline_events(tl, "t", pid_base=1000, flows=flows))


def test_every_op_has_a_slice_nested_as_it_ran(tmp_path: Path) -> None:
    """An op with no CPU time of its own was left out: a zero-length one, and a wrapper its
    child fills (aten::mm appeared right under aten::linear, its aten::matmul missing;
    hta_a100_rank0_of16 lost 6,063 of its 25,545 ops). Every op is a slice now, in both
    worlds, each inside its parent as Perfetto nests them."""
    for world, tl in _worlds(_wrapped_ops_trace(tmp_path / "t.json")):
        events = _events(tl, flows=False)
        imported = import_trace(events)
        assert not imported.errors, (world, imported.examples)
        ops = [i for i, e in enumerate(events) if e["ph"] == "X" and e["cat"] == "cpu_op"]
        names = [events[i]["name"] for i in ops]
        assert set(names) == {*OPS, "ProfilerStep#2", "aten::empty"}, world
        assert all(names.count(n) == 2 for n in (*OPS[1:], "aten::empty")), (world, names)
        for i in ops:
            e = events[i]
            up = imported.parent[i]
            want = {
                "aten::mm": "aten::matmul",
                "aten::matmul": "aten::linear",
                "aten::empty": "aten::linear",
                "aten::linear": "model.py(10): forward",
            }.get(e["name"])
            if want:
                assert events[up]["name"] == want, (world, e["name"], events[up]["name"])
        # The wrapper spans the child that fills it.
        spans = {
            events[i]["name"]: (events[i]["ts"], events[i]["dur"])
            for i in ops
            if events[i]["ts"] < 900
        }
        assert spans["aten::matmul"] == spans["aten::mm"]
        if world == "traced":
            # As traced: the trace's own extents (the frame is wider than its op).
            assert spans["model.py(10): forward"] == (5.0, 400.0)
            assert spans["aten::empty"] == (250.0, 0.0)
        else:
            frame, linear = spans["model.py(10): forward"], spans["aten::linear"]
            assert frame[0] < linear[0] and frame[0] + frame[1] > linear[0] + linear[1]


def test_a_real_trace_keeps_every_op(shared_traces: Path) -> None:
    """hta_a100_rank0_of16: 25,545 ops, 6,063 of them were missing from each world."""
    trace = shared_traces / "hta_a100_rank0_of16.json.gz"
    for world, tl in _worlds(trace):
        table = tl.graph.table
        events = _events(tl, flows=False)
        drawn = [e["args"]["op"] for e in events if e["ph"] == "X" and e["cat"] == "cpu_op"]
        ops = np.flatnonzero(np.isin(table.kind, [0, 1]))  # CPU_OP, USER_ANNOTATION
        assert len(drawn) == len(set(drawn)) and set(ops.tolist()) <= set(drawn), world
        imported = import_trace(events)
        assert not imported.errors, (world, imported.errors)


def test_frames_keep_their_traced_extents(shared_traces: Path) -> None:
    """The replay as traced drew Python frames over their ops' pieces: vLLM's execute_model
    was 79,599.9 µs where the trace says 87,216.9. Every op, frame and range of the traced
    world has its traced start and duration now."""
    trace = shared_traces / "tracelens_b200_vllm_eager_rank0.json.gz"
    tl = _worlds(trace)[0][1]
    table = tl.graph.table
    origin = tl.graph.rank_origin_ns[0]
    slices = [e for e in _events(tl, flows=False) if e["ph"] == "X" and e["cat"] == "cpu_op"]
    rows = np.array([e["args"]["op"] for e in slices])
    assert np.array_equal([to_ns(e["ts"]) for e in slices], table.ts[rows] - origin)
    assert np.array_equal([to_ns(e["dur"]) for e in slices], table.dur[rows])
    model = [e for e in slices if e["name"].endswith(": execute_model")]
    assert model and model[0]["dur"] == pytest.approx(87216.931)


def _expected_arrows(tl: Timeline, events: list[dict[str, Any]]) -> tuple[set[Any], set[Any]]:
    """(every arrow the export may draw, those it must): from the launching call to the GPU
    work, and each stored dependency from its source's slice to its destination's (a CPU
    piece's slice is its op's); one that bounds the end of a destination that began before
    its source may instead go to what ran next on that lane, or be left out. A matched
    collective's arrival and barrier are drawn inside its transfer's slice."""
    g = tl.graph
    c = g.cols
    by_node = {e["args"]["node"]: i for i, e in enumerate(events) if "node" in e.get("args", {})}
    by_op = {e["args"]["op"]: i for i, e in enumerate(events) if "op" in e.get("args", {})}
    into = perfetto._collective_arrivals(g)

    def slice_of(n: int) -> int | None:
        if n in by_node:
            return by_node[n]
        if into[n] >= 0:
            return by_node.get(int(into[n]))
        if c["kind"][n] == NodeKind.CPU and c["op"][n] >= 0:
            return by_op.get(int(c["op"][n]))
        return None

    def read_at(i: int) -> tuple[int, int, int]:  # Perfetto's read order
        return (to_ns(events[i]["ts"]), -to_ns(events[i]["dur"]), i)

    alive = np.flatnonzero(g.alive)
    lanes = {ln: alive[c["lane"][alive] == ln] for ln in np.unique(c["lane"][alive]).tolist()}
    may, must = set(), set()
    gpu = alive[(c["kind"][alive] == NodeKind.GPU) & (c["launch"][alive] >= 0)]
    for n in gpu.tolist():
        must.add((slice_of(int(c["launch"][n])), slice_of(n)))
    for s, d, at_end in zip(g.edge_src.tolist(), g.edge_dst.tolist(), g.edge_at_end.tolist()):
        a, b = slice_of(s), slice_of(d)
        if a is None or b is None or a == b:
            continue
        if at_end and read_at(b) < read_at(a):
            on = lanes[int(c["lane"][d])]
            on = on[np.argsort(c["order"][on], kind="stable")]
            k = int(np.flatnonzero(on == d)[0])
            if k + 1 < on.size and (nxt := slice_of(int(on[k + 1]))) is not None:
                may.add((a, nxt))
            continue
        must.add((a, b))
    return may | must, must


@pytest.mark.parametrize("name", ["example", "hta_a100_rank0_of16.json.gz"])
def test_arrows_bind_to_the_slices_they_join(name: str, request: pytest.FixtureRequest) -> None:
    """Arrows were placed by time (a source's end less 1 ns), and Perfetto binds an arrow to
    the slice on top of its track when it reads it, which may be a child that has already
    finished: 1,080 of the example's 1,086 dependency arrows started on the wrong slice.
    Read as Perfetto reads them, every arrow now joins its two slices, pointing forward in
    time, and none that can be drawn is missing."""
    trace = EXAMPLE if name == "example" else request.getfixturevalue("shared_traces") / name
    v2 = 0
    for world, tl in _worlds(trace):
        events = _events(tl)
        imported = import_trace(events)
        assert not imported.errors, (world, imported.examples)
        bound = {(a, b) for a, b, _ in imported.flows}
        may, must = _expected_arrows(tl, events)
        assert len(bound) == len(imported.flows)  # each once
        assert bound <= may, (world, sorted(bound - may)[:3])
        assert must <= bound, (world, sorted(must - bound)[:3])
        v2 += sum("bind_id" in e for e in events)
    if name != "example":
        assert v2  # wrappers that start with their first child carry their arrows


def test_an_arrow_on_a_slice_whose_child_starts_with_it_is_carried_by_the_slice() -> None:
    """No time binds a v1 arrow to a slice whose first child starts with it (Perfetto reads
    the child first there, then the arrow): such an arrow is carried on the two slices."""
    s = perfetto._Slices(
        pid=np.array([1, 1, 1]),
        tid=np.array([0, 0, 1]),
        start=np.array([1000, 1000, 0]),
        end=np.array([10000, 5000, 500]),
    )
    pos = np.argsort(perfetto._read_order(s))
    arrows = perfetto._bind_arrows(
        s, pos, np.array([2]), np.array([0]), ["dependency"], np.array([0]), itertools.count(1)
    )
    assert not arrows.v1 and not arrows.left_out
    events = []
    for i in range(3):
        e: dict[str, Any] = {
            "ph": "X",
            "name": f"s{i}",
            "pid": 1,
            "tid": int(s.tid[i]),
            "ts": s.start[i] / 1000,
            "dur": (s.end[i] - s.start[i]) / 1000,
        }
        if arrows.bind[i] >= 0:
            e["bind_id"] = int(arrows.bind[i])
            e["flow_out" if arrows.out[i] else "flow_in"] = True
        events.append(e)
    assert import_trace(events).flows == [(2, 0, None)]
    # Given at the slice's start, the arrow would have ended on the child.
    v1 = [
        {"ph": "s", "id": 1, "cat": "c", "name": "c", "pid": 1, "tid": 1, "ts": 0.0},
        {"ph": "f", "bp": "e", "id": 1, "cat": "c", "name": "c", "pid": 1, "tid": 0, "ts": 1.0},
    ]
    plain = [
        {k: v for k, v in e.items() if k not in ("bind_id", "flow_in", "flow_out")} for e in events
    ]
    assert import_trace(plain + v1).flows == [(2, 1, "c")]


def test_a_collectives_queue_slot_is_held_until_it_finishes(shared_traces: Path) -> None:
    """A matched collective is replayed as a zero-length arrival and its transfer; the
    launch-queue counter let the collective's slot go at the arrival, so a stream waiting
    on the other ranks showed an empty queue. It is held until the transfer ends now."""
    for _, tl in _worlds(shared_traces / "dlrm_v100_8rank"):
        events = _events(tl)
        names = {
            (e["pid"], e["tid"]): e["args"]["name"]
            for e in events
            if e["ph"] == "M" and e["name"] == "thread_name"
        }
        counters: dict[tuple[int, str], list[tuple[float, int]]] = {}
        for e in events:
            if e["ph"] == "C":
                counters.setdefault((e["pid"], e["name"]), []).append(
                    (e["ts"], e["args"]["pending"])
                )
        waited = [e for e in events if e["ph"] == "X" and "transfer (µs)" in e["args"]]
        assert len(waited) > 20
        for e in waited:
            track = counters[(e["pid"], f"launch queue · {names[(e['pid'], e['tid'])]}")]
            times = [t for t, _ in track]
            just_before_end = e["ts"] + e["dur"] - 0.001
            level = track[int(np.searchsorted(times, just_before_end, side="right")) - 1][1]
            assert level >= 1, e


def test_each_rank_has_its_steps_as_the_replay_times_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """No slice showed the step time the replay reports: each rank has a track of its steps
    now, each slice the step's window (from the previous step's completion to its own), as
    long as `replay --json` says, as traced and without the profiler."""
    out = tmp_path / "r.json"
    assert main(["replay", str(EXAMPLE), "--json", "--export-trace", str(out)]) == 0
    its = json.loads(capsys.readouterr().out)["ranks"][0]["iterations"]
    events = json.loads(out.read_text())["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    tracks = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"
    }
    steps: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        if e["ph"] == "X" and e["cat"] == "step":
            assert tracks[(e["pid"], e["tid"])] == perfetto.STEPS_TRACK
            steps.setdefault(procs[e["pid"]], []).append(e)
    traced = steps["simulated, as traced · rank 0"]
    real = steps["simulated, without the profiler · rank 0"]
    assert [e["name"] for e in traced] == [it["name"] for it in its] == [e["name"] for e in real]
    for it, a, b in zip(its, traced, real, strict=True):
        assert a["dur"] / 1e3 == pytest.approx(it["simulated_ms"], abs=1e-6)
        assert b["dur"] / 1e3 == pytest.approx(it["real_ms"], abs=1e-6)
    # Back to back: each begins where the one before completed.
    assert all(y["ts"] == pytest.approx(x["ts"] + x["dur"]) for x, y in itertools.pairwise(traced))
    # A prediction's steps are the predicted ones.
    assert (
        main(["whatif", str(EXAMPLE), "--apply", "amp", "--json", "--export-trace", str(out)]) == 0
    )
    its = json.loads(capsys.readouterr().out)["iterations"]
    events = json.loads(out.read_text())["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    predicted = [
        e["dur"] / 1e3
        for e in events
        if e["ph"] == "X" and e["cat"] == "step" and procs[e["pid"]].startswith("predicted")
    ]
    assert predicted == pytest.approx([it["predicted_ms"] for it in its], abs=1e-6)


def test_export_name_ending_in_upper_case_gz_is_gzipped(tmp_path: Path) -> None:
    """OUT.JSON.GZ is gzipped as out.json.gz is (it was written as plain JSON)."""
    out = tmp_path / "OUT.JSON.GZ"
    assert main(["replay", str(EXAMPLE), "--export-trace", str(out), "-q"]) == 0
    assert out.read_bytes()[:2] == b"\x1f\x8b"
