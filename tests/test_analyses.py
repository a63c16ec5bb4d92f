"""The trace analyses of `perfcast analyze`: numbers computed by hand on a small built trace,
and numbers HTA 0.5.0 reports on shared traces (within 1%)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import perfcast
from perfcast.analysis.battery import ANALYSES, analyze
from perfcast.analysis.comms import collectives
from perfcast.analysis.idle import idle_time
from perfcast.analysis.kernels import kernel_breakdown
from perfcast.analysis.launch_queue import launch_queue, queue_length_series
from perfcast.analysis.launches import launch_stats
from perfcast.analysis.memory import allocator_chains, memory
from perfcast.analysis.op_kernels import op_kernels
from perfcast.analysis.roofline import op_cost, roofline
from perfcast.analysis.scopes import scopes
from perfcast.analysis.stragglers import stragglers
from perfcast.frames import result_tables
from tests.tracegen import TraceBuilder

EXAMPLE = Path(__file__).parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"

# ---------------------------------------------------------------------------------------------
# A hand-built trace (times in µs). Stream 7 runs, in order:
#   sgemm  [100, 140]  launched at 20-30 inside aten::mm [10, 60]
#   add    [150, 160]  launched at 75-80 inside aten::add [70, 90]    gap 10: other (75 < 140)
#   relu   [320, 323]  launched at 305-310 inside aten::relu          gap 160: host wait
#   kw     [323.02, 333.02] launched at 310-312                       gap 0.02: kernel wait
#   comp2  [450, 470]  launched at 440-445                            gap 116.98: host wait
# Stream 9: an NCCL all-reduce [410, 510] (1e6 floats, 2 ranks), overlapping comp2 by 20.
# Stream 11: a 1 MB host-to-device copy [610, 620].


def _memory_event(ts: float, nbytes: int, total: int, device_type: int) -> dict:
    return {
        "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 100,
        "tid": 100, "ts": ts,
        "args": {"Device Type": device_type, "Device Id": 0 if device_type else -1,
                 "Bytes": nbytes, "Total Allocated": total},
    }  # fmt: skip


def small_trace() -> dict:
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.op("my_block", 5, 100, cat="user_annotation")
    b.op("nn.Module: Linear_0", 8, 60, cat="python_function")
    b.op("aten::mm", 10, 50, **{"Input Dims": [[64, 256], [256, 128]]})
    b.launch("ampere_sgemm_64x64_nn", 20, 10, 100, 40)
    b.op("aten::add", 70, 20, **{"Input Dims": [[64, 128], [64, 128], []]})
    b.launch("vectorized_elementwise_kernel<float>", 75, 5, 150, 10)
    b.op("aten::relu", 300, 20)
    b.launch("relu_kernel", 305, 5, 320, 3)
    b.launch("kw_kernel", 310, 2, 323.02, 10)
    b.op("record_param_comms", 395, 20)
    b.launch(
        "ncclKernel_AllReduce_RING_LL_Sum_float",
        400, 5, 410, 100, stream=9,
        **{"Collective name": "allreduce", "In msg nelems": 1_000_000,
           "Out msg nelems": 1_000_000, "Group size": 2, "dtype": "Float"},
    )  # fmt: skip
    b.launch("comp2_kernel", 440, 5, 450, 20)
    b.launch(
        "Memcpy HtoD (Pageable -> Device)", 600, 5, 610, 10, stream=11, cat="gpu_memcpy",
        name="cudaMemcpyAsync", bytes=1_000_000,
    )  # fmt: skip
    # GPU allocator: +1000, +500, -1000; the CPU allocator interleaved: +8, -8.
    b.events += [
        _memory_event(15, 1000, 1000, 1),
        _memory_event(16, 8, 8, 0),
        _memory_event(25, 500, 1500, 1),
        _memory_event(26, -8, 0, 0),
        _memory_event(85, -1000, 500, 1),
    ]
    return b.doc()


@pytest.fixture
def table(write_trace):
    return perfcast.load(write_trace(small_trace()))


def test_kernel_breakdown_by_hand(table) -> None:
    r = kernel_breakdown(table)
    kinds = {row.kind: row for row in r.by_kind}
    assert kinds["computation"].total_ms == pytest.approx((40 + 10 + 3 + 10 + 20) / 1000)
    assert kinds["communication"].total_ms == pytest.approx(0.1)
    assert kinds["memory"].total_ms == pytest.approx(0.01)
    overlap = {row.kinds: row.time_ms for row in r.overlap}
    assert overlap["computation + communication"] == pytest.approx(0.02)
    assert overlap["communication"] == pytest.approx(0.08)
    assert overlap["computation"] == pytest.approx(0.063)
    top = {row.name: row for row in r.top}
    assert top["ampere_sgemm_64x64_nn"].mean_us == pytest.approx(40)


def test_idle_time_by_hand(table) -> None:
    r = idle_time(table)
    s7 = next(s for s in r.by_stream if s.stream == 7)
    assert s7.host_wait_ms == pytest.approx((160 + 116.98) / 1000)
    # HTA's default threshold (30 µs) makes the 10 µs gap a kernel wait too.
    assert s7.kernel_wait_ms == pytest.approx(10.02 / 1000) and s7.other_ms == 0
    s7 = next(s for s in idle_time(table, kernel_gap_ns=1000).by_stream if s.stream == 7)
    assert s7.kernel_wait_ms == pytest.approx(0.02 / 1000)
    assert s7.other_ms == pytest.approx(10 / 1000)
    assert s7.span_ms == pytest.approx(0.37)
    assert s7.busy_ms == pytest.approx(0.083)
    # With a 10 ns threshold the 20 ns gap is no kernel wait.
    s7 = next(s for s in idle_time(table, kernel_gap_ns=10).by_stream if s.stream == 7)
    assert s7.kernel_wait_ms == 0 and s7.other_ms == pytest.approx(0.01002)
    host = next(i for i in r.intervals if i.stream == 7 and i.category == "host wait")
    assert host.count == 2 and host.max_us == pytest.approx(160)


def test_launch_stats_by_hand(table) -> None:
    r = launch_stats(table, launch_delay_cutoff_us=50)
    s = r.summary[0]
    delays = [70, 70, 10, 11.02, 5, 5, 5]  # kernel start − end of its launch call
    assert s.launches == 7
    assert s.mean_delay_us == pytest.approx(sum(delays) / 7)
    assert s.short_kernels == 1  # relu: 3 µs on the GPU, 5 µs to launch
    assert s.delay_outliers == 2
    by_op = {g.name: g for g in r.by_op}
    assert by_op["aten::mm"].mean_delay_us == pytest.approx(70)
    assert {o.kernel for o in r.outliers} == {
        "ampere_sgemm_64x64_nn",
        "vectorized_elementwise_kernel<float>",
    }


def test_launch_queue_by_hand(table) -> None:
    r = launch_queue(table, max_depth=1)
    s7 = next(s for s in r.by_stream if s.stream == 7)
    assert s7.max_length == 2
    # Queue at 1 or more: [20, 160], [305, 333.02], [440, 470].
    assert s7.time_at_max_ms == pytest.approx((140 + 28.02 + 30) / 1000)
    # The launches at 75 and 310 found a kernel queued: blocked until the call returned.
    assert s7.blocked_calls == 2
    assert s7.blocked_ms == pytest.approx((5 + 2) / 1000)
    assert next(s for s in launch_queue(table).by_stream if s.stream == 7).blocked_calls == 0
    _t, q = queue_length_series(table, 0, 0, 7)
    assert q.tolist() == [1, 2, 1, 0, 1, 2, 1, 0, 1, 0]


def test_launch_queue_blocked_until_a_slot_frees(write_trace) -> None:
    # Depth 1: the second launch starts at 10 with one kernel queued; the call returns at 60,
    # 10 µs after the first kernel ended (50) and freed the slot: blocked 40 µs, not 50.
    b = TraceBuilder()
    b.launch("k1", 0, 5, 10, 40)
    b.launch("k2", 10, 50, 60, 10)
    r = launch_queue(perfcast.load(write_trace(b.doc())), max_depth=1)
    assert r.by_stream[0].blocked_calls == 1
    assert r.by_stream[0].blocked_ms == pytest.approx(0.04)


def test_memory_by_hand(table) -> None:
    r = memory(table)
    gpu, cpu = r.allocators  # largest peak first
    assert gpu.peak_mb == pytest.approx(1500 / 1e6) and gpu.events == 3
    assert cpu.peak_mb == pytest.approx(8 / 1e6) and cpu.events == 2
    step = r.by_step[0]
    assert (step.start_mb, step.peak_mb, step.end_mb) == pytest.approx((0, 0.0015, 0.0005))
    fwd = next(p for p in r.by_phase if p.phase == "forward")
    assert fwd.allocated_mb == pytest.approx(0.0015) and fwd.freed_mb == pytest.approx(0.001)
    copy = next(c for c in r.copies if c.kind == "Memcpy HtoD")
    assert copy.effective_gbs == pytest.approx(100.0)  # 1 MB in 10 µs
    moved = sum(p.gbs for p in r.bandwidth if p.kind == "Memcpy HtoD")
    width_ns = (620 - 610) * 1000 / 100
    assert moved * width_ns == pytest.approx(1e6)  # the series conserves bytes


def test_memory_allocators_named_by_device(table) -> None:
    gpu, cpu = memory(table).allocators
    assert (gpu.device, cpu.device) == ("GPU 0", "CPU")
    assert gpu.totals == cpu.totals == "recorded"


def test_memory_gpu_first_and_totals_rebuilt_from_bytes(write_trace) -> None:
    """Events with Bytes and a device but no Total Allocated (older PyTorch): each
    allocator's level is their running sum, raised so that its lowest point is 0; the GPU's
    allocator leads even where the CPU's peaks higher."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.launch("k", 20, 5, 100, 10)
    events = [(10, -300, 1), (12, 5000, 0), (20, 1000, 1), (30, 500, 1), (40, -1000, 1)]
    for ts, nbytes, device_type in events:
        ev = _memory_event(ts, nbytes, 0, device_type)
        del ev["args"]["Total Allocated"]
        b.events.append(ev)
    r = memory(perfcast.load(write_trace(b.doc())))
    gpu, cpu = r.allocators
    assert (gpu.device, cpu.device) == ("GPU 0", "CPU")
    assert gpu.totals == "lower bound"
    # GPU levels -300, 700, 1200, 200 raised by 300: 0, 1000, 1500, 500.
    assert (gpu.first_mb, gpu.peak_mb, gpu.min_mb, gpu.last_mb) == pytest.approx(
        (0, 1500e-6, 0, 500e-6)
    )
    assert cpu.peak_mb == pytest.approx(5000e-6)
    assert cpu.peak_mb > gpu.peak_mb
    assert max(p.allocated_mb for p in r.timeline) == pytest.approx(1500e-6)
    assert any("lower bounds" in n for n in r.notes)


