"""Rich tables for the terminal. Renderers only format: they never compute."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from perfcast.report import display_name, shorten

if TYPE_CHECKING:  # types only: importing the simulator here would load numba for `summary`
    from perfcast.advisor.advisor import Advice, Suggestion
    from perfcast.analysis.replay import ReplayResult
    from perfcast.analysis.summary import NamedTime, Summary
    from perfcast.calibration import Calibration
    from perfcast.real import Correction
    from perfcast.whatif.runner import WhatIfResult


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.2f}"


def _fig(x: float | None) -> str:
    """A figure for the summary's tables: fewer decimals as it grows, so that a long window
    (a whole inference trace of 24,000 ms) still fits 80 columns."""
    if x is None:
        return "-"
    return f"{x:,.{2 if abs(x) < 100 else 1 if abs(x) < 10_000 else 0}f}"


def _short(name: str, width: int = 70) -> str:
    return shorten(display_name(name), width)


# Beyond this many ranks, one overview row per rank, then details of the extremes only.
MANY_RANKS = 4
# Step tables longer than this show their first and last steps: a trace of thousands of
# steps took a minute to print, and --json has every one.
MANY_STEPS = 40
_ENDS = 15  # steps shown at each end of a long table


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


# Under every table whose GPU columns split a step.
# The split is by time: GPU work of the next step that starts before this one ends counts
# here (a trace's last step has none after it, so its copies and comm can read lower).
_GPU_SPLIT = (
    "GPU columns split the step by time: compute + comm + copies + idle = step (GPU work of the "
    "next step that starts before this one ends counts here)"
)
# The per-rank table's overlap column: "-" where a step has no communication (not 0%: there
# was nothing to hide).
_OVERLAP = (
    "overlap: the share of the step's communication that compute hid (- : the step has no "
    "communication, nothing to overlap)"
)


def _step_label(name: str) -> Text:
    return Text(name.replace("ProfilerStep", "step "))


def _render_rank_overview(summary: Summary, console: Console) -> None:
    t = Table(title="ranks (means over steps)", title_justify="left")
    # As the one-rank table: the step without the profiler beside the traced one.
    real = any(it.real_ms is not None for rs in summary.ranks for it in rs.iterations)
    # Two-line headers keep the table within 80 columns with a copies column.
    for col in (
        "rank",
        "steps",
        "step\nms",
        *(["w/o\nprofiler"] if real else []),
        "GPU\ncompute",
        "comm",
        "copies",
        "idle",
        "data\nload",
    ):
        t.add_column(col, justify="right")
    means = {rs.rank: _mean([it.measured_ms for it in rs.iterations]) for rs in summary.ranks}
    for rs in summary.ranks:
        its = rs.iterations
        gpu = [it.gpu for it in its if it.gpu is not None]
        reals = [it.real_ms for it in its if it.real_ms is not None]
        t.add_row(
            Text(f"{rs.rank}" + ("*" if rs.rank in summary.stragglers else "")),
            str(len(its)),
            _ms(means[rs.rank]),
            *([_ms(_mean(reals)) if reals else "-"] if real else []),
            _ms(_mean([g.compute_ms for g in gpu])) if gpu else "-",
            _ms(_mean([g.communication_exposed_ms for g in gpu])) if gpu else "-",
            _ms(_mean([g.memcpy_exposed_ms for g in gpu])) if gpu else "-",
            _ms(_mean([g.idle_ms for g in gpu])) if gpu else "-",
            _ms(_mean([it.cpu.dataloader_ms for it in its])),
        )
    console.print(t)
    console.print(
        Text(
            f"{_GPU_SPLIT}; data load is the host's time in the DataLoader",
            style="dim",
        )
    )
    _render_stragglers(summary, console)


def _render_stragglers(summary: Summary, console: Console, marked: bool = True) -> None:
    """`marked`: the rank overview above marks them with *."""
    if summary.stragglers:
        console.print(
            Text(
                f"stragglers ({'* above: ' if marked else ''}the ranks that arrive latest at "
                "collectives on average, as HTA ranks them, and made others wait; the waiting "
                "each caused: perfcast analyze --only stragglers): "
                + ", ".join(str(r) for r in summary.stragglers)
            )
        )


# Notes of ranks not shown in detail, at most (the rest: --json).
_MANY_NOTES = 20


def render_summary(summary: Summary, console: Console, top: int = 5) -> None:
    for note in summary.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    ranks = summary.ranks
    if len(ranks) > MANY_RANKS:
        _render_rank_overview(summary, console)
        by_time = sorted(ranks, key=lambda rs: _mean([it.measured_ms for it in rs.iterations]))
        ranks = [by_time[-1], by_time[0]]  # slowest and fastest in detail; --json has all
        # The other ranks' notes (a cut file, a rank without steps) would go unsaid.
        others = [(rs.rank, n) for rs in summary.ranks if rs not in ranks for n in rs.notes]
        for rank, note in others[:_MANY_NOTES]:
            console.print(Text(f"note: rank {rank}: {note}", style="yellow"))
        if len(others) > _MANY_NOTES:
            console.print(
                Text(
                    f"note: {len(others) - _MANY_NOTES:,} more notes of other ranks (--json)",
                    style="yellow",
                )
            )
        console.print(Text("details of the slowest and the fastest rank:", style="bold"))
    else:
        _render_stragglers(summary, console, marked=False)
    correction = summary.correction
    several = len(summary.ranks) > 1
    if (
        several
        and correction is not None
        and any(it.real_ms is not None for rs in summary.ranks for it in rs.iterations)
    ):
        # One correction for the job: its host time removed per step is the mean over ranks.
        console.print(
            Text(
                f"every rank (host time removed: the mean per step over the "
                f"{len(summary.ranks)} ranks): {correction.assumption()}"
            )
        )
    for rs in ranks:
        late = " (straggler)" if rs.rank in summary.stragglers else ""
        title = f"rank {rs.rank}{late}" + (f" · {rs.device}" if rs.device else "") + f" · {rs.path}"
        real = any(it.real_ms is not None for it in rs.iterations)
        # Two-line headers keep the figures' columns narrow enough for 80 columns.
        cols = ["step", "ms", "GPU\ncompute", "comm", "copies", "idle", "overlap"]
        if real:
            cols.insert(2, "w/o\nprofiler")
        cpu_cols = [
            "step",
            "data\nloading",
            "forward",
            "backward",
            "optimizer",
            "comm",
            "kernels\n#",
        ]
        rows: list[list[str | Text]] = []
        cpu_rows: list[list[str | Text]] = []
        for it in rs.iterations:
            g = it.gpu
            c = it.cpu
            label = _step_label(it.name)
            row: list[str | Text] = [
                label,
                _fig(it.measured_ms),
                _fig(g.compute_ms) if g else "-",
                _fig(g.communication_exposed_ms) if g else "-",
                _fig(g.memcpy_exposed_ms) if g else "-",
                _fig(g.idle_ms) if g else "-",
                (
                    f"{g.communication_overlap_pct:.0f}%"
                    if g and g.communication_overlap_pct is not None
                    else "-"
                ),
            ]
            if real:
                row.insert(2, _fig(it.real_ms))
            rows.append(row)
            cpu_rows.append(
                [
                    label,
                    _fig(c.dataloader_ms),
                    _fig(c.forward_ms),
                    _fig(c.backward_ms),
                    _fig(c.optimizer_ms),
                    _fig(c.communication_ms),
                    str(it.kernels),
                ]
            )
        # Titles and captions are lines of their own: inside a table they wrap to its width.
        console.print(Text(title, style="bold"))
        console.print(_figures_table(cols, rows))
        # A CPU-only rank's "-" says no GPU work, not no communication (gloo's is on the host).
        on_gpu = any(it.gpu for it in rs.iterations)
        console.print(Text(f"{_GPU_SPLIT}; {_OVERLAP}" if on_gpu else _GPU_SPLIT, style="dim"))
        _render_measured(console, [it.measured_real_ms for it in rs.iterations])
        if real and correction is not None and not several:
            console.print(Text(correction.assumption()))
        console.print(
            Text(
                "CPU time by phase (ms as traced, the profiler's own cost included; summed "
                "over the host threads: can exceed the step; kernels: how many the step "
                "launched)",
                style="bold",
            )
        )
        console.print(_figures_table(cpu_cols, cpu_rows))
        for note in rs.notes:
            console.print(Text(f"  note: {note}", style="yellow"))
        # Launched inside the steps: `analyze` and `tree` count the whole trace, which on a
        # trace with work before its first step gives other totals.
        within = "launched in the steps" if rs.has_steps else "the whole trace"
        # Each list's % has its own whole (the scopes' is all GPU time): the titles say which.
        _render_top(
            console, f"top kernels ({within}; %: of their kernel time)", rs.top_kernels[:top]
        )
        _render_top(
            console,
            "top CPU ops (outermost calls only; %: of their CPU time)",
            rs.top_ops[:top],
        )
        _render_top(
            console,
            "GPU time by innermost module / scope, its own kernels only (% of the GPU time "
            f"{within}; `perfcast tree` adds up the modules inside)",
            rs.top_scopes[:top],
            count_head="GPU ops",
        )
        if rs.gpu_ms_by_phase:
            parts = ", ".join(f"{k} {v:,.2f}" for k, v in rs.gpu_ms_by_phase.items())
            console.print(Text(f"GPU ms by phase (all steps): {parts}"))
        console.print()


def _figures_table(cols: list[str], rows: list[list[str | Text]]) -> Table:
    """A table of a label column and figures: a figure is never cut or wrapped (a narrow
    terminal, or output piped at 80 columns, wraps the labels and headers instead)."""
    table = Table(
        show_lines=False,
        box=box.SIMPLE_HEAD,
        collapse_padding=True,
        pad_edge=False,
    )
    for i, col in enumerate(cols):
        width = max([len(str(r[i])) for r in rows] + [len(w) for w in col.split("\n")])
        justify: Literal["left", "right"] = "left" if i == 0 else "right"
        table.add_column(col, justify=justify, no_wrap=True, min_width=width)
    for r in _elided(rows, len(cols)):
        table.add_row(*r)
    return table


def _elided(
    rows: list[list[str | Text]], width: int, also: Iterable[int] = (), label: int = 0
) -> list[list[str | Text]]:
    """`rows`, or for a table of more than MANY_STEPS rows its first and last _ENDS and the
    rows at `also` (say, steps the replay missed); each run of rows left out is one row that
    says how many."""
    if len(rows) <= MANY_STEPS:
        return rows
    keep = sorted({*range(_ENDS), *range(len(rows) - _ENDS, len(rows)), *also})
    out: list[list[str | Text]] = []
    prev = -1
    for i in keep:
        if i > prev + 1:
            gap = i - prev - 1
            note = Text(f"… {gap:,} more", style="dim")
            blank: list[str | Text] = [""] * width
            blank[label] = note
            out.append(blank)
        out.append(rows[i])
        prev = i
    return out


def _render_top(
    console: Console, title: str, rows: list[NamedTime], count_head: str = "count"
) -> None:
    if not rows:
        return
    t = Table(title=title, title_justify="left", show_header=True, box=None, pad_edge=False)
    cells = [(_ms(r.total_ms), f"{r.pct:.1f}", str(r.count)) for r in rows]
    heads = ("total ms", "%", count_head)
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    for head, width in zip(heads, widths, strict=True):
        t.add_column(head, justify="right", no_wrap=True, min_width=width)
    # One line per row: a long name is cut ("…") to what the figures leave, not wrapped.
    room = max(20, min(70, console.width - sum(widths) - 2 * len(widths)))
    t.add_column("name", no_wrap=True)
    for c, r in zip(cells, rows, strict=True):
        t.add_row(*c, Text(_short(r.name, room)))
    console.print(t)


def _render_measured(console: Console, values: list[float | None]) -> None:
    """The unprofiled steps' time a trace carries (one median per rank), as one line."""
    measured = sorted({v for v in values if v})
    if not measured:
        return
    lo, hi = measured[0], measured[-1]
    figures = f"{lo:,.2f}" if lo == hi else f"{lo:,.2f} to {hi:,.2f}"
    console.print(
        Text(
            f"measured without the profiler: {figures} ms per step (the median of the steps "
            "timed beside the trace, when the profiler was off)"
        )
    )


