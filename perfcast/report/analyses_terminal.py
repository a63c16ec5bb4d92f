"""Terminal tables for `perfcast analyze` and `perfcast diff`. Renderers only format."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from perfcast.frames import result_tables
from perfcast.report import display_name, shorten

if TYPE_CHECKING:
    from perfcast.analysis.battery import Analyses
    from perfcast.analysis.diff import TraceDiff

# Tables drawn as charts in the HTML report, too long for a terminal.
SERIES = {"series", "timeline", "bandwidth", "values"}  # long tables: --json / --csv
# Columns shown in the terminal where a table has many; --json and --csv have them all.
COLUMNS: dict[str, tuple[str, ...]] = {
    "counters.kernels": ("index", "op", "flops_fp32", "flops_fp16", "kernel"),
    "kernels.top": ("rank", "kind", "count", "total_ms", "mean_us", "max_us", "pct", "name"),
    "launches.by_kernel": ("rank", "launches", "mean_cpu_us", "mean_gpu_us", "mean_delay_us",
                           "short_kernels", "delay_outliers", "name"),
    "launches.by_op": ("rank", "launches", "mean_cpu_us", "mean_gpu_us", "mean_delay_us",
                       "short_kernels", "delay_outliers", "name"),
    "launches.by_runtime": ("rank", "launches", "mean_cpu_us", "mean_gpu_us", "mean_delay_us",
                            "runtime_outliers", "name"),
    "collectives.by_op": ("rank", "op", "algorithm", "protocol", "dtype", "size_bytes",
                          "group_size", "count", "mean_us", "busbw_gbs", "best_busbw_gbs",
                          "link", "pct_of_peak"),
    "roofline.ops": ("rank", "op", "dtype", "calls", "gpu_ms", "gflops_per_call", "tflops",
                     "gbs", "pct_peak_flops", "pct_peak_bw", "bound", "shapes"),
    "scopes.scopes": ("rank", "kind", "count", "total_ms", "cpu_ms", "gpu_ms", "kernels", "name"),
    "ops.by_op": ("rank", "calls", "kernels", "gpu_ms", "mean_gpu_us", "mean_op_to_launch_us",
                  "mean_runtime_delay_us", "mean_op_to_kernel_us", "op"),
    "ops.sequences": ("rank", "occurrences", "mean_op_to_launch_us", "mean_runtime_delay_us",
                      "op", "sequence"),
    "idle.intervals": ("rank", "stream", "category", "count", "total_ms", "mean_us", "p50_us",
                       "max_us"),
}  # fmt: skip
ID_COLUMNS = {"rank", "device", "stream", "pid", "tid", "thread", "step", "iteration", "id"}
TEXT_COLUMNS = {"name", "op", "sequence", "shapes", "kernel", "runtime", "kinds", "group"}


def _cell(v: Any, width: int = 60, column: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float) and "count" in column:
        # Counts per step are means over steps: whole when every step had the same count.
        return _cell(int(v)) if v.is_integer() else f"{v:,.1f}"
    if isinstance(v, float):
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 100:
            return f"{v:,.0f}"
        if a >= 1:
            return f"{v:,.2f}"
        if a < 0.001:  # no "8e-06" beside "1.32" (--json and --csv keep the value)
            return "<0.001" if v > 0 else ">-0.001"
        return f"{v:.3g}"
    if isinstance(v, int):
        # "1,240" beside "26,770"; identifiers stay as the trace writes them.
        return str(v) if column in ID_COLUMNS else f"{v:,}"
    return shorten(display_name(str(v)), width)


def render_table(
    console: Console, title: str, cols: dict[str, list], keep: tuple[str, ...] | None, rows: int
) -> None:
    names = [c for c in (keep or tuple(cols)) if c in cols]
    n = len(cols[names[0]]) if names else 0
    if n == 0:
        return
    shown = min(n, rows)
    # Names as long as the terminal allows (at 60 characters two kernels that differ only
    # in their template arguments printed alike); they fold where they must.
    name_w = max(60, console.width - 40)
    cells = {
        c: [
            _cell(cols[c][i], width=name_w if c in TEXT_COLUMNS else 60, column=c)
            for i in range(shown)
        ]
        for c in names
    }
    # Figures are never cut ("2,1…"): each keeps its widest cell, text columns wrap into
    # what is left, and when even that does not fit the rightmost figures are left out.
    width = {c: max([len(c), *map(len, cells[c])]) for c in names}
    text_min = 20

    def needed(cs: list[str]) -> int:  # two spaces between columns
        return sum(min(width[c], text_min) if c in TEXT_COLUMNS else width[c] for c in cs) + 2 * (
            len(cs) - 1
        )

    dropped: list[str] = []
    while len(names) > 1 and needed(names) > console.width:
        figure_cols = [c for c in names if c not in TEXT_COLUMNS]
        if not figure_cols:
            break
        dropped.insert(0, figure_cols[-1])
        names.remove(figure_cols[-1])
    t = Table(title=Text(title), title_justify="left", box=None, pad_edge=False)
    for c in names:
        if c in TEXT_COLUMNS:
            t.add_column(c, justify="left", overflow="fold", min_width=min(width[c], text_min))
        else:
            t.add_column(c, justify="right", no_wrap=True, min_width=width[c])
    for i in range(shown):
        t.add_row(*(Text(cells[c][i]) for c in names))
    console.print(t)
    if dropped:
        console.print(
            Text(
                f"  ({', '.join(dropped)} left out at this width: --json, --csv, a wider "
                "terminal, or in Python result.to_pandas() and result.text(width=200) have "
                "them)",
                style="dim",
            )
        )
    if n > rows:
        console.print(
            Text(
                f"  … {n - rows} more rows (--json, --csv or result.to_pandas() have them all)",
                style="dim",
            )
        )


def render_analyses(result: Analyses, console: Console, rows: int = 12) -> None:
    from perfcast.analysis.battery import ANALYSES

    for note in result.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    for name, res in result.results().items():
        console.rule(Text(f"{name}: {ANALYSES[name][1]}", style="bold"), align="left")
        if name == "stragglers" and res.candidates:
            console.print(
                Text(
                    "straggler candidates (latest on average, as HTA ranks them): ranks "
                    + ", ".join(
                        f"{b.rank} ({b.mean_lateness_us:,.0f} µs late on average, last at "
                        f"{b.times_last} collectives, {b.wait_caused_ms:.2f} ms of waiting caused"
                        + ("; never the last, so it held no one up" if not b.times_last else "")
                        + ")"
                        for r in res.candidates
                        for b in res.by_rank
                        if b.rank == r
                    )
                    + f"; {res.matched} collectives matched across ranks"
                    + (
                        "; the ranks that made others wait are those with wait_caused_ms > 0 "
                        "(`summary` marks only those)"
                        if any(b.times_last == 0 for b in res.by_rank if b.rank in res.candidates)
                        else ""
                    )
                )
            )
        for tname, cols in result_tables(res).items():
            if tname in SERIES:
                continue
            render_table(console, f"{name} · {tname}", cols, COLUMNS.get(f"{name}.{tname}"), rows)
        for note in res.notes:
            console.print(Text(f"  note: {note}", style="yellow"))
        console.print()


def render_diff(result: TraceDiff, console: Console, rows: int = 15) -> None:
    for note in result.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    s = result.step
    head = (
        f"step time (mean of the steps, as traced): A {s.a_ms:,.3f} ms → B {s.b_ms:,.3f} ms "
        f"({s.delta_ms:+,.3f} ms, {s.delta_pct:+.1f}%, speedup {s.speedup:.3f}×)"
    )
    console.print(Text(head, style="bold"))
    if s.real_speedup is not None and s.a_real_ms is not None and s.b_real_ms is not None:
        console.print(
            Text(
                f"without the profiler (estimated, or measured where a trace carries its "
                f"unprofiled steps: their median): A {s.a_real_ms:,.3f} ms → B "
                f"{s.b_real_ms:,.3f} ms (speedup {s.real_speedup:.3f}×; {s.real_source}): the "
                "steps above are as traced, each with its profiler's own cost in it",
                style="bold",
            )
        )
    if result.prediction is not None:
        p = result.prediction
        console.print(
            Text(
                f"predicted from A with {', '.join(p.applied)}, as a profiled run (B is one): "
                f"{p.predicted_ms:,.3f} ms per step (speedup {p.predicted_speedup:.3f}×), "
                f"measured in B {p.measured_ms:,.3f} ms (speedup {p.measured_speedup:.3f}×): "
                f"error {p.error_pct:+.1f}%",
                style="bold",
            )
        )
        if result.different_programs:
            console.print(
                Text(
                    "  A and B look like different programs (see the note): this error "
                    "measures how unlike they are, not how good the prediction is",
                    style="yellow",
                )
            )
        if p.predicted_real_ms is not None and p.real_speedup is not None:
            against = ""
            if p.measured_real_ms is not None and p.real_error_pct is not None:
                speedup = (
                    f" (speedup {p.measured_real_speedup:.3f}×)"
                    if p.measured_real_speedup is not None
                    else ""
                )
                if p.measured_real_source == "measured":
                    against = (
                        f", B without the profiler {p.measured_real_ms:,.3f} ms{speedup}, "
                        f"measured (the unprofiled steps B carries): error "
                        f"{p.real_error_pct:+.1f}%"
                    )
                else:
                    # Two estimates: their gap is not an error, and B's own estimate may be
                    # the one that is off (a measured pair showed it 26% from B's real step).
                    against = (
                        f"; B's own estimate without the profiler {p.measured_real_ms:,.3f} "
                        f"ms{speedup} ({p.measured_real_source} correction) differs by "
                        f"{p.real_error_pct:+.1f}%: two estimates, not a measured error (B "
                        "carries no unprofiled steps; the profiled comparison above is "
                        "measured)"
                    )
            console.print(
                Text(
                    f"  without the profiler (as `whatif` reports it): {p.predicted_real_ms:,.3f} "
                    f"ms per step (speedup {p.real_speedup:.3f}×){against}"
                )
            )
    # The tables' legend just above them, after the prediction's lines (it was between
    # the step times and the prediction, far from the ops table it explains).
    console.print(
        Text(
            "ops: CPU time per step of each op, nested ops each counted in full (an op's time "
            "holds its children's, so shares overlap); share_pct: of the step's change",
            style="dim",
        )
    )
    for tname, cols in result_tables(result).items():
        # The predicted table holds the top kernels and then the top ops: both shown.
        render_table(console, tname, cols, None, 2 * rows if tname == "predicted" else rows)
