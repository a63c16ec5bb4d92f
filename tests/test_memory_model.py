"""The memory model: parts computed by hand, saved-tensor rules, recorded GPU peaks."""

from __future__ import annotations

from pathlib import Path

import pytest

import perfcast
from perfcast.memory_model import MemoryInputs, estimate, predict_peak_memory, trace_facts
from perfcast.memory_model.model import GIB, MIB, apply_changes
from tests.tracegen import TraceBuilder

RECORDED = Path(__file__).parents[1] / "benchmarks" / "accuracy" / "recorded" / "traces" / "h100"


def _mlp_trace(tmp_path: Path, batch: int = 32) -> Path:
    """One step: two Linear(100 -> 100) + GELU forward, backward with AccumulateGrad of the
    two weights and biases, a for-loop Adam step."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    t = 10.0
    for _ in range(2):
        b.op("aten::linear", t, 10, **{"Input Dims": [[batch, 100], [100, 100], [100]]})
        b.launch("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n", t + 1, 2, t + 20, 5)
        t += 30
        b.op("aten::gelu", t, 5, **{"Input Dims": [[batch, 100]]})
        b.launch("vectorized_elementwise_kernel<gelu>", t + 1, 2, t + 20, 3)
        t += 30
    for shape in ([100], [100, 100], [100], [100, 100]):
        b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", t, 8, tid=200)
        b.op("torch::autograd::AccumulateGrad", t + 1, 6, tid=200, **{"Input Dims": [shape]})
        t += 10
    b.op("Optimizer.step#Adam.step", t, 100, cat="user_annotation")
    for i in range(4):
        b.op("aten::addcdiv_", t + 1 + 10 * i, 5, **{"Input Dims": [[100, 100]]})
    return b.write(tmp_path / "mlp.json")


def test_parts_by_hand(tmp_path: Path) -> None:
    table = perfcast.load(str(_mlp_trace(tmp_path)))
    facts = trace_facts(table)
    params = 2 * (100 * 100 + 100)
    assert facts.params == params
    assert facts.optimizer == "adam" and facts.optimizer_impl == "for-loop"
    assert facts.batch == 32
    # Saved: linear inputs and GELU inputs, 32 x 100 fp32 each; linear 2 reads GELU 1's output.
    assert [s.op for s in facts.saved] == ["aten::linear", "aten::gelu"] * 2
    assert facts.activation_bytes == 4 * 32 * 100 * 4
    est = predict_peak_memory(table)
    assert est.weights_bytes == 4 * params
    assert est.grads_bytes == 4 * params
    assert est.optimizer_bytes == 8 * params  # Adam: exp_avg and exp_avg_sq, fp32
    assert est.source == "op shapes"
    # A100 (sm80) in tracegen: 8 MiB + 128 KiB of cuBLAS workspace per GEMM thread.
    assert est.workspace_bytes == 8 * MIB + 128 * 1024


def test_backward_sweep_by_hand() -> None:
    inp = MemoryInputs(param_numels=[1000], saved_bytes=[10000, 20000, 30000], optimizer="sgd")
    est = estimate(inp)
    # W 4000 + O 4000 (SGD momentum); at k=3: all 60000 saved + grads 0 + transient 30000
    # (k=2: 30000 + grads 1333 + 50000 is less; optimizer: 4000 x 3 + 8000 is less).
    assert est.peak_bytes == 4000 + 4000 + 60000 + 0 + 30000
    assert est.at == "backward"
    # Optimizer peak: W + G + O + 2 x the largest parameter x 4 bytes (for-loop temporaries).
    big = estimate(MemoryInputs(param_numels=[1_000_000], saved_bytes=[10], optimizer="adam"))
    assert big.at == "optimizer"
    assert big.peak_bytes == 4_000_000 + 4_000_000 + 8_000_000 + 8_000_000


def test_changes_by_hand() -> None:
    inp = MemoryInputs(param_numels=[1 << 20], saved_bytes=[1 << 20] * 4, optimizer="adam")
    z3 = estimate(apply_changes(inp, ["zero:stage=3,gpus=4,units=4"]))
    assert z3.weights_bytes == (4 << 20) // 4
    assert z3.grads_bytes == (4 << 20) // 4
    assert z3.optimizer_bytes == (8 << 20) // 4
    z1 = estimate(apply_changes(inp, [("zero", {"stage": 1, "gpus": 4})]))
    assert z1.weights_bytes == 4 << 20 and z1.optimizer_bytes == (8 << 20) // 4
    amp = estimate(apply_changes(inp, ["amp:dtype=bf16"]))
    assert amp.activations_bytes == 2 << 20  # fp32 -> 16-bit halves the saved bytes
    bs = estimate(apply_changes(inp, ["batch-size:factor=2"]))
    assert bs.activations_bytes == 8 << 20
    ck = estimate(apply_changes(inp, ["activation-checkpointing:regions=2"]))
    assert ck.activations_bytes == 2 << 20  # each region keeps its input only


def test_fused_optimizer_memory_assumes_the_whatifs_default_kind() -> None:
    """`whatif --apply fused-optimizer` models foreach (its default) while its memory line
    said 'optimizer: fused'."""
    inp = MemoryInputs(param_numels=[1 << 20], saved_bytes=[1 << 20], optimizer="adam")
    changed = apply_changes(inp, ["fused-optimizer"])
    assert changed.optimizer_impl == "foreach" and "optimizer: foreach" in changed.assumptions
    assert apply_changes(inp, ["fused-optimizer:kind=fused"]).optimizer_impl == "fused"


def test_an_inference_step_has_no_optimizer_and_peaks_in_forward(tmp_path: Path) -> None:
    """An inference trace's memory said 'adam (for-loop) state' and 'the peak falls in
    backward'."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.op("aten::linear", 10, 10, **{"Input Dims": [[32, 100], [100, 100], [100]]})
    b.launch("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n", 11, 2, 30, 5)
    table = perfcast.load(b.write(tmp_path / "infer.json"))
    facts = trace_facts(table)
    assert not facts.has_backward and facts.optimizer == "none"
    est = predict_peak_memory(facts, [])
    assert est.at == "forward" and est.optimizer_bytes == 0
    said = " ".join(est.assumptions)
    assert "no optimizer state" in said and "adam" not in said
    # A training step keeps its optimizer and its backward.
    train = trace_facts(perfcast.load(_mlp_trace(tmp_path)))
    assert train.has_backward and train.optimizer == "adam"