def _render_notes(console: Console, notes: list[str]) -> None:
    for note in notes:
        console.print(Text(f"note: {note}", style="yellow"))


def render_replay(result: ReplayResult, console: Console) -> None:
    _render_notes(console, result.notes)
    t = Table(title="replay: traced vs simulated step time", title_justify="left")
    # --keep-profiler-cost: no step has an estimate without the profiler, and no column
    # says otherwise (summary and the report show none either).
    kept = result.correction is not None and result.correction.source == "off"
    cols = ["rank", "step", "traced ms", "simulated ms", "error"]
    if not kept:
        cols.append("without\nprofiler ms")
    for col in cols:
        t.add_column(col, justify="left" if col == "step" else "right")
    rows: list[list[str | Text]] = []
    missed: list[int] = []  # steps the replay missed, shown however long the table is
    for rr in result.ranks:
        for it in rr.iterations:
            style = "red" if abs(it.error_pct) > 1.0 else None
            if style:
                missed.append(len(rows))
            row: list[str | Text] = [
                str(rr.rank),
                _step_label(it.name),
                _ms(it.measured_ms),
                _ms(it.simulated_ms),
                Text(f"{it.error_pct:+.2f}%", style=style or ""),
            ]
            if not kept:
                row.append(_ms(it.real_ms))
            rows.append(row)
    for row in _elided(rows, len(cols), missed[:10], label=1):
        t.add_row(*row)
    console.print(t)
    # One figure per trace (the median of the unprofiled steps timed beside it), said once:
    # as a column it repeated on every step and read as that step's own measurement.
    _render_measured(console, [it.measured_real_ms for rr in result.ranks for it in rr.iterations])
    if result.correction is not None:
        console.print(Text(result.correction.assumption()))
    console.print(
        f"{result.nodes:,} nodes; worst error {result.max_abs_error_pct:.2f}%; "
        f"{result.unresolved_dependencies:,} dependencies resolved by heuristic",
        highlight=False,
    )
    for kind, n in result.unresolved_by_kind.items():
        if n:
            console.print(f"  {kind.replace('_', ' ')}: {n:,}", highlight=False)
    for cp in result.critical_paths[:4]:
        parts = ", ".join(f"{k} {v:,.2f}" for k, v in cp.by_category_ms.items() if v > 0.0005)
        console.print(
            Text(
                f"critical path of rank {cp.rank} {cp.iteration} ({cp.total_ms:,.2f} ms, "
                f"{cp.bottleneck}): {parts}"
            )
        )
        for cat, name, ms in cp.top_items[:3]:
            console.print(Text(f"    {ms:9,.2f} ms  {cat:18s} {_short(name, 60)}"))


