"""Replay speed: nodes replayed per second, compiled loop vs the Python reference.

The input is a real trace's graph replicated k times side by side (independent
copies, so the work is the same as a k-times longer trace), measured in one
run so the numbers compare. Also times graph building (events per second)
on the largest shared trace.

    python benchmarks/bench_replay.py [--copies 8] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

import perfcast
from perfcast.graph import build_graph
from perfcast.graph.lower import Lowered, lower
from perfcast.sim.engine import replay_fast, replay_reference

TRACE = (
    Path(__file__).resolve().parents[2] / "shared" / "traces" / "hta_ddp_v100_rank1_memory.json.gz"
)
FALLBACK = Path(__file__).resolve().parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"


def replicate(low: Lowered, k: int) -> Lowered:
    """k independent copies of a lowered graph."""
    n = low.n

    def tile_csr(ptr: np.ndarray, src: np.ndarray, w: np.ndarray):
        m = src.size
        ptrs = [ptr[:-1] + i * m for i in range(k)] + [np.array([k * m])]
        srcs = [src + i * n for i in range(k)]
        return np.concatenate(ptrs), np.concatenate(srcs), np.tile(w, k)

    s_ptr, s_src, s_w = tile_csr(low.s_ptr, low.s_src, low.s_w)
    e_ptr, e_src, e_w = tile_csr(low.e_ptr, low.e_src, low.e_w)
    return Lowered(
        n=n * k,
        nodes=np.arange(n * k),
        dur=np.tile(low.dur, k),
        release=np.tile(low.release, k),
        s_ptr=s_ptr,
        s_src=s_src,
        s_w=s_w,
        e_ptr=e_ptr,
        e_src=e_src,
        e_w=e_w,
    )


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    trace = TRACE if TRACE.exists() else FALLBACK
    t0 = time.perf_counter()
    table = perfcast.load(trace)
    t_load = time.perf_counter() - t0
    t_build = timed(lambda: build_graph(table), args.repeat)
    graph = build_graph(table)
    low = lower(graph)
    big = replicate(low, args.copies)
    replay_fast(low)  # compile (or load the cache) outside the timing
    t_fast_big = timed(lambda: replay_fast(big), args.repeat)
    t_fast = timed(lambda: replay_fast(low), args.repeat)
    t_ref = timed(lambda: replay_reference(low), max(1, args.repeat // 2))
    t_lower = timed(lambda: lower(graph), args.repeat)
    print(f"trace: {trace.name}: {len(table):,} events, {low.n:,} replayed nodes")
    print(
        f"load {t_load:.2f} s; graph build {t_build:.2f} s "
        f"({len(table) / t_build / 1e6:.2f} M events/s)"
    )
    print(
        f"replay, compiled: {low.n / t_fast / 1e6:.2f} M nodes/s on {low.n:,} nodes; "
        f"{big.n / t_fast_big / 1e6:.2f} M nodes/s on {big.n:,} nodes ({args.copies} copies)"
    )
    print(f"replay, reference: {low.n / t_ref / 1e6:.2f} M nodes/s")
    print(f"lowering + compiled replay: {low.n / (t_lower + t_fast) / 1e6:.2f} M nodes/s")
    print(
        f"ratio compiled/reference: {t_ref / t_fast:.1f}x; "
        f"target 1 M nodes/s: {'met' if big.n / t_fast_big >= 1e6 else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
