"""The README's Python examples run as written, on the trace shipped with the project."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"


def _python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_api_examples_run(capsys):
    blocks = [b for b in _python_blocks() if "perfcast.load(" in b or "dependency_graph" in b]
    assert len(blocks) == 3, "the README's API, custom what-if and DataFrame examples"
    namespace: dict = {}
    for block in blocks:
        # The examples load "traces/"; here that is the shipped example trace.
        exec(block.replace('"traces/"', repr(str(EXAMPLE))), namespace)
    out = capsys.readouterr().out
    assert "ProfilerStep#4" in out  # the custom what-if printed its iterations
