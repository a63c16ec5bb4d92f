"""cuda-graphs: capture each step's forward/backward/optimizer and replay it with one launch.

Assumptions: shapes are static. A host synchronization cannot be captured
(capture fails), so by default (syncs=split) each sync inside the captured
phases stays, waiting for the GPU, and the step is captured as one graph per
stretch between syncs; syncs=move assumes them moved out of the step instead.
All other CPU work of each stretch — Python, dispatcher, launches — is replaced
by one graph launch. Where the durations come from:

- kernels keep their measured durations; inside a graph replay they run
  IN_GRAPH_GAP_NS apart (measured: the mean gap between the kernels of a
  1,575-kernel whole-step graph replayed on an H100, PyTorch 2.11, CUDA 13, is
  0.38 µs, median 0.29 µs; not measured on other GPUs, so used for all);
- graph launch: a few microseconds, roughly constant for straight-line graphs
  (NVIDIA technical blog, "Constant Time Launch for Straight-Line CUDA Graphs
  and Other Performance Enhancements", 2023);
- capturing the optimizer needs `capturable=True` (torch.optim docs), which
  keeps the step count and bias corrections on the GPU: a for-loop (single
  tensor) Adam then launches CAPTURABLE_EXTRA_KERNELS_PER_PARAM more kernels
  per parameter (measured on the H100 set: 7 -> 21 kernels per parameter, 66
  parameters, GPU time of the step 1.13 -> 2.24 ms). They are added with the
  median duration of the optimizer's own kernels. Multi-tensor (foreach) and
  fused optimizers are taken to capture without extra kernels (not measured).
  Which optimizer the trace ran decides (its `Optimizer.step#<Class>.step` ranges,
  perfcast.analysis.optimizers): SGD keeps no step count on the host and captures
  as it is, with no extra kernels; a torch.optim class without a capturable option
  (Adagrad, Adafactor, LBFGS, SparseAdam) keeps its step eager, outside the graphs;
  the other capturable classes get Adam's measured count; an optimizer the trace
  does not name is taken as a for-loop Adam.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.analysis.notes import ONE_TIME_NS, one_time_calls
from perfcast.analysis.optimizers import capture_support, optimizer_class
from perfcast.arrays import combine_codes, split_by
from perfcast.errors import NotApplicableError, OptionValueError
from perfcast.graph.launches import (
    DEFAULT_LAUNCH_LATENCY_NS,
    DEFAULT_STREAM_GAP_NS,
    UNEXPLAINED_TOL_NS,
)
from perfcast.graph.model import Graph, NodeKind, Source
from perfcast.graph.phases import Phase, phase_names
from perfcast.whatif import primitives as P
from perfcast.whatif.kernels import refuse_graph_replays


def steps_overlap(options: dict[str, object]) -> bool:
    """With syncs=move the step no longer ends in a sync and runs into the next (the runner
    then takes the speedup over the steps after the first)."""
    return options.get("syncs") == "move"


SUMMARY = (
    "replay each step's GPU work from captured CUDA graphs, split at host syncs "
    "(phases=forward+backward+..., syncs=split|move)"
)

GRAPH_LAUNCH_NS = 2_500
IN_GRAPH_GAP_NS = 380
CAPTURABLE_EXTRA_KERNELS_PER_PARAM = 14


@dataclass
class Options:
    phases: str = "forward+backward+optimizer"
    graph_launch_us: float = GRAPH_LAUNCH_NS / 1000
    # A host synchronization cannot be captured. "split": the region becomes one graph per
    # stretch between syncs, and each sync stays, waiting for the graph before it (what
    # capturing such a step takes); "move": the syncs are assumed moved out of the step.
    syncs: str = "split"


def check_options(options: Options) -> None:
    """Values the model cannot take (the registry calls this when it builds the options)."""
    if not P.split_list(options.phases):
        raise OptionValueError(
            "cuda-graphs: phases= names no phase",
            hint="name the phases to capture, e.g. phases=forward+backward+optimizer",
        )
    if options.syncs not in ("split", "move"):
        raise OptionValueError(
            f"cuda-graphs: syncs={options.syncs} is not split or move",
            hint="syncs=split keeps each host synchronization and captures the stretches "
            "between them; syncs=move assumes they were moved out of the step",
        )


def apply(graph: Graph, options: Options) -> Graph:
    c = graph.cols
    phases = P.split_list(options.phases)
    if not (c["kind"] == NodeKind.GPU).any():
        raise NotApplicableError("cuda-graphs: the trace has no GPU work")
    refuse_graph_replays(graph, "cuda-graphs")
    optimizer = optimizer_class(graph.table)
    support = capture_support(optimizer)
    eager_optimizer = "optimizer" in phases and support == "none"
    if eager_optimizer:
        phases = [p for p in phases if p != "optimizer"]
        if not phases:
            raise NotApplicableError(
                f"cuda-graphs: torch.optim.{optimizer} has no capturable option, so its step "
                "cannot be captured, and phases= names only the optimizer",
                hint="capture the rest of the step, e.g. phases=forward+backward",
            )
    host = P.select(graph, kind="host", phase=phases)
    host = host[c["iteration"][host] >= 0]
    if host.size == 0 and eager_optimizer:
        raise NotApplicableError(
            f"cuda-graphs: torch.optim.{optimizer} has no capturable option, so its step cannot "
            f"be captured, and the steps have no CPU work in {'+'.join(phases)} to capture"
        )
    if host.size == 0:
        raise _no_cpu_work(graph, phases)
    _refuse_dynamic_shapes(graph, host)
    split = options.syncs == "split"
    lat = graph.nominal.get("launch_latency_ns", DEFAULT_LAUNCH_LATENCY_NS)
    gap = graph.nominal.get("stream_gap_ns", DEFAULT_STREAM_GAP_NS)
    n_waits = 0
    # Only a class that needs capturable=True (or one the trace does not name) adds kernels.
    capture_optimizer = "optimizer" in phases and support in ("capturable", "unknown")
    n_sync = 0
    n_graphs = 0
    n_kernels = 0
    n_extra = 0
    removed_cpu = 0
    one_time = one_time_calls(graph)
    kept_ns = 0
    # Regions (rank, step) and the GPU tasks each launches, grouped once: a mask per region
    # was O(regions x nodes), 14 s of a 512-rank advise.
    codes, _ = combine_codes(
        c["rank"][host].astype(np.int64), c["iteration"][host].astype(np.int64)
    )
    region_of = np.full(len(graph), -1, dtype=np.int64)
    region_of[host] = codes
    launched = np.flatnonzero((c["launch"] >= 0) & graph.alive)
    launched = launched[c["kind"][c["launch"][launched]] == NodeKind.LAUNCH]
    tasks_of = dict(split_by(region_of[c["launch"][launched]]))
    for code, pos in split_by(codes):
        region = host[pos]
        region = region[np.argsort(c["order"][region], kind="stable")]
        is_sync = c["kind"][region] == NodeKind.SYNC
        n_sync += int(is_sync.sum())
        # Where the capture must stop: at each sync (split), or nowhere (move). A blocking
        # copy's launch half (the sync half sits 0.5 after it in host order) stays eager with
        # its sync: the host reads that copy's result.
        eager = is_sync.copy() if split else np.zeros(region.size, dtype=bool)
        if split and is_sync.any():
            sync_orders = c["order"][region[is_sync]]
            eager |= np.isin(c["order"][region] + 0.5, sync_orders) & (
                c["kind"][region] == NodeKind.LAUNCH
            )
        segment = np.cumsum(is_sync) if split else np.zeros(region.size, dtype=np.int64)
        tasks = launched[tasks_of.get(code, np.zeros(0, dtype=np.int64))]
        # Each task's launch is a node of this region: its position there gives the task's
        # segment, and whether it stays eager. Grouped once, not by a mask per segment (a
        # step with thousands of syncs would make that quadratic).
        by_id = np.argsort(region)
        at = by_id[np.searchsorted(region[by_id], c["launch"][tasks])]
        tasks, at = tasks[~eager[at]], at[~eager[at]]
        tasks_in = dict(split_by(segment[at]))
        captured = region[~eager]
        for seg, pos in split_by(segment[~eager]):
            members = captured[pos]  # in host order: split_by keeps ties in order
            launches = members[c["kind"][members] == NodeKind.LAUNCH]
            if launches.size == 0:
                continue
            n_graphs += 1
            first = int(launches[0])
            gpu = tasks[tasks_in.get(seg, np.zeros(0, dtype=np.int64))]
            n_kernels += gpu.size
            # A wait the trace shows but nothing in it explains (a kernel starting long after
            # both its launch and its stream predecessor: an unrecorded event, another
            # process) is not launch overhead, so a replay keeps it; a launch's own latency
            # and the gaps between eager kernels give way to the in-graph spacing.
            # The wait stays on the dependency it followed in the trace: the launch (now the
            # graph's) or the stream predecessor.
            after_launch = c["launch_w"][gpu] - lat
            after_stream = c["stream_w"][gpu] - gap
            on_launch = (after_launch > UNEXPLAINED_TOL_NS) & (after_launch >= after_stream)
            on_stream = (after_stream > UNEXPLAINED_TOL_NS) & ~on_launch
            n_waits += int((on_launch | on_stream).sum())
            c["launch"][gpu] = first
            c["launch_w"][gpu] = lat + np.where(on_launch, after_launch, 0)
            c["stream_w"][gpu] = IN_GRAPH_GAP_NS + np.where(on_stream, after_stream, 0)
            c["launch_order"][gpu] = c["order"][first]
            if capture_optimizer:
                n_extra += _capturable_optimizer(graph, gpu, first, lat)
                c = graph.cols
            # One-time work stays: a replay does not make it go away (see analysis.notes).
            first_kept = int(c["dur"][first]) if np.isin(first, one_time) else 0
            P.set_duration(
                graph,
                np.array([first]),
                int(options.graph_launch_us * 1000) + first_kept,
                Source.MODELLED,
            )
            c["name"][first] = graph.intern("cudaGraphLaunch")
            rest = members[members != first]
            keep = np.isin(rest, one_time)
            kept_ns += first_kept + int(c["dur"][rest[keep]].sum())
            rest = rest[~keep]
            removed_cpu += int(c["dur"][rest].sum())
            P.remove(graph, rest)
    if n_kernels == 0:
        raise _no_kernels(graph, phases)
    # Per step and rank, as every count perfcast prints (a sum over 512 ranks reads as nonsense).
    per, where = P.rank_steps(graph, host)
    graphs = P.per_count(n_graphs, per)
    graph.assumptions.append(
        f"{where}: {P.per_count(n_kernels, per)} GPU tasks of the captured phases replayed "
        f"from {graphs} CUDA graph "
        f"launch{'es' * (graphs != '1')}, {IN_GRAPH_GAP_NS / 1000:.2f} µs apart (measured on an "
        f"H100); {removed_cpu / per / 1e6:.2f} ms of CPU work and launches removed (summed over "
        f"the host threads); graph launch {options.graph_launch_us:g} µs ("
        + (
            "a few µs, about constant for straight-line graphs: NVIDIA technical blog, "
            "'Constant Time Launch for Straight-Line CUDA Graphs', 2023)"
            if options.graph_launch_us * 1000 == GRAPH_LAUNCH_NS
            else "given)"
        )
    )
    if n_waits:
        graph.assumptions.append(
            f"{P.per_count(n_waits, per)} GPU task{'s' * (n_waits != 1)} {where} started more "
            f"than {UNEXPLAINED_TOL_NS / 1000:g} µs after both its launch and the work before "
            "it on its stream, waiting for something the trace does not show: those waits "
            "stay inside the graph"
        )
    if kept_ns:
        graph.assumptions.append(
            f"{kept_ns / per / 1e6:,.2f} ms of runtime calls of {ONE_TIME_NS / 1e6:g} ms or more "
            f"kept {where} (initialization, module loading, allocation, pageable copies: not "
            "launch cost, and not removed by a replay)"
        )
    if n_extra:
        extra = P.per_count(n_extra, per)
        measured = (
            f"{CAPTURABLE_EXTRA_KERNELS_PER_PARAM} per parameter of a for-loop Adam, measured "
            "on an H100 with PyTorch 2.11"
        )
        if support == "unknown":
            graph.assumptions.append(
                "the trace does not name its optimizer class: taken as a for-loop Adam "
                f"captured with capturable=True, {extra} more kernels {where} ({measured})"
            )
        else:
            if optimizer not in ("Adam", "AdamW"):
                measured += f"; not measured for {optimizer}"
            graph.assumptions.append(
                f"torch.optim.{optimizer} is captured with capturable=True: {extra} more "
                f"kernels {where} ({measured})"
            )
    if "optimizer" in phases and support == "as-is":
        graph.assumptions.append(
            f"torch.optim.{optimizer} keeps no step count on the host: its step is captured "
            "as it is, with no extra kernels (no capturable option needed)"
        )
    if eager_optimizer:
        graph.assumptions.append(
            f"torch.optim.{optimizer} has no capturable option: its step stays eager, "
            "outside the graphs, launched kernel by kernel as traced"
        )
    syncs = P.per_count(n_sync, per)
    if n_sync and split:
        graph.assumptions.append(
            f"{syncs} host synchronization{'s' * (syncs != '1')} {where} inside the captured "
            "phases cannot be captured: each stays, waiting for the graph before it, and the "
            "step is captured as the stretches between them (syncs=move assumes them moved "
            "out; remove-host-sync removes them)"
        )
    elif n_sync:
        graph.assumptions.append(
            f"{syncs} host synchronization{'s' * (syncs != '1')} {where} inside the captured "
            "region assumed moved out (capture cannot contain them)"
        )
    return graph


def _refuse_dynamic_shapes(graph: Graph, host: np.ndarray) -> None:
    """A sync that sizes a data-dependent output (boolean-mask indexing, nonzero, unique)
    means shapes that change from step to step; a CUDA graph replays fixed ones."""
    from perfcast.whatif.models.remove_host_sync import SHAPE, classify_syncs, shape_op_of

    c = graph.cols
    syncs = host[c["kind"][host] == NodeKind.SYNC]
    ops = shape_op_of(graph, syncs)
    # A host-to-device copy inside such an op (DLRM's index tensors) sizes nothing.
    ops[classify_syncs(graph, syncs) != SHAPE] = -1
    if not (ops >= 0).any():
        return
    table = graph.table
    named = sorted({table.names[i] for i in np.unique(ops[ops >= 0]).tolist()})
    per, where = P.rank_steps(graph, syncs[ops >= 0])
    n = P.per_count(int((ops >= 0).sum()), per)
    raise NotApplicableError(
        f"cuda-graphs: {n} host synchronization{'s' * (n != '1')} {where} sizing outputs whose "
        f"shape depends on the data ({', '.join(named)}): the shapes change from step to step, "
        "and a CUDA graph replays fixed shapes",
        hint="make those shapes static first (torch.nonzero_static, a mask multiply, "
        "padding); remove-host-sync:shapes=true then cuda-graphs predicts that",
    )


def _no_cpu_work(graph: Graph, phases: list[str]) -> NotApplicableError:
    """No CPU work of the steps in the selected phases: which phases does it have?"""
    c = graph.cols
    host = P.select(graph, kind="host")
    present = ", ".join(phase_names(c["phase"][host[c["iteration"][host] >= 0]]))
    selected = "+".join(phases)
    if not present:
        return NotApplicableError(
            f"cuda-graphs: no CPU work in phases {selected}: the trace's steps hold no CPU work",
            hint="record a training step with torch.profiler's CPU and CUDA activities",
        )
    return NotApplicableError(
        f"cuda-graphs: no CPU work in phases {selected}; the steps' CPU work is in {present}",
        hint="pass phases= with some of those, joined with '+'",
    )


def _no_kernels(graph: Graph, phases: list[str]) -> NotApplicableError:
    """No kernel launched in the selected phases: which phases do launch them?"""
    c = graph.cols
    gpu = P.select(graph, kind="gpu")
    in_steps = gpu[c["iteration"][gpu] >= 0]
    present = ", ".join(phase_names(c["phase"][in_steps[c["launch"][in_steps] >= 0]]))
    selected = "+".join(phases)
    if present:
        return NotApplicableError(
            f"cuda-graphs: no kernels are launched in phases {selected}; the steps launch "
            f"kernels in {present}",
            hint=f"pass phases= with some of those, e.g. phases={present.replace(', ', '+')}",
        )
    if in_steps.size:
        return NotApplicableError(
            f"cuda-graphs: no kernels are launched in phases {selected}, nor in any other: "
            f"no GPU task in the steps ({in_steps.size:,}) is linked to the CPU launch that "
            "issued it",
            hint="the trace needs the CUDA runtime's launch calls and their correlation ids, "
            "as torch.profiler records them with the CPU and CUDA activities",
        )
    return NotApplicableError(
        f"cuda-graphs: no kernels are launched in phases {selected}: the trace's steps run "
        "no GPU work",
        hint="profile steps that run on the GPU (the ProfilerStep ranges of the trace)",
    )


def _capturable_optimizer(graph: Graph, gpu: np.ndarray, launch: int, lat: int) -> int:
    """Add the kernels a capturable for-loop optimizer launches beyond the trace's own: after
    the step's last optimizer kernel, on its stream. Returns how many were added."""
    from perfcast.whatif.models.fused_optimizer import already_fused, params_estimate

    c = graph.cols
    opt = gpu[c["phase"][gpu] == Phase.OPTIMIZER]
    if opt.size == 0 or already_fused(graph, opt):
        return 0
    params, _ = params_estimate(graph, opt)
    count = params * CAPTURABLE_EXTRA_KERNELS_PER_PARAM
    if count == 0:
        return 0
    last = int(opt[np.argmax(c["order"][opt])])
    P.insert(
        graph,
        lane=int(c["lane"][last]),
        after=last,
        dur=int(np.median(c["dur"][opt])),
        kind=NodeKind.GPU,
        name="capturable optimizer step-count / bias-correction kernel (modelled)",
        count=count,
        like=last,
        launch=launch,
        launch_w=lat,
        stream_w=IN_GRAPH_GAP_NS,
        launch_order=float(c["order"][launch]),
    )
    return count
