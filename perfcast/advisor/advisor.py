"""`perfcast advise`: every applicable optimization, predicted and ranked by gain.

One graph and one baseline replay are shared by all candidates; each
candidate transforms its own copy. The reason given for each suggestion is
read off the baseline: what limits the step and how much of it the
optimization touches.

Every prediction carries the error its model has shown on the project's measured pairs
(`error_bands.json`, written by the recorded accuracy benchmark): a band e is the largest
|predicted - measured| / measured speedup on that model's pairs, so a prediction s means a
measured speedup within s / (1 + e) .. s / (1 - e) (not s(1 - e) .. s(1 + e), a range that
left out the very pairs e came from). Only
suggestions whose gain stays above 1.00x at the band's low end are ranked; the others are
listed as uncertain, with why. The best plan composes the ranked suggestions that can be
applied together, and is predicted as one what-if.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from perfcast.analysis.common import NO_LAUNCH, first_launch_correlation
from perfcast.analysis.context_gain import CallSite, SiteFinder
from perfcast.analysis.critical_path import GPU, HOST, critical_paths
from perfcast.analysis.notes import (
    first_step_note,
    graph_notes,
    input_notes,
    refuse_counter_trace,
)
from perfcast.analysis.optimizers import (
    FUSED_OPTIMIZERS,
    TORCH_OPTIMIZERS,
    capture_support,
    optimizer_class,
    optimizer_classes,
)
from perfcast.analysis.real_step import RealWorld, real_world
from perfcast.events import EventTable, Kind
from perfcast.frames import Tables, TypedColumns, field_kinds, rows_to_columns
from perfcast.graph.build import build_graph
from perfcast.graph.model import GpuKind, Graph, NodeKind
from perfcast.graph.phases import Phase, host_collective_mask
from perfcast.real import Correction, StepEstimate
from perfcast.sim.timeline import Timeline, simulate
from perfcast.whatif.registry import Spec, build_options, in_plan_order, parse_spec
from perfcast.whatif.runner import (
    apply_specs,
    conflict,
    lead_assumption,
    measured_share,
    predicted_profiled_ms,
    predicted_step_ms,
    step_ms,
    steps_ns,
)

try:
    from perfcast.hardware.classify import KernelClass, dtype_from_kernel_name
except ImportError:  # pragma: no cover
    KernelClass = None  # type: ignore[assignment,misc]

from perfcast.errors import OptionValueError, PerfcastError


@dataclass
class Suggestion:
    """One optimization: its predicted step (ms, without the profiler), speedup (x) and gain
    (ms) with the model's measured error band, why and where it gains, the code change and
    what it assumes; `uncertain` says why it is not ranked."""

    name: str  # the spec, e.g. "fused-optimizer:kind=fused"
    predicted_ms: float
    speedup: float
    gain_ms: float
    explanation: str
    assumptions: list[str]
    measured_share: float  # share of the predicted critical path with durations from the trace
    # Where the gain comes from: its top call sites (module, source line, op, share), from
    # the calling-context tree; empty when the trace cannot tell or nothing is gained.
    where: list[CallSite] = field(default_factory=list)
    code: str = ""  # the change to make, in one line
    # The model's error on the project's measured pairs: speedup_low .. speedup_high.
    error_band_pct: float | None = None
    band_pairs: int = 0  # measured pairs behind the band (0: none for this model)
    speedup_low: float | None = None
    speedup_high: float | None = None
    uncertain: str = ""  # why it is not ranked (empty when ranked)
    # The predicted step with the profiler's cost left in (ranked items only: one more replay
    # each), beside the unprofiled `predicted_ms`.
    predicted_traced_ms: float | None = None

    def __repr__(self) -> str:  # the dataclass's printed every assumption and call site
        band = (
            f" [{self.speedup_low:.2f}-{self.speedup_high:.2f}]"
            if self.speedup_low is not None and self.speedup_high is not None
            else ""
        )
        state = "not ranked" if self.uncertain else "ranked"
        return (
            f"Suggestion({self.name!r}, {self.predicted_ms:,.2f} ms, "
            f"{self.speedup:.2f}x{band}, {state})"
        )


@dataclass
class NotApplicable:
    """An optimization that does not apply to this trace, and why."""

    name: str
    reason: str


@dataclass
class Plan:
    """The ranked suggestions that compose, applied together as one what-if."""

    specs: list[str]
    predicted_ms: float
    speedup: float
    code: list[str]
    left_out: list[str] = field(default_factory=list)  # ranked, but adding nothing on top
    # Not ranked by themselves (no gain alone), but the plan gains from them: removing a
    # host sync lets a CUDA graph capture the whole step instead of the stretches between.
    enablers: list[str] = field(default_factory=list)
    # What the composed prediction assumed, as every suggestion states its own: the models'
    # assumptions with the plan's options, applied together.
    assumptions: list[str] = field(default_factory=list)


@dataclass(repr=False)
class Advice(Tables):
    """Result of `advise`: the ranked suggestions (each a predicted speedup with its error
    band, the code change and the ops behind the gain), findings, the composed plan, and
    the candidates that did not apply and why. `to_pandas()` lists the suggestions."""

    RENDERER: ClassVar[tuple[str, str]] = ("perfcast.report.terminal", "render_advice")

    baseline_ms: float  # mean step without the profiler (estimated; see correction)
    traced_ms: float  # mean step as traced
    correction: Correction
    bottleneck: str
    suggestions: list[Suggestion]  # ranked: their gain exceeds their error band
    uncertain: list[Suggestion] = field(default_factory=list)  # predicted, not ranked: why
    plan: Plan | None = None
    not_applicable: list[NotApplicable] = field(default_factory=list)
    facts: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # about the input (salvage, no steps)
    measured_real_ms: float | None = None  # mean unprofiled step the trace carries, if any
    # What the trace shows that limits the step and no modelled optimization addresses.
    findings: list[str] = field(default_factory=list)
    # Per rank and step: traced_ms, real_ms, measured_real_ms and the correction's source,
    # under the keys summary, replay and whatif give them (the means alone were here).
    iterations: list[StepEstimate] = field(default_factory=list)

    def _tables(self) -> dict[str, Any]:
        """ "suggestions": one row per predicted optimization, ranked ones first (status
        "ranked"), then those within their error band ("not ranked", with `why`); times in
        ms. "not_applicable": what could not be predicted on this trace, and why."""
        items = [("ranked", s) for s in self.suggestions]
        items += [("not ranked", s) for s in self.uncertain]
        fields = field_kinds(Suggestion)
        suggestions = {"name": [s.name for _, s in items], "status": [st for st, _ in items]}
        kinds = {"name": fields["name"], "status": "str"}
        for column, attr in _SUGGESTION_COLUMNS.items():
            suggestions[column] = [getattr(s, attr) for _, s in items]
            if attr in fields:
                kinds[column] = fields[attr]
        return {
            "suggestions": TypedColumns(suggestions, kinds),
            "not_applicable": rows_to_columns(self.not_applicable, NotApplicable),
        }


# The suggestions table's columns after name and status: column -> Suggestion field.
_SUGGESTION_COLUMNS = {
    "predicted_ms": "predicted_ms",
    "predicted_traced_ms": "predicted_traced_ms",
    "speedup": "speedup",
    "speedup_low": "speedup_low",
    "speedup_high": "speedup_high",
    "gain_ms": "gain_ms",
    "error_band_pct": "error_band_pct",
    "band_pairs": "band_pairs",
    "from_trace_share": "measured_share",
    "code": "code",
    "why": "uncertain",
    "explanation": "explanation",
}


CANDIDATES = [
    "remove-host-sync",
    "cuda-graphs",
    "fused-optimizer:kind=foreach",
    "fused-optimizer:kind=fused",
    "amp:dtype=bf16",
    "torch-compile",
    "torch-compile:mode=reduce-overhead",
    "dataloader-overlap:workers=4",
]


# The change each suggestion asks for, in one line of PyTorch.
CODE = {
    "remove-host-sync": "drop .item() / .cpu() / print(loss) from the step; log every N steps",
    "fused-optimizer:kind=foreach": "torch.optim.AdamW(params, ..., foreach=True)",
    "fused-optimizer:kind=fused": "torch.optim.AdamW(params, ..., fused=True)",
    "amp:dtype=bf16": 'with torch.autocast("cuda", dtype=torch.bfloat16): loss = model(x)',
    "amp:dtype=fp16": 'with torch.autocast("cuda", dtype=torch.float16): ...; '
    "scaler = torch.amp.GradScaler()",
    "torch-compile": "model = torch.compile(model)",
    "torch-compile:mode=reduce-overhead": 'model = torch.compile(model, mode="reduce-overhead")',
    "fuse-elementwise": "model = torch.compile(model)  # the kernel fusion part of it",
    "dataloader-overlap": "DataLoader(..., num_workers=4, pin_memory=True, "
    "persistent_workers=True)",
    "device": "run on the other GPU",
}


@dataclass(frozen=True)
class TraceTraits:
    """What the one-line changes depend on, read off the trace once."""

    optimizer: str | None = None  # the torch.optim (or other) class of Optimizer.step# ranges
    phases: frozenset[str] = frozenset({"forward", "backward", "optimizer"})
    has_gpu: bool = True
    # Every optimizer class the steps name (`optimizer` is None when there are several).
    optimizers: frozenset[str] = frozenset()
    # Which host syncs the steps hold, as remove-host-sync tells them apart: "read",
    # "h2d" (a blocking host-to-device copy), "shape" (sizing a data-dependent output).
    syncs: frozenset[str] = frozenset({"read"})

    @classmethod
    def of(cls, table: EventTable, graph: Graph) -> TraceTraits:
        from perfcast.graph.phases import phase_names
        from perfcast.whatif.models.remove_host_sync import H2D_COPY, SHAPE, classify_syncs

        c = graph.cols
        in_steps = graph.alive & (c["iteration"] >= 0)
        host = np.flatnonzero(in_steps & (c["kind"] != NodeKind.GPU))
        sync = np.flatnonzero(in_steps & (c["kind"] == NodeKind.SYNC))
        kinds = set(classify_syncs(graph, sync).tolist())
        names = {SHAPE: "shape", H2D_COPY: "h2d"}
        return cls(
            optimizer=optimizer_class(table),
            optimizers=optimizer_classes(table),
            phases=frozenset(phase_names(c["phase"][host])),
            has_gpu=bool(((c["kind"] == NodeKind.GPU) & in_steps).any()),
            syncs=frozenset(names.get(k, "read") for k in kinds),
        )


def _code(spec: str, traits: TraceTraits | None = None) -> str:
    """The one-line change for `spec`, fitted to the trace: its optimizer class, the phases
    it has (an inference trace has no backward or optimizer), its device, its syncs."""
    t = traits or TraceTraits()
    code = CODE.get(spec) or CODE.get(spec.split(":")[0], "")
    name = spec.split(":")[0]
    if name == "remove-host-sync":
        return _sync_code(t)
    if name == "dataloader-overlap" and not t.has_gpu:
        return code.replace("pin_memory=True, ", "")  # pinning needs an accelerator
    if name == "cuda-graphs":
        return _capture_code(t)
    optimizer = t.optimizer
    if optimizer is None or name != "fused-optimizer":
        return code
    if optimizer not in TORCH_OPTIMIZERS:
        # A class of the user's own (or a library's): say what to look for, not a line that
        # would swap their optimizer for another.
        return f"{optimizer} is not a torch.optim class: use its multi-tensor mode, e.g. {code}"
    if "fused=True" in code and optimizer not in FUSED_OPTIMIZERS:
        return (
            f"torch.optim.{optimizer} has no fused kernel: "
            f"torch.optim.{optimizer}(params, ..., foreach=True)"
        )
    return code.replace("torch.optim.AdamW(", f"torch.optim.{optimizer}(")


def _sync_code(t: TraceTraits) -> str:
    """remove-host-sync's change for the syncs it removes (see its model)."""
    pinned = "copy inputs from pinned memory without blocking: DataLoader(..., pin_memory=True) "
    pinned += "and x.to(device, non_blocking=True)"
    read = "drop .item() / .cpu() / print(loss) from the step; log every N steps"
    if t.syncs == {"h2d"} or t.syncs == {"h2d", "shape"}:
        return pinned
    if "h2d" in t.syncs:
        return f"{read}; and {pinned}"
    return read


