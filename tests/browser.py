"""Headless Chromium for tests: open a local HTML file, read its DOM after scripts ran,
take a screenshot, and decode that PNG with the standard library and NumPy.

Chromium is found at /usr/bin/chromium or on PATH; tests that need it are skipped where
it is absent (CI installs it with `apt-get install -y chromium`). It runs isolated: a
throw-away profile, no network features, logging to stderr so console messages and
uncaught errors can be read back.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
PROBE_ID = "perfcast-probe"

# Added before </body> of a copy of the page: after load, it writes what only the live
# page knows (a sentinel global, the page height) into the DOM that --dump-dom prints.
PROBE = (
    "<script>window.addEventListener('load',function(){setTimeout(function(){"
    "var p=document.createElement('pre');p.id='" + PROBE_ID + "';p.hidden=true;"
    "p.textContent=JSON.stringify({pwned:typeof window.__pwned,"
    "height:document.documentElement.scrollHeight,"
    "rendered:document.body.getAttribute('data-perfcast-rendered'),"
    # Scrolling tables wider than their box: their first header cells name them.
    "overflow:Array.prototype.slice.call(document.querySelectorAll('.scroll'))"
    ".filter(function(e){return e.scrollWidth>e.clientWidth+1;})"
    ".map(function(e){return Array.prototype.slice.call(e.querySelectorAll('th'),0,3)"
    ".map(function(t){return t.textContent;}).join('|');})});"
    "document.body.appendChild(p);},0);});</script>"
)


def find_chromium() -> str | None:
    for path in CHROMIUM_PATHS:
        if os.access(path, os.X_OK):
            return path
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def require_chromium() -> str:
    """The Chromium executable, or skip the calling test."""
    path = find_chromium()
    if path is None:
        pytest.skip("headless Chromium not installed (apt-get install -y chromium)")
    return path


@dataclass
class Page:
    dom: str  # the serialized DOM after scripts ran
    log: str  # Chromium's stderr
    screenshot: Path | None
    probe: dict[str, Any] = field(default_factory=dict)

    def console_lines(self) -> list[str]:
        """Console messages and uncaught errors Chromium logged for the page."""
        return [ln for ln in self.log.splitlines() if "Uncaught" in ln or "CONSOLE" in ln]


def load_page(
    html_path: Path,
    *,
    screenshot: Path | None = None,
    window: tuple[int, int] = (1400, 4000),
    timeout: float = 90.0,
    budget_ms: int = 5000,
) -> Page:
    """Open a copy of `html_path` (with the probe added) in headless Chromium.

    With `screenshot`, a PNG of the first `window` pixels of the page is written there.
    """
    exe = require_chromium()
    with tempfile.TemporaryDirectory(prefix="perfcast-chromium-") as tmp:
        tmpdir = Path(tmp)
        text = html_path.read_text(encoding="utf-8")
        cut = text.rfind("</body>")
        page = tmpdir / "page.html"
        page.write_text(text[:cut] + PROBE + text[cut:], encoding="utf-8")
        png = tmpdir / "shot.png"
        cmd = [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={tmpdir / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            f"--virtual-time-budget={budget_ms}",
            f"--window-size={window[0]},{window[1]}",
            "--dump-dom",
        ]
        if screenshot is not None:
            cmd.append(f"--screenshot={png}")
        cmd.append(page.as_uri())
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
        dom = proc.stdout.decode("utf-8", "replace")
        log = proc.stderr.decode("utf-8", "replace")
        if proc.returncode != 0 or not dom.strip():
            raise RuntimeError(f"chromium failed (exit {proc.returncode}):\n{log[-4000:]}")
        shot = None
        if screenshot is not None:
            if not png.is_file():
                raise RuntimeError(f"chromium wrote no screenshot:\n{log[-4000:]}")
            shutil.copyfile(png, screenshot)
            shot = screenshot
    probe: dict[str, Any] = {}
    m = re.search(rf'<pre id="{PROBE_ID}"[^>]*>(.*?)</pre>', dom, re.S)
    if m:
        probe = json.loads(html.unescape(m.group(1)))
    return Page(dom=dom, log=log, screenshot=shot, probe=probe)


# ---- the dumped DOM -------------------------------------------------------------------------


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    parent: Element | None
    children: list[Element] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    @property
    def id(self) -> str | None:
        return self.attrs.get("id")

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def iter(self) -> Any:
        yield self
        for c in self.children:
            yield from c.iter()

    def find_all(self, tag: str | None = None, cls: str | None = None) -> list[Element]:
        return [
            e
            for e in self.iter()
            if (tag is None or e.tag == tag) and (cls is None or cls in e.classes)
        ]

    def by_id(self, ident: str) -> Element | None:
        return next((e for e in self.iter() if e.id == ident), None)

    def text_content(self) -> str:
        parts = list(self.text)
        for c in self.children:
            parts.append(c.text_content())
        return "".join(parts)


_VOID = {
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
    "track", "wbr",
}  # fmt: skip


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {}, None)
        self.cur = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = Element(tag, {k: v or "" for k, v in attrs}, self.cur)
        self.cur.children.append(el)
        if tag not in _VOID:
            self.cur = el

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.cur.children.append(Element(tag, {k: v or "" for k, v in attrs}, self.cur))

    def handle_endtag(self, tag: str) -> None:
        node: Element | None = self.cur
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.cur = node.parent

    def handle_data(self, data: str) -> None:
        self.cur.text.append(data)


def parse_dom(dom: str) -> Element:
    """A small element tree of serialized HTML (stdlib only)."""
    b = _TreeBuilder()
    b.feed(dom)
    b.close()
    return b.root


# ---- PNG ------------------------------------------------------------------------------------


def read_png(path: Path) -> np.ndarray:
    """Decode an 8-bit, non-interlaced PNG (what Chromium writes) to (h, w, channels) uint8."""
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos = 8
    idat = []
    width = height = 0
    channels = 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        ctype = data[pos + 4 : pos + 8]
        chunk = data[pos + 8 : pos + 8 + n]
        pos += 12 + n
        if ctype == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            if depth != 8 or interlace != 0:
                raise ValueError(f"unsupported PNG: depth {depth}, interlace {interlace}")
            channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(color, 0)
            if not channels:
                raise ValueError(f"unsupported PNG colour type {color}")
        elif ctype == b"IDAT":
            idat.append(chunk)
        elif ctype == b"IEND":
            break
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8)
    stride = width * channels
    rows = raw.reshape(height, stride + 1)
    return _unfilter(rows[:, 0].copy(), rows[:, 1:], width, channels)


def _unfilter(ftype: np.ndarray, filt: np.ndarray, w: int, ch: int) -> np.ndarray:
    """Undo PNG row filters, vectorized along anti-diagonals of the pixel grid.

    Pixel (y, x) depends on (y, x-1), (y-1, x) and (y-1, x-1) only, so all pixels with the
    same x + y can be reconstructed at once whatever filter each row uses.
    """
    h = filt.shape[0]
    f = filt.reshape(h, w, ch).astype(np.int32)
    out = np.zeros((h + 1, w + 1, ch), dtype=np.int32)  # padded: row 0 and column 0 are zero
    for d in range(h + w - 1):
        y = np.arange(max(0, d - w + 1), min(h, d + 1))
        x = d - y
        a = out[y + 1, x]  # left
        b = out[y, x + 1]  # up
        c = out[y, x]  # up-left
        t = ftype[y][:, None]
        p = a + b - c
        pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
        paeth = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
        pred = np.select(
            [t == 0, t == 1, t == 2, t == 3, t == 4],
            [np.zeros_like(a), a, b, (a + b) // 2, paeth],
        )
        out[y + 1, x + 1] = (f[y, x] + pred) & 0xFF
    return out[1:, 1:].astype(np.uint8)
