"""`perfcast report`: one self-contained HTML file with every analysis of a trace.

Everything is computed once here (summary, graph, replay, critical paths,
advice) and inlined as JSON; the page draws it with the inlined plotly.js.
The file makes no network request: no CDN, no fonts, no images, and a
Content-Security-Policy that only allows inline scripts and styles.

Trace text (kernel and op names, file paths) is never put into markup as
HTML: the JSON block escapes `<`, `>` and `&`, the page script writes it with
`textContent`, and the few strings rendered here go through `html.escape`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import html
import json
import math
import os
import re
from importlib import resources
from typing import Any

import numpy as np

from perfcast import __version__
from perfcast.analysis.summary import summarize
from perfcast.errors import PerfcastError
from perfcast.events import EventTable, Kind
from perfcast.graph.model import GpuKind, Graph, NodeKind
from perfcast.graph.phases import collective_kernel_mask, host_collective_mask
from perfcast.paths import write_output
from perfcast.report import shorten
from perfcast.report.analyses_terminal import SERIES
from perfcast.sim.timeline import Timeline

CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"

# Bars drawn per group (measured, simulated) in the timeline; the longest are kept.
MAX_TIMELINE_BARS = 2500
MAX_NAME_CHARS = 240
TOP_N = 10
SERIES_RANKS = 16  # ranks whose analyses' time series the page draws
_END_SCRIPT = re.compile(r"</(script)", re.IGNORECASE)

# Bar categories of the timeline, in legend order.
CATEGORIES = ("annotation", "cpu op", "runtime", "wait", "kernel", "communication", "copy")
_CAT = {name: i for i, name in enumerate(CATEGORIES)}

SECTIONS = (
    ("verdict", "In short"),
    ("summary", "Step time per rank"),
    ("breakdown", "Where the step time goes"),
    ("timeline", "Timeline of one step: measured vs simulated"),
    ("top", "Top kernels and CPU ops"),
    ("critical-path", "Critical path"),
    ("advice", "Suggested optimizations"),
    ("ranks", "Ranks"),
    ("analyses", "Trace analyses: kernels, idle time, launches, memory, collectives, roofline"),
    ("context", "Where in the code: GPU and CPU time per call path"),
)


def write_report(table: EventTable, output_path: str, correct: bool = True) -> list[str]:
    """Analyse `table` and write the HTML report to `output_path` (atomically). Returns the
    caveats its first card shows (for the command line to say too)."""
    data = report_data(table, correct=correct)
    write_output(output_path, render_html(data).encode("utf-8"))
    return list(data.get("caveats") or [])


def render_report(table: EventTable, correct: bool = True) -> str:
    """The report as one HTML string."""
    return render_html(report_data(table, correct=correct))


# ---------------------------------------------------------------------------------------------
# Data


def report_data(table: EventTable, correct: bool = True) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready values (computed once)."""
    summary = summarize(table, top=TOP_N, real=False)
    notes: list[str] = list(summary.notes)
    for rs in summary.ranks:
        prefix = f"rank {rs.rank}: " if len(summary.ranks) > 1 else ""
        notes.extend(prefix + n for n in rs.notes)

    graph: Graph | None = None
    tl: Timeline | None = None
    replay = None
    advice = None
    try:
        from perfcast.analysis.real_step import real_world
        from perfcast.analysis.replay import replay_result
        from perfcast.analysis.summary import add_real_steps
        from perfcast.graph import build_graph

        graph = build_graph(table)
        world = real_world(graph, correct=correct)
        tl = world.traced
        replay = replay_result(tl, world)
        if correct:  # --keep-profiler-cost: no estimate without the profiler, as summary
            add_real_steps(summary, world)
    except PerfcastError as exc:
        notes.append(f"the trace could not be replayed: {exc}")
    if graph is not None and tl is not None:
        try:
            from perfcast.advisor.advisor import advise

            advice = advise(table, graph=graph, world=world)
        except PerfcastError as exc:
            notes.append(f"no advice: {exc}")

    context = None
    try:
        from perfcast.report.flame import flame_data

        context = flame_data(table)
    except PerfcastError as exc:
        notes.append(f"no calling context: {exc}")

    devices = sorted({info.device_name for info in table.ranks if info.device_name})
    data: dict[str, Any] = {
        "meta": {
            "files": [info.path for info in table.ranks],
            "devices": devices,
            "version": __version__,
            "generated": _now(),
            "ranks": [info.rank for info in table.ranks],
            "world_size": max((info.world_size or 0 for info in table.ranks), default=0),
            "events": len(table),
            "notes": notes,
        },
        "summary": _asdict(summary),
        "caveats": report_caveats(notes, advice),
        "replay": _asdict(replay) if replay is not None else None,
        "advice": _asdict(advice) if advice is not None else None,
        "timeline": _timeline(table, graph, tl),
        "context": context,
        "categories": list(CATEGORIES),
        "analyses": _analyses(table, notes),
    }
    return _clean(data)


