"""Accelerator specifications taken from vendor datasheets and architecture whitepapers.

Conventions for `DeviceSpec.peak_tflops` (TFLOPS, dense, i.e. *without* 2:4 sparsity):

* ``fp32``: the plain (non-tensor-core) FP32 vector/FMA peak.
* ``tf32``: TF32 tensor-core peak. GPUs without TF32 tensor cores (Volta, Turing) use the
  ``fp32`` value, because that is what an FP32 matmul runs at there. On AMD it is the FP32
  matrix-core (MFMA) peak for CDNA2 and the TF32 matrix peak for CDNA3.
* ``bf16`` / ``fp16`` / ``fp8``: tensor-core (NVIDIA) or matrix-core (AMD) peaks with FP32
  accumulation, which is what PyTorch's GEMMs use. This matters on GeForce cards, whose
  FP32-accumulate tensor rate is half the headline FP16-accumulate number.
* ``fp64``: FP64 tensor-core / matrix-core peak where the part has one (A100, H100, H200,
  B200, MI250X, MI300X), else the FP64 vector peak. Where a datasheet gives no FP64 number the
  value is derived from the architecture's FP64:FP32 ratio and the source says so.
* A key is absent when the hardware has no native support (no BF16 on Volta/Turing, no FP8
  before Ada/Hopper/CDNA3); `DeviceSpec.peak` then falls back to the rate the operation would
  actually run at.

Datasheets that only print sparsity figures (H100, H200, B200, L4, ...) were halved.

AMD MI250X / MI250 are described *per GCD*: the OAM package holds two Graphics Compute Dies and
ROCm exposes each one as a separate device, so one PyTorch process sees half of the card's
compute, memory capacity and memory bandwidth.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

DTYPES: tuple[str, ...] = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")

# When a dtype is missing, the rate the work really runs at: bf16 without bf16 units is done
# in fp32 math, fp8 without fp8 units gets upcast to 16-bit, tf32 is plain fp32.
_FALLBACK: dict[str, tuple[str, ...]] = {
    "fp64": (),
    "fp32": (),
    "tf32": ("fp32",),
    "bf16": ("fp32",),
    "fp16": ("fp32",),
    "fp8": ("bf16", "fp16", "fp32"),
}


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator as a single PyTorch device sees it."""

    name: str
    vendor: str
    peak_tflops: dict[str, float]
    mem_bw_gbs: float
    mem_gb: float
    sm_count: int | None  # SMs (NVIDIA) or compute units (AMD)
    source: str

    def __post_init__(self) -> None:
        unknown = set(self.peak_tflops) - set(DTYPES)
        if unknown:
            raise ValueError(f"{self.name}: unknown dtypes {sorted(unknown)}")
        if "fp32" not in self.peak_tflops:
            raise ValueError(f"{self.name}: fp32 peak is required")
        if any(v <= 0 for v in self.peak_tflops.values()):
            raise ValueError(f"{self.name}: peaks must be positive")
        if self.mem_bw_gbs <= 0 or self.mem_gb <= 0:
            raise ValueError(f"{self.name}: memory bandwidth and size must be positive")

    # The dict field makes the generated hash fail; name + vendor identify a spec.
    def __hash__(self) -> int:
        return hash((self.name, self.vendor))

    def peak(self, dtype: str) -> float:
        """Peak TFLOPS for `dtype`, falling back to the rate the math really runs at."""
        if dtype not in _FALLBACK:
            raise KeyError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
        for candidate in (dtype, *_FALLBACK[dtype]):
            if candidate in self.peak_tflops:
                return self.peak_tflops[candidate]
        raise KeyError(f"{self.name} has no {dtype} peak")


_V100_DS = "NVIDIA Tesla V100 GPU Accelerator datasheet, 2018"
_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet, 2021"
_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet, 2023 (sparsity figures halved)"

