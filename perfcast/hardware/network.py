"""A cluster of GPUs and the collectives between them: NVLink / NVSwitch or PCIe inside a
node, InfiniBand / RoCE between nodes, ring / tree / NVLS algorithms, vectorized over plans.

The link table (`interconnects`) gives peaks; a cluster adds what a collective actually gets:

- the *bus bandwidth* a collective reaches is a fraction of the link peak (`intra_eff`,
  `inter_eff`; nccl-tests convention, doc/PERFORMANCE.md: busbw = algbw x 2(n-1)/n for an
  all-reduce, x (n-1)/n for all-gather and reduce-scatter, x 1 for send/recv). Defaults:
  0.80 of NVLink (NVIDIA's published nccl-tests all-reduce busbw on DGX A100 / H100 is about
  230 of 300 and 360-370 of 450 GB/s), 0.90 of an InfiniBand / RoCE port, 0.80 of PCIe and
  AMD's links as well (an assumption: no published figure behind it, and said so). A
  trace with real collectives replaces the intra-node figure with its own measured bus
  bandwidth (`calibrated_from`).
- a group inside one node moves at the intra-node bus bandwidth. A group that spans nodes
  is bound by the NICs: with `local` members of the group on each node, a ring leaves the
  node on `local` NICs at once (NCCL runs one ring channel per NIC), so its bus bandwidth is
  min(intra, local x per-GPU NIC bandwidth x inter_eff) (NVIDIA's DGX A100 multi-node
  nccl-tests: about 180-190 GB/s all-reduce busbw with 8 x 200 Gb/s HDR per node).
- algorithms: "ring" as above; "tree" pays log2(n) latency steps instead of 2(n-1) (NCCL's
  double binary tree, used for small messages across nodes), same bandwidth term; "nvls"
  (NVLink SHARP on NVSwitch 3, H100/H200 nodes): the switch reduces, so an all-reduce moves N
  bytes per GPU each way instead of 2(n-1)/n N: algbw = bus peak x eff inside a node.
- latency: a fixed launch-and-sync cost per collective (`base_us`: NCCL's measured small-message
  all-reduce time inside a node is 10-20 us) plus the link's hop latency per algorithm step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from perfcast.hardware.devices import (
    DeviceSpec,
    known_devices_text,
    lookup_device,
    lookup_or_nearest,
)
from perfcast.hardware.interconnects import (
    LinkSpec,
    default_intra_node_link,
    is_network_link,
    lookup_link,
)

_GBS = 1e9


@dataclass(frozen=True)
class Cluster:
    """GPUs in nodes: `gpus_per_node` GPUs joined by `intra`, nodes joined by `inter`
    (one NIC of `inter` per GPU unless `nics_per_node` says otherwise)."""

    device: DeviceSpec
    intra: LinkSpec
    inter: LinkSpec
    gpus_per_node: int = 8
    nics_per_node: int = 8
    intra_eff: float = 0.80
    inter_eff: float = 0.90
    base_us: float = 10.0
    nvls: bool = False
    calibration: str = ""  # what set intra_eff, when a trace did
    device_note: str = ""  # how an unlisted GPU name was taken (a variant of a known part)

    @property
    def nic_gbs_per_gpu(self) -> float:
        return self.inter.bw_gbs_per_direction * self.nics_per_node / self.gpus_per_node

    def describe(self) -> str:
        nv = ", all-reduce by NVLS inside a node" if self.nvls else ""
        cal = f"; {self.calibration}" if self.calibration else ""
        cal += f"; {self.device_note}" if self.device_note else ""
        nics = f"{self.nics_per_node} x " if self.nics_per_node != self.gpus_per_node else ""
        return (
            f"{self.device.name} x {self.gpus_per_node} per node over {self.intra.name} "
            f"({self.intra.bw_gbs_per_direction:g} GB/s, {self.intra_eff:.0%} reached{nv}), "
            f"nodes over {nics}{self.inter.name} ({self.nic_gbs_per_gpu:g} GB/s per GPU, "
            f"{self.inter_eff:.0%} reached); {self.base_us:g} µs per collective besides "
            f"{self.intra.latency_us:g} / {self.inter.latency_us:g} µs per algorithm step "
            f"inside / between nodes{cal}"
        )


def make_cluster(
    device: str | DeviceSpec,
    intra: str | None = None,
    inter: str | None = None,
    gpus_per_node: int = 8,
    nvls: bool | None = None,
    nics_per_node: int | None = None,
    named: str | None = None,
) -> Cluster:
    """A cluster of `device` GPUs. `intra` defaults to the device's usual intra-node link
    (a variant's own where `device`, or `named` beside a spec, names one: the H800's);
    `inter` to 400 Gb/s InfiniBand NDR for Hopper and newer, 200 Gb/s HDR before, one NIC
    per GPU unless `nics_per_node` says otherwise (e.g. 4 on nodes whose eight GPUs share
    four NICs)."""
    from perfcast.errors import OptionError

    found = _named_device(device) if isinstance(device, str) else (device, None)
    spec, why = found
    note = f"{why}; taken as {spec.name}" if why else ""
    named = named or (device if isinstance(device, str) else None)
    link_in = _intra_link(intra) if intra else default_intra_node_link(spec, named)
    foreign = {"amd": "nvlink", "nvidia": "infinity-fabric"}.get(spec.vendor.lower())
    if foreign and link_in.name.startswith(foreign):
        raise OptionError(
            f"the {spec.name} has no {link_in.name} (NVLink joins NVIDIA GPUs, Infinity "
            "Fabric AMD ones)",
            hint="name the node's link for this GPU, or leave it out for its usual one",
        )
    hopper = any(k in spec.name for k in ("H100", "H200", "B200", "MI300"))
    link_out = _inter_link(inter or ("ib-ndr" if hopper else "ib-hdr"))
    if nics_per_node is not None and nics_per_node < 1:
        raise OptionError(
            f"NICs per node must be at least 1, not {nics_per_node}",
            hint="the number of inter-node NICs each node has (default: one per GPU)",
        )
    eff_in = 0.80  # NVLink and PCIe alike (see the module docstring)
    if nvls is None:
        # NVLink SHARP needs third-generation NVSwitch: NVLink 4 (Hopper) and later.
        nvls = spec.name.startswith(("H100-SXM", "H200", "B200")) and link_in.name.startswith(
            ("nvlink4", "nvlink5")  # the H800's cut NVLink 4 too: the same switch
        )
    return Cluster(
        device=spec,
        intra=link_in,
        inter=link_out,
        gpus_per_node=gpus_per_node,
        nics_per_node=gpus_per_node if nics_per_node is None else nics_per_node,
        intra_eff=eff_in,
        nvls=bool(nvls),
        device_note=note,
    )


def check_names(device: str | None, intra: str | None, inter: str | None) -> None:
    """Refuse an unknown GPU or link name, or a link of the wrong kind, as make_cluster
    would: `perfcast plan` checks them before loading the trace (a typo cost a load)."""
    if device is not None:
        _named_device(device)
    if intra:
        _intra_link(intra)
    if inter:
        _inter_link(inter)


def _known_gpus() -> str:
    """Every part --gpu takes, as the device what-if's error lists them, and short names."""
    return f"{known_devices_text()}; or a short name such as h100, a100-80gb, mi300x"