def test_memsets_faster_than_dram_are_flagged(write_trace) -> None:
    """An A100 80GB's memory moves 2,039 GB/s: a 10 MB memset in 1 µs (10,000 GB/s) is a
    cache or clock effect, said in a note; a 1 MB one in 1 µs and a host copy are not."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    for i, nbytes in enumerate((10_000_000, 1_000_000)):
        b.launch(
            "Memset (Device)", 10 + 20 * i, 5, 100 + 20 * i, 1, cat="gpu_memset",
            name="cudaMemsetAsync", bytes=nbytes,
        )  # fmt: skip
    b.launch(
        "Memcpy HtoD (Pinned -> Device)", 60, 5, 200, 1, cat="gpu_memcpy",
        name="cudaMemcpyAsync", bytes=50_000_000,
    )  # fmt: skip
    notes = [n for n in memory(perfcast.load(write_trace(b.doc()))).notes if "faster" in n]
    assert len(notes) == 1
    assert "1 of 2 memsets and device-to-device copies" in notes[0]
    assert "up to 10,000 GB/s" in notes[0]


def test_copies_without_a_size_are_not_zero_bytes(write_trace) -> None:
    """A copy whose size the trace does not record (older ROCm traces) is left out of its
    kind's bytes and bandwidths, not counted as 0 bytes (which showed 0 GB/s), and said."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.launch(
        "Memcpy HtoD (Pinned -> Device)", 10, 5, 100, 10, cat="gpu_memcpy",
        name="cudaMemcpyAsync", bytes=1_000_000,
    )  # fmt: skip
    b.launch("Memcpy HtoD (Pinned -> Device)", 30, 5, 200, 90, cat="gpu_memcpy")
    b.launch("Memset (Device)", 50, 5, 300, 1, cat="gpu_memset")
    r = memory(perfcast.load(write_trace(b.doc())))
    copies = {c.kind: c for c in r.copies}
    htod, memset = copies["Memcpy HtoD"], copies["Memset"]
    assert (htod.count, htod.unsized) == (2, 1)
    assert htod.total_mb == pytest.approx(1.0)
    assert htod.effective_gbs == pytest.approx(100.0)  # 1 MB in the sized copy's 10 µs
    assert htod.time_ms == pytest.approx(0.1)  # time counts every call
    assert (memset.count, memset.unsized, memset.total_mb, memset.max_gbs) == (1, 1, None, None)
    assert any("2 of 3 copies and memsets have no size" in n for n in r.notes), r.notes