def _capture_code(t: TraceTraits) -> str:
    """The capture change, as the cuda-graphs model applies it: the phases the trace has,
    and its optimizer's class."""
    capture = "once with torch.cuda.graph(g) and call g.replay() each step"
    if "backward" not in t.phases and "optimizer" not in t.phases:
        return (
            f"capture the forward {capture}, feeding it through static input tensors "
            "(an inference step: no backward or optimizer in the trace)"
        )
    if "optimizer" not in t.phases:
        return f"capture forward and backward {capture}"
    optimizer = t.optimizer
    whole = f"capture the whole step (forward, backward, optimizer) {capture}"
    support = capture_support(optimizer)
    if support == "as-is":
        return f"{whole} (torch.optim.{optimizer} captures as it is)"
    if support == "none":
        return (
            f"capture forward and backward {capture}; torch.optim.{optimizer} has no "
            "capturable option, so its step stays outside the graph"
        )
    if support == "capturable":
        return f"{whole}, with torch.optim.{optimizer}(..., capturable=True)"
    if optimizer is not None:
        return (
            f"{whole}; {optimizer} is not a torch.optim class: its step must keep its step "
            "count on the GPU to be captured (as torch.optim's capturable=True does)"
        )
    if t.optimizers:
        # Several classes (a wrapper around an optimizer): no single line fits them.
        named = " and ".join(sorted(t.optimizers))
        return (
            f"{whole}; the steps of {named} must keep their step counts on the GPU to be "
            "captured (torch.optim's capturable=True does it for its own classes)"
        )
    return (
        f"{whole}, with the optimizer's capturable=True "
        "(e.g. torch.optim.Adam(..., capturable=True))"
    )


