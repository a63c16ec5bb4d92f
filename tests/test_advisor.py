"""The advisor: ranks only gains beyond their model's measured error, says what to change, and
composes a plan; counts are per rank."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import perfcast
from perfcast.advisor import advisor as adv

REPO = Path(__file__).resolve().parents[1]
MLP = REPO / "benchmarks" / "accuracy" / "recorded" / "traces" / "h100" / "mlp_base.json.gz"
EXAMPLE = REPO / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"


@pytest.fixture(scope="module")
def mlp_advice():
    return perfcast.advise(MLP)


def test_ranked_gains_clear_their_error_band(mlp_advice) -> None:
    assert mlp_advice.suggestions, "a launch-bound step with a for-loop Adam has clear gains"
    for s in mlp_advice.suggestions:
        assert s.speedup_low is not None and s.speedup_low > 1.0
        assert s.speedup_low < s.speedup < s.speedup_high
        assert s.code and not s.uncertain
    for s in mlp_advice.uncertain:
        assert s.uncertain and (s.speedup <= 1.0 or s.speedup_low <= 1.0)
    names = [s.name for s in mlp_advice.suggestions]
    assert names[0] == "cuda-graphs" and "fused-optimizer:kind=fused" in names
    assert [s.predicted_ms for s in mlp_advice.suggestions] == sorted(
        s.predicted_ms for s in mlp_advice.suggestions
    )


def test_the_plan_composes_different_models(mlp_advice) -> None:
    plan = mlp_advice.plan
    assert plan is not None
    models = [p.split(":")[0] for p in plan.specs]
    assert len(models) == len(set(models)) >= 2
    # Code changes first, capture last (a whole-step graph, or reduce-overhead's trees).
    assert plan.specs[-1] in ("cuda-graphs", "torch-compile:mode=reduce-overhead")
    best = min(s.predicted_ms for s in mlp_advice.suggestions)
    assert plan.predicted_ms <= best
    assert any("fused=True" in line for line in plan.code)


def test_the_plan_states_what_its_prediction_assumed(mlp_advice) -> None:
    # Every prediction states what it assumed; the composed plan's stated nothing.
    plan = mlp_advice.plan
    assert plan is not None and plan.assumptions
    said = " ".join(plan.assumptions)
    assert "optimizer kernels fused" in said  # fused-optimizer's, as applied in the plan
    assert ("CUDA graph" in said) or ("torch-compile" in said)
    from perfcast.whatif.runner import run_whatif

    table = perfcast.load(str(MLP))
    from perfcast.whatif.registry import parse_spec

    applied = run_whatif(table, [parse_spec(x) for x in plan.specs])[0].applied
    assert [a for m in applied for a in m.assumptions] == plan.assumptions[
        : sum(len(m.assumptions) for m in applied)
    ]


def test_code_lines_name_the_traces_own_optimizer(mlp_advice) -> None:
    # The MLP trace's optimizer ranges read "Optimizer.step#Adam.step".
    fused = next(s for s in mlp_advice.suggestions if s.name == "fused-optimizer:kind=fused")
    assert fused.code == "torch.optim.Adam(params, ..., fused=True)"
    graphs = next(s for s in mlp_advice.suggestions if s.name == "cuda-graphs")
    assert "torch.optim.Adam(..., capturable=True)" in graphs.code
    assert mlp_advice.plan is not None
    assert "torch.optim.Adam(params, ..., fused=True)" in mlp_advice.plan.code


@pytest.mark.parametrize(
    ("spec", "optimizer", "expected"),
    [
        ("fused-optimizer:kind=fused", "SGD", "torch.optim.SGD(params, ..., fused=True)"),
        (
            "fused-optimizer:kind=foreach",
            "RMSprop",
            "torch.optim.RMSprop(params, ..., foreach=True)",
        ),
        # No fused RMSprop in torch: the line offers what exists.
        ("fused-optimizer:kind=fused", "RMSprop", "torch.optim.RMSprop(params, ..., foreach=True)"),
        # A class of the user's own is named, never swapped for another.
        ("fused-optimizer:kind=fused", "FusedAdam", "FusedAdam is not a torch.optim class"),
        ("fused-optimizer:kind=fused", None, "torch.optim.AdamW(params, ..., fused=True)"),
        ("remove-host-sync", "SGD", "drop .item()"),
        # SGD has no capturable option and needs none; Adagrad has none and cannot be captured.
        ("cuda-graphs", "SGD", "(torch.optim.SGD captures as it is)"),
        ("cuda-graphs", "Adagrad", "capture forward and backward"),
        ("cuda-graphs", "RMSprop", "torch.optim.RMSprop(..., capturable=True)"),
        ("cuda-graphs", None, "the optimizer's capturable=True"),
    ],
)
def test_code_line_per_optimizer(spec: str, optimizer: str | None, expected: str) -> None:
    assert expected in adv._code(spec, adv.TraceTraits(optimizer=optimizer))


def test_code_lines_follow_the_trace() -> None:
    inference = adv.TraceTraits(phases=frozenset({"forward"}))
    assert adv._code("cuda-graphs", inference).startswith("capture the forward once")
    assert "optimizer" not in adv._code("cuda-graphs", inference).split("(")[0]
    cpu = adv.TraceTraits(has_gpu=False)
    assert "pin_memory" not in adv._code("dataloader-overlap:workers=4", cpu)
    assert "pin_memory=True" in adv._code("dataloader-overlap:workers=4", adv.TraceTraits())
    library = adv.TraceTraits(optimizer="FusedAdam")
    assert "FusedAdam is not a torch.optim class" in adv._code("cuda-graphs", library)
    assert "capturable=True" not in adv._code("cuda-graphs", library).split(";")[0]


def test_optimizer_class_needs_one_class() -> None:
    from types import SimpleNamespace
    from typing import Any

    def table(names: list[str]) -> Any:
        return SimpleNamespace(names=names)  # only the interned names are read

    assert adv.optimizer_class(table(["aten::mm", "Optimizer.step#SGD.step"])) == "SGD"
    two = ["Optimizer.step#SGD.step", "Optimizer.step#Adam.step"]
    assert adv.optimizer_class(table(two)) is None
    assert adv.optimizer_class(table(["aten::mm"])) is None


def test_every_plan_member_earns_its_place(mlp_advice) -> None:
    """Greedy, best first: each member, added in rank order, made the plan at least 1%
    faster; what was left out is a ranked suggestion the plan did not need."""
    from perfcast.analysis.real_step import real_world
    from perfcast.graph import build_graph

    plan = mlp_advice.plan
    assert plan is not None
    order = [s.name for s in mlp_advice.suggestions]
    # Enablers join last, unranked (no gain alone), on the same 1% terms.
    members = sorted((n for n in plan.specs if n not in plan.enablers), key=order.index)
    ranked = {s.name: s for s in mlp_advice.suggestions}
    world = real_world(build_graph(perfcast.load(MLP)))
    before = ranked[members[0]].predicted_ms
    chosen = [ranked[members[0]]]
    for name in members[1:]:
        together = adv._predict_together([*chosen, ranked[name]], world)
        assert together is not None
        now = together[0]
        assert now < before * 0.99, [*chosen, name]
        chosen, before = [*chosen, ranked[name]], now
    for name in plan.enablers:
        assert name not in ranked
        enabler = dataclasses.replace(chosen[0], name=name)
        together = adv._predict_together([*chosen, enabler], world)
        assert together is not None
        now = together[0]
        assert now < before * 0.99, name
        chosen, before = [*chosen, enabler], now
    assert plan.predicted_ms == pytest.approx(before)
    assert set(plan.left_out) <= set(ranked) - set(plan.specs)


def test_whole_step_capture_and_reduce_overhead_are_never_planned_together() -> None:
    # On the shipped DDP example both are ranked (a host-bound step), but CUDA graph trees
    # cannot run inside a capture of the whole step.
    advice = perfcast.advise(EXAMPLE)
    ranked = {s.name for s in advice.suggestions}
    assert {"cuda-graphs", "torch-compile:mode=reduce-overhead"} <= ranked
    if advice.plan is not None:
        assert not {"cuda-graphs", "torch-compile:mode=reduce-overhead"} <= set(advice.plan.specs)


def test_bands_come_from_the_packaged_file() -> None:
    bands = adv._bands()
    assert bands["by_model"]["fused-optimizer"]["rows"] >= 3
    band, pairs = adv._band("fused-optimizer:kind=fused", bands)
    assert pairs == bands["by_model"]["fused-optimizer"]["rows"]
    assert band == bands["by_model"]["fused-optimizer"]["max"] and band < bands["all"]["max"]
    # A model with no measured pair gets the largest error of any model.
    band, pairs = adv._band("zero:stage=2", bands)
    assert pairs == 0 and band == bands["all"]["max"]


def test_counts_are_per_rank(tmp_path: Path) -> None:
    one = perfcast.advise(EXAMPLE).facts
    folder = tmp_path / "ranks"
    folder.mkdir()
    doc = json.loads(gzip.decompress(EXAMPLE.read_bytes()))
    for r in (0, 1):  # the same rank twice: per-rank counts must not double
        doc["distributedInfo"]["rank"] = r
        (folder / f"rank{r}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    two = perfcast.advise(folder).facts
    assert one["ranks"] == 1.0 and two["ranks"] == 2.0
    for key in ("kernels_per_step", "optimizer_kernels_per_step", "syncs_per_step"):
        assert two[key] == pytest.approx(one[key]), key


def test_fp16_adds_the_grad_scalers_host_check() -> None:
    from perfcast.graph import build_graph
    from perfcast.graph.model import NodeKind
    from perfcast.whatif.registry import parse_spec
    from perfcast.whatif.runner import apply_specs

    path = REPO / "benchmarks" / "accuracy" / "recorded" / "traces" / "h100" / "r50_base.json.gz"
    g = build_graph(perfcast.load(path))
    steps = len(g.iterations)
    syncs = int((g.cols["kind"] == NodeKind.SYNC).sum())
    fp16, _ = apply_specs(g, [parse_spec("amp:dtype=fp16")])
    bf16, _ = apply_specs(g, [parse_spec("amp:dtype=bf16")])
    assert int((fp16.cols["kind"] == NodeKind.SYNC).sum()) == syncs + steps
    assert int((bf16.cols["kind"] == NodeKind.SYNC).sum()) == syncs
    names = {fp16.names[i] for i in fp16.cols["name"][fp16.cols["kind"] == NodeKind.GPU]}
    assert any("GradScaler" in n for n in names)
    # The host now waits for the gradients every step: never faster than bf16 where the
    # two differ in nothing else (no batch norm, which bf16 runs on native kernels).
    mlp = path.with_name("mlp_base.json.gz")
    r16 = perfcast.predict(mlp, "amp:dtype=fp16")
    rbf = perfcast.predict(mlp, "amp:dtype=bf16")
    assert r16.predicted_ms >= rbf.predicted_ms


def test_fp16_grad_scaler_per_rank_and_step(tmp_path: Path) -> None:
    """Two ranks with the same step numbers: each rank's steps get their own scaler, its
    check, and two kernels launched on that rank."""
    from perfcast.graph import build_graph
    from perfcast.graph.model import NodeKind
    from perfcast.whatif.registry import parse_spec
    from perfcast.whatif.runner import apply_specs

    path = REPO / "benchmarks" / "accuracy" / "recorded" / "traces" / "h100" / "mlp_fused.json.gz"
    doc = json.loads(gzip.decompress(path.read_bytes()))
    folder = tmp_path / "ranks"
    folder.mkdir()
    for r in (0, 1):
        doc["distributedInfo"] = {"rank": r, "world_size": 2, "backend": "nccl"}
        (folder / f"rank{r}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    g = build_graph(perfcast.load(folder))
    steps = {(int(r), int(i)) for r, i in zip(g.cols["rank"], g.cols["iteration"]) if i >= 0}
    assert {r for r, _ in steps} == {0, 1}
    fp16, _ = apply_specs(g, [parse_spec("amp:dtype=fp16")])
    c = fp16.cols
    named = {i for i, n in enumerate(fp16.names) if "GradScaler" in n}
    is_scaler = np.isin(c["name"], list(named))
    check = np.flatnonzero(is_scaler & (c["kind"] == NodeKind.SYNC))
    assert {(int(c["rank"][n]), int(c["iteration"][n])) for n in check} == steps
    assert check.size == len(steps)
    kernels = np.flatnonzero(is_scaler & (c["kind"] == NodeKind.GPU))
    assert kernels.size == 2 * len(steps)
    # Each kernel is launched by a new launch call on its own rank, before its optimizer.
    launches = c["launch"][kernels]
    assert (c["kind"][launches] == NodeKind.LAUNCH).all()
    assert (c["rank"][launches] == c["rank"][kernels]).all()


def test_amp_is_proposed_in_fp16_on_a_gpu_without_bf16() -> None:
    from perfcast.graph import build_graph

    g = build_graph(perfcast.load(EXAMPLE))
    assert "amp:dtype=bf16" in adv._candidates_for(g)  # an A100 has bf16
    g.device_names = dict.fromkeys(g.device_names, "Tesla V100-SXM2-32GB")
    specs = adv._candidates_for(g)
    assert "amp:dtype=fp16" in specs and "amp:dtype=bf16" not in specs


def test_not_applicable_reasons_do_not_repeat_the_name(shared_traces: Path) -> None:
    """The list read 'cuda-graphs: cuda-graphs: the trace has no GPU work'."""
    advice = perfcast.advise(str(shared_traces / "hta_cpu_only_gloo_rank34.json.gz"))
    assert advice.not_applicable
    for na in advice.not_applicable:
        assert not na.reason.startswith(na.name.split(":")[0] + ":"), na


def test_collectives_far_below_the_link_are_called_waiting(shared_traces: Path) -> None:
    """A DDP rank whose step is mostly all-reduce at under 1% of the link's bus bandwidth:
    GPU-bound, but by collectives, and they are waiting for other ranks, not moving data."""
    trace = shared_traces / "tracelens_mi300x_resnet_act_ckpt_rank0.json.gz"
    advice = perfcast.advise(str(trace))
    assert advice.bottleneck.startswith("GPU-bound") and "collectives" in advice.bottleneck
    assert len(advice.findings) == 1
    finding = advice.findings[0]
    assert "of the link's peak bus bandwidth" in finding and "waiting for other ranks" in finding
    # Below the share that makes a finding, none is given.
    facts = dict(advice.facts, comm_critical_pct=adv.COMM_FINDING_PCT - 1)
    assert adv._communication_findings(perfcast.load(str(trace)), facts) == []


def test_waiting_on_other_ranks_names_the_late_rank(shared_traces: Path) -> None:
    advice = perfcast.advise(str(shared_traces / "dlrm_v100_8rank"))
    assert advice.bottleneck.startswith("waiting on other ranks")
    assert [f for f in advice.findings if f.startswith("ranks waiting")] == advice.findings
    assert "rank 7 arrived last at 5 of its 8 collectives" in advice.findings[0]


def test_a_host_bound_step_has_no_finding() -> None:
    advice = perfcast.advise(str(EXAMPLE))
    assert advice.bottleneck.startswith("host-bound") and advice.findings == []


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("hta_a100_rank0_of16.json.gz", "GPU tasks have no launch in the trace"),
        (
            "tracelens_mi300x_sglang_qwen3_8b.json.gz",
            "blocked 493.2 ms (50% of the traced steps) in hipMemcpyWithStream",
        ),
    ],
)
def test_unexplained_time_on_the_critical_path_is_a_finding(
    shared_traces: Path, name: str, says: str
) -> None:
    advice = perfcast.advise(str(shared_traces / name))
    assert advice.bottleneck.startswith("idle")
    assert len(advice.findings) == 1 and says in advice.findings[0]


@pytest.mark.parametrize("frames", [False, True])
def test_the_idle_finding_points_to_the_tree_when_the_trace_has_frames(
    write_trace, frames: bool
) -> None:
    from perfcast.advisor.advisor import _idle_findings
    from tests.tracegen import TraceBuilder

    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.op("aten::mm", 100, 50)
    if frames:
        b.op("train.py(9): <module>", 10, 900, cat="python_function")
    graph = perfcast.dependency_graph(perfcast.load(write_trace(b.doc())))
    (finding,) = _idle_findings(graph, {"idle_critical_pct": 60.0})
    assert ("'perfcast tree' shows" in finding) is frames
    assert ("with_stack=True shows" in finding) is not frames


@pytest.mark.parametrize(
    ("speedup", "says"),
    [(0.90, "predicted slower (0.90x)"), (0.999, "predicted no gain (1.00x)"), (1.0, "no gain")],
)
def test_an_item_without_a_gain_says_whether_it_is_slower(speedup: float, says: str) -> None:
    s = adv.Suggestion("x", 10.0, speedup, 0.0, "", [], 1.0)
    assert says in adv._why_uncertain(s)


def test_ranked_items_carry_the_profiled_prediction_whatif_gives(mlp_advice) -> None:
    for s in mlp_advice.suggestions:
        assert s.predicted_traced_ms is not None and s.predicted_traced_ms >= s.predicted_ms
    s = next(x for x in mlp_advice.suggestions if x.name == "fused-optimizer:kind=fused")
    r = perfcast.predict(MLP, s.name)
    assert s.predicted_traced_ms == pytest.approx(r.predicted_traced_ms)
    assert all(u.predicted_traced_ms is None for u in mlp_advice.uncertain)


def test_a_plan_seeded_by_a_shut_out_suggestion_wins_when_faster(shared_traces: Path) -> None:
    """BERT (inference, H100): reduce-overhead ranks first and shut out torch-compile and
    cuda-graphs, both ranked and compatible with each other: the plan was reduce-overhead
    with its sync enabler, 0.71 ms, where torch-compile + cuda-graphs (+ the enabler) is
    0.62 ms. And the enabler comes before the capture (applied after it, the sync still
    split the capture: 2 graph launches)."""
    advice = perfcast.advise(shared_traces / "tracelens_h100_bert_small.json.gz")
    plan = advice.plan
    assert plan is not None
    assert plan.specs == ["remove-host-sync:reads=true", "torch-compile", "cuda-graphs"]
    alone = perfcast.predict(
        shared_traces / "tracelens_h100_bert_small.json.gz",
        ["remove-host-sync:reads=true", "torch-compile", "cuda-graphs"],
    )
    assert plan.predicted_ms == pytest.approx(alone.predicted_ms)
    best_alone = min(s.predicted_ms for s in advice.suggestions)
    assert plan.predicted_ms < 0.99 * best_alone


def test_whatif_refuses_two_captures_of_the_step(shared_traces: Path) -> None:
    """The advisor never planned them together; whatif applied both without a word."""
    with pytest.raises(perfcast.OptionError, match="cannot be applied together"):
        perfcast.predict(
            shared_traces / "tracelens_h100_bert_small.json.gz",
            ["torch-compile:mode=reduce-overhead", "cuda-graphs:syncs=move"],
        )


def test_reasons_do_not_repeat_the_items_name(shared_traces: Path) -> None:
    advice = perfcast.advise(shared_traces / "dlrm_v100_8rank")
    for item in advice.not_applicable:
        model = item.name.split(":")[0]
        assert not item.reason.startswith(model), item.reason


def _suggestion(name: str, speedup: float) -> adv.Suggestion:
    """A bare suggestion of a 1 ms prediction, for the parts that only read its figures."""
    return adv.Suggestion(
        name=name,
        predicted_ms=1.0,
        speedup=speedup,
        gain_ms=speedup - 1.0,
        explanation="",
        assumptions=[],
        measured_share=1.0,
    )


def test_a_ranked_items_range_never_prints_as_reaching_no_gain() -> None:
    from perfcast.report.terminal import _band

    s = _suggestion("x", 1.06)
    s.speedup_low, s.speedup_high, s.band_pairs = 1.003, 1.12, 23
    assert _band(s) == "1.003-1.12× (23 pairs)"


def test_a_plan_of_a_device_move_alone_is_no_plan() -> None:
    """Only a device move ranked: no code change can join a plan (it raised IndexError)."""
    s = _suggestion("device:target=b200", 2.0)
    assert adv._plan([s], None, 2.0) is None  # type: ignore[arg-type]


def test_error_bands_bound_the_measured_speedup(mlp_advice) -> None:
    """A band e is the largest |predicted - measured| / measured: the measured speedup lies in
    s / (1 + e) .. s / (1 - e), which s(1 - e) .. s(1 + e) was not (it left out the pairs e
    came from)."""
    for s in [*mlp_advice.suggestions, *mlp_advice.uncertain]:
        if s.error_band_pct is None:
            continue
        e = s.error_band_pct / 100
        assert s.speedup_low == pytest.approx(s.speedup / (1 + e))
        assert s.speedup_high == pytest.approx(s.speedup / (1 - e))
    compiled = [
        s
        for s in [*mlp_advice.suggestions, *mlp_advice.uncertain]
        if s.name == "torch-compile:mode=reduce-overhead"
    ]
    # The recorded torch-compile pairs are all default mode: none is this model's.
    assert compiled and compiled[0].band_pairs == 0


def test_advise_on_traces_queued_before_the_profiler_and_index_copies(
    shared_traces: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from perfcast.cli.main import main

    assert main(["advise", str(shared_traces / "hta_a100_rank0_of16.json.gz")]) == 0
    out = capsys.readouterr().out
    assert "872 of them were launched before it began" in out
    # DLRM's syncs copy index tensors from the host inside aten::index: copies to pin, not
    # data-dependent shapes that would rule out CUDA graphs.
    advice = perfcast.advise(shared_traces / "dlrm_v100_8rank")
    assert any(s.name == "cuda-graphs" for s in advice.suggestions)


def test_a_trace_without_launches_is_not_said_to_be_queued_before_it(tmp_path: Path) -> None:
    """With no launch at all on a rank, every GPU task's correlation id read as "before the
    first launch"; such a trace lost its CPU side."""
    example = Path(__file__).resolve().parents[1] / "perfcast/examples/ddp_a100_rank0.json.gz"
    doc = json.loads(gzip.decompress(example.read_bytes()))
    keep = ("kernel", "gpu_memcpy", "gpu_memset")
    doc["traceEvents"] = [
        e for e in doc["traceEvents"] if e.get("cat") in keep or e.get("ph") == "M"
    ]
    path = tmp_path / "gpu_only.json"
    path.write_text(json.dumps(doc))
    assert adv._launched_before_trace(perfcast.load(path)) == 0