_DEVICES: tuple[DeviceSpec, ...] = (
    DeviceSpec(
        name="V100-SXM2-32GB",
        vendor="NVIDIA",
        peak_tflops={"fp64": 7.8, "fp32": 15.7, "tf32": 15.7, "fp16": 125.0},
        mem_bw_gbs=900.0,
        mem_gb=32.0,
        sm_count=80,
        source=_V100_DS + " (SXM2; the 16 GB SXM2 board has identical rates)",
    ),
    DeviceSpec(
        name="V100-PCIe-32GB",
        vendor="NVIDIA",
        peak_tflops={"fp64": 7.0, "fp32": 14.0, "tf32": 14.0, "fp16": 112.0},
        mem_bw_gbs=900.0,
        mem_gb=32.0,
        sm_count=80,
        source=_V100_DS + " (PCIe; the 16 GB PCIe board has identical rates)",
    ),
    DeviceSpec(
        name="V100S-PCIe-32GB",
        vendor="NVIDIA",
        peak_tflops={"fp64": 8.2, "fp32": 16.4, "tf32": 16.4, "fp16": 130.0},
        mem_bw_gbs=1134.0,
        mem_gb=32.0,
        sm_count=80,
        source="NVIDIA V100 Tensor Core GPU datasheet, 2020 (V100S PCIe column)",
    ),
    DeviceSpec(
        name="A100-SXM4-40GB",
        vendor="NVIDIA",
        peak_tflops={
            "fp64": 19.5,
            "fp32": 19.5,
            "tf32": 156.0,
            "bf16": 312.0,
            "fp16": 312.0,
        },
        mem_bw_gbs=1555.0,
        mem_gb=40.0,
        sm_count=108,
        source=_A100_DS + " (A100 40GB SXM; fp64 is the FP64 tensor-core rate)",
    ),
    DeviceSpec(
        name="A100-SXM4-80GB",
        vendor="NVIDIA",
        peak_tflops={
            "fp64": 19.5,
            "fp32": 19.5,
            "tf32": 156.0,
            "bf16": 312.0,
            "fp16": 312.0,
        },
        mem_bw_gbs=2039.0,
        mem_gb=80.0,
        sm_count=108,
        source=_A100_DS + " (A100 80GB SXM; fp64 is the FP64 tensor-core rate)",
    ),
    DeviceSpec(
        name="A100-PCIe-40GB",
        vendor="NVIDIA",
        peak_tflops={
            "fp64": 19.5,
            "fp32": 19.5,
            "tf32": 156.0,
            "bf16": 312.0,
            "fp16": 312.0,
        },
        mem_bw_gbs=1555.0,
        mem_gb=40.0,
        sm_count=108,
        source="NVIDIA A100 Tensor Core GPU datasheet, 2020 (A100 40GB PCIe)",
    ),
    DeviceSpec(
        name="A100-PCIe-80GB",
        vendor="NVIDIA",
        peak_tflops={
            "fp64": 19.5,
            "fp32": 19.5,
            "tf32": 156.0,
            "bf16": 312.0,
            "fp16": 312.0,
        },
        mem_bw_gbs=1935.0,
        mem_gb=80.0,
        sm_count=108,
        source=_A100_DS + " (A100 80GB PCIe)",
    ),
    DeviceSpec(
        name="H100-SXM5-80GB",
        vendor="NVIDIA",
        peak_tflops={
            "fp64": 67.0,
            "fp32": 67.0,
            "tf32": 494.5,
            "bf16": 989.5,
            "fp16": 989.5,
            "fp8": 1979.0,
        },
        mem_bw_gbs=3350.0,
        mem_gb=80.0,
        sm_count=132,
        source=_H100_DS + ", H100 SXM column",
    ),
    DeviceSpec(
        name="H100-PCIe-80GB",
        vendor="NVIDIA",
        peak_tflops={
            "fp64": 51.0,
            "fp32": 51.0,
            "tf32": 378.0,
            "bf16": 756.5,
            "fp16": 756.5,
            "fp8": 1513.0,
        },
        mem_bw_gbs=2000.0,
        mem_gb=80.0,
        sm_count=114,
        source=_H100_DS + ", H100 PCIe column",
    ),
    DeviceSpec(
        name="H100-NVL-94GB",
        vendor="NVIDIA",
        peak_tflops={
            "fp64": 60.0,
            "fp32": 60.0,
            "tf32": 417.5,
            "bf16": 835.5,
            "fp16": 835.5,
            "fp8": 1670.5,
        },
        mem_bw_gbs=3900.0,
        mem_gb=94.0,
        sm_count=132,
        source=_H100_DS + ", H100 NVL column (per GPU)",
    ),
    DeviceSpec(
        name="H200-SXM-141GB",
        vendor="NVIDIA",
        peak_tflops={
            "fp64": 67.0,
            "fp32": 67.0,
            "tf32": 494.5,
            "bf16": 989.5,
            "fp16": 989.5,
            "fp8": 1979.0,
        },
        mem_bw_gbs=4800.0,
        mem_gb=141.0,
        sm_count=132,
        source="NVIDIA H200 Tensor Core GPU datasheet, 2024 (H200 SXM; sparsity figures halved)",
    ),
    DeviceSpec(
        name="B200",
        vendor="NVIDIA",
        peak_tflops={
            "fp64": 40.0,
            "fp32": 80.0,
            "tf32": 1100.0,
            "bf16": 2250.0,
            "fp16": 2250.0,
            "fp8": 4500.0,
        },
        mem_bw_gbs=8000.0,
        mem_gb=180.0,
        sm_count=148,
        source=(
            "NVIDIA HGX B200 / DGX B200 datasheet, 2024 (1000 W HGX configuration; sparsity "
            "figures halved; 1,440 GB and 64 TB/s per 8-GPU system)"
        ),
    ),
    DeviceSpec(
        name="L4",
        vendor="NVIDIA",
        peak_tflops={
            "fp64": 0.47,
            "fp32": 30.3,
            "tf32": 60.0,
            "bf16": 121.0,
            "fp16": 121.0,
            "fp8": 242.5,
        },
        mem_bw_gbs=300.0,
        mem_gb=24.0,
        sm_count=58,
        source=(
            "NVIDIA L4 Tensor Core GPU datasheet, 2023 (sparsity figures halved; fp64 not in "
            "datasheet, derived from Ada's 1:64 FP64:FP32 ratio)"
        ),
    ),
    DeviceSpec(
        name="A10",
        vendor="NVIDIA",
        peak_tflops={"fp64": 0.98, "fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
        mem_bw_gbs=600.0,
        mem_gb=24.0,
        sm_count=72,
        source=(
            "NVIDIA A10 Tensor Core GPU datasheet, 2021 (fp64 not in datasheet, derived from "
            "GA102's 1:32 FP64:FP32 ratio)"
        ),
    ),
    DeviceSpec(
        name="RTX-2080-Ti",
        vendor="NVIDIA",
        peak_tflops={"fp64": 0.42, "fp32": 13.4, "tf32": 13.4, "fp16": 53.8},
        mem_bw_gbs=616.0,
        mem_gb=11.0,
        sm_count=68,
        source=(
            "NVIDIA Turing GPU Architecture whitepaper, 2018 (reference-clock RTX 2080 Ti; fp16 "
            "is the FP32-accumulate tensor rate, half the 107.6 FP16-accumulate figure; fp64 "
            "derived from the 1:32 ratio)"
        ),
    ),
    DeviceSpec(
        name="RTX-3090",
        vendor="NVIDIA",
        peak_tflops={"fp64": 0.56, "fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0},
        mem_bw_gbs=936.0,
        mem_gb=24.0,
        sm_count=82,
        source=(
            "NVIDIA Ampere GA102 GPU Architecture whitepaper, 2020 (RTX 3090; 16-bit rates are "
            "FP32-accumulate, half the FP16-accumulate figure; fp64 from the 1:64 ratio)"
        ),
    ),
    DeviceSpec(
        name="RTX-4090",
        vendor="NVIDIA",
        peak_tflops={
            "fp64": 1.29,
            "fp32": 82.6,
            "tf32": 82.6,
            "bf16": 165.2,
            "fp16": 165.2,
            "fp8": 330.3,
        },
        mem_bw_gbs=1008.0,
        mem_gb=24.0,
        sm_count=128,
        source=(
            "NVIDIA Ada GPU Architecture whitepaper, 2023 (RTX 4090; 16/8-bit rates are "
            "FP32-accumulate, half the FP16-accumulate figure; fp64 from the 1:64 ratio)"
        ),
    ),
    DeviceSpec(
        name="MI250X-GCD",
        vendor="AMD",
        peak_tflops={
            "fp64": 47.85,
            "fp32": 23.95,
            "tf32": 47.85,
            "bf16": 191.5,
            "fp16": 191.5,
        },
        mem_bw_gbs=1638.4,
        mem_gb=64.0,
        sm_count=110,
        source=(
            "AMD Instinct MI250X accelerator datasheet, 2021; one GCD = half the card "
            "(card: 95.7 FP64/FP32 matrix, 47.9 FP32 vector, 383 FP16/BF16, 128 GB, 3.2768 TB/s, "
            "220 CUs); tf32 is the FP32 matrix rate (CDNA2 has no TF32)"
        ),
    ),
    DeviceSpec(
        name="MI250-GCD",
        vendor="AMD",
        peak_tflops={
            "fp64": 45.25,
            "fp32": 22.65,
            "tf32": 45.25,
            "bf16": 181.05,
            "fp16": 181.05,
        },
        mem_bw_gbs=1638.4,
        mem_gb=64.0,
        sm_count=104,
        source=(
            "AMD Instinct MI250 accelerator datasheet, 2021; one GCD = half the card "
            "(card: 90.5 FP64/FP32 matrix, 45.3 FP32 vector, 362.1 FP16/BF16, 128 GB, "
            "3.2768 TB/s, 208 CUs); tf32 is the FP32 matrix rate"
        ),
    ),
    DeviceSpec(
        name="MI300X",
        vendor="AMD",
        peak_tflops={
            "fp64": 163.4,
            "fp32": 163.4,
            "tf32": 653.7,
            "bf16": 1307.4,
            "fp16": 1307.4,
            "fp8": 2614.9,
        },
        mem_bw_gbs=5300.0,
        mem_gb=192.0,
        sm_count=304,
        source=(
            "AMD Instinct MI300X accelerator datasheet, 2023 (dense matrix-core figures; fp32 "
            "is the 163.4 TFLOPS vector peak)"
        ),
    ),
)

_BY_NAME: dict[str, DeviceSpec] = {d.name: d for d in _DEVICES}

# Words that vendors put in front of the model in `cudaDeviceProp.name` / `hipDeviceProp.name`.
_VENDOR_WORDS = re.compile(
    r"\b(?:nvidia|tesla|geforce|quadro|amd|instinct|radeon|ati)\b|\((?:r|tm)\)|[®™]"
)

# Ordered (pattern, device) rules over the compacted name (lower case, alphanumerics only).
# More specific variants come first: "a100 80gb pcie" must not fall through to A100 SXM.
_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), device)
    for pattern, device in (
        (r"mi300x", "MI300X"),
        (r"mi250x", "MI250X-GCD"),  # also "AMD Instinct MI250X / MI250"
        (r"mi250", "MI250-GCD"),
        (r"b200", "B200"),  # also GB200, whose B200 runs ~10% faster (closest entry)
        (r"(?<!g)h200", "H200-SXM-141GB"),  # not GH200 (a variant, below)
        (r"h100.*pcie", "H100-PCIe-80GB"),
        (r"h100.*nvl", "H100-NVL-94GB"),
        (r"h100", "H100-SXM5-80GB"),  # "H100 80GB HBM3" is how the SXM part reports itself
        (r"a100.*pcie.*80|a100.*80.*pcie", "A100-PCIe-80GB"),
        (r"a100.*pcie", "A100-PCIe-40GB"),
        (r"a100.*(?:80gb|pg509210)", "A100-SXM4-80GB"),  # PG509-210: the 80GB SXM board
        (r"a100", "A100-SXM4-40GB"),  # incl. PG509-200, Meta's A100 40GB SXM board
        (r"^a10(?![0-9g])", "A10"),  # not A100, not the lower-clocked AWS A10G
        (r"^l4(?![0-9])", "L4"),  # not L40 / L40S
        (r"v100s(?!xm)", "V100S-PCIe-32GB"),  # not "V100-SXM2"
        (r"v100.*pcie", "V100-PCIe-32GB"),
        (r"v100", "V100-SXM2-32GB"),
        (r"2080ti", "RTX-2080-Ti"),
        (r"^(?:rtx)?3090(?!ti)", "RTX-3090"),
        (r"^(?:rtx)?4090(?![a-z])", "RTX-4090"),
    )
)


