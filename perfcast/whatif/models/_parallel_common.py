"""Helpers the scale-out models (zero, tensor-parallel, pipeline-parallel) share: units of
the step's GPU work, a communication stream, modelled collectives and their waits."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.analysis.notes import no_gpu_work
from perfcast.errors import NotApplicableError, OptionValueError
from perfcast.graph.model import NONE, EdgeType, GpuKind, Graph, NodeKind, Source
from perfcast.graph.phases import Phase
from perfcast.hardware.classify import KernelClass
from perfcast.hardware.devices import DeviceSpec, lookup_or_nearest
from perfcast.hardware.interconnects import (
    LinkSpec,
    default_intra_node_link,
    list_links,
    lookup_link,
)
from perfcast.hardware.network import Cluster, collective_time_s, make_cluster, p2p_time_s
from perfcast.whatif import primitives as P

FALLBACK_LINK = "pcie4"
# Stands in for a device the table does not know: only its links are used.
_UNKNOWN_DEVICE = DeviceSpec(
    name="unknown GPU",
    vendor="unknown",
    peak_tflops={"fp32": 1.0},
    mem_bw_gbs=1.0,
    mem_gb=1.0,
    sm_count=None,
    source="placeholder for an unrecognized device; only its links are used",
)


def check_link(model: str, name: str | None) -> LinkSpec | None:
    """The link named in the options (None when none is), refused unless perfcast knows it;
    models check it when their options are built, and `link_for` uses it."""
    if not name:
        return None
    link = lookup_link(name)
    if link is None:
        raise OptionValueError(
            f"{model}: unknown link '{name}'",
            hint="known: " + ", ".join(ln.name for ln in list_links()),
        )
    return link


def check_node_options(model: str, gpus_per_node: int, nics_per_node: int | None) -> None:
    """The node shape every scale-out model takes (checked when its options are built)."""
    if gpus_per_node < 1:
        raise OptionValueError(f"{model}: gpus_per_node must be at least 1")
    if nics_per_node is not None and nics_per_node < 1:
        raise OptionValueError(f"{model}: nics_per_node must be at least 1")


def link_for(graph: Graph, rank: int, name: str | None, model: str) -> tuple[LinkSpec, str]:
    """The link a model runs its collectives over, and where the choice came from."""
    given = check_link(model, name)
    if given is not None:
        return given, "given"
    dev = graph.device_names.get(rank)
    found = lookup_or_nearest(dev) if dev else None
    if found is None:
        link = lookup_link(FALLBACK_LINK)
        assert link is not None
        return link, f"device {dev or 'unknown'} not recognized: {link.name} assumed"
    spec, variant = found
    # A variant runs over its own link where it differs (the H800's).
    link = default_intra_node_link(spec, dev)
    if variant:
        return link, f"the usual intra-node link of the {dev} ({variant})"
    return link, f"the usual intra-node link of {spec.name}"


@dataclass(frozen=True)
class CommModel:
    """What a modelled collective costs: the cluster `perfcast plan` uses (bus bandwidth a
    fraction of the link peak, a fixed cost per collective, nodes over the network beyond
    `gpus_per_node`), with the link chosen for the trace's device, and where each figure
    came from, for the assumptions."""

    cluster: Cluster
    why: str  # where the link came from
    calibration: str  # "" or the trace's collective the bandwidth was measured on
    ignored: str = ""  # a measured bandwidth too far below the link to use, and why

    def time_us(self, collective: str, nbytes: float, n: int, algorithm: str = "ring") -> float:
        """One collective of `nbytes` (nccl-tests size convention) over `n` ranks."""
        seconds = collective_time_s(self.cluster, collective, nbytes, n, algorithm=algorithm)
        return float(seconds) * 1e6

    def p2p_us(self, nbytes: float, cross_node: bool = False) -> float:
        return float(p2p_time_s(self.cluster, nbytes, cross_node)) * 1e6

    def describe(self, n: int) -> str:
        """The figures behind a group of `n` ranks, for the assumptions."""
        cl = self.cluster
        intra = cl.intra.bw_gbs_per_direction
        text = (
            f"{cl.intra.name} ({intra:g} GB/s per direction peak, bus bandwidth "
            f"{cl.intra_eff:.0%} of it = {intra * cl.intra_eff:.0f} GB/s"
            + (
                f", {self.calibration}"
                if self.calibration
                else ", an assumption of the order rccl-tests reports"
                if cl.device.vendor != "NVIDIA"
                else ", NVIDIA's nccl-tests figures"
                if cl.intra.name.startswith("nvlink")
                else ", an assumption (nccl-tests figures are published for NVLink, not this link)"
            )
            + f"; alpha {cl.intra.latency_us:g} µs per algorithm step, {cl.base_us:g} µs per "
            f"collective; {self.why}" + (f"; {self.ignored}" if self.ignored else "") + ")"
        )
        if n > cl.gpus_per_node:
            text += (
                f"; {n} GPUs span nodes of {cl.gpus_per_node}: between nodes {cl.inter.name} "
                f"({cl.nic_gbs_per_gpu:g} GB/s per GPU, {cl.inter_eff:.0%} reached)"
            )
        return text


def comm_model(
    graph: Graph,
    rank: int,
    name: str | None,
    model: str,
    gpus_per_node: int = 8,
    cache: dict[str | None, CommModel] | None = None,
    nics_per_node: int | None = None,
) -> CommModel:
    """The communication model for `rank`: its device's cluster over link `name` (default: the
    device's usual intra-node link), with the bandwidth measured on the trace's own large
    collectives where it has them (as `perfcast plan` does). Within one model's call the
    result depends only on the rank's device: `cache`, keyed by device name, keeps it for the
    other ranks and steps (the calibration reads the whole trace)."""
    dev = graph.device_names.get(rank)
    if cache is not None and dev in cache:
        return cache[dev]
    link, why = link_for(graph, rank, name, model)
    known = lookup_or_nearest(dev) if dev else None
    spec = known[0] if known else _UNKNOWN_DEVICE
    check_node_options(model, gpus_per_node, nics_per_node)
    cluster = make_cluster(
        spec, intra=link.name, gpus_per_node=gpus_per_node, nics_per_node=nics_per_node
    )
    calibration = ignored = ""
    if graph.table is not None:
        from perfcast.plan import calibrate_cluster

        cluster, measured, unused = calibrate_cluster(graph.table, cluster)
        calibration = measured or ""
        ignored = f"the trace's own collectives: {unused}" if unused else ""
    found = CommModel(cluster, why, calibration, ignored)
    if cache is not None:
        cache[dev] = found
    return found


def require_gpu_steps(graph: Graph, model: str) -> None:
    if P.select(graph, kind="gpu").size == 0:
        raise NotApplicableError(f"{model}: {no_gpu_work(graph.table)}")
    if not graph.iterations:
        raise NotApplicableError(f"{model}: the trace has no steps (ProfilerStep ranges)")


def step_gpu_nodes(graph: Graph, rank: int, it: int, phase: Phase) -> np.ndarray:
    """Live compute GPU nodes of one step and phase (no collectives), in launch order."""
    c = graph.cols
    nodes = P.select(graph, kind="gpu", rank=rank, iteration=it, phase=_PHASE_NAME[phase])
    nodes = nodes[c["klass"][nodes] != KernelClass.COMMUNICATION]
    return nodes[np.argsort(c["launch_order"][nodes], kind="stable")]


_PHASE_NAME = {
    Phase.FORWARD: "forward",
    Phase.BACKWARD: "backward",
    Phase.OPTIMIZER: "optimizer",
}


def chunks(nodes: np.ndarray, k: int) -> list[np.ndarray]:
    """`nodes` (in order) cut into at most `k` contiguous chunks of about equal count."""
    k = max(1, min(k, nodes.size))
    return [c for c in np.array_split(nodes, k) if c.size]


def comm_lane(graph: Graph, rank: int, label: str) -> int:
    gpu_lanes = [ln for ln in graph.lanes if ln.is_gpu and ln.rank == rank]
    dev = gpu_lanes[0].pid if gpu_lanes else 0
    stream = max((ln.tid for ln in gpu_lanes), default=0) + 1
    return P.add_lane(graph, rank, True, dev, stream, f"GPU {dev} stream {stream} ({label})")


def insert_collective(
    graph: Graph,
    lane: int,
    dur_ns: np.ndarray,
    nbytes: np.ndarray,
    order: np.ndarray,
    name: str,
    iteration: np.ndarray,
    phase: Phase = Phase.COMMUNICATION,
) -> np.ndarray:
    """Modelled collective kernels on `lane` at stream positions `order`."""
    k = int(np.size(dur_ns))
    return P.insert(
        graph,
        lane=lane,
        dur=np.asarray(dur_ns, dtype=np.int64),
        kind=NodeKind.GPU,
        name=name,
        count=k,
        source=Source.MODELLED,
        order=np.asarray(order, dtype=np.float64),
        launch_order=np.asarray(order, dtype=np.float64),
        phase=int(phase),
        iteration=np.asarray(iteration),
        gpu_kind=int(GpuKind.KERNEL),
        klass=int(KernelClass.COMMUNICATION),
        nbytes=np.asarray(nbytes, dtype=np.int64),
        launch=NONE,
    )


def wait(graph: Graph, src: int | np.ndarray, dst: int | np.ndarray, gap: int = 0) -> None:
    """`dst` starts after `src` ends (a stream waiting on an event)."""
    graph.add_edges(np.atleast_1d(src), np.atleast_1d(dst), gap, EdgeType.DATA)


def groups(graph: Graph) -> list[tuple[int, int]]:
    """(rank, iteration index) of every step."""
    out = []
    for span in graph.iterations:
        if span.index != NONE:
            out.append((span.rank, span.index))
    return sorted(set(out))


def balanced_max(times: np.ndarray, parts: int) -> float:
    """Smallest possible maximum part sum of `times` split into `parts` contiguous parts."""
    if parts <= 1 or times.size == 0:
        return float(times.sum())
    if parts >= times.size:
        return float(times.max())
    lo, hi = float(times.max()), float(times.sum())
    for _ in range(40):
        mid = (lo + hi) / 2
        n, acc = 1, 0.0
        for t in times.tolist():
            if acc + t > mid:
                n, acc = n + 1, t
            else:
                acc += t
        if n <= parts:
            hi = mid
        else:
            lo = mid
    return hi
