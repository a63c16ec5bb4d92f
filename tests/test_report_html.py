"""`perfcast report`: one self-contained HTML file, checked as text and in headless Chromium.

Browser tests (marked slow: each opens the 5 MB page in Chromium for a few seconds) are
skipped where Chromium is absent; CI installs it with `apt-get install -y chromium`.
"""

from __future__ import annotations

import json
import re
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

try:
    from tests.browser import Element, Page, find_chromium, load_page, parse_dom, read_png
except ImportError:  # tests/ not a package: its folder is on sys.path
    from browser import Element, Page, find_chromium, load_page, parse_dom, read_png  # type: ignore[no-redef]
import perfcast
from perfcast.cli.main import main as cli_main
from perfcast.report import html as report_html

SECTION_IDS = ("summary", "breakdown", "timeline", "top", "critical-path", "advice", "ranks")
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"

PWN_KERNEL = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
BREAKOUT_OP = "</script><!--"

browser_test = pytest.mark.slow


def make_report(trace: Path, out: Path) -> str:
    """Run `perfcast report TRACE -o OUT` in-process and return the HTML."""
    assert cli_main(["report", "-q", str(trace), "-o", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def static_checks(text: str) -> None:
    """No way for the file to fetch anything, whatever the browser."""
    assert text.startswith("<!DOCTYPE html>")
    assert f'<meta http-equiv="Content-Security-Policy" content="{CSP}">' in text
    lower = text.lower()
    assert "<script src" not in lower
    assert "<link" not in lower
    assert "@import" not in lower
    assert "<iframe" not in lower
    # Exactly our own script elements: the error hook, the data, plotly.js, the page script.
    assert lower.count("<script") == 4
    assert lower.count("</script>") == 4


def data_of(text: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="perfcast-data">(.*?)</script>', text, re.S)
    assert m, "no data block"
    raw = m.group(1)
    assert "<" not in raw and ">" not in raw and "&" not in raw
    return json.loads(raw)


def browser_checks(page: Page) -> Element:
    """No error anywhere, every section there, the page script ran to its end."""
    assert page.console_lines() == [], "\n".join(page.console_lines())
    root = parse_dom(page.dom)
    errors = root.by_id("perfcast-errors")
    assert errors is not None
    assert errors.text_content().strip() == ""
    assert page.probe.get("rendered") == "1"
    assert page.probe.get("pwned") == "undefined"
    for sid in SECTION_IDS:
        sec = root.by_id(sid)
        assert sec is not None and sec.tag == "section", sid
        assert sec.find_all("h2"), sid
        body = sec.text_content()
        assert "failed to render" not in body, body
        assert "rendering…" not in body, sid
    charts = root.find_all(cls="chart")
    assert charts
    for c in charts:
        assert c.find_all(cls="plot-container") or "js-plotly-plot" in c.classes, c.id
        assert c.find_all("svg"), c.id
    # Nothing in a report is an image; an <img> could only come from trace text.
    assert root.find_all("img") == []
    return root


def chart_ids(root: Element) -> set[str]:
    return {c.id or "" for c in root.find_all(cls="chart")}


# ---------------------------------------------------------------------------------------------
# Without a browser


def test_json_for_html_cannot_break_out() -> None:
    value = {"name": "</script><!--<script>alert(1)</script>&amp;\u2028", "x": [1.5, None]}
    text = report_html.json_for_html(value)
    assert not set(text) & set("<>&")
    assert json.loads(text) == value


def test_script_text_cannot_end_its_element() -> None:
    js = 'var s = "</script><!--"; var t = "</SCRIPT>";'
    safe = report_html._script_safe(js)
    assert "</script" not in safe.lower() and "<!--" not in safe


@pytest.mark.parametrize("channels", [3, 4])
def test_png_decoder_handles_every_filter(tmp_path: Path, channels: int) -> None:
    rng = np.random.default_rng(7)
    h, w = 23, 17
    img = rng.integers(0, 256, (h, w, channels), dtype=np.uint8)
    img[5:9] = 255  # flat rows too
    filters = [i % 5 for i in range(h)]
    rng.shuffle(filters)
    path = tmp_path / "roundtrip.png"
    path.write_bytes(_encode_png(img, filters))
    assert np.array_equal(read_png(path), img)


def _encode_png(img: np.ndarray, filters: list[int]) -> bytes:
    h, w, ch = img.shape
    px = img.astype(np.int32)
    rows = []
    for y in range(h):
        cur = px[y].reshape(-1)
        up = px[y - 1].reshape(-1) if y else np.zeros_like(cur)
        left = np.concatenate([np.zeros(ch, np.int32), cur[:-ch]])
        ul = np.concatenate([np.zeros(ch, np.int32), up[:-ch]])
        f = filters[y]
        if f == 0:
            pred = np.zeros_like(cur)
        elif f == 1:
            pred = left
        elif f == 2:
            pred = up
        elif f == 3:
            pred = (left + up) // 2
        else:
            p = left + up - ul
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - ul)
            pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, ul))
        rows.append(bytes([f]) + ((cur - pred) & 0xFF).astype(np.uint8).tobytes())

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, {3: 2, 4: 6}[ch], 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"".join(rows)))
        + chunk(b"IEND", b"")
    )


