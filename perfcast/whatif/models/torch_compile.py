"""torch-compile: `model = torch.compile(model)` (default mode) on an eager trace.

What changes, in the phases compiled (forward and backward; the optimizer and data loading
stay eager, as with `torch.compile(model)`):

GPU. Library calls (GEMMs, convolutions, attention, copies, collectives) stay as they are:
Inductor calls them as extern kernels. The kernels it generates itself replace every other
kernel: adjacent pointwise kernels on one stream, with the reductions and row-wise
normalizations they feed, become one Triton kernel (TorchInductor's pointwise / reduction
fusion, Ansel et al., "PyTorch 2", ASPLOS '24). Grouping, in stream order: a group ends at
anything it cannot absorb (a library kernel, a kernel another stream waits for, another
phase or step), after a full reduction, and before a second norm/softmax (one persistent
reduction per kernel). A group's duration follows its passes over memory as in
`fuse-elementwise` (fixed cost paid once, the variable part scaled by fused/unfused passes).
Inductor's kernels are assumed to move bytes as fast as ATen's.

Host. The eager ops of the compiled phases (Python, dispatcher, autograd bookkeeping, the
launches they make) are replaced by what the compiled code runs:
- each library call keeps the host time its own ATen op took in the trace (the innermost op
  that launched it, profiler cost taken out): Inductor calls the same op;
- so does an op whose own host time exceeds 200 µs (`WORK_NS`): that is work (lazy CUDA
  initialization, CPU compute, allocation), not dispatch;
- each generated kernel costs `launch_us` of host time (default 8 µs: Inductor's
  CachingAutotuner.run per kernel was measured at 6.8 µs with no arguments and 9.1 µs with 19
  on a GB200 host, cuLaunchKernel included; tritonbench pull request #1017, April 2026);
- each compiled graph call costs `graph_call_us` more (default 26.5 µs: the same
  measurement's end-to-end 33 µs for a one-kernel graph, Dynamo's guards and the AOTAutograd
  and wrapper layers, less the one kernel's 6.5 µs). One graph per phase and step unless
  `graphs` says the model breaks into more.
Host synchronizations and waits for other threads stay where they were (a sync in compiled
code is a graph break; the user states those with `graphs`).

`mode=reduce-overhead` then replays each compiled phase from a CUDA graph (the cuda-graphs
model on those phases), still paying the graph call before each replay.

Not modelled, said in the assumptions: compile time and recompilations, Inductor's choice of
layouts (it may convert convolutions to channels-last), its replacing of cuDNN batch-norm
kernels by generated ones that may be slower; `max-autotune`'s own GEMM choices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from perfcast.arrays import split_by
from perfcast.errors import NotApplicableError, OptionValueError
from perfcast.graph.model import GpuKind, Graph, NodeKind, Source
from perfcast.graph.phases import Phase, phase_names
from perfcast.hardware import KernelClass
from perfcast.whatif import primitives as P
from perfcast.whatif.kernels import (
    fixed_cost_text,
    is_library_helper,
    kernel_fixed_cost_ns,
    refuse_graph_replays,
)
from perfcast.whatif.models.fuse_elementwise import passes

SUMMARY = (
    "torch.compile(model): Inductor's fused kernels and a compiled host path "
    "(mode=default|reduce-overhead, phases=forward+backward, graphs=N)"
)

TRITON_LAUNCH_NS = 8_000
GRAPH_CALL_NS = 26_500
# Eager ops' own host time (profiler cost out) on the recorded H100 traces: 99th percentile
# 54 µs (MLP) and 82 µs (ResNet-50). Beyond WORK_NS an op is doing work, not dispatching.
WORK_NS = 200_000

_GENERATED = frozenset(
    {
        KernelClass.ELEMENTWISE,
        KernelClass.REDUCTION,
        KernelClass.NORM,
        KernelClass.SOFTMAX,
        KernelClass.MEMSET,
    }
)
_ROW_REDUCTION = frozenset({KernelClass.NORM, KernelClass.SOFTMAX})
# Kernels Inductor generated, or ops of a compiled region: the trace is compiled already.
_COMPILED = re.compile(r"^triton_|CompiledFunction|Torch-Compiled Region|^CompiledFxGraph")
_PHASES = {"forward": Phase.FORWARD, "backward": Phase.BACKWARD}
# A trace whose steps run at least this share of the GPU work Inductor would generate
# compiled already is a compiled model: refused. Below it, the compiled part is left as it is.
_COMPILED_SHARE = 0.5


@dataclass
class Options:
    mode: str = "default"  # or "reduce-overhead": the compiled graphs replayed as CUDA graphs
    phases: str = "forward+backward"
    graphs: int = 1  # compiled graphs per phase and step (1 + graph breaks)
    launch_us: float = TRITON_LAUNCH_NS / 1000
    graph_call_us: float = GRAPH_CALL_NS / 1000


def _phases(options: Options) -> list[int]:
    names = P.split_list(options.phases)
    bad = [p for p in names if p not in _PHASES]
    if bad or not names:
        raise OptionValueError(
            f"torch-compile: phases must be forward and/or backward (got {options.phases!r})"
        )
    return [int(_PHASES[p]) for p in names]


def _generated(graph: Graph, gpu: np.ndarray) -> np.ndarray:
    """Which of these GPU nodes Inductor would generate (True) rather than call (False)."""
    c = graph.cols
    ok = (c["gpu_kind"][gpu] == GpuKind.KERNEL) & np.isin(c["klass"][gpu], list(_GENERATED))
    ids, where = np.unique(c["name"][gpu], return_inverse=True)
    helper = np.array([i >= 0 and is_library_helper(graph.names[i]) for i in ids.tolist()])
    return ok & ~helper[where.reshape(-1)] if ids.size else ok


def _groups(graph: Graph, region_gpu: np.ndarray, generated: np.ndarray) -> list[list[int]]:
    """Generated kernels grouped into the kernels Inductor would emit (module docstring)."""
    c = graph.cols
    alive = graph.alive
    in_region = dict(zip(region_gpu.tolist(), generated.tolist(), strict=True))
    all_gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & alive)
    waited = set(graph.edge_dst[np.isin(graph.edge_dst, all_gpu)].tolist())
    groups: list[list[int]] = []
    on_region_lanes = all_gpu[np.isin(c["lane"][all_gpu], c["lane"][region_gpu])]
    for _, pos in split_by(c["lane"][on_region_lanes], c["order"][on_region_lanes]):
        nodes = on_region_lanes[pos].tolist()
        group: list[int] = []
        for n in nodes:
            if not in_region.get(n, False):
                if group:
                    groups.append(group)
                group = []
                continue
            k = int(c["klass"][n])
            joins = (
                bool(group)
                and c["phase"][n] == c["phase"][group[0]]
                and c["iteration"][n] == c["iteration"][group[0]]
                and n not in waited
                and not (
                    k in _ROW_REDUCTION and any(int(c["klass"][m]) in _ROW_REDUCTION for m in group)
                )
            )
            if not joins and group:
                groups.append(group)
                group = []
            group.append(n)
            if k == KernelClass.REDUCTION:  # a full reduction ends its kernel
                groups.append(group)
                group = []
        if group:
            groups.append(group)
    return groups


def _marker_ops(graph: Graph) -> np.ndarray:
    """The op rows of the step markers (ProfilerStep#N): work attributed to them is in no op."""
    c = graph.cols
    markers = np.array([s.start_node for s in graph.iterations if s.start_node >= 0])
    return np.unique(c["op"][markers]) if markers.size else np.zeros(0, np.int32)


def compiled_region_host(graph: Graph, host: np.ndarray, phases: list[int]) -> np.ndarray:
    """The host work the compiled code replaces: the ops of the compiled phases and the Python
    between them (time attributed to no op or to the step marker, inside the span of a
    phase's ops on its thread), not what comes before a phase's first op or after its last
    (a step's tail, logging, the training loop itself)."""
    c = graph.cols
    marker_ops = _marker_ops(graph)
    in_phase = np.isin(c["phase"][host], phases)
    anchor = in_phase & (c["op"][host] >= 0) & ~np.isin(c["op"][host], marker_ops)
    filler = ~anchor & (in_phase | (c["phase"][host] == Phase.NONE))
    key = (
        (c["rank"][host].astype(np.int64) << 40)
        | ((c["iteration"][host].astype(np.int64) + 1) << 20)
        | c["lane"][host].astype(np.int64)
    )
    _, group = np.unique(key, return_inverse=True)
    group = group.reshape(-1)
    n_groups = int(group.max()) + 1 if group.size else 0
    order = c["order"][host]
    inside = np.zeros(host.size, dtype=bool)
    for phase in phases:
        is_phase = anchor & (c["phase"][host] == phase)
        lo = np.full(n_groups, np.inf)
        hi = np.full(n_groups, -np.inf)
        np.minimum.at(lo, group[is_phase], order[is_phase])
        np.maximum.at(hi, group[is_phase], order[is_phase])
        inside |= filler & (order > lo[group]) & (order < hi[group])
    return host[anchor | inside]


def _autocast_calls(graph: Graph, host: np.ndarray, gpu: np.ndarray) -> np.ndarray:
    """Which of these host nodes are the amp model's modelled casts: their CPU calls and the
    launches of their kernels (among `gpu`)."""
    from perfcast.whatif.models.amp import (
        BACKWARD_CAST_CALL,
        CAST_KERNEL_PREFIX,
        FORWARD_CAST_CALL,
    )

    c = graph.cols
    calls = [i for i, n in enumerate(graph.names) if n in (FORWARD_CAST_CALL, BACKWARD_CAST_CALL)]
    kernels = [i for i, n in enumerate(graph.names) if n.startswith(CAST_KERNEL_PREFIX)]
    if not calls and not kernels:
        return np.zeros(host.size, dtype=bool)
    launches = c["launch"][gpu[np.isin(c["name"][gpu], kernels)]]
    return np.isin(c["name"][host], calls) | np.isin(host, launches[launches >= 0])


def _compiled_nodes(graph: Graph) -> np.ndarray:
    """Nodes of work the trace ran compiled already: inside a compiled region (or a
    CompiledFunction) of the trace, Inductor's kernels, and GPU work such nodes launched."""
    c = graph.cols
    hit = np.array([bool(_COMPILED.search(n)) for n in graph.names], dtype=bool)
    out = ((c["name"] >= 0) & hit[np.maximum(c["name"], 0)]) | (
        (c["op_name"] >= 0) & hit[np.maximum(c["op_name"], 0)]
    )
    table = graph.table
    if table is not None and len(table):
        # A row inside a compiled range (itself or any enclosing row named so).
        from perfcast.analysis.common import nearest_ancestor

        named = np.array([bool(_COMPILED.search(n)) for n in table.names], dtype=bool)
        event = c["event"].astype(np.int64)
        has = (event >= 0) & (event < len(table))
        out[has] |= nearest_ancestor(table, event[has], named[table.name]) >= 0
    launched = (c["kind"] == NodeKind.GPU) & (c["launch"] >= 0)
    out[launched] |= out[c["launch"][launched]]
    return out


def _refuse_compiled(graph: Graph) -> np.ndarray:
    """The compiled nodes; refused when they hold most of the steps' GPU time (a trace of a
    compiled model). A small compiled helper in an eager model (vLLM compiles one masking
    function) is left as it is, and the rest is compiled."""
    c = graph.cols
    compiled = _compiled_nodes(graph)
    gpu = (c["kind"] == NodeKind.GPU) & graph.alive & (c["iteration"] >= 0)
    # Against the work Inductor would generate: a compiled model's library GEMMs may sit
    # outside any compiled range of the trace, its generated kernels never do.
    triton = np.array([n.startswith(("triton_", "triton__")) for n in graph.names], dtype=bool)
    generated = np.isin(c["klass"], list(_GENERATED)) | (
        (c["name"] >= 0) & triton[np.maximum(c["name"], 0)]
    )
    eager = gpu & ~compiled & generated
    # Like with like: compiled kernels of the kinds Inductor generates (a compiled region's
    # library GEMMs are no evidence either way).
    done = float(c["dur"][gpu & compiled & generated].sum())
    total = done + float(c["dur"][eager].sum())
    host = compiled & graph.alive & (c["kind"] != NodeKind.GPU)
    if compiled[graph.alive].any() and (total <= 0 or done >= _COMPILED_SHARE * total):
        i = int(np.flatnonzero(compiled & graph.alive)[0])
        name = graph.name_of(i) if not host.any() else graph.name_of(int(np.flatnonzero(host)[0]))
        name = name if len(name) <= 80 else "…" + name[-79:]  # the end names the op
        raise NotApplicableError(
            f"torch-compile: the trace is compiled already ({name!r} runs in it; "
            f"{100 * done / total if total else 100:.0f}% of the GPU work Inductor would "
            "generate runs compiled)"
        )
    if compiled.any():
        graph.assumptions.append(
            f"torch-compile: {done / 1e6:,.3f} ms of the steps' GPU work runs compiled already "
            f"in the trace ({100 * done / total:.1f}% of what Inductor would generate): left "
            "as it is"
        )
    return compiled


def check_options(options: Options) -> None:
    """Values the model cannot take (the registry calls this when it builds the options)."""
    if options.mode not in ("default", "reduce-overhead"):
        raise OptionValueError(
            f"torch-compile: mode must be default or reduce-overhead (got {options.mode!r}); "
            "max-autotune's own GEMM choices are not modelled"
        )
    _phases(options)
    if options.graphs < 1:
        raise OptionValueError("torch-compile: graphs must be at least 1")


def apply(graph: Graph, options: Options) -> Graph:
    refuse_graph_replays(graph, "torch-compile")
    captured = graph.alive & (graph.cols["name"] == graph.intern("cudaGraphLaunch"))
    if (captured & (graph.cols["source"] == Source.MODELLED)).any():
        # Compiling a captured step would fuse kernels the replay already launches without
        # host work, and take away host work the capture already removed.
        if any(a.startswith("torch-compile mode=reduce-overhead") for a in graph.assumptions):
            raise NotApplicableError(
                "torch-compile: the step is compiled and captured already by "
                "torch-compile:mode=reduce-overhead; apply one of the two"
            )
        raise NotApplicableError(
            "torch-compile: the step is already captured by cuda-graphs, applied before it; "
            "apply torch-compile first (--apply torch-compile --apply cuda-graphs), or "
            "torch-compile:mode=reduce-overhead instead of cuda-graphs"
        )
    graph = _compile(graph, options)
    if options.mode == "reduce-overhead":
        graph = _replay_as_cuda_graphs(graph, options)
    return graph


def _replay_as_cuda_graphs(graph: Graph, options: Options) -> Graph:
    """mode="reduce-overhead": each compiled graph is captured once and replayed (CUDA graph
    trees): the cuda-graphs model over the compiled phases, the optimizer left eager, and
    the graph call's guards and bookkeeping still paid per phase before the replay."""
    from perfcast.whatif.models import cuda_graphs

    # The compiled phases each step has (an inference step: its forward only), each one a
    # graph call of its own: forward and backward are separate compiled graphs.
    c = graph.cols
    host = np.flatnonzero(
        graph.alive
        & (c["iteration"] >= 0)
        & (c["kind"] != NodeKind.GPU)
        & np.isin(c["phase"], _phases(options))
    )
    phases_of: dict[tuple[int, int], set[int]] = {}
    for key in zip(
        c["rank"][host].tolist(),
        c["iteration"][host].tolist(),
        c["phase"][host].tolist(),
        strict=True,
    ):
        phases_of.setdefault(key[:2], set()).add(key[2])
    try:
        graph = cuda_graphs.apply(graph, cuda_graphs.Options(phases=options.phases))
    except NotApplicableError as exc:
        # Said in this model's name: the user asked for torch-compile, not cuda-graphs.
        text = str(exc)
        if exc.hint and text.endswith(f" ({exc.hint})"):
            text = text[: -len(exc.hint) - 3]
        raise NotApplicableError(
            text.replace("cuda-graphs:", "torch-compile mode=reduce-overhead:", 1), hint=exc.hint
        ) from None
    c = graph.cols
    launches = np.flatnonzero(
        (c["name"] == graph.intern("cudaGraphLaunch")) & graph.alive & (c["iteration"] >= 0)
    )
    # The calls of a step (one per compiled phase it has, times graphs) before its first
    # replay: not per replay (syncs split a capture into several) nor per phase asked for.
    firsts = _first_per_step(graph, launches, by_phase=False)
    steps = zip(c["rank"][firsts].tolist(), c["iteration"][firsts].tolist(), strict=True)
    n_calls = np.array([len(phases_of.get(s, ())) or 1 for s in steps], dtype=np.int64)
    n_calls *= options.graphs
    _insert_before(
        graph,
        firsts,
        int(options.graph_call_us * 1000) * n_calls,
        "torch.compile graph calls (guards, CUDA graph tree bookkeeping)",
    )
    calls = float(n_calls.mean()) if n_calls.size else 0.0
    graph.assumptions.append(
        f"torch-compile mode=reduce-overhead: the compiled {options.phases} replayed from CUDA "
        f"graphs, {calls:g} graph call(s) of {options.graph_call_us:g} µs per step (one per "
        "compiled phase and graph, before its first replay); the optimizer stays eager "
        "(compile it too, or capture the whole step: see cuda-graphs)"
    )
    return graph


def _first_per_step(graph: Graph, nodes: np.ndarray, by_phase: bool) -> np.ndarray:
    """The earliest of `nodes` per rank and step (and phase)."""
    c = graph.cols
    if nodes.size == 0:
        return nodes
    phase = c["phase"][nodes].astype(np.int64) + 1 if by_phase else np.zeros(nodes.size, np.int64)
    key = (
        (c["rank"][nodes].astype(np.int64) << 40)
        | ((c["iteration"][nodes].astype(np.int64) + 1) << 8)
        | phase
    )
    ranked = np.lexsort((c["order"][nodes], key))
    first = np.ones(nodes.size, dtype=bool)
    first[1:] = key[ranked][1:] != key[ranked][:-1]
    return nodes[ranked[first]]


def _insert_before(graph: Graph, anchors: np.ndarray, dur_ns: int | np.ndarray, name: str) -> None:
    """One CPU node of `dur_ns` (one for all, or one per anchor) right before each anchor on
    its lane (a single append)."""
    if anchors.size == 0:
        return
    slots = P.order_slots(graph, anchors, 1, after=False)[:, 0]
    graph.append(
        kind=int(NodeKind.CPU),
        lane=graph.cols["lane"][anchors],
        order=slots,
        launch_order=slots,
        dur=dur_ns,
        source=int(Source.MODELLED),
        name=graph.intern(name),
        **P.like_columns(graph, anchors),
    )


def _compile(graph: Graph, options: Options) -> Graph:
    phases = _phases(options)
    c = graph.cols
    alive = graph.alive
    if not ((c["kind"] == NodeKind.GPU) & alive).any():
        raise NotApplicableError(
            "torch-compile: the trace has no GPU work (Inductor's CPU code generation is not "
            "modelled)"
        )
    compiled = _refuse_compiled(graph)
    host_kinds = np.isin(c["kind"], [NodeKind.CPU, NodeKind.LAUNCH, NodeKind.RUNTIME])
    region_host = compiled_region_host(
        graph, np.flatnonzero(host_kinds & alive & (c["iteration"] >= 0) & ~compiled), phases
    )
    region_launch = region_host[c["kind"][region_host] == NodeKind.LAUNCH]
    region_gpu = np.flatnonzero(
        (c["kind"] == NodeKind.GPU) & alive & np.isin(c["launch"], region_launch)
    )
    if region_gpu.size == 0:
        raise NotApplicableError(
            "torch-compile: no GPU work is launched in the compiled phases "
            f"({options.phases}) of any step"
        )
    generated = _generated(graph, region_gpu)
    # Ops that make library calls keep their own host time (Inductor calls the same op).
    extern_launch = np.unique(c["launch"][region_gpu[~generated]])
    extern_ops = np.unique(c["op"][extern_launch])
    extern_ops = extern_ops[(extern_ops >= 0) & ~np.isin(extern_ops, _marker_ops(graph))]
    # Ops whose own host time is far beyond dispatch are doing work (lazy CUDA
    # initialization, CPU compute, allocation) that compiled code does too: kept whole. Told
    # from the trace's own time: calls another model added (amp's extra batch-norm launches)
    # must not carry an op over the line.
    attributed = region_host[
        np.isin(c["phase"][region_host], phases)
        & (c["op"][region_host] >= 0)
        & np.isin(c["source"][region_host], [Source.MEASURED, Source.CORRECTED])
    ]
    # Per op and phase: checkpointing's recompute runs a forward op again in backward, as
    # a copy of the op's nodes, and is not one op doing twice the work.
    key = c["op"][attributed].astype(np.int64) * 16 + c["phase"][attributed] + 1
    keys, where = np.unique(key, return_inverse=True)
    own_ns = np.bincount(where.reshape(-1), weights=c["dur"][attributed].astype(np.float64))
    working_ops = np.unique(keys[own_ns > WORK_NS] // 16)

    fixed = kernel_fixed_cost_ns(graph)
    groups = _groups(graph, region_gpu, generated)
    gpu_before = int(c["dur"][region_gpu[generated]].sum())
    gpu_after = 0
    kept_launches: list[int] = []
    rest: list[int] = []
    for group in groups:
        first = group[0]
        if len(group) > 1:
            d = c["dur"][group].astype(np.float64)
            f = np.minimum(d, fixed)
            unfused, fused = passes(graph, group)
            new = round(float(f.max()) + float((d - f).sum()) * fused / max(unfused, 1))
            P.set_duration(graph, np.array([first]), new, Source.MODELLED)
            c["name"][first] = graph.intern(f"triton kernel: {len(group)} kernels fused")
            rest.extend(group[1:])
        gpu_after += int(c["dur"][first])
        kept_launches.append(int(c["launch"][first]))

    # Host: what is neither a library call's own op nor a generated kernel's launch goes.
    kept_ops = np.concatenate([extern_ops, working_ops])
    keep = np.isin(c["op"][region_host], kept_ops) & (c["op"][region_host] >= 0)
    # A library kernel launched outside any op keeps its launch call (it still runs).
    keep |= np.isin(region_host, extern_launch)
    # The amp model's casts (applied before) sit in the library ops they feed; Dynamo traces
    # autocast, so they are generated kernels: their eager dispatch goes (a generated
    # kernel's launch, theirs included, stays below).
    keep &= ~_autocast_calls(graph, region_host, region_gpu)
    keep |= np.isin(region_host, kept_launches)
    removed_host = int(c["dur"][region_host[~keep]].sum())
    launches = np.unique(np.array(kept_launches, dtype=np.int64))
    launches = launches[launches >= 0]
    # A launch that itself took longer than any dispatch (first-use module loading) stays.
    launches = launches[c["dur"][launches] <= WORK_NS]
    P.set_duration(graph, launches, int(options.launch_us * 1000), Source.MODELLED)
    c["name"][launches] = graph.intern("Inductor kernel launch (CachingAutotuner.run)")
    kept_ns = int(c["dur"][region_host[keep]].sum())

    # One graph call per phase and step, before the first host work kept there.
    kept_host = region_host[keep]
    firsts = _first_per_step(
        graph, kept_host[np.isin(c["phase"][kept_host], phases)], by_phase=True
    )
    call_ns = int(options.graph_call_us * 1000) * options.graphs
    _insert_before(
        graph, firsts, call_ns, "torch.compile graph call (guards, AOTAutograd, wrapper)"
    )
    n_calls = int(firsts.size)
    c = graph.cols

    P.remove(graph, region_host[~keep])
    P.remove_gpu_work(graph, np.array(rest, dtype=np.int64))
    per, per_what = P.rank_steps(graph, np.asarray(region_gpu, dtype=np.int64))
    # The phases the trace has of those asked for (an inference trace: its forward only).
    compiled_phases = "+".join(phase_names(c["phase"][region_gpu])) or options.phases

    def count(n: int) -> str:
        return P.per_count(n, per)

    graph.assumptions.append(
        f"torch-compile ({compiled_phases}), {per_what}: {count(int(generated.sum()))} kernels "
        f"become {count(len(groups))} generated kernels ({gpu_before / per / 1e6:.2f} -> "
        f"{gpu_after / per / 1e6:.2f} ms of GPU time: adjacent pointwise kernels with the "
        f"reductions they feed, each group paying one kernel's fixed cost "
        f"({fixed_cost_text(fixed)}) and its variable time "
        "x fused/unfused passes over memory, at ATen's bytes per second); "
        f"{count(int((~generated).sum()))} library kernels kept; "
        f"{removed_host / per / 1e6:.2f} ms of eager host work removed, "
        f"{kept_ns / per / 1e6:.2f} ms left (generated kernels' launches, library calls' own "
        f"ops, {count(working_ops.size)} ops doing work: over {WORK_NS / 1000:.0f} µs of own "
        "host time)"
    )
    # The defaults are tritonbench's measurements; a value given in their place is not.
    given = [
        f"{key}={value:g}"
        for key, value, default in (
            ("launch_us", options.launch_us, TRITON_LAUNCH_NS),
            ("graph_call_us", options.graph_call_us, GRAPH_CALL_NS),
        )
        if value * 1000 != default
    ]
    measured = "measured by tritonbench on a GB200 host (pull request #1017)"
    if len(given) == 2:
        source = "both given"
    elif given:
        source = f"{given[0]} given, the other {measured}"
    else:
        source = measured
    graph.assumptions.append(
        f"torch-compile host path: {options.launch_us:g} µs per generated kernel and "
        f"{options.graph_call_us:g} µs per graph call ({count(n_calls)} calls x "
        f"{options.graphs} graph(s) {per_what}), {source}; compile time, recompilation and "
        "Inductor's layout changes not modelled"
    )
    n_bn = _batch_norm_kernels(graph, region_gpu[generated])
    if n_bn:
        graph.assumptions.append(
            f"torch-compile: {count(n_bn)} batch-norm kernels {per_what} (cuDNN / ATen) become "
            "Inductor's "
            "generated reductions, assumed as fast per byte; measured outcomes of compiling "
            "conv nets with training-mode batch norm range from 0.7x to 1.4x (pytorch/pytorch "
            "issue 111180; this project's H100 ResNet-50, fp32: 0.83x), so the GPU part of "
            "this prediction is uncertain"
        )
    return graph


_BATCH_NORM = re.compile(r"batch_?norm|bn_fw|bn_bw|bnfwd|bnbwd", re.IGNORECASE)


def _batch_norm_kernels(graph: Graph, gpu: np.ndarray) -> int:
    c = graph.cols
    n = 0
    for node in gpu.tolist():
        op = int(c["op_name"][node])
        names = graph.name_of(node) + (" " + graph.names[op] if op >= 0 else "")
        n += bool(_BATCH_NORM.search(names))
    return n
