"""activation-checkpointing: recompute forward work during backward (time only).

torch.utils.checkpoint frees a region's activations after its forward and runs
the region's forward again during backward to rebuild them. This model adds
that second forward:

- what is recomputed: the forward-phase work of each step matching `module`
  (a regular expression on the enclosing nn.Module / record_function scope or
  on the op name; default: all forward work, i.e. checkpointing the whole
  model). GPU kernels, memsets and device-to-device copies, and the host work
  that issued them: the CPU segments and launches of the selected ops.
  Host<->device copies (the input batch), synchronizations and other runtime
  calls are not repeated;
- durations: every copy reuses its original's duration (measured, or as an
  earlier what-if left it), marked scaled since it is a measured time moved to
  a new place; except that a copied launch call costs at most the trace's
  median launch duration (`primitives.median_launch_ns`): a launch that took
  longer was blocked (a full launch queue while the CPU ran ahead of the GPU,
  or an allocator sync), which is not work the recompute repeats;
- where: once per step at the start of backward. Host copies go on the thread
  that runs backward (the thread of the step's first backward kernel launch),
  right before that launch, in their original order; GPU copies go on the
  stream of the first backward kernel, right before it, each launched by its
  copied launch with the trace's measured launch latency and back-to-back gap.
  torch.utils.checkpoint recomputes each checkpointed segment just before that
  segment's own backward; recomputing everything up front delays the first
  backward kernel by the same total work, so the step time matches when the
  step is GPU-bound and backward kernels do not overlap other streams;
- on CPU-only traces only the host work is copied;
- torch.utils.checkpoint's own bookkeeping (saved-tensor hooks, RNG state saved
  and restored, the recompute's frames): `regions` checkpoint() calls per step
  (default 1: the selection as one region) cost region_ms each plus op_ms per
  recomputed op, both measured on this machine by `perfcast calibrate` (about
  0.09 ms and 0.013 ms on a 2-core VM: as much as the ops themselves in a small
  model). Without a calibration it is left out, and the assumptions say so. It
  is one host node before the recompute's first backward launch.

A trace that already checkpoints is refused unless `module` picks what else
to checkpoint. The memory saved is `perfcast.memory_model`'s (repeated blocks, each keeping
its input), reported with every result; not modelled here: a larger batch it would allow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from perfcast import calibration
from perfcast.errors import NotApplicableError, OptionValueError
from perfcast.events import Kind
from perfcast.graph.launches import DEFAULT_LAUNCH_LATENCY_NS, DEFAULT_STREAM_GAP_NS
from perfcast.graph.model import NONE, GpuKind, Graph, NodeKind, Source
from perfcast.graph.phases import PHASE_RULES, Phase, in_phases, phase_names
from perfcast.hardware.classify import HOST_COPY_PATTERN
from perfcast.whatif import primitives as P
from perfcast.whatif.kernels import refuse_graph_replays

SUMMARY = (
    "recompute forward work in backward like torch.utils.checkpoint "
    "(module=REGEX, regions=checkpoint calls per step)"
)

_COPIED_HOST = (NodeKind.CPU, NodeKind.LAUNCH)
# torch.utils.checkpoint at work: reentrant (CheckpointFunctionBackward), non-reentrant
# (recompute_fn in with_stack traces), FSDP's checkpoint_wrapper modules.
_CHECKPOINT = r"CheckpointFunctionBackward|checkpoint\.py\(\d+\): recompute_fn|CheckpointWrapper"
_ATTR = ("op", "op_name", "scope", "gpu_kind", "klass", "nbytes", "dur_measured")


@dataclass
class Options:
    module: str | None = None  # regex on module/scope or op names; None: all forward work
    regions: int = 1  # checkpoint() calls per step (each pays the bookkeeping once)


def check_options(options: Options) -> None:
    """Values the model cannot take (the registry calls this when it builds the options)."""
    if options.regions < 1:
        raise OptionValueError("activation-checkpointing: regions must be at least 1")
    P.check_pattern(options.module, "activation-checkpointing: module")


def apply(graph: Graph, options: Options) -> Graph:
    refuse_graph_replays(graph, "activation-checkpointing")
    c = graph.cols
    bwd = P.select(graph, kind="host", phase="backward")
    bwd = bwd[c["iteration"][bwd] >= 0]
    if bwd.size == 0:
        raise NotApplicableError(
            "activation-checkpointing: the trace has no backward pass inside its steps "
            "(inference?): nothing would be recomputed"
        )
    already = _already_checkpointed(graph)
    if already and options.module is None:
        raise NotApplicableError(
            f"activation-checkpointing: the trace already checkpoints ({already}); "
            "recomputing all forward work again would count it twice",
            hint="pass module=REGEX to checkpoint other modules as well",
        )
    fwd = _selected(graph, options.module)
    costs, fit = calibration.for_trace(graph.table)
    ck = costs.checkpoint if costs is not None else None
    if fwd.size == 0:
        raise _no_forward(graph, options.module)
    lat = int(graph.nominal.get("launch_latency_ns", DEFAULT_LAUNCH_LATENCY_NS))
    gap = int(graph.nominal.get("stream_gap_ns", DEFAULT_STREAM_GAP_NS))
    launch_cap = P.median_launch_ns(graph)
    n_host = n_gpu = 0
    host_ns = gpu_ns = book_ns = 0
    keys = np.unique(np.stack([c["rank"][fwd], c["iteration"][fwd]], axis=1), axis=0)
    for rank, it in keys.tolist():
        group = fwd[(c["rank"][fwd] == rank) & (c["iteration"][fwd] == it)]
        ops = _outermost_ops(graph, c["op"][group])
        extra = round(ck.extra_ms(options.regions, ops) * 1e6) if ck is not None else 0
        done = _recompute(graph, group, rank, it, lat, gap, launch_cap, extra)
        c = graph.cols
        n_host += done[0]
        n_gpu += done[1]
        host_ns += done[2]
        gpu_ns += done[3]
        book_ns += done[4]
    if n_host + n_gpu == 0:
        raise NotApplicableError(
            "activation-checkpointing: no step has both the selected forward work and a backward"
        )
    # Per step and rank, as every count perfcast prints, and said so on a multi-rank trace.
    steps, per_what = P.rank_steps(graph, fwd)
    graph.assumptions.append(
        f"activation checkpointing of {options.module or 'all forward work'}: "
        f"{P.per_count(n_gpu, steps)} GPU tasks ({gpu_ns / steps / 1e6:.2f} ms) and "
        f"{P.per_count(n_host, steps)} host nodes ({host_ns / steps / 1e6:.2f} ms) {per_what} "
        "recomputed "
        "with their measured durations (launches at most the median launch), placed as one "
        "block at the start of backward: torch.utils.checkpoint recomputes each segment just "
        "before its own backward, the same time in total but not the same overlap with other "
        "work; the memory it saves is the memory model's (the result's peak memory)"
    )
    if ck is not None and costs is not None:
        graph.assumptions.append(
            f"checkpoint bookkeeping {book_ns / steps / 1e6:.2f} ms {per_what} = "
            f"{options.regions} region(s) x {ck.region_ms:g} ms + recomputed ops x "
            f"{ck.op_ms:g} ms ({fit})"
        )
    else:
        why = fit or "no calibration (run 'perfcast calibrate' on the training machine)"
        graph.assumptions.append(
            f"torch.utils.checkpoint's own bookkeeping per region and op is not counted: {why}"
        )
    if already:
        graph.assumptions.append(
            f"the trace already checkpoints ({already}); '{options.module}' is assumed to "
            "select other modules"
        )
    return graph


def _outermost_ops(graph: Graph, op_rows: np.ndarray) -> int:
    """How many distinct outermost CPU ops (aten::linear, not the addmm inside) these rows
    belong to: the unit torch.utils.checkpoint's per-op bookkeeping is calibrated in."""
    table = graph.table
    rows = np.unique(op_rows[op_rows >= 0])
    if table is None or rows.size == 0:
        return int(rows.size)
    for _ in range(64):  # op nesting depth; deeper stacks are not seen in practice
        par = table.parent[rows]
        up = (par >= 0) & (table.kind[np.maximum(par, 0)] == Kind.CPU_OP)
        if not up.any():
            break
        rows = np.unique(np.where(up, par, rows))
    return int(rows.size)