def test_allocator_chains_split_interleaved_allocators() -> None:
    import numpy as np

    total = np.array([100, 8, 150, 0, 50, 4])
    nbytes = np.array([100, 8, 50, -8, -100, 4])
    assert allocator_chains(total, nbytes).tolist() == [0, 1, 0, 1, 0, 1]


def _rank_trace(rank: int, starts: list[float], ends: list[float]) -> dict:
    b = TraceBuilder()
    b.step(1, 0, 1000)
    for i, (s, e) in enumerate(zip(starts, ends)):
        b.launch("ncclKernel_AllReduce_RING_LL_Sum_float", s - 20 + i, 5, s, e - s, stream=9)
    d = b.doc()
    d["distributedInfo"] = {"rank": rank, "world_size": 2}
    return d


def test_stragglers_by_hand(write_trace) -> None:
    # Rank 1 arrives 50 µs, then 10 µs after rank 0; both collectives end together.
    write_trace(_rank_trace(0, [100, 300], [200, 350]), "run/rank0.json")
    path = write_trace(_rank_trace(1, [150, 310], [200, 350]), "run/rank1.json")
    r = stragglers(perfcast.load(path.parent))
    assert r.matched == 2 and r.candidates == [1]
    by = {x.rank: x for x in r.by_rank}
    assert by[1].times_last == 2
    assert by[1].wait_caused_ms == pytest.approx(0.06)
    assert by[1].mean_lateness_us == pytest.approx(15)
    assert r.worst[0].max_wait_us == pytest.approx(50)
    # The worst table says which collective: the first all-reduce of the unnamed group.
    assert (r.worst[0].nth_of_kind, r.worst[0].group) == (0, "(default)")


def test_stragglers_need_several_ranks(table) -> None:
    r = stragglers(table)
    assert r.candidates == [] and "several ranks" in r.notes[-1]


def test_collectives_by_hand(table) -> None:
    r = collectives(table)
    row = r.by_op[0]
    assert (row.op, row.algorithm, row.protocol) == ("allreduce", "RING", "LL")
    assert row.size_bytes == 4_000_000 and row.group_size == 2
    assert row.algbw_gbs == pytest.approx(40.0)  # 4 MB in 100 µs
    assert row.busbw_gbs == pytest.approx(40.0)  # factor 2(n-1)/n = 1 for n = 2
    assert row.link == "nvlink3"
    assert row.pct_of_peak == pytest.approx(100 * 40 / row.link_peak_gbs)