# Every step time of a multi-rank prediction is the step's slowest rank (replay shows each).
_SLOWEST_RANK = "{n} ranks: each step counted at its slowest rank, as the job runs"


def render_whatif(result: WhatIfResult, console: Console) -> None:
    from perfcast.whatif.runner import LEAD_ASSUMPTION, MEAN_HEADLINE

    _render_notes(console, result.notes)
    applied = " + ".join(a.name for a in result.applied)
    console.print(Text(f"what-if: {applied}", style="bold"))
    n_ranks = len({it.rank for it in result.iterations})
    if n_ranks > 1:
        console.print(Text(f"  {_SLOWEST_RANK.format(n=n_ranks)}"))
    console.print(
        f"  traced step                 {result.traced_ms:10,.2f} ms\n"
        + _real_line(result.baseline_ms, result.measured_real_ms, result.correction)
        + f"  predicted step              {result.predicted_ms:10,.2f} ms   speedup "
        f"{result.speedup:.2f}×\n"
        f"  predicted, profiled         {result.predicted_traced_ms:10,.2f} ms   speedup "
        f"{result.speedup_traced:.2f}×\n"
        + (
            f"  throughput per sample       {result.per_sample_speedup:10.2f}×\n"
            if result.per_sample_speedup is not None
            else ""
        )
        + f"  {100 * result.measured_share:.0f}% of the predicted critical path is time from the "
        "trace",
        highlight=False,
    )
    if result.headline and result.headline != MEAN_HEADLINE:
        # The per-step rows (--json) average to another number: say which is the headline.
        console.print(Text(f"  predicted step: {result.headline}"))
    if result.memory is not None:
        console.print(Text(_memory_line(result.memory, result.baseline_memory)))
        if result.memory.assumptions:
            console.print(Text(f"  assumes (memory): {'; '.join(result.memory.assumptions)}"))
    for a in result.applied:
        for line in a.assumptions:
            console.print(Text(f"  assumes ({a.name}): {line}"))
    for line in result.assumptions:
        # The part the peaks and bandwidth are read for, and a starting lead not kept.
        if line.startswith(("the trace's GPU ", LEAD_ASSUMPTION)):
            console.print(Text(f"  assumes: {line}"))
    if result.correction.source != "off":
        console.print(Text(f"  assumes (profiler cost): {result.correction.assumption()}"))


