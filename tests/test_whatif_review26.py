"""Session 26's review of the what-if options: each bad value is refused in one line that
names the what-if and the option, before any trace is read where the value alone says so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import perfcast
from perfcast.errors import NotApplicableError, OptionError, PerfcastError
from perfcast.whatif.registry import build_options, checked_specs

MLP = Path(__file__).parents[1] / "benchmarks/accuracy/recorded/traces/h100/mlp_base.json.gz"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("faster-op:pattern=(", "faster-op: pattern='(' is not a valid regular expression"),
        ("faster-op:module=[", "faster-op: module='[' is not a valid regular expression"),
        ("remove-host-sync:op=(", "remove-host-sync: op='(' is not a valid regular expression"),
        (
            "activation-checkpointing:module=(",
            "activation-checkpointing: module='(' is not a valid regular expression",
        ),
    ],
)
def test_a_bad_regular_expression_names_its_what_if_and_option(spec: str, says: str) -> None:
    """The error was "'(' is not a valid regular expression": with two patterns in one
    command (faster-op's pattern and module, or two --apply), it did not say which."""
    with pytest.raises(OptionError) as err:
        checked_specs([spec])
    assert str(err.value).startswith(says)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("device:target=foo", "device: unknown device 'foo' (target)"),
        ("device:target=h100,source=foo", "device: unknown device 'foo' (source option)"),
        ("amp:device=foo", "amp: unknown device 'foo' (device option)"),
    ],
)
def test_an_unknown_gpu_is_refused_before_the_trace_is_read(spec: str, says: str) -> None:
    """Unknown GPU names were refused only once the trace was loaded and its graph built
    (4.5 s on the 54 MB shared trace, against 1.1 s for an unknown link), and device's
    source=foo was called a "device option"."""
    with pytest.raises(OptionError, match="^" + re.escape(says)):
        checked_specs([spec])


def test_a_known_variant_still_stands_in_for_its_part() -> None:
    """The early check refuses only what apply would refuse: H800 and A800 still pass."""
    assert build_options("device", {"target": "h800", "source": "a800"}).target == "h800"
    assert build_options("amp", {"device": "a800"}).device == "a800"


@pytest.mark.parametrize("params", ["0", "1"])
def test_fused_optimizer_refuses_fewer_than_two_parameters(params: str) -> None:
    """params=0 read as not given (the model's `if options.params:`) and was silently
    replaced by the trace's count; params=1 was refused as "found no per-parameter optimizer
    kernels", which the trace has."""
    with pytest.raises(
        OptionError, match=rf"fused-optimizer: params must be at least 2 \(got {params}\)"
    ):
        checked_specs([f"fused-optimizer:params={params}"])


def test_fused_optimizer_says_when_the_params_given_leave_nothing_to_fuse() -> None:
    """More parameters than the trace has optimizer kernels was refused as "found no
    per-parameter optimizer kernels", though there are 462 per step."""
    if not MLP.exists():
        pytest.skip("the recorded H100 traces are not in this checkout")
    table = perfcast.load(str(MLP))
    with pytest.raises(NotApplicableError, match=r"params=1,000,000 leaves nothing to fuse"):
        perfcast.predict(table, "fused-optimizer:params=1000000")
    assert perfcast.predict(table, "fused-optimizer:params=10").speedup > 1.0


@pytest.mark.parametrize(("text", "value"), [("1e3", 1000), ("8.0", 8), ("16", 16)])
def test_a_whole_number_written_with_an_exponent_is_whole(text: str, value: int) -> None:
    """`workers=1e3` was refused as "is not a whole number"."""
    workers = build_options("dataloader-overlap", {"workers": text}).workers
    assert workers == value and isinstance(workers, int)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("2.5", "is not a whole number"),
        ("inf", "is out of range"),
        ("nan", "is out of range"),
        ("1e7", "is out of range"),
        ("abc", "is not a number"),
    ],
)
def test_an_integer_option_still_refuses_what_is_not_whole(text: str, says: str) -> None:
    with pytest.raises(PerfcastError, match=says):
        build_options("dataloader-overlap", {"workers": text})


def _assumption(table: perfcast.EventTable, spec: str, holds: str) -> str:
    applied = perfcast.predict(table, spec).applied
    found = [a for model in applied for a in model.assumptions if holds in a]
    assert len(found) == 1, (spec, holds)
    return found[0]


@pytest.fixture(scope="module")
def mlp() -> perfcast.EventTable:
    if not MLP.exists():
        pytest.skip("the recorded H100 traces are not in this checkout")
    return perfcast.load(str(MLP))


