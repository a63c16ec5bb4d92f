"""Per-layer costs of a described transformer on a device: the analytic workload.

Every GEMM of a layer is timed by a roofline with tile quantization:

    t = max(2MNK x batch / (peak x e_mm x util), bytes / (bw x e_mem)) + k_over
    util = tiles / (waves x SMs), tiles of 128 x 128 output elements

and every memory-bound kernel (norms, activation functions, dropout, residual adds, softmax)
by the bytes it moves over `bw x e_mem`, plus `k_over` per kernel. Backward is two GEMMs per
forward GEMM (data and weight gradients: twice the FLOPs) and twice the forward memory traffic.
FlashAttention kernels run at `e_flash` of the peak, backward 2.5x the forward FLOPs (five
matmuls instead of two).

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): QKV and the first MLP projection are
split by columns, the attention output and second MLP projection by rows, heads split across
ranks; the layer norms, dropouts and residual adds outside those pairs run replicated, or split
by the sequence with sequence parallelism (Korthikanti et al. 2022). Two all-reduces of the
layer's activations per layer forward and two backward (without SP), or all-gathers and
reduce-scatters of the same volume (with SP), on the critical path (Megatron does not
overlap them). Activation memory per layer follows Korthikanti et al.'s accounting
(34 sbh + 5 a s^2 b bytes for a GPT layer with dropout at 16 bits), computed term by term so
that GQA, SwiGLU, RMSNorm and FlashAttention models get theirs.

Recomputation: "full" keeps each layer's input only and reruns the layer's forward (with its
all-reduces) in backward; "selective" keeps all but the attention core (scores, softmax,
dropout) and reruns that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perfcast.hardware.network import Cluster, collective_time_s
from perfcast.plan.desc import ModelDesc
from perfcast.plan.plans import Plans

K_OVER_S = 2e-6  # fixed cost per kernel (launch gap, ramp-up, tail) when the GPU is busy
E_MEM = 0.85  # share of peak HBM bandwidth streaming kernels reach
TILE = 128


def gemm_efficiency(device_name: str) -> tuple[float, float, str]:
    """(e_mm, e_flash, where they come from) for a device."""
    if device_name.startswith("A100"):
        return (
            0.82,
            0.65,
            (
                "A100: large fp16/bf16 cuBLAS GEMMs reach about 255 of 312 TFLOP/s (0.82), "
                "FlashAttention-2 forward about 0.65 of peak"
            ),
        )
    if device_name.startswith(("H100", "H200")):
        return (
            0.72,
            0.40,
            (
                "Hopper: large bf16 cuBLAS GEMMs reach about 700 of 989 TFLOP/s (0.72), "
                "FlashAttention-2 about 0.40 of peak"
            ),
        )
    return 0.75, 0.45, f"{device_name}: assumed 0.75 of peak for GEMMs, 0.45 for attention"


@dataclass
class StageTimes:
    """Per micro-batch, on the slowest pipeline stage (seconds)."""

    fwd: np.ndarray
    bwd: np.ndarray
    recompute: np.ndarray
    tp_comm: np.ndarray  # the part of fwd + bwd + recompute spent in TP collectives
    host: np.ndarray  # host time per micro-batch that the GPU work cannot hide


@dataclass
class AnalyticWorkload:
    """A `ModelDesc` on a cluster, at 16-bit precision (Megatron fp16 or bf16 mixed precision:
    16-bit weights and activations, fp32 master weights and Adam state)."""

    desc: ModelDesc
    cluster: Cluster
    act_bytes: int = 2
    grad_bytes: int = 2  # bytes per gradient element all-reduced / reduce-scattered
    param_bytes: int = 2  # 16-bit model weights
    master_bytes: int = 4  # fp32 master copy kept by the optimizer
    main_grad_bytes: int = 4  # fp32 gradient accumulation buffer (Megatron main_grad)
    opt_state_bytes: int = 8  # Adam exp_avg and exp_avg_sq in fp32
    opt_update_bytes: int = 34  # bytes an Adam step reads and writes per parameter
    gather_bytes: int = 0  # bytes per parameter an FSDP all-gather moves (0: param_bytes)
    source: str = "model description"
    assumptions: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        dev = self.cluster.device
        self.e_mm, self.e_flash, note = gemm_efficiency(dev.name)
        self.peak = dev.peak("bf16") * 1e12
        self.bw = dev.mem_bw_gbs * 1e9
        self.sms = dev.sm_count or 108
        self.assumptions.extend(
            [
                f"{self.desc.name}: {self.desc.params() / 1e9:.2f} B parameters, "
                f"{self.desc.layers} layers, hidden {self.desc.hidden}, sequence {self.desc.seq}",
                note,
                f"memory-bound kernels at {E_MEM:.0%} of {dev.mem_bw_gbs:g} GB/s, "
                f"{K_OVER_S * 1e6:g} us fixed cost per kernel",
                "tensor-parallel collectives are not overlapped with compute (Megatron-LM)",
            ]
        )

    # -- what the cost model asks --------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return self.desc.layers

    @property
    def tokens_per_sample(self) -> int:
        return self.desc.seq

    @property
    def tp_max(self) -> int:
        return self.desc.heads

    def tp_ok(self, tp: np.ndarray) -> np.ndarray:
        kv = self.desc.kv_heads or self.desc.heads
        return (self.desc.heads % tp == 0) & ((kv % tp == 0) | (tp % kv == 0))

    def _gemm(self, m: Any, n: Any, k: Any, batch: Any = 1) -> np.ndarray:
        """Seconds of a (batched) GEMM, M x K times K x N; arguments scalars or arrays."""
        m, n, k = (np.asarray(x, dtype=np.float64) for x in (m, n, k))
        batch = np.asarray(batch, dtype=np.float64)
        tiles = batch * np.ceil(m / TILE) * np.ceil(n / TILE)
        waves = np.ceil(tiles / self.sms)
        util = tiles / (waves * self.sms)
        flops = 2 * m * n * k * batch
        nbytes = self.act_bytes * batch * (m * k + k * n + m * n)
        return np.maximum(flops / (self.peak * self.e_mm * util), nbytes / (self.bw * E_MEM))

    def _layer(self, p: Plans) -> dict[str, np.ndarray]:
        """Forward costs of one layer for one micro-batch, split by kind (seconds)."""
        d = self.desc
        b, t = p.mb.astype(np.float64), p.tp.astype(np.float64)
        s, h, f, a = d.seq, d.hidden, d.ffn_dim, d.heads
        e = self.act_bytes
        tokens = b * s
        n_th = tokens * h  # token x hidden elements
        hd = h // a
        kv = d.kv_dim
        mm = (
            self._gemm(tokens, (h + 2 * kv) / t, h)
            + self._gemm(tokens, h, h / t)
            + self._gemm(tokens, (2 if d.gated_mlp else 1) * f / t, h)
            + self._gemm(tokens, h, f / t)
        )
        n_mm = 4.0
        heads = b * a / t
        if d.flash_attention:
            frac = 0.5 if d.causal_skip else 1.0
            flops = 4 * b * s * s * h / t * frac
            attn_core = flops / (self.peak * self.e_flash)
            attn_mem = np.zeros_like(b)
            n_attn = 1.0
        else:
            attn_core = self._gemm(s, s, hd, heads) + self._gemm(s, hd, s, heads)
            n_sc = heads * s * s
            # Fused scale-mask-softmax (read, write) and dropout (read, write, 1-byte mask).
            attn_mem = n_sc * (2 * e + ((2 * e + 1) if d.dropout else 0)) / (self.bw * E_MEM)
            n_attn = 4.0
        # Memory-bound work outside the TP pairs: two norms (read, write), two residual adds
        # with dropout (read two, write one, 1-byte mask).
        add = (3 * e + (1 if d.dropout else 0)) * n_th
        rep = (2 * 2 * e * n_th + 2 * add) / (self.bw * E_MEM)
        # Inside the pairs: the MLP activation (GeLU: read, write; SwiGLU: read two, write one)
        # and the attention context transpose (read, write).
        act = (3 if d.gated_mlp else 2) * e * tokens * f / t
        split = (act + 2 * e * n_th / t) / (self.bw * E_MEM)
        rep = np.where(p.sp > 0, rep / t, rep)
        kernels = n_mm + n_attn + 6.0
        # TP collectives: 2 all-reduces of the activations forward (or AG + RS with SP).
        nbytes = n_th * e
        ar = collective_time_s(self.cluster, "allreduce", nbytes, t, np.minimum(t, 8))
        ag = collective_time_s(self.cluster, "allgather", nbytes, t, np.minimum(t, 8))
        rs = collective_time_s(self.cluster, "reducescatter", nbytes, t, np.minimum(t, 8))
        comm_f = np.where(p.sp > 0, 2 * (ag + rs), 2 * ar)
        return {
            "mm": mm,
            "attn_core": attn_core,
            "attn_mem": attn_mem,
            "mem": rep + split,
            "over": kernels * K_OVER_S,
            "comm_f": comm_f,
            "ag": ag,
        }

    def _ends(self, p: Plans) -> tuple[np.ndarray, np.ndarray]:
        """Forward seconds of the first stage's extra work (embedding) and the last stage's
        (final norm, LM head, cross-entropy) per micro-batch."""
        d = self.desc
        b, t = p.mb.astype(np.float64), p.tp.astype(np.float64)
        tokens = b * d.seq
        n_th = tokens * d.hidden
        pre = 3 * self.act_bytes * n_th / (self.bw * E_MEM) + 3 * K_OVER_S
        head = self._gemm(tokens, d.vocab / t, d.hidden)
        # Vocabulary-parallel cross-entropy in fp32: about four passes over the logits.
        ce = 4 * 4 * tokens * d.vocab / t / (self.bw * E_MEM)
        post = head + ce + 2 * self.act_bytes * n_th / (self.bw * E_MEM) + 6 * K_OVER_S
        return pre, post

    def stage_times(self, p: Plans) -> StageTimes:
        lay = self._layer(p)
        fwd_layer = lay["mm"] + lay["attn_core"] + lay["attn_mem"] + lay["mem"] + lay["over"]
        flash_bwd = 2.5 if self.desc.flash_attention else 2.0
        bwd_layer = (
            2 * lay["mm"]
            + flash_bwd * lay["attn_core"]
            + 2 * (lay["attn_mem"] + lay["mem"])
            + 2 * lay["over"]
        )
        comm_b = lay["comm_f"] + np.where(p.sp > 0, 2 * lay["ag"], 0.0)
        full = p.ckpt == 2
        sel = p.ckpt == 1
        recompute_layer = np.where(
            full,
            fwd_layer + lay["comm_f"],
            np.where(sel, lay["attn_core"] + lay["attn_mem"], 0.0),
        )
        if self.desc.flash_attention:
            # With FlashAttention the scores are never kept: "selective" is torchtitan's
            # op-level policy, which reruns the non-matmul work and every other matmul.
            recompute_layer = np.where(sel, lay["mem"] + 0.5 * lay["mm"], recompute_layer)
        per_stage = np.ceil(self.desc.layers / p.pp)
        pre, post = self._ends(p)
        # The slowest stage: the last one carries the LM head (first the embedding).
        ends_f = np.where(p.pp > 1, np.maximum(pre, post), pre + post)
        fwd = per_stage * (fwd_layer + lay["comm_f"]) + ends_f
        bwd = per_stage * (bwd_layer + comm_b) + 2 * ends_f
        rec = per_stage * recompute_layer
        tp_comm = per_stage * (lay["comm_f"] + comm_b + np.where(full, lay["comm_f"], 0.0))
        return StageTimes(fwd, bwd, rec, tp_comm, np.zeros_like(fwd))

    def layer_params(self) -> float:
        return float(self.desc.layer_params())

    def params_stage(self, p: Plans) -> np.ndarray:
        """Parameters on one GPU of the largest stage, after tensor parallelism."""
        d = self.desc
        per_stage = np.ceil(d.layers / p.pp)
        emb = d.vocab * d.hidden
        # Layer weights split by TP (norm weights replicated, a negligible share).
        layers = per_stage * d.layer_params() / p.tp
        ends = np.where(p.pp > 1, emb, d.embedding_params()) / p.tp
        return layers + ends

    def act_bytes_stage(self, p: Plans) -> np.ndarray:
        """Activation bytes one micro-batch leaves on the first stage (Korthikanti et al.)."""
        d = self.desc
        b, t = p.mb.astype(np.float64), p.tp.astype(np.float64)
        e = self.act_bytes
        s, h, f = d.seq, d.hidden, d.ffn_dim
        n_th = b * s * h
        mask = n_th if d.dropout else 0.0
        # Replicated (split by SP): norm inputs x2, QKV input, fc1 input, two dropout masks.
        rep = 4 * e * n_th + 2 * mask
        qkv_out = e * b * s * (h + 2 * d.kv_dim) / t
        proj_in = e * n_th / t
        mlp = (3 if d.gated_mlp else 2) * e * b * s * f / t
        split = qkv_out + proj_in + mlp
        if d.flash_attention:
            core = e * n_th / t  # the attention output kept by the flash kernel
        else:
            n_sc = b * d.heads * s * s / t
            # Softmax output (kept for AV), and with dropout its mask and output.
            core = n_sc * (e + ((e + 1) if d.dropout else 0))
        rep = np.where(p.sp > 0, rep / t, rep)
        full_layer = rep + split + core
        per_stage = np.ceil(d.layers / p.pp)
        layer_input = np.where(p.sp > 0, e * n_th / t, e * n_th)
        # torchtitan's op-level selective checkpointing (FlashAttention models) keeps about
        # half the layer; Korthikanti's selective drops the attention core.
        sel_layer = 0.5 * full_layer if d.flash_attention else full_layer - core
        per_layer = np.where(p.ckpt == 2, layer_input, np.where(p.ckpt == 1, sel_layer, full_layer))
        return per_stage * per_layer

    def transient_bytes(self, p: Plans) -> np.ndarray:
        """Working memory beyond what is kept: one layer's full activations while it is
        recomputed or run backward, and the logits (16-bit, fp32 softmax and its gradient)."""
        d = self.desc
        b, t = p.mb.astype(np.float64), p.tp.astype(np.float64)
        one = self.act_bytes_stage(
            Plans(
                **{**_fields(p), "ckpt": np.zeros_like(p.ckpt), "pp": np.full_like(p.pp, d.layers)}
            )
        )
        logits = b * d.seq * d.vocab / t * (self.act_bytes + 4 + 4)
        return one + np.where(p.pp > 1, 0.0, logits)

    def last_stage_logits(self, p: Plans) -> np.ndarray:
        d = self.desc
        return p.mb * d.seq * d.vocab / p.tp * (self.act_bytes + 4 + 4)

    def p2p_bytes(self, p: Plans) -> np.ndarray:
        """Bytes a stage boundary sends per micro-batch (Megatron's scatter-gather: 1/tp of
        the activations over the network, then an all-gather inside the node)."""
        d = self.desc
        return self.act_bytes * p.mb * d.seq * d.hidden / p.tp

    def optimizer_s(self, params_gpu: np.ndarray) -> np.ndarray:
        return params_gpu * self.opt_update_bytes / (self.bw * E_MEM)

    def bytes_per_param(self) -> tuple[int, int, int]:
        """(weights, gradients, optimizer state incl. master copy) bytes per parameter."""
        return self.param_bytes, self.main_grad_bytes, self.opt_state_bytes + self.master_bytes


def _fields(p: Plans) -> dict[str, np.ndarray]:
    keys = ("dp", "tp", "pp", "mb", "m", "v", "zero", "ckpt", "sp", "amp")
    return {k: getattr(p, k) for k in keys}
