"""Results drawn as the command line draws them: in Jupyter (`_repr_html_`) and as text.

A result of the Python API shown in a notebook cell renders as the matching command's
terminal output, as HTML with inline styles (it survives saving the notebook); `text()`
returns the same as plain text for logs, and `print(result)` prints it. The renderers are
imported only when a result is drawn, so importing perfcast does not load rich.
"""

from __future__ import annotations

import importlib
import io
from typing import Any, ClassVar

NOTEBOOK_WIDTH = 160  # a notebook's <pre> scrolls: wide enough for the bandwidth columns
# A <pre> that wraps like a terminal: Jupyter's own styles would otherwise reflow it.
_HTML_FORMAT = (
    '<pre style="white-space: pre; overflow-x: auto; line-height: 1.25; '
    "font-family: Menlo, 'DejaVu Sans Mono', Consolas, monospace; font-size: 12px\">"
    "<code>{code}</code></pre>"
)


MIN_TEXT_WIDTH = 40


class Displayed:
    """Mixin for result classes: `RENDERER` names the terminal renderer (module, function)
    that draws the result into a rich Console."""

    RENDERER: ClassVar[tuple[str, str]] = ("perfcast.display", "render_tables")

    def _draw(self, width: int) -> Any:
        from rich.console import Console

        console = Console(
            record=True, width=width, file=io.StringIO(), force_terminal=False, color_system=None
        )
        module, function = self.RENDERER
        getattr(importlib.import_module(module), function)(self, console)
        return console

    def __repr__(self) -> str:
        from perfcast.frames import short_repr

        return short_repr(self)

    def __str__(self) -> str:
        """`print(result)`: the command line's text, as wide as the terminal (100 when it
        is not known); the repr stays one line."""
        import shutil

        return self.text(max(MIN_TEXT_WIDTH, shutil.get_terminal_size((100, 24)).columns))

    def text(self, width: int = 100) -> str:
        """The result as the command line prints it, as plain text (no trailing spaces)."""
        from perfcast.errors import whole_number

        # Narrower than this, rich drops whole columns and lines without a word.
        width = whole_number("width", width, minimum=MIN_TEXT_WIDTH)
        text = str(self._draw(width).export_text(styles=False))
        return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"

    def _repr_html_(self) -> str:
        console = self._draw(NOTEBOOK_WIDTH)
        return str(console.export_html(inline_styles=True, code_format=_HTML_FORMAT))


def render_tables(result: Any, console: Any) -> None:
    """A single analysis (a `Tables` result): each of its tables and notes, as in
    `perfcast analyze --only NAME`."""
    from rich.text import Text

    from perfcast.frames import result_tables
    from perfcast.report.analyses_terminal import SERIES, render_table

    name = type(result).__name__
    shown = False
    for tname, cols in result_tables(result).items():
        if tname in SERIES:
            continue
        render_table(console, f"{name} · {tname}", cols, None, 12)
        shown = shown or any(len(col) for col in cols.values())
    if not shown:
        console.print(Text(f"{name}: no rows"))
    for note in getattr(result, "notes", []):
        console.print(Text(f"  note: {note}", style="yellow"))


def render_summary(result: Any, console: Any) -> None:
    """A `Summary` with every top row it holds (`summary(top=N)` chose how many)."""
    from perfcast.report.terminal import render_summary as draw

    top = max((len(rs.top_kernels) for rs in result.ranks), default=5)
    draw(result, console, top=max(top, 1))