def _compact(name: str) -> str:
    text = _VENDOR_WORDS.sub(" ", name.lower())
    return re.sub(r"[^a-z0-9]+", "", text)


def convs_in_tf32(dev: DeviceSpec | None) -> bool:
    """Does cuDNN run this GPU's fp32 convolutions in TF32 by default
    (`torch.backends.cudnn.allow_tf32`)? Only with TF32 tensor cores (NVIDIA Ampere and
    newer: a TF32 peak above the fp32 one); Volta and Turing have none, and on ROCm the
    convolutions are MIOpen's, in fp32."""
    return dev is not None and dev.vendor == "NVIDIA" and dev.peak("tf32") > dev.peak("fp32")


def lookup_device(name: str) -> DeviceSpec | None:
    """Find the spec for a device name as written in a trace or typed by a user.

    Accepts `deviceProperties[].name` strings ("Tesla V100-SXM2-32GB", "NVIDIA H100 80GB HBM3",
    "AMD Instinct MI250X / MI250"), this module's canonical names, and short aliases ("h100",
    "a100-80gb", "rtx4090"). Matching ignores case, punctuation and vendor words. Returns None
    for unknown parts rather than guessing; ROCm gfx architecture names are not accepted
    because one gfx target covers several products.
    """
    if name in _BY_NAME:
        return _BY_NAME[name]
    key = _compact(name)
    if not key:
        return None
    for pattern, device in _RULES:
        if pattern.search(key):
            return _BY_NAME[device]
    return None


