"""Review 26 of the calling-context tree (`perfcast tree`): faults found and fixed."""

from __future__ import annotations

from pathlib import Path

import perfcast
from perfcast.analysis.context import context_tree
from perfcast.analysis.context_views import hot_spots
from tests.tracegen import TraceBuilder

US = 1000  # ns


def _op_inside_op(tmp_path: Path) -> Path:
    """An autograd Function's op (DLRM's All2All_Pooled_Req) launching a kernel of its own,
    and inside its record_function range the c10d op that launches the collective."""
    b = TraceBuilder()
    b.op("All2All_Pooled_Req", 0, 500)
    b.launch("pack_kernel", 10, 5, 100, 30)
    b.op("## alltoall_fwd_single ##", 50, 300, cat="user_annotation")
    b.op("c10d::alltoall_base_", 60, 200)
    b.launch("ncclDevKernel_SendRecv", 70, 5, 200, 70)
    return b.write(tmp_path / "nested.json")


def test_bottom_up_ops_count_nested_calls_once(tmp_path: Path) -> None:
    """An op called inside another op's range (DLRM's c10d::alltoall_base_ in
    All2All_Pooled_Req, the aten ops of a `Torch-Compiled Region`, SGLang's aiter ops in
    its profiler wrappers) was listed with its time, and its caller with the same time
    again: the hot ops added up to 1.5x the GPU time on the DLRM folder and 2.0x on the
    SGLang and torch.compile traces. The outer op now keeps only what the ops listed
    inside it did not."""
    t = context_tree(perfcast.load(_op_inside_op(tmp_path)))
    assert t.incl["gpu_ns"][0] == 100 * US
    spots = hot_spots(t, "gpu_ns", top=10)
    ops = {s.name: s.value for s in spots if s.kind == "op"}
    assert ops == {"c10d::alltoall_base_": 70 * US, "All2All_Pooled_Req": 30 * US}
    assert sum(s.value for s in spots if s.kind == "kernel") == 100 * US
    for s in spots:  # each path's share adds up to the spot's value
        assert sum(p.value for p in s.paths) == s.value
