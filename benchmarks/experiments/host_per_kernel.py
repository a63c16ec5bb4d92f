"""Host time per kernel launched in the project's own eager training steps on GPU hosts: the
source of the analytic plan model's default (perfcast.plan.analytic.HOST_S_PER_KERNEL).

    python benchmarks/experiments/host_per_kernel.py

For every baseline trace of the recorded H100 and H200 runs (benchmarks/accuracy/recorded:
live-h100-2026-11-26, live-h200-2026-11-26, and the gpu-truth H100 `*_base` traces), read
the way `perfcast plan` reads a trace: the busy time of forward and backward's top-level
ops less their blocking syncs, with the profiler's own cost removed, divided by the forward
and backward GPU tasks of the step (kernels, copies and memsets; collectives are not in the
count). The 45 traces are 9 workload and host pairs, each traced about five times (one
baseline trace per recorded row). Traces whose step is not eager (CUDA graphs,
torch.compile) and those recorded beside a DataLoader-workers variant are left out. Prints
one line per trace and the median with its interquartile range (27 Nov 2026: 45 traces,
median 25.6 us, 18.4-40.1).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import perfcast  # noqa: E402
from perfcast.analysis.real_step import real_world  # noqa: E402
from perfcast.graph.build import build_graph  # noqa: E402
from perfcast.plan import _cluster_for  # noqa: E402
from perfcast.plan.trace_workload import host_correction, trace_workload  # noqa: E402

RECORDED = ROOT / "benchmarks" / "accuracy" / "recorded" / "traces"
SKIP = ("cuda-graphs", "torch-compile", "dataloader")


def traces() -> list[Path]:
    found = sorted(RECORDED.glob("live-h100-2026-11-26/*.json.gz"))
    found += sorted(RECORDED.glob("live-h200-2026-11-26/*.json.gz"))
    found += sorted(RECORDED.glob("h100/*_base.json.gz"))
    return [p for p in found if not any(s in p.name for s in SKIP)]


def main() -> None:
    per_kernel = []
    for path in traces():
        table = perfcast.load(str(path))
        cluster = _cluster_for(table, None, None, None, 8, None)
        host = host_correction(real_world(build_graph(table), correct=True))
        w = trace_workload(table, cluster, host=host)
        us = w.host_s / w.n_kernels * 1e6
        per_kernel.append(us)
        rel = path.relative_to(RECORDED)
        print(f"{rel}: {w.host_s * 1e3:.2f} ms host, {w.n_kernels:.0f} kernels, {us:.1f} us")
    q1, _, q3 = statistics.quantiles(per_kernel, n=4)
    print(
        f"{len(per_kernel)} traces: median {statistics.median(per_kernel):.1f} us per kernel, "
        f"interquartile {q1:.1f}-{q3:.1f} us"
    )


if __name__ == "__main__":
    main()
