"""The Python API's arguments: a wrong type or value raises a perfcast error that names the
argument (not a TypeError from deep inside, not a slice that means something else), and a
DataFrame the API hands out is the user's to edit."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import perfcast
from perfcast.errors import OptionError

EXAMPLE = Path(__file__).parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"
MLP_TRACE = Path(__file__).parents[1] / "benchmarks/accuracy/recorded/traces/h100/mlp_base.json.gz"


@pytest.fixture(scope="module")
def table() -> perfcast.EventTable:
    return perfcast.load(EXAMPLE)


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda t: perfcast.predict(t, 5), "apply must be a what-if spec"),
        (lambda t: perfcast.predict(t, [5]), "apply must be a what-if spec"),
        (lambda t: perfcast.summary(t, top="x"), "top must be an integer"),
        (lambda t: perfcast.summary(t, top=-1), "top must be at least 1"),
        (lambda t: perfcast.scopes(t, top="a"), "top must be an integer"),
        (lambda t: perfcast.idle_time(t, kernel_gap_ns="x"), "kernel_gap_ns must be an integer"),
        (lambda t: perfcast.launch_queue(t, max_depth=0), "max_depth must be at least 1"),
        (lambda t: perfcast.stragglers(t, candidates=-1), "candidates must be at least 1"),
        (lambda t: perfcast.diff(t, t, top=-1), "top must be at least 1"),
        (lambda t: perfcast.advise(t, candidates=[]), "candidates is empty"),
        (lambda t: perfcast.summary(b"trace.json"), "trace must be a path"),
        (lambda t: perfcast.diff(t, 5), "b must be a path"),
        (lambda t: perfcast.analyze(t, only=5), "only must be an analysis name"),
    ],
)
def test_bad_arguments_raise_an_error_that_names_them(table, call, needle) -> None:
    with pytest.raises(OptionError, match=needle):
        call(table)


def test_diff_takes_an_empty_apply_and_correct_or_its_old_name(table) -> None:
    assert perfcast.diff(table, table, apply=[], correct=False).prediction is None
    old = perfcast.diff(table, table, apply="remove-host-sync", real=False).prediction
    assert old is not None and old.predicted_real_ms is None  # nothing corrected: none
    with pytest.raises(OptionError, match="not both"):
        perfcast.diff(table, table, correct=False, real=True)


def test_numpy_integers_are_counts_too(table) -> None:
    import numpy as np

    summary = perfcast.summary(table, top=np.int64(3), correct=False)
    assert len(summary.ranks[0].top_kernels) == 3


def test_advise_checks_its_candidates_and_device_before_any_work(table) -> None:
    """These returned an empty Advice with the problem in `not_applicable` ('nope'), or
    with each letter of a string taken as a candidate ('a', 'm', 'p')."""
    with pytest.raises(OptionError, match="candidates: unknown optimization 'nope'"):
        perfcast.advise(table, candidates="nope")
    with pytest.raises(OptionError, match="has no option 'dtyp'"):
        perfcast.advise(table, candidates=["amp:dtyp=bf16"])
    with pytest.raises(OptionError, match="device='nonsense-gpu': unknown GPU"):
        perfcast.advise(table, device="nonsense-gpu")
    advice = perfcast.advise(table, candidates="remove-host-sync")
    tried = [s.name for s in advice.suggestions] + [str(n) for n in advice.not_applicable]
    assert "remove-host-sync" in advice.text() and not any(n in ("a", "m", "p") for n in tried)


def test_editing_to_pandas_leaves_the_table_alone(table) -> None:
    before = perfcast.summary(table, correct=False).ranks[0].iterations[0].measured_ms
    ts, dur, name = table.ts.copy(), table.dur.copy(), table.name.copy()
    df = table.to_pandas()
    df.loc[:, "ts"] = 0
    df.iloc[0, df.columns.get_loc("dur")] = 123_456_789
    df.loc[0, "name"] = df.loc[5, "name"]
    assert (table.ts == ts).all() and (table.dur == dur).all() and (table.name == name).all()
    assert perfcast.summary(table, correct=False).ranks[0].iterations[0].measured_ms == before


def test_dependency_graph_is_a_corrected_copy(table) -> None:
    """The README's custom what-if starts here: the profiler's cost is out of the graph (the
    replay of it is the step without the profiler), and each call gives a fresh copy."""
    from perfcast.sim import simulate
    from perfcast.whatif import primitives as P

    traced = simulate(perfcast.dependency_graph(table, correct=False)).iteration_ns()
    g = perfcast.dependency_graph(table)
    real = simulate(g).iteration_ns()
    assert all(r[3] < t[3] for r, t in zip(real, traced, strict=True))
    P.scale(g, P.select(g, kind="gpu"), 2.0)
    assert simulate(perfcast.dependency_graph(table)).iteration_ns() == real


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda t: perfcast.predict(t, "nosuch"), "unknown optimization 'nosuch'"),
        (lambda t: perfcast.predict(t, "amp:foo=1"), "'amp' has no option 'foo'"),
        (lambda t: perfcast.predict(t, "amp:dtype=fp8"), "dtype must be bf16 or fp16"),
        (lambda t: perfcast.predict(t, "ddp:gpus=0"), "gpus must be at least 2"),
        (lambda t: perfcast.predict(t, "batch-size:factor=-2"), "factor cannot be negative"),
        (lambda t: perfcast.tree(t, phase="bogus"), "unknown phase 'bogus'"),
        (lambda t: perfcast.tree(t, rank=99), "no rank 99"),
        (lambda t: perfcast.tree(t, step="nope"), "no step 'nope'"),
        (lambda t: perfcast.tree(t, step=4.0), "step must be an integer, not 4.0"),
        (lambda t: perfcast.analyze(t, only="bogus"), "unknown analysis 'bogus'"),
        (lambda t: perfcast.collectives(t, link="foo"), "unknown link 'foo'"),
        (lambda t: perfcast.kernel_breakdown(t).to_pandas("nosuch"), "has no table 'nosuch'"),
        (lambda t: perfcast.load(None), "a trace is a path"),
    ],
)
def test_bad_options_are_option_errors(table, call, needle) -> None:
    # `except perfcast.OptionError` catches every wrong argument, not only some of them.
    with pytest.raises(OptionError, match=needle):
        call(table)


def test_plan_model_checks_its_counts() -> None:
    from perfcast.plan import plan_model

    for kwargs, needle in [
        ({"gpus": "64"}, "gpus must be an integer"),
        ({"gpus": 0}, "gpus must be at least 1"),
        ({"gpus": 8, "global_batch": 0}, "global_batch must be at least 1"),
        ({"gpus": 8, "gpu": "tpu"}, "unknown GPU 'tpu'"),
    ]:
        with pytest.raises(OptionError, match=needle):
            plan_model("gpt-1.7b", **kwargs)


def test_graph_primitives_refuse_what_they_cannot_select_or_scale(table) -> None:
    from perfcast.whatif import primitives as P

    g = perfcast.dependency_graph(table)
    with pytest.raises(OptionError, match="unknown node kind 'bogus'"):
        P.select(g, kind="bogus")
    with pytest.raises(OptionError, match="not a valid regular expression"):
        P.select(g, name="(")
    nodes = P.select(g, kind="gpu")
    for factor in (-1.0, float("nan"), float("inf")):
        with pytest.raises(OptionError, match="finite number >= 0"):
            P.scale(g, nodes, factor)
    with pytest.raises(OptionError, match="days: no step runs that long"):
        P.scale(g, nodes, 1e20)  # would overflow int64 nanoseconds
    before = g.cols["dur"][nodes].copy()
    P.scale(g, nodes, 0.5)
    assert (g.cols["dur"][nodes] <= before).all()
    # Through a what-if, the message names the spec.
    with pytest.raises(OptionError, match=r"^faster-op:factor=1e-20: a duration factor"):
        perfcast.predict(table, "faster-op:factor=1e-20")


def test_peak_memory_takes_one_spec_or_a_list_and_refuses_unknown_ones(table) -> None:
    from perfcast.memory_model.model import predict_peak_memory

    one = predict_peak_memory(table, "amp")
    assert one.peak_bytes == predict_peak_memory(table, ["amp"]).peak_bytes
    assert any(a.startswith("amp") for a in one.assumptions)  # not the letters a, m, p
    assert predict_peak_memory(EXAMPLE, ["amp"]).peak_bytes == one.peak_bytes  # a path too
    for bad, needle in [
        (["nosuch"], "unknown change 'nosuch'"),
        (["amp:dtype=fp99"], "dtype must be bf16 or fp16"),
        (["amp:foo=1"], "'amp' has no option 'foo'"),
        (42, "changes must be what-if specs"),
    ]:
        with pytest.raises(OptionError, match=needle):
            predict_peak_memory(table, bad)
    with pytest.raises(OptionError, match="needs a trace path"):
        predict_peak_memory(42)


def test_advise_refuses_a_bad_value_in_a_candidate_the_user_named() -> None:
    for bad, needle in [("amp:dtype=fp8", "dtype"), ("faster-op:pattern=(", "regular expression")]:
        with pytest.raises(OptionError, match=needle):
            perfcast.advise(EXAMPLE, candidates=[bad])
    with pytest.raises(OptionError, match="unknown GPU"):
        perfcast.advise(EXAMPLE, device="nosuchgpu")
    # The advisor's own candidates that do not apply are listed, not raised.
    assert perfcast.advise(EXAMPLE).not_applicable


def test_plan_and_collectives_check_their_arguments_before_the_trace(tmp_path) -> None:
    from perfcast.plan import plan_trace

    assert plan_trace(str(EXAMPLE), gpus=8, top=1).best  # a path is loaded
    for memory in (float("nan"), 0, -1.0, "80"):
        with pytest.raises(OptionError, match="memory_gb must be a number more than 0"):
            plan_trace(str(EXAMPLE), gpus=8, memory_gb=memory)
    # A trace without collectives still refuses a link it does not know.
    with pytest.raises(OptionError, match="unknown link 'bogus'"):
        perfcast.collectives(MLP_TRACE, link="bogus")  # one GPU: no collectives


# Found by a review: each of these was an AttributeError, TypeError, IndexError or ValueError
# from deep inside, or (plan --model) an internal error.
@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda t: perfcast.tree(t, phase=5), "phase must be a name"),
        (lambda t: perfcast.tree(t, rank="0"), "rank must be an integer, not '0'"),
        (lambda t: perfcast.collectives(t, link=5), "link must be a name"),
        (lambda t: _plan().plan_trace(t, 8, gpu=5), "gpu must be a name"),
        (lambda t: _plan().plan_trace(t, 8, link=5), "link must be a name"),
        (lambda t: _plan().plan_trace(t, 8, batch="x"), "batch must be an integer"),
        (lambda t: _plan().plan_trace(t, 8, batch=0), "batch must be at least 1"),
        (lambda t: _plan().plan_trace(t, 8, nics_per_node="x"), "nics_per_node must be"),
        (lambda t: _plan().plan_trace(None, 8), "a path .* or a loaded EventTable"),
        (lambda t: _plan().plan_model(None, 8), "model is a preset name"),
        (lambda t: _plan().plan_model({"layers": 2}, 8), "model is a preset name"),
        (lambda t: _plan().plan_model("gpt-1.7b", 8, gpu=5), "gpu must be a name"),
        (lambda t: _plan().plan_model("gpt-1.7b", 8, bogus=1), "no option 'bogus'"),
        (lambda t: _peak(t, [("amp",)]), None),  # a name alone is fine
        (lambda t: _peak(t, [("amp", None)]), r"a change given as a tuple is \(name"),
        (lambda t: _peak(t, [("amp", 5)]), r"a change given as a tuple is \(name"),
        (lambda t: _peak(t, ["amp:dtype"]), "is not key=value"),
        (lambda t: _peak(t, [("activation-checkpointing", {"module": "("})]), "regular expr"),
    ],
)
def test_wrong_arguments_are_named_in_one_line(table, call, says) -> None:
    if says is None:
        call(table)
        return
    with pytest.raises(OptionError, match=says) as info:
        call(table)
    assert "\n" not in str(info.value)


def _plan():
    import perfcast.plan

    return perfcast.plan


def _peak(table, changes):
    from perfcast.memory_model import predict_peak_memory

    return predict_peak_memory(table, changes)


@pytest.mark.parametrize(
    ("desc", "says"),
    [
        ('{"layers": NaN, "hidden": 64, "heads": 4, "seq": 128, "vocab": 1000}', "whole number"),
        ('{"layers": 2.5, "hidden": 64, "heads": 4, "seq": 128, "vocab": 1000}', "whole number"),
        ('{"layers": true, "hidden": 64, "heads": 4, "seq": 128, "vocab": 1000}', "whole number"),
        ('{"layers": 2, "hidden": "x", "heads": 4, "seq": 128, "vocab": 1000}', "whole number"),
        (
            '{"layers": 99999999999999999999999, "hidden": 64, "heads": 4, "seq": 128, "vocab": 1}',
            "out of range",
        ),
        (
            '{"layers": 2, "hidden": 64, "heads": 4, "seq": 128, "vocab": 1000, "gated_mlp": 1}',
            "true or false",
        ),
        ("{}", "lacks layers, hidden, heads, seq, vocab"),
    ],
)
def test_a_model_description_with_wrong_values_is_refused(desc: str, says: str) -> None:
    from perfcast.errors import PerfcastError
    from perfcast.plan.desc import load_desc

    with pytest.raises(PerfcastError, match=says):
        load_desc(desc)


@pytest.mark.parametrize("fn", ["summary", "replay", "dependency_graph", "advise"])
def test_yes_no_arguments_take_only_true_or_false(table, fn: str) -> None:
    """`correct="no"` was read as true, silently."""
    with pytest.raises(OptionError, match="correct must be True or False, not 'no'"):
        getattr(perfcast, fn)(table, correct="no")
    with pytest.raises(OptionError, match="correct must be True or False"):
        perfcast.predict(table, "amp", correct=None)


def test_what_the_checks_must_still_take(table) -> None:
    """Found by a review of the checks above: values that worked before them still do."""
    import numpy as np

    from perfcast.errors import TraceFormatError
    from perfcast.hardware.devices import lookup_device
    from perfcast.plan import plan_model
    from perfcast.plan.desc import ModelDesc
    from perfcast.whatif.registry import build_options

    # device's host is a ratio or a calibration file: a number or a Path, not only text.
    assert build_options("device", {"target": "h100", "host": 1.5}).host == 1.5
    assert _peak(table, [("device", {"target": "h100", "host": 2})]) is not None
    # A GPU of the user's own, as a DeviceSpec.
    assert plan_model("gpt-1.7b", 8, gpu=lookup_device("h100"), top=1).best
    # numpy's integers and booleans where a whole number or a yes/no is asked.
    desc = ModelDesc("m", np.int64(2), 1024, 16, 512, 1000, gated_mlp=np.bool_(True))
    assert type(desc.layers) is int and desc.gated_mlp is True
    assert build_options("remove-host-sync", {"reads": np.bool_(True)}).reads is True
    # A NUL in a path is no such file, not a ValueError.
    with pytest.raises(TraceFormatError, match="no such file"):
        perfcast.load("a\0b")


def test_a_bad_flag_is_refused_before_the_trace_is_read() -> None:
    with pytest.raises(OptionError, match="correct must be True or False"):
        perfcast.summary("/no/such/trace.json", correct="no")
    with pytest.raises(OptionError, match="real must be True or False"):
        perfcast.diff("/no/such/a.json", "/no/such/b.json", real="no")


def test_predict_and_diff_check_every_option_before_the_trace(tmp_path) -> None:
    """A bad option value (not only a bad name) fails before any load: the path below does
    not exist, so reaching the load would say so instead."""
    missing = tmp_path / "never-read.json"
    for spec in ("amp:dtype=fp8", "ddp:gpus=-1", "batch-size:factor=0", "amp:foo=1"):
        with pytest.raises(OptionError):
            perfcast.predict(missing, spec)
        with pytest.raises(OptionError):
            perfcast.diff(missing, missing, apply=spec)
    for host in ("-1", "nan", "0", str(tmp_path / "no-calibration.json")):
        with pytest.raises(OptionError, match="host"):
            perfcast.predict(missing, f"device:target=h100,host={host}")


def test_text_width_and_load_progress_are_checked(table) -> None:
    summary = perfcast.summary(table, correct=False)
    for width in ("100", 100.5, 0, -1):
        with pytest.raises(OptionError, match="width"):
            summary.text(width=width)
    with pytest.raises(OptionError, match="progress must be a function"):
        perfcast.load(EXAMPLE, progress=5)


def test_a_trace_without_events_is_refused_as_the_command_line_refuses_it(tmp_path) -> None:
    from perfcast.errors import PerfcastError

    empty = tmp_path / "empty.json"
    empty.write_text('{"traceEvents": []}')
    with pytest.raises(PerfcastError, match="holds no complete events") as info:
        perfcast.summary(empty)
    assert str(empty) in str(info.value)
    with pytest.raises(PerfcastError, match="holds no complete events"):
        perfcast.diff(EXAMPLE, empty)


def test_advice_to_pandas_takes_a_table_name_like_the_other_results(table) -> None:
    pytest.importorskip("pandas")
    advice = perfcast.advise(table, candidates="remove-host-sync", correct=False)
    assert advice.to_pandas("suggestions").equals(advice.to_pandas())
    with pytest.raises(OptionError, match="no table 'x'"):
        advice.to_pandas("x")


def test_advise_takes_each_candidate_once_and_a_device_name_only(table) -> None:
    advice = perfcast.advise(table, candidates=["remove-host-sync", "remove-host-sync"])
    tried = [s.name for s in advice.suggestions + advice.uncertain]
    tried += [str(n) for n in advice.not_applicable]
    assert len(tried) == 1
    for device in (0, False, 5):
        with pytest.raises(OptionError, match="device must be a name"):
            perfcast.advise(table, device=device)


def _perfcast_classes(hint: object) -> list[type]:
    import inspect
    import typing

    return [
        t
        for t in (typing.get_args(hint) or (hint,))
        if inspect.isclass(t) and t.__module__.startswith("perfcast")
    ]


def test_public_api_type_hints_resolve() -> None:
    """typing.get_type_hints (pydantic, typeguard, IDEs, docs) resolves every public function's
    annotations and those of the result types they return, recursively: names imported only for
    the type checker raise NameError there."""
    import subprocess
    import sys
    import typing

    seen: set[type] = set()
    todo: list[type] = []
    for name in perfcast.__all__:
        obj = getattr(perfcast, name)
        if callable(obj) and not isinstance(obj, type):
            for hint in typing.get_type_hints(obj).values():
                todo += _perfcast_classes(hint)
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for hint in typing.get_type_hints(cls).values():
            todo += _perfcast_classes(hint)
        # Their public methods too (to_pandas' frame types were imported for the checker
        # only, and get_type_hints raised NameError on them).
        for attr in dir(cls):
            method = getattr(cls, attr, None)
            if not attr.startswith("_") and inspect.isfunction(method):
                typing.get_type_hints(method)
    assert len(seen) > 20  # the results and what they hold were walked
    # the command line's `import perfcast` does not import the API's result types
    probe = "import sys, perfcast; print('perfcast.advisor.advisor' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert "advise" in dir(perfcast) and perfcast.api.advise is perfcast.advise


def test_empty_selections_and_paths_are_refused() -> None:
    """`analyze(only="")` ran every analysis, `load("")` named no path, and
    `diff(correct=True, real=False)` silently took real=False."""
    example = Path(__file__).parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"
    with pytest.raises(perfcast.OptionError, match="names no analysis"):
        perfcast.analyze(example, only="")
    with pytest.raises(perfcast.OptionError, match="names no analysis"):
        perfcast.analyze(example, only=[" "])
    with pytest.raises(perfcast.OptionError, match="trace path is empty"):
        perfcast.load("")
    with pytest.raises(perfcast.OptionError, match="not both"):
        perfcast.diff(example, example, correct=True, real=False)
    assert perfcast.diff(example, example, real=False).step.real_speedup is None


def test_plan_and_whatif_carry_their_functions_signatures() -> None:
    """perfcast.plan / perfcast.whatif are callable packages: help() and a notebook's `?`
    showed (*args, **kwargs), and `from perfcast import *` left them out."""
    import inspect

    from perfcast.api import predict
    from perfcast.plan import plan_trace

    assert inspect.signature(perfcast.plan) == inspect.signature(plan_trace)
    assert inspect.signature(perfcast.whatif) == inspect.signature(predict)
    assert {"plan", "whatif"} <= set(perfcast.__all__)
    namespace: dict[str, object] = {}
    exec("from perfcast import *", namespace)
    assert namespace["plan"] is perfcast.plan and callable(namespace["whatif"])


def test_graph_primitives_refuse_ids_and_values_outside_the_graph() -> None:
    """-1 removed the last node and scaled it, large ids and empty groups raised NumPy's
    IndexError / ValueError, a NaN position and a rank given as "0" passed in silence."""
    from perfcast.graph.model import NodeKind
    from perfcast.whatif import primitives as P

    example = Path(__file__).parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"
    g = perfcast.dependency_graph(perfcast.load(example))
    n = len(g)
    sel = P.select(g, kind="gpu")[:3]
    bad_calls = {
        "not in the graph": [
            lambda: P.remove(g, [-1]),
            lambda: P.scale(g, [n], 0.5),
            lambda: P.reschedule(g, [10**9], [1.0]),
            lambda: P.insert(g, lane=0, after=10**9, dur=10, kind=NodeKind.CPU, name="x"),
            lambda: P.insert(g, lane=10**6, dur=10, kind=NodeKind.CPU, name="x"),
            lambda: P.add_lane(g, 999, True, 0, 99, "x"),
        ],
        "at least one node": [lambda: P.fuse(g, [], 100, "x")],
        "finite": [
            lambda: P.fuse(g, sel, float("nan"), "x"),
            lambda: P.reschedule(g, sel, [float("nan")] * 3),
        ],
        "one lane": [lambda: P.fuse(g, [int(P.select(g, kind="cpu")[0]), int(sel[0])], 1, "x")],
        "NodeKind": [lambda: P.insert(g, lane=0, dur=10, kind="gpu", name="x")],  # type: ignore[arg-type]
        "count must be": [
            lambda: P.insert(g, lane=0, dur=10, kind=NodeKind.CPU, name="x", count=0)
        ],
        "must be an integer": [lambda: P.select(g, rank="0")],  # type: ignore[arg-type]
        "kind must be": [lambda: P.select(g, kind=5)],  # type: ignore[arg-type]
        "a number": [lambda: P.scale(g, sel, None)],  # type: ignore[arg-type]
    }
    before = (g.alive.copy(), g.cols["dur"].copy(), len(g.lanes))
    for message, calls in bad_calls.items():
        for call in calls:
            with pytest.raises(perfcast.OptionError, match=message):
                call()
    assert (g.alive == before[0]).all() and (g.cols["dur"] == before[1]).all()
    assert len(g.lanes) == before[2]
    # What is right still works.
    first = P.fuse(g, sel[:2][g.cols["lane"][sel[:2]] == g.cols["lane"][sel[0]]], 1000, "fused")
    assert g.cols["dur"][first] == 1000


def test_plan_and_tables_refuse_with_the_documented_errors(shared_traces: Path) -> None:
    """plan's keep_profiler_cost took "no" as yes; a CPU-only trace's refusal, a table name
    given as a list and an unknown replay engine were a bare PerfcastError, a TypeError and
    the fast engine in silence."""
    from perfcast.sim import simulate

    example = Path(__file__).parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"
    table = perfcast.load(example)
    with pytest.raises(perfcast.OptionError, match="keep_profiler_cost must be True or False"):
        perfcast.plan(table, gpus=8, keep_profiler_cost="no")  # type: ignore[arg-type]
    cpu = perfcast.load(shared_traces / "hta_cpu_only_gloo_rank34.json.gz")
    with pytest.raises(perfcast.NotApplicableError, match="no GPU work"):
        perfcast.plan(cpu, gpus=8)
    with pytest.raises(perfcast.OptionError, match="has no table"):
        perfcast.summary(table).to_pandas(["steps"])  # type: ignore[arg-type]
    with pytest.raises(perfcast.OptionError, match="engine must be"):
        simulate(perfcast.dependency_graph(table), engine="bogus")


def test_dataframe_hand_offs_declare_their_types() -> None:
    """to_pandas / to_polars / to_arrow were typed Any: a notebook's type checker and
    completion knew nothing of the frame they return (polars ships its types). The names
    resolve at runtime too (to Any), without the optional libraries imported."""
    import typing

    from perfcast.events import EventTable
    from perfcast.frames import Tables

    for owner in (EventTable, Tables):
        hints = {
            m: getattr(owner, m).__annotations__["return"]
            for m in ("to_pandas", "to_polars", "to_arrow")
        }
        assert hints == {
            "to_pandas": "PandasFrame",
            "to_polars": "PolarsFrame",
            "to_arrow": "ArrowTable",
        }, (owner, hints)
        for m in hints:
            assert typing.get_type_hints(getattr(owner, m))["return"] is typing.Any


def test_missing_optional_package_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hint names the package, installable as it is: 'perfcast[dataframe]' and
    'perfcast[report]' named a package index entry and an extra that do not exist."""
    import importlib

    from perfcast import frames
    from perfcast.errors import PerfcastError

    real = importlib.import_module

    def without_polars(name: str, package: str | None = None) -> object:
        if name.split(".")[0] == "polars":
            raise ImportError(name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", without_polars)
    with pytest.raises(PerfcastError) as err:
        frames._need("polars")
    assert err.value.hint is not None and err.value.hint.startswith("pip install polars ")
    assert "perfcast[" not in err.value.hint


def test_diff_names_each_traces_correction_source() -> None:
    """diff's step carried B's source alone (b_real_source) and A's only inside the combined
    'A: ..., B: ...' string: --json readers had to parse it."""
    example = Path(__file__).parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"
    step = perfcast.diff(example, example).step
    assert (step.a_real_source, step.b_real_source) == ("default", "default")
    assert step.real_source == "A: default, B: default"


def test_plan_takes_correct_as_the_other_api_functions_do() -> None:
    """perfcast.plan(t, gpus=8, correct=False) raised TypeError: plan spelled it
    keep_profiler_cost only, every other function correct=."""
    example = Path(__file__).parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"
    table = perfcast.load(example)
    kept = perfcast.plan(table, gpus=8, keep_profiler_cost=True, top=1)
    assert perfcast.plan(table, gpus=8, correct=False, top=1) == kept
    with pytest.raises(perfcast.OptionError, match="say opposite things"):
        perfcast.plan(table, gpus=8, correct=True, keep_profiler_cost=True)
    with pytest.raises(perfcast.OptionError, match="correct must be True or False"):
        perfcast.plan(table, gpus=8, correct="no")  # type: ignore[arg-type]
