"""perfcast.hardware: device/link tables, collective cost models, kernel classification."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from perfcast.hardware import (
    DTYPES,
    DeviceSpec,
    KernelClass,
    LinkSpec,
    allgather_time_us,
    allreduce_time_us,
    alltoall_time_us,
    broadcast_time_us,
    bus_bandwidth_factor,
    bus_bandwidth_gbs,
    classify_kernel,
    classify_names,
    collective_from_kernel_name,
    collective_time_us,
    default_intra_node_link,
    dtype_from_kernel_name,
    gemm_flops_bytes,
    is_compute_bound_class,
    list_devices,
    list_links,
    lookup_device,
    lookup_device_properties,
    lookup_link,
    reduce_scatter_time_us,
    reduce_time_us,
    roofline_time_us,
    sendrecv_time_us,
)

# ---------------------------------------------------------------------------------------------
# devices


def _device(name: str) -> DeviceSpec:
    spec = lookup_device(name)
    assert spec is not None, name
    return spec


@pytest.mark.parametrize("spec", list_devices(), ids=lambda d: d.name)
def test_device_fields_are_complete(spec: DeviceSpec) -> None:
    assert spec.name and spec.vendor in ("NVIDIA", "AMD")
    assert spec.source.strip()
    assert spec.mem_bw_gbs > 0 and spec.mem_gb > 0
    assert spec.sm_count is not None and spec.sm_count > 0
    assert set(spec.peak_tflops) <= set(DTYPES)
    assert {"fp32", "tf32", "fp16"} <= set(spec.peak_tflops)
    assert all(v > 0 for v in spec.peak_tflops.values())
    # Tensor/matrix units never lose to the vector unit; tf32 equals fp32 where absent.
    assert spec.peak_tflops["tf32"] >= spec.peak_tflops["fp32"]
    assert spec.peak_tflops["fp16"] > spec.peak_tflops["tf32"]
    if "fp8" in spec.peak_tflops:
        assert spec.peak_tflops["fp8"] == pytest.approx(2 * spec.peak_tflops["fp16"], rel=0.01)
    # Every canonical name finds itself again.
    assert lookup_device(spec.name) is spec


def test_device_names_unique_and_hashable() -> None:
    specs = list_devices()
    assert len({d.name for d in specs}) == len(specs)
    assert len(set(specs)) == len(specs)


def test_device_datasheet_numbers() -> None:
    h100 = _device("h100")
    assert h100.peak_tflops["bf16"] == pytest.approx(989, rel=2e-3)
    assert h100.peak_tflops["fp8"] == pytest.approx(1979, rel=2e-3)
    assert h100.mem_bw_gbs == pytest.approx(3350)
    a100_40, a100_80 = _device("A100-SXM4-40GB"), _device("A100-SXM4-80GB")
    assert a100_40.peak_tflops["bf16"] == a100_80.peak_tflops["bf16"] == 312
    assert a100_40.peak_tflops["tf32"] == 156
    assert (a100_40.mem_bw_gbs, a100_80.mem_bw_gbs) == (1555, 2039)
    v100 = _device("v100")
    assert (v100.peak_tflops["fp16"], v100.peak_tflops["fp32"], v100.mem_bw_gbs) == (
        125,
        15.7,
        900,
    )
    assert "bf16" not in v100.peak_tflops and v100.peak_tflops["tf32"] == 15.7
    assert _device("b200").peak_tflops["bf16"] == 2250
    assert _device("mi300x").peak_tflops["bf16"] == pytest.approx(1307.4)


def test_mi250x_is_described_per_gcd() -> None:
    gcd = _device("AMD Instinct MI250X")
    assert gcd.peak_tflops["fp16"] * 2 == pytest.approx(383, rel=1e-3)
    assert gcd.mem_gb * 2 == 128
    assert gcd.mem_bw_gbs * 2 == pytest.approx(3276.8)
    assert "GCD" in gcd.name and "half" in gcd.source


@pytest.mark.parametrize(
    ("trace_name", "expected"),
    [
        ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),
        ("Tesla V100-SXM2-16GB", "V100-SXM2-32GB"),
        ("Tesla V100-PCIE-16GB", "V100-PCIe-32GB"),
        ("Tesla V100S-PCIE-32GB", "V100S-PCIe-32GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("NVIDIA A100-PG509-200", "A100-SXM4-40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
        ("NVIDIA H100 PCIe", "H100-PCIe-80GB"),
        ("NVIDIA H100 NVL", "H100-NVL-94GB"),
        ("NVIDIA H200", "H200-SXM-141GB"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA GeForce RTX 2080 Ti", "RTX-2080-Ti"),
        ("NVIDIA GeForce RTX 3090", "RTX-3090"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI250X / MI250", "MI250X-GCD"),
        ("AMD Instinct MI250X", "MI250X-GCD"),
        ("AMD Instinct MI250", "MI250-GCD"),
        # user aliases
        ("h100", "H100-SXM5-80GB"),
        ("a100", "A100-SXM4-40GB"),
        ("a100-80gb", "A100-SXM4-80GB"),
        ("A100_80GB", "A100-SXM4-80GB"),
        ("v100", "V100-SXM2-32GB"),
        ("mi300x", "MI300X"),
        ("b200", "B200"),
        ("rtx4090", "RTX-4090"),
        ("nvidia h100 80gb hbm3", "H100-SXM5-80GB"),
    ],
)
def test_lookup_device_trace_strings(trace_name: str, expected: str) -> None:
    assert _device(trace_name).name == expected


@pytest.mark.parametrize(
    "name",
    [
        "",
        "NVIDIA L40S",
        "NVIDIA A10G",
        "NVIDIA GeForce RTX 3090 Ti",
        "Intel Arc A770",
        "AMD Instinct MI300A",
        "cpu",
    ],
)
def test_lookup_device_unknown(name: str) -> None:
    assert lookup_device(name) is None


def test_lookup_device_properties() -> None:
    # hta_mi250_minitoy_train: ROCm named the GCD generically; CU count and memory identify it
    mi250 = {"name": "AMD Radeon Graphics", "numSms": 104, "totalGlobalMem": 68702699520}
    assert _name(lookup_device_properties(mi250)) == "MI250-GCD"
    mi250x = {"name": "AMD Radeon Graphics", "numSms": 110, "totalGlobalMem": 68702699520}
    assert _name(lookup_device_properties(mi250x)) == "MI250X-GCD"
    h100 = {"name": "NVIDIA H100 80GB HBM3", "numSms": 132}
    assert _name(lookup_device_properties(h100)) == "H100-SXM5-80GB"
    # NVIDIA parts are never guessed from counts
    assert (
        lookup_device_properties({"name": "NVIDIA H800", "numSms": 132, "totalGlobalMem": 8e10})
        is None
    )
    assert lookup_device_properties({"name": "AMD Radeon Graphics", "numSms": 104}) is None
    assert lookup_device_properties({}) is None


def _name(spec: DeviceSpec | None) -> str | None:
    return None if spec is None else spec.name


def test_peak_fallbacks() -> None:
    v100 = _device("v100")
    assert v100.peak("bf16") == v100.peak_tflops["fp32"]  # no bf16 units: fp32 math
    a100 = _device("a100")
    assert a100.peak("fp8") == a100.peak_tflops["bf16"]  # no fp8 units: 16-bit math
    with pytest.raises(KeyError):
        a100.peak("int4")


def test_device_spec_validation() -> None:
    with pytest.raises(ValueError):
        DeviceSpec("x", "NVIDIA", {"fp32": 0.0}, 1.0, 1.0, 1, "s")
    with pytest.raises(ValueError):
        DeviceSpec("x", "NVIDIA", {"fp32": 1.0, "int8": 2.0}, 1.0, 1.0, 1, "s")
    with pytest.raises(dataclasses.FrozenInstanceError):
        _device("h100").mem_gb = 1.0  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# interconnects


@pytest.mark.parametrize("link", list_links(), ids=lambda link: link.name)
def test_link_fields(link: LinkSpec) -> None:
    assert link.bw_gbs_per_direction > 0 and link.latency_us > 0
    assert link.source.strip() and "assum" in link.source  # latencies are assumptions
    assert lookup_link(link.name) is link


@pytest.mark.parametrize(
    ("alias", "expected", "bw"),
    [
        ("PCIe Gen3 x16", "pcie3", 15.75),
        ("pcie4", "pcie4", 31.5),
        ("PCIe 5.0", "pcie5", 63.0),
        ("pcie6", "pcie6", 121.0),
        ("NVLink 2", "nvlink2", 150.0),
        ("nvlink-a100", "nvlink3", 300.0),
        ("NVLink4", "nvlink4", 450.0),
        ("nvlink5", "nvlink5", 900.0),
        ("InfiniBand HDR", "ib-hdr", 25.0),
        ("IB-NDR", "ib-ndr", 50.0),
        ("edr", "ib-edr", 12.5),
        ("xdr", "ib-xdr", 100.0),
        ("400GbE", "400gbe", 50.0),
        ("100GbE", "100gbe", 12.5),
        ("xGMI MI300X", "infinity-fabric-mi300x", 448.0),
        ("Infinity Fabric MI250X", "infinity-fabric-mi250x", 100.0),
    ],
)
def test_lookup_link(alias: str, expected: str, bw: float) -> None:
    link = lookup_link(alias)
    assert link is not None and link.name == expected
    assert link.bw_gbs_per_direction == pytest.approx(bw)


def test_lookup_link_unknown() -> None:
    assert lookup_link("carrier pigeon") is None


@pytest.mark.parametrize(
    ("device", "link"),
    [
        ("Tesla V100-SXM2-32GB", "nvlink2"),
        ("NVIDIA A100-SXM4-80GB", "nvlink3"),
        ("NVIDIA A100-PCIE-40GB", "pcie4"),
        ("NVIDIA H100 80GB HBM3", "nvlink4"),
        ("NVIDIA H100 PCIe", "pcie5"),
        ("NVIDIA B200", "nvlink5"),
        ("NVIDIA GeForce RTX 4090", "pcie4"),
        ("AMD Instinct MI300X", "infinity-fabric-mi300x"),
        ("AMD Instinct MI250X", "infinity-fabric-mi250x"),
    ],
)
def test_default_intra_node_link(device: str, link: str) -> None:
    assert default_intra_node_link(_device(device)).name == link


def test_default_intra_node_link_unknown_device() -> None:
    custom = DeviceSpec("Custom", "NVIDIA", {"fp32": 1.0}, 100.0, 8.0, None, "made up")
    assert default_intra_node_link(custom).name == "pcie4"


# ---------------------------------------------------------------------------------------------
# collectives: alpha = 5 us, B = 100 GB/s = 1e5 bytes/us

LINK = LinkSpec("test", bw_gbs_per_direction=100.0, latency_us=5.0, source="test")


def test_allreduce_ring_hand_computed() -> None:
    # 2*(8-1) steps of (5 + (1e9/8)/1e5) = 14 * 1255
    assert allreduce_time_us(1e9, 8, LINK) == pytest.approx(17570.0)
    assert allreduce_time_us(1e9, 8, LINK, algorithm="ring") == pytest.approx(17570.0)


def test_allreduce_tree_hand_computed() -> None:
    # 2*log2(8)*5 + 1e9/1e5
    assert allreduce_time_us(1e9, 8, LINK, algorithm="tree") == pytest.approx(10030.0)
    # 6 ranks: tree depth ceil(log2 6) = 3
    assert allreduce_time_us(1e9, 6, LINK, algorithm="tree") == pytest.approx(10030.0)
    # 2 ranks: 2*1*5 + 1e4
    assert allreduce_time_us(1e9, 2, LINK, algorithm="tree") == pytest.approx(10010.0)


def test_allgather_reduce_scatter_hand_computed() -> None:
    # ring: 3 * (5 + 2e6/1e5) = 75
    assert allgather_time_us(8e6, 4, LINK) == pytest.approx(75.0)
    assert reduce_scatter_time_us(8e6, 4, LINK) == pytest.approx(75.0)
    # recursive doubling/halving: 2*5 + 0.75*8e6/1e5 = 70
    assert allgather_time_us(8e6, 4, LINK, "recursive_doubling") == pytest.approx(70.0)
    assert reduce_scatter_time_us(8e6, 4, LINK, "recursive_halving") == pytest.approx(70.0)


def test_broadcast_reduce_alltoall_sendrecv_hand_computed() -> None:
    assert broadcast_time_us(1e6, 4, LINK) == pytest.approx(3 * 5 + 10)
    assert broadcast_time_us(1e6, 4, LINK, algorithm="tree") == pytest.approx(2 * (5 + 10))
    assert reduce_time_us(1e6, 4, LINK) == pytest.approx(25.0)
    # 3 * (5 + 1e6/1e5)
    assert alltoall_time_us(4e6, 4, LINK) == pytest.approx(45.0)
    assert sendrecv_time_us(1e6, LINK) == pytest.approx(15.0)


def test_allreduce_is_reduce_scatter_plus_allgather() -> None:
    for n in (2, 3, 8, 64):
        total = reduce_scatter_time_us(3e8, n, LINK) + allgather_time_us(3e8, n, LINK)
        assert allreduce_time_us(3e8, n, LINK) == pytest.approx(total)


@pytest.mark.parametrize(
    "fn",
    [
        allreduce_time_us,
        allgather_time_us,
        reduce_scatter_time_us,
        broadcast_time_us,
        alltoall_time_us,
        reduce_time_us,
    ],
)
def test_single_rank_and_empty_cost_nothing(fn: Callable[..., float]) -> None:
    assert fn(1e9, 1, LINK) == 0.0
    assert fn(0, 8, LINK) == 0.0
    with pytest.raises(ValueError):
        fn(1e6, 0, LINK)
    with pytest.raises(ValueError):
        fn(-1, 4, LINK)


def test_unknown_algorithm() -> None:
    with pytest.raises(ValueError):
        allreduce_time_us(1e6, 4, LINK, algorithm="butterfly")


def test_bus_bandwidth_factor() -> None:
    assert bus_bandwidth_factor("allreduce", 8) == pytest.approx(1.75)
    assert bus_bandwidth_factor("all_reduce", 1) == 0.0
    for name in (
        "allgather",
        "AllGather",
        "reduce_scatter",
        "reducescatter",
        "alltoall",
        "all_to_all",
    ):
        assert bus_bandwidth_factor(name, 8) == pytest.approx(0.875)
    for name in ("broadcast", "reduce", "sendrecv"):
        assert bus_bandwidth_factor(name, 8) == 1.0
    with pytest.raises(ValueError):
        bus_bandwidth_factor("gossip", 8)


def test_ring_allreduce_busbw_equals_link_bw_without_latency() -> None:
    link = dataclasses.replace(LINK, latency_us=0.0)
    nbytes, n = 1 << 30, 8
    t = allreduce_time_us(nbytes, n, link)
    assert bus_bandwidth_gbs("allreduce", nbytes, t, n) == pytest.approx(100.0)
    t = allgather_time_us(nbytes, n, link)
    assert bus_bandwidth_gbs("allgather", nbytes, t, n) == pytest.approx(100.0)


def test_collective_dispatch_and_kernel_names() -> None:
    assert collective_time_us("all_reduce", 1e9, 8, LINK) == allreduce_time_us(1e9, 8, LINK)
    assert collective_time_us("AllReduce", 1e9, 8, LINK, "tree") == pytest.approx(10030.0)
    assert collective_time_us("sendrecv", 1e6, 2, LINK) == pytest.approx(15.0)
    names = {
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)": (
            "allreduce"
        ),
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "allgather",
        "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)": (
            "reducescatter"
        ),
        "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "broadcast",
        "ncclDevKernel_Reduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "reduce",
        "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)": "sendrecv",
        "nccl:_all_gather_base": "allgather",
        "nccl:all_to_all": "alltoall",
        "ncclDevKernel_Generic(ncclDevComm*, channelMasks, ncclWork*)": None,
    }
    for name, expected in names.items():
        assert collective_from_kernel_name(name) == expected, name


def test_realistic_nvlink_allreduce() -> None:
    # 1 GiB over 8 H100s: bandwidth term 2*7/8 * 2^30 / 450e3 us ~ 4175 us, plus 14 hops
    link = _link("nvlink4")
    expected = 2 * 7 / 8 * (1 << 30) / 450e3 + 14 * link.latency_us
    assert allreduce_time_us(1 << 30, 8, link) == pytest.approx(expected)


def _link(name: str) -> LinkSpec:
    link = lookup_link(name)
    assert link is not None
    return link


# ---------------------------------------------------------------------------------------------
# kernel classification

# Real kernel names from CUDA and ROCm traces (long template argument lists trimmed).
KERNELS_BY_CLASS: dict[KernelClass, list[str]] = {
    KernelClass.MATMUL: [
        "volta_sgemm_128x64_nn",
        "ampere_sgemm_128x64_nn",
        "volta_h884gemm_64x64_ldg8_nn",
        "turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_tn",
        "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn",
        "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4"
        "_alignc4_execute_kernel__5x_cublas",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_se"
        "gment_k_off_kernel__5x_cublas",
        "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT",
        "void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_nn_align8>("
        "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_nn_align8::Params)",
        "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0_APM1_ABV0_ACED0_AF0EM1_AF1EM1_AM"
        "AS3_ASE_ASGT_ASAE01_ASCE01_ASEM1_AAC0_BL1_BS1_GRVW8_GSU1_ISA90a_IU1_K1_WG32_4_1_WGM8",
        "Cijk_Alik_Bljk_BBS_BH_MT256x256x64_MI32x32x8x1_SN_1LDSB1_GRVW8_GSU1_ISA942_WG32_8_1",
        "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, "
        "false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, "
        "float> >(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, "
        "float>, float, float)",
        "triton_tem_fused_addmm_0",
    ],
    KernelClass.CONV: [
        "void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, "
        "true>(int, int, int, float const*, int, float*, float const*, kernel_conv_params, "
        "unsigned long long, int, float, float, int, float const*, float const*, bool, int, int)",
        "sm86_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x1"
        "6_stage4_warpsize2x2x1_g1_tensor16x8x8_kernel",
        "sm80_xmma_dgrad_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_"
        "stage4_warpsize2x2x1_g1_tensor16x8x16_kernel",
        "void cudnn::cnn::wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int, int, int, "
        "float const*, int, float*, float const*, kernel_grad_params, unsigned long long, int, "
        "float, int, int, int, int)",
        "void cudnn::winograd_nonfused::winogradForwardData4x4<float, "
        "float>(cudnn::winograd_nonfused::WinogradDataParams<float, float>)",
        "volta_scudnn_128x64_relu_interior_nn_v1",
        "void fft2d_r2c_32x32<float, false, 1u, false>(float2*, float const*, int, int, int, int, "
        "int, int, int, int, int, cudnn::reduced_divisor, bool, int2, int, int)",
        "miopenSp3AsmConv_v21_1_3_gfx9_fp32_stride1",
        "igemm_fwd_gtcx_nhwc_fp16_bx0_ex0_bt128x128x32_wt32x32x8_ws2x1_wr2x2_ta1x8x2x1_1x4x1x64_tb"
        "1x8x2x1_1x4x1x64",
        "triton_tem_fused_convolution_0",
    ],
    KernelClass.ATTENTION: [
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, "
        "false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, "
        "false, true, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)",
        "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<"
        "128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t>, true, false, false, false, "
        "false, false, false>(pytorch_flash::Flash_bwd_params)",
        "fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::"
        "half_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel"
        "0_0",
        "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::Co"
        "llectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, 128, "
        "cutlass::bfloat16_t, float, cutlass::arch::Sm90> > > >(flash::Params)",
        "_attn_fwd",
    ],
    KernelClass.COMMUNICATION: [
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
        "ncclDevKernel_Generic(ncclDevComm*, channelMasks, ncclWork*)",
    ],
    KernelClass.ELEMENTWISE: [
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
        "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, "
        "at::detail::Array<char*, 3>)",
        "void at::native::unrolled_elementwise_kernel<at::native::MulFunctor<float>, "
        "at::detail::Array<char*, 3>, TrivialOffsetCalculator<2, unsigned int>, "
        "TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<2>, "
        "at::native::memory::StoreWithCast<1> >(int, at::native::MulFunctor<float>, "
        "at::detail::Array<char*, 3>, TrivialOffsetCalculator<2, unsigned int>, "
        "TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<2>, "
        "at::native::memory::StoreWithCast<1>)",
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native"
        "::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > "
        ">(at::TensorIteratorBase&, at::native::BinaryFunctor<float, float, float, "
        "at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1}>(int, "
        "at::native::gpu_kernel_impl_nocast<...>::{lambda(int)#1})",
        "void at::native::vectorized_elementwise_kernel<4, "
        "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
        "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() "
        "const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, "
        "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
        "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() "
        "const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)",
        "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float, float, unsigned "
        "int, 1, 4, bool>(at::cuda::detail::TensorInfo<float const, unsigned int>, "
        "at::cuda::detail::TensorInfo<float, unsigned int>, at::cuda::detail::TensorInfo<bool, "
        "unsigned int>, unsigned int, float, at::PhiloxCudaState)",
        "triton_poi_fused_add_mul_0",
        "triton_poi_fused__scaled_dot_product_efficient_attention_0",
    ],
    KernelClass.REDUCTION: [
        # cuBLAS's split-K helper only sums partial products: memory-bound, not a GEMM.
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, "
        "__nv_bfloat16, true, false, false>(cublasLt::cublasSplitKParams<float>, float const*, "
        "__nv_bfloat16 const*, __nv_bfloat16*, float const*, float const*, __nv_bfloat16 const*, "
        "float const*, __nv_bfloat16*, void*, long, float*, int*)",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
        "at::native::func_wrapper_t<float, at::native::sum_functor<float, float, "
        "float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, "
        "4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(fl"
        "oat, float)#1}>, unsigned int, float, 4>)",
        "triton_red_fused_sum_0",
        "triton_per_fused_mean_1",
        "void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>(int, float "
        "const*, long, long, long, int, int, int, int, int, int, int, int, int, int, float*, "
        "long*)",
        "void cudnn::pooling_fw_4d_kernel<float, float, cudnn::maxpooling_func<float, "
        "(cudnnNanPropagation_t)0>, 0, false>(cudnnTensorStruct, float const*, cudnnTensorStruct, "
        "float*, cudnnPoolingStruct, float, float, int, cudnn::reduced_divisor, "
        "cudnn::reduced_divisor)",
        "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, "
        "float, long>(float*, float*, float const*, long const*, float const*, bool, long, long, "
        "long, long)",
    ],
    KernelClass.NORM: [
        "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 32, true, 1>(float, float, "
        "float, float, cudnnTensorStruct, float const*, cudnnTensorStruct, float const*, "
        "cudnnTensorStruct, float*, float const*, float*, float*, float const*, float const*, "
        "float)",
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, "
        "1>(cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, float "
        "const*, float, float, float*, float*, float*, float*, float, float)",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, "
        "float, float const*, float const*, float const*, float*, float*, float*)",
        "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>(long, "
        "long, float const*, float const*, float const*, float const*, float*, float*)",
        "void at::native::batch_norm_collect_statistics_kernel<at::native::InvStd, float, float, "
        "float, int>(at::GenericPackedTensorAccessor<float const, 3, at::RestrictPtrTraits, int>, "
        "float, float, at::GenericPackedTensorAccessor<float, 1, at::RestrictPtrTraits, int>, "
        "at::GenericPackedTensorAccessor<float, 1, at::RestrictPtrTraits, int>)",
        "void cuApplyRMSNorm<c10::BFloat16, float, c10::BFloat16>(c10::BFloat16*, float*, "
        "c10::BFloat16 const*, int, int, float, c10::BFloat16 const*)",
        "MIOpenBatchNormFwdTrainSpatial",
        "triton_red_fused_native_layer_norm_0",
    ],
    KernelClass.SOFTMAX: [
        "void at::native::(anonymous namespace)::softmax_warp_forward<c10::Half, c10::Half, "
        "float, 10, false, false>(c10::Half*, c10::Half const*, int, int, int, bool const*, int, "
        "bool)",
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)",
        "triton_per_fused__softmax_0",
    ],
    KernelClass.COPY: [
        "Memcpy HtoD (Pageable -> Device)",
        "Memcpy DtoD (Device -> Device)",
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 4, 64, "
        "64>(float*, at::native::(anonymous namespace)::CatArrInputTensorMetadata<float, unsigned "
        "int, 64, 64>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, "
        "int, unsigned int)",
        "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native"
        "::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() "
        "const::{lambda()#7}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, "
        "...)::{lambda(int)#1}>(int, ...)",
        "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, "
        "(cudnnKernelDataType_t)2>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, float "
        "const*, float*)",
        "__amd_rocclr_copyBuffer",
    ],
    KernelClass.MEMSET: [
        "Memset (Device)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, "
        "at::detail::Array<char*, 1>)",
        "__amd_rocclr_fillBufferAligned",
    ],
    KernelClass.EMBEDDING: [
        "void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, "
        "2, 2, -2, true>(at::cuda::detail::TensorInfo<float, unsigned int>, "
        "at::cuda::detail::TensorInfo<float const, unsigned int>, "
        "at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, unsigned "
        "int, long)",
        "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float, float, "
        "long>(long const*, float const*, float*, int, long, int, int)",
        "void at::native::(anonymous namespace)::EmbeddingBag_updateOutputKernel_sum_mean<float, "
        "long>(long const*, long const*, float const*, float*, long*, long, long, long, long, "
        "float const*, long)",
        "void fbgemm_gpu::batch_index_select_dim0_codegen_forward_kernel<float, float, long, 64, "
        "4>(...)",
    ],
    KernelClass.OPTIMIZER: [
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
        "namespace)::TensorListMetadata<4>, at::native::(anonymous "
        "namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double, "
        "double, double, double, double, double, bool, double*, double*>(at::native::(anonymous "
        "namespace)::TensorListMetadata<4>, ...)",
        "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float, float, "
        "float, float, float, float, adamMode_t, float>(long, int volatile*, "
        "TensorListMetadata<4>, AdamFunctor<float>, float, float, float, float, float, float, "
        "adamMode_t, float)",
        "void at::native::amp_update_scale_cuda_kernel<float>(float*, int*, float const*, double, "
        "double, int)",
    ],
    KernelClass.OTHER: [
        "void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<long, long, unsigned "
        "long, unsigned int>::Policy800, false, long, long, unsigned long, int, int>(int*, int*, "
        "unsigned long*, unsigned int const*, long*, long const*, long*, long const*, int, int, "
        "int)",
        "my_custom_kernel",
    ],
}
KERNELS: list[tuple[str, KernelClass]] = [
    (name, cls) for cls, names in KERNELS_BY_CLASS.items() for name in names
]


def test_kernel_list_is_large_enough() -> None:
    assert len(KERNELS) >= 40
    assert {cls for _, cls in KERNELS} == set(KernelClass)


@pytest.mark.parametrize(("name", "expected"), KERNELS, ids=[n[:60] for n, _ in KERNELS])
def test_classify_kernel(name: str, expected: KernelClass) -> None:
    assert classify_kernel(name) is expected


def test_classify_names_vectorized() -> None:
    names = [n for n, _ in KERNELS] * 3
    out = classify_names(names)
    assert out.dtype == np.int8 and out.shape == (len(names),)
    assert out.tolist() == [int(c) for _, c in KERNELS] * 3
    assert classify_names(iter(["Memset (Device)"])).tolist() == [int(KernelClass.MEMSET)]
    assert classify_names([]).shape == (0,)


def test_is_compute_bound_class() -> None:
    bound = {cls for cls in KernelClass if is_compute_bound_class(cls)}
    assert bound == {KernelClass.MATMUL, KernelClass.CONV, KernelClass.ATTENTION}
    assert is_compute_bound_class(int(KernelClass.CONV))


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("volta_sgemm_128x64_nn", "fp32"),
        ("ampere_sgemm_128x64_nn", "fp32"),
        ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_ffma", "fp32"),
        ("sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16_stage4", "tf32"),
        ("ampere_tf32_s1688gemm_tf32_128x128_ldg8_f2f_stages_32x3_nt", "tf32"),
        ("volta_h884gemm_64x64_ldg8_nn", "fp16"),
        ("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_tn", "fp16"),
        ("fmha_cutlassF_f16_aligned_64x64_rf_sm80", "fp16"),
        (
            "void at::native::(anonymous namespace)::softmax_warp_forward<c10::Half, c10::Half, "
            "float, 10, false, false>",
            "fp16",
        ),
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn", "bf16"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "bf16"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<"
            "c10::BFloat16>, at::detail::Array<char*, 3> >",
            "bf16",
        ),
        (
            "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, "
            "false, cutlass::bfloat16_t>>",
            "bf16",
        ),
        ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_bf16_tn_n_tilesize128x128x128", "fp8"),
        ("void fp8_quantize_kernel<__nv_fp8_e5m2>", "fp8"),
        ("volta_dgemm_64x64_nn", "fp64"),
        ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN", "fp16"),
        ("Cijk_Alik_Bljk_BBS_BH_MT256x256x64_MI32x32x8x1_SN", "bf16"),
        ("Cijk_Ailk_Bljk_SB_MT64x64x8_SN", "fp32"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT", "bf16"),
        ("nvjet_hsh_64x8_64x16_4x1_v_bz_splitK_TNT", "fp16"),
        ("Memset (Device)", None),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", None),
    ],
)
def test_dtype_from_kernel_name(name: str, dtype: str | None) -> None:
    assert dtype_from_kernel_name(name) == dtype


# ---------------------------------------------------------------------------------------------
# roofline


def test_gemm_flops_bytes() -> None:
    flops, nbytes = gemm_flops_bytes(128, 256, 64, 2)
    assert flops == 2 * 128 * 256 * 64
    assert nbytes == (128 * 64 + 64 * 256 + 128 * 256) * 2
    flops_b, nbytes_b = gemm_flops_bytes(128, 256, 64, 2, batch=4)
    assert (flops_b, nbytes_b) == (4 * flops, 4 * nbytes)


def test_roofline_compute_bound_gemm() -> None:
    h100 = _device("h100")
    flops, nbytes = gemm_flops_bytes(8192, 8192, 8192, 2)
    t = roofline_time_us(flops, nbytes, h100, "bf16")
    assert t == pytest.approx(flops / (989.5e12) * 1e6)  # ~1111 us, memory only ~120 us
    assert t > nbytes / 3350e9 * 1e6


def test_roofline_memory_bound_elementwise() -> None:
    h100 = _device("h100")
    nbytes = 3 * 4 * (1 << 28)  # a + b -> c over 2^28 fp32 values
    t = roofline_time_us(float(1 << 28), nbytes, h100, "fp32")
    assert t == pytest.approx(nbytes / 3350e3)


def test_roofline_dtype_changes_compute_limit() -> None:
    a100 = _device("a100")
    flops = 1e12
    assert roofline_time_us(flops, 0, a100, "fp32") == pytest.approx(1e12 / 19.5e6)
    assert roofline_time_us(flops, 0, a100, "tf32") == pytest.approx(1e12 / 156e6)
    assert roofline_time_us(flops, 0, a100, "bf16") == pytest.approx(1e12 / 312e6)
    assert math.isclose(
        roofline_time_us(flops, 0, a100, "fp32") / roofline_time_us(flops, 0, a100, "bf16"),
        16.0,
    )


# ---------------------------------------------------------------------------------------------
# real traces (skipped where /work/shared/traces is absent)

# trace -> largest share of kernel launches allowed to stay OTHER. The vLLM trace keeps its
# MoE routing kernels (top-k histograms) unclassified on purpose.
_REAL = {
    "tracelens_h100_bert_small.json.gz": 0.02,
    "tracelens_mi300x_resnet_act_ckpt_rank0.json.gz": 0.02,
    "hta_ddp_a100_rank0_nccl_args.json.gz": 0.02,
    "hta_mi250_minitoy_train.json.gz": 0.02,
    "param_resnet_rtx2080ti.json.gz": 0.02,
    "tracelens_b200_vllm_eager_rank0.json.gz": 0.15,
}


@pytest.mark.parametrize("filename", sorted(_REAL))
def test_real_traces(shared_traces: Path, filename: str) -> None:
    with gzip.open(shared_traces / filename, "rt") as fh:
        trace = json.load(fh)
    # Every GPU resolves to a spec whose SM / CU count is what the trace reports.
    for props in trace["deviceProperties"]:
        spec = lookup_device_properties(props)
        assert spec is not None, props["name"]
        assert spec.sm_count == props["numSms"]
    kernels = [
        e["name"]
        for e in trace["traceEvents"]
        if str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    assert kernels
    classes = classify_names(kernels)
    other = np.count_nonzero(classes == KernelClass.OTHER)
    assert other / len(kernels) <= _REAL[filename]


@pytest.mark.parametrize(
    ("device", "tf32"),
    [("A100-80GB", True), ("H100", True), ("V100-SXM2-32GB", False), ("MI250X", False)],
)
def test_convolutions_run_tf32_only_with_tf32_tensor_cores(device: str, tf32: bool) -> None:
    """cuDNN's allow_tf32 default matters from Ampere on; Volta has no TF32 and ROCm's
    convolutions are MIOpen's: an fp32 convolution kernel there is fp32."""
    from perfcast.hardware import KernelClass, convs_in_tf32, lookup_device
    from perfcast.whatif.kernels import kernel_dtype

    dev = lookup_device(device)
    assert dev is not None
    assert convs_in_tf32(dev) is tf32
    conv = "xmma_fprop_implicit_gemm_nhwckrsc_nchw"  # names no dtype
    assert kernel_dtype(conv, KernelClass.CONV, convs_in_tf32(dev)) == ("tf32" if tf32 else "fp32")