def _memory_line(after: Any, before: Any) -> str:
    """Predicted peak memory per rank, before -> after, against the device's memory."""
    gib = 1 << 30
    was = f"{before.peak_bytes / gib:.2f} -> " if before is not None else ""
    cap = after.capacity_bytes
    of = (
        f" of {cap / gib:.1f} GiB{' on ' + after.device if after.device else ''}: "
        + ("fits" if after.fits else "DOES NOT FIT")
        if cap
        else " (device memory unknown)"
    )
    return (
        f"  peak memory per rank        {was}{after.peak_bytes / gib:.2f} GiB{of}; the peak "
        f"falls in {after.at} ({after.source})"
    )


def _real_line(real_ms: float, measured_real_ms: float | None, correction: Correction) -> str:
    """The step without the profiler, and where its estimate came from."""
    if correction.source == "off":
        return "  (profiler's cost left in: every figure is for the profiled run)\n"
    line = (
        f"  step without the profiler   {real_ms:10,.2f} ms   ({correction.source}"
        # A fit is said to be exact unless it fell short (then its gap is the uncertainty).
        + (
            f", ±{correction.uncertainty_pct:.0f}%"
            if correction.source != "fit" or correction.uncertainty_pct > 5.5
            else ""
        )
        + ")\n"
    )
    if measured_real_ms is not None:
        line += f"  measured without profiler   {measured_real_ms:10,.2f} ms\n"
    return line


