"""pipeline-parallel: the step split into `pp` pipeline stages with `microbatches` micro-
batches, 1F1B or interleaved, from a one-GPU (or data-parallel) trace.

What is modelled (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", section 2.2):

- stages: the forward GPU work cut into `pp` contiguous parts of balanced measured time; each
  GPU runs the slowest part (share s >= 1/pp) of forward and backward, for every micro-batch:
  kernel time t -> f m + (t - f) s (f: the trace's fixed cost per kernel, paid by each of the
  m micro-batches; the rest is the stage's share of the work, split over them). The host work
  of forward and backward repeats per micro-batch: host time x s m.
- the bubble: 1F1B leaves (pp - 1) micro-batch slots idle per step, (pp-1)/(m+pp-1) of it;
  the interleaved schedule with v virtual stages per GPU divides that by v. It is one modelled
  idle block of (pp-1)/v x (stage forward + backward per micro-batch) on the compute stream,
  at the start of the step;
- point-to-point: every micro-batch sends its boundary activations forward and their gradient
  back (v times each with interleaving): `act_mb` MiB per micro-batch (default: the
  activation that enters the middle layer, from the recorded shapes), send/recv over `link`
  in the cluster model `perfcast plan` uses (10 µs + alpha + N / (80% of the link peak), or
  the bus bandwidth the trace's own collectives reached), on the compute stream (blocking,
  as Megatron's p2p is); neighbouring stages are assumed inside one node.

The trace's other work keeps its measured times; the optimizer updates 1/pp of the
parameters and tensors: its GPU kernels and its host time are scaled by 1/pp. Assumes
m >= pp, stages of equal memory and lock-step ranks. The memory model reports the
activations of the micro-batches in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.errors import NotApplicableError, OptionValueError
from perfcast.graph.model import Graph
from perfcast.graph.phases import Phase
from perfcast.memory_model.model import PP_MICROBATCHES_PER_STAGE
from perfcast.whatif import kernels as K
from perfcast.whatif import primitives as P
from perfcast.whatif.models import _parallel_common as C

SUMMARY = (
    "pipeline parallel over pp stages: 1F1B or interleaved schedule, micro-batches, bubble "
    "and point-to-point sends (pp=N, microbatches=M, virtual=V, link=NAME, act_mb=)"
)
MIB = 1 << 20


@dataclass
class Options:
    pp: int = 2
    microbatches: int = 0  # 0: 4 x pp
    virtual: int = 1  # >1: interleaved 1F1B with this many model chunks per GPU
    link: str | None = None
    act_mb: float | None = None  # MiB sent per micro-batch between stages


def check_options(o: Options) -> None:
    """Values the model cannot take (the registry calls this when it builds the options)."""
    if o.pp < 2:
        raise OptionValueError("pipeline-parallel: pp must be at least 2")
    m = o.microbatches or PP_MICROBATCHES_PER_STAGE * o.pp
    if m < 1 or o.virtual < 1:
        raise OptionValueError("pipeline-parallel: microbatches and virtual must be >= 1")
    if m < o.pp:
        # 1F1B keeps every stage busy only with at least one micro-batch per stage; fewer
        # leaves stages idle beyond the bubble this model counts. The values alone say so:
        # refused before a trace is read.
        raise OptionValueError(
            f"pipeline-parallel: microbatches={m} is fewer than pp={o.pp} stages",
            hint=f"use microbatches >= {o.pp} (the default is 4 x pp)",
        )
    C.check_link("pipeline-parallel", o.link)


def apply(graph: Graph, options: Options) -> Graph:
    K.refuse_graph_replays(graph, "pipeline-parallel")
    o = options
    m = o.microbatches or PP_MICROBATCHES_PER_STAGE * o.pp
    C.require_gpu_steps(graph, "pipeline-parallel")
    fixed = K.kernel_fixed_cost_ns(graph)
    act_bytes = _act_bytes(graph, o, m)
    n_steps = 0
    ranks: set[int] = set()
    bubble_ns = p2p_ns = 0
    share = 1.0
    note = ""
    cache: dict[str | None, C.CommModel] = {}
    for rank, it in C.groups(graph):
        fwd = C.step_gpu_nodes(graph, rank, it, Phase.FORWARD)
        bwd = C.step_gpu_nodes(graph, rank, it, Phase.BACKWARD)
        if fwd.size == 0 or bwd.size == 0:
            continue
        if o.pp * o.virtual > fwd.size:
            raise NotApplicableError(
                f"pipeline-parallel: pp={o.pp} x virtual={o.virtual} stages, but a step's "
                f"forward runs only {fwd.size:,} GPU tasks: a stage needs at least one",
                hint=f"use pp x virtual <= {fwd.size:,} (a stage is normally several layers)",
            )
        n_steps += 1
        ranks.add(rank)
        comm = C.comm_model(graph, rank, o.link, "pipeline-parallel", cache=cache)
        note = comm.describe(2)
        c = graph.cols
        share = _stage_share(c["dur"][fwd].astype(np.float64), o.pp)
        # Each kernel: m fixed costs, and the stage's share of the variable work.
        for nodes in (fwd, bwd):
            t = c["dur"][nodes].astype(np.float64)
            f = np.minimum(t, float(fixed))
            new = np.rint(f * m + (t - f) * share).astype(np.int64)
            P.set_duration(graph, nodes, new)
        host = np.concatenate(
            [
                P.select(graph, kind="host", phase=ph, rank=rank, iteration=it)
                for ph in ("forward", "backward")
            ]
        )
        P.scale(graph, host, share * m)
        opt = C.step_gpu_nodes(graph, rank, it, Phase.OPTIMIZER)
        K.scale_variable(graph, opt, 1.0 / o.pp, fixed)
        # A stage holds 1/pp of the parameter tensors: a for-loop optimizer's per-tensor
        # launches (its host time) shrink with them, as `plan` counts them.
        opt_host = P.select(graph, kind="host", phase="optimizer", rank=rank, iteration=it)
        P.scale(graph, opt_host, 1 / o.pp)
        per_mb = (int(c["dur"][fwd].sum()) + int(c["dur"][bwd].sum())) / m
        bubble = round((o.pp - 1) / o.virtual * per_mb)
        p2p_us = comm.p2p_us(act_bytes) if act_bytes > 0 else 0.0
        p2p = round(2 * m * o.virtual * p2p_us * 1000)
        lane = int(c["lane"][fwd[0]])
        nodes = C.insert_collective(
            graph,
            lane,
            np.array([bubble, p2p]),
            np.array([0, 2 * m * o.virtual * act_bytes]),
            np.array([c["order"][fwd[0]] - 2e-3, c["order"][fwd[0]] - 1e-3]),
            f"pipeline bubble and p2p (modelled, pp={o.pp}, m={m}, v={o.virtual})",
            np.array([it, it]),
            Phase.FORWARD,
        )
        C.wait(graph, nodes[0], nodes[1])
        C.wait(graph, nodes[1], fwd[0])
        bubble_ns += bubble
        p2p_ns += p2p
    if n_steps == 0:
        raise NotApplicableError(
            "pipeline-parallel: no step has both forward and backward GPU work (inference?)"
        )
    frac = (o.pp - 1) / o.virtual / (m + (o.pp - 1) / o.virtual)
    if act_bytes > 0:
        p2p_text = (
            f"p2p {p2p_ns / n_steps / 1e6:.2f} ms ({_size(act_bytes)} per micro-batch, "
            f"over {note}; neighbouring stages assumed in one node)"
        )
    elif o.act_mb is not None:
        p2p_text = "p2p not counted (act_mb=0)"
    else:
        # Not a measured zero: the boundary's size is unknown without shapes.
        p2p_text = (
            "p2p not counted: the trace records no activation shapes to size the stage "
            "boundary (profile with record_shapes=True, or pass act_mb=)"
        )
    graph.assumptions.append(
        f"pipeline x{o.pp}, {m} micro-batches"
        f"{f', interleaved x{o.virtual}' if o.virtual > 1 else ' (1F1B)'}: slowest stage "
        f"{share:.0%} of the forward work; bubble {bubble_ns / n_steps / 1e6:.2f} ms "
        f"{P.per_step_of(len(ranks), n_steps)} "
        f"({frac:.0%}: (pp-1)/v of m + (pp-1)/v slots); {p2p_text}; host work repeated per "
        "micro-batch; the optimizer's GPU and host work 1/pp (a stage's tensors); kernels "
        "pay their fixed cost once per micro-batch: " + K.fixed_cost_text(fixed)
    )
    return graph


def _stage_share(times: np.ndarray, parts: int) -> float:
    total = float(times.sum())
    return C.balanced_max(times, parts) / total if total > 0 else 1.0 / parts


def _act_bytes(graph: Graph, o: Options, m: int) -> float:
    if o.act_mb is not None:
        if o.act_mb < 0:
            raise OptionValueError("pipeline-parallel: act_mb must be >= 0")
        return o.act_mb * MIB
    if graph.table is None:
        return 0.0
    from perfcast.memory_model.facts import trace_facts

    saved = trace_facts(graph.table).saved
    if not saved:
        return 0.0
    return saved[len(saved) // 2].nbytes / m


def _size(nbytes: float) -> str:
    """Bytes in the unit that keeps them readable (a 4 KiB send is not '0.00 MiB')."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} B"
