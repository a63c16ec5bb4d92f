"""Tiny hand-made traces of every Kineto generation, and what the loader makes of them."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import perfcast
from perfcast.events import NONE, EventTable, Kind

CPU_PID = 4242
CPU_TID = 4243
BWD_TID = 4250


def ev(cat: str, name: str, ts: Any, dur: Any, pid: Any = CPU_PID, tid: Any = CPU_TID, **args):
    e: dict[str, Any] = {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": dur,
    }
    if args:
        e["args"] = args
    return e


def flow(cat: str, ph: str, fid: int, ts: Any, pid: Any = CPU_PID, tid: Any = CPU_TID):
    e: dict[str, Any] = {"ph": ph, "id": fid, "pid": pid, "tid": tid, "ts": ts, "cat": cat}
    e["name"] = cat
    if ph == "f":
        e["bp"] = "e"
    return e


def rows_named(table: EventTable, name: str) -> np.ndarray:
    return np.flatnonzero(table.name == table.names.index(name))


def row(table: EventTable, name: str) -> int:
    found = rows_named(table, name)
    assert found.size == 1, f"{name}: {found.size} rows"
    return int(found[0])


def name_at(table: EventTable, r: int) -> str | None:
    return None if r == NONE else table.name_of(r)


def ns(us: Any) -> int:
    """Exact nanoseconds of a microsecond timestamp as written in the JSON text."""
    return int(Decimal(repr(us)) * 1000)


def iteration_name(table: EventTable, r: int) -> str | None:
    it = int(table.iteration[r])
    return None if it == NONE else table.iterations[it].name


# ---------------------------------------------------------------------------------------------
# (a) 2021: Operator/Runtime/Kernel/Memcpy/Memset, "async" flows, integer µs, "stream 7" tids.

T21 = 1621401187223005  # integer epoch microseconds, as PyTorch 1.8 wrote them


def trace_2021() -> dict:
    t = T21
    gpu = {"pid": 0, "tid": "stream 7"}
    events = [
        ev("Operator", "ProfilerStep#3", t, 1000, **{"External id": 1}),
        ev("Operator", "aten::linear", t + 10, 100, **{"External id": 2, "Sequence number": 7}),
        # addmm and the launch inside it start in the same microsecond and end with linear.
        ev("Operator", "aten::addmm", t + 20, 90, **{"External id": 3, "Sequence number": 8}),
        ev("Runtime", "cudaLaunchKernel", t + 20, 8, correlation=100, **{"external id": 3}),
        ev(
            "Kernel",
            "volta_sgemm_128x64_nn",
            t + 40,
            15,
            **gpu,
            queued=0,
            device=0,
            context=1,
            stream=7,
            correlation=100,
            grid=[4, 2, 1],
            block=[256, 1, 1],
            **{"external id": 3},
        ),
        ev("Operator", "aten::copy_", t + 200, 30, **{"External id": 4}),
        ev("Runtime", "cudaMemcpyAsync", t + 205, 5, correlation=101, **{"external id": 4}),
        ev(
            "Memcpy",
            "Memcpy HtoD (Pageable -> Device)",
            t + 215,
            3,
            **gpu,
            device=0,
            stream=7,
            correlation=101,
            bytes=4096,
            **{"external id": 4},
        ),
        ev("Operator", "aten::zero_", t + 300, 30, **{"External id": 5}),
        ev("Runtime", "cudaMemsetAsync", t + 305, 4, correlation=102, **{"external id": 5}),
        # No device/stream args: the stream must come from the "stream 7" thread id.
        ev("Memset", "Memset (Device)", t + 312, 2, **gpu, correlation=102, bytes=512),
        # The backward pass of linear (same sequence number, on the autograd thread).
        ev(
            "Operator",
            "LinearBackward",
            t + 500,
            50,
            tid=BWD_TID,
            **{"Sequence number": 7, "Fwd thread id": CPU_TID},
        ),
        ev("Operator", "ProfilerStep#4", t + 1000, 1000, **{"External id": 6}),
        ev("Operator", "aten::relu", t + 1980, 15, **{"External id": 7}),
        ev("Runtime", "cudaLaunchKernel", t + 1990, 4, correlation=103, **{"external id": 7}),
        # Runs after its step ended on the CPU: still belongs to the step that launched it.
        ev("Kernel", "relu_kernel", t + 2005, 6, **gpu, device=0, stream=7, correlation=103),
        flow("async", "s", 100, t + 20),
        flow("async", "f", 100, t + 40, **gpu),
        flow("async", "s", 101, t + 205),
        flow("async", "f", 101, t + 215, **gpu),
        # The profiler's own span: not program activity.
        ev("Trace", "PyTorch Profiler (0)", t - 5, 3000, pid="Spans", tid="PyTorch Profiler"),
    ]
    return {"schemaVersion": 1, "traceEvents": events}


def test_2021_kinds_times_streams(write_trace):
    table = perfcast.load(write_trace(trace_2021(), "trace_2021.json"))
    assert table.check_invariants() == []
    kinds = {table.name_of(i): Kind(int(table.kind[i])) for i in range(len(table))}
    assert kinds["aten::addmm"] is Kind.CPU_OP
    assert kinds["cudaLaunchKernel"] is Kind.RUNTIME
    assert kinds["volta_sgemm_128x64_nn"] is Kind.KERNEL
    assert kinds["Memcpy HtoD (Pageable -> Device)"] is Kind.MEMCPY
    assert kinds["Memset (Device)"] is Kind.MEMSET
    assert "PyTorch Profiler (0)" not in kinds  # the "Trace" span is dropped
    assert len(table) == 16

    # Integer microseconds become exact nanoseconds (no float rounding at epoch scale).
    k = row(table, "volta_sgemm_128x64_nn")
    assert int(table.ts[k]) == (T21 + 40) * 1000
    assert int(table.dur[k]) == 15_000
    assert int(table.ts[row(table, "aten::linear")]) == (T21 + 10) * 1000

    gpu = table.is_gpu()
    assert gpu.sum() == 4
    assert set(table.tid[gpu].tolist()) == {7}
    assert set(table.pid[gpu].tolist()) == {0}
    assert table.tid[row(table, "Memset (Device)")] == 7

    assert table.grid[k].tolist() == [4, 2, 1]
    assert table.block[k].tolist() == [256, 1, 1]
    assert table.nbytes[row(table, "Memcpy HtoD (Pageable -> Device)")] == 4096
    assert table.nbytes[row(table, "Memset (Device)")] == 512
    # Lower-case "external id" (2021) and "External id" both fill external_id.
    assert table.external_id[k] == 3
    assert table.external_id[row(table, "aten::addmm")] == 3
    assert table.correlation[k] == 100


def test_2021_links_nesting_iterations(write_trace):
    table = perfcast.load(write_trace(trace_2021(), "trace_2021.json.gz"))
    launches = rows_named(table, "cudaLaunchKernel")
    k = row(table, "volta_sgemm_128x64_nn")
    assert table.launch[k] == launches[0]
    assert table.launch[row(table, "relu_kernel")] == launches[1]
    assert name_at(table, table.launch[row(table, "Memcpy HtoD (Pageable -> Device)")]) == (
        "cudaMemcpyAsync"
    )
    assert name_at(table, table.launch[row(table, "Memset (Device)")]) == "cudaMemsetAsync"
    assert (table.launch[~table.is_gpu()] == NONE).all()

    # Nesting: a launch that starts in the same microsecond as its op, and an op that ends
    # in the same microsecond as its parent, are still nested.
    assert name_at(table, table.parent[launches[0]]) == "aten::addmm"
    assert name_at(table, table.parent[row(table, "aten::addmm")]) == "aten::linear"
    assert name_at(table, table.parent[row(table, "aten::linear")]) == "ProfilerStep#3"
    assert table.parent[row(table, "ProfilerStep#3")] == NONE
    assert table.parent[row(table, "LinearBackward")] == NONE  # another thread
    assert (table.parent[table.is_gpu()] == NONE).all()

    # Forward/backward from sequence numbers (no fwdbwd flows in 2021).
    pairs = {(table.name_of(f), table.name_of(b)) for f, b in table.fwd_bwd.tolist()}
    assert pairs == {("aten::linear", "LinearBackward")}

    assert [it.name for it in table.iterations] == ["ProfilerStep#3", "ProfilerStep#4"]
    assert table.ranks[0].has_steps
    assert table.iterations[0].start_ns == T21 * 1000
    assert table.iterations[0].dur_ns == 1_000_000
    assert iteration_name(table, k) == "ProfilerStep#3"
    assert iteration_name(table, row(table, "relu_kernel")) == "ProfilerStep#4"
    assert iteration_name(table, row(table, "LinearBackward")) == "ProfilerStep#3"


# ---------------------------------------------------------------------------------------------
# (b) 2022: "async_cpu_to_gpu" flows; runtime events without a correlation argument.

T22 = 1650000000000000


def trace_2022() -> dict:
    t = T22
    gpu7 = {"pid": 0, "tid": "stream 7"}
    events = [
        ev("user_annotation", "ProfilerStep#0", t, 500),
        ev("cpu_op", "aten::mm", t + 10, 40, **{"External id": 11}),
        # The launch starts in the same microsecond as the op around it (listed after it).
        ev("cuda_runtime", "cudaLaunchKernel", t + 20, 5, **{"External id": 12}),
        ev("cpu_op", "aten::mm_inner", t + 20, 20, **{"External id": 12}),
        ev("kernel", "gemm_kernel", t + 30, 10, **gpu7, device=0, stream=7, correlation=900),
        # A GPU annotation that starts exactly with the kernel, on the same stream.
        ev("gpu_user_annotation", "## forward ##", t + 30, 100, **gpu7),
        ev("cpu_op", "aten::copy_", t + 100, 30),
        ev("cuda_runtime", "cudaMemcpyAsync", t + 105, 6),
        ev(
            "gpu_memcpy",
            "Memcpy DtoH (Device -> Pinned)",
            t + 140,
            4,
            pid=0,
            tid="stream 13",
            device=0,
            stream=13,
            correlation=901,
            bytes=1 << 20,
        ),
        flow("async_cpu_to_gpu", "s", 900, t + 20),
        flow("async_cpu_to_gpu", "f", 900, t + 30, **gpu7),
        flow("async_cpu_to_gpu", "s", 901, t + 105),
        flow("async_cpu_to_gpu", "f", 901, t + 140, pid=0, tid="stream 13"),
    ]
    return {"schemaVersion": 1, "traceEvents": events}


def test_2022_launch_links_from_flows(write_trace):
    table = perfcast.load(write_trace(trace_2022(), "trace_2022.json.gz"))
    assert table.check_invariants() == []
    k = row(table, "gemm_kernel")
    m = row(table, "Memcpy DtoH (Device -> Pinned)")
    assert Kind(int(table.kind[row(table, "## forward ##")])) is Kind.GPU_ANNOTATION
    assert table.correlation[row(table, "cudaLaunchKernel")] == NONE
    assert table.launch[k] == row(table, "cudaLaunchKernel")
    assert table.launch[m] == row(table, "cudaMemcpyAsync")
    assert (table.tid[k], table.tid[m]) == (7, 13)
    assert table.nbytes[m] == 1 << 20
    assert table.ts[k] == (T22 + 30) * 1000
    assert name_at(table, table.parent[row(table, "cudaLaunchKernel")]) == "aten::mm_inner"
    assert name_at(table, table.parent[row(table, "aten::mm_inner")]) == "aten::mm"
    assert [it.name for it in table.iterations] == ["ProfilerStep#0"]
    assert iteration_name(table, m) == "ProfilerStep#0"


# ---------------------------------------------------------------------------------------------
# (c) Current: every category, ac2g/fwdbwd flows, [memory] events, float µs, baseTimeNanoseconds.

B = 1419247332500.684  # float microseconds since boot
BASE_NS = 1751410836000000000


def at(offset: str) -> float:
    """B + offset, rounded to the nanosecond as Kineto writes it."""
    return float(Decimal(repr(B)) + Decimal(offset))


def trace_current() -> dict:
    gpu = {"pid": 0, "tid": 7}
    nccl = {"pid": 0, "tid": 20}
    rt = "cuda_runtime"

    def kernel(name: str, ts: str, dur: float, corr: int, where=gpu, **args):
        stream = where["tid"]
        return ev(
            "kernel",
            name,
            at(ts),
            dur,
            **where,
            device=0,
            stream=stream,
            correlation=corr,
            grid=[8, 1, 1],
            block=[128, 1, 1],
            **args,
        )

    def memory(ts: str, nbytes: int, total: int):
        return {
            "ph": "i",
            "cat": "cpu_instant_event",
            "s": "t",
            "name": "[memory]",
            "pid": CPU_PID,
            "tid": CPU_TID,
            "ts": at(ts),
            "args": {
                "Device Type": 1,
                "Device Id": 0,
                "Addr": 140000000000000,
                "Bytes": nbytes,
                "Total Allocated": total,
                "Total Reserved": 1 << 30,
            },
        }

    coll = {
        "Collective name": "allreduce",
        "In msg nelems": 1024,
        "Out msg nelems": 1024,
        "Group size": 8,
        "dtype": "Float",
        "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]",
    }
    events = [
        ev("user_annotation", "ProfilerStep#6", at("0"), 5000.0, **{"External id": 1}),
        ev("python_function", "train.py(10): step", at("1.001"), 4000.5),
        ev(
            "cpu_op",
            "aten::linear",
            at("10.5"),
            100.25,
            **{"External id": 2, "Input Dims": [[8, 16], [32, 16], [32]]},
        ),
        ev(
            "cpu_op", "aten::addmm", at("20.125"), 50.0, **{"External id": 3, "Sequence number": 42}
        ),
        ev(
            rt,
            "cudaLaunchKernel",
            at("30.001"),
            5.5,
            cbid=211,
            correlation=500,
            **{"External id": 3},
        ),
        kernel("ampere_sgemm_64x32_nn", "40.002", 12.345, 500, **{"External id": 3}),
        ev("gpu_user_annotation", "## forward ##", at("40.002"), 50.0, **gpu),
        # Triton launches through the driver API.
        ev("cuda_driver", "cuLaunchKernel", at("60"), 3.0, correlation=501),
        kernel("triton_poi_fused_add_0", "70.25", 2.0, 501),
        ev(rt, "cudaMemcpyAsync", at("130"), 4.0, correlation=502),
        ev(
            "gpu_memcpy",
            "Memcpy HtoD (Pinned -> Device)",
            at("140"),
            3.0,
            **gpu,
            device=0,
            stream=7,
            correlation=502,
            bytes=65536,
        ),
        ev(rt, "cudaMemsetAsync", at("150"), 2.0, correlation=503),
        ev(
            "gpu_memset",
            "Memset (Device)",
            at("155"),
            1.0,
            **gpu,
            device=0,
            stream=7,
            correlation=503,
            bytes=256,
        ),
        ev(rt, "cudaStreamSynchronize", at("160"), 30.0, correlation=504),
        ev(
            "cuda_sync",
            "Stream Sync",
            at("185"),
            1.0,
            **gpu,
            stream=7,
            correlation=504,
            cuda_sync_kind="Stream Sync",
        ),
        memory("200", 1024, 1 << 20),
        memory("210", -1024, (1 << 20) - 1024),
        # A collective: args on the record_param_comms op, none on the kernel.
        ev("cpu_op", "record_param_comms", at("300"), 80.0, **coll),
        ev("cpu_op", "nccl:all_reduce", at("310"), 60.0),
        ev(rt, "cudaLaunchKernel", at("320"), 8.0, correlation=505),
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "330", 400.0, 505, where=nccl),
        # A collective kernel with its own args keeps them.
        ev(rt, "cudaLaunchKernel", at("900"), 8.0, correlation=506),
        kernel(
            "ncclDevKernel_AllGather_RING_LL",
            "910",
            100.0,
            506,
            where=nccl,
            **{
                "Collective name": "allgather",
                "In msg nelems": 64,
                "Out msg nelems": 512,
                "Group size": 8,
                "dtype": "BFloat16",
            },
        ),
        # Backward of addmm on the autograd thread, tied by a fwdbwd flow.
        ev(
            "cpu_op",
            "autograd::engine::evaluate_function: AddmmBackward0",
            at("2000"),
            100.0,
            tid=BWD_TID,
        ),
        ev(
            "cpu_op",
            "AddmmBackward0",
            at("2001.5"),
            90.0,
            tid=BWD_TID,
            **{"Sequence number": 42, "Fwd thread id": 1},
        ),
        flow("ac2g", "s", 500, at("30.001")),
        flow("ac2g", "f", 500, at("40.002"), **gpu),
        flow("ac2g", "s", 505, at("320")),
        flow("ac2g", "f", 505, at("330"), **nccl),
        flow("fwdbwd", "s", 42, at("20.125")),
        flow("fwdbwd", "f", 42, at("2001.5"), tid=BWD_TID),
        {
            "name": "thread_name",
            "ph": "M",
            "ts": at("0"),
            "pid": CPU_PID,
            "tid": CPU_TID,
            "args": {"name": "python main thread"},
        },
        {
            "name": "process_name",
            "ph": "M",
            "ts": at("0"),
            "pid": CPU_PID,
            "tid": 0,
            "args": {"name": "python3"},
        },
        {
            "name": "Iteration Start: PyTorch Profiler",
            "ph": "i",
            "s": "g",
            "pid": "Traces",
            "tid": "Trace PyTorch Profiler",
            "ts": at("0"),
        },
        ev("Trace", "PyTorch Profiler (0)", at("-1"), 9000.0, pid="Spans", tid="PyTorch Profiler"),
    ]
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}],
        "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8},
        "traceEvents": events,
        "traceName": "/tmp/rank3.pt.trace.json",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_NS,
    }


def test_current_kinds_and_metadata(write_trace):
    table = perfcast.load(write_trace(trace_current(), "current.pt.trace.json"))
    assert table.check_invariants() == []
    expected = {
        "ProfilerStep#6": Kind.USER_ANNOTATION,
        "train.py(10): step": Kind.PYTHON_FUNCTION,
        "aten::addmm": Kind.CPU_OP,
        "cudaLaunchKernel": Kind.RUNTIME,
        "cuLaunchKernel": Kind.DRIVER,
        "ampere_sgemm_64x32_nn": Kind.KERNEL,
        "Memcpy HtoD (Pinned -> Device)": Kind.MEMCPY,
        "Memset (Device)": Kind.MEMSET,
        "## forward ##": Kind.GPU_ANNOTATION,
        "Stream Sync": Kind.CUDA_SYNC,
        "[memory]": Kind.MEMORY,
    }
    for name, kind in expected.items():
        assert {Kind(int(table.kind[r])) for r in rows_named(table, name)} == {kind}, name
    assert "Iteration Start: PyTorch Profiler" not in table.names
    assert "PyTorch Profiler (0)" not in table.names
    assert len(table) == 25

    info = table.ranks[0]
    assert (info.rank, info.world_size, info.backend) == (3, 8, "nccl")
    assert info.device_name == "NVIDIA H100 80GB HBM3"
    assert info.base_ns == BASE_NS
    assert not info.truncated and info.salvage_note is None
    assert set(table.rank.tolist()) == {3}
    assert table.thread_names[(3, CPU_PID, CPU_TID)] == "python main thread"

    # Float microseconds with ns digits -> exact integer nanoseconds.
    k = row(table, "ampere_sgemm_64x32_nn")
    assert int(table.ts[k]) == ns(at("40.002"))
    assert int(table.dur[k]) == 12_345
    assert int(table.ts[row(table, "aten::addmm")]) == ns(at("20.125"))
    assert table.shapes[row(table, "aten::linear")] >= 0
    assert "[8, 16]" in table.names[table.shapes[row(table, "aten::linear")]]

    mem = rows_named(table, "[memory]")
    assert table.nbytes[mem].tolist() == [1024, -1024]
    assert table.mem_total[mem].tolist() == [1 << 20, (1 << 20) - 1024]
    assert (table.dur[mem] == 0).all()

    assert set(table.tid[rows_named(table, "ncclDevKernel_AllReduce_Sum_f32_RING_LL")]) == {20}
    assert table.tid[k] == 7 and table.pid[k] == 0


def test_current_links(write_trace):
    table = perfcast.load(write_trace(trace_current(), "current.pt.trace.json.gz"))
    launches = rows_named(table, "cudaLaunchKernel")
    k = row(table, "ampere_sgemm_64x32_nn")
    assert table.launch[k] == launches[0]
    assert table.launch[row(table, "triton_poi_fused_add_0")] == row(table, "cuLaunchKernel")
    assert name_at(table, table.launch[row(table, "Memset (Device)")]) == "cudaMemsetAsync"
    assert table.launch[row(table, "Memcpy HtoD (Pinned -> Device)")] == row(
        table, "cudaMemcpyAsync"
    )
    ar = row(table, "ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    assert table.launch[ar] == launches[1]
    assert table.launch[row(table, "## forward ##")] == NONE
    assert table.launch[row(table, "Stream Sync")] == NONE

    fb = {(table.name_of(f), table.name_of(b)) for f, b in table.fwd_bwd.tolist()}
    assert fb == {("aten::addmm", "AddmmBackward0")}

    assert name_at(table, table.parent[launches[0]]) == "aten::addmm"
    assert name_at(table, table.parent[row(table, "aten::addmm")]) == "aten::linear"
    assert name_at(table, table.parent[row(table, "aten::linear")]) == "train.py(10): step"
    assert name_at(table, table.parent[row(table, "train.py(10): step")]) == "ProfilerStep#6"
    assert name_at(table, table.parent[launches[1]]) == "nccl:all_reduce"
    assert name_at(table, table.parent[row(table, "nccl:all_reduce")]) == "record_param_comms"
    assert (
        name_at(table, table.parent[row(table, "AddmmBackward0")])
        == "autograd::engine::evaluate_function: AddmmBackward0"
    )

    # The NCCL kernel inherits the collective args of the enclosing record_param_comms.
    assert table.names[table.coll_name[ar]] == "allreduce"
    assert (table.coll_in[ar], table.coll_out[ar], table.coll_group[ar]) == (1024, 1024, 8)
    assert table.names[table.coll_dtype[ar]] == "Float"
    assert table.names[table.coll_ranks[ar]] == "[0, 1, 2, 3, 4, 5, 6, 7]"
    ag = row(table, "ncclDevKernel_AllGather_RING_LL")
    assert table.names[table.coll_name[ag]] == "allgather"
    assert (table.coll_in[ag], table.coll_out[ag]) == (64, 512)
    assert table.names[table.coll_dtype[ag]] == "BFloat16"
    assert table.coll_name[k] == NONE

    assert [it.name for it in table.iterations] == ["ProfilerStep#6"]
    assert table.iterations[0].start_ns == ns(B)
    assert table.iterations[0].end_ns == ns(B) + 5_000_000
    assert iteration_name(table, ar) == "ProfilerStep#6"
    assert iteration_name(table, row(table, "AddmmBackward0")) == "ProfilerStep#6"


# ---------------------------------------------------------------------------------------------
# (d) A bare JSON array of events, without ProfilerStep.


def test_bare_array_without_steps(write_trace):
    t = 1000.0
    events = [
        ev("cpu_op", "aten::add", t, 20.0),
        ev("cuda_runtime", "cudaLaunchKernel", t + 5, 5.0, correlation=1),
        ev("kernel", "add_kernel", t + 15, 10.0, pid=1, tid=9, device=1, stream=9, correlation=1),
        ev("cpu_op", "aten::mul", t + 50, 10.0),
    ]
    table = perfcast.load(write_trace(events, "bare.json"))
    assert table.check_invariants() == []
    assert len(table) == 4
    assert table.kind.tolist() == [Kind.CPU_OP, Kind.RUNTIME, Kind.KERNEL, Kind.CPU_OP]
    assert table.launch[2] == 1
    assert (table.pid[2], table.tid[2]) == (1, 9)
    assert table.parent.tolist() == [NONE, 0, NONE, NONE]
    info = table.ranks[0]
    assert info.has_steps is False
    assert [it.name for it in table.iterations] == ["whole trace"]
    assert table.iterations[0].start_ns == 1_000_000
    assert table.iterations[0].end_ns == 1_060_000
    assert (table.iteration == 0).all()


def test_dict_without_steps_is_whole_trace(write_trace):
    trace = trace_2022()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e["name"] != "ProfilerStep#0"]
    table = perfcast.load(write_trace(trace))
    assert table.ranks[0].has_steps is False
    assert [it.name for it in table.iterations] == ["whole trace"]
    assert table.iterations[0].start_ns == (T22 + 10) * 1000
    assert table.iterations[0].end_ns == (T22 + 144) * 1000


# ---------------------------------------------------------------------------------------------
# (e) ROCm: hipLaunchKernel runtime calls, cat "kernel", GPU pid = device 2, ac2g "f" on the CPU.


def trace_rocm() -> dict:
    t = 4203669603187.439
    gpu = {"pid": 2, "tid": 0}

    def us(off: float) -> float:
        return round(t + off, 3)

    events = [
        ev("user_annotation", "ProfilerStep#1", us(0), 9288.291, **{"External id": 1}),
        ev("cpu_op", "aten::add", us(100), 50.0, **{"External id": 8}),
        ev(
            "cuda_runtime",
            "hipLaunchKernel",
            us(110),
            12.5,
            stream="0x0",
            cid=153,
            correlation=117,
            **{"External id": 8},
        ),
        ev(
            "kernel",
            "void at::native::elementwise_kernel<128, 2>",
            us(130),
            4.2,
            **gpu,
            device=2,
            stream=0,
            correlation=117,
            grid=[1024, 1, 1],
            block=[128, 1, 1],
            **{"External id": 8},
        ),
        ev("cpu_op", "aten::copy_", us(200), 80.0, **{"External id": 9}),
        ev(
            "cuda_runtime",
            "hipMemcpyWithStream",
            us(205),
            60.2,
            stream="0x0",
            correlation=118,
            size="2560",
            kind="1",
        ),
        ev(
            "gpu_memcpy",
            "Memcpy HtoD (Host -> Device)",
            us(215),
            22.4,
            **gpu,
            device=2,
            stream=0,
            correlation=118,
            kind="HtoD",
        ),
        ev("cuda_runtime", "hipExtModuleLaunchKernel", us(400), 9.0, correlation=119),
        ev(
            "kernel",
            "Cijk_Alik_Bljk_SB_MT128x128x8",
            us(420),
            30.0,
            **gpu,
            device=2,
            stream=0,
            correlation=119,
        ),
        flow("ac2g", "s", 117, us(110)),
        flow("ac2g", "f", 117, us(130), **gpu),
        flow("ac2g", "s", 119, us(400)),
        flow("ac2g", "f", 119, us(400)),  # ROCm 6 draws some "f" ends on the CPU thread
    ]
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 2, "name": "AMD Instinct MI300X", "warpSize": 64}],
        "roctracer_version": 4,
        "traceEvents": events,
        "baseTimeNanoseconds": 1735632360000000000,
    }


def test_rocm(write_trace):
    table = perfcast.load(write_trace(trace_rocm(), "mi300x.json.gz"))
    assert table.check_invariants() == []
    assert table.ranks[0].device_name == "AMD Instinct MI300X"
    kernels = table.rows(Kind.KERNEL)
    assert table.names_of(kernels) == [
        "void at::native::elementwise_kernel<128, 2>",
        "Cijk_Alik_Bljk_SB_MT128x128x8",
    ]
    assert table.names_of(table.launch[kernels]) == ["hipLaunchKernel", "hipExtModuleLaunchKernel"]
    m = row(table, "Memcpy HtoD (Host -> Device)")
    assert name_at(table, table.launch[m]) == "hipMemcpyWithStream"
    assert set(table.pid[table.is_gpu()].tolist()) == {2}
    assert set(table.tid[table.is_gpu()].tolist()) == {0}
    assert name_at(table, table.parent[row(table, "hipLaunchKernel")]) == "aten::add"
    assert table.grid[kernels[0]].tolist() == [1024, 1, 1]
    assert [it.name for it in table.iterations] == ["ProfilerStep#1"]
    assert (table.iteration[table.is_gpu()] == 0).all()


# ---------------------------------------------------------------------------------------------
# Multi-rank folders and odd values.


def test_folder_of_ranks(write_trace, tmp_path):
    for r in (1, 0):
        trace = trace_current()
        trace["distributedInfo"]["rank"] = r
        write_trace(trace, f"job/r{r}.json.gz")
    table = perfcast.load(tmp_path / "job")
    assert table.rank_ids() == [0, 1]
    n = len(table) // 2
    assert table.rank[:n].tolist() == [0] * n and table.rank[n:].tolist() == [1] * n
    assert [(it.rank, it.name) for it in table.iterations] == [
        (0, "ProfilerStep#6"),
        (1, "ProfilerStep#6"),
    ]
    # Links of the second rank point into its own rows.
    gpu = np.flatnonzero(table.launch >= 0)
    assert (table.rank[table.launch[gpu]] == table.rank[gpu]).all()
    assert (table.rank[table.fwd_bwd[:, 0]] == table.rank[table.fwd_bwd[:, 1]]).all()
    assert (table.iteration[table.rank == 1] != 0).all()
    assert table.check_invariants() == []


def test_rank_from_file_name_when_no_distributed_info(write_trace, tmp_path):
    for r in (0, 1):
        write_trace(trace_2022(), f"job/worker{r}.json")
    table = perfcast.load(tmp_path / "job")
    assert table.rank_ids() == [0, 1]
    assert [r.path.endswith(f"worker{i}.json") for i, r in enumerate(table.ranks)] == [True, True]


@pytest.mark.parametrize("bad", [None, "abc", [1, 2], {"x": 1}])
def test_unreadable_timestamps_are_dropped(write_trace, bad):
    trace = trace_current()
    trace["traceEvents"][1]["ts"] = bad  # the python_function row
    table = perfcast.load(write_trace(trace))
    assert "train.py(10): step" not in table.names_of(np.arange(len(table)))
    # A missing time is "unreadable"; a time of the wrong type is named as such.
    expect = "without a readable time were skipped" if bad is None else "'ts' is "
    assert any(expect in w for w in table.ranks[0].warnings), table.ranks[0].warnings
    assert table.check_invariants() == []


def test_out_of_range_numbers_do_not_crash(write_trace):
    """Huge integers (a corrupt file, a hand edit) are treated as missing, not overflowed."""
    huge = 10**30
    trace = trace_current()
    events = trace["traceEvents"]
    events[0]["ts"] = huge  # ProfilerStep#6: unreadable time, dropped
    events[2]["dur"] = huge  # aten::linear
    events[3]["args"]["Sequence number"] = huge
    events[4]["args"]["correlation"] = huge
    events[5]["args"]["grid"] = [huge, 1, 1]
    events[5]["args"]["stream"] = huge
    events[10]["args"]["bytes"] = -huge
    events[15]["args"]["Total Allocated"] = huge
    table = perfcast.load(write_trace(trace))
    assert table.check_invariants() == []
    assert "ProfilerStep#6" not in table.names_of(np.arange(len(table)))
    assert len(table) == 23
    k = row(table, "ampere_sgemm_64x32_nn")
    # The launch lost its correlation id; the ac2g flow still ties the kernel to it.
    assert table.launch[k] == rows_named(table, "cudaLaunchKernel")[0]
    assert table.correlation[rows_named(table, "cudaLaunchKernel")[0]] == NONE
    assert table.grid[k].tolist() == [0, 0, 0]
    assert table.tid[k] == 7  # the stream arg is unusable: the thread id says 7
    assert table.nbytes[row(table, "Memcpy HtoD (Pinned -> Device)")] == NONE


def test_gpu_event_before_its_launch_is_not_linked(write_trace):
    """CPU/GPU clock skew can draw a kernel before its launch; the table stays consistent."""
    trace = trace_current()
    for e in trace["traceEvents"]:
        if e.get("name") == "ampere_sgemm_64x32_nn" or (e["ph"] == "f" and e.get("id") == 500):
            e["ts"] = at("25")  # the launch starts at 30.001
    table = perfcast.load(write_trace(trace))
    assert table.check_invariants() == []
    k = row(table, "ampere_sgemm_64x32_nn")
    assert table.launch[k] == NONE
    assert table.launch[row(table, "triton_poi_fused_add_0")] == row(table, "cuLaunchKernel")
    assert any("before" in w and "launch" in w for w in table.ranks[0].warnings)


def _stopped_inside(extra_end_us: float, kernel_end_us: float | None = None) -> dict:
    """Two steps; the last step ends inside an optimizer range that the trace ends
    `extra_end_us` after the step (the profiler stopped inside it)."""
    from tests.tracegen import TraceBuilder

    b = TraceBuilder()
    for k in range(2):
        t = k * 1000.0
        b.step(k + 1, t, 900)
        b.op("aten::mm", t + 100, 300)
        end = t + 900 + (extra_end_us if k == 1 else 5)
        b.op("Optimizer.step#SGD.step", t + 800, end - (t + 800), cat="user_annotation")
        b.op("aten::add_", t + 820, 50)
    if kernel_end_us is not None:
        b.launch("gemm_kernel", 1100, 5, 1200, kernel_end_us - 1200)
    return b.doc()


def test_a_range_open_when_the_profiler_stopped_ends_with_the_trace(write_trace) -> None:
    table = perfcast.load(write_trace(_stopped_inside(5000.0)))
    opt = [r for r in range(len(table)) if table.name_of(r) == "Optimizer.step#SGD.step"]
    durs = sorted(int(table.dur[r]) for r in opt)
    # The first step's range keeps its 105 µs; the last one's 5.1 ms becomes 100 µs (to its
    # step's end, where the trace's other events end).
    assert durs == [100_000, 105_000]
    (note,) = [w for w in table.ranks[0].warnings if "profiler stopped" in w]
    assert "Optimizer.step#SGD.step" in note and "5.00 ms later" in note


def test_a_range_ending_before_the_trace_does_is_kept(write_trace) -> None:
    # A kernel of the last step runs until 3 ms after it: the range ended before that.
    table = perfcast.load(write_trace(_stopped_inside(1000.0, kernel_end_us=5000.0)))
    opt = [r for r in range(len(table)) if table.name_of(r) == "Optimizer.step#SGD.step"]
    assert sorted(int(table.dur[r]) for r in opt) == [105_000, 1_100_000]
    assert not any("profiler stopped" in w for w in table.ranks[0].warnings)


def test_a_last_step_without_work_is_not_a_step(write_trace) -> None:
    from tests.tracegen import TraceBuilder

    b = TraceBuilder()
    for k in range(2):
        b.step(k + 1, k * 1000.0, 900)
        b.op("aten::mm", k * 1000.0 + 100, 300)
    b.step(3, 2000.0, 50)  # the profiler stopped as step 3 began: nothing inside it
    table = perfcast.load(write_trace(b.doc()))
    assert [it.name for it in table.iterations] == ["ProfilerStep#1", "ProfilerStep#2"]
    (note,) = [w for w in table.ranks[0].warnings if "holds no work" in w]
    assert "ProfilerStep#3" in note
    # A step with an op inside it is a step, however short; so is a trace's only step.
    b.op("aten::add", 2010.0, 5)
    assert len(perfcast.load(write_trace(b.doc())).iterations) == 3
    only = TraceBuilder()
    only.step(1, 0.0, 50)
    assert len(perfcast.load(write_trace(only.doc())).iterations) == 1


def test_ranges_open_at_the_stop_are_cut_under_python_frames_too(write_trace) -> None:
    # `perfcast profile --with-stack`: a <module> frame spans the whole trace and the stop's
    # own frame starts after the last step; neither keeps the optimizer's range open.
    doc = _stopped_inside(5000.0)
    doc["traceEvents"] += [
        {"ph": "X", "cat": "python_function", "name": "train.py(9): <module>", "pid": 1,
         "tid": 1, "ts": 0.0, "dur": 6900.0},
        {"ph": "X", "cat": "python_function", "name": "torch/profiler/profiler.py(848): stop",
         "pid": 1, "tid": 1, "ts": 1950.0, "dur": 4950.0},
    ]  # fmt: skip
    table = perfcast.load(write_trace(doc))
    opt = [r for r in range(len(table)) if table.name_of(r) == "Optimizer.step#SGD.step"]
    assert sorted(int(table.dur[r]) for r in opt) == [100_000, 105_000]
    (note,) = [w for w in table.ranks[0].warnings if "profiler stopped" in w]
    assert "'Optimizer.step#SGD.step'" in note  # named before any Python frame


def test_a_program_that_went_on_after_its_last_step_keeps_its_ranges(write_trace) -> None:
    # A DataLoader range open across the last step's end, with an op of its own after it:
    # the program ran on; the range really took that long.
    from tests.tracegen import TraceBuilder

    b = TraceBuilder()
    for k in range(2):
        b.step(k + 1, k * 1000.0, 900)
        b.op("aten::mm", k * 1000.0 + 100, 300)
    b.op("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 1850, 2050,
         cat="user_annotation")  # fmt: skip
    b.op("aten::copy_", 3000, 890)
    table = perfcast.load(write_trace(b.doc()))
    nxt = [r for r in range(len(table)) if table.name_of(r).startswith("enumerate")]
    assert [int(table.dur[r]) for r in nxt] == [2_050_000]
    assert not any("profiler stopped" in w for w in table.ranks[0].warnings)


def test_epoch_nanosecond_timestamps_are_read_exactly(shared_traces: Path) -> None:
    """hta_v100_ns_resolution writes epoch microseconds with 3 decimals (~1.7e15): a double
    holds them only to 0.125 µs, which moved idle gaps between categories (host wait 1.29
    against the exact 1.347 ms). Their text is read instead."""
    import gzip
    import json

    path = shared_traces / "hta_v100_ns_resolution.json.gz"
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    table = perfcast.load(path)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"][:200]
    want = sorted(int(Decimal(e["ts"]) * 1000) for e in kernels)
    got = set((table.ts[table.kind == perfcast.Kind.KERNEL]).tolist())
    assert set(want) <= got
    idle = perfcast.idle_time(table).by_stream[0]
    assert idle.host_wait_ms == pytest.approx(1.347125, abs=1e-6)


def test_a_comma_before_the_lists_end_is_no_cut(tmp_path) -> None:
    """`...},]` (a hand-joined trace): both events kept and no cut reported (the last event
    was dropped as 'the unfinished one at the cut'); a trailing comma inside an event's
    array is still that event's damage, the events around it kept."""
    event = '{{"ph":"X","cat":"cpu_op","name":"{}","pid":1,"tid":1,"ts":{},"dur":5{}}}'
    trailing = tmp_path / "trailing.json"
    trailing.write_text(
        '{"traceEvents":[' + event.format("aten::mm", 10, "") + ","
        + event.format("aten::add", 20, "") + ',]}'
    )  # fmt: skip
    table = perfcast.load(trailing)
    assert sorted(table.names[i] for i in table.name) == ["aten::add", "aten::mm"]
    assert not table.ranks[0].truncated
    nested = tmp_path / "nested.json"
    bad = ',"args":{"Input Dims":[[1,2],]}'
    nested.write_text(
        '{"traceEvents":[' + event.format("aten::mm", 10, "") + ","
        + event.format("aten::bad", 15, bad) + "," + event.format("aten::add", 20, "")
        + '],"schemaVersion":1}'
    )  # fmt: skip
    table = perfcast.load(nested)
    assert sorted(table.names[i] for i in table.name) == ["aten::add", "aten::mm"]