def _bands() -> dict[str, object]:
    """The recorded error of each model (advisor/error_bands.json; empty if missing)."""
    import json
    from importlib import resources

    try:
        text = resources.files("perfcast.advisor").joinpath("error_bands.json").read_text()
        data = json.loads(text)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# A band of e >= 1 would bound the measured speedup by nothing above: its top is taken at
# this (none of the measured models comes near: the largest is 0.51).
MAX_BAND = 0.95
# Options that make another model of the same what-if: its measured pairs are not theirs
# (the recorded torch-compile pairs are all default mode, the amp pairs all bf16).
_OTHER_MODEL = {("torch-compile", "mode"): "default", ("amp", "dtype"): "bf16"}


def _band(spec: str, bands: dict[str, object]) -> tuple[float | None, int]:
    """(relative error band, pairs behind it): the model's largest error on its measured pairs;
    a model with none (or a variant of one, e.g. torch-compile's reduce-overhead mode) gets
    the largest error of any model, and 0 pairs."""
    by_model = bands.get("by_model", {})
    overall = bands.get("all", {})
    from perfcast.whatif.models.amp import _DTYPE_ALIASES as ALIASES  # as amp reads them

    parsed = parse_spec(spec)
    name = parsed.name
    options = build_options(name, parsed.options)  # the defaults of what the spec leaves out

    def value(key: str) -> str:
        text = str(getattr(options, key)).lower()
        return ALIASES.get(text, text)

    variant = any(
        model == name and value(key) != default for (model, key), default in _OTHER_MODEL.items()
    )
    if isinstance(by_model, dict) and not variant:
        entry = by_model.get(name)
        if isinstance(entry, dict) and entry.get("max") is not None:
            return float(entry["max"]), int(entry.get("rows", 0))
    if isinstance(overall, dict) and overall.get("max") is not None:
        return float(overall["max"]), 0
    return None, 0