def test_fit_verdict() -> None:
    inp = MemoryInputs(param_numels=[10 * (1 << 30)], saved_bytes=[], capacity_bytes=80 * GIB)
    est = estimate(inp)
    assert est.fits is False and "DOES NOT FIT" in est.verdict()


@pytest.mark.parametrize(
    ("config", "measured_gib"),
    [("r50_foreach", 5.60), ("r50_fused", 5.60), ("r50_amp_bf16", 3.16), ("mlp_fused", 0.08)],
)
def test_recorded_h100_peaks_within_10pct(config: str, measured_gib: float) -> None:
    """torch.cuda.max_memory_allocated() of recorded runs (benchmarks/accuracy/recorded)."""
    est = predict_peak_memory(perfcast.load(str(RECORDED / f"{config}.json.gz")))
    assert abs(est.peak_gib - measured_gib) / measured_gib < 0.10


def test_whatif_changes_on_recorded_trace() -> None:
    table = perfcast.load(str(RECORDED / "r50_base.json.gz"))
    base = predict_peak_memory(table)
    amp = predict_peak_memory(table, ["amp:dtype=bf16"])
    # Measured: 5.60 GiB (fp32, warm cuDNN cache) -> 3.16 GiB with bf16 autocast.
    assert abs(amp.peak_gib - 3.16) / 3.16 < 0.10
    assert predict_peak_memory(table, ["batch-size:factor=2"]).peak_bytes > base.peak_bytes


def test_memory_events_anchor(shared_traces: Path) -> None:
    table = perfcast.load(str(shared_traces / "hta_ddp_v100_rank1_memory.json.gz"))
    est = predict_peak_memory(table)
    assert est.source == "[memory] events"
    assert est.peak_bytes == pytest.approx(est.measured_peak_bytes, rel=1e-6)
    # The measured peak moves by what a change moves in the estimate (here: batch x2 adds
    # the saved activations the shapes show once more).
    bs = predict_peak_memory(table, ["batch-size:factor=2"])
    moved = estimate(apply_changes(_inputs(table), ["batch-size:factor=2"])).peak_bytes
    assert bs.peak_bytes == est.peak_bytes + moved - estimate(_inputs(table)).peak_bytes


