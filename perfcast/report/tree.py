"""Calling-context trees in the terminal: top-down with guides, and bottom-up hot spots.

Renderers only format: the rows to show were chosen by `analysis.context_views`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from perfcast.report import display_name, shorten

if TYPE_CHECKING:
    from perfcast.analysis.context import ContextTree, Coverage
    from perfcast.analysis.context_gain import CallSite, GainAttribution
    from perfcast.analysis.context_views import HotSpot, MoreSpots, TreeResult, TreeRow

_KIND_STYLE = {
    "frame": "",
    "module": "bold cyan",
    "annotation": "cyan",
    "op": "green",
    "runtime": "yellow",
    "kernel": "magenta",
    "copy": "magenta",
    "special": "red",
    "rank": "bold",
    "root": "bold",
}


@dataclass
class Column:
    header: str
    value: Callable[[TreeRow], float | None]
    fmt: Callable[[float | None], str]
    width: int = 9


def _ms(x: float | None) -> str:
    return "" if x is None else f"{x / 1e6:,.2f}"


def _count(x: float | None) -> str:
    return "" if not x else f"{int(x):,}"


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:.1f}%"


def _flop(x: float | None) -> str:
    if not x:
        return ""
    for scale, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.0f}"


def _render_rows(
    rows: Sequence[TreeRow],
    columns: Sequence[Column],
    console: Console,
    more_value: Callable[[float], str],
    more_what: str,
) -> None:
    """The rows with their columns on the left and tree guides before each name."""
    if not rows:
        return
    kids: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        if r.parent >= 0:
            kids.setdefault(r.parent, []).append(i)
    head = " ".join(f"{c.header:>{c.width}}" for c in columns)
    console.print(Text(f"{head}  call path", style="bold"), no_wrap=True, overflow="crop")
    width = max(console.width, 80)
    cells_w = sum(c.width for c in columns) + len(columns) - 1
    # Deep paths (30 levels of frames on an SGLang trace) would push names off the line:
    # the levels past half the room take one column each instead of three. Every level
    # keeps its own column on every row, so the guides stay in line and each name starts
    # right of its parent's (dropping levels from the left drew deep rows left of their
    # parents).
    full = max(4, (width - cells_w - 2) // 2 // 3)
    # Deeper still, the guide stops growing where a name would keep fewer than NAME_ROOM
    # characters: rows past that depth start where their parent does (never left of it),
    # and keep their names (at 100 columns, 30 levels of one column each left none).
    most = max(2, width - cells_w - 2 - NAME_ROOM)

    def guide(more: Sequence[bool], last: bool) -> str:
        """The guide before a name at depth len(more) + 1: `more[i]` when the ancestor at
        level i has siblings below it (its vertical line continues)."""
        d = len(more)
        out = [
            ("│  " if m else "   ") if i < full else ("│" if m else " ") for i, m in enumerate(more)
        ]
        tip = ("└─ " if last else "├─ ") if d < full else ("└ " if last else "├ ")
        text = "".join(out)
        if len(text) + len(tip) > most:
            tip = "└ " if last else "├ "
            text = text[: most - len(tip)]
        return text + tip

    def emit(i: int, more: tuple[bool, ...], last: bool, top: bool) -> None:
        r = rows[i]
        cells = " ".join(f"{c.fmt(c.value(r)):>{c.width}}" for c in columns)
        g = "" if top else guide(more, last)
        room = width - len(cells) - 2 - len(g)
        line = Text(f"{cells}  {g}")
        line.append(shorten(display_name(r.name), room), style=_KIND_STYLE.get(r.kind, ""))
        console.print(line, no_wrap=True, overflow="crop")
        below = () if top else (*more, not last)
        mine = kids.get(i, [])
        for k, ci in enumerate(mine):
            emit(ci, below, k == len(mine) - 1 and not r.hidden, False)
        if r.hidden:
            blank = " ".join(" " * c.width for c in columns)
            # Their time first, and an ellipsis where the line ends: cropped at 80 columns,
            # "… 5 more below 1% or deeper than " lost the time and ended mid-phrase.
            note = f"… {r.hidden:,} more ({more_value(r.hidden_value)}) {more_what}"
            text = Text(f"{blank}  {guide(below, True)}")
            text.append(shorten(note, width - len(text)), style="dim")
            console.print(text, no_wrap=True, overflow="crop")

    emit(0, (), True, True)


# Characters a name keeps at least beside its guide, however deep its row.
NAME_ROOM = 20
# Room the guides and names keep at least: on an 80-column terminal the seven columns of
# a GPU trace left 17 characters, and from the sixth level on the rows showed no name.
MIN_PATH_ROOM = 40
CORE_COLUMNS = 3  # the metric, its share and its own time are never left out


def _fit_columns(cols: list[Column], width: int) -> tuple[list[Column], list[str]]:
    """The columns that leave the call paths MIN_PATH_ROOM characters, the last ones
    (FLOP, kernels, launches, the other time) left out first, and the headers left out."""
    dropped: list[str] = []
    while len(cols) > CORE_COLUMNS and sum(c.width + 1 for c in cols) + 1 + MIN_PATH_ROOM > width:
        dropped.insert(0, cols.pop().header)
    return cols, dropped


def _tree_columns(result: TreeResult) -> list[Column]:
    gpu = result.metric == "gpu_ns"
    main, other = ("gpu_ns", "cpu_ns") if gpu else ("cpu_ns", "gpu_ns")
    label, other_label = ("GPU ms", "CPU ms") if gpu else ("CPU ms", "GPU ms")
    total = result.rows[0].incl[main] if result.rows else 0.0
    cols = [
        Column(label, lambda r: r.incl[main], _ms),
        Column("%", lambda r: 100.0 * r.incl[main] / total if total else None, _pct, 6),
        Column("self", lambda r: r.excl[main], _ms),
    ]
    if result.coverage.gpu_ns:
        cols.append(Column(other_label, lambda r: r.incl[other], _ms))
    if result.rows and result.rows[0].incl.get("launches"):
        cols.append(Column("launches", lambda r: r.incl["launches"], _count, 8))
    if result.coverage.gpu_ns:
        cols.append(Column("kernels", lambda r: r.incl["kernels"], _count, 7))
    if result.rows and result.rows[0].incl.get("flops"):
        cols.append(Column("FLOP", lambda r: r.incl["flops"], _flop, 7))
    return cols


def coverage_text(cov: Coverage, level: str) -> str:
    """The GPU time the tree covers and how much of it no Python frame explains (the HTML
    report's icicle says the same): without Python frames every path lacks one, and "100%
    not attributed" read as a failure to attribute rather than as frames never recorded."""
    text = (
        f"GPU time {cov.gpu_ns / 1e6:,.2f} ms (kernels, copies, memsets); root "
        f"{cov.root_gpu_ns / 1e6:,.2f} ms; "
    )
    if level == "python":
        return text + f"not attributed to a Python frame: {cov.unattributed_pct:.2f}%"
    return text + "no Python frames recorded"


def render_tree(result: TreeResult, console: Console) -> None:
    """`perfcast tree`: header, coverage, the top-down tree, and the bottom-up hot spots."""
    sel = result.selection
    parts = [f"rank {sel['rank']}" if "rank" in sel else "all ranks"]
    parts.append(str(sel.get("phase", "all phases")))
    parts.append(
        f"step {sel['step']}"
        if "step" in sel
        else f"the whole window ({result.steps} step(s) and any events outside them), summed"
    )
    if "focus" in sel:
        parts.append(f"focus {sel['focus']!r}")
    console.print(Text("calling context · " + " · ".join(parts), style="bold"))
    console.print(Text(f"context from {result.level_text}"))
    cov = result.coverage
    if cov.gpu_ns:
        console.print(Text(coverage_text(cov, result.level)))
    if (
        not cov.gpu_ns
        and result.metric == "gpu_ns"
        and result.rows
        and result.rows[0].incl.get("cpu_ns")
    ):
        console.print(
            Text(
                "note: no GPU work in the selection: its GPU times are zero (--metric cpu "
                "ranks by CPU time)",
                style="yellow",
            )
        )
    if "focus" in sel and result.rows and cov.root_gpu_ns and result.metric == "gpu_ns":
        # The rows below hold only the matches' time: the root's row is their total.
        shown = result.rows[0].incl["gpu_ns"]
        console.print(
            Text(
                f"paths through --focus {sel['focus']!r}: {shown / 1e6:,.2f} ms, "
                f"{100.0 * shown / cov.root_gpu_ns:.1f}% of the root's GPU time (the % column "
                "is of this)"
            )
        )
    for note in result.notes[1:]:  # the first one repeats the level
        console.print(Text(f"note: {note}", style="yellow"))
    if result.compiled is not None:
        for name, fused, ns in result.compiled.top[:3]:
            console.print(
                Text(
                    f"  compiled kernel {name} ({ns / 1e6:,.3f} ms) fuses: "
                    + (", ".join(fused) or "?"),
                    style="yellow",
                ),
                no_wrap=True,
                overflow="ellipsis",
            )
    if result.library_frames_hidden:
        console.print(
            Text(
                f"{result.library_frames_hidden:,} frames of PyTorch, the interpreter and perfcast "
                "hidden (--all-frames shows them)",
                style="dim",
            )
        )
    if result.instances_folded:
        console.print(
            Text(
                f"{result.instances_folded:,} module instances folded into one node per class "
                "and parent, 'Class ×N' (--instances shows each)",
                style="dim",
            )
        )
    width = max(console.width, 80)  # the rows are laid out for 80 at least (_render_rows)
    columns, dropped = _fit_columns(_tree_columns(result), width)
    if dropped:
        console.print(
            Text(
                f"columns left out to fit {width} characters: {', '.join(dropped)} "
                "(a wider terminal or --json shows them)",
                style="dim",
            )
        )
    _render_rows(
        result.rows,
        columns,
        console,
        _ms_text,
        f"below {result.min_pct:g}%"
        + (f" or deeper than {result.depth}" if result.depth is not None else ""),
    )
    if result.bottom_up is not None:
        render_hot_spots(result.bottom_up, result.metric, console, result.bottom_up_more)


def _ms_text(ns: float) -> str:
    return f"{ns / 1e6:,.2f} ms"


def render_hot_spots(
    spots: Sequence[HotSpot],
    metric: str,
    console: Console,
    more: Sequence[MoreSpots] = (),
) -> None:
    """Bottom-up: each hot kernel or op, then the call paths that reach it; after each
    list, the time of what --top left out, and after each spot, that of its other paths."""
    what = "GPU" if metric == "gpu_ns" else "CPU"
    console.print()
    console.print(Text(f"bottom-up: hot kernels and ops by {what} time", style="bold"))
    width = max(console.width, 80)
    left_out = {m.kind: m for m in more}
    for i, s in enumerate(spots):
        line = Text(f"{s.value / 1e6:10,.2f} ms  {s.kind:<6} {s.calls:>8,}×  ")
        line.append(
            shorten(display_name(s.name), width - len(line)), style=_KIND_STYLE.get(s.kind, "")
        )
        console.print(line, no_wrap=True, overflow="crop")
        for p in s.paths:
            text = Text(f"{p.value / 1e6:10,.2f} ms    ◂ ", style="dim")
            text.append(shorten(p.path, width - len(text)))
            console.print(text, no_wrap=True, overflow="crop")
        other = s.value - sum(p.value for p in s.paths)
        if other >= 500:  # half a microsecond: the paths' rounding is no path
            console.print(
                Text(f"{other / 1e6:10,.2f} ms    ◂ … other call paths", style="dim"),
                no_wrap=True,
                overflow="crop",
            )
        group = "kernel" if s.kind == "copy" else s.kind
        last = i == len(spots) - 1 or (spots[i + 1].kind == "op") != (group == "op")
        m = left_out.get(group)
        if last and m is not None:
            what_more = "kernels and copies" if group == "kernel" else "ops"
            console.print(
                Text(
                    f"{m.value / 1e6:10,.2f} ms  … {m.count:,} more {what_more} (--top)",
                    style="dim",
                ),
                no_wrap=True,
                overflow="crop",
            )


def _site_text(site: CallSite) -> str:
    where = " · ".join(x for x in (site.module, site.source, site.op) if x) or site.path
    return where


def render_call_sites(sites: Sequence[CallSite], console: Console, indent: str = "") -> None:
    for s in sites:
        console.print(
            Text(f"{indent}{100 * s.share:5.1f}%  {s.gain_ms:8.3f} ms  {_site_text(s)}"),
            no_wrap=True,
            overflow="ellipsis",
        )


def render_gain_tree(
    gain: GainAttribution, rows: Sequence[TreeRow], console: Console, min_pct: float
) -> None:
    """`perfcast whatif --tree`: where the predicted gain lands, per call path, per step."""
    steps = max(gain.steps, 1)
    console.print()
    console.print(
        Text(
            f"where the gain lands: {gain.step_saved_ms:,.3f} ms per step "
            f"(critical-path time saved, summed over the tree; per step)",
            style="bold",
        )
    )
    if gain.lead_not_kept_ms >= 0.0005:
        console.print(
            Text(
                f"of which {gain.lead_not_kept_ms:,.3f} ms per step is the host's starting lead "
                "over the GPU, finished sooner than the host issues the next step: a running "
                "job does not keep it, and the predicted step does not count it"
            )
        )

    def per_step(key: str) -> Callable[[TreeRow], float]:
        return lambda r: r.incl[key] / steps

    cols = [
        Column("step ms", per_step("path_saved_ns"), _signed_ms),
        Column("at changes", per_step("gain_ns"), _signed_ms, 10),
        Column("GPU work", per_step("gpu_saved_ns"), _signed_ms),
        Column("CPU work", per_step("cpu_saved_ns"), _signed_ms),
    ]
    _render_rows(
        rows,
        cols,
        console,
        lambda v: (_signed_ms(v / steps) or "±0.000") + " ms",
        f"below {min_pct:g}%",
    )
    console.print(
        Text(
            "step ms: critical-path time saved there (adds up to the step time saved; "
            "negative where hidden work now sets the step) · at changes: the same, at the "
            "work the what-if changed · GPU/CPU work: time the what-if removed there",
            style="dim",
        )
    )
    if gain.sites:
        console.print(Text(f"where it comes from ({gain.method}):", style="bold"))
        render_call_sites(gain.sites, console, indent="  ")


def _signed_ms(x: float | None) -> str:
    if x is None or abs(x) < 500:  # below 0.5 µs: nothing to show
        return ""
    return f"{x / 1e6:+,.3f}"


def render_context_tree(tree: ContextTree, console: Console) -> None:
    """A ContextTree in a notebook: `perfcast tree`'s default view of it."""
    from perfcast.analysis.context_views import tree_result

    render_tree(tree_result(tree), console)
