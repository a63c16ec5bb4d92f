"""tensor-parallel: Megatron-style tensor parallelism of the linear layers the trace shows.

What is modelled (Shoeybi et al., "Megatron-LM", 2019):

- the linear layers are the ops `aten::linear` / `addmm` / `matmul` (forward) and their
  backward nodes (`AddmmBackward0`, `MmBackward0`, ...); in launch order they form units of
  column-parallel layers followed by one row-parallel layer, so each does 1/tp of its GEMM
  work (kernel time t -> f + (t - f)/tp, f the trace's fixed cost per kernel). Layers that
  read an input of the same shape with no GEMM, attention or softmax kernel between them
  are one column group (separate Q, K and V projections; a gated MLP's gate and up
  projections); the next layer is the row layer. Without shapes, consecutive layers pair up;
- after each unit's forward its output is all-reduced, and in backward the input gradient of
  its column group (the unit's input), on the compute stream: Megatron does not overlap
  them. Backward units mirror the forward ones when the layer counts match. With
  `sequence_parallel`, an all-gather and a reduce-scatter of the same volume take their place
  and the elementwise work between units (norms, dropout, residual adds) is split too;
- size: the row-parallel layer's output (its input's leading dimensions x its output
  features, from the recorded shapes; in backward the column group's input), at the layer's
  dtype (bf16/fp16 kernels 2 bytes, else
  4); time: ring all-reduce in the cluster model `perfcast plan` uses (10 µs + 2(t-1) alpha +
  2(t-1)/t N / busbw, busbw 80% of the peak of `link`, NVIDIA's nccl-tests figures, or what
  the trace's own large collectives reached), `link` by default the device's intra-node link;
  a group of more than `gpus_per_node` GPUs crosses nodes, bound by their NICs.

Everything else (convolutions, elementwise work outside units, the optimizer on the linear
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
    "tensor parallel over tp GPUs: linear layers split by columns, then rows, with their "
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
    n_pairs = 0  # forward units (each also all-reduced in backward, where there is one)
    n_collectives = 0
    backward = False
    comm_ns = 0
    split_ns = 0
    n_steps = 0
    ranks: set[int] = set()
    note = ""
    n_grouped = 0  # forward units whose column group holds more than one layer
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
        # This step's forward units (indices into its linear layers, column group then row
        # layer) and each unit's input size, which backward all-reduces.
        forward_layers, forward_units = 0, []
        group_inputs: list[float] = []
        for phase, pattern in ((Phase.FORWARD, _LINEAR_FWD), (Phase.BACKWARD, _LINEAR_BWD)):
            layers = _linear_layers(graph, rank, it, phase, pattern)
            if not layers:
                continue
            if phase == Phase.FORWARD:
                n_steps += 1
                ranks.add(rank)
            else:
                backward = True
            before = sum(int(graph.cols["dur"][n].sum()) for n, _ in layers)
            for nodes, _ in layers:
                K.scale_variable(graph, nodes, 1.0 / t, fixed)
            split_ns += before - sum(int(graph.cols["dur"][n].sum()) for n, _ in layers)
            if phase == Phase.FORWARD:
                units = _forward_units(graph, rank, it, layers)
                forward_layers, forward_units = len(layers), units
                sizes = _unit_sizes(graph, layers, units)
                # Without the input's shape, the row layer's output (a block keeps its width).
                fallback = float(np.median([b for _, b in sizes])) if sizes else 0.0
                group_inputs = [
                    _in_bytes(graph, layers[u[0]][0])
                    or _out_bytes(graph, layers[u[-1]][0])
                    or fallback
                    for u in units
                    if len(u) > 1
                ]
                n_grouped += sum(len(u) > 2 for u in units)
            elif len(layers) == forward_layers and forward_units:
                # Backward runs the forward units in reverse, row layer first; each one's
                # all-reduce is its column group's input gradient, once the group is done.
                units, start = [], 0
                for u in reversed(forward_units):
                    units.append(list(range(start, start + len(u))))
                    start += len(u)
                whole = [u for u in units if len(u) > 1]
                sizes = [
                    (int(layers[u[-1]][0][-1]), nbytes)
                    for u, nbytes in zip(whole, reversed(group_inputs), strict=True)
                    if nbytes > 0
                ]
            else:
                units = [[i, i + 1] for i in range(0, len(layers) - 1, 2)]
                sizes = _unit_sizes(graph, layers, units)
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
            "tensor-parallel: no column and row linear layers (aten::linear / addmm / matmul with "
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
        f"tensor parallel x{t}: {n_pairs / steps:g} units of linear layers "
        f"{P.per_step_of(len(ranks), n_steps)} (column "
        f"layers, then a row layer; {n_grouped / steps:g} with several column layers) split "
        f"1/{t} ({split_ns / steps / 1e6:.2f} ms of GEMM time saved), "
        f"{'all-gather + reduce-scatter' if options.sequence_parallel else 'all-reduce'} of "
        f"each unit's activations {where} on the compute stream, "
        f"{n_collectives / steps:g} collectives ({comm_ns / steps / 1e6:.2f} ms per step, over "
        f"{note}); layers on an input of one shape with no GEMM, attention or softmax kernel "
        "between them split by columns together (Megatron: attention's Q, K, V and a gated "
        "MLP's gate and up projections), the next one by rows; everything else replicated; "
        + K.fixed_cost_text(fixed)
    )
    return graph


def units_per_step(graph: Graph, rank: int) -> float | None:
    """How many forward units (column layers and their row layer: one all-reduce each way)
    a step of `rank` holds, as `apply` forms them; None without linear layers."""
    counts = []
    for r, it in C.groups(graph):
        if r != rank:
            continue
        layers = _linear_layers(graph, rank, it, Phase.FORWARD, _LINEAR_FWD)
        if layers:
            counts.append(sum(len(u) > 1 for u in _forward_units(graph, rank, it, layers)))
    return float(np.mean(counts)) if counts else None


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


# Kernels that mix what the layers before them computed (attention's score and value GEMMs,
# softmax): a layer after one reads the mix, not the column group's shared input.
_MIXING = np.array([int(KernelClass.MATMUL), int(KernelClass.ATTENTION), int(KernelClass.SOFTMAX)])


def _forward_units(
    graph: Graph, rank: int, it: int, layers: list[tuple[np.ndarray, int]]
) -> list[list[int]]:
    """The forward linear layers (indices, launch order) as units: a column group (layers
    on an input of one shape, no mixing kernel between them) and the row layer after it. The
    last unit may lack its row layer (a final projection): it is all-reduced nowhere."""
    step = C.step_gpu_nodes(graph, rank, it, Phase.FORWARD)
    position = {int(n): i for i, n in enumerate(step.tolist())}
    in_layer = np.zeros(step.size, dtype=bool)
    for nodes, _ in layers:
        in_layer[[position[int(n)] for n in nodes.tolist()]] = True
    mixing = np.isin(graph.cols["klass"][step], _MIXING) & ~in_layer
    mixed_before = np.cumsum(mixing)  # mixing kernels launched up to each position
    other_before = np.cumsum(~in_layer)  # any other kernel

    def launched_between(a: int, b: int, counts: np.ndarray) -> bool:
        first, last = position[int(layers[b][0][0])], position[int(layers[a][0][-1])]
        return bool(counts[first] > counts[last])

    def joins(i: int, group: list[int], shape: tuple[int, ...] | None) -> bool:
        """Whether layer i reads the column group's input rather than what came before it:
        an input of the group's shape, no mixing kernel since the group's last layer, and
        either nothing launched between them (Q, K, V) or an input that cannot be the last
        layer's output (a gated MLP's up projection, after the gate's activation)."""
        here = _in_shape(graph, int(layers[i][0][0]))
        last = group[-1]
        if here is None or here != shape or launched_between(last, i, mixed_before):
            return False
        if not launched_between(last, i, other_before):
            return True
        return _out_shape(graph, int(layers[last][0][0])) not in (None, here)

    units: list[list[int]] = []
    group: list[int] = []
    shape = None
    for i, (nodes, _) in enumerate(layers):
        if not group:
            group, shape = [i], _in_shape(graph, int(nodes[0]))
        elif joins(i, group, shape):
            group.append(i)
        else:
            units.append([*group, i])
            group = []
    if group:
        units.append(group)
    return units