def _already_checkpointed(graph: Graph) -> str | None:
    """A name showing torch.utils.checkpoint at work in the trace, if any."""
    table = graph.table
    names = table.names if table is not None else graph.names
    pat = re.compile(_CHECKPOINT)
    return next((n for n in names if pat.search(n)), None)


def _no_forward(graph: Graph, module: str | None) -> NotApplicableError:
    """Nothing to recompute: no forward work in the steps, or none that `module` matches."""
    c = graph.cols
    every = _selected(graph, None) if module is not None else np.zeros(0, np.int64)
    ops = np.unique(c["op_name"][every][c["op_name"][every] >= 0])
    scopes = np.unique(c["scope"][every][c["scope"][every] >= 0])
    if ops.size or scopes.size:
        return NotApplicableError(
            f"activation-checkpointing: module '{module}' matches none of the steps' forward "
            f"work: its {ops.size:,} op name{'s' if ops.size != 1 else ''} and "
            f"{scopes.size:,} module/record_function scope{'s' if scopes.size != 1 else ''}",
            hint="module= is a regular expression searched within those names, e.g. "
            "module=layer3 or module=aten::conv; `perfcast analyze --only scopes` "
            "(perfcast.scopes()) lists the "
            "scopes, and module scopes need a trace recorded with with_stack=True or "
            "with_modules=True",
        )
    host = P.select(graph, kind=("cpu", "launch"))
    present = phase_names(c["phase"][host[c["iteration"][host] >= 0]])
    found = f"the steps' CPU work is all {in_phases(present)}" if present else "no CPU work"
    return NotApplicableError(
        f"activation-checkpointing: the steps have a backward pass but no forward work to "
        f"recompute ({found}); {PHASE_RULES}",
        hint="profile whole training steps, forward included, with prof.step() once per iteration",
    )


