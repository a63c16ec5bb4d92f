"""Plan search: formulas by hand (bubble, bus factors, Korthikanti activations), published
rows, the search, the CLI and its errors."""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import perfcast
from perfcast.analysis.real_step import real_world
from perfcast.cli.main import main
from perfcast.graph.build import build_graph
from perfcast.hardware.interconnects import LinkSpec
from perfcast.hardware.network import collective_time_s, group_busbw_gbs, make_cluster
from perfcast.plan import plan_model, plan_trace
from perfcast.plan.analytic import AnalyticWorkload, StageTimes
from perfcast.plan.cost import evaluate
from perfcast.plan.desc import PRESETS, ModelDesc, load_desc, megatron_gpt
from perfcast.plan.plans import Plans
from tests.tracegen import TraceBuilder

ROOT = Path(__file__).parents[1]
EXAMPLE = ROOT / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"
RECORDED = ROOT / "benchmarks" / "accuracy" / "recorded" / "traces" / "h100"


class _Flat:
    """A workload whose micro-batch takes 1 s forward and 2 s backward on every stage."""

    n_layers = 8
    source = "test"

    def stage_times(self, p: Plans) -> StageTimes:
        one = np.ones(len(p))
        return StageTimes(one, 2 * one, 0 * one, 0 * one, 0 * one)

    def p2p_bytes(self, p: Plans) -> np.ndarray:
        return np.zeros(len(p))

    def params_stage(self, p: Plans) -> np.ndarray:
        return np.zeros(len(p))

    def bytes_per_param(self) -> tuple[int, int, int]:
        return 4, 4, 8

    def optimizer_s(
        self, params: np.ndarray, gpu_lag_s: object = 0.0, tensor_share: object = 1.0
    ) -> np.ndarray:
        return np.zeros_like(params)

    def act_bytes_stage(self, p: Plans) -> np.ndarray:
        return np.ones(len(p))

    def transient_bytes(self, p: Plans) -> np.ndarray:
        return np.zeros(len(p))


def test_1f1b_bubble_by_hand() -> None:
    cl = make_cluster("a100-80gb")
    p = Plans(
        dp=[1, 1, 1],
        tp=[1, 1, 1],
        pp=[4, 4, 1],
        mb=[1, 1, 1],
        m=[8, 8, 8],
        v=[1, 2, 1],
        zero=[0, 0, 0],
        ckpt=[0, 0, 0],
        sp=[0, 0, 0],
        amp=[0, 0, 0],
    )
    c = evaluate(_Flat(), p, cl)
    # 1F1B: (m + p - 1) slots of 3 s; bubble (p-1)/(m+p-1).
    assert c.pipeline_s[0] == pytest.approx((8 + 3) * 3)
    assert c.bubble_frac[0] == pytest.approx(3 / 11)
    # Interleaved over v=2: (p-1)/v slots.
    assert c.pipeline_s[1] == pytest.approx((8 + 1.5) * 3)
    assert c.bubble_frac[1] == pytest.approx(1.5 / 9.5)
    assert c.pipeline_s[2] == pytest.approx(8 * 3) and c.bubble_frac[2] == 0
    # 1F1B keeps min(m, pp) micro-batches in flight on the first stage.
    assert c.activations_b[0] == 4 and c.activations_b[2] == 1


def _ideal_cluster():
    link = LinkSpec("test", 100.0, 0.0, "test")
    return replace(
        make_cluster("a100-80gb"),
        intra=link,
        inter=link,
        intra_eff=1.0,
        inter_eff=1.0,
        base_us=0.0,
        nvls=False,
        nics_per_node=8,
    )


def test_ring_bus_factors_by_hand() -> None:
    cl = _ideal_cluster()
    n, nbytes = 8, 1e9
    bus = 100e9
    ar = collective_time_s(cl, "allreduce", nbytes, n)
    assert float(ar) == pytest.approx(2 * (n - 1) / n * nbytes / bus)
    ag = collective_time_s(cl, "allgather", nbytes, n)
    assert float(ag) == pytest.approx((n - 1) / n * nbytes / bus)
    assert float(collective_time_s(cl, "reducescatter", nbytes, n)) == pytest.approx(float(ag))
    assert float(collective_time_s(cl, "allreduce", nbytes, 1)) == 0.0
    # NVLS inside a node: the switch reduces, N bytes each way.
    nvls = collective_time_s(replace(cl, nvls=True), "allreduce", nbytes, n, algorithm="auto")
    assert float(nvls) == pytest.approx(nbytes / bus)


def test_groups_across_nodes_are_nic_bound() -> None:
    cl = make_cluster("a100-80gb", intra="nvlink3", inter="ib-hdr")
    # One GPU per node: one 25 GB/s NIC at 90%; eight per node: eight NICs, capped by NVLink.
    assert float(group_busbw_gbs(cl, 16, 1)) == pytest.approx(25 * 0.9)
    assert float(group_busbw_gbs(cl, 16, 8)) == pytest.approx(min(300 * 0.8, 8 * 25 * 0.9))
    assert float(group_busbw_gbs(cl, 8, 8)) == pytest.approx(300 * 0.8)


def test_parameter_counts() -> None:
    # Calculon's parameter calculator: gpt3-175B 174.616 G, megatron-22B 22.074 G, 1T 1.008 T.
    assert PRESETS["gpt-175b"].params() == pytest.approx(174.616e9, rel=1e-4)
    assert PRESETS["gpt-22b"].params() == pytest.approx(22.074e9, rel=1e-4)
    assert PRESETS["gpt-1t"].params() == pytest.approx(1.008e12, rel=1e-3)
    assert PRESETS["llama3-8b"].params() == pytest.approx(8.03e9, rel=1e-3)