def test_torch_compile_credits_tritonbench_only_with_its_measured_values(mlp) -> None:
    """launch_us=1,graph_call_us=100 was said "measured by tritonbench on a GB200 host"."""
    tritonbench = "measured by tritonbench on a GB200 host"
    assert tritonbench in _assumption(mlp, "torch-compile", "host path")
    both = _assumption(mlp, "torch-compile:launch_us=1,graph_call_us=100", "host path")
    assert "1 µs per generated kernel and 100 µs per graph call" in both
    assert "both given" in both and tritonbench not in both
    one = _assumption(mlp, "torch-compile:launch_us=1", "host path")
    assert f"launch_us=1 given, the other {tritonbench}" in one


def test_cuda_graphs_gives_the_source_of_its_graph_launch_time(mlp) -> None:
    """The 2.5 µs graph launch was stated without where it comes from."""
    default = _assumption(mlp, "cuda-graphs", "CUDA graph launch")
    assert "graph launch 2.5 µs (a few µs, about constant for straight-line graphs" in default
    assert "graph launch 7 µs (given)" in _assumption(
        mlp, "cuda-graphs:graph_launch_us=7", "CUDA graph launch"
    )


def test_activation_checkpointing_says_its_counts_are_per_rank(shared_traces) -> None:
    """On the 8-rank DLRM folder the counts were the mean over rank-steps but read "per
    step", as if the job's; and 952.9 host nodes printed as 953."""
    table = perfcast.load(str(shared_traces / "dlrm_v100_8rank"))
    text = _assumption(table, "activation-checkpointing", "recomputed")
    assert "71 GPU tasks (0.32 ms) and 952.9 host nodes (3.63 ms) per step and rank " in text
    assert "(mean of 8 ranks, 8 rank-steps) recomputed" in text


def test_pipeline_parallel_refuses_too_few_micro_batches_before_the_trace_is_read() -> None:
    """microbatches=1 with pp=2 was refused only once a trace was read and its graph built,
    though the two values alone say it."""
    with pytest.raises(OptionError, match=r"microbatches=1 is fewer than pp=2 stages"):
        checked_specs(["pipeline-parallel:pp=2,microbatches=1"])
    assert build_options("pipeline-parallel", {"pp": "4"}).microbatches == 0  # 4 x pp


@pytest.mark.parametrize("spec", ["", ":", ":factor=2", "  "])
def test_a_spec_that_names_no_optimization_says_so(spec: str) -> None:
    # "unknown optimization ''" read as if '' were a name perfcast did not know.
    from perfcast.whatif.registry import parse_spec

    with pytest.raises(OptionError, match="names no optimization") as exc:
        parse_spec(spec)
    assert "fused-optimizer" in (exc.value.hint or "")


def test_ddp_says_where_its_bucket_sizes_come_from() -> None:
    # Every constant a model uses is measured, cited or given: the buckets were neither.
    example = Path(__file__).resolve().parents[1] / "perfcast/examples/ddp_a100_rank0.json.gz"
    table = perfcast.load(str(example))

    def said(spec: str) -> str:
        return " ".join(a for m in perfcast.predict(table, spec).applied for a in m.assumptions)

    default, given = said("ddp:gpus=16"), said("ddp:gpus=16,bucket_mb=50")
    assert "PyTorch DDP's defaults" in default and "bucket_cap_mb" in default
    assert "1 then 50 MiB in gradient-ready order, as given" in given


def test_scale_out_figures_on_several_ranks_say_they_are_per_rank(tmp_path: Path) -> None:
    """ddp, zero, tensor-parallel and pipeline-parallel give means over (rank, step) pairs;
    on a rank folder "5.0 buckets per step" read as the whole job's step. The example as
    two ranks: each now says "per step and rank (mean of 2 ranks, 6 rank-steps)" (the
    example has no linear layers for tensor-parallel, which says it the same way)."""
    import gzip
    import json

    example = Path(__file__).resolve().parents[1] / "perfcast/examples/ddp_a100_rank0.json.gz"
    doc = json.loads(gzip.decompress(example.read_bytes()))
    for rank in range(2):
        doc.setdefault("distributedInfo", {}).update(rank=rank, world_size=2)
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(doc))
    table = perfcast.load(str(tmp_path))
    per = "per step and rank (mean of 2 ranks, 6 rank-steps)"
    for spec, head in [
        ("ddp:gpus=16", "buckets " + per),
        ("zero:stage=2,gpus=16", "16 units; " + per),
        ("pipeline-parallel:pp=2", "ms " + per),
    ]:
        first = perfcast.predict(table, spec).applied[0].assumptions[0]
        assert head in first, (spec, first)