# A note that says the figures themselves are in doubt (a cut or damaged file): the first
# card repeats it beside the answers it casts doubt on.
_DOUBT = ("unreliable", "survived the cut", "survived the damage")


def report_caveats(notes: list[str], advice: Any) -> list[str]:
    """What the first card says before its answers: the advisor's own notes (what `perfcast
    advise` prints first, e.g. a step that is mostly lazy initialization) and the trace's
    notes that put every figure in doubt."""
    out = [n for n in notes if any(d in n for d in _DOUBT)]
    if advice is not None:
        out.extend(n for n in getattr(advice, "notes", []) if n not in out)
    return out


def _analyses(table: EventTable, notes: list[str]) -> dict[str, Any] | None:
    """`perfcast analyze`'s battery for the report's own section (drawn by analyses.js)."""
    from perfcast.analysis.battery import ANALYSES, analyze

    try:
        result = analyze(table, top=TOP_N)
    except PerfcastError as exc:
        notes.append(f"the trace analyses failed: {exc}")
        return None
    results = {name: _asdict(res) for name, res in result.results().items()}
    if "counters" in results:
        # One row per kernel and metric: not drawn, and too long to embed in a page.
        results["counters"].pop("values", None)
    _series_for_some_ranks(results, table, notes)
    return {
        "titles": {name: title for name, (_, title) in ANALYSES.items()},
        "results": results,
    }


def _series_for_some_ranks(results: dict[str, Any], table: EventTable, notes: list[str]) -> None:
    """Keep the time series (launch queue, memory, copy bandwidth) of SERIES_RANKS ranks at
    most, the stragglers first: a line per rank is unreadable past a few dozen, and on 1,024
    ranks the series were 40 of the page's 90 MB."""
    ranks = table.rank_ids()
    if len(ranks) <= SERIES_RANKS:
        return
    stragglers = (results.get("stragglers") or {}).get("candidates") or []
    keep = list(dict.fromkeys([*stragglers, *ranks]))[:SERIES_RANKS]
    kept = set(keep)
    cut = False
    for res in results.values():
        for key in SERIES:
            rows = res.get(key) if isinstance(res, dict) else None
            if isinstance(rows, list) and rows and isinstance(rows[0], dict):
                res[key] = [r for r in rows if r.get("rank") in kept]
                cut = True
    if cut:
        which = f"stragglers {', '.join(map(str, stragglers))}, then " if stragglers else ""
        notes.append(
            f"the analyses' time series are drawn for {len(keep)} of {len(ranks):,} ranks "
            f"({which}the lowest: {', '.join(str(r) for r in sorted(keep))}); `perfcast "
            "analyze --json` has every rank's"
        )


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def _asdict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    return obj


def _clean(x: Any) -> Any:
    """JSON-safe: no NaN/inf (JSON.parse rejects them), no tuples, no NumPy scalars."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, enum.Enum):
        return x.name.lower()
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        f = float(x)
        return f if math.isfinite(f) else None
    if x is None or isinstance(x, str):
        return x
    return str(x)


def _timeline_rank(table: EventTable) -> int | None:
    ranks = table.rank_ids()
    if not ranks:
        return None
    return 0 if 0 in ranks else ranks[0]


class _Names:
    """Interned, shortened names shared by both groups of the timeline."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._index: dict[str, int] = {}

    def ids(self, names: list[str]) -> list[int]:
        out = []
        for n in names:
            i = self._index.get(n)
            if i is None:
                i = len(self.names)
                self.names.append(shorten(n, MAX_NAME_CHARS))
                self._index[n] = i
            out.append(i)
        return out