def test_korthikanti_activation_formula() -> None:
    """Activation bytes per layer (Korthikanti et al. 2022, Table 2): sbh(34 + 5as/h) without
    parallelism, sbh(10 + 24/t + 5as/ht) with TP, sbh/t (34 + 5as/h) with TP + SP, 2sbh with
    full recomputation."""
    d = megatron_gpt("t", layers=4, hidden=1024, heads=16)
    w = AnalyticWorkload(d, make_cluster("a100-80gb"))
    s, b, h, a = d.seq, 2, d.hidden, d.heads

    def act(tp: int, sp: int, ckpt: int) -> float:
        p = Plans.single(tp=tp, pp=4, mb=b, sp=sp, ckpt=ckpt)  # one layer per stage
        return float(w.act_bytes_stage(p)[0])

    sbh = s * b * h
    assert act(1, 0, 0) == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert act(4, 0, 0) == pytest.approx(sbh * (10 + 24 / 4 + 5 * a * s / (h * 4)))
    assert act(4, 1, 0) == pytest.approx(sbh / 4 * (34 + 5 * a * s / h))
    assert act(4, 1, 1) == pytest.approx(sbh / 4 * 34)  # selective: no 5as/h term
    assert act(1, 0, 2) == pytest.approx(2 * sbh)


def test_published_rows_within_bounds() -> None:
    """The README's published-table numbers, recomputed: a ratchet on the model."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_published import DATA, korthikanti, megatron

    data = json.loads(DATA.read_text())
    ko = korthikanti(data["korthikanti_iteration_times"])
    assert max(r["error_pct"] for r in ko) <= 10.0
    meg = megatron(data["megatron_weak_scaling"])
    errs = [r["error_pct"] for r in meg]
    # With the authors' micro-batches, schedules and DDP (examples/sc21/run_table_1.sh) the
    # model is 9-19% optimistic on the 2021 runs (median 14.2%, max 18.5%): the goal of 10%
    # is not met, and this bound only keeps it from getting worse.
    assert statistics.median(errs) <= 14.5
    assert max(errs) <= 19.0


def test_same_pipelines_in_both_papers_ran_faster_in_2022() -> None:
    """The 2021 table and Korthikanti's share two pipelines (530B and 1T, same tp, pp,
    micro-batch, interleaving and micro-batches per pipeline): the 2022 runs achieved 8.7%
    and 10.3% more, which bounds how close one model can be to both tables."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_published import DATA, same_pipelines

    data = json.loads(DATA.read_text())
    same = same_pipelines(data["megatron_weak_scaling"], data["korthikanti_iteration_times"])
    assert [r["model"] for r in same] == ["530B (MT-NLG)", "1T"]
    assert [r["dp_2021"] for r in same] == [9, 6]
    assert [round(r["faster_pct"], 1) for r in same] == [10.3, 8.7]