def test_a_step_outliving_the_recorded_window_is_cut_at_its_end(write_trace) -> None:
    """HTA's Triton sample: ProfilerStep#1 lasts 13.3 s, its work 0.3 ms, and Kineto's
    "Record Window End" marker comes 1.8 ms after the step began. The step ends there."""
    from tests.tracegen import TraceBuilder

    b = TraceBuilder()
    b.step(1, 0.0, 5_000_000.0)
    b.op("aten::mm", 100.0, 300)
    b.launch("gemm", 120.0, 10, 200.0, 400.0)
    b.events.append({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "",
                     "ts": 2000.0})  # fmt: skip
    table = perfcast.load(write_trace(b.doc()))
    (it,) = table.iterations
    assert it.end_ns - it.start_ns == 2_000_000
    (note,) = [w for w in table.ranks[0].warnings if "Record Window End" in w]
    assert "ProfilerStep#1 ends 4,998.00 ms after" in note
    # A marker after the step's end changes nothing, and so does a step within 0.1 ms of it.
    b.events[-1]["ts"] = 6_000_000.0
    assert perfcast.load(write_trace(b.doc())).iterations[0].end_ns == 5_000_000_000
    b.events[-1]["ts"] = 4_999_950.0
    table = perfcast.load(write_trace(b.doc()))
    assert table.iterations[0].end_ns == 5_000_000_000 and not table.ranks[0].warnings