def _inputs(table: object) -> MemoryInputs:
    from perfcast.memory_model import inputs_from_facts

    return inputs_from_facts(trace_facts(table))


def test_whatif_result_carries_memory() -> None:
    r = perfcast.predict(str(RECORDED / "mlp_fused.json.gz"), "remove-host-sync")
    assert r.memory is not None and r.memory.peak_bytes > 0


def test_cuda_graphs_keep_the_peak_and_say_why() -> None:
    inp = MemoryInputs(param_numels=[1000], saved_bytes=[64, 32], optimizer="adam")
    out = apply_changes(inp, ["cuda-graphs", "remove-host-sync"])
    assert out.saved_bytes == inp.saved_bytes and out.param_numels == inp.param_numels
    assert [a for a in out.assumptions if a.startswith("cuda-graphs:")] == [
        a for a in out.assumptions if "private pool" in a
    ]
    assert len(out.assumptions) == len(inp.assumptions) + 1  # remove-host-sync says nothing


LIVE_H200 = RECORDED.parent / "live-h200-2026-11-26"


def test_checkpoint_regions_have_equal_op_counts() -> None:
    # A CNN-like step: early layers hold more bytes. Three regions of two saved tensors each
    # keep their first tensor; backward recomputes the largest region (the first).
    inp = MemoryInputs(param_numels=[1], saved_bytes=[64, 64, 32, 32, 16, 16], optimizer="none")
    ck = apply_changes(inp, ["activation-checkpointing:regions=3"])
    assert ck.saved_bytes == [64, 32, 16]
    assert ck.recompute_bytes == [128, 64, 32]


def test_repeated_blocks_are_found_by_op_names_and_shapes() -> None:
    from perfcast.memory_model.model import Blocks, repeated_blocks

    # embedding, add | norm, linear, gelu, add (x3) | norm, linear, loss
    tokens = [1, 2, 3, 4, 5, 2, 3, 4, 5, 2, 3, 4, 5, 2, 3, 4, 6]
    saved_at = [2, 3, 4, 6, 7, 8, 10, 11, 12, 14, 15, 16]
    saved = [10] * len(saved_at)
    # Per block (shortest blocks), aligned on the norm (the first op that saves); the
    # trailing norm and linear repeat the pattern but do not complete a block.
    assert repeated_blocks(tokens, None, saved, saved_at) == Blocks(2, 4, 3)
    assert repeated_blocks(tokens, 3, saved, saved_at) == Blocks(2, 4, 3)
    assert repeated_blocks(tokens, 4, saved, saved_at) is None  # only 3 blocks
    # The blocks must hold at least half the saved bytes to be what is checkpointed.
    heavy_outside = [1000] + [10] * (len(saved_at) - 1)
    tail = [*tokens[:2], 7, *tokens[3:]]  # first block differs: 2 repeats left
    assert repeated_blocks(tail, None, heavy_outside, saved_at) is None


def _block_facts_trace(tmp_path: Path, zero_grad_at: float | None) -> Path:
    """Two identical linear+gelu blocks between an input layer and a loss; the optimizer's
    zero_grad annotated where the loop calls it."""
    b = TraceBuilder()
    b.step(1, 0, 2000)
    ops = [("aten::linear", [[64, 100], [100, 100], [100]])]
    for _ in range(2):
        ops += [
            ("aten::layer_norm", [[64, 100], [100], [100], [100]]),
            ("aten::linear", [[64, 100], [100, 100], [100]]),
            ("aten::gelu", [[64, 100]]),
            ("aten::add", [[64, 100], [64, 100], []]),
        ]
    ops.append(("aten::cross_entropy_loss", [[64, 100], [64]]))
    for i, (op, dims) in enumerate(ops):
        b.op(op, 10 + 20 * i, 10, **{"Input Dims": dims})
    if zero_grad_at is not None:
        b.op("Optimizer.zero_grad#Adam.zero_grad", zero_grad_at, 5, cat="user_annotation")
    b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 500, 8, tid=2)
    b.op("torch::autograd::AccumulateGrad", 501, 6, tid=2, **{"Input Dims": [[100, 100]]})
    return b.write(tmp_path / "t.json")


