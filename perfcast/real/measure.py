"""Measure the profiler's own cost per recorded event on this machine (`perfcast calibrate`).

Small CPU ops are timed in alternating rounds with the profiler off and on (each setting:
plain, record_shapes, with_stack, profile_memory); the extra time divided by the events
recorded is the cost per event. Two loops separate an op's own cost from its inputs' (ops of
one and of three tensor inputs); with_stack's extra over record_shapes, divided by the Python
frames, is a frame's cost; profile_memory's, divided by the allocations, a [memory] event's.
With a GPU, small kernel launches give a runtime call's cost (CUPTI); without one the runtime
cost is left to the default and the result says so.

`measure_work_share` then measures what per-event costs miss: how much longer the ops' own
work runs in a profiled training step (a reference CNN step, profiled and unprofiled windows
alternating, the share fitted through the correction on each window's trace).

The costs are what the profiler makes a step longer by, per event: bookkeeping plus what it
costs the CPU around it (caches), which is what the correction must take out.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import replace
from typing import Any

from perfcast.paths import native_stderr_to

ROUNDS = {True: 5, False: 9}  # quick or not
LOOP = {True: 400, False: 1500}


def _timed(fn: Any, n: int, profiler_kwargs: dict[str, Any] | None) -> float:
    """Seconds for fn(n), under the profiler when kwargs are given (off otherwise)."""
    if profiler_kwargs is None:
        t = time.perf_counter()
        fn(n)
        return time.perf_counter() - t
    from torch.profiler import ProfilerActivity, profile

    # Kineto's own start/stop lines would land between calibrate's progress messages.
    with (
        native_stderr_to(os.devnull),
        profile(activities=[ProfilerActivity.CPU], **profiler_kwargs),
    ):
        t = time.perf_counter()
        fn(n)
        dt = time.perf_counter() - t
    return dt


def _extra_per_iteration(
    fn: Any, n: int, rounds: int, settings: dict[str, Any]
) -> dict[str, float]:
    """Median seconds per iteration the profiler adds, per setting, off and on alternating."""
    extra: dict[str, list[float]] = {k: [] for k in settings}
    fn(max(n // 4, 10))  # warm up
    for _ in range(rounds):
        for name, kwargs in settings.items():
            off = _timed(fn, n, None)
            on = _timed(fn, n, kwargs)
            extra[name].append((on - off) / n)
    return {k: max(statistics.median(v), 0.0) for k, v in extra.items()}


def measure_profiler_cost(quick: bool = False) -> dict[str, Any]:
    """Per-event profiler costs on this machine, in ns, and how they were measured."""
    import torch

    torch.set_num_threads(1)
    x = torch.randn(32, 32)
    y = torch.randn(32, 32)
    z = torch.randn(32, 32)

    def one_input(n: int) -> None:  # 1 op, 1 tensor input, 1 allocation
        for _ in range(n):
            torch.neg(x)

    def three_inputs(n: int) -> None:  # 1 op, 3 tensor inputs, 1 allocation
        for _ in range(n):
            torch.addcmul(x, y, z)

    def framed(a: torch.Tensor) -> torch.Tensor:
        return torch.neg(a)

    def one_frame(n: int) -> None:  # 1 op and 1 Python frame per iteration
        for _ in range(n):
            framed(x)

    n, rounds = LOOP[quick], ROUNDS[quick]
    shapes = {"record_shapes": True}
    a = _extra_per_iteration(one_input, n, rounds, {"plain": {}, "shapes": shapes})
    b = _extra_per_iteration(three_inputs, n, rounds, {"shapes": shapes})
    st = _extra_per_iteration(
        one_frame, n, rounds, {"shapes": shapes, "stack": {**shapes, "with_stack": True}}
    )
    mem = _extra_per_iteration(
        one_input, n, rounds, {"shapes": shapes, "memory": {**shapes, "profile_memory": True}}
    )
    # This CPU's speed at what a training step's host side does most (dispatching small ops),
    # without the profiler: `device:host=FILE` compares two machines by it.
    host_op_ns = statistics.median([_timed(one_input, n, None) / n for _ in range(rounds)]) * 1e9
    input_ns = max((b["shapes"] - a["shapes"]) / 2 * 1e9, 0.0)
    op_ns = max(a["shapes"] * 1e9 - input_ns, 0.0)
    out: dict[str, Any] = {
        "op_ns": round(op_ns, 1),
        "input_ns": round(input_ns, 1),
        "op_no_shapes_ns": round(a["plain"] * 1e9, 1),
        # A frame records an entry and an exit.
        "python_ns": round(max(st["stack"] - st["shapes"], 0.0) * 1e9, 1),
        # neg allocates its output and frees it: two [memory] events per iteration.
        "memory_ns": round(max(mem["memory"] - mem["shapes"], 0.0) * 1e9 / 2, 1),
        "runtime_ns": None,
        "task_ns": None,
        "host_op_ns": round(host_op_ns, 1),
        "rounds": rounds,
        "loop": n,
        "torch": str(torch.__version__),
        "note": "CPU ops timed with the profiler off and on in alternating rounds (medians)",
    }
    if torch.cuda.is_available():
        out.update(_runtime_cost(n, rounds))
    else:
        out["note"] += "; no GPU here, so runtime calls keep the default cost"
    return out


def _runtime_cost(n: int, rounds: int) -> dict[str, Any]:
    """A kernel launch's profiler cost (CUPTI), beyond the op that launches it."""
    import torch

    g = torch.randn(16, device="cuda")

    def launches(k: int) -> None:
        for _ in range(k):
            torch.neg(g)
        torch.cuda.synchronize()

    from torch.profiler import ProfilerActivity, profile

    def timed(k: int, on: bool) -> float:
        torch.cuda.synchronize()
        if not on:
            t = time.perf_counter()
            launches(k)
            return time.perf_counter() - t
        activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with native_stderr_to(os.devnull), profile(activities=activities, record_shapes=True):
            t = time.perf_counter()
            launches(k)
            dt = time.perf_counter() - t
        return dt

    launches(50)
    cpu_only = _extra_per_iteration(
        lambda k: launches(k), n, rounds, {"cpu": {"record_shapes": True}}
    )["cpu"]
    both = statistics.median([(timed(n, True) - timed(n, False)) / n for _ in range(rounds)])
    return {"runtime_ns": round(max(both - cpu_only, 0.0) * 1e9, 1), "task_ns": None}