def test_recorded_memory_rows_are_the_gpu_truth_runs_and_the_live_baselines() -> None:
    """The memory table scores gpu-truth configurations by their own traces and each live
    machine's baselines by theirs; live variants belong to the what-if table (a row without a
    trace is a torch.compile run, as its note says)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_published import recorded_memory

    rows = {r["config"]: r for r in recorded_memory()}
    unscored = sorted(c for c, r in rows.items() if r["predicted_gib"] is None)
    assert unscored == ["H100 mlp_compile", "H100 r50_compile"]
    live = [c for c in rows if c.endswith(" baseline")]
    assert sorted(live) == sorted(
        [f"H100 {w} baseline" for w in ("cnn", "transformer", "mlp")]
        + [f"H200 {w} baseline" for w in ("cnn", "transformer", "mlp", "dlrm")]
    )
    # Steady steps are within 10% of the model; a first step in cuDNN's benchmark mode is not,
    # and its note says why.
    for name in ("H100 r50_foreach", "H100 transformer baseline", "H200 dlrm baseline"):
        assert rows[name]["error_pct"] <= 10.0
    assert "autotuning" in rows["H100 cnn baseline"]["note"]


def test_search_is_fast_and_sorted() -> None:
    r = plan_model("gpt-175b", 1024, gpu="a100-80gb", global_batch=1536, top=20)
    assert r.evaluated > 1000
    assert r.search_ms < 5000
    steps = [row.step_ms for row in r.best]
    assert steps == sorted(steps) or all(b >= a * 0.99 for a, b in itertools.pairwise(steps))
    assert all(row.peak_gib <= r.capacity_gib for row in r.best)
    assert r.fitting < r.evaluated  # some plans do not fit in 80 GiB


def test_memory_limit_prunes() -> None:
    small = plan_model("gpt-22b", 8, gpu="a100-80gb", global_batch=8, memory_gb=20)
    assert small.best == [] and "no plan fits" in small.notes[0]


def test_plan_trace_example() -> None:
    r = plan_trace(perfcast.load(str(EXAMPLE)), 16, top=3)
    assert r.best and r.baseline is not None
    # The traced configuration (2-GPU DDP) is reproduced from its own measurements.
    assert r.baseline.step_ms == pytest.approx(222.4, rel=0.05)
    assert any("no input shapes" in a for a in r.assumptions)


def test_plan_keeps_the_traced_configuration_only_on_as_many_gpus() -> None:
    """The example ran on 2 GPUs: planned for 1, its 2-GPU throughput is no plan to keep."""
    r = plan_trace(perfcast.load(str(EXAMPLE)), 1, top=3)
    assert r.baseline is not None and r.best
    assert r.baseline.samples_per_s > r.best[0].samples_per_s  # two GPUs' samples/s
    assert not any("keep it" in n for n in r.notes)


def test_plan_says_which_model_parallel_traffic_no_plan_models(shared_traces: Path) -> None:
    r = plan_trace(perfcast.load(str(shared_traces / "dlrm_v100_8rank")), 8, top=1)
    said = " ".join(r.assumptions)
    assert "also runs alltoall" in said and "no plan models" in said
    # A V100 has no bf16 math: its AMP plans are fp16 (they were left out, with a hint to
    # try dtype=fp16, an option plan does not have).
    assert "AMP plans (fp16 autocast)" in said and "no AMP plans" not in said


def test_plan_trace_recorded_reproduces_its_step() -> None:
    table = perfcast.load(str(RECORDED / "r50_fused.json.gz"))
    r = plan_trace(table, 8, top=3)
    measured = np.median([it.dur_ns for it in table.iterations]) / 1e6
    assert r.baseline is not None
    assert r.baseline.step_ms == pytest.approx(measured, rel=0.05)
    assert r.best[0].plan["dp"] * r.best[0].plan["tp"] * r.best[0].plan["pp"] == 8
    # A CNN's plans say their memory is a steady step's (cuDNN autotuning peaks higher).
    assert any("cudnn.benchmark" in a for a in r.assumptions)


@pytest.mark.parametrize("name", ["r50_base", "r50_bs128", "mlp_base"])
def test_plan_trace_reproduces_the_step_without_the_profiler(name: str) -> None:
    """The traced configuration's plan is the step `whatif` starts from (profiler cost taken
    out), and, with the cost kept, the traced step. A for-loop Adam's host time runs while
    the GPU still works through backward: summing the two put r50_bs128 21% over its step."""
    table = perfcast.load(str(RECORDED / f"{name}.json.gz"))
    graph = build_graph(table)
    rw = real_world(graph)
    real = plan_trace(table, 1, top=1)
    traced = plan_trace(table, 1, top=1, keep_profiler_cost=True)
    assert real.baseline is not None and traced.baseline is not None
    iters = [(s.traced_ms, s.real_ms) for s in rw.steps]
    traced_median = float(np.median([t for t, _ in iters]))
    real_median = float(np.median([r for _, r in iters]))
    assert traced.baseline.step_ms == pytest.approx(traced_median, rel=0.02)
    assert real.baseline.step_ms == pytest.approx(real_median, rel=0.02)
    assert any("without the profiler" in a for a in real.assumptions)


def test_plan_amp_follows_the_amp_whatif() -> None:
    """AMP plans scale by the AMP what-if's own per-kernel model on the trace: on the fp32
    ResNet-50 it predicts about 1.1x, where the datasheet's bf16/tf32 peak ratio made the
    plan's AMP row 1.5x; a trace already in bf16 gets no AMP plans, and says why."""
    table = perfcast.load(str(RECORDED / "r50_base.json.gz"))
    rows = {r.label: r.step_ms for r in plan_trace(table, 1, top=50).best}
    gain = rows["dp1 tp1 pp1 mb64x1"] / rows["dp1 tp1 pp1 mb64x1 AMP"]
    whatif = perfcast.predict(table, "amp:dtype=bf16").speedup
    assert gain == pytest.approx(whatif, abs=0.1)
    bf16 = plan_trace(perfcast.load(str(RECORDED / "r50_amp_bf16.json.gz")), 1, top=50)
    assert not any(r.plan["amp"] for r in bf16.best)
    # A lead smaller than the AMP model's measured error is flagged, as advise leaves it
    # unranked, with the best plan without AMP beside it.
    eight = plan_trace(table, 8, top=3)
    assert eight.best[0].plan["amp"]
    assert any("best without it (dp8" in n and "measure one AMP step" in n for n in eight.notes)


def test_collectives_stay_inside_nodes_of_any_size_and_use_nvls() -> None:
    """Tensor-parallel groups up to `gpus_per_node` are intra-node (not capped at 8), and the
    all-reduce runs as NVLS where the cluster has it (the header says so)."""
    desc = load_desc("gpt-22b")
    p = Plans.single(dp=1, tp=16, mb=1, m=1)
    t8 = AnalyticWorkload(desc, make_cluster("h100", gpus_per_node=8)).stage_times(p).tp_comm
    t16 = AnalyticWorkload(desc, make_cluster("h100", gpus_per_node=16)).stage_times(p).tp_comm
    assert float(t16[0]) < 0.75 * float(t8[0])  # NVLink, not the NICs (it was equal)
    p8 = Plans.single(dp=1, tp=8, mb=1, m=1)
    nvls = make_cluster("h100")
    ring = replace(nvls, nvls=False)
    assert nvls.nvls and "NVLS" in nvls.describe()
    on = AnalyticWorkload(desc, nvls).stage_times(p8).tp_comm
    off = AnalyticWorkload(desc, ring).stage_times(p8).tp_comm
    assert float(on[0]) < float(off[0])


