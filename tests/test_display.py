"""Results of the Python API draw themselves in notebooks (`_repr_html_`) and as text, the
way the matching command prints them."""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
from pathlib import Path

import pytest

import perfcast
from perfcast.display import Displayed

EXAMPLE = Path(__file__).parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"


@pytest.fixture(scope="module")
def table() -> perfcast.EventTable:
    return perfcast.load(EXAMPLE)


def _results(table: perfcast.EventTable) -> dict[str, Displayed]:
    return {
        "summary": perfcast.summary(table),
        "replay": perfcast.replay(table),
        "predict": perfcast.predict(table, "remove-host-sync"),
        "analyze": perfcast.analyze(table, only="idle"),
        "memory": perfcast.memory(table),
        "diff": perfcast.diff(EXAMPLE, EXAMPLE),
        "tree": perfcast.tree(table),
    }


def test_every_result_draws_as_html_and_text(table) -> None:
    headline = {
        "summary": "rank 0 · NVIDIA A100",
        "replay": "replay: traced vs simulated step time",
        "predict": "what-if: remove-host-sync",
        "analyze": "idle: GPU idle time per stream",
        "memory": "Memory · copies",
        "diff": "step time (mean of the steps, as traced): A 222.409 ms → B 222.409 ms",
        "tree": "calling context · all ranks",
    }
    for name, result in _results(table).items():
        text = result.text()
        html = result._repr_html_()
        assert headline[name] in text, name
        assert html.startswith("<pre") and html.rstrip().endswith("</pre>"), name
        assert headline[name].split(" ")[0] in html, name
        # Kernel names hold '<' and '>': escaped, never markup.
        assert "<float>" not in html, name


def test_advice_and_plan_draw_as_their_commands_print_them(table) -> None:
    from perfcast.plan import plan_trace

    advice = perfcast.advise(table)
    assert "without the profiler" in advice.text().splitlines()[0]
    result = plan_trace(table, gpus=8)
    assert "plans evaluated" in result.text()


def test_text_follows_the_width_asked_for(table) -> None:
    result = perfcast.summary(table)
    assert max(len(line) for line in result.text(width=80).splitlines()) <= 80
    assert max(len(line) for line in result.text(width=140).splitlines()) > 80
    assert not any(line.endswith(" ") for line in result.text(width=100).splitlines())


def test_importing_perfcast_loads_no_renderer() -> None:
    code = "import sys, perfcast; print('rich' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_repr_says_what_a_result_holds_not_all_of_it(table) -> None:
    for name, result in _results(table).items():
        text = repr(result)
        assert len(text) < 600 and "\n" not in text, name
        assert text.startswith(type(result).__name__ + "("), name


def test_counts_per_step_print_whole_when_whole() -> None:
    from perfcast.report.analyses_terminal import _cell

    # A mean count over steps is whole when every step had the same count: no "53.00".
    assert _cell(53.0, column="a_count") == "53"
    assert _cell(12_345.0, column="count") == "12,345"
    assert _cell(2.5, column="b_count") == "2.5"
    assert _cell(53.0, column="a_ms") == "53.00"  # times keep their decimals
    assert _cell(1240, column="launches") == "1,240"  # as 26,770 beside it
    assert _cell(131072, column="tid") == "131072"  # identifiers as the trace writes them
    assert _cell(8e-06, column="total_ms") == "<0.001"  # not "8e-06" beside "1.32"


def test_top_kernels_are_one_line_each_without_void(table) -> None:
    """A kernel's `void` return type is dropped and a long name is cut to the width the
    figures leave, so each top kernel is one line in an 80-column terminal."""
    summary = perfcast.summary(table, correct=False)
    names = [k.name for k in summary.ranks[0].top_kernels[:5]]
    assert any(n.startswith("void ") for n in names)  # the example's kernels do have it
    text = summary.text(width=80)
    block = text.split("top kernels", 1)[1].split("top CPU ops", 1)[0].splitlines()
    rows = [line for line in block[2:] if line.strip()]
    assert len(rows) >= 5
    assert all(len(line.rstrip()) <= 80 and "void" not in line for line in rows)
    assert all(line.split()[0].replace(".", "").replace(",", "").isdigit() for line in rows)


