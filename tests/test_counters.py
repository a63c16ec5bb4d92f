"""GPU counters from CUPTI range-profiler traces (`perfcast analyze --only counters`)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import perfcast
from perfcast.analysis.counters import gpu_counters
from perfcast.cli.main import main
from tests.tracegen import TraceBuilder

FP32 = "smsp__sass_thread_inst_executed_op_f{}_pred_on.sum"


def _counter_trace(ranges: list[tuple[str, dict]], launches: list[str]) -> TraceBuilder:
    """Ops that each make one launch call, and the range profiler's events (no kernels)."""
    b = TraceBuilder()
    for i, op in enumerate(launches):
        b.op(op, 100 * i, 50)
        b.runtime("cudaLaunchKernel", 100 * i + 10, 5)
    for i, (kernel, values) in enumerate(ranges):
        ev = {"ph": "X", "cat": "cuda_profiler_range", "name": kernel, "pid": 0, "tid": 0}
        b.events.append({**ev, "ts": 10_000 + 500 * i, "dur": 500, "args": values})
    return b


def test_counters_paired_with_their_ops_and_flops(tmp_path: Path) -> None:
    ranges = [
        ("gemm_kernel", {FP32.format("add"): 10, FP32.format("mul"): 5, FP32.format("fma"): 3}),
        ("relu_kernel", {FP32.format("add"): 0, FP32.format("fma"): 0, "dram__bytes.sum": 64}),
        ("relu_kernel", {FP32.format("add"): 4, "odd": "text", "nan": None}),
    ]
    path = _counter_trace(ranges, ["aten::mm", "aten::relu", "aten::relu"]).write(
        tmp_path / "t.json"
    )
    table = perfcast.load(str(path))
    assert any("range profiler" in w for w in table.ranks[0].warnings)
    r = gpu_counters(table)
    assert [k.op for k in r.kernels] == ["aten::mm", "aten::relu", "aten::relu"]
    assert r.kernels[0].flops_fp32 == 10 + 5 + 2 * 3
    assert r.kernels[0].flops_fp64 == 0.0
    by_op = {o.op: o for o in r.by_op}
    assert by_op["aten::relu"].kernels == 2 and by_op["aten::relu"].flops_fp32 == 4
    assert r.by_op[0].op == "aten::mm"  # most FLOPs first
    metrics = {m.metric: m for m in r.by_metric}
    assert metrics["dram__bytes.sum"].total == 64 and metrics["dram__bytes.sum"].kernels == 1
    assert metrics[FP32.format("add")].nonzero == 2
    assert "odd" not in metrics and "nan" not in metrics  # only numbers are counters
    assert len(r.values) == 3 + 3 + 1


def test_counters_not_paired_when_counts_differ(tmp_path: Path) -> None:
    ranges = [("k", {"dram__bytes.sum": 1})] * 3
    path = _counter_trace(ranges, ["aten::mm", "aten::relu"]).write(tmp_path / "t.json")
    r = gpu_counters(perfcast.load(str(path)))
    assert [k.op for k in r.kernels] == ["", "", ""]
    assert any("not paired" in n for n in r.notes)
    assert r.by_op[0].op == "(not paired)" and r.by_op[0].flops_fp32 is None
    assert any("no FLOP counts" in n for n in r.notes)


def test_counters_of_a_cut_file_are_salvaged(tmp_path: Path) -> None:
    """A killed job's file: every complete counter event is kept, and the note says how many
    of those the file holds were read; the input is not modified."""
    ranges = [(f"k{i}", {"dram__bytes.sum": i + 1}) for i in range(40)]
    b = _counter_trace(ranges, [f"aten::op{i}" for i in range(40)])
    raw = json.dumps({"traceEvents": b.events}).encode()
    last = raw.rfind(b'{"ph": "X", "cat": "cuda_profiler_range"')
    cut = tmp_path / "cut.json"
    cut.write_bytes(raw[: last + 60])  # inside the last counter event
    before = cut.read_bytes()
    table = perfcast.load(str(cut))
    assert table.ranks[0].truncated
    r = gpu_counters(table)
    assert [k.kernel for k in r.kernels] == [f"k{i}" for i in range(39)]
    assert [k.op for k in r.kernels] == [f"aten::op{i}" for i in range(39)]
    assert any("the counters of 39 of the 40 counter events" in n for n in r.notes)
    assert any("the first 39 of each are paired" in n for n in r.notes)
    assert cut.read_bytes() == before
    # The same cut inside a gzip stream.
    gz = tmp_path / "cut.json.gz"
    whole = gzip.compress(raw, mtime=0)
    gz.write_bytes(whole[: int(len(whole) * 0.8)])
    r = gpu_counters(perfcast.load(str(gz)))
    assert 0 < len(r.kernels) < 40 and any("cut: the counters" in n for n in r.notes)