def test_plan_trace_searches_the_traced_batch_and_says_when_nothing_beats_it(
    shared_traces: Path,
) -> None:
    """A batch of 10 per GPU has no power-of-two micro-batch above 2: the traced
    configuration must be among the plans, or every plan found is slower than what the
    user runs (the best was once a 58%-bubble pipeline at 57% of the traced throughput)."""
    table = perfcast.load(str(shared_traces / "tracelens_mi300x_resnet_act_ckpt_rank0.json.gz"))
    r = plan_trace(table, 8, top=3)
    assert r.baseline is not None and r.best
    assert r.best[0].plan["mb"] == 10 and r.best[0].plan["pp"] == 1
    assert r.best[0].samples_per_s >= r.baseline.samples_per_s * 0.995
    assert not any("predicted faster than every plan" in n for n in r.notes)


def test_plan_trace_of_unknown_parameters_says_dp_looks_free(shared_traces: Path) -> None:
    r = plan_trace(perfcast.load(str(shared_traces / "hta_v100_ns_resolution.json.gz")), 16)
    assert any("data parallelism looks free" in n for n in r.notes)


def test_optimizer_state_follows_the_traced_class() -> None:
    from perfcast.memory_model.facts import trace_facts

    facts = trace_facts(perfcast.load(str(EXAMPLE)))  # Optimizer.step#SGD.step, foreach ops
    assert (facts.optimizer, facts.optimizer_impl) == ("sgd", "foreach")


def test_load_desc_errors(tmp_path: Path) -> None:
    assert load_desc('{"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 100}').layers == 2
    with pytest.raises(perfcast.errors.PerfcastError, match="unknown model"):
        load_desc("no-such-model")
    # Inline JSON with a typo is a JSON error, not an unknown model.
    with pytest.raises(perfcast.errors.PerfcastError, match=r"not valid JSON .*line 1 column 2"):
        load_desc("{bad")
    with pytest.raises(perfcast.errors.PerfcastError):
        load_desc('{"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 100, "x": 1}')
    with pytest.raises(perfcast.errors.PerfcastError):
        ModelDesc("m", 2, 65, 4, 16, 100)


