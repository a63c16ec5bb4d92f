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


def test_a_first_step_that_stands_out_is_said_where_the_steps_are_shown() -> None:
    """r50_amp_bf16 (H100): the first step took 50.56 ms without the profiler, 39.52 the
    others (76.08 against 63.40 as traced); the mean every what-if scales (43.20 ms) holds
    it, and summary, replay and whatif showed it with no word."""
    path = str(H100 / "r50_amp_bf16.json.gz")
    summary_notes = perfcast.summary(path).notes
    replay_notes = perfcast.replay(path).notes
    predicted = perfcast.predict(path, "fused-optimizer")
    for notes in (summary_notes, replay_notes, predicted.notes):
        said = [n for n in notes if n.startswith("the first step (ProfilerStep#3)")]
        assert len(said) == 1
        assert "50.56 ms" in said[0] and "39.52 ms" in said[0] and "43.20 ms" in said[0]


def test_a_first_step_like_the_others_is_not_noted() -> None:
    r = perfcast.replay(str(H100 / "r50_fused.json.gz"))
    assert not any(n.startswith("the first step") for n in r.notes)