def _group(
    names: _Names,
    labels: list[str],
    gpu_lanes: list[bool],
    lane: np.ndarray,
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    cat: np.ndarray,
    name_strs: list[str],
    origin: int,
) -> dict[str, Any]:
    """One group of lanes: bars sorted by start, capped to MAX_TIMELINE_BARS (see _capped).
    `gpu_lanes[i]`: lane i is a GPU stream (a thread's name can start with "GPU" too)."""
    dur = end_ns - start_ns
    total = int(dur.size)
    # Quotas per lane and kind of bar, GPU lanes apart from CPU lanes: the GPU work is the
    # same in both groups (the replay reproduces it), the CPU lanes are not (11 measured, 5
    # simulated on the example), and shares of one cap made the two panels draw different
    # kernels and copies (a stream's 1.7 µs copies were dropped in one and drawn in the other).
    kinds = int(cat.max(initial=0)) + 1
    key = lane * kinds + cat
    on_gpu = np.array(gpu_lanes, dtype=bool)[lane]
    gpu, cpu = np.flatnonzero(on_gpu), np.flatnonzero(~on_gpu)
    gpu_cap = min(gpu.size, max(MAX_TIMELINE_BARS // 2, MAX_TIMELINE_BARS - cpu.size))
    keep = np.concatenate(
        [
            gpu[_capped(key[gpu], dur[gpu], gpu_cap)],
            cpu[_capped(key[cpu], dur[cpu], MAX_TIMELINE_BARS - gpu_cap)],
        ]
    )
    keep = keep[np.argsort(start_ns[keep], kind="stable")]
    used = np.unique(lane[keep]) if keep.size else np.zeros(0, dtype=np.int64)
    # Keep every lane that has work, even if none of its bars survived the cap.
    used = np.unique(lane) if lane.size else used
    remap = {int(old): new for new, old in enumerate(used.tolist())}
    return {
        "lanes": [labels[int(i)] for i in used.tolist()],
        "lane": [remap[int(i)] for i in lane[keep].tolist()],
        "start": np.round((start_ns[keep] - origin) / 1e6, 5).tolist(),
        "dur": np.round(dur[keep] / 1e6, 5).tolist(),
        "cat": cat[keep].astype(int).tolist(),
        "name": names.ids([name_strs[int(i)] for i in keep.tolist()]),
        "total": total,
        "shown": int(keep.size),
    }


def _capped(lane: np.ndarray, dur: np.ndarray, cap: int) -> np.ndarray:
    """At most `cap` bars: each lane (here: a lane and kind of bar) keeps its longest bars up
    to an equal quota (the largest that fits), and the slots left go to the longest bars of
    all. Capping by length alone left a runtime lane of hundreds of short launches with 2-6
    bars beside whole kernels."""
    n = int(dur.size)
    if n <= cap:
        return np.arange(n)
    order = np.lexsort((-dur, lane))  # by lane, longest first within it
    _, first, counts = np.unique(lane[order], return_index=True, return_counts=True)
    rank_in_lane = np.arange(n) - np.repeat(first, counts)
    # The largest equal quota q with sum(min(count, q)) <= cap.
    lo, hi = 0, int(counts.max())
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if int(np.minimum(counts, mid).sum()) <= cap:
            lo = mid
        else:
            hi = mid - 1
    chosen = rank_in_lane < lo
    keep = order[chosen]
    rest = order[~chosen]
    left = cap - keep.size
    if left > 0 and rest.size:
        keep = np.concatenate([keep, rest[np.argsort(-dur[rest], kind="stable")[:left]]])
    return keep


def _depth(table: EventTable, rows: np.ndarray, counted: np.ndarray) -> np.ndarray:
    """Per row, how many of its enclosing events are `counted` (a mask over all rows)."""
    depth = np.zeros(rows.size, dtype=np.int64)
    p = table.parent[rows].astype(np.int64)
    for _ in range(512):
        valid = p >= 0
        if not valid.any():
            break
        pc = np.maximum(p, 0)
        depth += valid & counted[pc]
        p = np.where(valid, table.parent[pc], -1)
    return depth


# Lanes of a measured CPU thread, in display order.
_THREAD_LANES = ("annotations", "ops", "nested ops", "runtime")


def _measured_group(
    table: EventTable, rank: int, lo: int, hi: int, coll: np.ndarray, names: _Names
) -> dict[str, Any]:
    """The table's events of one step window: per CPU thread its outermost annotations,
    its ops two levels deep and its runtime calls; per GPU stream its kernels and copies."""
    kind = table.kind
    wanted = np.array(
        [
            Kind.CPU_OP,
            Kind.USER_ANNOTATION,
            Kind.RUNTIME,
            Kind.DRIVER,
            Kind.KERNEL,
            Kind.MEMCPY,
            Kind.MEMSET,
        ],
        dtype=np.int8,
    )
    ts = table.ts
    end = ts + table.dur
    rows = np.flatnonzero((table.rank == rank) & np.isin(kind, wanted) & (ts < hi) & (end > lo))
    step_name = table.step_marker_names()
    annotation = (kind == Kind.USER_ANNOTATION) & ~step_name[table.name]
    rows = rows[(kind[rows] != Kind.USER_ANNOTATION) | annotation[rows]]
    k = kind[rows]
    sub = np.full(rows.size, 3, dtype=np.int64)  # runtime (GPU rows: ignored)
    ops = k == Kind.CPU_OP
    ann = k == Kind.USER_ANNOTATION
    keep = np.ones(rows.size, dtype=bool)
    if ops.any():
        d = _depth(table, rows[ops], kind == Kind.CPU_OP)
        sub[ops] = 1 + np.minimum(d, 2)
        keep[ops] = d <= 1
    if ann.any():
        d = _depth(table, rows[ann], annotation)
        sub[ann] = 0
        keep[ann] = d == 0
    rows, k, sub = rows[keep], k[keep], sub[keep]
    is_gpu = np.isin(k, [Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET])
    cat = np.full(rows.size, _CAT["cpu op"], dtype=np.int8)
    cat[k == Kind.USER_ANNOTATION] = _CAT["annotation"]
    cat[np.isin(k, [Kind.RUNTIME, Kind.DRIVER])] = _CAT["runtime"]
    cat[k == Kind.KERNEL] = _CAT["kernel"]
    cat[(k == Kind.KERNEL) & coll[rows]] = _CAT["communication"]
    cat[(k == Kind.USER_ANNOTATION) & coll[rows]] = _CAT["communication"]  # gloo's ranges
    cat[np.isin(k, [Kind.MEMCPY, Kind.MEMSET])] = _CAT["copy"]
    sub[is_gpu] = 0
    pid = table.pid[rows]
    tid = table.tid[rows]
    keys = list(zip(is_gpu.tolist(), pid.tolist(), tid.tolist(), sub.tolist()))
    busy: dict[tuple[int, int], int] = {}
    for g, p, t, _ in keys:
        if not g:
            busy[(p, t)] = busy.get((p, t), 0) + 1
    # CPU threads busiest first, then GPU streams in order.
    order = sorted(
        set(keys), key=lambda key: (key[0], -busy.get((key[1], key[2]), 0), key[1], key[2], key[3])
    )
    index = {key: i for i, key in enumerate(order)}
    labels = []
    for g, p, t, sb in order:
        if g:
            labels.append(f"GPU {p} stream {t}")
        else:
            thread = table.thread_names.get((rank, p, t)) or f"thread {t}"
            labels.append(f"{thread} · {_THREAD_LANES[sb]}")
    lane = np.array([index[key] for key in keys], dtype=np.int64)
    start = np.maximum(ts[rows], lo)
    stop = np.minimum(end[rows], hi)
    gpu_lanes = [g for g, _, _, _ in order]
    return _group(names, labels, gpu_lanes, lane, start, stop, cat, table.names_of(rows), lo)


def _sim_window(tl: Timeline, span_pos: int) -> tuple[int, int]:
    """Simulated [begin, completion] of one iteration, as `Timeline.iteration_ns` counts it
    (the first step begins when the GPU work left from before the trace is done)."""
    span = tl.graph.iterations[span_pos]
    for w in tl.step_windows():
        if w.span is span:
            return w.begin, w.done
    return 0, 0  # a rank whose every event a damaged trace lost


def _simulated_group(
    tl: Timeline, span_pos: int, coll: np.ndarray, names: _Names
) -> dict[str, Any]:
    g = tl.graph
    c = g.cols
    span = g.iterations[span_pos]
    begin, finish = _sim_window(tl, span_pos)
    kind = c["kind"]
    # Everything that ran in the window, as the measured group shows it: a step's own host
    # work often ran before its window (the CPU runs ahead), and the lanes were then empty.
    sel = (c["rank"] == span.rank) & g.alive
    sel &= (kind != NodeKind.CPU) | (c["op"] >= 0)  # CPU gaps outside any op are idle
    sel &= (tl.start < finish) & (tl.end > begin) & (tl.end > tl.start)
    nodes = np.flatnonzero(sel)
    k = kind[nodes]
    cat = np.full(nodes.size, _CAT["cpu op"], dtype=np.int8)
    cat[np.isin(k, [NodeKind.LAUNCH, NodeKind.RUNTIME, NodeKind.SYNC])] = _CAT["runtime"]
    cat[k == NodeKind.WAIT] = _CAT["wait"]
    gpu = k == NodeKind.GPU
    ev = c["event"][nodes]
    is_coll = (ev >= 0) & coll[np.maximum(ev, 0)] if coll.size else np.zeros(nodes.size, bool)
    cat[gpu] = _CAT["kernel"]
    cat[gpu & is_coll] = _CAT["communication"]
    # gloo's collectives: CPU pieces of a collective range on its worker thread.
    if coll.size:
        op = c["op"][nodes]
        cat[(k == NodeKind.CPU) & (op >= 0) & coll[np.maximum(op, 0)]] = _CAT["communication"]
    cat[gpu & np.isin(c["gpu_kind"][nodes], [GpuKind.MEMCPY, GpuKind.MEMSET])] = _CAT["copy"]
    # CPU segments carry no name of their own: they are named after their op.
    nm = np.where(k == NodeKind.CPU, c["op_name"][nodes], c["name"][nodes])
    name_strs = [g.names[i] if i >= 0 else "cpu" for i in nm.tolist()]
    lane = c["lane"][nodes].astype(np.int64)
    # CPU lanes first, then GPU streams.
    lane_order = sorted(range(len(g.lanes)), key=lambda i: (g.lanes[i].is_gpu, i))
    pos = np.zeros(len(g.lanes), dtype=np.int64)
    pos[lane_order] = np.arange(len(g.lanes))
    labels = [g.lanes[i].name for i in lane_order]
    gpu_lanes = [g.lanes[i].is_gpu for i in lane_order]
    start = np.maximum(tl.start[nodes], begin)
    stop = np.minimum(tl.end[nodes], finish)
    out = _group(names, labels, gpu_lanes, pos[lane], start, stop, cat, name_strs, begin)
    out["window_ms"] = (finish - begin) / 1e6
    return out


def _timeline(table: EventTable, graph: Graph | None, tl: Timeline | None) -> dict[str, Any] | None:
    rank = _timeline_rank(table)
    if rank is None:
        return None
    its = [(i, it) for i, it in enumerate(table.iterations) if it.rank == rank]
    if not its:
        return None
    by_len = sorted(its, key=lambda p: (p[1].dur_ns, p[0]))
    idx, it = by_len[(len(by_len) - 1) // 2]
    lo, hi = it.window_start_ns, it.end_ns
    # Communication: collective kernels, and a CPU backend's (gloo's) collective ranges.
    coll = collective_kernel_mask(table) | host_collective_mask(table)
    names = _Names()
    measured = _measured_group(table, rank, lo, hi, coll, names)
    measured["window_ms"] = (hi - lo) / 1e6
    simulated = None
    if graph is not None and tl is not None:
        span_pos = next(
            (p for p, s in enumerate(graph.iterations) if s.rank == rank and s.index == idx),
            None,
        )
        if span_pos is None:
            span_pos = next(
                (p for p, s in enumerate(graph.iterations) if s.rank == rank and s.name == it.name),
                None,
            )
        if span_pos is not None:
            simulated = _simulated_group(tl, span_pos, coll, names)
    return {
        "rank": rank,
        "iteration": it.name,
        "steps_on_rank": len(its),
        "names": names.names,
        "measured": measured,
        "simulated": simulated,
        "max_bars": MAX_TIMELINE_BARS,
    }


# ---------------------------------------------------------------------------------------------
# HTML


def _asset(name: str) -> str:
    return (resources.files("perfcast.report") / "assets" / name).read_text(encoding="utf-8")


def _plotly_js() -> str:
    try:
        from plotly.offline import get_plotlyjs
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise PerfcastError("the HTML report needs plotly", hint="pip install plotly") from exc
    return _script_safe(get_plotlyjs())


def _script_safe(js: str) -> str:
    """Script text that cannot end its <script> element early (`<\\/` is the same in JS)."""
    return _END_SCRIPT.sub(r"<\\/\1", js).replace("<!--", "<\\!--")


def _page_js() -> str:
    """The page's own script: report.js, then analyses.js (the trace-analyses section)."""
    return _script_safe(_asset("report.js") + "\n" + _asset("analyses.js"))


def json_for_html(data: Any) -> str:
    """JSON text that is safe inside a <script> element: no `<`, `>` or `&` at all."""
    text = json.dumps(data, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_html(data: dict[str, Any]) -> str:
    meta = data["meta"]
    esc = html.escape
    files = meta["files"]
    names = [os.path.basename(f) or f for f in files]
    title = names[0] if len(names) == 1 else f"{len(names)} ranks ({os.path.dirname(files[0])})"
    file_items = (
        "".join(f'<li title="{esc(f)}">{esc(n)}</li>' for f, n in zip(files, names))
        or "<li>none</li>"
    )
    notes = "".join(f"<li>{esc(n)}</li>" for n in meta["notes"])
    notes_html = f'<ul class="notes" id="notes">{notes}</ul>' if notes else ""
    device = ", ".join(meta["devices"]) or "unknown"
    n_ranks = len(meta["ranks"])
    ranks_text = ", ".join(str(r) for r in meta["ranks"][:8]) + (", …" if n_ranks > 8 else "")
    ranks_text = f"{n_ranks} ({ranks_text})" if n_ranks > 1 else f"rank {ranks_text}"
    if meta["world_size"] > n_ranks:
        ranks_text += f" of {meta['world_size']}"
    nav = "".join(f'<a href="#{sid}">{esc(h)}</a>' for sid, h in SECTIONS)
    sections = "\n".join(
        f'<section id="{sid}"><h2>{esc(h)}</h2><div class="body" id="{sid}-body">'
        f'<p class="loading">rendering…</p></div></section>'
        for sid, h in SECTIONS
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="perfcast {esc(meta["version"])}">
<title>perfcast report · {esc(title)}</title>
<style>
{_asset("report.css")}
</style>
<script>
{_script_safe(_asset("errors.js"))}
</script>
</head>
<body>
<pre id="perfcast-errors" hidden></pre>
<header>
<h1>perfcast report</h1>
<dl class="meta">
<dt>trace</dt><dd><ul class="files">{file_items}</ul></dd>
<dt>device</dt><dd>{esc(device)}</dd>
<dt>ranks</dt><dd>{ranks_text} · {meta["events"]:,} events</dd>
<dt>perfcast</dt><dd>{esc(meta["version"])}</dd>
<dt>generated</dt><dd>{esc(meta["generated"])}</dd>
</dl>
{notes_html}
<nav>{nav}</nav>
</header>
<main>
{sections}
</main>
<noscript><p>This report draws its tables and charts with JavaScript.</p></noscript>
<script type="application/json" id="perfcast-data">{json_for_html(data)}</script>
<script>
{_plotly_js()}
</script>
<script>
{_page_js()}
</script>
</body>
</html>
"""
