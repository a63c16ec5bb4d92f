"""The scale-out what-ifs (zero, tensor-parallel, pipeline-parallel) on recorded traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import perfcast
from perfcast.errors import NotApplicableError
from perfcast.graph.build import build_graph
from perfcast.sim.timeline import simulate
from perfcast.whatif.models import _parallel_common as C
from perfcast.whatif.registry import build_options, get_model

RECORDED = Path(__file__).parents[1] / "benchmarks" / "accuracy" / "recorded" / "traces" / "h100"
EXAMPLE = Path(__file__).parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"


@pytest.fixture(scope="module")
def mlp() -> perfcast.events.EventTable:
    return perfcast.load(str(RECORDED / "mlp_fused.json.gz"))


def _apply(table: object, name: str, **opts: object):
    g = build_graph(table).copy()  # type: ignore[arg-type]
    return get_model(name).apply(g, build_options(name, opts))


def _named(g, text: str) -> np.ndarray:
    idx = [i for i, n in enumerate(g.names) if text in n]
    return np.flatnonzero(np.isin(g.cols["name"], idx) & g.alive)


def test_pipeline_bubble_node_by_hand(mlp) -> None:
    g = _apply(mlp, "pipeline-parallel", pp=4, microbatches=8)
    nodes = _named(g, "pipeline bubble")
    assert nodes.size == 2 * 3  # bubble and p2p nodes, three steps
    fwd_bwd = g.cols["dur"][
        np.isin(g.cols["phase"], [1, 2]) & (g.cols["kind"] == 4) & g.alive & (g.cols["klass"] != 9)
    ]
    # Per step: bubble = (pp-1)/v x (forward + backward per micro-batch).
    per_step_mb = fwd_bwd.sum() / 3 / 8
    bubble = g.cols["dur"][nodes][::2]
    assert bubble.mean() == pytest.approx(3 * per_step_mb, rel=0.02)
    assert simulate(g).iteration_ns()[0][3] > 0


def test_pipeline_refuses_stages_it_cannot_fill(mlp) -> None:
    with pytest.raises(NotApplicableError, match="a stage needs at least one"):
        _apply(mlp, "pipeline-parallel", pp=10_000)
    with pytest.raises(NotApplicableError, match="fewer than pp=4 stages"):
        _apply(mlp, "pipeline-parallel", pp=4, microbatches=2)


def test_pipeline_interleaving_shrinks_bubble(mlp) -> None:
    plain = _apply(mlp, "pipeline-parallel", pp=4, microbatches=8)
    inter = _apply(mlp, "pipeline-parallel", pp=4, microbatches=8, virtual=2)
    b1 = plain.cols["dur"][_named(plain, "pipeline bubble")][::2].sum()
    b2 = inter.cols["dur"][_named(inter, "pipeline bubble")][::2].sum()
    assert b2 == pytest.approx(b1 / 2, rel=0.01)


def test_zero_stage3_gathers_and_scatters(mlp) -> None:
    g = _apply(mlp, "zero", gpus=8, stage=3, units=4)
    assert _named(g, "AllGather (modelled, FSDP unit)").size == 3 * 8  # fwd + bwd units
    assert _named(g, "ReduceScatter (modelled").size == 3 * 4
    r = perfcast.predict(mlp, "zero:gpus=8,stage=3,units=4")
    assert r.predicted_ms > 0 and r.memory is not None
    one = perfcast.predict(mlp, "zero:gpus=8,stage=1")
    assert one.memory.optimizer_bytes == pytest.approx(r.memory.optimizer_bytes, rel=1e-6)
    assert r.memory.weights_bytes < one.memory.weights_bytes


def test_zero_needs_parameter_sizes(tmp_path: Path) -> None:
    # The example has no shapes, but its DDP all-reduces move 97.5 MiB of fp32 gradients a
    # step: zero counts the parameters by them, as params_mb=97.5 would.
    table = perfcast.load(str(EXAMPLE))
    g = _apply(table, "zero", gpus=8, stage=3)
    assert any("gradient elements the trace's own all-reduces moved" in a for a in g.assumptions)
    measured = perfcast.predict(table, "zero:gpus=8,stage=2").predicted_ms
    given = perfcast.predict(table, "zero:gpus=8,stage=2,params_mb=97.5").predicted_ms
    assert measured == pytest.approx(given, rel=0.01)
    # bf16 gradients: the same parameters in half the bytes (counted by elements, not by
    # bytes / 4, which read 12.8 M).
    import gzip

    text = gzip.decompress(EXAMPLE.read_bytes()).replace(b'"Float"', b'"BFloat16"')
    (tmp_path / "bf16.json").write_bytes(text)
    half = _apply(perfcast.load(str(tmp_path / "bf16.json")), "zero", gpus=8, stage=3)
    assert any(a.startswith("ZeRO-3 over 8 GPUs: 25.6 M parameters") for a in half.assumptions)
    # No shapes and no sized all-reduces: nothing to count them by.
    from tests.test_models_graph import training_step

    bare = perfcast.load(str(training_step(shapes=False).write(tmp_path / "bare.json")))
    with pytest.raises(NotApplicableError, match="params_mb"):
        _apply(bare, "zero", gpus=8, stage=3)


def test_tensor_parallel_pairs_and_refusal(mlp) -> None:
    g = _apply(mlp, "tensor-parallel", tp=2)
    # 17 linear layers: 8 pairs forward and 8 backward, per step.
    assert _named(g, "modelled TP").size == 3 * 16
    said = " ".join(g.assumptions)
    assert "8 units of linear layers per step" in said and "16 collectives" in said
    with pytest.raises(NotApplicableError, match="linear"):
        _apply(perfcast.load(str(RECORDED / "r50_fused.json.gz")), "tensor-parallel", tp=2)


def test_zero_refusal_names_zero(shared_traces: Path) -> None:
    """zero shares ddp's check of the trace's own collectives; its refusal says zero."""
    table = perfcast.load(str(shared_traces / "dlrm_v100_8rank" / "worker0.json.gz"))
    with pytest.raises(NotApplicableError, match=r"^zero: the trace already runs collectives"):
        _apply(table, "zero", gpus=8, stage=2, params_mb=10)


def test_pipeline_without_shapes_says_p2p_is_not_counted(mlp, shared_traces: Path) -> None:
    """Without shapes the boundary's size is unknown: said so, not printed as 0.00 MiB."""
    table = perfcast.load(str(shared_traces / "hta_v100_ns_resolution.json.gz"))
    said = " ".join(_apply(table, "pipeline-parallel", pp=2).assumptions)
    assert "p2p not counted: the trace records no activation shapes" in said
    assert "0.00 MiB" not in said
    assert "p2p not counted (act_mb=0)" in " ".join(
        _apply(mlp, "pipeline-parallel", pp=2, act_mb=0).assumptions
    )
    g = _apply(mlp, "pipeline-parallel", pp=2, act_mb=4)
    assert "4.00 MiB per micro-batch" in " ".join(g.assumptions)


