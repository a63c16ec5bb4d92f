"""The recorded accuracy benchmark: every measured pair scored from its committed trace.

Runs in CI with no GPU. The table of every row is printed at the end of the test session
(conftest), the README's table must be the one generated from the rows, and the committed
median / max error may not get worse by more than one percentage point (a ratchet).
"""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path

import msgspec
import pytest

from benchmarks.accuracy import recorded
from benchmarks.accuracy.recorded_rows import RECORDED_DIR, RecordedRow, load_rows

SHARED_GPU_TRUTH = Path(__file__).parents[2] / "shared" / "gpu-truth"


@pytest.fixture(scope="module")
def rows() -> list[RecordedRow]:
    return load_rows()


@pytest.fixture(scope="module")
def tables() -> dict:
    return recorded._Tables()


@pytest.fixture(scope="module")
def scored(rows: list[RecordedRow], tables: dict) -> list[dict]:
    return recorded.score(rows, tables)


@pytest.fixture(scope="module")
def host_stated(rows: list[RecordedRow], scored: list[dict], tables: dict) -> dict | None:
    return recorded.host_stated_device(rows, scored, tables)


def test_rows_cover_the_measured_sets(rows: list[RecordedRow]) -> None:
    gpu = [r for r in rows if r.source == "gpu-truth-2026-11"]
    assert len(gpu) >= 25
    assert any(r.id == "v100/resnet50_nw0->nw4" and r.measured == "traced" for r in rows)
    # Device pairs start from the H100 trace and name the GPU they were measured on.
    assert {r.variant_device for r in gpu} == {None, "NVIDIA H200"}
    for r in gpu:
        assert r.measured == "unprofiled" and r.baseline_traced_ms and r.batch
        assert r.baseline_trace.startswith("traces/h100/")


def test_traces_are_byte_identical_to_what_was_recorded() -> None:
    sums = (RECORDED_DIR / "traces" / "SHA256SUMS").read_text().split("\n")
    listed = {}
    for line in filter(None, sums):
        digest, name = line.split()
        listed[name] = digest
        assert hashlib.sha256((RECORDED_DIR / name).read_bytes()).hexdigest() == digest, name
    on_disk = {str(p.relative_to(RECORDED_DIR)) for p in RECORDED_DIR.glob("traces/*/*.json.gz")}
    assert on_disk == set(listed)
    if SHARED_GPU_TRUTH.is_dir():  # and identical to the shared originals, where present
        for name in listed:
            if name.startswith("traces/h100/"):
                original = SHARED_GPU_TRUTH / name
                assert original.read_bytes() == (RECORDED_DIR / name).read_bytes(), name


def test_every_row_is_predicted_and_scored(rows: list[RecordedRow], scored: list[dict]) -> None:
    assert [p["id"] for p in scored] == [r.id for r in rows]
    for r, p in zip(rows, scored):
        if r.spec is None:
            continue
        assert p.get("predicted_speedup", 0) > 0, (r.id, p["note"])
        expected = abs(p["predicted_speedup"] - r.speedup) / r.speedup
        assert p["speedup_error"] == pytest.approx(expected)


def test_readme_table_is_generated_from_the_rows(
    rows: list[RecordedRow],
    scored: list[dict],
    host_stated: dict | None,
    tables: dict,
    pytestconfig: pytest.Config,
) -> None:
    held_out = recorded.held_out_baselines(rows, tables)
    # Every trace that carries unprofiled steps is checked without its fit, with its
    # machine's calibration (the rows that carry none come from a source that has one).
    carrying = {r.baseline_trace for r in rows if r.source.startswith("live-")}
    assert held_out["rows"] == len(carrying) == 128 and held_out["sources"] == ["calibration"]
    table = (
        recorded.markdown(rows, scored, host_stated, held_out)
        + "\n\n"
        + recorded.ranking_markdown(recorded.advisor_rankings(rows))
    )
    pytestconfig.cache.set("perfcast/recorded_table", table)  # printed by conftest
    assert recorded.readme_block() == table, (
        "README's recorded-accuracy table is out of date: "
        "run `python -m benchmarks.accuracy --update-readme`"
    )


def test_device_rows_with_the_host_stated_are_left_out_one_at_a_time(
    rows: list[RecordedRow], scored: list[dict], host_stated: dict | None
) -> None:
    assert host_stated is not None
    by_id = {r.id: (r, p) for r, p in zip(rows, scored)}
    device_rows = [i for i, (r, _) in by_id.items() if (r.spec or "").startswith("device:")]
    assert [x["id"] for x in host_stated["rows_detail"]] == device_rows
    for x in host_stated["rows_detail"]:
        r, same_host = by_id[x["id"]]
        # Each row's host speed comes from the other host-only rows, never its own result.
        others = [
            o.speedup
            for o, q in by_id.values()
            if o.id != r.id
            and (o.spec or "").startswith("device:")
            and (o.device, o.variant_device) == (r.device, r.variant_device)
            and o.measured == "unprofiled"
            and q.get("predicted_speedup") is not None
            and q["predicted_speedup"] <= 1.01
        ]
        assert x["host"] == round(statistics.median(others), 2)
        # A faster host never makes the predicted step slower.
        assert x["predicted_speedup"] >= round(same_host["predicted_speedup"], 4) - 1e-9
    # What the recorded H200 pairs show: stating the host closes most of the device gap.
    same = [by_id[x["id"]][1]["speedup_error"] for x in host_stated["rows_detail"]]
    assert host_stated["median"] < statistics.median(same)