def _named_device(device: str) -> tuple[DeviceSpec, str | None]:
    from perfcast.errors import OptionError

    if not device.strip():
        raise OptionError("no GPU named (an empty name)", hint=_known_gpus())
    found = lookup_or_nearest(device)
    if found is None:
        raise OptionError(f"unknown GPU '{device}'", hint=_known_gpus())
    return found


def _intra_link(name: str) -> LinkSpec:
    from perfcast.errors import OptionError

    link = lookup_link(name)
    if link is None:
        raise OptionError(f"unknown link '{name}'", hint="e.g. nvlink4, pcie5")
    if is_network_link(link):
        raise OptionError(
            f"'{name}' is a link between nodes, not between the GPUs of a node",
            hint="inside a node: nvlink2-5, pcie3-6, infinity-fabric-*; between nodes: --inter",
        )
    return link


def _inter_link(name: str) -> LinkSpec:
    from perfcast.errors import OptionError

    link = lookup_link(name)
    if link is None:
        raise OptionError(f"unknown link '{name}'", hint="e.g. ib-ndr, ib-hdr, 400gbe")
    if not is_network_link(link):
        raise OptionError(
            f"'{name}' joins the GPUs of a node, not nodes",
            hint="between nodes: ib-edr, ib-hdr, ib-ndr, ib-xdr, 100gbe, 200gbe, 400gbe",
        )
    return link


