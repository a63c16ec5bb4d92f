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

The helpers shared with the other scaling models (fixed kernel cost, device
lookup, a compute kernel's dtype, op shapes) are in `perfcast.whatif.kernels`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from perfcast.errors import PerfcastError
from perfcast.graph.model import GpuKind, Graph
from perfcast.hardware import (
    DeviceSpec,
    KernelClass,
    default_intra_node_link,
)
from perfcast.whatif.kernels import (
    is_compute_kernel,
    kernel_dtype,
    kernel_fixed_cost_ns,
    rank_devices,
    require_gpu,
    resolve_device,
    scale_variable,
)

SUMMARY = "the same work on another GPU, per-kernel roofline scaling (target=h100, source=...)"


@dataclass
class Options:
    target: str = ""  # required: the GPU to move to ("h100", "A100-SXM4-80GB", ...)
    source: str | None = None  # the trace's device, when its deviceProperties lack or misname it


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
