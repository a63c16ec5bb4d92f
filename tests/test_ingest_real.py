"""Every real trace in /work/shared/traces loads, and agrees with a plain stdlib-json reading."""

from __future__ import annotations

import gzip
import json
import math
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

import perfcast
from perfcast.errors import TraceFormatError
from perfcast.events import NONE, EventTable, Kind
from tests.conftest import SHARED_TRACES

# Over ~10 MB of JSON: loading them and reading them again with stdlib json takes seconds.
BIG = {
    "hta_ddp_v100_rank1_memory.json.gz",
    "hta_a100_rank0_of16.json.gz",
    "tracelens_h100_timesformer.json.gz",
    "tracelens_mi300x_resnet_act_ckpt_rank0.json.gz",
    "tracelens_mi300x_sglang_qwen3_8b.json.gz",
}
FOLDERS = {"hta_sampled_128rank": [0, 1], "dlrm_v100_8rank": list(range(8))}


def _files() -> list[str]:
    found = sorted(p.name for p in SHARED_TRACES.glob("*.json*"))
    return found or ["(no shared traces)"]


def _param(name: str):
    marks = [pytest.mark.slow] if name in BIG else []
    return pytest.param(name, marks=marks, id=name.removesuffix(".json.gz"))


def raw_events(path: Path) -> list[dict]:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    # Decimal keeps float microseconds exact, to check the nanosecond conversion.
    trace = json.loads(data, parse_float=Decimal)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def raw_summary(events: list[dict]) -> dict:
    kernels = [
        e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"
    ]
    steps = {
        e["name"]
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    }
    return {
        "kernels": len(kernels),
        "kernel_ts_ns": sorted(int(Decimal(e["ts"]) * 1000) for e in kernels),
        # Float µs are decoded as float64: exact to the ns below 2**43 µs, else within
        # half a float spacing (±125 ns for epoch-based µs, ~1.7e15).
        "ts_tolerance_ns": max(
            (
                int(math.ulp(float(e["ts"])) * 500 + 0.5)
                for e in kernels
                if isinstance(e["ts"], Decimal)
            ),
            default=0,
        ),
        "steps": steps,
    }


def check_rank(table: EventTable, rank: int, raw: dict) -> None:
    rows = table.rows(Kind.KERNEL, rank=rank)
    assert rows.size == raw["kernels"]
    got = np.sort(table.ts[rows])
    expected = np.array(raw["kernel_ts_ns"], dtype=np.int64)
    assert np.abs(got - expected).max(initial=0) <= raw["ts_tolerance_ns"]
    iterations = [it for it in table.iterations if it.rank == rank]
    info = table.rank_info(rank)
    assert not info.truncated and info.salvage_note is None
    if raw["steps"]:
        assert info.has_steps
        # A last step the profiler stopped in as it began holds no work: left out, and said.
        empty = {s for s in raw["steps"] if any(f"last step, {s} (" in w for w in info.warnings)}
        assert len(empty) <= 1
        assert {it.name for it in iterations} == raw["steps"] - empty
        assert len(iterations) == len(raw["steps"]) - len(empty)
    else:
        assert not info.has_steps
        assert [it.name for it in iterations] == ["whole trace"]
    assert all(it.end_ns >= it.start_ns for it in iterations)


def check_links(table: EventTable) -> None:
    assert table.check_invariants() == []
    linked = np.flatnonzero(table.launch >= 0)
    assert table.is_gpu()[linked].all()
    launchers = table.kind[table.launch[linked]]
    assert np.isin(launchers, [Kind.RUNTIME, Kind.DRIVER]).all()
    assert (table.rank[table.launch[linked]] == table.rank[linked]).all()
    if len(table.fwd_bwd):
        assert (table.kind[table.fwd_bwd] == Kind.CPU_OP).all()
    has_parent = np.flatnonzero(table.parent != NONE)
    par = table.parent[has_parent]
    assert (table.ts[par] <= table.ts[has_parent]).all()
    assert (table.end[par] >= table.end[has_parent]).all()