# ---------------------------------------------------------------------------------------------
# A hand-made trace whose names try to break out of the page


PID, TID, STREAM = 100, 101, 7


def hostile_trace() -> dict[str, Any]:
    t0 = 1_700_000_000_000_000

    def ev(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
        e = {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID, "ts": t0 + ts}
        e["dur"] = dur
        if args:
            e["args"] = args
        return e

    kernel = ev("kernel", PWN_KERNEL, 40, 300, device=0, stream=STREAM, correlation=7)
    kernel.update(pid=0, tid=STREAM)
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "Test GPU <b>bold</b>"}],
        "traceEvents": [
            ev("user_annotation", "ProfilerStep#1", 0, 1000),
            ev("cpu_op", BREAKOUT_OP, 10, 100, **{"External id": 1}),
            ev("cuda_runtime", "cudaLaunchKernel", 20, 10, correlation=7, **{"External id": 1}),
            kernel,
            {
                "ph": "M",
                "name": "thread_name",
                "pid": PID,
                "tid": TID,
                "args": {"name": "<i>thread</i></script>"},
            },
        ],
    }


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("hostile")
    trace = folder / "a<b>&c'.json"
    trace.write_text(json.dumps(hostile_trace()))
    out = folder / "report.html"
    return out, make_report(trace, out)


def test_hostile_names_stay_text_in_the_file(hostile: tuple[Path, str]) -> None:
    _, text = hostile
    static_checks(text)
    for raw in (PWN_KERNEL, BREAKOUT_OP, "<b>bold</b>", "a<b>&c'", "<i>thread</i>"):
        assert raw not in text
    assert "a&lt;b&gt;&amp;c&#x27;.json" in text  # the header, escaped by html.escape
    data = data_of(text)
    top = data["summary"]["ranks"][0]
    assert [k["name"] for k in top["top_kernels"]] == [PWN_KERNEL]
    assert [o["name"] for o in top["top_ops"]] == [BREAKOUT_OP]
    assert PWN_KERNEL in data["timeline"]["names"]


@browser_test
def test_hostile_names_render_as_text_and_run_nothing(hostile: tuple[Path, str]) -> None:
    if find_chromium() is None:
        pytest.skip("headless Chromium not installed")
    out, _ = hostile
    page = load_page(out)
    root = browser_checks(page)
    assert root.find_all("i") == []
    for b in root.find_all("b"):  # our own: the numbers in the advice headline and verdict
        assert b.parent is not None
        ours = b.parent.classes | (b.parent.parent.classes if b.parent.parent else set())
        assert {"headline", "verdict"} & ours
    cells = [td.text_content() for td in root.find_all("td")]
    assert PWN_KERNEL in cells
    assert BREAKOUT_OP in cells
    # Only our own four script elements exist after rendering.
    assert len(root.find_all("script")) == 4 + 1  # + the test probe


def test_header_notes_truncated_trace_without_steps(tmp_path: Path) -> None:
    trace = hostile_trace()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e["name"] != "ProfilerStep#1"]
    text = json.dumps(trace)
    cut = text.rindex('{"ph": "M"')  # inside the last event: the file ends mid-object
    path = tmp_path / "cut.json"
    path.write_text(text[: cut + 20])
    out = make_report(path, tmp_path / "report.html")
    static_checks(out)
    notes = re.search(r'<ul class="notes" id="notes">(.*?)</ul>', out, re.S)
    assert notes, "no notes in the header"
    assert "truncated trace" in notes.group(1)
    assert "no ProfilerStep#N" in notes.group(1)