def _unit_sizes(
    graph: Graph, layers: list[tuple[np.ndarray, int]], units: list[list[int]]
) -> list[tuple[int, float]]:
    """(last node of the unit's row layer, bytes all-reduced) for every unit that has one."""
    whole = [u for u in units if len(u) > 1]
    sizes = [_out_bytes(graph, layers[u[-1]][0]) for u in whole]
    known = [s for s in sizes if s > 0]
    fallback = float(np.median(known)) if known else 0.0
    out = []
    for u, nbytes in zip(whole, sizes, strict=True):
        nbytes = nbytes or fallback
        if nbytes > 0:
            out.append((int(layers[u[-1]][0][-1]), nbytes))
    return out


def _op_name(graph: Graph, node: int) -> str:
    op = int(graph.cols["op_name"][node])
    return graph.names[op] if op >= 0 else ""


def _in_shape(graph: Graph, node: int) -> tuple[int, ...] | None:
    """The shape of a forward linear layer's input (x), from the recorded shapes."""
    dims = K.op_input_dims(graph, node)
    if not dims:
        return None
    x = dims[1] if _op_name(graph, node).endswith("addmm") and len(dims) > 2 else dims[0]
    return tuple(x) if _is_shape(x) else None


def _out_shape(graph: Graph, node: int) -> tuple[int, ...] | None:
    """The shape of a forward linear layer's output, from the recorded shapes."""
    dims = K.op_input_dims(graph, node)
    x = _in_shape(graph, node)
    if not dims or x is None:
        return None
    name = _op_name(graph, node)
    if name.endswith("addmm") and len(dims) > 2:
        w = dims[2]  # bias, x, W^T
        return (*x[:-1], w[-1]) if _is_shape(w) else None
    w = dims[1] if len(dims) > 1 else None
    if not isinstance(w, list) or not _is_shape(w) or len(w) != 2:
        return None
    # linear's weight is [out, in]; mm and matmul take it transposed, [in, out]
    return (*x[:-1], w[0] if name.endswith("linear") else w[1])


def _nbytes(graph: Graph, node: int, shape: tuple[int, ...] | None) -> float:
    """Bytes of a tensor of `shape` at the layer's dtype (bf16/fp16 kernels 2, else 4)."""
    if shape is None:
        return 0.0
    dt = dtype_from_kernel_name(graph.name_of(node))
    return float(math.prod(shape) * (2 if dt in ("bf16", "fp16") else 4))


def _in_bytes(graph: Graph, nodes: np.ndarray) -> float:
    """Bytes of a forward layer's input: its input gradient's size in backward."""
    node = int(nodes[0])
    return _nbytes(graph, node, _in_shape(graph, node))


def _out_bytes(graph: Graph, nodes: np.ndarray) -> float:
    """Bytes of the layer's output (forward) or of the gradient it receives (backward)."""
    node = int(nodes[0])
    shape = _out_shape(graph, node)
    if shape is None:  # a backward node: the incoming gradient
        dims = K.op_input_dims(graph, node)
        shape = tuple(dims[0]) if dims and _is_shape(dims[0]) else None
    return _nbytes(graph, node, shape)


def _is_shape(d: object) -> bool:
    return isinstance(d, list) and bool(d) and all(isinstance(x, int) for x in d)
