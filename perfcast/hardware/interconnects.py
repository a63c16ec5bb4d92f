"""Links between accelerators: bandwidth per direction and a typical one-hop latency.

Bandwidths are the published signalling rates after line encoding, per direction, for the
*whole* attachment of one GPU (all of its NVLink / Infinity Fabric links together, an x16
PCIe slot, one network port). They are peaks: NCCL usually reaches 70-90 % of them.

Latencies are rough one-hop figures used as the alpha term of collective cost models. No vendor
datasheet states them the way this model uses them, so every latency here is an assumption and
each `source` says so. The NVLink / PCIe / network figures are of the order NCCL's own tuning
model uses for one hop (src/graph/tuning.cc, `hwLat`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from perfcast.hardware.devices import DeviceSpec, variant_link


@dataclass(frozen=True)
class LinkSpec:
    """A link as seen by one GPU: GB/s (1e9 bytes/s) per direction and microseconds."""

    name: str
    bw_gbs_per_direction: float
    latency_us: float
    source: str

    def __post_init__(self) -> None:
        if self.bw_gbs_per_direction <= 0 or self.latency_us < 0:
            raise ValueError(f"{self.name}: bandwidth must be positive, latency non-negative")


_PCIE = "PCI-SIG PCI Express Base Specification {v}: {gt} GT/s per lane, {enc}, x16"
_LAT_PCIE = "latency 1.0 us is an assumption (one switch hop, GPU peer-to-peer)"
_LAT_NVL = "latency 0.6 us is an assumption (one NVSwitch / direct hop)"
_LAT_IB = "latency 1.0 us is an assumption (RDMA, adapter plus one switch)"
_LAT_ETH = "latency 2.0 us is an assumption (RoCEv2 RDMA, one switch; kernel TCP is ~10x more)"

_LINKS: tuple[LinkSpec, ...] = (
    LinkSpec(
        "pcie3",
        15.75,
        1.0,
        _PCIE.format(v="3.0", gt=8, enc="128b/130b") + "; " + _LAT_PCIE,
    ),
    LinkSpec(
        "pcie4",
        31.5,
        1.0,
        _PCIE.format(v="4.0", gt=16, enc="128b/130b") + "; " + _LAT_PCIE,
    ),
    LinkSpec(
        "pcie5",
        63.0,
        1.0,
        _PCIE.format(v="5.0", gt=32, enc="128b/130b") + "; " + _LAT_PCIE,
    ),
    LinkSpec(
        "pcie6",
        121.0,
        1.0,
        _PCIE.format(v="6.0", gt=64, enc="PAM4 with 242/256 FLIT efficiency") + "; " + _LAT_PCIE,
    ),
    LinkSpec(
        "nvlink2",
        150.0,
        0.6,
        "NVIDIA Tesla V100 GPU Architecture whitepaper, 2017: 6 NVLink 2.0 links x 25 GB/s per "
        "direction (300 GB/s total); " + _LAT_NVL,
    ),
    LinkSpec(
        "nvlink3",
        300.0,
        0.6,
        "NVIDIA A100 Tensor Core GPU Architecture whitepaper, 2020: 12 NVLink 3 links x 25 GB/s "
        "per direction (600 GB/s total); " + _LAT_NVL,
    ),
    LinkSpec(
        "nvlink4",
        450.0,
        0.6,
        "NVIDIA H100 Tensor Core GPU Architecture whitepaper, 2022: 18 NVLink 4 links x 25 GB/s "
        "per direction (900 GB/s total); " + _LAT_NVL,
    ),
    LinkSpec(
        "nvlink3-a800",
        200.0,
        0.6,
        "NVIDIA A800 product listing: NVLink 400 GB/s (both directions), i.e. 200 GB/s per "
        "direction (the A100's 600 GB/s cut for export); " + _LAT_NVL,
    ),
    LinkSpec(
        "nvlink4-h800",
        200.0,
        0.6,
        "NVIDIA H800 product listing: NVLink 400 GB/s (both directions), i.e. 200 GB/s per "
        "direction (the H100's 900 GB/s cut for export); " + _LAT_NVL,
    ),
    LinkSpec(
        "nvlink5",
        900.0,
        0.6,
        "NVIDIA Blackwell architecture technical brief, 2024: 18 NVLink 5 links x 50 GB/s per "
        "direction (1.8 TB/s total); " + _LAT_NVL,
    ),
    LinkSpec(
        "infinity-fabric-mi250x",
        100.0,
        1.0,
        "AMD Instinct MI250X datasheet, 2021: up to 8 Infinity Fabric (xGMI) links, 50 GB/s per "
        "direction each (800 GB/s aggregate per card). Per GCD the peers sit behind 4, 2 or 1 "
        "links, so 100 GB/s per direction is an assumed effective ring figure; latency 1.0 us "
        "is an assumption",
    ),
    LinkSpec(
        "infinity-fabric-mi300x",
        448.0,
        1.0,
        "AMD Instinct MI300X datasheet, 2023: 7 Infinity Fabric links, 128 GB/s bidirectional "
        "each (896 GB/s aggregate), i.e. 7 x 64 GB/s per direction over the full mesh (a single "
        "peer pair gets 64 GB/s); latency 1.0 us is an assumption",
    ),
    LinkSpec(
        "ib-edr",
        12.5,
        1.0,
        "InfiniBand Trade Association roadmap: EDR 100 Gb/s per 4x port; " + _LAT_IB,
    ),
    LinkSpec(
        "ib-hdr",
        25.0,
        1.0,
        "InfiniBand Trade Association roadmap: HDR 200 Gb/s per 4x port; " + _LAT_IB,
    ),
    LinkSpec(
        "ib-ndr",
        50.0,
        1.0,
        "InfiniBand Trade Association roadmap: NDR 400 Gb/s per 4x port; " + _LAT_IB,
    ),
    LinkSpec(
        "ib-xdr",
        100.0,
        1.0,
        "InfiniBand Trade Association roadmap: XDR 800 Gb/s per 4x port; " + _LAT_IB,
    ),
    LinkSpec(
        "100gbe",
        12.5,
        2.0,
        "IEEE 802.3ba/802.3bj 100 Gb/s Ethernet; " + _LAT_ETH,
    ),
    LinkSpec(
        "200gbe",
        25.0,
        2.0,
        "IEEE 802.3bs/802.3cd 200 Gb/s Ethernet; " + _LAT_ETH,
    ),
    LinkSpec(
        "400gbe",
        50.0,
        2.0,
        "IEEE 802.3bs 400 Gb/s Ethernet; " + _LAT_ETH,
    ),
)

_BY_NAME: dict[str, LinkSpec] = {link.name: link for link in _LINKS}


def _compact(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "", name.lower())


def _aliases() -> dict[str, str]:
    table: dict[str, str] = {}
    for gen in (3, 4, 5, 6):
        for alias in (f"pcie{gen}", f"pcie{gen}x16", f"pciegen{gen}", f"pcie{gen}0", f"gen{gen}"):
            table[alias] = f"pcie{gen}"
        table[f"pciegen{gen}x16"] = f"pcie{gen}"
    for gen, gpu in ((2, "v100"), (3, "a100"), (4, "h100"), (5, "b200")):
        for alias in (f"nvlink{gen}", f"nvlink{gen}0", f"nvlinkv{gen}", f"nvlink{gpu}"):
            table[alias] = f"nvlink{gen}"
    for gen, gpu in ((3, "a800"), (4, "h800")):
        for alias in (f"nvlink{gpu}", f"nvlink{gen}{gpu}"):
            table[alias] = f"nvlink{gen}-{gpu}"
    for chip in ("mi250x", "mi250", "mi200"):
        for prefix in ("infinityfabric", "if", "xgmi"):
            table[prefix + chip] = "infinity-fabric-mi250x"
    for prefix in ("infinityfabric", "if", "xgmi"):
        table[prefix + "mi300x"] = "infinity-fabric-mi300x"
        table[prefix + "mi300"] = "infinity-fabric-mi300x"
    for rate in ("edr", "hdr", "ndr", "xdr"):
        for alias in (rate, f"ib{rate}", f"infiniband{rate}", f"{rate}ib", f"{rate}infiniband"):
            table[alias] = f"ib-{rate}"
    for speed in (100, 200, 400):
        for alias in (
            f"{speed}gbe",
            f"{speed}ge",
            f"{speed}gethernet",
            f"ethernet{speed}g",
            f"ethernet{speed}gbe",
            f"roce{speed}",
            f"roce{speed}g",
            f"{speed}gbroce",
        ):
            table[alias] = f"{speed}gbe"
    return table


_ALIASES = _aliases()

# What the GPUs of a typical multi-GPU server of each kind talk over. PCIe-only parts get the
# PCIe generation they support; the H100 NVL's bridge only joins pairs, so a node uses PCIe.
_INTRA_NODE: dict[str, str] = {
    "V100-SXM2-32GB": "nvlink2",
    "V100-PCIe-32GB": "pcie3",
    "V100S-PCIe-32GB": "pcie3",
    "A100-SXM4-40GB": "nvlink3",
    "A100-SXM4-80GB": "nvlink3",
    "A100-PCIe-40GB": "pcie4",
    "A100-PCIe-80GB": "pcie4",
    "H100-SXM5-80GB": "nvlink4",
    "H100-PCIe-80GB": "pcie5",
    "H100-NVL-94GB": "pcie5",
    "H200-SXM-141GB": "nvlink4",
    "B200": "nvlink5",
    "L4": "pcie4",
    "A10": "pcie4",
    "RTX-2080-Ti": "pcie3",
    "RTX-3090": "pcie4",
    "RTX-4090": "pcie4",
    "MI250X-GCD": "infinity-fabric-mi250x",
    "MI250-GCD": "infinity-fabric-mi250x",
    "MI300X": "infinity-fabric-mi300x",
}


def lookup_link(name: str) -> LinkSpec | None:
    """Find a link by canonical name ("nvlink4", "ib-ndr", "400gbe") or a common alias
    ("PCIe Gen4 x16", "NVLink-H100", "InfiniBand HDR", "xGMI MI300X"); None if unknown."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    canonical = _ALIASES.get(_compact(name))
    return _BY_NAME[canonical] if canonical else None


def is_network_link(link: LinkSpec) -> bool:
    """A link between nodes (InfiniBand, Ethernet), as opposed to one between the GPUs of a
    node (NVLink, Infinity Fabric, PCIe)."""
    return link.name.startswith("ib-") or link.name.endswith("gbe")


def list_links() -> list[LinkSpec]:
    return list(_LINKS)


def default_intra_node_link(device: DeviceSpec, named: str | None = None) -> LinkSpec:
    """The GPU-to-GPU link a typical server with this device uses inside one node; where
    `named` (the name a trace or a user gave) is a variant `device` stands in for, the
    variant's own link (the H800's cut NVLink).

    Unknown devices get PCIe 4.0 x16, the most common slot of the period this table covers.
    """
    return known_intra_node_link(device, named) or _BY_NAME["pcie4"]


def known_intra_node_link(device: DeviceSpec, named: str | None = None) -> LinkSpec | None:
    """The device's intra-node link when the table names one (no PCIe 4.0 guess); a
    variant's own, as `default_intra_node_link`."""
    name = (variant_link(named) if named else None) or _INTRA_NODE.get(device.name)
    return _BY_NAME[name] if name else None