def test_advisor_error_bands_come_from_the_rows(
    rows: list[RecordedRow], scored: list[dict]
) -> None:
    bands = json.loads(recorded.BANDS.read_text())
    assert bands == recorded.error_bands(recorded.summarize(rows, scored)), (
        "perfcast/advisor/error_bands.json is out of date: "
        "run `python -m benchmarks.accuracy --update-readme`"
    )


def test_error_ratchet(rows: list[RecordedRow], scored: list[dict]) -> None:
    committed = json.loads(recorded.RATCHET.read_text())
    problems = recorded.check_ratchet(recorded.summarize(rows, scored), committed)
    assert not problems, "; ".join(problems)


def test_ratchet_catches_a_regression_and_a_stale_figure() -> None:
    def summary(unpredicted: int = 0) -> dict:
        return {
            "by_processor": {"gpu": {"median": 0.10, "max": 0.50}},
            "unpredicted_by_processor": {"gpu": unpredicted} if unpredicted else {},
        }

    ok = {"median_error": 0.10, "max_error": 0.50, "unpredicted": 0}
    assert recorded.check_ratchet(summary(), {"gpu": ok}) == []
    worse = recorded.check_ratchet(summary(), {"gpu": {**ok, "median_error": 0.08}})
    assert len(worse) == 1 and "got worse" in worse[0]
    stale = recorded.check_ratchet(summary(), {"gpu": {**ok, "max_error": 0.60}})
    assert len(stale) == 1 and "improved" in stale[0]
    lost = recorded.check_ratchet(summary(1), {"gpu": ok})
    assert len(lost) == 1 and "no prediction" in lost[0]
    assert recorded.check_ratchet(summary(), {"gpu": ok, "cpu": ok})  # a group went missing


def test_pairs_apart_are_the_orders_the_windows_vouch_for() -> None:
    def row(name: str, base: list[float], variant: list[float]) -> RecordedRow:
        return RecordedRow(
            id=name, source="s", device="d", processor="cpu", workload="w", baseline="b",
            variant=name, change=name, spec=name, baseline_trace="t", measured="unprofiled",
            baseline_ms=statistics.median(base), variant_ms=statistics.median(variant),
            baseline_windows_ms=base, variant_windows_ms=variant,
        )  # fmt: skip

    fast = row("fast", [10.0, 10.5], [5.0, 5.2])  # 1.92-2.10x
    same = row("same", [10.0, 10.5], [9.8, 10.4])  # 0.96-1.07x
    close = row("close", [10.0, 10.5], [9.5, 10.0])  # 1.00-1.11x: overlaps `same`
    pairs = recorded._pairs_apart([fast, same, close])
    assert pairs == [(0, 1), (0, 2)]
    # [as measured, the other way, tied]
    assert recorded._order_agreement([2.0, 1.0, 1.0], pairs) == [2, 0, 0]
    assert recorded._order_agreement([1.0, 1.0, 1.5], pairs) == [0, 1, 1]


def test_rows_are_grouped_by_how_far_their_machine_drifted() -> None:
    # A row whose machine ran its trace's unprofiled steps far from the row's own baseline
    # is scored apart: the prediction is fitted to the first and scored against the second.
    def row(name: str, processor: str) -> RecordedRow:
        return RecordedRow(
            id=name, source="s", device="d", processor=processor, workload="w", baseline="b",
            variant=name, change=name, spec=name, baseline_trace="t", measured="unprofiled",
            baseline_ms=10.0, variant_ms=5.0,
        )  # fmt: skip

    rows = [row("a", "gpu"), row("b", "gpu"), row("c", "gpu"), row("d", "cpu")]
    results = [
        {"speedup_error": 0.02, "drift": 0.01},
        {"speedup_error": 0.30, "drift": 0.25},
        {"speedup_error": 0.04, "drift": None},  # the trace carries no unprofiled steps
        {"speedup_error": 0.01, "drift": recorded.DRIFT_LIMIT},
    ]
    groups = recorded.summarize(rows, results)["by_drift"]
    assert {k: g["rows"] for k, g in groups.items()} == {
        "cpu, held": 1,
        "gpu, drifted": 1,
        "gpu, held": 1,
    }
    assert groups["gpu, drifted"]["max"] == 0.30
    assert "gpu rows whose trace's unprofiled steps are more than 10%" in recorded.markdown(
        rows, results
    )
    # The advisor's error band for a change leaves its drifted rows out, and says how many.
    same = [
        RecordedRow(**{**msgspec.structs.asdict(r), "spec": "amp", "change": "amp"}) for r in rows
    ]
    bands = recorded.error_bands(recorded.summarize(same, results))["by_model"]
    assert bands["amp"]["rows"] == 3 and bands["amp"]["max"] == 0.04
    assert bands["amp"]["drifted_rows_set_aside"] == 1