# ---------------------------------------------------------------------------------------------
# Real traces


@pytest.fixture(scope="module")
def real_report(shared_traces: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("real") / "report.html"
    make_report(shared_traces / "hta_ddp_a100_rank0_nccl_args.json.gz", out)
    return out


def test_real_report_is_self_contained(real_report: Path) -> None:
    text = real_report.read_text(encoding="utf-8")
    static_checks(text)
    data = data_of(text)
    assert data["meta"]["devices"] == ["NVIDIA A100-PG509-200"]
    tl = data["timeline"]
    assert tl["rank"] == 0 and tl["iteration"] == "ProfilerStep#4"  # the median of 3 steps
    for group in ("measured", "simulated"):
        g = tl[group]
        assert 0 < g["shown"] <= report_html.MAX_TIMELINE_BARS
        assert len(g["start"]) == len(g["dur"]) == len(g["lane"]) == g["shown"]
        assert max(g["lane"]) < len(g["lanes"])
        assert min(g["start"]) >= 0
    assert data["advice"]["suggestions"]
    assert len(data["replay"]["critical_paths"]) == 3


def test_timeline_windows_are_the_steps_own(shared_traces: Path) -> None:
    """The simulated window of the drawn step is the step as the replay times it: on this
    trace the drawn step is the first, whose predecessor completes when the GPU work left
    from before the trace is done (it was drawn from 0 to 49.06 ms for an 18.98 ms step)."""
    import perfcast

    table = perfcast.load(str(shared_traces / "tracelens_mi300x_resnet_act_ckpt_rank0.json.gz"))
    tl = report_html.report_data(table)["timeline"]
    assert tl["iteration"] == "ProfilerStep#15"  # the first of its three steps
    measured = tl["measured"]["window_ms"]
    assert tl["simulated"]["window_ms"] == pytest.approx(measured, rel=1e-6)
    assert min(tl["simulated"]["start"]) >= 0


@browser_test
def test_real_report_renders_in_chromium(real_report: Path, tmp_path: Path) -> None:
    if find_chromium() is None:
        pytest.skip("headless Chromium not installed")
    page = load_page(real_report, screenshot=tmp_path / "report.png")
    root = browser_checks(page)
    assert {
        "chart-breakdown-gpu",
        "chart-breakdown-cpu",
        "chart-timeline",
        "chart-critical-path",
        "chart-advice",
    } <= chart_ids(root)
    ranks = root.by_id("ranks")
    assert ranks is not None and "single rank" in ranks.text_content().lower()
    # The timeline drew bars in both groups.
    timeline = root.by_id("chart-timeline")
    assert timeline is not None
    assert len(timeline.find_all(cls="point")) > 500
    assert page.probe["height"] > 3500
    assert page.screenshot is not None
    img = read_png(page.screenshot)
    assert img.shape[:2] == (4000, 1400)
    ink = img[..., :3].min(axis=2) < 200
    assert ink.mean() > 0.03, "screenshot looks blank"
    # Not just a header: ink all the way down the viewport.
    bands = ink.reshape(8, 500, 1400).mean(axis=(1, 2))
    assert (bands > 0.005).all(), bands


@browser_test
def test_multi_rank_report_compares_ranks(
    shared_traces: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if find_chromium() is None:
        pytest.skip("headless Chromium not installed")
    out = tmp_path_factory.mktemp("ranks") / "report.html"
    text = make_report(shared_traces / "hta_sampled_128rank", out)
    static_checks(text)
    assert [r["rank"] for r in data_of(text)["summary"]["ranks"]] == [0, 1]
    page = load_page(out)
    root = browser_checks(page)
    ranks = root.by_id("ranks")
    assert ranks is not None
    chart = ranks.by_id("chart-ranks")
    assert chart is not None
    ticks = {t.text_content() for t in chart.find_all(cls="xtick")}
    assert ticks == {"rank 0", "rank 1"}
    assert "2 ranks" in ranks.text_content()
    # Each rank's step split, so load imbalance tells apart from waiting.
    assert ranks.by_id("chart-ranks-split") is not None
    assert "Across ranks: compute" in ranks.text_content()


@pytest.mark.slow
def test_largest_trace_report_stays_small(shared_traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    t0 = time.perf_counter()
    text = make_report(shared_traces / "hta_ddp_v100_rank1_memory.json.gz", out)
    took = time.perf_counter() - t0
    size = out.stat().st_size
    assert size < 10_000_000, size
    data = data_of(text)
    tl = data["timeline"]
    assert tl["measured"]["total"] > tl["measured"]["shown"] == report_html.MAX_TIMELINE_BARS
    assert took < 120, took  # load + replay + advice; a few seconds on a laptop


def test_timeline_cap_keeps_every_lanes_longest_bars() -> None:
    """A lane of many short bars keeps an equal share of the cap beside lanes of long ones
    (by length alone, a runtime lane of hundreds of launches kept 2-6 bars)."""
    lane = np.array([0] * 10 + [1] * 3 + [2] * 100)
    dur = np.arange(113, dtype=float)[::-1]  # lane 0 longest, lane 2 shortest
    keep = report_html._capped(lane, dur, 20)
    assert keep.size == 20 and np.unique(keep).size == 20
    assert np.bincount(lane[keep], minlength=3).tolist() == [9, 3, 8]
    # Within a lane, its longest bars.
    assert set(keep[lane[keep] == 2].tolist()) == set(range(13, 21))
    assert report_html._capped(lane, dur, 500).tolist() == list(range(113))


def test_many_ranks_draw_the_time_series_of_a_few(
    shared_traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On 1,024 ranks the analyses' time series (a line per rank) were 40 of the page's 90
    MB: the page keeps SERIES_RANKS ranks' series, the stragglers first, and says so."""
    import perfcast
    from perfcast.report import html

    table = perfcast.load(str(shared_traces / "dlrm_v100_8rank"))
    notes: list[str] = []
    whole = html._analyses(table, notes)
    assert whole is not None and not any("time series" in n for n in notes)
    monkeypatch.setattr(html, "SERIES_RANKS", 3)
    cut = html._analyses(table, notes)
    assert cut is not None
    stragglers = cut["results"]["stragglers"]["candidates"]
    kept = {r["rank"] for r in cut["results"]["queue"]["series"]}
    assert len(kept) == 3 and set(stragglers[:3]) <= kept
    assert len(whole["results"]["kernels"]["top"]) == len(cut["results"]["kernels"]["top"])
    assert any("drawn for 3 of 8 ranks (stragglers" in n for n in notes)


def test_report_warns_where_advise_does_and_keeps_the_cost_when_asked(
    shared_traces: Path, tmp_path: Path
) -> None:
    """advise's notes (a step that is mostly lazy initialization) never reached the page, and
    --keep-profiler-cost still embedded estimates without the profiler."""
    import perfcast
    from perfcast.report.html import report_data

    table = perfcast.load(shared_traces / "hta_mi250_minitoy_train.json.gz")
    data = report_data(table)
    assert any("lazy initialization" in c for c in data["caveats"])
    kept = report_data(table, correct=False)
    assert all(it["real_ms"] is None for rs in kept["summary"]["ranks"] for it in rs["iterations"])


@browser_test
def test_report_page_shows_caveats_step_estimates_and_labels(
    shared_traces: Path, tmp_path: Path
) -> None:
    out = tmp_path / "mi250.html"
    make_report(shared_traces / "hta_mi250_minitoy_train.json.gz", out)
    page = load_page(out)
    root = browser_checks(page)
    verdict = root.by_id("verdict-body")
    assert verdict is not None and "lazy initialization" in verdict.text_content()
    summary = root.by_id("summary-body")
    assert summary is not None and "without profiler ms" in summary.text_content()
    assert "icicle graph" in out.read_text(encoding="utf-8")  # the canvas's accessible name


def test_timeline_cap_keeps_each_kind_of_bar_in_a_lane(tmp_path: Path) -> None:
    """The measured panel kept a stream's kernels and dropped its short copies (its quota per
    lane went to the longer kernels) while the simulated panel, with fewer lanes, drew them:
    the two showed different GPU work. Each lane keeps a share of each kind of bar."""
    out = tmp_path / "r.html"
    example = Path(perfcast.__file__).parent / "examples" / "ddp_a100_rank0.json.gz"
    data = data_of(make_report(example, out))
    tl = data["timeline"]
    copy = report_html._CAT["copy"]
    for group in ("measured", "simulated"):
        g = tl[group]
        assert g["total"] > g["shown"]
        gpu_lanes = {i for i, name in enumerate(g["lanes"]) if name.startswith("GPU")}
        shown_copies = sum(1 for ln, c in zip(g["lane"], g["cat"]) if ln in gpu_lanes and c == copy)
        assert shown_copies > 0, group
    # The two panels draw the same GPU work: the replay reproduces it, so the same bars.
    drawn = {}
    for group in ("measured", "simulated"):
        g = tl[group]
        drawn[group] = sorted(
            (g["lanes"][ln], c, round(d, 3))
            for ln, c, d in zip(g["lane"], g["cat"], g["dur"])
            if g["lanes"][ln].startswith("GPU")
        )
    assert drawn["measured"] == drawn["simulated"]


@browser_test
def test_example_report_tables_fit_and_keep_one_font_per_column(tmp_path: Path) -> None:
    """The error range on one line pushed the suggestions table past a 1400-px window: the
    code change sat behind a horizontal scrollbar."""
    if find_chromium() is None:
        pytest.skip("headless Chromium not installed")
    out = tmp_path / "r.html"
    make_report(Path(perfcast.__file__).parent / "examples" / "ddp_a100_rank0.json.gz", out)
    page = load_page(out, window=(1400, 3000))
    root = browser_checks(page)
    assert not [t for t in page.probe["overflow"] if "optimization" in t], page.probe["overflow"]
    # The example's collectives: the caption says why their simulated bars are shorter.
    timeline = root.by_id("timeline")
    assert timeline is not None
    assert "the last rank reaches it" in timeline.text_content()
    # One font per column of the analyses' tables: per cell, "computation + communication"
    # (27 characters) came out monospace among plain "memory" and "computation".
    checked = 0
    for table in root.find_all("table"):
        heads = [th.text_content() for th in table.find_all("th")]
        if "kinds" not in heads:
            continue
        col = heads.index("kinds")
        cells = [tr.find_all("td")[col] for tr in table.find_all("tr") if tr.find_all("td")]
        texts = [td.text_content() for td in cells]
        assert any(len(t) > 24 for t in texts) and any(len(t) <= 24 for t in texts), texts
        assert len({frozenset(td.classes) for td in cells}) == 1, texts
        checked += 1
    assert checked


def test_every_critical_path_category_has_its_own_colour() -> None:
    """'launch' and 'other ranks' had no colour: both fell back to the same grey, side by side
    in one stacked bar of a multi-rank critical path."""
    from perfcast.analysis.critical_path import CATEGORIES

    js = (Path(report_html.__file__).parent / "assets" / "report.js").read_text()
    block = js[js.index("var COLORS = {") : js.index("};", js.index("var COLORS = {"))]
    colours = dict(re.findall(r'"([^"]+)": "(#[0-9a-f]{6})"', block))
    missing = [c for c in CATEGORIES if c not in colours]
    assert not missing, missing
    used = [colours[c] for c in CATEGORIES]
    assert len(set(used)) == len(used), dict(zip(CATEGORIES, used))


def test_timeline_cap_tells_gpu_lanes_by_kind_not_label(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU streams' share of the cap is theirs whatever a thread is called: a CPU thread
    named "GPU feeder" took half the GPU stream's bars when lanes were told by label."""
    monkeypatch.setattr(report_html, "MAX_TIMELINE_BARS", 100)
    labels = ["GPU feeder · ops", "main · ops", "GPU 0 stream 7"]
    lane = np.repeat(np.arange(3), 300)
    start = np.tile(np.arange(300, dtype=np.int64) * 1000, 3)
    end = start + 500
    cat = np.zeros(lane.size, dtype=np.int8)
    g = report_html._group(
        report_html._Names(), labels, [False, False, True], lane, start, end, cat,
        ["x"] * lane.size, 0,
    )  # fmt: skip
    drawn = np.bincount(np.array(g["lane"]), minlength=3).tolist()
    assert g["lanes"] == labels and drawn == [25, 25, 50]