def test_collective_size_from_the_nccl_range_when_c10d_records_a_tensor_list(
    write_trace,
) -> None:
    """DDP's c10d op records its bucket as a TensorList without dims (2023-era traces, no
    collective arguments); the nccl:all_reduce range inside it records the flat tensor."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.op("c10d::allreduce_", 100, 80, **{"Input Dims": [[], [], [], []]})
    b.op("record_param_comms", 102, 70, **{"Input Dims": [[], [], [], [], [], [], []]})
    b.op(
        "nccl:all_reduce", 105, 60, cat="user_annotation",
        **{"Input Dims": [[394241]], "Input type": ["float"]},
    )  # fmt: skip
    b.launch("ncclKernel_AllReduce_RING_LL_Sum_float", 110, 5, 200, 100)
    row = collectives(perfcast.load(write_trace(b.doc()))).by_op[0]
    assert (row.op, row.dtype, row.size_bytes) == ("allreduce", "float", 4 * 394241)


def test_a_collective_no_range_sizes_is_unsized_not_zero_bytes(write_trace) -> None:
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.op("nccl:all_reduce", 105, 60, cat="user_annotation")
    b.launch("ncclKernel_AllReduce_RING_LL_Sum_float", 110, 5, 200, 100)
    r = collectives(perfcast.load(write_trace(b.doc())))
    row = r.by_op[0]
    assert (row.op, row.size_bytes, row.busbw_gbs) == ("allreduce", None, None)
    assert r.summary[0].total_mb is None and any("carry no size" in n for n in r.notes)


def test_roofline_by_hand(table) -> None:
    assert op_cost("aten::mm", [[64, 256], [256, 128]], 4) == (4194304.0, 229376.0)
    r = roofline(table)
    mm = next(o for o in r.ops if o.op == "aten::mm")
    assert mm.dtype == "fp32" and not mm.dtype_assumed  # "sgemm" in the kernel name
    assert mm.tflops == pytest.approx(2 * 64 * 256 * 128 / 40e-6 / 1e12)
    assert mm.pct_peak_flops == pytest.approx(100 * mm.tflops / mm.peak_tflops)
    add = next(o for o in r.ops if o.op == "aten::add")
    assert add.gbs == pytest.approx(3 * 64 * 128 * 4 / 10e-6 / 1e9)
    assert add.bound == "memory"


def test_roofline_bytes_and_flops_by_op_signature() -> None:
    """What each op really reads and writes: fill_ only writes, copy_ reads its source and
    writes itself, a .out variant's last tensor is its output (once counted twice: 129% of
    an A100's bandwidth), and flash-attn's q/k/v are (batch, seq, heads, dim)."""
    n = 1024 * 1024
    assert op_cost("aten::fill_", [[1024, 1024], []], 4) == (0.0, 4.0 * n)
    assert op_cost("aten::copy_", [[1024, 1024], [1024, 1024], []], 2) == (0.0, 4.0 * n)
    q, kv = [2, 3, 10, 8], [2, 3, 12, 8]
    fwd = op_cost("aten::_scaled_dot_product_flash_attention", [q, kv, kv], 2)
    assert fwd == (2.0 * 2 * 3 * 10 * 12 * 16, 2.0 * (480 + 576 + 576 + 480))
    # Backward: the output's gradient first; 2.5x the FLOPs; reads dO, q, k, v, O, writes
    # dq, dk, dv.
    bwd = op_cost("aten::_scaled_dot_product_flash_attention_backward", [q, q, kv, kv, q], 2)
    assert bwd == (2.5 * fwd[0], 2.0 * (2 * (480 + 576 + 576) + 2 * 480))
    plain = op_cost("aten::mul", [[1024, 1024], []], 4)
    assert plain is not None and plain[1] == 8.0 * n  # read self, write the result
    assert op_cost("aten::mul", [[1024, 1024], [], [1024, 1024]], 4) == plain  # mul.out
    assert op_cost("aten::add", [[4], [4], []], 4) == (4.0, 48.0)  # alpha is a scalar
    q = [8, 4096, 16, 128]
    flops, _ = op_cost("aten::_flash_attention_forward", [q, q, q], 2)  # type: ignore[misc]
    assert flops == pytest.approx(4 * 8 * 16 * 4096 * 4096 * 128)
    bhsd = [8, 16, 4096, 128]
    sdpa, _ = op_cost("aten::_scaled_dot_product_flash_attention", [bhsd] * 3, 2)  # type: ignore[misc]
    assert sdpa == flops


def test_op_input_dtype_from_input_types() -> None:
    from perfcast.ingest.input_dims import parse_input_types

    assert parse_input_types("['c10::BFloat16', 'Scalar', '']") == ("c10::BFloat16", "Scalar", "")
    assert parse_input_types("not a list") is None


def test_scopes_by_hand(table) -> None:
    r = scopes(table)
    rows = {(s.kind, s.name): s for s in r.scopes}
    block = rows[("annotation", "my_block")]
    assert block.cpu_ms == pytest.approx(0.1)
    assert block.gpu_ms == pytest.approx(0.05) and block.kernels == 2  # sgemm + add
    module = rows[("module", "nn.Module: Linear_0")]
    assert module.gpu_ms == pytest.approx(0.04)


def test_op_kernels_by_hand(table) -> None:
    r = op_kernels(table)
    mm = next(o for o in r.by_op if o.op == "aten::mm")
    assert mm.mean_op_to_launch_us == pytest.approx(10)
    assert mm.mean_runtime_delay_us == pytest.approx(80)
    assert mm.mean_op_to_kernel_us == pytest.approx(90)
    relu = next(o for o in r.by_op if o.op == "aten::relu")
    assert relu.kernels == 2 and relu.gpu_ms == pytest.approx(0.013)
    seq = next(s for s in r.sequences if s.op == "aten::relu")
    assert seq.sequence == "relu_kernel -> kw_kernel"


def test_results_are_json_and_tables(table) -> None:
    import msgspec

    result = analyze(table)
    assert set(result.results()) == set(ANALYSES)
    data = json.loads(msgspec.json.encode(result))
    assert data["idle"]["by_stream"][0]["stream"] == 7
    names = result.tables()
    assert "kernels.top" in names and "queue.series" in names
    # Figures that are not tables (stragglers' candidates, roofline's coverage) are written
    # too, one row per analysis.
    if result.stragglers is not None:
        assert "stragglers.figures" in names
        assert "candidates" in names["stragglers.figures"]
    assert len(repr(result)) < 2000
    assert len(repr(table)) < 200


def test_dataframes(table) -> None:
    pd = pytest.importorskip("pandas")
    df = table.to_pandas()
    assert len(df) == len(table) and df["name"].dtype.name == "category"
    assert isinstance(idle_time(table).to_pandas("by_stream"), pd.DataFrame)
    pa = pytest.importorskip("pyarrow")
    at = table.to_arrow()
    assert at.num_rows == len(table) and pa.types.is_dictionary(at.schema.field("name").type)
    pytest.importorskip("polars")
    assert table.to_polars().height == len(table)
    assert kernel_breakdown(table).to_polars("by_kind").height == 3
    # The whole battery names its tables as --csv names its files.
    every = analyze(table)
    assert "idle.by_stream" in every.table_names()
    assert every.to_pandas("idle.by_stream").equals(idle_time(table).to_pandas("by_stream"))


def test_cli_analyze_json_and_csv(write_trace, tmp_path: Path, capsys) -> None:
    from perfcast.cli.main import main

    path = write_trace(small_trace())
    assert main(["analyze", str(path), "--json", "-q", "--csv", str(tmp_path / "csv")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kernels"]["by_kind"][0]["kind"] == "computation"
    assert (tmp_path / "csv" / "idle.by_stream.csv").read_text().startswith("rank,device")
    assert main(["analyze", str(path), "--only", "idle,queue"]) == 0
    out = capsys.readouterr().out
    assert "idle · by_stream" in out and "kernels ·" not in out


def test_cli_analyze_bad_input(write_trace, capsys) -> None:
    from perfcast.cli.main import main

    path = write_trace(small_trace())
    assert main(["analyze", str(path), "--only", "nope"]) == 2
    assert "unknown analysis 'nope'" in capsys.readouterr().err
    assert main(["analyze", str(path.parent / "missing.json")]) == 2


def test_parquet_needs_pyarrow_or_writes(write_trace, tmp_path: Path) -> None:
    from perfcast.cli.main import main

    pytest.importorskip("pyarrow")
    path = write_trace(small_trace())
    assert main(["analyze", str(path), "-q", "--json", "--parquet", str(tmp_path / "pq")]) == 0
    assert (tmp_path / "pq" / "kernels.by_kind.parquet").is_file()


def test_result_tables_lists_empty_tables(table) -> None:
    r = stragglers(table)
    tables = result_tables(r)
    assert tables["by_rank"] == {name: [] for name in tables["by_rank"]}


def test_report_has_the_analyses_section(write_trace) -> None:
    from perfcast.report.html import render_report, report_data

    t = perfcast.load(write_trace(small_trace()))
    data = report_data(t)
    assert set(data["analyses"]["results"]) == set(ANALYSES)
    assert 'id="analyses-body"' in render_report(t)


def test_launch_queue_cupti_command_buffer_full(write_trace) -> None:
    """CUPTI's own record of a launch waiting for the command buffer, counted per stream."""
    b = TraceBuilder()
    b.launch("k1", 0, 5, 10, 40)
    b.launch("k2", 10, 50, 60, 10)
    ev = {"ph": "X", "cat": "overhead", "pid": -1, "tid": 0}
    b.events.append({**ev, "name": "Command Buffer Full", "ts": 12, "dur": 45})
    b.events.append({**ev, "name": "Activity Buffer Request", "ts": 200, "dur": 30})
    r = launch_queue(perfcast.load(write_trace(b.doc())))
    s = r.by_stream[0]
    assert (s.cupti_blocked_calls, s.cupti_blocked_ms) == (1, pytest.approx(0.045))
    assert r.depth_source == "HTA's default" and r.max_depth == 1024  # too few to read
    assert any("CUPTI recorded 1 launches" in n for n in r.notes)
    plain = TraceBuilder()
    plain.launch("k1", 0, 5, 10, 40)
    s = launch_queue(perfcast.load(write_trace(plain.doc()))).by_stream[0]
    assert s.cupti_blocked_calls is None and s.cupti_blocked_ms is None  # not recorded