def test_plans_amp_note_reads_the_band_as_advise_does() -> None:
    from types import SimpleNamespace

    from perfcast.plan import _amp_confidence

    best, alt = SimpleNamespace(step_ms=100.0), SimpleNamespace(step_ms=180.0, label="dp8")
    assert _amp_confidence(best, alt) is None  # 1.8x / 1.51 > 1: advise would rank it
    close = SimpleNamespace(step_ms=120.0, label="dp8")
    assert "measure one AMP step" in (_amp_confidence(best, close) or "")


def test_blocking_copies_count_the_copy_calls_time(shared_traces: Path) -> None:
    """A pageable cudaMemcpyAsync blocks inside the call: the reason line said 0.06 ms (the
    synchronize after it) where the calls held 9.45 ms per step."""
    advice = perfcast.advise(shared_traces / "resnet50_v100_nw4_2021.json.gz")
    sync = next(s for s in advice.suggestions if s.name == "remove-host-sync")
    assert "block the CPU for 9.45 ms" in sync.explanation, sync.explanation


def test_idle_time_held_by_a_blocking_call_names_it(shared_traces: Path) -> None:
    """SGLang's prefill on MI300X: the host sat 493 ms in hipMemcpyWithStream while the GPU
    waited for an event from before the trace; the finding said neither the GPU nor a traced
    op was busy (Python between ops, I/O, ...)."""
    advice = perfcast.advise(shared_traces / "tracelens_mi300x_sglang_qwen3_8b.json.gz")
    found = " ".join(advice.findings)
    assert "blocked 493.2 ms" in found and "hipMemcpyWithStream" in found
    assert "neither the GPU nor a traced op" not in found


