"""zero: ZeRO-1/2/3 and FSDP sharding over N data-parallel GPUs, from a trace of one or more.

What is modelled (Rajbhandari et al., "ZeRO", SC'20; PyTorch FSDP2 and DeepSpeed as they
place their collectives):

- units: the step's forward GPU work cut into `units` contiguous chunks in launch order (FSDP
  wraps one module per unit, typically a transformer block), backward into as many in reverse;
  parameters spread evenly over units (the trace's AccumulateGrad shapes give the total,
  `params_mb` when it has none);
- every stage: after each backward unit its gradients are reduce-scattered
  (`grad_bytes` per element) on a communication stream, overlapping the next unit's backward;
  the optimizer waits for the last one; the optimizer's GPU kernels do 1/N of the work (the
  host still loops over every parameter tensor);
- stages 1 and 2: after the optimizer step the updated shards are all-gathered
  (`param_bytes` per element) before the next forward (DeepSpeed's end of step);
- stage 3 / FSDP: before each unit's forward and again before its backward its parameters are
  all-gathered (reshard after forward); a gather is issued `prefetch` units ahead, and no
  earlier than the end of the unit `prefetch + 1` before it (FSDP2's default: one unit
  prefetched, two units' parameters live at once).

Collective times: the cluster model `perfcast plan` uses (`perfcast.hardware.network`; ring:
10 µs + (p-1) alpha + (p-1)/p N / busbw, busbw 80% of the peak of `link` as in NVIDIA's
nccl-tests, or what the trace's own large collectives reached), `link` by default the
device's intra-node link; beyond `gpus_per_node` GPUs the rings cross nodes. Assumptions: weak
scaling (every GPU keeps the trace's batch), ranks in lock step, NCCL kernels do not slow the
compute they overlap. A trace that already ran data parallel has its measured all-reduces
replaced. Memory (what the
sharding saves) is reported by the memory model (`perfcast.memory_model`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.errors import NotApplicableError, OptionValueError
from perfcast.graph.model import Graph
from perfcast.graph.phases import Phase
from perfcast.memory_model.model import ZERO_UNITS
from perfcast.whatif import kernels as K
from perfcast.whatif import primitives as P
from perfcast.whatif.models import _parallel_common as C

SUMMARY = (
    "ZeRO-1/2/3 / FSDP over N GPUs: sharded optimizer state, gradients and parameters; "
    "reduce-scatter and all-gather per unit with prefetch (gpus=8, stage=3, units=16, "
    "prefetch=1, link=, gpus_per_node=8, nics_per_node=, param_bytes=4, grad_bytes=4, "
    "params_mb= when the trace has no shapes)"
)
MIB = 1 << 20


@dataclass
class Options:
    gpus: int = 8
    stage: int = 3
    units: int = ZERO_UNITS
    prefetch: int = 1
    link: str | None = None
    gpus_per_node: int = 8
    nics_per_node: int | None = None  # inter-node NICs per node (default: one per GPU)
    param_bytes: int = 4  # bytes per element all-gathered (2: FSDP mixed precision, bf16)
    grad_bytes: int = 4  # bytes per element reduce-scattered
    params_mb: float | None = None  # total parameter MiB (fp32), when the trace has no shapes


def check_options(o: Options) -> None:
    """Values the model cannot take (the registry calls this when it builds the options)."""
    if o.gpus < 2:
        raise OptionValueError("zero: gpus must be at least 2")
    if o.stage not in (1, 2, 3):
        raise OptionValueError("zero: stage must be 1, 2 or 3")
    if o.units < 1 or o.prefetch < 0:
        raise OptionValueError("zero: units must be >= 1 and prefetch >= 0")
    if o.param_bytes not in (1, 2, 4) or o.grad_bytes not in (1, 2, 4):
        raise OptionValueError("zero: param_bytes and grad_bytes must be 1, 2 or 4")
    if o.params_mb is not None and o.params_mb <= 0:
        raise OptionValueError("zero: params_mb must be positive")
    C.check_node_options("zero", o.gpus_per_node, o.nics_per_node)
    C.check_link("zero", o.link)


def apply(graph: Graph, options: Options) -> Graph:
    K.refuse_graph_replays(graph, "zero")
    o = options
    C.require_gpu_steps(graph, "zero")
    params, params_from = _param_count(graph, o)
    from perfcast.whatif.models.ddp import drop_measured_allreduces

    replaced_ms = drop_measured_allreduces(graph, "zero")
    fixed = K.kernel_fixed_cost_ns(graph)
    total_rs = total_ag = 0.0
    n_steps = 0
    ranks: set[int] = set()
    comm: C.CommModel | None = None
    cache: dict[str | None, C.CommModel] = {}
    for rank, it in C.groups(graph):
        fwd = C.step_gpu_nodes(graph, rank, it, Phase.FORWARD)
        bwd = C.step_gpu_nodes(graph, rank, it, Phase.BACKWARD)
        opt = C.step_gpu_nodes(graph, rank, it, Phase.OPTIMIZER)
        if bwd.size == 0:
            continue
        n_steps += 1
        ranks.add(rank)
        comm = C.comm_model(graph, rank, o.link, "zero", o.gpus_per_node, cache, o.nics_per_node)
        link = comm.cluster.intra
        lane = C.comm_lane(graph, rank, f"modelled ZeRO-{o.stage} collectives")
        # FSDP and DeepSpeed reduce-scatter on a stream of their own: on the gathers' stream
        # the next backward unit's gather would queue behind this unit's reduce-scatter.
        rs_lane = (
            C.comm_lane(graph, rank, "modelled ZeRO-3 reduce-scatters") if o.stage == 3 else lane
        )
        c = graph.cols
        f_units = C.chunks(fwd, o.units)
        b_units = C.chunks(bwd, o.units)
        k = len(b_units)
        per_unit = params / k
        rs_us = comm.time_us("reducescatter", per_unit * o.grad_bytes, o.gpus)
        ag_us = comm.time_us("allgather", per_unit * o.param_bytes, o.gpus)
        if o.stage == 3:
            for units in (f_units, b_units):
                _gathers(graph, lane, units, ag_us, per_unit * o.param_bytes, it, o.prefetch)
                total_ag += ag_us * len(units)
        # Gradients: reduce-scatter after each backward unit.
        last = np.array([u[-1] for u in b_units])
        order = c["launch_order"][last] + 0.25
        rs = C.insert_collective(
            graph,
            rs_lane,
            np.full(k, round(rs_us * 1000)),
            np.full(k, per_unit * o.grad_bytes),
            order,
            f"ncclKernel_ReduceScatter (modelled, {o.gpus} GPUs, {link.name})",
            np.full(k, it),
        )
        C.wait(graph, last, rs)
        total_rs += rs_us * k
        if opt.size:
            # The update waits for the last gradients: its first kernel after the backward's
            # last. Optimizer-phase kernels launched before that (zero_grad's memsets at the
            # step's start, or a 2021 trace's interleaved ones) precede the backward on the
            # stream: a wait there was a cycle, dropped with the reduce-scatters' waits.
            after = opt[c["launch_order"][opt] > c["launch_order"][bwd[-1]]]
            if after.size:
                C.wait(graph, rs[-1:], after[:1])
            K.scale_variable(graph, opt, 1.0 / o.gpus, fixed)
            if o.stage < 3:
                whole_us = comm.time_us("allgather", params * o.param_bytes, o.gpus)
                ag = C.insert_collective(
                    graph,
                    int(c["lane"][opt[-1]]),
                    np.array([round(whole_us * 1000)]),
                    np.array([params * o.param_bytes]),
                    np.array([c["order"][opt[-1]] + 1e-3]),
                    f"ncclKernel_AllGather (modelled, {o.gpus} GPUs, {link.name})",
                    np.array([it]),
                )
                C.wait(graph, opt[-1:], ag)
                total_ag += whole_us
    if n_steps == 0 or comm is None:
        raise NotApplicableError("zero: no backward GPU work in the trace's steps (inference?)")
    graph.assumptions.append(
        f"ZeRO-{o.stage} over {o.gpus} GPUs: {params / 1e6:.1f} M parameters in "
        f"{o.units} units; {P.per_step_of(len(ranks), n_steps)} "
        f"{total_rs / n_steps / 1e3:.2f} ms of reduce-scatter "
        f"({o.grad_bytes} B/element) and {total_ag / n_steps / 1e3:.2f} ms of all-gather "
        f"({o.param_bytes} B/element), ring, modelled over {comm.describe(o.gpus)}; "
        f"optimizer GPU kernels at 1/{o.gpus} of their work, {K.fixed_cost_text(fixed)}"
        + (
            "; parameters gathered before each unit's forward and backward, "
            f"{o.prefetch} unit(s) ahead"
            if o.stage == 3
            else ""
        )
    )
    if params_from:
        graph.assumptions.append(params_from)
    if replaced_ms:
        graph.assumptions.append(
            f"the trace's measured all-reduces ({replaced_ms / n_steps:.2f} ms per step) were "
            "replaced by the modelled collectives"
        )
    return graph


def _gathers(
    graph: Graph,
    lane: int,
    units: list[np.ndarray],
    ag_us: float,
    nbytes: float,
    it: int,
    prefetch: int,
) -> None:
    """All-gathers before each unit; unit i waits for its gather; gather i waits for the end
    of unit i - prefetch - 1 (memory for prefetch + 1 gathered units)."""
    c = graph.cols
    k = len(units)
    first = np.array([u[0] for u in units])
    order = c["launch_order"][first] - 0.5
    ag = C.insert_collective(
        graph,
        lane,
        np.full(k, round(ag_us * 1000)),
        np.full(k, nbytes),
        order,
        "ncclKernel_AllGather (modelled, FSDP unit)",
        np.full(k, it),
    )
    C.wait(graph, ag, first)
    for i in range(prefetch + 1, k):
        C.wait(graph, units[i - prefetch - 1][-1], ag[i])


def _param_count(graph: Graph, o: Options) -> tuple[float, str | None]:
    """Parameters (elements), and where they come from when not from the trace's shapes."""
    if o.params_mb is not None:
        return o.params_mb * MIB / 4, None
    from perfcast.analysis.comms import allreduced_per_step
    from perfcast.memory_model.facts import trace_facts

    facts = trace_facts(graph.table) if graph.table is not None else None
    if facts is not None and facts.params > 0:
        return float(facts.params), None
    # A data-parallel trace's own all-reduces move every gradient once a step.
    counted = allreduced_per_step(graph.table) if graph.table is not None else {}
    measured = {r: elements for r, (_, elements) in counted.items()}
    if not measured:
        if facts is not None and not facts.has_backward:
            raise NotApplicableError(
                "zero: the trace is an inference step (no backward pass): there are no "
                "gradients or optimizer state to shard",
                hint="plan a training step from a trace of one",
            )
        raise NotApplicableError(
            "zero: the trace has no parameter shapes (record_shapes=False) and no sized "
            "all-reduces to count its gradients by",
            hint="pass params_mb=<total parameter MiB>",
        )
    params = sum(measured.values()) / len(measured)
    return params, (
        f"no parameter shapes: {params / 1e6:.1f} M parameters, the gradient elements the "
        "trace's own all-reduces moved per step"
    )