def test_launch_queue_depth_and_cupti_on_h100_resnet() -> None:
    """The depth is read off the trace (1,022, as the graph reads it), and on r50_bs128 the
    launches the model finds blocked are the 13 CUPTI recorded."""
    path = Path(__file__).parents[1] / "benchmarks/accuracy/recorded/traces/h100/r50_bs128.json.gz"
    r = launch_queue(perfcast.load(str(path)))
    assert (r.max_depth, r.depth_source) == (1022, "measured on this trace")
    s = r.by_stream[0]
    assert s.cupti_blocked_calls == 13 and s.blocked_calls == 13
    assert s.blocked_ms == pytest.approx(s.cupti_blocked_ms, rel=0.02)


def test_analyses_with_nothing_to_report_say_why(shared_traces: Path) -> None:
    """On a CPU-only job the GPU analyses printed empty sections without a word."""
    a = analyze(perfcast.load(shared_traces / "hta_cpu_only_gloo_rank34.json.gz"))
    for name in ("kernels", "idle", "launches", "queue", "ops"):
        assert getattr(a, name).notes == [
            "nothing to report: the trace has no GPU work (CPU-only)"
        ], name
    assert not any("nothing to report" in n for n in a.collectives.notes)


def test_launch_queue_does_not_count_blocks_at_cudas_depth_past_which_the_queue_grew(
    shared_traces: Path,
) -> None:
    """MI300X: the queue reached 1,840 pending launches; counted against CUDA's 1,024 (HTA's
    default), 1,649 launches "blocked" that took as long as any other (3.2 µs)."""
    r = launch_queue(
        perfcast.load(shared_traces / "tracelens_mi300x_resnet_act_ckpt_rank0.json.gz")
    )
    s = max(r.by_stream, key=lambda x: x.max_length)
    assert s.max_length == 1840
    assert s.blocked_calls == 0 and s.time_at_max_ms == 0
    assert r.depth_source.startswith("unknown") and r.max_depth > 1840
    assert any("past HTA's 1,024" in n for n in r.notes)


