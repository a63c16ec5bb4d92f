"""Helpers the what-if models share: a kernel's fixed cost, scaling with a fixed
part, device lookup, the dtype a compute kernel runs in, and op shapes.

The fixed cost: every kernel keeps a part that does not scale with its work
(launch, block scheduling, ramp-up and tail), taken as the 5th percentile of
the kernel durations in the trace, since the smallest kernels are almost all
fixed cost (measured).
"""

from __future__ import annotations

import re

import numpy as np

from perfcast.analysis.notes import no_gpu_work
from perfcast.errors import NotApplicableError, OptionValueError
from perfcast.graph.model import GpuKind, Graph, NodeKind, Source
from perfcast.graph.phases import Phase
from perfcast.hardware import (
    DeviceSpec,
    KernelClass,
    dtype_from_kernel_name,
    is_compute_bound_class,
    lookup_device,
    nearest_device,
)
from perfcast.hardware.devices import known_devices_text
from perfcast.ingest.input_dims import row_input_dims
from perfcast.whatif import primitives as P

# The smallest kernels of a trace are almost all fixed cost (see module docstring).
FIXED_PERCENTILE = 5.0

# Kernels that GEMM / convolution libraries launch around the main kernel and that the name
# classifier files under MATMUL or CONV: split-K reductions, cuDNN's weight-gradient
# reduction helper and offset-table kernels. They do no tensor-core math.
_LIBRARY_HELPER = re.compile(r"splitkreduce|reducesplitk|reduce_wgrad|computeoffsets")
# FP32 math on the FMA units rather than TF32 tensor cores (sgemm / scudnn / CUTLASS simt).
_FP32_FMA = re.compile(r"sgemm|scudnn|simt|ffma")
# Kernels that the amp model converted carry their new dtype in front of their name.
AUTOCAST_PREFIX = re.compile(r"^autocast\[(bf16|fp16)\] ")


def fixed_cost_text(fixed_ns: int) -> str:
    """The fixed per-kernel cost as a model's assumptions state it."""
    return (
        f"{fixed_ns / 1000:.1f} µs fixed cost per kernel (the {FIXED_PERCENTILE:g}th percentile "
        "of the trace's kernel durations), not scaled"
    )


def fixed_cost_ns(durations: np.ndarray) -> int:
    """The fixed per-kernel (or per-op) cost: 5th percentile of the durations, 0 if none."""
    d = np.asarray(durations)
    d = d[d > 0]
    if d.size == 0:
        return 0
    return int(np.percentile(d, FIXED_PERCENTILE))


def kernel_fixed_cost_ns(graph: Graph) -> int:
    """`fixed_cost_ns` over the live kernels of the graph (their current durations)."""
    c = graph.cols
    k = (c["kind"] == NodeKind.GPU) & (c["gpu_kind"] == GpuKind.KERNEL) & graph.alive
    return fixed_cost_ns(c["dur"][k])


def scale_variable(
    graph: Graph,
    nodes: np.ndarray,
    ratio: float | np.ndarray,
    fixed: int,
    source: Source = Source.SCALED,
) -> None:
    """t_new = f + (t - f) * ratio with f = min(t, fixed), for each node."""
    nodes = np.asarray(nodes, dtype=np.int64)
    if nodes.size == 0:
        return
    t = graph.cols["dur"][nodes].astype(np.float64)
    f = np.minimum(t, float(fixed))
    new = np.rint(f + (t - f) * np.asarray(ratio, dtype=np.float64)).astype(np.int64)
    P.set_duration(graph, nodes, new, source)


def gpu_nodes(graph: Graph) -> np.ndarray:
    c = graph.cols
    return np.flatnonzero((c["kind"] == NodeKind.GPU) & graph.alive)


def require_gpu(graph: Graph, model: str) -> np.ndarray:
    gpu = gpu_nodes(graph)
    if gpu.size == 0:
        raise NotApplicableError(f"{model}: {no_gpu_work(graph.table)}")
    return gpu


def resolve_device(name: str, model: str, what: str, graph: Graph | None = None) -> DeviceSpec:
    """The spec of a named device; a variant of a known part stands in for it (the graph's
    assumptions say so), anything else is refused."""
    spec = lookup_device(name)
    if spec is not None:
        return spec
    near = nearest_device(name)
    if near is None:
        raise OptionValueError(
            f"{model}: unknown device '{name}' ({what})",
            hint=known_devices_text(),
        )
    if graph is not None:
        graph.assumptions.append(f"{model}: {near[1]}; taken as {near[0].name}")
    return near[0]


