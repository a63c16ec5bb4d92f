"""Review of the calling-context tree (`perfcast tree`): faults found and fixed."""

from __future__ import annotations

import io

from rich.console import Console

from perfcast.analysis.context_views import TreeRow
from perfcast.report.tree import Column, _ms, _render_rows


def _chain_with_siblings(depth: int) -> list[TreeRow]:
    """A path `depth` levels deep whose every node also has a leaf sibling, depth first as
    tree_rows orders them: n0 > n1 > ... with s<d> beside n<d>."""
    rows: list[TreeRow] = []

    def add(name: str, parent: int, d: int) -> int:
        rows.append(
            TreeRow(
                id=len(rows),
                parent=parent,
                depth=d,
                name=name,
                kind="frame",
                incl={"gpu_ns": 1e6},
                excl={"gpu_ns": 0.0},
            )
        )
        return len(rows) - 1

    def grow(parent: int, d: int) -> None:
        if d > depth:
            return
        me = add(f"n{d}", parent, d)
        grow(me, d + 1)
        add(f"s{d}", parent, d)

    grow(add("all", -1, 0), 1)
    return rows


def _name_columns(depth: int, width: int) -> tuple[list[TreeRow], list[str]]:
    rows = _chain_with_siblings(depth)
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, legacy_windows=False)
    cols = [Column("GPU ms", lambda r: r.incl["gpu_ns"], _ms)]
    _render_rows(rows, cols, console, lambda v: f"{v:g}", "below 1%")
    return rows, out.getvalue().splitlines()[1:]  # after the header


def test_deep_rows_start_right_of_their_parent() -> None:
    """Past half the line the guides dropped 8 levels at a time: the row where the cut
    began was drawn 19 columns left of its parent (`+8 │ ... └─ cuLaunchKernel` under
    `aten::addmm` on the H100 BERT trace at 200 columns, `nn.Module:
    MergedColumnParallelLinear ×36` left of its Qwen2MLP frame on the SGLang trace)."""
    for width in (100, 150, 200):
        rows, lines = _name_columns(45, width)
        assert len(lines) == len(rows)
        start = []
        for r, line in zip(rows, lines, strict=True):
            col = line.find(r.name)
            assert col > 0, (width, r.name, line)
            start.append(col)
        deepest = max(start)  # where the guide stops growing, so that names keep room
        for i, r in enumerate(rows):
            if r.parent >= 0:
                right = start[i] > start[r.parent] or start[i] == start[r.parent] == deepest
                assert right, (width, r.name, lines[i], lines[r.parent])
            if r.name.startswith("s"):  # a node's sibling starts where the node does
                twin = next(j for j, q in enumerate(rows) if q.name == "n" + r.name[1:])
                assert start[i] == start[twin], (width, lines[i], lines[twin])
        assert all(len(line) <= width for line in lines)


def test_deep_guides_stay_in_line() -> None:
    """Each level keeps one column on every row: a vertical guide continues straight down
    from the connector of the node it belongs to."""
    rows, lines = _name_columns(45, 150)
    for i, r in enumerate(rows):
        if not r.name.startswith("n") or r.name == "n45":
            continue
        col = lines[i].find(r.name) - 1
        while lines[i][col] == " " or lines[i][col] == "─":
            col -= 1
        assert lines[i][col] == "├"  # n<d> has its sibling s<d> below it
        twin = next(j for j, q in enumerate(rows) if q.name == "s" + r.name[1:])
        for j in range(i + 1, twin):
            assert lines[j][col] == "│", (lines[i], lines[j])
        assert lines[twin][col] == "└"


def _kernel(ts: float, corr: int) -> dict[str, object]:
    return {
        "ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": ts, "dur": 10.0,
        "args": {"correlation": corr, "stream": 7, "device": 0},
    }  # fmt: skip


def test_gpu_only_trace_is_not_launched_before_the_trace(write_trace) -> None:
    """A trace of GPU activity alone (activities=[CUDA]) records no launch at all: its
    kernels' launches are missing, not earlier than the trace (the advisor reads it so);
    the tree put all of them under 'launched before the trace began'."""
    from perfcast.analysis.context import EARLY_LAUNCH_LABEL, NO_LAUNCH_LABEL, context_tree
    from perfcast.ingest.loader import load

    path = write_trace({"traceEvents": [_kernel(0.0, 5), _kernel(20.0, 6)]})
    tree = context_tree(load(path))
    names = [tree.index.name(n) for n in range(len(tree.index))]
    assert NO_LAUNCH_LABEL in names and EARLY_LAUNCH_LABEL not in names
    assert tree.coverage.no_launch_ns == 20_000 and tree.coverage.early_ns == 0