def test_stragglers_pair_collectives_by_the_op_they_run(shared_traces: Path) -> None:
    """hta_sampled_128rank: NCCL runs its all-to-alls and all-reduces alike as SendRecv
    kernels; paired in order as one kind, 6 of 10 pairs were different collectives (an
    all-to-all on rank 0 with an all-reduce on rank 1). And all-reduces of different sizes
    on the two ranks (groups the trace does not name) are said to be uncertain."""
    r = stragglers(perfcast.load(shared_traces / "hta_sampled_128rank"))
    assert {w.kind for w in r.worst} == {"alltoall", "allreduce", "allgather"}
    assert r.matched == 10
    assert any("2 of the 4 allreduce collectives" in n for n in r.notes)


def test_summary_top_ops_count_outermost_calls_and_2021_ranges_are_scopes(tmp_path):
    """An op inside another counts once, in the outer one, even with a Python frame between
    them (a direct-parent test listed it again: 555 nested calls on the MI300X trace); a
    2021-era record_function range, recorded as a CPU op, is a scope and not an op."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.op("aten::conv2d", 10, 100)
    b.op("conv.py(12): forward", 20, 80, cat="python_function")
    b.op("aten::convolution", 30, 50)
    b.launch("sgemm", 40, 5, 60, 30)
    b.op("Optimizer.step#SGD.step", 200, 300)  # how PyTorch 1.9 recorded the range
    b.op("aten::add_", 210, 20)
    b.launch("add", 215, 5, 240, 10)
    b.op("aten::add_", 240, 20)
    b.launch("add", 245, 5, 260, 10)
    path = b.write(tmp_path / "t.json")
    ops = {o.name: o.count for o in perfcast.summary(path, correct=False).ranks[0].top_ops}
    assert ops == {"aten::conv2d": 1, "aten::add_": 2}
    found = {s.name: s for s in scopes(perfcast.load(path)).scopes}
    assert found["Optimizer.step#SGD.step"].count == 1
    assert found["Optimizer.step#SGD.step"].kernels == 2


def test_summary_cpu_phases_are_exact_on_epoch_microsecond_timestamps(tmp_path):
    """Phase times are summed in integer nanoseconds: as doubles, epoch timestamps (~1.6e18
    ns) hold only multiples of 256 ns, which moved a 2021 trace's phases by up to 70 µs."""
    b = TraceBuilder()
    t0 = 1_623_143_089_861_001
    b.step(1, t0, 100_000)
    b.op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0 + 3, 68_694)
    b.op("aten::to", t0 + 11, 7)
    b.op("aten::mm", t0 + 70_001, 1_003)
    b.launch("sgemm", t0 + 70_010, 5, t0 + 70_020, 500)
    cpu = perfcast.summary(b.write(tmp_path / "t.json"), correct=False).ranks[0].iterations[0].cpu
    assert cpu.dataloader_ms == 68.694  # the range's whole time, its op's included


def test_dataframe_dtypes_are_the_declared_ones_for_empty_and_all_none_columns(
    tmp_path: Path,
) -> None:
    """A table's dtypes do not change with the data: a column of Nones is float where the
    row declares a float, and a table of no rows keeps its columns' types (they came back
    object, null or float64, names included, so results of two traces did not concatenate)."""
    pd = pytest.importorskip("pandas")
    b = TraceBuilder()
    b.step(1, 0, 100)
    b.op("aten::mm", 10, 50)
    b.launch("sgemm", 20, 5, 30, 20)
    table = perfcast.load(b.write(tmp_path / "t.json"))
    mem = memory(table)  # no [memory] events: no allocators
    df = mem.to_pandas("allocators")
    assert len(df) == 0
    assert df["peak_mb"].dtype == np.float64 and df["events"].dtype == np.int64
    assert not pd.api.types.is_numeric_dtype(df["device"])
    summary = perfcast.summary(table, correct=False)
    steps = summary.to_pandas("steps")
    assert steps["measured_real_ms"].isna().all() and steps["measured_real_ms"].dtype == float
    scopes_df = summary.to_pandas("top_scopes")  # no scopes in this trace
    assert len(scopes_df) == 0 and scopes_df["count"].dtype == np.int64
    assert not pd.api.types.is_numeric_dtype(scopes_df["name"])
    # An optional int is pandas' nullable Int64 whether or not a None came up.
    queue = launch_queue(table).to_pandas("by_stream")
    assert str(queue["cupti_blocked_calls"].dtype) == "Int64"
    pa = pytest.importorskip("pyarrow")
    schema = mem.to_arrow("allocators").schema
    assert schema.field("peak_mb").type == pa.float64()
    assert schema.field("device").type == pa.string()
    pl = pytest.importorskip("polars")
    assert mem.to_polars("allocators").schema["events"] == pl.Int64


