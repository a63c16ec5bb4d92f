"""device: the same workload on another GPU, scaled kernel by kernel.

Per-kernel scaling by kernel class follows Habitat (Yu et al., "Habitat: A
Runtime-Based Computational Performance Predictor for Deep Neural Network
Training", USENIX ATC '21), which predicts each kernel on a new GPU from its
measured time on the old one, with the ratio of whichever hardware limit
bounds that kind of kernel. Here, from `perfcast.hardware` datasheet figures:

- compute-bound classes (matmul, convolution, attention): by the ratio of the
  two devices' peak FLOPS at the kernel's dtype (read from its name). A
  matmul whose name states no dtype is taken as FP32 (PyTorch's
  `torch.backends.cuda.matmul.allow_tf32` defaults to False since 1.12); a
  convolution as TF32 (`torch.backends.cudnn.allow_tf32` defaults to True),
  unless its name marks FP32 FMA math (sgemm, scudnn, simt); `DeviceSpec.peak`
  gives plain FP32 on GPUs without TF32 units. Helper kernels that GEMM and
  convolution libraries launch (split-K reductions, weight-gradient
  reductions, offset tables) are memory-bound and scale as such;
- memory-bound classes (elementwise, reductions, norms, softmax, copies,
  embeddings, optimizer, memsets, unclassified kernels): by the ratio of DRAM
  bandwidths;
- communication kernels: unchanged, unless both devices' typical intra-node
  links are NVLink (`hardware.interconnects.default_intra_node_link`); then by
  the ratio of NVLink bandwidths, which assumes the collectives run within one
  node (a multi-node job's network would not change). Time a collective spends
  waiting for slower peers scales with it;
- memcpy: device-to-device copies by the bandwidth ratio; host<->device and
  peer copies unchanged (same PCIe host link and topology assumed);
- CPU work, launch latencies and gaps: unchanged (the same host is assumed).

The graph's device names become the target's, so models applied afterwards
(amp, batch-size) use the new GPU's figures.

Every kernel keeps a fixed part that does not scale (launch, block scheduling,
ramp-up and tail): t_new = f + (t - f) * ratio with f = min(t, fixed), fixed =
the 5th percentile of kernel durations in the trace (the smallest kernels are
almost all fixed cost), measured. Durations changed here are Source.SCALED.
Wave quantization across different SM counts and clock differences within a
class are not modelled.

This module also holds the helpers the other scaling models share (amp,
batch_size, fuse_elementwise): the fixed kernel cost, device lookup, the
effective dtype of a compute kernel and the shapes of the op that launched it.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

import numpy as np

from perfcast.errors import NotApplicableError, PerfcastError
from perfcast.graph.model import GpuKind, Graph, NodeKind, Source
from perfcast.hardware import (
    DeviceSpec,
    KernelClass,
    default_intra_node_link,
    dtype_from_kernel_name,
    is_compute_bound_class,
    lookup_device,
)
from perfcast.whatif import primitives as P

SUMMARY = "the same work on another GPU, per-kernel roofline scaling (target=h100, source=...)"

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


@dataclass
class Options:
    target: str = ""  # required: the GPU to move to ("h100", "A100-SXM4-80GB", ...)
    source: str | None = None  # the trace's device, when its deviceProperties lack or misname it


# ---------------------------------------------------------------- shared helpers


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
        raise NotApplicableError(f"{model}: the trace has no GPU work (CPU-only trace)")
    return gpu


def resolve_device(name: str, model: str, what: str) -> DeviceSpec:
    spec = lookup_device(name)
    if spec is None:
        raise NotApplicableError(
            f"{model}: unknown device '{name}' ({what})",
            hint="perfcast.hardware.list_devices() lists the known devices",
        )
    return spec


def rank_devices(
    graph: Graph, ranks: np.ndarray, override: str | None, model: str
) -> dict[int, DeviceSpec]:
    """rank -> DeviceSpec of the trace's GPU (the override wins); refuse unknown devices."""
    if override:
        forced = resolve_device(override, model, "device option")
        return {int(r): forced for r in np.unique(ranks).tolist()}
    out: dict[int, DeviceSpec] = {}
    for r in np.unique(ranks).tolist():
        name = graph.device_names.get(int(r))
        spec = lookup_device(name) if name else None
        if spec is None:
            shown = f"'{name}'" if name else "not recorded"
            raise NotApplicableError(
                f"{model}: the trace's device ({shown}, rank {r}) is unknown",
                hint=f"name it with {'source' if model == 'device' else 'device'}=NAME, "
                "e.g. a100-80gb",
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


def kernel_dtype(name: str, klass: int) -> str:
    """The dtype a compute kernel's math runs in (see module docstring for the defaults)."""
    m = AUTOCAST_PREFIX.match(name)
    if m:
        return m.group(1)
    d = dtype_from_kernel_name(name)
    if d in ("fp8", "bf16", "fp16", "tf32", "fp64"):
        return d
    if klass == KernelClass.CONV and not _FP32_FMA.search(name.lower()):
        return "tf32"  # torch.backends.cudnn.allow_tf32 defaults to True
    return "fp32"  # torch.backends.cuda.matmul.allow_tf32 defaults to False since 1.12


@functools.lru_cache(maxsize=1 << 14)
def _parse_dims(text: str) -> list | None:
    try:
        value = json.loads(text)
    except (ValueError, TypeError):
        return None
    return value if isinstance(value, list) else None


def op_input_dims(graph: Graph, node: int) -> list | None:
    """The parsed "Input Dims" of the op a node is attributed to (do not modify), or None."""
    table = graph.table
    op = int(graph.cols["op"][node])
    if table is None or op < 0 or op >= len(table):
        return None
    idx = int(table.shapes[op])
    return _parse_dims(table.names[idx]) if idx >= 0 else None


# ---------------------------------------------------------------- the model

_MEMCPY_DTOD = re.compile(r"DtoD|Device -> Device", re.IGNORECASE)


def _link_ratio(src: DeviceSpec, dst: DeviceSpec) -> float | None:
    a, b = default_intra_node_link(src), default_intra_node_link(dst)
    if a.name.startswith("nvlink") and b.name.startswith("nvlink"):
        return a.bw_gbs_per_direction / b.bw_gbs_per_direction
    return None


def apply(graph: Graph, options: Options) -> Graph:
    if not options.target:
        raise PerfcastError("device needs a target GPU", hint="e.g. device:target=h100")
    target = resolve_device(options.target, "device", "target")
    gpu = require_gpu(graph, "device")
    c = graph.cols
    sources = rank_devices(graph, c["rank"][gpu], options.source, "device")
    fixed = kernel_fixed_cost_ns(graph)
    ratio = np.ones(gpu.size, dtype=np.float64)
    counts = {"compute": 0, "memory": 0, "comm": 0, "copy": 0}
    comm_scaled = False
    for i, n in enumerate(gpu.tolist()):
        src = sources[int(c["rank"][n])]
        gk = int(c["gpu_kind"][n])
        name = graph.name_of(n)
        if gk == GpuKind.MEMCPY:
            if _MEMCPY_DTOD.search(name):
                ratio[i] = src.mem_bw_gbs / target.mem_bw_gbs
                counts["copy"] += 1
            continue
        if gk == GpuKind.MEMSET:
            ratio[i] = src.mem_bw_gbs / target.mem_bw_gbs
            counts["memory"] += 1
            continue
        k = int(c["klass"][n])
        if k == KernelClass.COMMUNICATION:
            r = _link_ratio(src, target)
            if r is not None:
                ratio[i] = r
                comm_scaled = True
            counts["comm"] += 1
        elif is_compute_kernel(graph, n):
            d = kernel_dtype(name, k)
            ratio[i] = src.peak(d) / target.peak(d)
            counts["compute"] += 1
        else:
            ratio[i] = src.mem_bw_gbs / target.mem_bw_gbs
            counts["memory"] += 1
    changed = ratio != 1.0
    before = int(c["dur"][gpu].sum())
    scale_variable(graph, gpu[changed], ratio[changed], fixed)
    after = int(c["dur"][gpu].sum())
    # Later models (amp, batch-size) see the new device; a fresh dict, as copies share it.
    graph.device_names = {**graph.device_names, **dict.fromkeys(sources, target.name)}
    src_names = ", ".join(sorted({s.name for s in sources.values()}))
    comm = (
        "communication kernels scaled by the NVLink bandwidth ratio"
        if comm_scaled
        else "communication kernels unchanged"
    )
    graph.assumptions.append(
        f"device {src_names} -> {target.name}: {counts['compute']:,} compute-bound kernels by "
        f"peak FLOPS, {counts['memory']:,} memory-bound kernels and {counts['copy']:,} "
        f"device copies by DRAM bandwidth ({src_names} {_bw(sources)} -> "
        f"{target.mem_bw_gbs:g} GB/s), {comm}; fixed {fixed / 1000:.1f} µs per kernel kept; "
        f"GPU time {before / 1e6:.2f} -> {after / 1e6:.2f} ms; same host CPU assumed"
    )
    return graph


def _bw(sources: dict[int, DeviceSpec]) -> str:
    return "/".join(f"{b:g}" for b in sorted({s.mem_bw_gbs for s in sources.values()}))