def test_advice_to_pandas_and_a_suggestion_repr(table) -> None:
    advice = perfcast.advise(table)
    df = advice.to_pandas()
    assert len(df) == len(advice.suggestions) + len(advice.uncertain) > 0
    assert {"name", "status", "predicted_ms", "speedup", "speedup_low", "why"} <= set(df.columns)
    first = (advice.suggestions + advice.uncertain)[0]
    assert df.iloc[0]["name"] == first.name
    text = repr(first)
    assert text.startswith(f"Suggestion({first.name!r}") and len(text) < 160


def test_summary_and_replay_flatten_their_steps_into_tables(table) -> None:
    s = perfcast.summary(table)
    assert s.table_names() == ["steps", "top_kernels", "top_ops", "top_scopes"]
    steps = s.to_pandas()
    assert len(steps) == sum(len(r.iterations) for r in s.ranks)
    assert {"rank", "step", "traced_ms", "real_ms", "gpu_compute_ms", "kernels"} <= set(steps)
    assert steps["traced_ms"].tolist() == [it.traced_ms for it in s.ranks[0].iterations]
    r = perfcast.replay(table)
    assert r.table_names() == ["steps", "critical_path"]
    assert set(r.to_pandas()["error_pct"].abs()) and r.to_pandas("critical_path")["ms"].ge(0).all()


