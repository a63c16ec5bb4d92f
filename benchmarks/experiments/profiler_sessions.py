"""How much does one profiler session cost a CPU training step, and does a live forked child
(as DataLoader workers are) change it?

    python benchmarks/experiments/profiler_sessions.py [ROUNDS]

An 8-layer MLP (256 wide, batch 64, for-loop Adam) on one CPU thread. Each round, once
without and once with a forked child process sleeping beside it: 10 warm-up steps, then 15
steps unprofiled, 15 in a fresh `torch.profiler` session (record_shapes=True), 15 unprofiled
again. Prints per window the median step, the profiled / unprofiled ratio, and the page
faults and context switches the process took in the profiled window. Results of 24 Nov 2026
on the project's 2-core VM are quoted in README.md (profiler cost, item 2).
"""

from __future__ import annotations

import os
import resource
import signal
import statistics
import sys
import time
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile


def main(rounds: int) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(8):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), foreach=False)
    x = torch.randn(64, 256)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()

    def window(n: int, profiled: bool) -> float:
        times = []
        ctx: Any = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
        if not profiled:
            ctx = _Nothing()
        with ctx:
            for _ in range(n):
                t = time.perf_counter()
                step()
                times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3

    for _ in range(30):
        step()
    ratios: dict[str, list[float]] = {"none": [], "child": []}
    for r in range(rounds):
        for cond in ("none", "child"):
            pid = 0
            if cond == "child":
                pid = os.fork()
                if pid == 0:
                    time.sleep(600)
                    os._exit(0)
            for _ in range(10):
                step()
            before = window(15, False)
            u0 = resource.getrusage(resource.RUSAGE_SELF)
            on = window(15, True)
            u1 = resource.getrusage(resource.RUSAGE_SELF)
            after = window(15, False)
            off = (before + after) / 2
            ratios[cond].append(on / off)
            print(
                f"round {r} {cond:5s} unprofiled {off:.2f} ms, profiled {on:.2f} ms, ratio "
                f"{on / off:.3f}; in the profiled window {u1.ru_minflt - u0.ru_minflt} page "
                f"faults, {u1.ru_nivcsw - u0.ru_nivcsw} involuntary context switches",
                flush=True,
            )
            if pid:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    for cond, rs in ratios.items():
        print(
            f"{cond}: median ratio {statistics.median(rs):.3f}, range {min(rs):.3f}-{max(rs):.3f}"
        )


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