def test_no_counters_says_how_to_record_them() -> None:
    example = Path(perfcast.__file__).parent / "examples" / "ddp_a100_rank0.json.gz"
    r = gpu_counters(perfcast.load(str(example)))
    assert not r.kernels and any("profiler_metrics" in n for n in r.notes)


def test_counters_on_the_shared_cupti_trace(
    shared_traces: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """HTA's CUPTI counter example: 77 kernels profiled, 77 launch calls, 9 metrics."""
    path = shared_traces / "hta_alexnet_a100_cupti_counters.json.gz"
    r = perfcast.gpu_counters(path)  # the public API takes a path too
    assert len(r.kernels) == 77 and len(r.by_metric) == 9 and len(r.values) == 77 * 9
    assert r.kernels[0].op == "aten::uniform_" and "distribution" in r.kernels[0].kernel
    assert all(k.op for k in r.kernels)
    # The convolutions carry most of the fp32 work of AlexNet.
    assert r.by_op[0].op == "aten::cudnn_convolution"
    assert main(["analyze", str(path), "--only", "counters", "--json", "-q"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["counters"]["kernels"]) == 77
    assert main(["summary", str(path)]) == 0
    assert "range profiler" in capsys.readouterr().out


def test_counter_values_nested_past_the_limit(tmp_path: Path) -> None:
    """Deep nesting (RecursionError inside msgspec) becomes null, as the reader reads it."""
    deep = "[" * 100_000 + "]" * 100_000
    ev = '{"ph": "X", "ts": 1, "dur": 1, "pid": 1, "tid": 1, "cat": "cuda_profiler_range"'
    doc = f'{{"traceEvents": [{ev}, "name": "k", "args": {{"a": {deep}, "m": 3}}}}]}}'
    path = tmp_path / "deep.json"
    path.write_text(doc)
    r = gpu_counters(perfcast.load(str(path)))
    assert [(m.metric, m.total) for m in r.by_metric] == [("m", 3.0)]
    assert main(["analyze", str(path), "--only", "counters", "-q"]) == 0


def test_counter_values_with_invalid_utf8(tmp_path: Path) -> None:
    """Invalid UTF-8 (a flipped byte; fuzz campaign) becomes U+FFFD, as the reader reads it."""
    ev = b'{"ph": "X", "ts": 1, "dur": 1, "pid": 1, "tid": 1, "cat": "cuda_profiler_range"'
    doc = b'{"traceEvents": [' + ev + b', "name": "k\x89", "args": {"m\x89": 3, "n": 1}}]}'
    path = tmp_path / "utf8.json"
    path.write_bytes(doc)
    r = gpu_counters(perfcast.load(str(path)))
    assert sorted(m.total for m in r.by_metric) == [1.0, 3.0]
    assert r.kernels[0].kernel == "k\ufffd"


def test_predictions_refuse_a_counter_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """Kernels replayed for counters inside their launch calls: no step time to predict from.
    summary and analyze still run."""
    ranges = [("gemm_kernel", {FP32.format("fma"): 3})] * 2
    b = _counter_trace(ranges, ["aten::mm", "aten::mm"])
    b.step(1, 0, 400)
    path = b.write(tmp_path / "counters.json")
    for argv in (["advise"], ["whatif", "--apply", "amp"], ["plan", "--gpus", "8"]):
        assert main([argv[0], str(path), *argv[1:]]) == 2
        err = capsys.readouterr().err
        assert "needs kernel times" in err and "profiler_metrics" in err, err
    assert main(["summary", str(path)]) == 0
    assert main(["analyze", str(path), "--only", "counters"]) == 0