def test_copy_direction_in_every_spelling() -> None:
    from perfcast.analysis.memory import copy_kind
    from perfcast.hardware.classify import copy_direction

    cases = {
        "Memcpy HtoD (Pageable -> Device)": "HtoD",
        "Memcpy HtoD (Host -> Device)": "HtoD",  # ROCm through Kineto
        "CopyHostToDevice": "HtoD",  # roctracer
        "Memcpy DtoH (Device -> Pinned)": "DtoH",
        "CopyDeviceToHost": "DtoH",
        "Memcpy DtoD (Device -> Device)": "DtoD",
        "Memcpy PtoP (Device -> Device)": "PtoP",  # the abbreviation wins over the arrow
        "Memcpy HtoH (Pinned -> Pinned)": "HtoH",
        "Memset (Device)": None,
        "void at::native::direct_copy_kernel_cuda": None,
    }
    for name, direction in cases.items():
        assert copy_direction(name) == direction, name
    assert copy_kind("CopyHostToDevice") == "Memcpy HtoD"
    assert copy_kind("Memcpy PtoP (Device -> Device)") == "Memcpy PtoP"
    assert copy_kind("Memset (Device)") == "Memset"


def test_clusters_of_variant_parts_take_their_cut_links() -> None:
    from perfcast.errors import OptionError
    from perfcast.hardware.devices import lookup_device, variant_link
    from perfcast.hardware.network import make_cluster

    h800 = make_cluster("h800")
    assert h800.device.name == "H100-SXM5-80GB"
    assert h800.intra.name == "nvlink4-h800" and h800.intra.bw_gbs_per_direction == 200
    assert "H800" in h800.describe()
    assert h800.nvls  # NVLink 4 through the same third-generation switch
    assert make_cluster("NVIDIA A800-SXM4-80GB").intra.name == "nvlink3-a800"
    assert variant_link("NVIDIA H100 80GB HBM3") is None
    # GH200 is no H200: an H100 at 80 GB, said so.
    assert lookup_device("NVIDIA GH200 480GB") is None
    gh = make_cluster("gh200")
    assert gh.device.name == "H100-SXM5-80GB" and "GH200" in gh.describe()
    # NVLS only over NVLink 4 and later (third-generation NVSwitch).
    assert make_cluster("h100").nvls
    assert not make_cluster("h100", intra="nvlink3").nvls
    # Links in the wrong role, or of the other vendor, and an empty name are refused.
    for kw in (
        {"intra": "ib-ndr"},
        {"inter": "nvlink5"},
        {"intra": "infinity-fabric-mi300x"},
    ):
        with pytest.raises(OptionError):
            make_cluster("h100", **kw)
    with pytest.raises(OptionError):
        make_cluster("mi300x", intra="nvlink4")
    with pytest.raises(OptionError):
        make_cluster("")


def test_the_device_whatif_moves_collectives_onto_a_variants_cut_link() -> None:
    import perfcast

    example = Path(__file__).resolve().parents[1] / "perfcast/examples/ddp_a100_rank0.json.gz"
    r = perfcast.predict(example, "device:target=a800")
    text = " ".join(a for ap in r.applied for a in ap.assumptions)
    assert "nvlink3 -> nvlink3-a800" in text
