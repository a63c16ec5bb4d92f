"""The same figure is the same wherever perfcast shows it: across commands, their text and
--json outputs, and the Python API."""

from __future__ import annotations

import json
from pathlib import Path

from perfcast.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"


def test_replay_keeping_the_profiler_cost_shows_no_step_without_the_profiler(capsys):
    """With --keep-profiler-cost each step's real_ms is its traced time: replay's table said so
    under "without profiler ms" while summary and the report show no such column."""
    assert main(["replay", str(EXAMPLE), "--keep-profiler-cost", "-q"]) == 0
    kept = capsys.readouterr().out.split("┘")[0]  # the step table
    assert "profiler" not in kept and "222.44" in kept
    assert main(["summary", str(EXAMPLE), "--keep-profiler-cost", "-q"]) == 0
    assert "profiler" not in capsys.readouterr().out.split("GPU columns")[0]
    # Without the flag the column is there, with the estimate summary shows.
    assert main(["replay", str(EXAMPLE), "-q"]) == 0
    text = capsys.readouterr().out.split("┘")[0]
    assert main(["summary", str(EXAMPLE), "-q", "--json"]) == 0
    real = json.loads(capsys.readouterr().out)["ranks"][0]["iterations"][0]["real_ms"]
    assert "profiler" in text and f"{real:.2f}" in text