def test_the_shared_triton_sample_step_is_its_recorded_window(shared_traces) -> None:
    table = perfcast.load(shared_traces / "hta_triton_example_a100.json.gz")
    (it,) = table.iterations
    assert (it.end_ns - it.start_ns) / 1e6 < 2.0  # was 13,336 ms


def test_a_copy_takes_its_size_from_its_rocm_runtime_call(write_trace, shared_traces) -> None:
    """ROCm 6.2 writes a copy's size on hipMemcpyWithStream ("size": "2560"), not on the
    copy: 'memory' said both of the MI250 trace's copies had no size."""
    from tests.tracegen import TraceBuilder

    b = TraceBuilder()
    b.step(1, 0.0, 100.0)
    corr = b.launch("Memcpy HtoD (Host -> Device)", 10, 5, 20, 4, cat="gpu_memcpy",
                    name="hipMemcpyWithStream")  # fmt: skip
    call = next(e for e in b.events if e.get("args", {}).get("correlation") == corr)
    call["args"]["size"] = "2560"
    table = perfcast.load(write_trace(b.doc()))
    copy = int(np.flatnonzero(table.kind == Kind.MEMCPY)[0])
    assert table.nbytes[copy] == 2560
    assert (table.nbytes[table.kind == Kind.RUNTIME] < 0).all()  # a GPU row's column
    mi250 = perfcast.memory(shared_traces / "hta_mi250_minitoy_train.json.gz")
    (row,) = mi250.copies
    assert row.total_mb == pytest.approx(2 * 2560 / 1e6) and row.unsized == 0
