"""Step boundaries and per-step figures (session-25 review): the per-step rows against the
headline, and predictions that must not depend on how many steps a trace holds."""

from __future__ import annotations

from pathlib import Path

import perfcast
from perfcast.whatif.runner import MEAN_HEADLINE, rows_mean_ms

RECORDED = Path(__file__).resolve().parents[1] / "benchmarks/accuracy/recorded/traces"
H100 = RECORDED / "h100"


def test_steady_state_headline_says_its_rows_average_another_number() -> None:
    """r50_amp_bf16 with cuda-graphs:syncs=move: the headline is the baseline's mean times
    the steady-state ratio (39.72 ms) while the per-step rows average 36.40 ms; nothing said
    so, and a user averaging --json's rows got another number."""
    r = perfcast.predict(str(H100 / "r50_amp_bf16.json.gz"), "cuda-graphs:syncs=move")
    mean = rows_mean_ms(r.iterations)
    assert abs(mean - r.predicted_ms) > 0.01 * r.predicted_ms
    assert "steady-state ratio" in r.headline
    assert f"{mean:,.3f} ms" in r.headline
    assert "predicted step: predicted_ms" in r.text(400)


def test_plain_headline_is_the_mean_of_its_rows() -> None:
    r = perfcast.predict(str(H100 / "mlp_base.json.gz"), "fused-optimizer")
    assert r.headline == MEAN_HEADLINE
    assert abs(rows_mean_ms(r.iterations) - r.predicted_ms) < 0.0005
    assert abs(rows_mean_ms(r.iterations, traced=True) - r.predicted_traced_ms) < 0.0005