def calibrated_from(cluster: Cluster, busbw_gbs: float, what: str) -> Cluster:
    """The cluster with its intra-node efficiency set from a measured bus bandwidth."""
    eff = float(np.clip(busbw_gbs / cluster.intra.bw_gbs_per_direction, 0.05, 1.0))
    return replace(cluster, intra_eff=eff, calibration=f"intra-node busbw {what}")


def _arr(x: object) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def group_busbw_gbs(cluster: Cluster, n: object, local: object) -> np.ndarray:
    """Bus bandwidth (GB/s) of a group of `n` ranks with `local` of them on each node."""
    n, local = _arr(n), _arr(local)
    intra = cluster.intra.bw_gbs_per_direction * cluster.intra_eff
    inter = np.minimum(intra, local * cluster.nic_gbs_per_gpu * cluster.inter_eff)
    return np.where(n <= local, intra, inter)


def collective_time_s(
    cluster: Cluster,
    collective: str,
    nbytes: object,
    n: object,
    local: object | None = None,
    algorithm: str = "ring",
) -> np.ndarray:
    """Seconds for a collective of `nbytes` (nccl-tests size convention) over `n` ranks,
    `local` of them per node (default: as many as fit in one node). Vectorized; n <= 1 -> 0."""
    nbytes, n = _arr(nbytes), _arr(n)
    local = np.minimum(n, cluster.gpus_per_node) if local is None else _arr(local)
    n_safe = np.maximum(n, 1.0)
    bus = group_busbw_gbs(cluster, n_safe, local) * _GBS
    intra_node = n_safe <= local
    hop = np.where(intra_node, cluster.intra.latency_us, cluster.inter.latency_us) * 1e-6
    base = cluster.base_us * 1e-6
    if collective == "allreduce":
        factor = 2 * (n_safe - 1) / n_safe
        if algorithm == "nvls" or (algorithm == "auto" and cluster.nvls):
            # The switch reduces: N bytes each way at the bus rate inside a node; across nodes
            # NVLS-tree still pays the inter-node ring bandwidth.
            factor = np.where(intra_node, 1.0, factor)
        steps = 2 * (n_safe - 1)
        if algorithm == "tree":
            steps = 2 * np.ceil(np.log2(n_safe))
    elif collective in ("allgather", "reducescatter") or collective == "alltoall":
        factor = (n_safe - 1) / n_safe
        steps = n_safe - 1
    elif collective in ("sendrecv", "broadcast", "reduce"):
        factor = np.ones_like(n_safe)
        steps = np.ones_like(n_safe)
    else:
        raise ValueError(f"unknown collective {collective!r}")
    t = base + steps * hop + nbytes * factor / bus
    return np.where((n <= 1) | (nbytes <= 0), 0.0, t)


def p2p_time_s(cluster: Cluster, nbytes: object, cross_node: object) -> np.ndarray:
    """Send/recv between two GPUs, inside a node or across (one NIC)."""
    nbytes = _arr(nbytes)
    cross = np.asarray(cross_node, dtype=bool)
    intra = cluster.intra.bw_gbs_per_direction * cluster.intra_eff * _GBS
    inter = cluster.nic_gbs_per_gpu * cluster.inter_eff * _GBS
    bw = np.where(cross, inter, intra)
    hop = np.where(cross, cluster.inter.latency_us, cluster.intra.latency_us) * 1e-6
    return np.where(nbytes > 0, cluster.base_us * 1e-6 + hop + nbytes / bw, 0.0)


def default_cluster_for(device_name: str | None) -> Cluster | None:
    spec = lookup_device(device_name) if device_name else None
    return make_cluster(spec) if spec is not None else None


def intra_link_for(spec: DeviceSpec) -> LinkSpec:
    return default_intra_node_link(spec)