def test_a_blocking_call_is_weighed_against_its_own_ranks_steps(
    tmp_path: Path, shared_traces: Path
) -> None:
    """In a folder of two copies of SGLang's trace the 493 ms call was weighed against both
    ranks' steps (25%) and the finding fell back to 'neither the GPU nor a traced op'."""
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank in (0, 1):
        raw = json.loads(
            gzip.decompress(
                (shared_traces / "tracelens_mi300x_sglang_qwen3_8b.json.gz").read_bytes()
            )
        )
        raw["distributedInfo"] = {"rank": rank, "world_size": 2, "backend": "nccl"}
        (folder / f"rank{rank}.json").write_text(json.dumps(raw))
    found = " ".join(perfcast.advise(folder).findings)
    assert "blocked 493.2 ms (50% of the traced steps)" in found


def test_plan_lists_its_changes_in_the_order_whatif_applies_them() -> None:
    """The advisor kept its own ordering (PLAN_ORDER, the rest after it) while whatif now
    applies dataloader-overlap after everything: the plan shown and the plan predicted
    could disagree. Both use registry.in_plan_order."""
    from types import SimpleNamespace

    from perfcast.advisor.advisor import _in_plan_order
    from perfcast.whatif.registry import in_plan_order, parse_spec

    names = ["dataloader-overlap:workers=4", "faster-op:factor=2", "cuda-graphs", "amp"]
    shown = [s.name for s in _in_plan_order([SimpleNamespace(name=n) for n in names])]  # type: ignore[misc]
    applied = [str(s) for s in in_plan_order([parse_spec(n) for n in names])]
    assert shown == applied
    assert shown[-1] == "dataloader-overlap:workers=4"