def _selected(graph: Graph, module: str | None) -> np.ndarray:
    """Forward host segments/launches and GPU tasks to recompute (no copies, no syncs)."""
    c = graph.cols
    host = P.select(graph, kind=("cpu", "launch"), phase="forward")
    gpu = P.select(graph, kind="gpu", phase="forward")
    if module is not None:
        host = np.union1d(
            P.select(graph, kind=("cpu", "launch"), phase="forward", module=module),
            P.select(graph, kind=("cpu", "launch"), phase="forward", op=module),
        )
        gpu = np.union1d(
            P.select(graph, kind="gpu", phase="forward", module=module),
            P.select(graph, kind="gpu", phase="forward", op=module),
        )
    # A selected kernel brings its launch, a selected launch its kernels.
    alive_fwd_gpu = P.select(graph, kind="gpu", phase="forward")
    gpu = np.union1d(gpu, alive_fwd_gpu[np.isin(c["launch"][alive_fwd_gpu], host)])
    launches = c["launch"][gpu]
    host = np.union1d(host, launches[launches >= 0])
    # Host<->device copies (and the launches that only issue them) are not recomputed.
    host_copy = P.select(graph, kind="gpu", phase="forward", name=HOST_COPY_PATTERN)
    host_copy = host_copy[c["gpu_kind"][host_copy] == GpuKind.MEMCPY]
    copies = np.intersect1d(gpu, host_copy)
    gpu = np.setdiff1d(gpu, host_copy)
    copy_only = np.setdiff1d(c["launch"][copies], c["launch"][gpu])
    host = np.setdiff1d(host, copy_only)
    nodes = np.union1d(host, gpu)
    return nodes[c["iteration"][nodes] >= 0]