def test_declared_column_types_leave_containers_and_odd_values_alone() -> None:
    """list[int] is a text column (its rows are joined text, so a table of no rows is text
    too), a Callable does not break the table, and an int field holding 1.5 stays 1.5 (a
    cast would have made it 1 in silence)."""
    import dataclasses
    from collections.abc import Callable

    from perfcast.frames import columns_to_pandas, field_kinds, rows_to_columns

    row_fields = [
        ("ranks", list[int]),
        ("hook", Callable[[int], int] | None),
        ("calls", int | None),
        ("count", int),
    ]
    row = dataclasses.make_dataclass("Row", row_fields)  # annotations as objects

    assert field_kinds(row) == {"ranks": "str", "calls": "int?", "count": "int"}
    pytest.importorskip("pandas")
    df = columns_to_pandas(rows_to_columns([row([1, 2], None, None, 1.5)]))  # type: ignore[arg-type]
    assert df["ranks"][0] == "1, 2" and df["count"][0] == 1.5


def test_stragglers_leave_out_a_rank_without_collectives_and_keep_whole_ns(write_trace) -> None:
    """A rank cut before its GPU work left no collective present on every rank (nothing was
    compared); and waits were computed from epoch ns in float64 (multiples of 256 ns)."""
    epoch = 1_700_000_000_000_000.0  # µs: ~1.7e18 ns, as real traces' timestamps are
    for rank, starts in ((0, [100, 300]), (1, [150, 310])):
        d = _rank_trace(rank, [epoch + s for s in starts], [epoch + 200, epoch + 350])
        d["distributedInfo"]["world_size"] = 3
        write_trace(d, f"run/rank{rank}.json")
    bare = TraceBuilder()
    bare.step(1, epoch, 1000)
    d = bare.doc()
    d["distributedInfo"] = {"rank": 2, "world_size": 3}
    path = write_trace(d, "run/rank2.json")
    table = perfcast.load(path.parent)
    r = stragglers(table)
    assert r.matched == 2 and r.candidates == [1]
    assert any("rank 2 holds no collective" in n for n in r.notes)
    assert r.worst[0].max_wait_us == 50.0  # exactly: not 49.92 or 50.176
    assert {x.rank: x.mean_lateness_us for x in r.by_rank}[1] == 15.0


def test_a_folder_short_of_the_jobs_ranks_says_so(write_trace) -> None:
    for rank in (0, 1):
        d = _rank_trace(rank, [100], [200])
        d["distributedInfo"]["world_size"] = 4
        path = write_trace(d, f"run/rank{rank}.json")
    notes = perfcast.summary(path.parent, correct=False).notes
    assert any("the folder holds 2 of the job's 4 ranks" in n for n in notes), notes


def test_kernels_across_ranks_count_ranks_that_never_ran_them(write_trace) -> None:
    for rank in (0, 1):
        b = TraceBuilder()
        b.step(1, 0, 1000)
        b.launch("everywhere_kernel", 10, 2, 20, 50)
        if rank == 0:
            b.launch("rank0_only_kernel", 100, 2, 110, 90)
        d = b.doc()
        d["distributedInfo"] = {"rank": rank, "world_size": 2}
        path = write_trace(d, f"k/rank{rank}.json")
    rows = {r.name: r for r in perfcast.kernel_breakdown(path.parent).across_ranks}
    only = rows["rank0_only_kernel"]
    assert only.ranks == 1 and only.min_rank_ms == 0.0 and only.max_rank_ms == pytest.approx(0.09)
    assert only.spread_pct == pytest.approx(200.0)  # all of it on one rank of two
    assert rows["everywhere_kernel"].spread_pct == 0.0


def test_diff_says_when_a_and_b_hold_different_ranks(write_trace) -> None:
    for folder, ranks in (("a", (0, 1)), ("b", (2, 3))):
        for rank in ranks:
            d = _rank_trace(rank, [100], [200])
            d["distributedInfo"]["world_size"] = 4
            last = write_trace(d, f"{folder}/rank{rank}.json")
    notes = perfcast.diff(last.parent.parent / "a", last.parent).notes
    assert any("A holds ranks 0, 1, B ranks 2, 3" in n for n in notes), notes