# Parts missing from the table that are variants of one in it, with what differs and the
# intra-node link they use when it is not the base part's. Used only when a name matches
# nothing else, and always stated in the prediction's assumptions.
_VARIANTS: tuple[tuple[re.Pattern[str], str, str, str | None], ...] = tuple(
    (re.compile(pattern), device, why, link)
    for pattern, device, why, link in (
        (
            r"h800",
            "H100-SXM5-80GB",
            "the H800 is the H100 SXM with NVLink cut to 400 GB/s (both directions); compute "
            "and memory as H100",
            "nvlink4-h800",
        ),
        (
            r"a800",
            "A100-SXM4-80GB",
            "the A800 is the A100 with NVLink cut to 400 GB/s (both directions); compute and "
            "memory as A100 80GB",
            "nvlink3-a800",
        ),
        (
            r"gh200",
            "H100-SXM5-80GB",
            "the GH200's GPU is an H100 with 96 GB (HBM3) or 144 GB (HBM3e) and a faster "
            "clock; its memory is read as the H100 SXM's 80 GB",
            None,
        ),
    )
)


def nearest_device(name: str) -> tuple[DeviceSpec, str] | None:
    """A known part standing in for an unknown name, and why; None when nothing is near."""
    key = _compact(name)
    for pattern, device, why, _ in _VARIANTS:
        if key and pattern.search(key):
            return _BY_NAME[device], f"'{name}' is not in the device table: {why}"
    return None