def test_narrow_terminal_keeps_the_names(write_trace, monkeypatch, capsys) -> None:
    """On an 80-column terminal the seven columns of a GPU trace left 17 characters for
    the call path: from the sixth level on the rows showed no name at all. The last
    columns are now left out (and said) so that the path keeps 40."""
    from perfcast.cli.main import main

    depth = 12
    frames = [
        {"ph": "X", "cat": "python_function", "name": f"model.py({i}): f{i}", "pid": 1,
         "tid": 1, "ts": float(i), "dur": 1000.0 - 2 * i}
        for i in range(depth)
    ]  # fmt: skip
    op = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100.0,
          "dur": 50.0, "args": {"Input Dims": [[64, 64], [64, 64]],
                                "Input type": ["float", "float"]}}  # fmt: skip
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
              "tid": 1, "ts": 110.0, "dur": 5.0, "args": {"correlation": 9}}  # fmt: skip
    path = write_trace({"traceEvents": [*frames, op, launch, _kernel(120.0, 9)]})
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["tree", str(path), "--min-pct", "0"]) == 0
    out = capsys.readouterr().out
    assert "columns left out to fit 80 characters" in out
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.rstrip().endswith("call path"))
    rows = lines[head + 1 :]
    assert len(rows) == depth + 4  # root, the frames, op, launch, kernel
    assert all(len(line) <= 80 for line in lines)
    for line in rows:  # every row ends in a name (or its start), never in guides alone
        assert line.rstrip()[-1] not in " │├└─", line
    assert "cudaLaunch" in rows[-2]


def test_deep_rows_keep_their_names_beside_wide_columns() -> None:
    """With a GPU trace's seven columns at 100 characters, 30 levels of one-column guides
    filled the line: 20 of the SGLang trace's 122 rows showed no name (its 17.49 ms kernel
    among them). The guide stops growing where a name would keep fewer than NAME_ROOM."""
    from perfcast.report.tree import NAME_ROOM

    rows = _chain_with_siblings(45)
    out = io.StringIO()
    console = Console(file=out, width=100, color_system=None, legacy_windows=False)
    cols = [Column(f"c{i}", lambda r: r.incl["gpu_ns"], _ms) for i in range(7)]
    _render_rows(rows, cols, console, lambda v: f"{v:g}", "below 1%")
    lines = out.getvalue().splitlines()[1:]
    assert len(lines) == len(rows)
    start = [line.find(r.name) for r, line in zip(rows, lines, strict=True)]
    assert min(start) > 0, [ln for ln, c in zip(lines, start) if c <= 0][:3]
    for i, r in enumerate(rows):
        assert len(lines[i]) <= 100
        assert len(lines[i]) - start[i] >= min(len(r.name), NAME_ROOM - 1) or lines[i].endswith(
            r.name
        )
        if r.parent >= 0:
            assert start[i] >= start[r.parent], (lines[i], lines[r.parent])


def test_unknown_step_hint_lists_steps_in_trace_order(write_trace, capsys) -> None:
    """The hint sorted step names as text: ProfilerStep#10 before ProfilerStep#9."""
    from perfcast.cli.main import main

    events = []
    for i, n in enumerate((8, 9, 10, 11)):
        t0 = 1000.0 * i
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}",
                       "pid": 1, "tid": 1, "ts": t0, "dur": 900.0})  # fmt: skip
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1,
                       "ts": t0 + 10, "dur": 100.0})  # fmt: skip
    path = write_trace({"traceEvents": events})
    assert main(["tree", str(path), "--step", "99", "-q"]) == 2
    err = capsys.readouterr().err
    assert "ProfilerStep#8', 'ProfilerStep#9', 'ProfilerStep#10', 'ProfilerStep#11'" in err, err


def test_matmul_flops_with_a_vector_first() -> None:
    """[k] @ [..., k, n] counted 0 FLOPs (only matrix @ vector was read)."""
    from perfcast.analysis.context import op_flops

    assert op_flops("aten::matmul", "[[64], [64, 32]]") == 2.0 * 64 * 32
    assert op_flops("aten::matmul", "[[64], [3, 64, 32]]") == 2.0 * 3 * 64 * 32
    assert op_flops("aten::matmul", "[[64, 32], [32]]") == 2.0 * 64 * 32
    assert op_flops("aten::matmul", "[[63], [64, 32]]") == 0.0  # shapes that do not chain


def test_tree_and_roofline_count_matrix_products_with_one_formula() -> None:
    """The tree's FLOPs (context.op_flops) and the roofline's (roofline.op_cost) were two
    hand-written copies of the matrix-product formulas; they disagreed where one read a case
    the other did not (batched matmul, _addmm_activation, shapes that do not chain)."""
    from perfcast.analysis.context import op_flops
    from perfcast.analysis.roofline import op_cost

    cases = [
        ("aten::mm", [[64, 256], [256, 128]]),
        ("aten::addmm", [[128], [64, 256], [256, 128]]),
        ("aten::_addmm_activation", [[128], [64, 256], [256, 128]]),
        ("aten::bmm", [[8, 64, 32], [8, 32, 16]]),
        ("aten::baddbmm", [[8, 64, 16], [8, 64, 32], [8, 32, 16]]),
        ("aten::linear", [[4, 10, 256], [128, 256], [128]]),
        ("aten::matmul", [[4, 8, 64, 32], [4, 8, 32, 16]]),
        ("aten::matmul", [[64], [64, 32]]),
        ("aten::mm", [[64, 255], [256, 128]]),  # does not chain: no FLOPs, no cost
    ]
    for name, dims in cases:
        cost = op_cost(name, dims, 4)
        assert op_flops(name, str(dims)) == (cost[0] if cost else 0.0), (name, dims)
    assert op_cost("aten::mm", [[64, 255], [256, 128]], 4) is None
    assert op_flops("aten::matmul", "[[4, 8, 64, 32], [4, 8, 32, 16]]") == 2.0 * 32 * 64 * 32 * 16