def test_cli_plan_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLE), "--gpus", "8", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "plans evaluated" in out and "assumptions" in out
    assert main(["plan", str(EXAMPLE), "--gpus", "8", "--json", "-q"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpus"] == 8 and data["best"]


def test_cli_plan_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "plan",
                "--model",
                "gpt-1.7b",
                "--gpus",
                "32",
                "--gpu",
                "a100-80gb",
                "--global-batch",
                "512",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["best"][0]["tokens_per_s"] > 0


def test_cli_plan_nics_per_node(capsys: pytest.CaptureFixture[str]) -> None:
    """Fewer NICs than GPUs per node: the cluster says so, and data parallelism across nodes
    gets no faster for it."""
    steps = {}
    for nics in ("8", "2"):
        args = ["plan", "--model", "gpt-1.7b", "--gpus", "64", "--gpu", "a100-80gb", "--json"]
        assert main([*args, "--nics-per-node", nics, "-q"]) == 0
        data = json.loads(capsys.readouterr().out)
        steps[nics] = data["best"][0]["step_ms"]
        if nics == "2":
            assert "2 x ib-hdr" in data["cluster"]
    assert steps["2"] >= steps["8"]
    assert make_cluster("h100", nics_per_node=4).nic_gbs_per_gpu == pytest.approx(
        make_cluster("h100").nic_gbs_per_gpu / 2
    )
    with pytest.raises(perfcast.errors.PerfcastError):
        make_cluster("h100", nics_per_node=0)


@pytest.mark.parametrize(
    "args",
    [
        ["--gpus", "0"],
        ["--gpus", "8", "--nics-per-node", "0"],
        ["--gpus", "8", "--memory-gb", "-1"],
        ["--gpus", "8", "--model", "gpt-1.7b"],  # both a trace and --model
        ["--gpus", "8", "--gpu", "no-such-gpu"],
        ["--gpus", "8", "--host-us-per-kernel", "20"],  # host time is the trace's own
    ],
)
def test_cli_plan_bad_input(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLE), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perfcast: error:") and "Traceback" not in err


def test_cli_plan_cpu_only_and_no_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cpu = TraceBuilder(device=None)
    cpu.step(1, 0, 100)
    cpu.op("aten::add", 10, 5)
    path = cpu.write(tmp_path / "cpu.json")
    assert main(["plan", str(path), "--gpus", "8", "--gpu", "h100"]) == 2
    assert "no GPU work" in capsys.readouterr().err
    nostep = TraceBuilder()
    nostep.op("aten::mm", 0, 10)
    nostep.launch("gemm", 1, 2, 5, 10)
    path = nostep.write(tmp_path / "nostep.json")
    assert main(["plan", str(path), "--gpus", "8"]) == 2
    assert "ProfilerStep" in capsys.readouterr().err


def test_plan_multi_rank_folders(shared_traces: Path) -> None:
    r = plan_trace(perfcast.load(str(shared_traces / "dlrm_v100_8rank")), 16, top=3)
    assert r.best
    r = plan_trace(
        perfcast.load(str(shared_traces / "hta_sampled_128rank")), 128, gpu="a100-80gb", top=3
    )
    assert r.best


def _one_step(device: dict | None, tmp_path: Path, name: str) -> Path:
    b = TraceBuilder(device=device)
    b.step(1, 0, 1000)
    b.op("aten::mm", 10, 50, **{"Input Dims": [[64, 64], [64, 64]]})
    b.launch("gemm", 20, 5, 30, 200)
    return b.write(tmp_path / name)


def test_plan_identifies_the_traced_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ROCm builds that call every GPU "AMD Radeon Graphics" are known by their compute units
    and memory; a named variant stands in for its base part; a CPU-only trace says so first."""
    radeon = {"id": 0, "name": "AMD Radeon Graphics", "numSms": 104,
              "totalGlobalMem": 68702699520, "warpSize": 64}  # fmt: skip
    r = plan_trace(perfcast.load(str(_one_step(radeon, tmp_path, "mi250.json"))), 8, top=1)
    assert r.best and any("those of the MI250-GCD" in a for a in r.assumptions)
    h800 = {"id": 0, "name": "NVIDIA H800", "totalGlobalMem": 85899345920, "numSms": 132}
    r = plan_trace(perfcast.load(str(_one_step(h800, tmp_path, "h800.json"))), 8, top=1)
    assert any("H800 is the H100 SXM" in a for a in r.assumptions)
    unknown = {"id": 0, "name": "Imaginary GPU 9000", "numSms": 7}
    path = _one_step(unknown, tmp_path, "unknown.json")
    assert main(["plan", str(path), "--gpus", "8"]) == 2
    assert "'Imaginary GPU 9000' is not in perfcast's device table" in capsys.readouterr().err
    cpu = TraceBuilder(device=None)
    cpu.step(1, 0, 100)
    cpu.op("aten::add", 10, 5)
    path = cpu.write(tmp_path / "cpu.json")
    assert main(["plan", str(path), "--gpus", "8"]) == 2  # no --gpu, no name: no GPU work
    assert "no GPU work" in capsys.readouterr().err


def test_plan_on_the_rocm_trace_that_calls_its_gpu_radeon(shared_traces: Path) -> None:
    """HTA's MI250 trace names every GPU "AMD Radeon Graphics": planned as the MI250 GCD its
    104 compute units and 64 GiB say it is (it was refused before)."""
    r = plan_trace(perfcast.load(str(shared_traces / "hta_mi250_minitoy_train.json.gz")), 16)
    assert r.best
    assert any("those of the MI250-GCD" in a for a in r.assumptions)


def test_one_ranks_graph_of_a_folder_is_that_ranks_files(shared_traces: Path) -> None:
    """plan replays only the rank it plans: `build_graph(table, ranks=)` of a folder gives the
    graph (and the replayed steps) of that rank's file loaded alone."""
    from perfcast.sim.timeline import simulate

    folder = perfcast.load(str(shared_traces / "hta_sampled_128rank"))
    alone = perfcast.load(str(shared_traces / "hta_sampled_128rank" / "rank-0.json.gz"))
    part = build_graph(folder, ranks={folder.ranks[0].rank})
    whole = build_graph(alone)
    assert len(part.lanes) == len(whole.lanes) and part.alive.sum() == whole.alive.sum()
    steps = [(n, s) for _, n, _, s in simulate(part).iteration_ns()]
    assert steps == [(n, s) for _, n, _, s in simulate(whole).iteration_ns()]


def test_vtrain_measured_runs_within_bounds() -> None:
    """vTrain's 109 measured Megatron-LM runs: a ratchet on the plan model's error and on
    how well it orders each model's configurations (numbers in the README)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_published import DATA, vtrain

    res = vtrain(json.loads(DATA.read_text())["vtrain_multi_node"])
    assert len(res["runs"]) == 109
    assert statistics.median(r["error_pct"] for r in res["runs"]) <= 8.0
    for m in res["models"]:
        assert m["spearman"] >= 0.6, m["model"]
        # The configuration ranked first runs within 5% of the measured fastest.
        assert m["regret_pct"] <= 5.0, m["model"]


def test_analytic_host_time_floors_each_micro_batch(capsys: pytest.CaptureFixture[str]) -> None:
    """The analytic model's host time (kernels x host cost) sets a floor under each
    micro-batch: no effect where the GPU work is longer, the step once host-bound grows
    with the cost and never shrinks, and the plan says it is host-bound."""
    cl = make_cluster("a100-80gb")
    small = ModelDesc("small", 12, 1024, 16, seq=1024, vocab=50304)
    p = Plans.single(dp=1, tp=8, pp=1, mb=1, m=8, ckpt=2)
    steps = []
    for host_us in (0.0, 10.0, 26.0, 60.0, 120.0):
        w = AnalyticWorkload(small, cl, host_us_per_kernel=host_us)
        c = evaluate(w, p, cl)
        steps.append(float(c.step_s[0]))
        st = w.stage_times(p)
        assert float(c.host_exposed_s[0]) == pytest.approx(
            8 * max(float(st.host[0]) - float(st.fwd[0] + st.bwd[0] + st.recompute[0]), 0.0)
        )
    assert steps == sorted(steps) and steps[-1] > 1.5 * steps[0]
    # A large model's GPU work hides its host time: the prediction does not move.
    big = PRESETS["gpt-175b"]
    q = Plans.single(dp=1, tp=8, pp=8, mb=1, m=64, v=1, ckpt=2)
    ref = evaluate(AnalyticWorkload(big, cl, host_us_per_kernel=0.0), q, cl).step_s[0]
    assert evaluate(AnalyticWorkload(big, cl), q, cl).step_s[0] == ref
    with pytest.raises(perfcast.errors.PerfcastError):
        AnalyticWorkload(small, cl, host_us_per_kernel=-1.0)
    model = '{"layers": 12, "hidden": 1024, "heads": 16, "seq": 1024, "vocab": 50304}'
    args = ["plan", "--model", model, "--gpus", "8", "--global-batch", "8", "--json", "-q"]
    assert main([*args, "--host-us-per-kernel", "200"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert any(r.startswith("host-bound") for r in data["best"][0]["reasons"])
    assert any("200 us per kernel" in a for a in data["assumptions"])


def test_vtrain_single_node_runs_within_bounds() -> None:
    """vTrain's 1,440 single-node runs: small models whose pace the host sets. A ratchet on
    the errors with the host cost fitted on them (a fit, not a test) and with the default."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_published import DATA, vtrain_single

    res = vtrain_single(json.loads(DATA.read_text())["vtrain_single_node"])
    assert len(res["runs"]) == 1440
    fitted = [r["error_fitted_pct"] for r in res["runs"]]
    assert statistics.median(fitted) <= 7.5 and max(fitted) <= 30.0
    # The default host cost makes no run worse than no host time (1,297 of the 1,440 are
    # predicted too fast without it, and the floor only lengthens a prediction where the
    # host's launches outlast the GPU work).
    for r in res["runs"]:
        assert r["error_default_pct"] <= r["error_none_pct"] + 1e-9, r
    default = [r["error_default_pct"] for r in res["runs"]]
    assert statistics.median(default) <= 28.5 and max(default) <= 68.0
    # What plan search is for: with the default host cost the predicted order of each
    # model's configurations follows the measured one better than without (rho 0.48 -> 0.67,
    # the first pick 8.7% -> 2.6% slower than the fastest at the median).
    rk = res["ranking"]
    assert rk["default"]["rho_median"] >= 0.6 > rk["none"]["rho_median"]
    assert rk["default"]["regret_median_pct"] <= 3.0 < rk["none"]["regret_median_pct"]
    assert rk["fitted"]["rho_median"] >= 0.9 and rk["fitted"]["regret_median_pct"] <= 1.0


def test_plan_says_when_the_traced_configuration_misses_the_trace(shared_traces: Path) -> None:
    """The V100 DDP rank's own collectives ran ~60 ms a step; the plans model them again
    and its own configuration lands 4.6% under the trace's step: a note says so and why."""
    table = perfcast.load(str(shared_traces / "hta_ddp_v100_rank1_memory.json.gz"))
    result = plan_trace(table, 8)
    assert result.baseline is not None
    note = next(n for n in result.notes if n.startswith("the traced configuration"))
    assert "ms of collective kernels per step" in note and "-4." in note
    assert any("every plan fits" in n for n in result.notes)


def test_a_plan_on_another_gpu_scales_each_kernel_at_its_own_dtype(tmp_path: Path) -> None:
    """fp32 GEMMs stay fp32 on the new GPU (PyTorch leaves matmul TF32 off) and fp32
    convolutions run in TF32 where it has TF32 tensor cores, as the device what-if reads
    them; the plan scaled every fp32 kernel by TF32 peaks (V100 -> H100 x0.03, 7x the
    device what-if's x0.23 on the same DLRM trace)."""
    from perfcast.hardware.classify import KernelClass
    from perfcast.hardware.devices import lookup_device
    from perfcast.plan.trace_workload import _compute_ratio

    v100, h100 = lookup_device("V100-SXM2-32GB"), lookup_device("H100-SXM5-80GB")
    assert v100 is not None and h100 is not None
    b = TraceBuilder()
    b.launch("volta_sgemm_128x64_nn", 0, 5, 10, 30)
    b.launch("cudnn::detail::wgrad_alg0_engine", 40, 5, 50, 10)
    table = perfcast.load(b.write(tmp_path / "t.json"))
    rows = np.flatnonzero(table.is_gpu())
    classes = np.array([KernelClass.MATMUL, KernelClass.CONV], dtype=np.int16)
    dur = np.array([3.0, 1.0])
    ratio, dtypes = _compute_ratio(table, rows, classes, dur, v100, h100)
    expect = (3 * 15.7 / h100.peak("fp32") + 1 * 15.7 / h100.peak("tf32")) / 4
    assert ratio == pytest.approx(expect)
    assert dtypes == "fp32 75%, fp32 -> tf32 25%"
    # The other way round a convolution leaves TF32 for the V100's fp32 units.
    back, _ = _compute_ratio(table, rows, classes, dur, h100, v100)
    assert back == pytest.approx((3 * h100.peak("fp32") + h100.peak("tf32")) / 15.7 / 4)


def test_plan_of_an_fp32_trace_on_another_gpu_follows_the_device_whatif(
    shared_traces: Path,
) -> None:
    r = plan_trace(perfcast.load(str(shared_traces / "dlrm_v100_8rank")), 64, gpu="h100", top=1)
    said = " ".join(r.assumptions)
    assert "compute-bound kernels x0.23" in said and "fp32 100%" in said, said


def test_full_checkpointing_in_a_plan_follows_the_checkpointing_whatif() -> None:
    """A full-ckpt plan keeps what the memory model's checkpoint regions keep (it kept every
    saved tensor of a CNN: 108 layer groups for 106 saved tensors) and pays the forward's
    host time again (a host-bound step recomputed for free)."""
    from perfcast.memory_model import predict_peak_memory

    table = perfcast.load(RECORDED / "r50_base.json.gz")
    rows = plan_trace(table, 1, top=40).best
    plain = next(r for r in rows if r.label == "dp1 tp1 pp1 mb64x1")
    ckpt = next(r for r in rows if r.label == "dp1 tp1 pp1 mb64x1 full-ckpt")
    whatif = perfcast.predict(table, "activation-checkpointing")
    before = predict_peak_memory(table, [])
    after = predict_peak_memory(table, ["activation-checkpointing"])
    saved = (before.activations_bytes - after.activations_bytes) / 2**30
    assert plain.activations_gib - ckpt.activations_gib == pytest.approx(saved, rel=0.15)
    assert ckpt.step_ms == pytest.approx(whatif.predicted_ms, rel=0.05)
    mlp = plan_trace(perfcast.load(RECORDED / "mlp_base.json.gz"), 1, top=40).best
    by = {r.label: r.step_ms for r in mlp}
    assert by["dp1 tp1 pp1 mb64x1 full-ckpt"] > 1.05 * by["dp1 tp1 pp1 mb64x1"]


def test_plan_without_parameters_says_why_and_what_the_trace_measured(
    shared_traces: Path,
) -> None:
    """An inference trace has shapes but no gradients; a trace with [memory] events
    measured its peak, which plans without parameters do not include."""
    bert = plan_trace(perfcast.load(str(shared_traces / "tracelens_h100_bert_small.json.gz")), 8)
    assert any("no backward pass (inference?)" in n for n in bert.notes)
    v100 = perfcast.load(str(shared_traces / "hta_ddp_v100_rank1_memory.json.gz"))
    said = " ".join(plan_trace(v100, 8, memory_gb=4).notes)
    assert "memory events measured 6.2 GiB per rank" in said


def test_micro_batches_reach_the_local_batch() -> None:
    """Micro-batches stopped at 64: a local batch of 1,024 that does not fit whole was
    offered only 64 x 16, where a larger micro-batch fits and runs faster (host time is paid
    per micro-batch)."""
    table = perfcast.load(str(RECORDED / "r50_base.json.gz"))
    r = plan_trace(table, 1, global_batch=1024, top=50)
    mbs = {row.plan["mb"] for row in r.best}
    assert {128, 256} & mbs
    assert r.best[0].plan["mb"] > 64
    # Every power of two up to the local batch is among the plans tried.
    from perfcast.plan.search import enumerate_plans

    plans = enumerate_plans(_FlatTp(), 1, 2048, make_cluster("h100"), zero=(0,), ckpt=(0,))
    assert {1 << k for k in range(12)} <= set(plans.mb.tolist())


class _FlatTp(_Flat):
    def tp_ok(self, tp: np.ndarray) -> np.ndarray:
        return np.asarray(tp) == 1


def test_plan_says_why_there_is_no_tensor_parallelism() -> None:
    """ResNet-50's one linear layer has no column/row pair: the plan told the user to
    re-record with record_shapes=True, which the trace already had."""
    r = plan_trace(perfcast.load(str(RECORDED / "r50_base.json.gz")), 8, top=1)
    said = " ".join(r.assumptions)
    assert "1 linear layer per step, no column/row pair to split" in said
    assert "record_shapes=False" not in said


def test_plan_names_the_gpu_for_amp_when_the_trace_does_not(shared_traces: Path) -> None:
    """With --gpu given for a trace that names no GPU, AMP said to pass device=NAME (which
    plan has no option for); the trace is taken as the --gpu's run, for AMP too."""
    table = perfcast.load(str(shared_traces / "hta_sampled_128rank"))
    said = " ".join(plan_trace(table, 8, gpu="a100", top=1).assumptions)
    assert "AMP plans (bf16 autocast)" in said and "device=NAME" not in said
    assert "`whatif amp:dtype=bf16,device='a100'`" in said
    # A DeviceSpec of the user's own has no efficiency tables under its name: said, plans kept.
    from perfcast.hardware.devices import lookup_device

    own = replace(lookup_device("a100"), name="Bob's GPU, rev 2")
    r = plan_trace(table, 8, gpu=own, top=1)
    said = " ".join(r.assumptions)
    assert r.best and "per known GPU" in said and "device=NAME" not in said


def test_plan_notes_memory_beyond_the_gpu() -> None:
    r = plan_trace(perfcast.load(str(EXAMPLE)), 2, memory_gb=1e6, top=1)
    assert any("more than the A100" in n for n in r.notes)
    assert not any("more than" in n for n in plan_trace(perfcast.load(str(EXAMPLE)), 2).notes)


def _plan(**kw: int) -> Plans:
    base = {"dp": 1, "tp": 1, "pp": 1, "mb": 1, "m": 1, "v": 1, "zero": 0, "ckpt": 0, "sp": 0}
    base.update(kw)
    return Plans(**base, amp=0)  # type: ignore[arg-type]


def test_a_faster_link_never_makes_a_plan_slower() -> None:
    """Traffic hides behind the micro-batch's slot: on a host-bound step a faster link that
    shortens the GPU's tensor-parallel work must not expose more FSDP traffic."""
    desc = load_desc("gpt-1.7b")
    plans = Plans(
        **{
            k: np.array(v)
            for k, v in {
                "dp": [2, 2, 2, 16, 4],
                "tp": [8, 8, 8, 1, 4],
                "pp": [1, 1, 1, 1, 1],
                "mb": [1, 1, 2, 4, 1],
                "m": [32, 32, 16, 1, 16],
                "v": [1, 1, 1, 1, 1],
                "zero": [3, 2, 1, 0, 3],
                "ckpt": [0, 0, 0, 0, 1],
                "sp": [1, 1, 1, 0, 1],
                "amp": [0, 0, 0, 0, 0],
            }.items()
        }
    )
    steps = []
    for link in ("nvlink2", "nvlink3", "nvlink4"):
        c = make_cluster("h100", intra=link, inter="ib-hdr")
        steps.append(evaluate(AnalyticWorkload(desc, c), plans, c).step_s)
    for slower, faster in itertools.pairwise(steps):
        assert (faster <= slower * (1 + 1e-9)).all(), (slower, faster)


def test_zero2_with_accumulation_reduce_scatters_every_micro_batch() -> None:
    desc = load_desc("gpt-1.7b")
    c = make_cluster("a100-80gb")
    w = AnalyticWorkload(desc, c)
    one = evaluate(w, _plan(dp=8, m=8, zero=1), c)
    two = evaluate(w, _plan(dp=8, m=8, zero=2), c)
    # Sharded gradients: less memory, and m reduce-scatters instead of one.
    assert two.grads_b[0] < one.grads_b[0]
    assert two.dp_comm_s[0] > 4 * one.dp_comm_s[0] / 2
    assert two.step_s[0] >= one.step_s[0]
    # With one micro-batch the two stages move the same bytes.
    assert evaluate(w, _plan(dp=8, m=1, zero=2), c).dp_comm_s[0] == pytest.approx(
        evaluate(w, _plan(dp=8, m=1, zero=1), c).dp_comm_s[0]
    )


def test_fsdp_units_are_the_stage_layers() -> None:
    """Two gathered units of the stage: the same bytes at any pipeline depth (a stage of
    96/pp layers holds 1/pp of the parameters, each layer the same share)."""
    desc = load_desc("gpt-175b")
    c = make_cluster("a100-80gb")
    w = AnalyticWorkload(desc, c)
    gathered = []
    for pp in (4, 8, 16):
        cost = evaluate(w, _plan(dp=2, tp=4, pp=pp, m=16, zero=3), c)
        no_gather = evaluate(w, _plan(dp=2, tp=4, pp=pp, m=16, zero=2), c)
        gathered.append(cost.transient_b[0] - no_gather.transient_b[0])
    layer_bytes = 12 * desc.hidden**2 / 4 * 2  # one layer's weights per tp rank, 16-bit
    for g in gathered:  # the worst stage also holds the embedding: a little more
        assert 2 * layer_bytes <= g <= 1.1 * 2 * layer_bytes


def test_bubble_share_is_of_the_whole_step() -> None:
    c = make_cluster("a100-80gb")
    w = AnalyticWorkload(load_desc("gpt-22b"), c)
    cost = evaluate(w, _plan(dp=4, tp=8, pp=4, m=8, zero=1), c)
    pipe_share = 3 / (8 + 3)
    assert cost.bubble_frac[0] == pytest.approx(pipe_share * cost.pipeline_s[0] / cost.step_s[0])
    assert cost.bubble_frac[0] < pipe_share


def test_full_checkpointing_memory_does_not_grow_with_the_pipeline(tmp_path: Path) -> None:
    """One region is recomputed at a time whatever the stage holds: deeper pipelines hold
    less, never more (the region's peak was multiplied by pp)."""
    from perfcast.plan.trace_workload import trace_workload

    c = make_cluster("h100")
    w = trace_workload(perfcast.load(str(RECORDED / "r50_base.json.gz")), c)
    peaks = [evaluate(w, _plan(pp=pp, mb=w.batch, ckpt=2), c).peak_b[0] for pp in (1, 2, 4, 8)]
    assert all(b <= a * (1 + 1e-9) for a, b in itertools.pairwise(peaks)), peaks
    plain = evaluate(w, _plan(mb=w.batch), c).peak_b[0]
    assert peaks[0] < 0.5 * plain


def test_plan_says_when_half_the_gpus_run_the_step_faster() -> None:
    """Every plan must use all N GPUs: with a global batch too small for them, the best of N
    was slower than the best of N/2, and nothing said so."""
    many = plan_model("llama3-8b", 1024, global_batch=32, top=1)
    half = plan_model("llama3-8b", 512, global_batch=32, top=1)
    assert half.best[0].step_ms < many.best[0].step_ms
    assert any(n.startswith("on 512 GPUs the best plan") for n in many.notes), many.notes
    roomy = plan_model("gpt-1.7b", 16, global_batch=1024, top=1)
    assert not any("GPUs the best plan" in n for n in roomy.notes)


def test_plan_says_what_the_input_notes_say(tmp_path: Path, shared_traces: Path) -> None:
    """A folder short of a rank (one file empty): plan printed nothing of it, and every other
    command prefixed the folder's note with 'rank 0:'."""
    import shutil

    import perfcast
    from perfcast.analysis.notes import input_notes

    folder = tmp_path / "ranks"
    shutil.copytree(shared_traces / "dlrm_v100_8rank", folder)
    (folder / "worker2.json.gz").write_bytes(b"")
    table = perfcast.load(folder)
    notes = input_notes(table)
    assert notes[0].startswith("1 file of the folder") and not notes[0].startswith("rank 0:")
    plan = perfcast.plan(table, gpus=8)
    assert any("7 of the job's 8 ranks" in n for n in plan.notes)


def test_an_unknown_gpu_lists_the_known_ones() -> None:
    """plan's hint gave three examples where the device what-if lists every part."""
    from perfcast.errors import OptionError
    from perfcast.hardware.network import check_names

    with pytest.raises(OptionError) as err:
        check_names("z9000", None, None)
    assert err.value.hint is not None
    assert "H200-SXM-141GB" in err.value.hint and "MI300X" in err.value.hint
