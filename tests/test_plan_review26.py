"""Review of `perfcast plan` and the memory model (session 26): what a user planning a run
reads must agree with itself and with the memory model."""

from __future__ import annotations

from pathlib import Path

from perfcast.plan import plan_model

RECORDED = Path(__file__).parents[1] / "benchmarks" / "accuracy" / "recorded" / "traces" / "h100"

# Six heads: tensor parallelism of 4 or 8 does not split them.
SIX_HEADS = '{"layers": 4, "hidden": 12288, "heads": 6, "seq": 2048, "vocab": 32000}'


def test_no_plan_fits_note_names_the_usable_memory() -> None:
    # The smallest plan needs 19.3 GiB: under the 20 given, over the 92% of it a plan may use.
    r = plan_model(SIX_HEADS, 8, memory_gb=20)
    assert r.best == []
    note = r.notes[0]
    assert note.startswith("no plan fits in 20 GiB (92% of it usable, 18.4 GiB)")
    needs = float(note.split("the smallest needs ")[1].split(" GiB")[0])
    assert 18.4 < needs < 20
