"""`perfcast advise`: every applicable optimization, predicted and ranked by gain.

One graph and one baseline replay are shared by all candidates; each
candidate transforms its own copy. The reason given for each suggestion is
read off the baseline: what limits the step and how much of it the
optimization touches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfcast.analysis.context_gain import CallSite, SiteFinder
from perfcast.analysis.critical_path import GPU, HOST, critical_paths
from perfcast.analysis.notes import input_notes
from perfcast.analysis.real_step import RealWorld, real_world
from perfcast.events import EventTable
from perfcast.graph.build import build_graph
from perfcast.graph.model import GpuKind, Graph, NodeKind
from perfcast.real import Correction
from perfcast.sim.timeline import Timeline, simulate
from perfcast.whatif.registry import Spec
from perfcast.whatif.runner import apply_specs, measured_share, step_ms

try:
    from perfcast.hardware.classify import KernelClass, dtype_from_kernel_name
except ImportError:  # pragma: no cover
    KernelClass = None  # type: ignore[assignment,misc]

from perfcast.errors import PerfcastError


@dataclass
class Suggestion:
    name: str  # the spec, e.g. "fused-optimizer:kind=fused"
    predicted_ms: float
    speedup: float
    gain_ms: float
    explanation: str
    assumptions: list[str]
    measured_share: float  # of the predicted critical path, with measured durations
    # Where the gain comes from: its top call sites (module, source line, op, share), from
    # the calling-context tree; empty when the trace cannot tell or nothing is gained.
    where: list[CallSite] = field(default_factory=list)


@dataclass
class NotApplicable:
    name: str
    reason: str


@dataclass
class Advice:
    baseline_ms: float  # mean step without the profiler (estimated; see correction)
    traced_ms: float  # mean step as traced
    correction: Correction
    bottleneck: str
    suggestions: list[Suggestion]
    not_applicable: list[NotApplicable] = field(default_factory=list)
    facts: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # about the input (salvage, no steps)


CANDIDATES = [
    "remove-host-sync",
    "cuda-graphs",
    "fused-optimizer:kind=foreach",
    "fused-optimizer:kind=fused",
    "amp:dtype=bf16",
    "fuse-elementwise",
    "dataloader-overlap:workers=4",
]


def _facts(graph: Graph, tl: Timeline) -> dict[str, float]:
    """Per-step quantities the explanations quote (means over steps)."""
    c = graph.cols
    alive = graph.alive
    n_steps = max(len(graph.iterations), 1)
    gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & alive & (c["iteration"] >= 0))
    gpu_ms = float(c["dur"][gpu].sum()) / 1e6 / n_steps
    facts: dict[str, float] = {"gpu_ms": gpu_ms, "kernels_per_step": gpu.size / n_steps}
    paths = critical_paths(tl, keep_steps=False)
    if paths:
        tot = sum(p.total_ms for p in paths) or 1.0

        def pct(cats: tuple[str, ...]) -> float:
            return 100.0 * sum(p.by_category_ms[c] for p in paths for c in cats) / tot

        facts["host_critical_pct"] = pct(HOST)
        facts["gpu_critical_pct"] = pct(GPU)
        facts["ranks_critical_pct"] = pct(("other ranks",))
        facts["latency_critical_pct"] = pct(("latency",))
        facts["idle_critical_pct"] = pct(("idle",))
    if KernelClass is not None and gpu.size:
        klass = c["klass"][gpu]
        heavy = np.isin(klass, [KernelClass.MATMUL, KernelClass.CONV, KernelClass.ATTENTION])
        names = graph.names
        fp32 = np.array(
            [
                dtype_from_kernel_name(names[int(i)]) in (None, "fp32", "tf32")
                for i in c["name"][gpu]
            ],
            dtype=bool,
        )
        busy = float(c["dur"][gpu].sum()) or 1.0
        facts["fp32_matmul_pct"] = 100.0 * float(c["dur"][gpu][heavy & fp32].sum()) / busy
        facts["elementwise_pct"] = (
            100.0 * float(c["dur"][gpu][klass == KernelClass.ELEMENTWISE].sum()) / busy
        )
    sync = np.flatnonzero((c["kind"] == NodeKind.SYNC) & alive & (c["iteration"] >= 0))
    facts["syncs_per_step"] = sync.size / n_steps
    facts["sync_ms"] = float(c["dur_measured"][sync].sum()) / 1e6 / n_steps
    opt = gpu[c["phase"][gpu] == 3]
    facts["optimizer_kernels_per_step"] = opt.size / n_steps
    facts["optimizer_gpu_ms"] = float(c["dur"][opt].sum()) / 1e6 / n_steps
    host = np.flatnonzero(
        np.isin(c["kind"], [NodeKind.CPU, NodeKind.LAUNCH, NodeKind.RUNTIME])
        & alive
        & (c["iteration"] >= 0)
    )
    facts["dataloader_ms"] = float(c["dur"][host[c["phase"][host] == 0]].sum()) / 1e6 / n_steps
    facts["optimizer_host_ms"] = float(c["dur"][host[c["phase"][host] == 3]].sum()) / 1e6 / n_steps
    facts["copies_per_step"] = (
        float(np.isin(c["gpu_kind"][gpu], [GpuKind.MEMCPY, GpuKind.MEMSET]).sum()) / n_steps
    )
    return facts


def _bottleneck(f: dict[str, float]) -> str:
    """What sets the step: the largest share of the critical path (which adds up to it)."""
    if "host_critical_pct" not in f:
        return "unknown (no steps to analyse)"
    if f.get("gpu_ms", 0.0) == 0.0:
        return "CPU-only trace: the host sets the step time"
    shares = {
        "host-bound: CPU work and launches": f["host_critical_pct"],
        "GPU-bound: GPU work": f.get("gpu_critical_pct", 0.0),
        "waiting on other ranks": f.get("ranks_critical_pct", 0.0),
        "latency-bound: launch and hand-off latencies": f.get("latency_critical_pct", 0.0),
        "idle: delays the trace does not explain": f.get("idle_critical_pct", 0.0),
    }
    label, pct = max(shares.items(), key=lambda kv: kv[1])
    return f"{label} set {pct:.0f}% of the critical path"


def _explain(spec: str, f: dict[str, float]) -> str:
    name = spec.split(":")[0]
    host = f.get("host_critical_pct", 0.0)
    if name == "remove-host-sync":
        return (
            f"{f['syncs_per_step']:.0f} host syncs per step block the CPU for "
            f"{f['sync_ms']:.2f} ms; the CPU cannot queue work ahead of the GPU"
        )
    if name == "cuda-graphs":
        return (
            f"host work sets {host:.0f}% of the critical path; "
            f"{f['kernels_per_step']:.0f} GPU tasks launched one by one per step"
        )
    if name == "fused-optimizer":
        if f.get("gpu_ms", 0.0) == 0.0:
            return (
                f"the optimizer takes {f['optimizer_host_ms']:.2f} ms of host time per step, "
                "one small op per parameter"
            )
        return (
            f"the optimizer launches {f['optimizer_kernels_per_step']:.0f} kernels per step "
            f"({f['optimizer_gpu_ms']:.2f} ms of GPU time, {f['optimizer_host_ms']:.2f} ms of "
            "host time)"
        )
    if name == "amp":
        return (
            f"{f.get('fp32_matmul_pct', 0.0):.0f}% of GPU time is fp32 matmul/conv/attention; "
            f"GPU work sets {f.get('gpu_critical_pct', 0.0):.0f}% of the critical path"
        )
    if name == "fuse-elementwise":
        return f"{f.get('elementwise_pct', 0.0):.0f}% of GPU time is elementwise kernels"
    if name == "dataloader-overlap":
        return f"data loading takes {f['dataloader_ms']:.2f} ms per step on the main thread"
    if name == "device":
        return f"the same kernels on {spec.split('=')[-1]}, scaled per kernel class"
    return ""


def advise(
    table: EventTable,
    target_device: str | None = None,
    candidates: list[str] | None = None,
    graph: Graph | None = None,
    world: RealWorld | None = None,
    correct: bool = True,
) -> Advice:
    """Evaluate every candidate on the run without the profiler (unless `correct` is False);
    pass `graph`/`world` to reuse an existing build and replay."""
    from perfcast.whatif.registry import parse_spec

    graph = graph if graph is not None else build_graph(table)
    world = world if world is not None else real_world(graph, correct=correct)
    base = world.real
    traced_ms, _, _ = step_ms(world.traced)
    _, baseline_ms, _ = step_ms(base)
    facts = _facts(world.graph, base)
    specs = list(candidates or CANDIDATES)
    if target_device:
        specs.append(f"device:target={target_device}")
    suggestions: list[Suggestion] = []
    skipped: list[NotApplicable] = []
    where = SiteFinder(table, base)
    for text in specs:
        try:
            spec: Spec = parse_spec(text)
            new_graph, applied = apply_specs(world.graph, [spec])
            tl = simulate(new_graph)
        except PerfcastError as exc:
            skipped.append(NotApplicable(text, str(exc)))
            continue
        _, predicted, _ = step_ms(tl)
        suggestions.append(
            Suggestion(
                name=text,
                predicted_ms=predicted,
                speedup=baseline_ms / predicted if predicted > 0 else float("inf"),
                gain_ms=baseline_ms - predicted,
                explanation=_explain(text, facts),
                assumptions=[a for ap in applied for a in ap.assumptions],
                measured_share=measured_share(tl),
                where=where(tl),
            )
        )
    suggestions.sort(key=lambda s: s.predicted_ms)
    return Advice(
        baseline_ms=baseline_ms,
        traced_ms=traced_ms,
        correction=world.correction,
        bottleneck=_bottleneck(facts),
        suggestions=suggestions,
        not_applicable=skipped,
        facts=facts,
        notes=input_notes(table),
    )