def test_gradients_alive_through_forward_when_zero_grad_follows_it(tmp_path: Path) -> None:
    """The loop `loss = model(x); opt.zero_grad(); loss.backward()` keeps the last step's
    gradients through forward; `opt.zero_grad()` first does not."""
    after = trace_facts(perfcast.load(str(_block_facts_trace(tmp_path, 400))))
    before = trace_facts(perfcast.load(str(_block_facts_trace(tmp_path, 1))))
    none = trace_facts(perfcast.load(str(_block_facts_trace(tmp_path, None))))
    assert after.grads_live_in_forward
    assert not before.grads_live_in_forward and not none.grads_live_in_forward
    p_after = predict_peak_memory(after)
    p_before = predict_peak_memory(before)
    assert p_after.at == "forward"
    assert p_after.peak_bytes > p_before.peak_bytes
    # cross_entropy keeps its log_softmax result, the size of the logits.
    assert after.saved[-1].op == "aten::cross_entropy_loss"
    assert after.saved[-1].nbytes == 64 * 100 * 4


def test_checkpointing_keeps_block_inputs_and_what_is_outside(tmp_path: Path) -> None:
    facts = trace_facts(perfcast.load(str(_block_facts_trace(tmp_path, 400))))
    from perfcast.memory_model import inputs_from_facts

    ck = apply_changes(inputs_from_facts(facts), ["activation-checkpointing"])
    x = 64 * 100 * 4
    # input layer's input, the two block inputs (the first is the input layer's output,
    # which nothing else kept), the loss's log_softmax result
    assert ck.saved_bytes == [x, x, x, x]
    assert ck.recompute_bytes is not None and ck.recompute_bytes[1] > 0
    assert "2 repeated blocks" in ck.assumptions[-1]


@pytest.mark.parametrize(("workload", "measured_gib"), [("transformer", 0.5569), ("mlp", 0.3023)])
def test_checkpointing_peak_matches_the_h200_rows(workload: str, measured_gib: float) -> None:
    """Per-block checkpointing on the live H200 rows (recorded/README.md): the variant's
    peak, measured less what the baseline held in the same process (its cuBLAS workspace
    included), within 5% of the prediction less that workspace."""
    table = perfcast.load(str(LIVE_H200 / f"{workload}.activation-checkpointing.json.gz"))
    m = predict_peak_memory(table, ["activation-checkpointing:regions=4"])
    predicted = (m.peak_bytes - m.workspace_bytes) / GIB
    assert abs(predicted - measured_gib) / measured_gib < 0.05


def test_autocast_dtypes_follow_the_op_lists() -> None:
    """Under autocast a GEMM saves its 16-bit input copy, a norm its fp32 input, dropout a
    one-byte mask, and an activation function the dtype of what it reads."""
    facts = trace_facts(perfcast.load(str(LIVE_H200 / "transformer.amp.json.gz")))
    by_op: dict[str, set[float]] = {}
    for s in facts.saved:
        by_op.setdefault(s.op, set()).add(s.autocast_nbytes / s.nbytes)
    assert by_op["aten::linear"] == {0.5}
    assert by_op["aten::layer_norm"] == {1.0}
    assert by_op["aten::dropout"] == {1.0}
    assert by_op["aten::gelu"] == {0.5}  # reads fc1's 16-bit output


def test_autocast_activation_after_a_norm_stays_fp32(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.step(1, 0, 1000)
    for i, (op, dims) in enumerate(
        [
            ("aten::linear", [[32, 100], [100, 100], [100]]),
            ("aten::layer_norm", [[32, 100], [100], [100], [100]]),
            ("aten::gelu", [[32, 100]]),
            ("aten::linear", [[32, 100], [100, 100], [100]]),
        ]
    ):
        b.op(op, 10 + 30 * i, 10, **{"Input Dims": dims})
    b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 200, 8, tid=2)
    b.op("torch::autograd::AccumulateGrad", 201, 6, tid=2, **{"Input Dims": [[100, 100]]})
    facts = trace_facts(perfcast.load(str(b.write(tmp_path / "t.json"))))
    ratios = [(s.op, s.autocast_nbytes / s.nbytes) for s in facts.saved]
    assert ("aten::gelu", 1.0) in ratios  # LayerNorm hands on fp32
    assert ("aten::layer_norm", 1.0) in ratios
    assert all(r == 0.5 for op, r in ratios if op == "aten::linear")


