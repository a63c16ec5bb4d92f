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
dropout) and reruns that. With FlashAttention there are no scores to drop, and "selective" is
torchtitan's op-level policy (torchtitan/parallelisms/parallelize_llama.py, Dec 2024): it
keeps the outputs of the attention kernel and of every other matmul (the 1st, 3rd, ...) and
reruns everything else of the layer's forward, up to the last tensor backward needs (torch's
non-reentrant checkpoint stops early: the layer's final residual add is not rerun).

Host time: a micro-batch takes at least the host (CPU) time of the kernels it launches
(forward, recomputation, backward, the TP collectives, the stage's ends), at
`host_us_per_kernel` each (`HOST_S_PER_KERNEL` by default); cost.evaluate takes the larger of
that and the GPU work. It decides small models split over many GPUs (vTrain's single-node
runs) and leaves large ones, whose GPU work hides it, unchanged.

Fused and eager memory-bound work (`ModelDesc.kernels`, the table in `chains`): "fused"
counts one kernel per norm, activation and rotary embedding, backward twice the forward's
traffic and kernels; "eager" counts the ATen kernels an eager PyTorch model launches for the
ops that are chains of kernels there (RMSNorm, SwiGLU, RoPE, repeat_kv), forward and backward
each from its own count. Ops that are one kernel either way (residual adds, LayerNorm, GeLU,
dropout) are counted the same in both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perfcast.errors import PerfcastError
from perfcast.hardware.devices import DeviceSpec
from perfcast.hardware.network import Cluster, collective_time_s
from perfcast.plan.desc import ModelDesc
from perfcast.plan.plans import Plans

K_OVER_S = 2e-6  # fixed cost per kernel (launch gap, ramp-up, tail) when the GPU is busy
# Host (CPU) time per kernel an eager PyTorch training step launches, its Python, dispatch and
# launch cost together: the median over 45 baseline traces of the project's own workloads on
# H100 and H200 hosts (9 workload and host pairs, each traced about five times:
# benchmarks/accuracy/recorded, live-h100/h200-2026-11-26 and the gpu-truth H100 bases), the
# busy time of forward and backward's top-level ops less their blocking syncs, with the
# profiler's cost removed, divided by the GPU tasks launched (kernels, copies and memsets;
# no collectives): 25.6 us, 8-55 us, interquartile 18-40 us
# (benchmarks/experiments/host_per_kernel.py). A framework with more
# Python per kernel costs more (Megatron-DeepSpeed on vTrain's A100 hosts: about 60 us per
# kernel counted here, see benchmarks/bench_published.py); `host_us_per_kernel` sets it.
HOST_S_PER_KERNEL = 26e-6
E_MEM = 0.85  # share of peak HBM bandwidth streaming kernels reach
TILE = 128  # output tile of a large GEMM (CUTLASS's usual 128x128 threadblock tile)
F32 = 4  # bytes of the fp32 upcasts inside eager RMSNorm and RoPE
# Kernels of a stage's ends besides the final norm's: the embedding's forward (its backward
# twice as many), and the LM head and cross-entropy forward (backward twice as many).
EMBED_KERNELS = 3
HEAD_KERNELS = 5


@dataclass(frozen=True)
class Chain:
    """One op of a layer as the kernels that run it: bytes moved per element of the tensor it
    is counted over, and kernels, in forward and in backward."""

    fwd_bytes: float
    fwd_kernels: int
    bwd_bytes: float
    bwd_kernels: int


def _fused(nbytes: float) -> Chain:
    # One kernel forward; backward twice the forward's traffic in two kernels (the model's
    # rule for fused kernels since the Megatron tables were first checked).
    return Chain(nbytes, 1, 2 * nbytes, 2)


def chains(kernels: str, e: int) -> dict[str, Chain]:
    """The memory-bound ops whose cost differs between fused and eager kernels, at `e` bytes
    per activation element (2: bf16 under FSDP's mixed precision, fp16 under Megatron's).

    "norm" (RMSNorm) and "accum" per element of the tokens x hidden input, "swiglu" per
    element of one of its two tokens x ffn inputs, "rope" per element of q or of k. Small
    (tokens-sized) tensors count as kernels without bytes; the broadcast operand of a
    pointwise op (norm weight, rotary table) is read once per kernel, a negligible share.

    Eager, counted from torchtitan's Llama at its Dec 2024 benchmark commit (9dec370;
    torchtitan/models/norms.py RMSNorm, torchtitan/models/llama/model.py apply_rotary_emb,
    FeedForward, repeat_kv) and the ATen ops eager PyTorch dispatches for them. Backward
    counting rule: each op's autograd formula (derivatives.yaml) launched as written: a
    pointwise op's backward reads the incoming gradient and the saved inputs it multiplies by
    and writes one gradient per differentiable input; a broadcast input's gradient is a
    further sum over the broadcast dimensions; a dtype cast's backward is the reverse cast; a
    tensor used twice has its two gradients added (one more kernel).

    RMSNorm forward, x in e-byte activations (8 kernels, 4e + 28 bytes):
        x.float()            read e, write 4          (_to_copy)
        pow(2)               read 4, write 4
        mean(-1)             read 4                   (writes tokens-sized)
        + eps, rsqrt         tokens-sized, 2 kernels
        x * rsqrt            read 4, write 4
        .type_as(x)          read 4, write e          (_to_copy)
        * weight             read e, write e
    RMSNorm backward (16 kernels, 8e + 76 bytes):
        * weight             grad*weight: read e, write e; grad*normed: read 2e, write e;
                             sum over tokens for the weight gradient: read e (3 kernels)
        .type_as             reverse cast: read e, write 4
        x * rsqrt            grad*rsqrt: read 4, write 4; grad*x: read 8, write 4; sum over
                             hidden to the rsqrt's shape: read 4 (3 kernels)
        rsqrt                -0.5 * grad * result.pow(3): 3 tokens-sized kernels
        + eps                gradient passes through (no kernel)
        mean                 expand, then divide by hidden: write 4
        pow(2)               grad * (2 * x.pow(1)): x.pow(1) is a copy (read 4, write 4),
                             times 2 (read 4, write 4), times grad (read 8, write 4)
        x used twice         add the two gradients: read 8, write 4
        x.float()            reverse cast: read 4, write e
    SwiGLU, silu(w1 x) * (w3 x) (forward 2 kernels, 5e bytes; backward 3 kernels, 9e):
        silu                 read e, write e
        mul                  read 2e, write e
        backward             mul: grad*b and grad*a, each read 2e, write e; silu_backward:
                             read 2e (grad, input), write e
    RoPE on q and on k separately (forward 3 kernels, 2e + 16 bytes; backward 4, 2e + 16):
        x.float()            read e, write 4; view_as_complex is a view
        * freqs_cis          complex64: read 4, write 4 per real element; view_as_real and
                             flatten are views
        .type_as(x)          read 4, write e
        backward             reverse casts (e + 4 each) and grad * freqs_cis.conj() (read 4,
                             write 4), plus one kernel materializing the conjugated table
    Gradient accumulation ("accum", backward only): the normed input feeding the separate
    wq / wk / wv (and w1 / w3) GEMMs receives one gradient from each, added pairwise: read
    2e, write e per addition.

    Fused: one kernel reading and writing each tensor once: norm 2e, SwiGLU read two and
    write one (3e), RoPE 2e; no accumulation (one fused QKV / fc1 GEMM gives one gradient).
    """
    if kernels == "eager":
        return {
            "norm": Chain(4 * e + 7 * F32, 8, 8 * e + 19 * F32, 16),
            "swiglu": Chain(5 * e, 2, 9 * e, 3),
            "rope": Chain(2 * e + 4 * F32, 3, 2 * e + 4 * F32, 4),
            "accum": Chain(0, 0, 3 * e, 1),
        }
    return {
        "norm": _fused(2 * e),
        "swiglu": _fused(3 * e),
        "rope": _fused(2 * e),
        "accum": Chain(0, 0, 0, 0),
    }


# FlashAttention-2's share of peak: 50-73% of the A100's forward (Dao 2023, FlashAttention-2,
# arXiv 2307.08691), "only 35% utilization" on the H100 (Shah et al. 2024, FlashAttention-3,
# arXiv 2407.08608). Optimized GEMMs on the A100: "up to 80-90%" (Dao 2023).
_A100_GEMM, _A100_FLASH = 0.82, 0.65
_HOPPER_FLASH = 0.35
_OTHER_GEMM, _OTHER_FLASH = 0.75, 0.45


def gemm_efficiency(device: DeviceSpec) -> tuple[float, float, str]:
    """(e_mm, e_flash, where they come from) for a device: the project's measured large-GEMM
    efficiency of the part where it has one (perfcast.hardware.measured, as the device
    what-if uses), the published figures for the A100, else the same vendor's measured part,
    else an assumption, said so."""
    from perfcast.hardware.measured import achieved_gemm, achieved_gemm_or_stand_in

    hopper = device.name.startswith(("H100", "H200"))
    flash, flash_src = (
        (_A100_FLASH, "FlashAttention-2 at 0.65 of peak (Dao 2023: 50-73% forward)")
        if device.name.startswith("A100")
        else (_HOPPER_FLASH, "FlashAttention-2 at 0.35 of peak (Shah et al. 2024, FA3 paper)")
        if hopper
        else (_OTHER_FLASH, "attention at 0.45 of peak (an assumption)")
    )
    own = achieved_gemm(device.name)
    if own is None and device.name.startswith("A100"):
        return (
            _A100_GEMM,
            flash,
            f"A100: large 16-bit cuBLAS GEMMs at {_A100_GEMM} of peak (Dao 2023: up to "
            f"80-90%), {flash_src}",
        )
    found = own or achieved_gemm_or_stand_in(device.name, device.vendor)
    if found is not None:
        return (
            found.efficiency,
            flash,
            f"GEMMs at {found.efficiency:.3f} of peak ({found.source}), {flash_src}",
        )
    return (
        _OTHER_GEMM,
        flash,
        f"{device.name}: GEMMs at {_OTHER_GEMM} of peak (an assumption), {flash_src}",
    )


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
    host_us_per_kernel: float = HOST_S_PER_KERNEL * 1e6  # see HOST_S_PER_KERNEL
    source: str = "model description"
    assumptions: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Up to a second per kernel: beyond that no launch is plausible and steps overflow.
        if not (0 <= self.host_us_per_kernel <= 1e6):
            raise PerfcastError(
                "host time per kernel must be a number of us from 0 to 1,000,000, not "
                f"{self.host_us_per_kernel}"
            )
        dev = self.cluster.device
        self.e_mm, self.e_flash, note = gemm_efficiency(dev)
        self.peak = dev.peak("bf16") * 1e12
        self.bw = dev.mem_bw_gbs * 1e9
        self.sms = dev.sm_count or 108
        self.assumptions.extend(
            [
                f"{self.desc.name}: {self.desc.params() / 1e9:.2f} B parameters, "
                f"{self.desc.layers} layers, hidden {self.desc.hidden}, sequence {self.desc.seq}",
                note,
                f"memory-bound kernels at {E_MEM:.0%} of {dev.mem_bw_gbs:g} GB/s, "
                f"{K_OVER_S * 1e6:g} us fixed cost per kernel, GEMMs in {TILE}x{TILE} output "
                f"tiles run in waves over {self.sms} SMs (assumptions, the same for every GPU)",
                "tensor-parallel collectives are not overlapped with compute (Megatron-LM)",
                f"host time {self.host_us_per_kernel:g} us per kernel launched (Python, dispatch "
                "and launch; "
                + (
                    "the median of the project's eager PyTorch traces on H100/H200 hosts"
                    if self.host_us_per_kernel == HOST_S_PER_KERNEL * 1e6
                    else "given"
                )
                + "): a micro-batch takes at least its kernels' host time, however fast the GPU",
                (
                    "norms, activations and rotary embeddings as eager PyTorch's kernel chains "
                    "(unfused)"
                    if self.desc.kernels == "eager"
                    else "norms, activations and rotary embeddings as fused kernels"
                ),
            ]
        )
        # The search skips a tensor-parallel degree the heads do not split into; said, or a
        # model of 6 heads on 8-GPU nodes was planned without tp 4 or 8 and no reason.
        tried = [1 << i for i in range(self.cluster.gpus_per_node.bit_length())]
        ok = self.tp_ok(np.array(tried)) & (np.array(tried) <= self.tp_max)
        refused = [t for t, good in zip(tried, ok.tolist()) if not good]
        if refused:
            kv = self.desc.kv_heads or self.desc.heads
            self.assumptions.append(
                f"tensor parallelism tp {', '.join(map(str, refused))} not offered: tp must "
                f"divide the {self.desc.heads} attention heads"
                + (
                    f" and divide or be a multiple of the {kv} KV heads"
                    if kv != self.desc.heads
                    else ""
                )
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
        """Costs of one layer for one micro-batch, split by kind (seconds): forward, and the
        backward (`*_b`) and op-level-selective recompute (`*_rec`) of the memory-bound work."""
        d = self.desc
        b, t = p.mb.astype(np.float64), p.tp.astype(np.float64)
        s, h, f, a = d.seq, d.hidden, d.ffn_dim, d.heads
        e = self.act_bytes
        eager = d.kernels == "eager"
        ch = chains(d.kernels, e)
        tokens = b * s
        n_th = tokens * h  # token x hidden elements
        hd = h // a
        kv = d.kv_dim
        # The GEMMs (N, K) in forward order: fused QKV and fc1 (Megatron), or torchtitan's
        # separate wq, wk, wv, wo, w1, [w3,] w2 nn.Linear layers (eager).
        if eager:
            up = [(f / t, h)] * (2 if d.gated_mlp else 1)
            shapes = [(h / t, h), (kv / t, h), (kv / t, h), (h, h / t), *up, (h, f / t)]
        else:
            fc1 = (2 if d.gated_mlp else 1) * f / t
            shapes = [((h + 2 * kv) / t, h), (h, h / t), (fc1, h), (h, f / t)]
        mms = [self._gemm(tokens, n, k) for n, k in shapes]
        mm = mms[0]
        for x in mms[1:]:
            mm = mm + x
        n_mm = float(len(mms))
        # torchtitan's op-level selective checkpointing keeps every other mm's output (the
        # 1st, 3rd, ...) and reruns the others.
        mm_sac = np.zeros_like(b)
        for x in mms[1::2]:
            mm_sac = mm_sac + x
        n_mm_sac = float(len(mms[1::2]))
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
        bw = self.bw * E_MEM
        # Memory-bound work outside the TP pairs (split by the sequence with SP): two norms,
        # two residual adds with dropout (read two, write one, 1-byte mask; one kernel fused
        # or eager). RMSNorm counts by `chains`; LayerNorm is one kernel eager too
        # (native_layer_norm), so counted as fused.
        norm = chains(d.kernels if d.norm == "rmsnorm" else "fused", e)["norm"]
        add = (3 * e + (1 if d.dropout else 0)) * n_th
        rep = 2 * norm.fwd_bytes * n_th + 2 * add
        rep_b = 2 * norm.bwd_bytes * n_th + 2 * (2 * add)
        k_rep = 2 * norm.fwd_kernels + 2.0
        kb_rep = 2 * norm.bwd_kernels + 4.0
        # Inside the pairs (split by TP): the MLP activation (GeLU, one kernel either way:
        # read, write; SwiGLU by `chains`) and the attention context transpose (read, write;
        # counted for every model, though with torch's SDPA flash kernel, which writes its
        # output token-major, torchtitan's transpose(1, 2).contiguous() is a view).
        act = ch["swiglu"] if d.gated_mlp else _fused(2 * e)
        n_tf = tokens * f / t
        split = act.fwd_bytes * n_tf + 2 * e * n_th / t
        split_b = act.bwd_bytes * n_tf + 2 * (2 * e * n_th / t)
        k_split = act.fwd_kernels + 1.0
        kb_split = act.bwd_kernels + 2.0
        if not d.position_embeddings:
            # Rotary embedding of q and of k.
            rope = ch["rope"]
            n_qk = tokens * (h + kv) / t
            split = split + rope.fwd_bytes * n_qk
            split_b = split_b + rope.bwd_bytes * n_qk
            k_split += 2 * rope.fwd_kernels
            kb_split += 2 * rope.bwd_kernels
        if eager and kv < h:
            # repeat_kv: K and V each copied to all query heads (read kv, write h per token);
            # backward sums the copies back (read h, write kv). A GQA-aware kernel does not.
            rkv = 2 * e * tokens * (kv + h) / t
            split = split + rkv
            split_b = split_b + rkv
            k_split += 2.0
            kb_split += 2.0
        # Gradients of the normed inputs summed across the separate projections (eager: the
        # attention input feeds 3 GEMMs, the gated MLP input 2), on the full sequence.
        acc, n_sums = ch["accum"], 2 + (1 if d.gated_mlp else 0)
        n_acc = float(n_sums * acc.bwd_kernels)
        full_b = n_sums * acc.bwd_bytes * n_th
        sp = p.sp > 0
        rep_s = np.where(sp, rep / t, rep)
        rep_b_s = np.where(sp, rep_b / t, rep_b)
        add_s = np.where(sp, add / t, add)
        mem = (rep_s + split) / bw
        mem_b = (rep_b_s + split_b + full_b) / bw
        kernels = n_mm + n_attn + k_rep + k_split
        kernels_b = 2 * (n_mm + n_attn) + kb_rep + kb_split + n_acc
        # Op-level selective recompute: every memory-bound kernel of the forward but the
        # final residual add, and the unsaved GEMMs.
        mem_rec = (rep_s - add_s + split) / bw
        kernels_rec = n_mm_sac + k_rep - 1 + k_split
        # TP collectives: 2 all-reduces of the activations forward (or AG + RS with SP).
        nbytes = n_th * e
        local = np.minimum(t, self.cluster.gpus_per_node)
        ar = collective_time_s(self.cluster, "allreduce", nbytes, t, local, algorithm="auto")
        ag = collective_time_s(self.cluster, "allgather", nbytes, t, local)
        rs = collective_time_s(self.cluster, "reducescatter", nbytes, t, local)
        comm_f = np.where(p.sp > 0, 2 * (ag + rs), 2 * ar)
        ones = np.ones_like(b)
        return {
            # Kernels launched (host work): forward, backward, op-level-selective recompute,
            # and the TP collectives of one forward.
            "k": ones * kernels,
            "k_b": ones * kernels_b,
            "k_rec": ones * kernels_rec,
            "k_comm": np.where(t > 1, np.where(p.sp > 0, 4.0, 2.0), 0.0),
            "mm": mm,
            "mm_sac": mm_sac,
            "attn_core": attn_core,
            "attn_mem": attn_mem,
            "mem": mem,
            "mem_b": mem_b,
            "mem_rec": mem_rec,
            "over": np.full_like(b, kernels * K_OVER_S),
            "over_b": np.full_like(b, kernels_b * K_OVER_S),
            "over_rec": np.full_like(b, kernels_rec * K_OVER_S),
            "comm_f": comm_f,
            "ag": ag,
        }

    def _ends(self, p: Plans) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Forward seconds of the first stage's extra work (embedding) and the last stage's
        (final norm, LM head, cross-entropy) per micro-batch, then their backward seconds."""
        d = self.desc
        b, t = p.mb.astype(np.float64), p.tp.astype(np.float64)
        tokens = b * d.seq
        n_th = tokens * d.hidden
        bw = self.bw * E_MEM
        pre = 3 * self.act_bytes * n_th / bw + EMBED_KERNELS * K_OVER_S
        head = self._gemm(tokens, d.vocab / t, d.hidden)
        # Vocabulary-parallel cross-entropy in fp32: about four passes over the logits.
        ce = 4 * 4 * tokens * d.vocab / t / bw
        # The final norm as the layers' norms; the rest: LM head, cross-entropy (5 kernels).
        norm = chains(d.kernels if d.norm == "rmsnorm" else "fused", self.act_bytes)["norm"]
        rest = head + ce + HEAD_KERNELS * K_OVER_S
        post = rest + norm.fwd_bytes * n_th / bw + norm.fwd_kernels * K_OVER_S
        post_b = 2 * rest + norm.bwd_bytes * n_th / bw + norm.bwd_kernels * K_OVER_S
        return pre, post, 2 * pre, post_b

    def stage_times(self, p: Plans) -> StageTimes:
        lay = self._layer(p)
        fwd_layer = lay["mm"] + lay["attn_core"] + lay["attn_mem"] + lay["mem"] + lay["over"]
        flash_bwd = 2.5 if self.desc.flash_attention else 2.0
        bwd_layer = (
            2 * lay["mm"]
            + flash_bwd * lay["attn_core"]
            + 2 * lay["attn_mem"]
            + lay["mem_b"]
            + lay["over_b"]
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
            # op-level policy (see the module docstring).
            op_sac = lay["mm_sac"] + lay["mem_rec"] + lay["over_rec"]
            recompute_layer = np.where(sel, op_sac, recompute_layer)
        per_stage = np.ceil(self.desc.layers / p.pp)
        pre, post, pre_b, post_b = self._ends(p)
        # The slowest stage: the last one carries the LM head (first the embedding).
        ends_f = np.where(p.pp > 1, np.maximum(pre, post), pre + post)
        ends_b = np.where(p.pp > 1, np.where(pre >= post, pre_b, post_b), pre_b + post_b)
        fwd = per_stage * (fwd_layer + lay["comm_f"]) + ends_f
        bwd = per_stage * (bwd_layer + comm_b) + ends_b
        rec = per_stage * recompute_layer
        tp_comm = per_stage * (lay["comm_f"] + comm_b + np.where(full, lay["comm_f"], 0.0))
        return StageTimes(fwd, bwd, rec, tp_comm, self._host(p, lay, per_stage))

    def _host(self, p: Plans, lay: dict[str, np.ndarray], per_stage: np.ndarray) -> np.ndarray:
        """Host time of one micro-batch on the slowest stage: every kernel it launches (the
        layers' forward, backward and recomputation, their TP collectives, the stage's ends)
        at `host_us_per_kernel`. The GPU cannot run ahead of it (cost.evaluate takes the
        larger of the two per micro-batch)."""
        comm_b = lay["k_comm"] + np.where((p.sp > 0) & (p.tp > 1), 2.0, 0.0)
        n_attn = 1.0 if self.desc.flash_attention else 4.0
        rec = np.where(
            p.ckpt == 2,
            lay["k"] + lay["k_comm"],
            np.where(p.ckpt == 1, lay["k_rec"] if self.desc.flash_attention else n_attn, 0.0),
        )
        per_layer = lay["k"] + lay["k_comm"] + lay["k_b"] + comm_b + rec
        norm = chains(self.desc.kernels if self.desc.norm == "rmsnorm" else "fused", 2)["norm"]
        # The ends' kernels forward and backward, as _ends counts their fixed costs.
        pre = 3.0 * EMBED_KERNELS
        post = 3.0 * HEAD_KERNELS + norm.fwd_kernels + norm.bwd_kernels
        ends = np.where(p.pp > 1, max(pre, post), pre + post)
        return (per_stage * per_layer + ends) * self.host_us_per_kernel * 1e-6

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

    def optimizer_s(
        self,
        params_gpu: np.ndarray,
        gpu_lag_s: np.ndarray | float = 0.0,
        tensor_share: np.ndarray | float = 1.0,
    ) -> np.ndarray:
        """GPU time of the optimizer step (no host time modelled: `gpu_lag_s` and
        `tensor_share` are unused)."""
        return params_gpu * self.opt_update_bytes / (self.bw * E_MEM)

    def bytes_per_param(self) -> tuple[int, int, int]:
        """(weights, gradients, optimizer state incl. master copy) bytes per parameter."""
        return self.param_bytes, self.main_grad_bytes, self.opt_state_bytes + self.master_bytes


def _fields(p: Plans) -> dict[str, np.ndarray]:
    keys = ("dp", "tp", "pp", "mb", "m", "v", "zero", "ckpt", "sp", "amp")
    return {k: getattr(p, k) for k in keys}
