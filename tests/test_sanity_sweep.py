"""The sanity sweep on the traces that ship with the project: every model, every trace, no
prediction that breaks the rules in benchmarks/sanity_sweep.py. And the rules themselves
catch what they are meant to."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import sanity_sweep

REPO = Path(__file__).parents[1]
SHIPPED = [REPO / "benchmarks/accuracy/recorded/traces", REPO / "perfcast/examples"]


def test_shipped_traces_get_sane_predictions(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    status = sanity_sweep.main(["--traces", *map(str, SHIPPED), "--jobs", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["traces"] >= 60
    assert result["counts"].get("ok", 0) > 500
    assert "exception" not in result["counts"]
    assert status == 0, result["anomalies"]


def _row(spec: str, speedup: float, trace: str = "t.json.gz", **kw: object) -> dict:
    base = {"trace": trace, "spec": spec, "status": "ok", "baseline_ms": 10.0}
    return base | {"predicted_ms": 10.0 / speedup, "speedup": speedup, "assumptions": ""} | kw


def test_the_rules_flag_what_they_should() -> None:
    flagged = sanity_sweep.anomalies(
        [
            _row("fused-optimizer:kind=fused", 0.9),  # only removes work, yet slower
            _row("batch-size:factor=2", 1.2),  # only adds work per step, yet faster
            _row("cuda-graphs", 25.0),  # beyond 20x
            _row("amp", 1.1, assumptions="scaled by nan"),
            {"trace": "t.json.gz", "spec": "zero", "status": "exception", "message": "E\nKeyError"},
            _row("device:target=h100", 1.10, trace="u.json.gz"),
            _row("device:target=h200", 1.05, trace="u.json.gz"),  # slower than to the H100
        ]
    )
    text = "\n".join(flagged)
    assert len(flagged) == 6, text
    for expected in ("only removes work", "only adds work", "25x", "'nan'", "KeyError", "H200"):
        assert expected in text
    assert sanity_sweep.anomalies([_row("fused-optimizer:kind=fused", 0.99)]) == []