def measure_work_share(op_ns: float, input_ns: float, quick: bool = False) -> dict[str, Any]:
    """How much longer the ops' own work runs inside a profiled training step, beyond the
    per-event costs (perfcast.real.estimate.CALIBRATION_WORK_SHARE): a small CNN training step
    is timed without the profiler and traced with it in alternating windows; each trace is
    corrected with the per-event costs just measured and the share that makes its replayed
    step match the unprofiled steps around it is found by bisection. The median over the
    rounds is the result (a fresh profiler session's cost varies: the rounds' range is kept)."""
    import tempfile
    from pathlib import Path

    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    import perfcast
    from perfcast.graph import build_graph
    from perfcast.real.profiler_cost import ProfilerCost, remove_profiler_cost
    from perfcast.sim import simulate

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(),
        *[m for _ in range(4) for m in (torch.nn.Linear(256, 256), torch.nn.ReLU())],
        torch.nn.Linear(256, 10),
    )
    opt = torch.optim.Adam(model.parameters(), foreach=False)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def unprofiled(k: int) -> list[float]:
        out = []
        for _ in range(k):
            t = time.perf_counter()
            step()
            out.append((time.perf_counter() - t) * 1e3)
        return out

    def share_for(path: Path, real_ms: float) -> float | None:
        graph = build_graph(perfcast.load(path))

        def step_ms(share: float) -> float:
            cost = ProfilerCost(op_ns, input_ns, 0.0, 0.0, 0.0, "calibration", 0.0)
            g, _ = remove_profiler_cost(graph, replace(cost, work_share=share))
            steps = [sim for *_, sim in simulate(g).iteration_ns()]
            return statistics.fmean(steps) / 1e6 if steps else float("nan")

        events_only = step_ms(0.0)
        if events_only != events_only:  # no steps in the trace
            return None
        if events_only <= real_ms:  # per-event costs alone explain it
            return 0.0
        lo, hi = 0.0, 1.0
        if step_ms(hi) > real_ms:
            return hi
        for _ in range(12):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if step_ms(mid) > real_ms else (lo, mid)
        return (lo + hi) / 2

    k, rounds = (10, 5) if quick else (15, 9)
    unprofiled(20)  # warm up
    shares: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            before = unprofiled(k)
            path = Path(tmp) / f"round{r}.json"
            # A schedule, so that the trace marks its steps (ProfilerStep#N); one warm-up step.
            with (
                native_stderr_to(os.devnull),
                profile(
                    activities=[ProfilerActivity.CPU],
                    record_shapes=True,
                    schedule=schedule(wait=0, warmup=1, active=k, repeat=1),
                    on_trace_ready=lambda p, path=path: p.export_chrome_trace(str(path)),
                ) as prof,
            ):
                for _ in range(k + 1):
                    step()
                    prof.step()
            after = unprofiled(k)
            share = share_for(path, statistics.median(before + after))
            if share is not None:
                shares.append(share)
    if not shares:
        return {"work_share": None, "work_share_rounds": []}
    return {
        "work_share": round(statistics.median(shares), 4),
        "work_share_rounds": [round(s, 4) for s in shares],
    }
