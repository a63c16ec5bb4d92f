"""tensor-parallel: Megatron-style tensor parallelism of the linear layers the trace shows.

What is modelled (Shoeybi et al., "Megatron-LM", 2019):

- the linear layers are the ops `aten::linear` / `addmm` / `matmul` (forward) and their
  backward nodes (`AddmmBackward0`, `MmBackward0`, ...); they pair up in launch order: the
  first of a pair split by columns, the second by rows, so each does 1/tp of its GEMM work
  (kernel time t -> f + (t - f)/tp, f the trace's fixed cost per kernel);
- after each pair's forward its output is all-reduced, and in backward the input gradient of
  each pair (the same size), on the compute stream: Megatron does not overlap them. With
  `sequence_parallel`, an all-gather and a reduce-scatter of the same volume take their place
  and the elementwise work between pairs (norms, dropout, residual adds) is split too;
- size: the row-parallel layer's output (its input's leading dimensions x its output
  features, from the recorded shapes; in backward each pair's forward size, the shape of its
  input gradient), at the layer's dtype (bf16/fp16 kernels 2 bytes, else
  4); time: ring all-reduce in the cluster model `perfcast plan` uses (10 µs + 2(t-1) alpha +
  2(t-1)/t N / busbw, busbw 80% of the peak of `link`, NVIDIA's nccl-tests figures, or what
  the trace's own large collectives reached), `link` by default the device's intra-node link;
  a group of more than `gpus_per_node` GPUs crosses nodes, bound by their NICs.

Everything else (convolutions, elementwise work outside pairs, the optimizer on the linear
layers' shards aside) runs replicated: a convolutional network gains little. Assumes the
output features divide by tp and the ranks of a group run in lock step.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from perfcast.errors import NotApplicableError, OptionValueError
from perfcast.graph.model import Graph
from perfcast.graph.phases import Phase
from perfcast.hardware.classify import KernelClass, dtype_from_kernel_name
from perfcast.whatif import kernels as K
from perfcast.whatif import primitives as P
from perfcast.whatif.models import _parallel_common as C

SUMMARY = (
    "tensor parallel over tp GPUs: linear layers split in column/row pairs with their "
    "all-reduces (tp=N, link=NAME, gpus_per_node=8, nics_per_node=, sequence_parallel=false)"
)
_LINEAR_FWD = r"^aten::(linear|addmm|matmul|mm)$"
_LINEAR_BWD = r"^(Addmm|Mm|Linear|Matmul)Backward\d*$"


@dataclass
class Options:
    tp: int = 2
    link: str | None = None
    sequence_parallel: bool = False
    gpus_per_node: int = 8  # a group larger than a node crosses the network
    nics_per_node: int | None = None  # inter-node NICs per node (default: one per GPU)


def check_options(options: Options) -> None:
    """Values the model cannot take (the registry calls this when it builds the options)."""
    if options.tp < 2:
        raise OptionValueError("tensor-parallel: tp must be at least 2")
    C.check_node_options("tensor-parallel", options.gpus_per_node, options.nics_per_node)
    C.check_link("tensor-parallel", options.link)


def apply(graph: Graph, options: Options) -> Graph:
    K.refuse_graph_replays(graph, "tensor-parallel")
    t = options.tp
    C.require_gpu_steps(graph, "tensor-parallel")
    fixed = K.kernel_fixed_cost_ns(graph)
    n_pairs = 0  # forward pairs (each also all-reduced in backward, where there is one)
    n_collectives = 0
    backward = False
    comm_ns = 0
    split_ns = 0
    n_steps = 0
    note = ""
    cache: dict[str | None, C.CommModel] = {}
    for rank, it in C.groups(graph):
        comm = C.comm_model(
            graph,
            rank,
            options.link,
            "tensor-parallel",
            options.gpus_per_node,
            cache,
            options.nics_per_node,
        )
        link = comm.cluster.intra
        note = comm.describe(t)
        forward_bytes: list[float] = []  # this step's forward all-reduce sizes, in order
        for phase, pattern in ((Phase.FORWARD, _LINEAR_FWD), (Phase.BACKWARD, _LINEAR_BWD)):
            layers = _linear_layers(graph, rank, it, phase, pattern)
            if not layers:
                continue
            if phase == Phase.FORWARD:
                n_steps += 1
            else:
                backward = True
            before = sum(int(graph.cols["dur"][n].sum()) for n, _ in layers)
            for nodes, _ in layers:
                K.scale_variable(graph, nodes, 1.0 / t, fixed)
            split_ns += before - sum(int(graph.cols["dur"][n].sum()) for n, _ in layers)
            sizes = _pair_sizes(graph, layers, phase)
            if phase == Phase.FORWARD:
                forward_bytes = [nbytes for _, nbytes in sizes]
            elif len(forward_bytes) == len(sizes):
                # A pair's backward all-reduce is its input gradient: the shape of its input,
                # the previous pair's output, not the gradient its row layer receives.
                sizes = [
                    (last, nbytes)
                    for (last, _), nbytes in zip(sizes, reversed(forward_bytes), strict=True)
                ]
            for last, nbytes in sizes:
                if options.sequence_parallel:
                    us = comm.time_us("allgather", nbytes, t) + comm.time_us(
                        "reducescatter", nbytes, t
                    )
                else:
                    us = comm.time_us("allreduce", nbytes, t)
                c = graph.cols
                new = C.insert_collective(
                    graph,
                    int(c["lane"][last]),
                    np.array([round(us * 1000)]),
                    np.array([nbytes]),
                    np.array([c["order"][last] + 1e-3]),
                    f"ncclKernel_AllReduce (modelled TP, {t} GPUs, {link.name})",
                    np.array([it]),
                    phase,
                )
                C.wait(graph, last, new)
                comm_ns += round(us * 1000)
                n_collectives += 1
                n_pairs += phase == Phase.FORWARD
    if n_collectives == 0:
        raise NotApplicableError(
            "tensor-parallel: no pairs of linear layers (aten::linear / addmm / matmul with "
            "recorded shapes) in the trace's steps: nothing to split"
        )
    if options.sequence_parallel:
        ew = P.select(graph, kind="gpu", phase="forward")
        ew = ew[
            np.isin(graph.cols["klass"][ew], [int(KernelClass.ELEMENTWISE), int(KernelClass.NORM)])
        ]
        K.scale_variable(graph, ew, 1.0 / t, fixed)
    steps = max(n_steps, 1)
    where = "forward and backward" if backward else "forward (the trace has no backward)"
    graph.assumptions.append(
        f"tensor parallel x{t}: {n_pairs / steps:g} linear-layer pairs per step split 1/{t} "
        f"({split_ns / steps / 1e6:.2f} ms of GEMM time saved), "
        f"{'all-gather + reduce-scatter' if options.sequence_parallel else 'all-reduce'} of "
        f"each pair's activations {where} on the compute stream, "
        f"{n_collectives / steps:g} collectives ({comm_ns / steps / 1e6:.2f} ms per step, over "
        f"{note}); consecutive linear layers paired in launch order (Megatron pairs attention's "
        "QKV with its output projection and the MLP's two layers); everything else replicated; "
        + K.fixed_cost_text(fixed)
    )
    return graph


def _linear_layers(
    graph: Graph, rank: int, it: int, phase: Phase, pattern: str
) -> list[tuple[np.ndarray, int]]:
    """GPU nodes of each linear-layer call, in launch order: grouped by the forward op, or in
    backward by the autograd node (`AddmmBackward0`, ...) that the GEMM ops run inside."""
    nodes = C.step_gpu_nodes(graph, rank, it, phase)
    if nodes.size == 0:
        return []
    c = graph.cols
    table = graph.table
    fwd = re.compile(_LINEAR_FWD)
    bwd = re.compile(pattern)
    names = graph.names
    keys = np.full(nodes.size, -1, dtype=np.int64)
    for i, (op, op_name) in enumerate(zip(c["op"][nodes].tolist(), c["op_name"][nodes].tolist())):
        if op_name < 0 or op < 0:
            continue
        name = names[op_name]
        if phase == Phase.FORWARD:
            if fwd.search(name):
                keys[i] = op
            continue
        # Backward: the op itself or one of its enclosing events is the autograd node.
        row = op
        for _ in range(4):
            if row < 0 or table is None:
                break
            if bwd.search(table.names[int(table.name[row])]):
                keys[i] = row
                break
            row = int(table.parent[row])
    out = []
    for key in dict.fromkeys(keys[keys >= 0].tolist()):
        out.append((nodes[keys == key], int(key)))
    return out


def _pair_sizes(
    graph: Graph, layers: list[tuple[np.ndarray, int]], phase: Phase
) -> list[tuple[int, float]]:
    """(last node of the pair, bytes all-reduced) for every pair of linear layers."""
    out = []
    sizes = [_out_bytes(graph, nodes) for nodes, _ in layers]
    known = [s for s in sizes if s > 0]
    fallback = float(np.median(known)) if known else 0.0
    for i in range(0, len(layers) - 1, 2):
        nodes = layers[i + 1][0]
        nbytes = sizes[i + 1] or fallback
        if nbytes > 0:
            out.append((int(nodes[-1]), nbytes))
    return out


def _out_bytes(graph: Graph, nodes: np.ndarray) -> float:
    """Bytes of the layer's output (forward) or of the gradient it receives (backward)."""
    node = int(nodes[0])
    dims = K.op_input_dims(graph, node)
    if not dims or not isinstance(dims[0], list):
        return 0.0
    op = int(graph.cols["op_name"][node])
    name = graph.names[op] if op >= 0 else ""
    numel = 0
    if name.endswith("addmm") and len(dims) > 2 and _is_shape(dims[1]) and _is_shape(dims[2]):
        numel = math.prod(dims[1][:-1]) * dims[2][-1]  # bias, x, W^T
    elif len(dims) > 1 and _is_shape(dims[0]) and _is_shape(dims[1]) and len(dims[1]) == 2:
        # linear's weight is [out, in]; mm and matmul take it transposed, [in, out]
        out = dims[1][0] if name.endswith("linear") else dims[1][1]
        numel = math.prod(dims[0][:-1]) * out
    elif _is_shape(dims[0]):
        numel = math.prod(dims[0])  # a backward node: the incoming gradient
    dt = dtype_from_kernel_name(graph.name_of(node))
    return float(numel * (2 if dt in ("bf16", "fp16") else 4))


def _is_shape(d: object) -> bool:
    return isinstance(d, list) and bool(d) and all(isinstance(x, int) for x in d)