def test_tensor_parallel_sizes_mm_by_its_output(shared_traces: Path) -> None:
    """aten::mm takes the weight transposed ([in, out]): a pair's forward all-reduce is its
    output, [327680, 10] fp32 for the 267 -> 10 layer here, not [327680, 267]."""
    table = perfcast.load(str(shared_traces / "hta_sampled_128rank" / "rank-0.json.gz"))
    g = _apply(table, "tensor-parallel", tp=2)
    nodes = _named(g, "modelled TP")
    forward = g.cols["nbytes"][nodes][g.cols["phase"][nodes] == 1]
    assert 327680 * 10 * 4 in forward.tolist()
    assert 327680 * 267 * 4 not in forward.tolist()


def test_tensor_parallel_backward_all_reduces_match_forward(mlp) -> None:
    """Each pair's backward all-reduce is its input gradient: the forward one's size."""
    g = _apply(mlp, "tensor-parallel", tp=2)
    nodes = _named(g, "modelled TP")
    c = g.cols
    for it in np.unique(c["iteration"][nodes]).tolist():
        mine = nodes[c["iteration"][nodes] == it]
        fwd = c["nbytes"][mine][c["phase"][mine] == 1]
        bwd = c["nbytes"][mine][c["phase"][mine] == 2]
        assert bwd.tolist() == fwd[::-1].tolist()