def check_device_name(name: str, label: str) -> None:
    """Refuse, before any work, a GPU name that `resolve_device` would refuse: an argument
    error (OptionError) naming the argument, e.g. label "--device" or "device="."""
    from perfcast.errors import OptionError

    if isinstance(name, str) and any(c in name for c in ",=:"):
        # One GPU's name: advise pastes it into device:target=NAME, where "h100,h200" read
        # as h100 with an option "h200"
        raise OptionError(
            f"{label}{name!r}: name one GPU (e.g. h100); for the device what-if's other "
            "options use whatif --apply device:target=...,host=...",
            hint=known_devices_text(),
        )
    if isinstance(name, str) and name.strip():
        try:
            resolve_device(name, "", "")
            return
        except NotApplicableError:
            pass
    raise OptionError(f"{label}{name!r}: unknown GPU", hint=known_devices_text())


def rank_devices(
    graph: Graph, ranks: np.ndarray, override: str | None, model: str
) -> dict[int, DeviceSpec]:
    """rank -> DeviceSpec of the trace's GPU (the override wins); refuse unknown devices."""
    # The option that names the trace's GPU: device's own `device=` names its target.
    option = "source" if model == "device" else "device"
    if override:
        forced = resolve_device(override, model, f"{option} option", graph)
        return {int(r): forced for r in np.unique(ranks).tolist()}
    out: dict[int, DeviceSpec] = {}
    for r in np.unique(ranks).tolist():
        name = graph.device_names.get(int(r))
        spec = lookup_device(name) if name else None
        if spec is None and name:
            near = nearest_device(name)
            if near is not None:
                spec = near[0]
                note = f"{model}: {near[1]}; taken as {spec.name}"
                if note not in graph.assumptions:
                    graph.assumptions.append(note)
        if spec is None:
            shown = f"'{name}'" if name else "not recorded"
            raise NotApplicableError(
                f"{model}: the trace's device ({shown}, rank {r}) is unknown",
                hint=f"name it with {option}=NAME, e.g. a100-80gb",
            )
        out[int(r)] = spec
    return out


def is_library_helper(name: str) -> bool:
    return bool(_LIBRARY_HELPER.search(name.lower()))


def is_compute_kernel(graph: Graph, node: int) -> bool:
    """A matmul / conv / attention kernel doing the math (not a library helper)."""
    k = int(graph.cols["klass"][node])
    if k < 0 or not is_compute_bound_class(k):
        return False
    return not is_library_helper(graph.name_of(node))


def kernel_dtype(name: str, klass: int, conv_tf32: bool = True) -> str:
    """The dtype a compute kernel's math runs in (see module docstring for the defaults);
    `conv_tf32`: the device runs fp32 convolutions in TF32 (see `convs_in_tf32`)."""
    m = AUTOCAST_PREFIX.match(name)
    if m:
        return m.group(1)
    d = dtype_from_kernel_name(name)
    if d in ("fp8", "bf16", "fp16", "tf32", "fp64"):
        return d
    if conv_tf32 and klass == KernelClass.CONV and not _FP32_FMA.search(name.lower()):
        return "tf32"  # torch.backends.cudnn.allow_tf32 defaults to True
    return "fp32"  # torch.backends.cuda.matmul.allow_tf32 defaults to False since 1.12


def node_dtype(graph: Graph, node: int, conv_tf32: bool = True) -> str:
    """The dtype a GPU task computes in: its kernel's name (`kernel_dtype`), unless the name
    looks fp32 and the launching op's own inputs are 16-bit (record_shapes writes their
    "Input type"): a Triton or ROCm kernel often names no dtype at all."""
    from perfcast.ingest.input_dims import row_input_dtype

    c = graph.cols
    named = kernel_dtype(graph.name_of(node), int(c["klass"][node]), conv_tf32)
    if named not in ("fp32", "tf32"):
        return named
    table = graph.table
    op = int(c["op"][node])
    traced = row_input_dtype(table, op) if table is not None and 0 <= op < len(table) else None
    return traced if traced in ("bf16", "fp16", "fp8") else named


def op_input_dims(graph: Graph, node: int) -> list | None:
    """The parsed "Input Dims" of the op a node is attributed to (do not modify), or None."""
    table = graph.table
    op = int(graph.cols["op"][node])
    if table is None or op < 0 or op >= len(table):
        return None
    return row_input_dims(table, op)


def refuse_graph_replays(graph: Graph, model: str) -> None:
    """Refuse a trace whose steps replay most of their GPU work from CUDA graphs: it is
    captured already, and a replay's kernels carry no phase (forward, backward, optimizer)
    of their own (`Phase.GRAPH`), so what a model would change cannot be told apart."""
    c = graph.cols
    gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & graph.alive & (c["iteration"] >= 0))
    if gpu.size == 0:
        return
    replayed = int(np.count_nonzero(c["phase"][gpu] == Phase.GRAPH))
    if 2 * replayed >= gpu.size:
        raise NotApplicableError(
            f"{model}: the steps already replay {replayed:,} of their {gpu.size:,} GPU tasks "
            "from CUDA graphs (cudaGraphLaunch): the work is captured, and the trace cannot "
            "tell its forward, backward and optimizer kernels apart",
            hint="profile the eager step, without the graph capture, to ask this",
        )