def _recompute(
    graph: Graph,
    group: np.ndarray,
    rank: int,
    it: int,
    lat: int,
    gap: int,
    launch_cap: int,
    bookkeeping_ns: int,
) -> tuple[int, int, int, int, int]:
    c = graph.cols
    host = group[np.isin(c["kind"][group], [int(k) for k in _COPIED_HOST])]
    gpu = group[c["kind"][group] == NodeKind.GPU]
    launches = P.select(graph, kind="launch", phase="backward", rank=rank, iteration=it)
    if launches.size:
        anchor = int(launches[np.argmin(c["order"][launches])])
    else:  # no backward kernels (CPU-only trace): before the first backward host work
        bwd = P.select(graph, kind=("cpu", "runtime"), phase="backward", rank=rank, iteration=it)
        if bwd.size == 0:
            return 0, 0, 0, 0, 0
        anchor = int(bwd[np.argmin(c["order"][bwd])])
        gpu = gpu[:0]
    host = host[np.argsort(c["order"][host], kind="stable")]
    gpu = gpu[np.lexsort((c["order"][gpu], c["launch_order"][gpu]))]
    copy_of: dict[int, int] = {}
    # A launch far slower than the median waited on a full launch queue (the CPU ran ahead
    # of the GPU) or an allocator sync; recomputed, it costs a typical launch.
    host_dur = c["dur"][host].copy()
    is_launch = c["kind"][host] == NodeKind.LAUNCH
    host_dur[is_launch] = np.minimum(host_dur[is_launch], launch_cap)
    host_ns = int(host_dur.sum())
    if host.size:
        new = P.insert(
            graph,
            lane=int(c["lane"][anchor]),
            before=anchor,
            dur=host_dur,
            kind=NodeKind.CPU,
            name="recompute",
            count=host.size,
            source=Source.SCALED,
            phase=int(Phase.BACKWARD),
            iteration=it,
            rank=rank,
            **{k: c[k][host] for k in _ATTR},
        )
        c = graph.cols
        _copy_identity(graph, host, new)
        copy_of = dict(zip(host.tolist(), new.tolist()))
    if bookkeeping_ns > 0:
        P.insert(
            graph,
            lane=int(c["lane"][anchor]),
            before=anchor,
            dur=np.array([bookkeeping_ns], dtype=np.int64),
            kind=NodeKind.CPU,
            name="checkpoint bookkeeping",
            count=1,
            source=Source.MODELLED,
            phase=int(Phase.BACKWARD),
            iteration=it,
            rank=rank,
        )
        c = graph.cols
    gpu_ns = int(c["dur"][gpu].sum())
    if gpu.size:
        first = _first_backward_gpu(graph, anchor, rank, it)
        if first < 0:
            return host.size, 0, host_ns, 0, bookkeeping_ns
        launch = np.array([copy_of.get(int(x), NONE) for x in c["launch"][gpu]], dtype=np.int64)
        launch_order = np.where(launch >= 0, c["order"][np.maximum(launch, 0)], c["order"][first])
        new = P.insert(
            graph,
            lane=int(c["lane"][first]),
            before=first,
            dur=c["dur"][gpu],
            kind=NodeKind.GPU,
            name="recompute",
            count=gpu.size,
            source=Source.SCALED,
            phase=int(Phase.BACKWARD),
            iteration=it,
            rank=rank,
            launch=launch,
            launch_order=launch_order,
            launch_w=lat,
            stream_w=gap,
            **{k: c[k][gpu] for k in _ATTR},
        )
        _copy_identity(graph, gpu, new)
    return host.size, gpu.size, host_ns, gpu_ns, bookkeeping_ns


def _copy_identity(graph: Graph, originals: np.ndarray, copies: np.ndarray) -> None:
    """Copies keep their originals' kind and name; their source is at least scaled."""
    c = graph.cols
    c["kind"][copies] = c["kind"][originals]
    c["name"][copies] = c["name"][originals]
    c["source"][copies] = np.maximum(c["source"][originals], int(Source.SCALED))


def _first_backward_gpu(graph: Graph, anchor: int, rank: int, it: int) -> int:
    """The first backward GPU task: the first one the anchor launch issued, else the first
    backward GPU task launched."""
    c = graph.cols
    gpu = P.select(graph, kind="gpu", phase="backward", rank=rank, iteration=it)
    if gpu.size == 0:
        return NONE
    own = gpu[c["launch"][gpu] == anchor]
    pick = own if own.size else gpu
    return int(pick[np.lexsort((c["order"][pick], c["launch_order"][pick]))[0]])