def _facts(graph: Graph, tl: Timeline) -> dict[str, float]:
    """Per-step, per-rank quantities the explanations quote (means over steps and ranks: a
    count is never summed over ranks)."""
    c = graph.cols
    alive = graph.alive
    ranks = max(len({it.rank for it in graph.iterations}), 1)
    n_steps = max(len(graph.iterations), 1)  # every rank's steps: per-rank means
    # GPU work the trace recorded (not the zero-length arrival marks collectives get).
    gpu = np.flatnonzero(
        (c["kind"] == NodeKind.GPU) & alive & (c["iteration"] >= 0) & (c["event"] >= 0)
    )
    gpu_ms = float(c["dur"][gpu].sum()) / 1e6 / n_steps
    facts: dict[str, float] = {"gpu_ms": gpu_ms, "kernels_per_step": gpu.size / n_steps}
    facts["ranks"] = float(ranks)
    paths = critical_paths(tl, keep_steps=False)
    if paths:
        tot = sum(p.total_ms for p in paths) or 1.0

        def pct(cats: tuple[str, ...]) -> float:
            return 100.0 * sum(p.by_category_ms[c] for p in paths for c in cats) / tot

        facts["host_critical_pct"] = pct(HOST)
        facts["gpu_critical_pct"] = pct(GPU)
        facts["comm_critical_pct"] = pct(("gpu communication",))
        facts["ranks_critical_pct"] = pct(("other ranks",))
        # The rank that waits most: with one late rank among few, the mean hides it.
        by_rank: dict[int, list[float]] = {}
        for p in paths:
            acc = by_rank.setdefault(p.rank, [0.0, 0.0])
            acc[0] += p.by_category_ms["other ranks"]
            acc[1] += p.total_ms
        share = {r: 100.0 * w / t for r, (w, t) in by_rank.items() if t > 0}
        # A CPU backend's (gloo's) collectives on the path: CPU work by category, but what a
        # CPU-only job's bottleneck should name.
        table = graph.table
        if table is not None and len(table):
            gloo = host_collective_mask(table)
            on_path = 0.0
            for p in paths:
                ops = c["op"][p.path_nodes]
                mine = (ops >= 0) & gloo[np.maximum(ops, 0)] & (c["rank"][p.path_nodes] == p.rank)
                on_path += float(p.path_ns[mine].sum()) / 1e6
            facts["host_comm_critical_pct"] = 100.0 * on_path / tot
        if len(share) > 1:
            worst = max(share, key=lambda r: (share[r], -r))
            facts["ranks_critical_max_pct"] = share[worst]
            facts["ranks_critical_max_rank"] = float(worst)
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
    # Syncs that size data-dependent outputs stay under remove-host-sync: not counted as its.
    from perfcast.whatif.models.remove_host_sync import SHAPE, blocking_ns, classify_syncs

    shaped = classify_syncs(graph, sync) == SHAPE
    facts["syncs_per_step"] = float((~shaped).sum()) / n_steps
    facts["sync_ms"] = blocking_ns(graph, sync[~shaped]) / 1e6 / n_steps
    facts["shape_syncs_per_step"] = float(shaped.sum()) / n_steps
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
    # As torch-compile counts what it replaces: the forward's and backward's ops and the
    # Python between them.
    from perfcast.whatif.models.torch_compile import compiled_region_host

    model_host = compiled_region_host(graph, host, [Phase.FORWARD, Phase.BACKWARD])
    facts["model_host_ms"] = float(c["dur"][model_host].sum()) / 1e6 / n_steps
    facts["has_backward"] = float((c["phase"][host] == Phase.BACKWARD).any())
    facts["copies_per_step"] = (
        float(np.isin(c["gpu_kind"][gpu], [GpuKind.MEMCPY, GpuKind.MEMSET]).sum()) / n_steps
    )
    return facts


def _bottleneck(f: dict[str, float], gpu_side_lost: bool = False) -> str:
    """What sets the step: the largest share of the critical path (which adds up to it).
    `gpu_side_lost`: a GPU run's file lost events to a cut or damage."""
    if "host_critical_pct" not in f:
        return "unknown (no steps to analyse)"
    if f.get("gpu_ms", 0.0) == 0.0 and gpu_side_lost:
        return "unknown: no GPU work survived in this GPU run's damaged or cut-off file"
    if f.get("gpu_ms", 0.0) == 0.0:
        parts = [
            f"{label} {f.get(key, 0.0):.0f}%"
            for label, key in (
                ("collectives (gloo)", "host_comm_critical_pct"),
                ("waiting on other ranks", "ranks_critical_pct"),
            )
            if f.get(key, 0.0) >= 5.0
        ]
        of_path = f" ({', '.join(parts)} of the critical path)" if parts else ""
        return "CPU-only trace: the host sets the step time" + of_path
    shares = {
        "host-bound: CPU work and launches": f["host_critical_pct"],
        "GPU-bound: GPU work": f.get("gpu_critical_pct", 0.0),
        "waiting on other ranks": f.get("ranks_critical_pct", 0.0),
        "latency-bound: launch and hand-off latencies": f.get("latency_critical_pct", 0.0),
        "idle: delays the trace does not explain": f.get("idle_critical_pct", 0.0),
    }
    label, pct = max(shares.items(), key=lambda kv: kv[1])
    comm = f.get("comm_critical_pct", 0.0)
    if label.startswith("GPU-bound") and comm > pct / 2:
        # Collectives are GPU work that no kernel optimization shortens: say so.
        return f"GPU-bound: GPU work set {pct:.0f}% of the critical path, collectives {comm:.0f}%"
    return f"{label} set {pct:.0f}% of the critical path"