@pytest.mark.parametrize("name", [_param(n) for n in _files()])
def test_real_trace_loads(shared_traces: Path, name: str):
    path = shared_traces / name
    table = perfcast.load(path)
    assert len(table.ranks) == 1
    rank = table.ranks[0].rank
    assert set(np.unique(table.rank).tolist()) <= {rank}
    check_rank(table, rank, raw_summary(raw_events(path)))
    check_links(table)


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_real_rank_folder(shared_traces: Path, folder: str):
    table = perfcast.load(shared_traces / folder)
    assert table.rank_ids() == FOLDERS[folder]
    assert sorted(set(table.rank.tolist())) == FOLDERS[folder]
    files = sorted((shared_traces / folder).glob("*.json.gz"))
    assert sorted(Path(r.path).name for r in table.ranks) == [f.name for f in files]
    for info in table.ranks:
        check_rank(table, info.rank, raw_summary(raw_events(Path(info.path))))
    check_links(table)


def test_world_info(shared_traces: Path):
    table = perfcast.load(shared_traces / "dlrm_v100_8rank")
    assert {(r.world_size, r.backend) for r in table.ranks} == {(8, "nccl")}
    assert {r.device_name for r in table.ranks} == {"Tesla V100-SXM2-32GB"}
    one = perfcast.load(shared_traces / "hta_cpu_only_gloo_rank34.json.gz")
    assert (one.ranks[0].rank, one.ranks[0].world_size, one.ranks[0].backend) == (34, 300, "gloo")
    assert one.ranks[0].base_ns == 1719853884000000000


def test_nccl_collective_args(shared_traces: Path):
    table = perfcast.load(shared_traces / "hta_ddp_a100_rank0_nccl_args.json.gz")
    kernels = table.rows(Kind.KERNEL)
    nccl = kernels[[n.startswith("ncclKernel") for n in table.names_of(kernels)]]
    assert nccl.size > 0
    assert (table.coll_name[nccl] >= 0).all()
    # DDP broadcasts the parameters once, then all-reduces gradients.
    assert {table.names[i] for i in table.coll_name[nccl].tolist()} == {"allreduce", "broadcast"}
    assert (table.coll_group[nccl] == 2).all()
    assert (table.coll_in[nccl] > 0).all()
    assert len(table.fwd_bwd) > 0


@pytest.mark.parametrize(
    "et", ["et/hta_simple_add_a100_et.json.gz", "et/param_resnet_2gpu_et.json.gz"]
)
def test_execution_trace_is_not_a_kineto_trace(shared_traces: Path, et: str):
    """Execution Traces sit next to the Kineto traces; loading one says what it is not."""
    with pytest.raises(TraceFormatError, match="traceEvents") as err:
        perfcast.load(shared_traces / et)
    assert Path(et).name in str(err.value)


def test_parallel_load_matches_sequential(shared_traces, monkeypatch):
    """A folder loaded by worker processes gives the same table as one loaded in-process."""
    from perfcast import parallel

    folder = shared_traces / "dlrm_v100_8rank"
    monkeypatch.setattr(parallel, "MIN_BYTES", 10**12)
    seq = perfcast.load(folder)
    monkeypatch.setattr(parallel, "MIN_BYTES", 0)
    assert parallel.worker_count([str(p) for p in folder.iterdir()]) > 1
    par = perfcast.load(folder)
    assert seq.rank_ids() == par.rank_ids() == list(range(8))
    assert seq.names_of(np.arange(len(seq))) == par.names_of(np.arange(len(par)))
    for col in ("kind", "ts", "dur", "parent", "launch", "iteration", "coll_name"):
        a, b = getattr(seq, col), getattr(par, col)
        if col == "coll_name":  # indices differ, names must not
            a = [seq.names[i] if i >= 0 else None for i in a.tolist()]
            b = [par.names[i] if i >= 0 else None for i in b.tolist()]
        assert np.array_equal(np.asarray(a, dtype=object), np.asarray(b, dtype=object)), col