def test_graph_and_table_reprs_are_one_short_line(table, tmp_path) -> None:
    g = perfcast.dependency_graph(table)
    text = repr(g)
    assert text.startswith("Graph(") and len(text) < 200 and f"{len(g):,} nodes" in text
    assert "truncated" not in repr(table)
    cut = tmp_path / "cut.json"
    raw = gzip.decompress(EXAMPLE.read_bytes())
    cut.write_bytes(raw[: len(raw) * 6 // 10])
    assert "salvaged from 1 truncated file(s)" in repr(perfcast.load(cut))


def test_empty_tables_keep_their_columns(tmp_path) -> None:
    """A CPU-only trace has no kernels: its top_kernels table is empty but still has its
    columns, so a notebook's `df["total_ms"]` works on it (it had no columns at all)."""
    from tests.tracegen import TraceBuilder

    b = TraceBuilder(device=None)
    for n in range(3):
        b.step(n, n * 1000.0, 900.0)
        b.op("aten::mm", n * 1000.0 + 10, 500.0)
    s = perfcast.summary(b.write(tmp_path / "cpu.json"), correct=False)
    kernels = s.to_pandas("top_kernels")
    assert len(kernels) == 0 and list(kernels.columns) == [
        "rank",
        "name",
        "count",
        "total_ms",
        "pct",
    ]
    assert len(s.to_pandas("top_ops")) > 0 and len(s.to_pandas()) == 3
    r = perfcast.replay(tmp_path / "cpu.json")
    assert list(r.to_pandas("critical_path").columns) == [
        "rank",
        "step",
        "bottleneck",
        "category",
        "ms",
    ]


def test_the_many_ranks_overview_splits_the_step_in_80_columns(shared_traces: Path) -> None:
    """With more than a few ranks, summary opens with one row per rank: its GPU columns add
    up to the step (the copies column was missing), and it fits 80 columns."""
    from io import StringIO

    from rich.console import Console

    from perfcast.report.terminal import render_summary

    s = perfcast.summary(shared_traces / "dlrm_v100_8rank")
    buf = StringIO()
    render_summary(s, Console(file=buf, width=80, color_system=None))
    text = buf.getvalue()
    assert "copies" in text.split("stragglers")[0]
    assert max(len(line) for line in text.splitlines()) <= 80
    rank0 = next(line for line in text.splitlines() if re.match(r"^│ +0 │", line))
    figures = [float(x) for x in rank0.strip("│ ").split("│")[1:] if x.strip()]
    # steps, step ms, w/o profiler, then the GPU columns that split the (traced) step
    step, _, compute, comm, copies, idle = figures[1:7]
    assert compute + comm + copies + idle == pytest.approx(step, abs=0.03)


def test_print_shows_the_text_the_repr_stays_one_line(table) -> None:
    """print(result) printed `Advice(baseline_ms=212.84091166666667, ...)`: now the command's
    text; the repr (a list of results, a debugger, IPython) stays one line."""
    result = perfcast.summary(table)
    assert str(result).startswith(result.text(100).splitlines()[0][:20])
    assert "\n" not in repr(result) and repr(result).startswith("Summary(")
    assert "\n" not in repr([result, result])


def test_every_result_with_rows_gives_dataframes(table) -> None:
    """predict, advise, plan and tree had no to_pandas / to_polars / to_arrow (advise only
    to_pandas), where every analysis had them."""
    pytest.importorskip("pandas")
    pytest.importorskip("polars")
    pytest.importorskip("pyarrow")
    from perfcast.plan import plan_trace

    w = perfcast.predict(table, "remove-host-sync")
    assert w.table_names() == ["iterations", "applied"]
    w.iterations = []  # an empty table is still named, not the next one
    assert w.to_pandas("iterations").empty and list(w.to_pandas().columns)[:2] == ["rank", "name"]
    w = perfcast.predict(table, "remove-host-sync")
    assert len(w.to_pandas()) == len(w.iterations)
    assert w.to_polars("applied")["name"].to_list() == ["remove-host-sync"]

    a = perfcast.advise(table)
    assert a.table_names() == ["suggestions", "not_applicable"]
    df = a.to_pandas()
    assert list(df["name"]) == [s.name for s in a.suggestions + a.uncertain]
    assert a.to_polars().height == len(df) and a.to_arrow().num_rows == len(df)
    assert a.to_pandas("not_applicable")["reason"].str.len().min() > 0
    with pytest.raises(perfcast.OptionError, match="Advice has no table 'x'"):
        a.to_pandas("x")

    nothing = plan_trace(table, 4, top=3, memory_gb=0.001).to_pandas()
    assert nothing.empty and {"dp", "tp", "pp", "mb", "zero"} <= set(nothing.columns)
    p = plan_trace(table, 4, top=3)
    best = p.to_pandas()
    assert list(best["label"]) == [r.label for r in p.best]
    assert list(best["dp"] * best["tp"] * best["pp"]) == [4, 4, 4]
    assert p.to_pandas("baseline")["label"].tolist() == [p.baseline.label]

    t = perfcast.tree(table)
    nodes = t.to_pandas()
    assert len(nodes) == len(t) and nodes["depth"][0] == 0 and nodes["parent"][0] == -1
    assert (nodes["depth"][1:] == nodes["depth"][nodes["parent"][1:]].to_numpy() + 1).all()
    assert nodes["incl_gpu_ns"][0] == t.incl["gpu_ns"][0]


def test_whatif_and_plan_are_callable_by_their_command_names(table) -> None:
    """`perfcast.whatif(...)` raised AttributeError in a fresh session and "'module' object
    is not callable" after any predict() (the subpackage took the name); `perfcast.plan`
    needed `import perfcast.plan` first."""
    code = (
        "import perfcast, sys\n"
        f"t = perfcast.load({str(EXAMPLE)!r})\n"
        "a = perfcast.whatif(t, 'remove-host-sync').speedup\n"
        "b = perfcast.predict(t, 'remove-host-sync').speedup\n"
        "c = perfcast.whatif(t, ['remove-host-sync']).speedup\n"
        "p = perfcast.plan(t, gpus=2, top=1).best[0].label\n"
        "print(a == b == c, p.startswith('dp'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]
    # Pickled by name, as modules are (cloudpickle ships functions that use them to workers).
    import pickle

    import perfcast.plan

    assert pickle.loads(pickle.dumps(perfcast.plan)) is perfcast.plan
    assert pickle.loads(pickle.dumps(perfcast.whatif)) is perfcast.whatif