def _explain(spec: str, f: dict[str, float]) -> str:
    name = spec.split(":")[0]
    host = f.get("host_critical_pct", 0.0)
    if name == "remove-host-sync":
        stay = f.get("shape_syncs_per_step", 0.0)
        return (
            f"{f['syncs_per_step']:,.0f} host syncs per step block the CPU for "
            f"{f['sync_ms']:.2f} ms; the CPU cannot queue work ahead of the GPU"
            + (
                f" ({stay:.0f} more per step size data-dependent outputs and stay)"
                if stay >= 0.5
                else ""
            )
        )
    if name == "cuda-graphs":
        return (
            f"host work sets {host:.0f}% of the critical path; "
            f"{f['kernels_per_step']:,.0f} GPU tasks (kernels, copies, memsets) launched one by "
            "one per step"
        )
    if name == "fused-optimizer":
        if f.get("gpu_ms", 0.0) == 0.0:
            return (
                f"the optimizer takes {f['optimizer_host_ms']:.2f} ms of host time per step, "
                "one small op per parameter"
            )
        return (
            f"the optimizer launches {f['optimizer_kernels_per_step']:,.0f} kernels per step "
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
    if name == "torch-compile":
        what = "forward and backward take" if f.get("has_backward") else "the forward takes"
        return (
            f"{what} {f.get('model_host_ms', 0.0):.2f} ms of eager host work per step (ops and "
            f"the Python between them); {f.get('elementwise_pct', 0.0):.0f}% of GPU time is "
            "elementwise kernels"
        )
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
    refuse_counter_trace(table, "advise")
    graph = graph if graph is not None else build_graph(table)
    world = world if world is not None else real_world(graph, correct=correct)
    base = world.real
    traced_ms, _, _ = step_ms(world.traced)
    _, baseline_ms, _ = step_ms(base)
    facts = _facts(world.graph, base)
    specs = list(candidates or _candidates_for(world.graph))
    if target_device:
        specs.append(f"device:target={target_device}")
    # Specs the user wrote (candidates, the target device): a bad value in one is an error;
    # the advisor's own candidates that do not apply are listed as not applicable.
    user_named = set(candidates or []) | {s for s in specs if s.startswith("device:")}
    suggestions: list[Suggestion] = []
    skipped: list[NotApplicable] = []
    where = SiteFinder(table, base)
    traits = TraceTraits.of(table, world.graph)
    bands = _bands()

    def suggest(text: str) -> Suggestion | NotApplicable:
        # One candidate's graph and timeline die when this returns: a large trace's graph is
        # copied for every candidate, and two copies alive at once doubled advise's peak.
        try:
            spec: Spec = parse_spec(text)
            new_graph, applied = apply_specs(world.graph, [spec])
            tl = simulate(new_graph)
        except PerfcastError as exc:
            if isinstance(exc, OptionValueError) and text in user_named:
                raise  # a value the user wrote is wrong: say so, as whatif does
            reason = str(exc)
            # The model names itself ("torch-compile: ...", "torch-compile mode=...: ..."),
            # and the item does too.
            model = text.split(":")[0]
            head, sep, rest = reason.partition(": ")
            if sep and head.split(" ")[0] == model:
                reason = rest
            return NotApplicable(text, reason)
        predicted = predicted_step_ms(base, tl, applied)
        speedup = baseline_ms / predicted if predicted > 0 else float("inf")
        band, pairs = _band(text, bands)
        s = Suggestion(
            name=text,
            predicted_ms=predicted,
            speedup=speedup,
            gain_ms=baseline_ms - predicted,
            explanation=_explain(text, facts),
            assumptions=[a for ap in applied for a in ap.assumptions]
            + [a for a in [lead_assumption(base, tl, applied)] if a],
            measured_share=measured_share(tl),
            where=where(tl),
            code=_code(text, traits),
            error_band_pct=None if band is None else 100.0 * band,
            band_pairs=pairs,
            speedup_low=None if band is None else speedup / (1 + band),
            speedup_high=None if band is None else speedup / (1 - min(band, MAX_BAND)),
        )
        s.uncertain = _why_uncertain(s)
        if not s.uncertain:
            kept = tl if world.cost.is_off else None
            del tl, new_graph  # one graph at a time (see above)
            s.predicted_traced_ms, _, _ = predicted_profiled_ms(
                world, [spec], applied, kept, predicted
            )
        return s

    for text in specs:
        outcome = suggest(text)
        if isinstance(outcome, NotApplicable):
            skipped.append(outcome)
        else:
            suggestions.append(outcome)
    suggestions.sort(key=lambda s: s.predicted_ms)
    ranked = [s for s in suggestions if not s.uncertain]
    uncertain = [s for s in suggestions if s.uncertain]
    return Advice(
        baseline_ms=baseline_ms,
        traced_ms=traced_ms,
        correction=world.correction,
        bottleneck=_bottleneck(
            facts, any(r.truncated and r.device_name is not None for r in table.ranks)
        ),
        suggestions=ranked,
        uncertain=uncertain,
        plan=_plan(ranked, world, baseline_ms, traits, unranked=uncertain),
        not_applicable=skipped,
        facts=facts,
        notes=input_notes(table)
        + graph_notes(world.traced_graph, steps_ns(world.traced))
        + first_step_note(world.steps, world.traced_graph.table),
        measured_real_ms=world.measured_real_ms,
        findings=(
            _communication_findings(table, facts)
            + _waiting_findings(table, facts)
            + _idle_findings(world.traced_graph, facts)
        ),
        iterations=list(world.steps),
    )


# Collectives on the critical path are worth a finding from this share on.
COMM_FINDING_PCT = 25.0
# Below this share of the intra-node link's peak bus bandwidth a collective is mostly not
# moving data. Low enough that a job across nodes at its network's full speed (400 Gb/s
# InfiniBand: about 10% of NVLink 4's bus bandwidth) is not called waiting.
SLOW_COLLECTIVE_PCT = 5.0
# GPU tasks without a launch beyond this share of all say the trace's CPU side is incomplete.
ORPHAN_SHARE = 0.01


def _launched_before_trace(table: Any) -> int:
    """GPU tasks without a launch whose correlation id precedes every launch the trace
    recorded on their rank: launched before the profiler started."""
    if table is None:
        return 0
    gpu = table.kind_mask((Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)) & (table.launch < 0)
    rows = np.flatnonzero(gpu & (table.correlation >= 0))
    if rows.size == 0:
        return 0
    # A rank with no launch at all lost its CPU side: its work is not queued before the trace.
    before = first_launch_correlation(table)[table.rank[rows]]
    return int(((before != NO_LAUNCH) & (table.correlation[rows] < before)).sum())


def _idle_findings(graph: Graph, facts: dict[str, float]) -> list[str]:
    """When time no traced work explains holds a large share of the critical path: whether the
    trace lost the launches of its GPU work (a trace without its CPU side) or the host was
    busy outside any traced op."""
    idle = facts.get("idle_critical_pct", 0.0)
    if idle < COMM_FINDING_PCT:
        return []
    head = f"time no traced work explains holds {idle:.0f}% of the critical path"
    orphans = graph.unresolved.get("gpu_without_launch", 0)
    tasks = int(((graph.cols["kind"] == NodeKind.GPU) & graph.alive).sum())
    # A few kernels without a launch are ordinary (work enqueued just before the trace).
    early = _launched_before_trace(graph.table)
    if orphans > ORPHAN_SHARE * max(tasks, 1) and early >= 0.5 * orphans:
        return [
            f"{head}, and {orphans:,} GPU tasks have no launch in the trace: {early:,} of them "
            "were launched before it began (their correlation ids precede every launch it "
            "recorded), so the GPU was still working through earlier work when profiling "
            "started; the first steps' times hold that backlog: profile after a few more "
            "warm-up steps (torch.profiler.schedule(wait=..., warmup=...))"
        ]
    if orphans > ORPHAN_SHARE * max(tasks, 1):
        return [
            f"{head}, and {orphans:,} GPU tasks have no launch in the trace: its CPU side is "
            "incomplete (sampled or filtered, or the work was launched from a thread the "
            "profiler did not record), so the replay cannot tell what delayed them; a trace "
            "with CPU and CUDA activities of every thread says"
        ]
    blocked = _longest_blocking_call(graph)
    if blocked is not None:
        name, ms, share = blocked
        return [
            f"{head}: the host was blocked {ms:,.1f} ms ({share:.0f}% of the traced steps) in "
            f"{name}, a call that waits for the GPU, while the GPU ran nothing of this trace: "
            "it was waiting for work or an event the trace does not show (queued before the "
            "trace began, or on a stream or process the profiler did not record); profile "
            "after a few more warm-up steps, or every process that feeds this GPU"
        ]
    table = graph.table
    has_frames = table is not None and bool((table.kind == Kind.PYTHON_FUNCTION).any())
    where = (
        "'perfcast tree' shows which Python lines ran there (the trace has their frames)"
        if has_frames
        else "with_stack=True shows which Python lines ran there"
    )
    return [
        f"{head}: neither the GPU nor a traced op was busy (Python between ops, I/O, waiting "
        f"for input or requests); {where}"
    ]


# A call that waits for the GPU (a sync, a blocking copy) holding this share of the steps'
# traced time explains their idle time by itself.
BLOCKED_SHARE = 0.25


def _longest_blocking_call(graph: Graph) -> tuple[str, float, float] | None:
    """The longest host call inside the steps that waits for the GPU (a synchronize, a
    blocking copy), as traced: (name, ms, % of the steps' time), when it holds at least
    BLOCKED_SHARE of them. SGLang's prefill sat 493 ms of 987 in hipMemcpyWithStream, and
    the finding said neither the GPU nor a traced op was busy."""
    c = graph.cols
    in_steps = graph.alive & (c["iteration"] >= 0)
    calls = np.flatnonzero(in_steps & (c["kind"] == NodeKind.SYNC))
    if calls.size == 0:
        return None
    table = graph.table
    if table is None:
        return None
    longest = int(calls[np.argmax(c["dur_measured"][calls])])
    held = float(c["dur_measured"][longest])
    rank = int(c["rank"][longest])
    # Against its own rank's steps (a folder's other ranks have steps of their own).
    steps_ns = sum(it.end_ns - it.start_ns for it in table.iterations if it.rank == rank) or 1
    if held < BLOCKED_SHARE * steps_ns:
        return None
    # The GPU must have been idle meanwhile, as traced: a sync that waits for busy GPU work
    # is no mystery (and no idle time).
    row = int(c["event"][longest])
    if row >= 0:
        lo, hi = int(table.ts[row]), int(table.ts[row] + table.dur[row])
        gpu = np.flatnonzero(table.is_gpu() & (table.rank == rank))
        busy = np.clip(table.ts[gpu] + table.dur[gpu], lo, hi) - np.clip(table.ts[gpu], lo, hi)
        if float(busy.sum()) > 0.1 * (hi - lo):
            return None
    return graph.name_of(longest), held / 1e6, 100.0 * held / steps_ns


def _waiting_findings(table: EventTable, facts: dict[str, float]) -> list[str]:
    """When ranks waiting for each other hold a large share of the critical path: which rank
    they wait for, from the collectives' arrival times."""
    waiting = facts.get("ranks_critical_pct", 0.0)
    worst = facts.get("ranks_critical_max_pct", 0.0)
    if max(waiting, worst) < COMM_FINDING_PCT or len(table.ranks) < 2:
        return []
    from perfcast.analysis.stragglers import stragglers

    found = stragglers(table)
    rows = sorted(found.by_rank, key=lambda r: -r.wait_caused_ms)
    head = (
        f"ranks waiting for each other hold {waiting:.0f}% of the critical path"
        if waiting >= COMM_FINDING_PCT
        else f"rank {int(facts['ranks_critical_max_rank'])} spends {worst:.0f}% of its "
        f"critical path waiting for other ranks ({waiting:.0f}% over all ranks)"
    )
    if not rows or rows[0].wait_caused_ms <= 0:
        return [f"{head}; the collectives' arrival times do not single out a rank"]
    late = rows[0]
    # The same ranks the summary and the analyses call stragglers (latest on average).
    on_average = ", ".join(str(r) for r in found.candidates)
    return [
        f"{head}: rank {late.rank} arrived last at {late.times_last} of its {late.collectives} "
        f"collectives and kept the others waiting {late.wait_caused_ms:.2f} ms in all"
        + (
            f" (latest on average: rank{'s' if len(found.candidates) > 1 else ''} {on_average})"
            if on_average
            else ""
        )
        + f"; what makes rank {late.rank} late (its own step in 'perfcast summary': data "
        "loading, host work) is what would shorten every rank's step, and the what-ifs change "
        "every rank alike"
    ]


def _communication_findings(table: EventTable, facts: dict[str, float]) -> list[str]:
    """What the collectives on the critical path say, when they hold a large share of it:
    whether they ran near the link's bandwidth or far below it (then mostly waiting for other
    ranks), since no modelled optimization shortens either."""
    comm = facts.get("comm_critical_pct", 0.0)
    if comm < COMM_FINDING_PCT:
        return []
    from perfcast.analysis.comms import collectives

    sized = [r for r in collectives(table).by_op if r.size_bytes]
    rows = [r for r in sized if r.pct_of_peak is not None]
    head = f"collectives hold {comm:.0f}% of the critical path"
    if not rows:
        why = (
            "no link to compare their bandwidth with is known (the device is not in the "
            "hardware tables, or the backend moves data over the host's network)"
            if sized
            else "the trace carries no collective sizes (record_shapes=True records them)"
        )
        return [f"{head}; {why}, so whether they move data or wait for other ranks is unknown"]
    # The share of peak the time-weighted collective reached (its fastest call).
    weight = sum(r.total_ms for r in rows)
    pct_peak = sum((r.pct_of_peak or 0.0) * r.total_ms for r in rows) / weight
    link = rows[0].link
    ops = sorted({r.op for r in rows})
    if pct_peak < SLOW_COLLECTIVE_PCT:
        who = (
            "run 'perfcast analyze DIR --only stragglers' to see which"
            if len(table.ranks) > 1
            else "trace every rank (perfcast profile -- torchrun ...) and run 'perfcast analyze "
            "DIR --only stragglers' to see which"
        )
        return [
            f"{head}, and they reached {pct_peak:.1f}% of the link's peak bus bandwidth "
            f"({', '.join(ops)}, time-weighted, against {link}, the device's usual link inside "
            "a node; a job across nodes runs on a slower one): far below what the link "
            "carries, so most of their time is likely spent waiting for other ranks to "
            "arrive (a slower rank, its input pipeline, or a slow network) rather than moving "
            f"data; {who}. No modelled optimization shortens that wait"
        ]
    return [
        f"{head} and ran at {pct_peak:.0f}% of the link's peak bus bandwidth ({link}): they "
        "are moving data, so fewer bytes (a bf16 gradient-compression hook, "
        "model.register_comm_hook(None, bf16_compress_hook)), more overlap with backward "
        "(smaller DDP buckets start earlier) or a faster link shorten them"
    ]


def _candidates_for(graph: Graph) -> list[str]:
    """The default candidates, with AMP in the 16-bit type the trace's GPUs compute in: fp16
    (with its grad scaler) where a GPU has no bf16 math, such as a V100."""
    from perfcast.hardware import lookup_device

    specs = list(CANDIDATES)
    names = {n for n in graph.device_names.values() if n}
    devices = [lookup_device(n) for n in names]
    if devices and any(d is not None and "bf16" not in d.peak_tflops for d in devices):
        specs = ["amp:dtype=fp16" if s == "amp:dtype=bf16" else s for s in specs]
    return specs


def _why_uncertain(s: Suggestion) -> str:
    """Empty when the gain is beyond the model's error band; else why it is not ranked."""
    if s.speedup <= 1.0:
        # Slower where the two-decimal figure says so; 0.999 reads as no gain.
        word = "slower" if round(s.speedup, 2) < 1.0 else "no gain"
        return f"predicted {word} ({s.speedup:.2f}x)"
    if s.speedup_low is None:
        return "no measured error for any model to bound this prediction"
    if s.speedup_low <= 1.0:
        pairs = f"{s.band_pairs} measured pair{'s' * (s.band_pairs != 1)}"
        if not s.band_pairs:
            pairs = "no measured pair of this model; the largest error of any model"
        return (
            f"the gain ({s.speedup:.2f}x) is within this model's error band "
            f"(±{s.error_band_pct:.0f}%, {pairs})"
        )
    return ""


# Greedy plans tried: from the best suggestion and from up to two it shuts out (each plan is
# a few replays; the ranked list is short).
_PLAN_SEEDS = 3


def _greedy_plan(
    order: list[Suggestion], world: RealWorld
) -> tuple[list[Suggestion], float, list[str], list[str]]:
    """The greedy plan over `order`: (its suggestions, its predicted step, the compatible
    ones left out for gaining under 1% with the others, the prediction's assumptions)."""
    chosen: list[Suggestion] = []
    for s in order:
        if _compatible(s, chosen):
            chosen.append(s)
    if not chosen:  # only a device move ranked: no code change to plan
        return [], math.inf, [], []
    plan, best, assumed = [chosen[0]], chosen[0].predicted_ms, chosen[0].assumptions
    left_out: list[str] = []
    for s in chosen[1:]:
        together = _predict_together([*plan, s], world)
        if together is not None and together[0] < best * 0.99:
            plan, (best, assumed) = [*plan, s], together
        else:
            left_out.append(s.name)
    return plan, best, left_out, assumed


def _compatible(s: Suggestion, chosen: list[Suggestion]) -> bool:
    model = s.name.split(":")[0]
    if model == "device" or any(c.name.split(":")[0] == model for c in chosen):
        return False  # one variant per model; a GPU change is a purchase, not a code change
    return not any(conflict([parse_spec(s.name), parse_spec(c.name)]) for c in chosen)


# Changes with no gain of their own that another change can need, as the plan asks for
# them: a host sync splits a CUDA graph capture (cuda-graphs keeps syncs by default), and the
# syncs a user can drop are their own reads (.item(), .cpu()), not a library's waits.
_ENABLERS = {"remove-host-sync": "remove-host-sync:reads=true"}


def _plan(
    ranked: list[Suggestion],
    world: RealWorld,
    baseline_ms: float,
    traits: TraceTraits | None = None,
    unranked: list[Suggestion] | None = None,
) -> Plan | None:
    """The ranked suggestions of different models that gain together, applied as one.

    Greedy, best first: a suggestion joins the plan when the plan with it is predicted at
    least 1% faster than without it (a CUDA graph over an already fused optimizer, or a
    second way to hide the same wait, may add nothing, and capture can even add work).
    A suggestion that the first choice shuts out (another variant of its model, or a change
    that cannot be made with it) seeds a greedy plan of its own; the fastest plan wins.
    Then an unranked enabler (remove-host-sync) that slows nothing by itself joins on the
    same terms.
    """
    if not ranked:
        return None
    seeds = [ranked[0]]
    for s in ranked[1:]:
        # A device move joins no plan: it seeds none either.
        shut_out = s.name.split(":")[0] != "device" and not _compatible(s, [ranked[0]])
        if len(seeds) < _PLAN_SEEDS and shut_out:
            seeds.append(s)
    plan: list[Suggestion] = []
    best = math.inf
    left_out: list[str] = []
    assumed: list[str] = []
    for seed in seeds:
        order = [seed, *(s for s in ranked if s is not seed)]
        got, got_ms, got_left, got_assumed = _greedy_plan(order, world)
        # Another seed's plan wins by 1% or more, as every change in a plan must.
        if not plan or got_ms < best * 0.99:
            plan, best, left_out, assumed = got, got_ms, got_left, got_assumed
    enablers: list[str] = []
    for s in unranked or []:
        if s.name.split(":")[0] not in _ENABLERS or s.speedup < 0.99:
            continue
        s = replace(s, name=_ENABLERS[s.name.split(":")[0]])
        if not _compatible(s, plan):
            continue
        together = _predict_together([*plan, s], world)
        if together is not None and together[0] < best * 0.99:
            plan, (best, assumed) = [*plan, s], together
            enablers.append(s.name)
    if len(plan) < 2:
        return None
    names = [s.name for s in _in_plan_order(plan)]
    return Plan(
        specs=names,
        predicted_ms=best,
        speedup=baseline_ms / best if best > 0 else float("inf"),
        code=[c for c in (_code(n, traits) for n in names) if c],
        left_out=left_out,
        enablers=enablers,
        assumptions=list(assumed),
    )


def _in_plan_order(suggestions: list[Suggestion]) -> list[Suggestion]:
    """The suggestions in the order `whatif` applies them (registry.in_plan_order: code
    changes first, capture last, dataloader-overlap after everything), so that the plan
    shown is the plan predicted."""
    specs = [parse_spec(s.name) for s in suggestions]
    where = {id(spec): i for i, spec in enumerate(specs)}
    return [suggestions[where[id(spec)]] for spec in in_plan_order(specs)]


def _predict_together(
    suggestions: list[Suggestion], world: RealWorld
) -> tuple[float, list[str]] | None:
    """The mean predicted step with all of them applied, and what that prediction assumed
    (as a suggestion lists it); None if one does not apply after the others."""
    specs = [parse_spec(s.name) for s in _in_plan_order(suggestions)]
    try:
        new_graph, applied = apply_specs(world.graph, specs)
    except PerfcastError:
        return None
    tl = simulate(new_graph)
    assumed = [a for ap in applied for a in ap.assumptions]
    lead = lead_assumption(world.real, tl, applied)
    return float(predicted_step_ms(world.real, tl, applied)), assumed + ([lead] if lead else [])