def test_autocast_leaves_embedding_tables_uncast() -> None:
    table = perfcast.load(str(LIVE_H200 / "dlrm.amp.json.gz"))
    facts = trace_facts(table)
    assert facts.embedding_param_numel > 0.9 * facts.params  # 26 tables: most parameters
    base = predict_peak_memory(table)
    amp = predict_peak_memory(table, ["amp:dtype=bf16"])
    # Measured on the H200: 2.79 GiB without and with autocast; a copy of every table
    # would have added 0.33 GiB.
    assert abs(amp.peak_gib - base.peak_gib) < 0.02


def test_a_recomputed_region_holds_its_tensors_and_the_worst_layers_buffers() -> None:
    from perfcast.memory_model.model import _region_peak

    # Layer 2 of [4, 4]: both tensors, its own (4) and its output's gradient, which past
    # the region's last layer is the region's output (2).
    assert _region_peak([4, 4], 2) == 4 + 4 + 4 + 2
    # A big early layer: its buffers and the next layer's.
    assert _region_peak([10, 1, 1], 1) == 10 + 10 + 1


def test_checkpointing_twice_changes_nothing_more(tmp_path: Path) -> None:
    facts = trace_facts(perfcast.load(str(_block_facts_trace(tmp_path, 400))))
    from perfcast.memory_model import inputs_from_facts

    inp = inputs_from_facts(facts)
    once = estimate(apply_changes(inp, ["activation-checkpointing"])).peak_bytes
    twice = estimate(apply_changes(inp, ["activation-checkpointing"] * 2)).peak_bytes
    assert once == twice


def test_a_region_never_keeps_more_than_it_would_save() -> None:
    """A region starting at a view of a large buffer keeps no copy of it (found on an A100
    trace whose region edge fell on an as_strided of a 1.7 GB parameter buffer)."""
    from perfcast.memory_model.facts import ForwardOps

    fwd = ForwardOps(
        tokens=[1, 2, 3, 4, 5, 6],
        input_bytes=[10, 10, 10**9, 10, 10, 10],
        input_bytes_autocast=[10] * 6,
        input_saved=[False] * 6,
    )
    inp = MemoryInputs(
        param_numels=[1], saved_bytes=[10, 10, 10], optimizer="none", forward=fwd,
        saved_at=[0, 3, 5],
    )  # fmt: skip
    before = estimate(inp).peak_bytes
    for regions in (2, 3):
        ck = apply_changes(inp, [f"activation-checkpointing:regions={regions}"])
        assert max(ck.saved_bytes) <= 20
        assert estimate(ck).peak_bytes <= before


def test_hand_made_saved_positions_out_of_range_fall_back() -> None:
    from perfcast.memory_model.facts import ForwardOps

    fwd = ForwardOps(tokens=[1, 2], input_bytes=[4, 4], input_bytes_autocast=[2, 2],
                     input_saved=[False, False])  # fmt: skip
    inp = MemoryInputs(param_numels=[1], saved_bytes=[4, 4], optimizer="none", forward=fwd,
                       saved_at=[0, 7])  # fmt: skip
    ck = apply_changes(inp, ["activation-checkpointing:regions=2"])
    assert ck.saved_bytes == [4, 4] and ck.recompute_bytes == [4, 4]


def test_an_inference_step_keeps_no_activations_for_a_backward(shared_traces) -> None:
    """SGLang's Qwen3-8B prefill on MI300X: every forward output was counted as a saved
    activation (145 of them, 26.5 GiB) though no backward reads them."""
    import perfcast
    from perfcast.memory_model import trace_facts

    table = perfcast.load(shared_traces / "tracelens_mi300x_sglang_qwen3_8b.json.gz")
    facts = trace_facts(table)
    assert not facts.has_backward and not facts.saved
    assert any("no backward pass (inference)" in n for n in facts.notes)
    r = perfcast.predict(table, "tensor-parallel")
    assert r.memory is None
    assert any("an inference step (no backward)" in n for n in r.notes)