def lookup_or_nearest(name: str) -> tuple[DeviceSpec, str | None] | None:
    """The spec for `name` (`lookup_device`), else the known part standing in for a variant
    of it with why (`nearest_device`); None when neither knows it."""
    spec = lookup_device(name)
    if spec is not None:
        return spec, None
    return nearest_device(name)


def variant_link(name: str) -> str | None:
    """The intra-node link of a variant part whose link differs from its base part's (the
    H800's and A800's cut NVLink), by the link table's name; None for other names."""
    if lookup_device(name) is not None:
        return None
    key = _compact(name)
    for pattern, _, _, link in _VARIANTS:
        if key and pattern.search(key):
            return link
    return None


_GIB = 1 << 30


def lookup_device_properties(props: Mapping[str, object]) -> DeviceSpec | None:
    """Spec for one `deviceProperties[]` entry of a Kineto trace.

    Tries the name first. Some ROCm builds report every GPU as "AMD Radeon Graphics"; for
    those (AMD or empty names only) the compute-unit count `numSms` and `totalGlobalMem` pick
    the device when exactly one AMD entry has that CU count and a memory size within 10 %.
    NVIDIA names are never guessed from counts: e.g. an H800 would pass as an H100.
    """
    name = props.get("name")
    name = name if isinstance(name, str) else ""
    found = lookup_device(name) if name else None
    if found is not None or not (name == "" or re.search(r"amd|radeon", name, re.I)):
        return found
    sms, mem = props.get("numSms"), props.get("totalGlobalMem")
    if not isinstance(sms, (int, float)) or not isinstance(mem, (int, float)) or mem <= 0:
        return None
    mem_gib = mem / _GIB  # vendors' "GB" capacities are binary in practice (80 GB = 80 GiB)
    matches = [
        d
        for d in _DEVICES
        if d.vendor == "AMD" and d.sm_count == sms and abs(d.mem_gb - mem_gib) <= 0.1 * d.mem_gb
    ]
    return matches[0] if len(matches) == 1 else None


def list_devices() -> list[DeviceSpec]:
    """All known devices, in table order (oldest NVIDIA first, AMD last)."""
    return list(_DEVICES)


def known_devices_text() -> str:
    """The GPUs a device option accepts, for an error's hint."""
    return "known: " + ", ".join(d.name for d in _DEVICES)