def render_advice(advice: Advice, console: Console) -> None:
    _render_notes(console, advice.notes)
    if advice.correction.source == "off":
        # --keep-profiler-cost: every figure is the profiled run's.
        step = f"step {advice.traced_ms:,.2f} ms as traced, the profiler's cost kept in"
    else:
        step = (
            f"step {advice.baseline_ms:,.2f} ms without the profiler "
            f"({advice.correction.source}; traced {advice.traced_ms:,.2f} ms)"
        )
    n_ranks = int(advice.facts.get("ranks", 1))
    if n_ranks > 1:
        step += f"; {_SLOWEST_RANK.format(n=n_ranks)}"
    console.print(Text(f"{step} · {advice.bottleneck}", style="bold"))
    for finding in advice.findings:
        console.print(Text(f"finding: {finding}"))
    t = Table(
        title="optimizations ranked by predicted step time (gain beyond the model's error)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
    )
    # Widths set here, not by rich (which cropped the last column off an 80-column
    # terminal): numbers never shrink, the name, which the reader acts on, keeps its width
    # while there is room, and the error range wraps first.
    rows = [
        (str(i), s.name, _ms(s.predicted_ms), f"{s.speedup:.2f}×", _band(s), s.measured_share)
        for i, s in enumerate(advice.suggestions, 1)
    ]
    w_num = max((len(r[2]) for r in rows), default=5)
    w_sp = max((len(r[3]) for r in rows), default=7)
    w_hash = len(str(len(rows)))
    overhead = 2 * 6 + 5  # padding and separators of six columns
    fixed = overhead + w_hash + max(w_num, 2) + max(w_sp, 7) + 5
    # At least the header's width: "optimization" folded into "optimizatio / n".
    longest = max([len("optimization"), *(len(r[1]) for r in rows)])
    name_w = max(8, min(longest, console.width - fixed - 10))
    range_w = console.width - fixed - name_w
    # Too narrow for the range too (under ~55 columns): it is left out, the rest kept whole.
    show_range = range_w >= 10
    if not show_range:
        name_w = max(8, min(longest, console.width - fixed))
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("optimization", overflow="fold", min_width=name_w, max_width=name_w)
    t.add_column("ms", justify="right", no_wrap=True)
    t.add_column("speedup", justify="right", no_wrap=True)
    if show_range:
        t.add_column("range", justify="right", min_width=10, max_width=range_w)
    t.add_column("from trace", justify="right", width=5)
    for rank, name, ms, speedup, band, share in rows:
        cells: list[str | Text] = [rank, Text(name), ms, speedup]
        t.add_row(*cells, *([band] if show_range else []), f"{100 * share:.0f}%")
    if advice.suggestions:
        console.print(t)
    else:
        console.print(
            Text(
                "nothing ranked: no optimization perfcast models gains beyond its measured "
                "error on this trace (each one below says why)",
                style="bold",
            )
        )
    if advice.plan is not None:
        p = advice.plan
        console.print(
            Text(
                f"best plan, together: {' + '.join(p.specs)} -> {p.predicted_ms:,.2f} ms "
                f"({p.speedup:.2f}×)",
                style="bold",
            )
        )
        for line in p.code:
            console.print(Text(f"  {line}"))
        if p.enablers:
            console.print(
                Text(
                    f"  with {', '.join(p.enablers)}: no gain alone, but the plan needs it "
                    "(a host sync splits a CUDA graph capture)",
                    style="dim",
                )
            )
        if p.left_out:
            console.print(
                Text(f"  left out, adding under 1% on top: {', '.join(p.left_out)}", style="dim")
            )
    if advice.suggestions:
        console.print("why, where, the change, and what each prediction assumes:", style="bold")
    for i, s in enumerate(advice.suggestions, 1):
        console.print(Text(f"{i}. {s.name}: {s.explanation}"))
        if s.code:
            console.print(Text(f"     change: {s.code}"))
        for site in s.where:
            where = " · ".join(x for x in (site.module, site.source, site.op) if x) or site.path
            console.print(Text(f"     where: {100 * site.share:.0f}%  {where}"))
        for line in s.assumptions:
            console.print(Text(f"     assumes: {line}", style="dim"))
    for s in advice.uncertain:
        console.print(
            Text(f"not ranked: {s.name} ({s.speedup:.2f}×): {s.uncertain}", style="yellow")
        )
    for na in advice.not_applicable:
        console.print(Text(f"not applicable: {na.name}: {na.reason}", style="dim"))
    if advice.suggestions:
        console.print(
            Text(
                "'ms': the predicted step; 'range': the speedup widened by the largest error "
                "of this model on the project's measured pairs (how many); 'from trace': the "
                "share of the predicted critical path whose durations come from the trace",
                style="dim",
            )
        )


