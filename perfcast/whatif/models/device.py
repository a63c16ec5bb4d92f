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
- communication kernels: by the ratio of the two devices' typical intra-node
  links' bandwidths (`hardware.interconnects.known_intra_node_link`: NVLink,
  PCIe, Infinity Fabric), which assumes the collectives run within one node (a
  multi-node job's network would not change); unchanged where a device's link
  is not known. Only the share of a collective's time that a transfer of its size at the
  traced link's peak bus bandwidth takes scales; latency and waiting for slower peers stay
  (a collective of unknown size scales whole);
- memcpy: device-to-device copies by the bandwidth ratio; host<->device and
  peer copies unchanged (same PCIe host link and topology assumed);
- where the project measured both parts (`perfcast.hardware.measured`, e.g. H100 -> H200),
  the measured class ratios replace the datasheet ones: achieved bandwidth does not grow
  as fast as the peak. Where it has no pair but knows what large GEMMs reach of each
  part's peak in real traces (H100 73.2%, MI300X 41.5%, `achieved_gemm`), compute-bound
  kernels scale by achieved FLOPS: H100 -> MI300X then makes them 1.33x slower, not 1.32x
  faster as the datasheets say. When only one side of a move has its own figure, the other
  takes its vendor's measured part's (an H200 or A100 the H100's, stated): judging one
  side by achieved FLOPS and the other by its datasheet peak made MI300X -> H200 predict a
  0.63x slowdown where MI300X -> H100 gained;
- CPU work: the same host is assumed unless `host=SPEED` says the new machine's CPU is
  SPEED times as fast (every CPU node and runtime call then takes 1/SPEED as long; launch
  latencies and gaps on the GPU side are unchanged), or `host=FILE` names the new
  machine's `perfcast calibrate` file: SPEED is then the ratio of the two machines' time
  per small ATen op without the profiler (the traced machine's from the calibration that
  fits the trace). The measured H200 machine's host ran a launch-bound step 1.39x faster
  than the H100 machine's: a new GPU often comes with a new host, and only the user knows
  it.

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

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfcast.errors import OptionValueError, PerfcastError
from perfcast.graph.model import GpuKind, Graph, NodeKind
from perfcast.hardware import DeviceSpec, KernelClass, convs_in_tf32
from perfcast.hardware.devices import known_devices_text
from perfcast.hardware.interconnects import known_intra_node_link
from perfcast.hardware.measured import achieved_gemm, achieved_gemm_or_stand_in, measured_ratio
from perfcast.whatif import primitives as P
from perfcast.whatif.kernels import (
    is_compute_kernel,
    kernel_fixed_cost_ns,
    node_dtype,
    rank_devices,
    require_gpu,
    resolve_device,
    scale_variable,
)
from perfcast.whatif.registry import MAX_OPTION

SUMMARY = (
    "the same work on another GPU, per-kernel roofline scaling (target=GPU, required: e.g. "
    "target=h100; source= when the trace misnames its own; host=SPEED, or host=FILE: the new "
    "machine's perfcast calibrate file)"
)


@dataclass
class Options:
    target: str = ""  # required: the GPU to move to ("h100", "A100-SXM4-80GB", ...)
    source: str | None = None  # the trace's device, when its deviceProperties lack or misname it
    # the new machine's CPU speed relative to the traced one, or its calibration file
    host: str | float | os.PathLike[str] = "1"  # a speed ratio or a calibration file


# ---------------------------------------------------------------- the model

_MEMCPY_DTOD = re.compile(r"DtoD|Device -> Device", re.IGNORECASE)


# GPUs in one node, as the scale-out models' gpus_per_node defaults to.
GPUS_PER_NODE = 8


def _transfer_shares(
    graph: Graph, gpu: np.ndarray, sources: dict[int, DeviceSpec], options: Options
) -> dict[int, float]:
    """Per communication node of known size: the share of its time a transfer at its rank's
    intra-node link's peak bus bandwidth takes (at most 1)."""
    from perfcast.analysis.comms import bus_bytes

    c = graph.cols
    table = graph.table
    comm = gpu[(c["klass"][gpu] == KernelClass.COMMUNICATION) & (c["event"][gpu] >= 0)]
    if table is None or comm.size == 0:
        return {}
    moved = bus_bytes(table, c["event"][comm].astype(np.int64))
    out: dict[int, float] = {}
    for n, b in zip(comm.tolist(), moved.tolist(), strict=True):
        rank = int(c["rank"][n])
        link = known_intra_node_link(sources[rank], options.source or graph.device_names.get(rank))
        dur = int(c["dur"][n])
        if b > 0 and link is not None and link.bw_gbs_per_direction > 0 and dur > 0:
            out[n] = min(b / link.bw_gbs_per_direction / dur, 1.0)  # bytes / (bytes/ns) / ns
    return out


def _link_ratio(
    src: DeviceSpec, dst: DeviceSpec, src_name: str | None = None, dst_name: str | None = None
) -> float | None:
    """Communication time's ratio: the intra-node links' bandwidths, where both parts' links
    are known (NVLink, PCIe, Infinity Fabric alike: moving from NVLink to a PCIe part slows
    collectives as much as the other way speeds them up)."""
    # A variant named by the trace or the user (an H800) runs over its own cut link.
    a, b = known_intra_node_link(src, src_name), known_intra_node_link(dst, dst_name)
    if a is None or b is None or a.bw_gbs_per_direction <= 0 or b.bw_gbs_per_direction <= 0:
        return None
    return a.bw_gbs_per_direction / b.bw_gbs_per_direction


def host_ratio(host: str | float | os.PathLike[str], graph: Graph) -> tuple[float, str]:
    """The new host's speed relative to the traced one, and where it comes from: a number,
    or the new machine's calibration file against the one that fits the trace."""
    speed = _host_speed(host)
    if speed is None:
        return _host_ratio_from_calibration(_host_file(host), graph)
    return speed, f"host={speed:g}"


def _host_file(host: str | float | os.PathLike[str]) -> Path:
    """The option as the calibration file it names; an OptionValueError when no such file."""
    text = (os.fspath(host) if isinstance(host, os.PathLike) else str(host)).strip()
    path = Path(text).expanduser()
    try:
        is_file = path.is_file()
    except (OSError, ValueError):  # a name too long for the OS, a NUL byte
        is_file = False
    if not is_file:
        raise OptionValueError(
            f"device: host={str(path)[:200]} is neither a number nor a file",
            hint="host=1.3, or the file `perfcast calibrate -o FILE` wrote on the new machine",
        )
    return path


def _host_speed(host: str | float | os.PathLike[str]) -> float | None:
    """The option as a speed ratio (checked), or None when it names a file."""
    text = (os.fspath(host) if isinstance(host, os.PathLike) else str(host)).strip()
    try:
        speed = float(text)
    except ValueError:
        return None
    if not _sane_speed(speed):
        raise OptionValueError(
            "device: host must be a positive speed ratio or a calibration file",
            hint=f"e.g. host=1.3 (between {1 / MAX_OPTION:g} and {MAX_OPTION:g}), or "
            "host=other-machine.json written by perfcast calibrate there",
        )
    return speed


def _sane_speed(speed: float) -> bool:
    # Bounded both ways: a ratio of 1e-300 or 1e300 would overflow every host duration.
    return math.isfinite(speed) and 1 / MAX_OPTION <= speed <= MAX_OPTION


def _host_op_ns(cal: object) -> float | None:
    """A calibration's host speed figure, when it is a usable one."""
    profiler = getattr(cal, "profiler", None)
    value = getattr(profiler, "host_op_ns", None)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _host_ratio_from_calibration(path: Path, graph: Graph) -> tuple[float, str]:
    from perfcast import calibration

    try:
        new = calibration.load(path)
    except PerfcastError as exc:
        raise PerfcastError(
            f"device: host={path.name} is not a perfcast calibration file",
            path=str(path),
            hint="run 'perfcast calibrate -o FILE' on the new machine and pass that FILE",
        ) from exc
    new_ns = _host_op_ns(new)
    if new_ns is None:
        raise PerfcastError(
            "device: this calibration has no usable host speed (written by an older "
            "perfcast, or edited); run 'perfcast calibrate' on the new machine again",
            path=str(path),
        )
    here, fits, sentence = (
        calibration.matches_trace(graph.table) if graph.table is not None else (None, False, "")
    )
    old_ns = _host_op_ns(here) if here is not None else None
    if not fits or old_ns is None:
        raise PerfcastError(
            "device: host=FILE compares the new machine with the traced one, and no "
            "calibration with a host speed is known for the traced machine"
            + (f" ({sentence})" if sentence else ""),
            hint="run 'perfcast calibrate' on the traced machine too (or name its file in "
            "PERFCAST_CALIBRATION), or give the ratio as host=SPEED",
        )
    speed = old_ns / new_ns
    if not _sane_speed(speed):
        raise PerfcastError(
            f"device: the host speed from {path.name} ({old_ns:g} / {new_ns:g} ns per op = "
            f"{speed:g}) is out of range",
            path=str(path),
        )
    return speed, (
        f"host={path.name}: {new_ns:g} ns per small op there against {old_ns:g} ns on the "
        "traced machine, per perfcast calibrate"
    )


def check_options(options: Options) -> None:
    """Values the model cannot take (the registry calls this when it builds the options)."""
    if not options.target:
        raise OptionValueError(
            "device needs a target GPU", hint=f"e.g. device:target=h100; {known_devices_text()}"
        )
    if _host_speed(options.host) is None:  # a file: it must exist (its contents: at apply)
        _host_file(options.host)
    # Unknown GPU names, refused before a trace is read (apply resolves them again, noting
    # a stand-in variant in the graph's assumptions).
    resolve_device(options.target, "device", "target")
    if options.source:
        resolve_device(options.source, "device", "source option")


def apply(graph: Graph, options: Options) -> Graph:
    host_speed, host_how = host_ratio(options.host, graph)
    target = resolve_device(options.target, "device", "target", graph)
    gpu = require_gpu(graph, "device")
    c = graph.cols
    sources = rank_devices(graph, c["rank"][gpu], options.source, "device")
    fixed = kernel_fixed_cost_ns(graph)
    ratio = np.ones(gpu.size, dtype=np.float64)
    counts = {"compute": 0, "memory": 0, "comm": 0, "copy": 0}
    comm_scaled = False
    # A job of more ranks than a node holds runs its collectives over the network, which a
    # GPU change does not change (the intra-node link bounds only a one-node job).
    world = max((i.world_size or 0 for i in graph.table.ranks), default=0) if graph.table else 0
    multi_node = world > GPUS_PER_NODE
    measured_used: set[str] = set()
    achieved_used: set[str] = set()
    peaks_used: set[tuple[str, float, float]] = set()
    comm_share = _transfer_shares(graph, gpu, sources, options)
    comm_sized = comm_linked = 0  # collectives sized, and scaled at all (a known link)
    for i, n in enumerate(gpu.tolist()):
        src = sources[int(c["rank"][n])]
        table = measured_ratio(src.name, target.name)
        gk = int(c["gpu_kind"][n])
        name = graph.name_of(n)
        mem_ratio = 1 / table.memory if table else src.mem_bw_gbs / target.mem_bw_gbs
        if table:
            measured_used.add(table.source)
        if gk == GpuKind.MEMCPY:
            if _MEMCPY_DTOD.search(name):
                ratio[i] = mem_ratio
                counts["copy"] += 1
            continue
        if gk == GpuKind.MEMSET:
            ratio[i] = mem_ratio
            counts["memory"] += 1
            continue
        k = int(c["klass"][n])
        if k == KernelClass.COMMUNICATION:
            src_name = options.source or graph.device_names.get(int(c["rank"][n]))
            r = None if multi_node else _link_ratio(src, target, src_name, options.target)
            if r is not None:
                # Only the transfer's share at the link's peak moves with the link; latency
                # and waiting for other ranks stay (an RCCL all-reduce at 0.6% of the link's
                # peak is waiting, and a faster link does not shorten that).
                share = comm_share.get(int(n))
                ratio[i] = r if share is None else 1.0 - share + share * r
                comm_scaled = True
                comm_sized += share is not None
                comm_linked += 1
            counts["comm"] += 1
        elif is_compute_kernel(graph, n):
            d = node_dtype(graph, int(n), convs_in_tf32(src))
            if table:
                ratio[i] = 1 / table.compute
            else:
                ratio[i] = src.peak(d) / target.peak(d)
                peaks_used.add((d, src.peak(d), target.peak(d)))
                e_src, e_tgt = achieved_gemm(src.name), achieved_gemm(target.name)
                if e_src or e_tgt:
                    # One side measured: the other by its vendor's measured part, so that a
                    # move is not judged by achieved FLOPS on one side and peak on the other.
                    e_src = e_src or achieved_gemm_or_stand_in(src.name, src.vendor)
                    e_tgt = e_tgt or achieved_gemm_or_stand_in(target.name, target.vendor)
                if e_src and e_tgt:
                    ratio[i] *= e_src.efficiency / e_tgt.efficiency
                    achieved_used.update((e_src.source, e_tgt.source))
            counts["compute"] += 1
        else:
            ratio[i] = mem_ratio
            counts["memory"] += 1
    changed = ratio != 1.0
    before = int(c["dur"][gpu].sum())
    scale_variable(graph, gpu[changed], ratio[changed], fixed)
    after = int(c["dur"][gpu].sum())
    host_text = "same host CPU assumed"
    if host_speed != 1.0:
        host = np.flatnonzero(
            np.isin(c["kind"], [NodeKind.CPU, NodeKind.LAUNCH, NodeKind.RUNTIME, NodeKind.SYNC])
            & graph.alive
        )
        P.scale(graph, host, 1.0 / host_speed)
        host_text = f"the new machine's CPU taken as {host_speed:.3g}x as fast ({host_how})"
    # Later models (amp, batch-size) see the new device; a fresh dict, as copies share it.
    graph_names = dict(graph.device_names)  # as traced, for the links' names below
    graph.device_names = {**graph.device_names, **dict.fromkeys(sources, target.name)}
    src_names = ", ".join(sorted({s.name for s in sources.values()}))
    comm = "communication kernels unchanged (a device's intra-node link is not known)"
    if multi_node:
        comm = (
            f"communication kernels unchanged: the job has {world} ranks, more than a node's "
            f"{GPUS_PER_NODE} GPUs, so its collectives are taken as bound by the network"
        )
    if comm_scaled:
        links = {
            f"{known_intra_node_link(s, options.source or graph_names.get(r)).name} -> "  # type: ignore[union-attr]
            f"{known_intra_node_link(target, options.target).name}"  # type: ignore[union-attr]
            for r, s in sources.items()
        }
        per_comm, _ = P.rank_steps(graph, gpu)
        sized = (
            "the share of each a transfer at the traced link's peak bus bandwidth takes "
            "(its size from the trace), latency and waiting for other ranks kept"
            if comm_sized == comm_linked
            else f"{P.per_count(comm_sized, per_comm)} of {P.per_count(comm_linked, per_comm)} "
            "by the share a transfer at the traced "
            "link's peak bus bandwidth takes, latency and waiting for other ranks kept; the "
            "rest, of unknown size, whole"
            if comm_sized
            else "whole (no collective's size is in the trace: waiting for other ranks "
            "scales with them)"
        )
        comm = (
            "communication kernels scaled by the intra-node links' bandwidth ratio "
            f"({', '.join(sorted(links))}; collectives taken to run within one node): {sized}"
        )
    how = (
        f"by ratios {'; '.join(sorted(measured_used))}"
        if measured_used
        else f"by datasheet peak FLOPS and DRAM bandwidth ({src_names} {_bw(sources)} -> "
        f"{target.mem_bw_gbs:g} GB/s)"
    )
    if peaks_used:
        how += "; datasheet peaks " + ", ".join(
            f"{d} {old:g} -> {new:g} TFLOP/s" for d, old, new in sorted(peaks_used)
        )
    if achieved_used:
        how += (
            "; compute-bound kernels by achieved, not peak, FLOPS (large bf16 GEMMs in the "
            f"shared traces: {'; '.join(sorted(achieved_used))})"
        )
    per, per_what = P.rank_steps(graph, gpu)
    graph.assumptions.append(
        f"device {src_names} -> {target.name}, {per_what}: "
        f"{P.per_count(counts['compute'], per)} compute-bound kernels, "
        f"{P.per_count(counts['memory'], per)} memory-bound kernels and "
        f"{P.per_count(counts['copy'], per)} device copies scaled {how}, {comm}; fixed "
        f"{fixed / 1000:.1f} µs per kernel kept; GPU time {before / per / 1e6:.2f} -> "
        f"{after / per / 1e6:.2f} ms; {host_text}"
    )
    return graph


def _bw(sources: dict[int, DeviceSpec]) -> str:
    return "/".join(f"{b:g}" for b in sorted({s.mem_bw_gbs for s in sources.values()}))