def test_zero3_reduce_scatters_run_beside_the_gathers(mlp) -> None:
    """On one stream the next backward unit's gather would wait for this unit's
    reduce-scatter: FSDP and DeepSpeed give the reduce-scatters a stream of their own."""
    g = _apply(mlp, "zero", gpus=8, stage=3, units=4)
    gathers = _named(g, "AllGather (modelled, FSDP unit)")
    scatters = _named(g, "ReduceScatter (modelled")
    assert not set(g.cols["lane"][gathers].tolist()) & set(g.cols["lane"][scatters].tolist())


def test_pipeline_stage_runs_its_share_of_the_optimizers_host_work(mlp) -> None:
    """A stage holds 1/pp of the parameter tensors: a for-loop optimizer launches 1/pp."""
    from perfcast.whatif import primitives as P

    base = build_graph(mlp)
    g = _apply(mlp, "pipeline-parallel", pp=4, microbatches=8)
    host_before = base.cols["dur"][P.select(base, kind="host", phase="optimizer")].sum()
    host_after = g.cols["dur"][P.select(g, kind="host", phase="optimizer")].sum()
    assert host_before > 0
    assert host_after == pytest.approx(host_before / 4, rel=0.01)


def test_tensor_parallel_splits_q_k_v_together_and_the_output_projection_by_rows(
    shared_traces: Path,
) -> None:
    """BERT's attention has separate query, key and value projections: Megatron splits the
    three by columns and the output projection by rows, one all-reduce per attention block.
    Pairing consecutive layers made (Q, K) and (V, O) pairs: two all-reduces, one of them
    after the key projection, where no partial sum exists."""
    from perfcast.whatif.models.tensor_parallel import units_per_step

    table = perfcast.load(str(shared_traces / "tracelens_h100_bert_small.json.gz"))
    g = _apply(table, "tensor-parallel", tp=2)
    said = " ".join(g.assumptions)
    # 4 encoder layers (Q, K, V + output; intermediate + output) and the pooler/classifier.
    assert "9 units of linear layers per step" in said and "4 with several column" in said
    steps = len({it for _, it in C.groups(g)})
    assert _named(g, "modelled TP").size == 9 * steps
    assert units_per_step(build_graph(table), table.ranks[0].rank) == 9
    # A sequential MLP (Linear, ReLU, Linear, ... on one width) still pairs up.
    mlp = perfcast.load(str(RECORDED / "mlp_fused.json.gz"))
    assert units_per_step(build_graph(mlp), 0) == 8


def test_zero_waits_make_no_cycle_when_optimizer_kernels_precede_the_backward(
    shared_traces: Path,
) -> None:
    """resnet50 2021: optimizer-phase kernels launch in the middle of the backward; the
    update's wait on the last reduce-scatter went to the first of them, every reduce-scatter
    wait closed a cycle and was dropped ("contradicted the trace's own order (a damaged
    trace?)"), and the link stopped mattering: ZeRO-3 on PCIe 3 predicted as fast as NVLink."""
    table = perfcast.load(str(shared_traces / "resnet50_v100_nw4_2021.json.gz"))
    for stage in (1, 3):
        said = " ".join(_apply(table, "zero", gpus=8, stage=stage).assumptions)
        assert "contradicted" not in said
    fast = perfcast.predict(table, "zero:gpus=8,stage=3").predicted_ms
    slow = perfcast.predict(table, "zero:gpus=8,stage=3,link=pcie3").predicted_ms
    assert slow > fast


def test_collectives_queued_before_the_trace_are_not_the_steps_traffic(shared_traces) -> None:
    """MI300X ResNet, rank 0 of 8: five NCCL kernels ran before the first step (launched
    before the profiler started: no launch call, no arguments). plan called them 8.11 ms per
    step of model-parallel traffic, and ddp refused them as collectives of unknown kind."""
    import perfcast

    path = shared_traces / "tracelens_mi300x_resnet_act_ckpt_rank0.json.gz"
    table = perfcast.load(path)
    plan = perfcast.plan(table, gpus=8)
    assert not any("model-parallel" in n for n in plan.notes)
    assert perfcast.predict(table, "ddp:gpus=16").predicted_ms > 0


def test_zero_on_an_inference_step_says_so(shared_traces) -> None:
    """It said 'no parameter shapes (record_shapes=False)' of a trace recorded with shapes."""
    import perfcast

    table = perfcast.load(shared_traces / "tracelens_mi300x_sglang_qwen3_8b.json.gz")
    with pytest.raises(perfcast.NotApplicableError, match="inference step"):
        perfcast.predict(table, "zero")