def _band(s: Suggestion) -> str:
    if s.speedup_low is None or s.speedup_high is None:
        return "-"
    pairs = f"{s.band_pairs} pair{'s' * (s.band_pairs != 1)}" if s.band_pairs else "no pairs"
    # A low end just above 1 gets the digits that show it is above 1 (1.003, not 1.00: a
    # ranked item's range must not read as reaching no gain).
    low = f"{s.speedup_low:.2f}"
    if low == "1.00" and s.speedup_low != 1.0:
        low = f"{s.speedup_low:.3f}" if abs(s.speedup_low - 1) >= 5e-4 else f"{s.speedup_low:.4f}"
    return f"{low}-{s.speedup_high:.2f}× ({pairs})"


def calibration(cal: Calibration, console: Console) -> None:
    m = cal.machine
    console.print(
        Text(
            f"calibration of {m.get('hostname', '?')} ({m.get('cpu_model', '?')}, "
            f"{m.get('cores', '?')} cores, torch {m.get('torch', '?')}) written to {cal.path}",
            style="bold",
        )
    )
    if cal.dataloader is not None:
        dl = cal.dataloader
        t = Table(
            title=f"DataLoader hand-off, {dl.workers} workers, {dl.sharing_strategy} sharing: "
            "main-thread receive ms after the workers sat idle for",
            title_justify="left",
            box=None,
            pad_edge=False,
        )
        t.add_column("tensors/batch", justify="right")
        for gap in dl.gaps_ms:
            t.add_column(f"{gap:g} ms", justify="right")
        t.add_column("worker extra ms", justify="right")
        ks = sorted({int(key.split(",")[0][2:]) for key in dl.samples})
        for k in ks:
            cells = [_ms(dl.samples.get(f"k={k},gap={gap:g}")) for gap in dl.gaps_ms]
            t.add_row(str(k), *cells, _ms(dl.samples.get(f"k={k},worker")))
        console.print(t)
        fits = ", ".join(
            f"{b:g} + {x:g}/tensor after {g:g} ms"
            for g, b, x in zip(dl.gaps_ms, dl.batch_ms, dl.tensor_ms)
        )
        console.print(
            f"  fitted receive: {fits}; worker {dl.worker_batch_ms:g} + "
            f"{dl.worker_tensor_ms:g} ms/tensor"
        )
    if cal.profiler is not None:
        pr = cal.profiler
        rt = "not measured (no GPU)" if pr.runtime_ns is None else f"{pr.runtime_ns:g} ns"
        console.print(
            f"torch.profiler's own cost per event: {pr.op_ns:g} ns per op + {pr.input_ns:g} per "
            f"recorded input ({pr.op_no_shapes_ns:g} without record_shapes), "
            f"{pr.python_ns:g} per Python frame, {pr.memory_ns:g} per memory event, "
            f"runtime call {rt}"
        )
        why = pr.noisy()
        if why:
            console.print(
                Text(
                    f"  {why}: the machine was busy; run perfcast calibrate again when it is "
                    "idle (these costs are used as they are)",
                    style="yellow",
                )
            )
        if pr.work_share is not None:
            console.print(
                f"and the ops' own work runs {100 * pr.work_share:.1f}% longer in a profiled "
                "training step (a reference CNN step, median of its profiled windows)"
            )
        if pr.host_op_ns is not None:
            console.print(
                f"host speed: {pr.host_op_ns:g} ns per small op without the profiler "
                "(compare machines with device:target=GPU,host=THIS_FILE)"
            )
    if cal.checkpoint is not None:
        ck = cal.checkpoint
        console.print(
            f"torch.utils.checkpoint bookkeeping: {ck.region_ms:g} ms per region + "
            f"{ck.op_ms:g} ms per recomputed op (measured: "
            + ", ".join(f"{k} ops {v:g} ms" for k, v in ck.samples.items())
            + ")"
        )
        if ck.noisy():
            console.print(
                Text(
                    "  a larger region measured cheaper than a smaller one: the machine was "
                    "busy; run perfcast calibrate again when it is idle",
                    style="yellow",
                )
            )
    from perfcast import calibration as cal_files

    if cal.path and cal_files.is_active_path(cal.path):
        said = (
            "perfcast now uses these numbers for traces from this machine; set "
            "PERFCAST_CALIBRATION=off to ignore them"
        )
    else:
        said = (
            f"perfcast reads this file only where PERFCAST_CALIBRATION={cal.path} is set "
            "(or as device:host=FILE)"
        )
    console.print(Text(said, style="dim"))