def test_empty_tables_of_text_and_plan_degrees_concatenate_with_full_ones() -> None:
    """A prediction that applied nothing, and a plan search where nothing fits, gave Null /
    float64 columns for lists of text and for the plan's degrees: polars and Arrow refused
    to concatenate them with another trace's results."""
    pl = pytest.importorskip("polars")
    pa = pytest.importorskip("pyarrow")
    table = perfcast.load(EXAMPLE)
    none, amp = perfcast.predict(table, []), perfcast.predict(table, ["amp"])
    assert len(pl.concat([none.to_polars("applied"), amp.to_polars("applied")])) == 1
    assert pa.concat_tables([none.to_arrow("applied"), amp.to_arrow("applied")]).num_rows == 1
    fits_nothing = perfcast.plan(table, gpus=8, gpu="h100", memory_gb=0.001)
    some = perfcast.plan(table, gpus=8, gpu="h100")
    both = pl.concat([fits_nothing.to_polars("best"), some.to_polars("best")])
    assert both.schema["dp"] == pl.Int64 and both.schema["reasons"] == pl.String
    assert fits_nothing.to_pandas("best")["tp"].dtype == np.int64


def test_an_analysis_called_alone_says_why_it_is_empty(shared_traces: Path) -> None:
    """perfcast.kernel_breakdown(...) on a CPU-only trace printed a blank line (only
    perfcast.analyze carried the note), and its HTML an empty box."""
    table = perfcast.load(shared_traces / "hta_cpu_only_gloo_rank34.json.gz")
    for fn in (perfcast.kernel_breakdown, perfcast.idle_time, perfcast.launch_queue):
        result = fn(table)
        text = str(result)
        assert "no rows" in text and "no GPU work (CPU-only)" in text
        assert "(CPU-only)" in result._repr_html_()


def test_a_gpu_run_cut_before_its_gpu_events_is_not_called_cpu_only(tmp_path: Path) -> None:
    """Kineto writes GPU events after the CPU ops: a file cut at 3 MB of the H100 ResNet-50
    kept none, and plan, whatif and analyze called the run 'CPU-only'."""
    import gzip

    src = Path(__file__).parents[1] / "benchmarks/accuracy/recorded/traces/h100/r50_base.json.gz"
    cut = tmp_path / "cut.json"
    cut.write_bytes(gzip.decompress(src.read_bytes())[:3_000_000])
    table = perfcast.load(cut)
    assert not table.is_gpu().any() and table.ranks[0].truncated
    with pytest.raises(perfcast.NotApplicableError, match="no GPU work survived") as err:
        perfcast.plan(table, gpus=8)
    assert "CPU-only" not in str(err.value)
    with pytest.raises(perfcast.NotApplicableError, match="no GPU work survived"):
        perfcast.predict(table, "ddp:gpus=8")
    assert any("no GPU work survived" in n for n in perfcast.analyze(table).kernels.notes)


def test_rocm_blit_kernels_are_copies(tmp_path: Path) -> None:
    """ROCm runs device copies and fills as kernels (__amd_rocclr_copyBuffer): summary and
    the kernel breakdown counted them as compute."""
    b = TraceBuilder()
    b.step(1, 0, 100)
    b.launch("__amd_rocclr_copyBuffer", 10, 5, 20, 30, name="hipMemcpyAsync")
    b.launch("Cijk_Ailk_Bljk_SB_MT64x64x16", 40, 5, 60, 20, name="hipLaunchKernel")
    table = perfcast.load(b.write(tmp_path / "t.json"))
    step = perfcast.summary(table, correct=False).ranks[0].iterations[0]
    assert step.gpu.memcpy_exposed_ms == pytest.approx(0.030)
    assert step.gpu.compute_ms == pytest.approx(0.020)
    kinds = {row.kind: row.total_ms for row in kernel_breakdown(table).by_kind}
    assert kinds["memory"] == pytest.approx(0.030)


def test_a_downsampled_step_function_keeps_each_peak_where_it_was() -> None:
    """Counters cut to a few samples (the Perfetto export's launch queues, the report's
    series) stamped each bin's peak at the bin's first change, up to a bin early: a peak
    reached at t=7345 showed from 7300 on. Now it shows when it was reached, the level each
    bin ends on follows it, and the last sample is the series' last."""
    from perfcast.analysis.common import downsample_steps

    t = np.arange(10_000, dtype=np.int64)
    y = np.zeros(t.size, dtype=np.int64)
    y[7345] = 50
    y[-1] = 3
    ts, ys = downsample_steps(t, y, 100)
    assert ts.size <= 100 and np.all(np.diff(ts) > 0)
    assert ts[np.argmax(ys)] == 7345 and ys.max() == 50
    assert ys[np.searchsorted(ts, 7346)] == 0  # back down after the peak, within its bin
    assert (ts[-1], ys[-1]) == (9_999, 3) and (ts[0], ys[0]) == (0, 0)


def test_a_step_function_has_one_value_per_time() -> None:
    """Several changes at one time (a launch and a completion in the same ns) were samples
    with one timestamp and different values, which a viewer draws as it likes: the value
    that holds from that time on is kept, the others lasted no time."""
    from perfcast.analysis.common import downsample_steps

    t = np.array([0, 5, 5, 5, 9])
    ts, ys = downsample_steps(t, np.array([1, 2, 3, 1, 0]), 100)
    assert ts.tolist() == [0, 5, 9] and ys.tolist() == [1, 1, 0]


def test_a_cut_cpu_only_trace_stays_cpu_only(tmp_path: Path, shared_traces: Path) -> None:
    """No device named and no runtime call: a cut file is no evidence of a lost GPU side."""
    import gzip

    from perfcast.analysis.notes import no_gpu_work

    raw = gzip.decompress((shared_traces / "hta_cpu_only_gloo_rank34.json.gz").read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(raw[:22_000])
    table = perfcast.load(cut)
    assert table.ranks[0].truncated
    assert no_gpu_work(table) == "the trace has no GPU work (CPU-only)"
