"""Step time and memory of many plans at once, from a workload's per-micro-batch costs.

One training step of a plan (dp x tp x pp GPUs, `m` micro-batches of `mb` samples per
data-parallel rank):

    per micro-batch  t_mb = max(fwd + bwd + recompute, host) + 2 v p2p          (pp > 1)
    pipeline         T_pipe = (m + (pp - 1) / v) t_mb
                     (1F1B: the bubble is (pp-1) micro-batch slots, (pp-1)/(m+pp-1) of the
                     step; interleaving over v virtual stages divides it by v and multiplies
                     the point-to-point sends by v; Narayanan et al. 2021)
    gradients        ddp: all-reduce of the stage's gradients once per step;
                     ZeRO-1/2: reduce-scatter of the gradients + all-gather of the updated
                     parameters (ZeRO-2 with several micro-batches: a reduce-scatter after
                     each one's backward, as it keeps only its shard of the gradients);
                     ZeRO-3 / FSDP: per micro-batch an all-gather of the
                     parameters in forward and again in backward, and a reduce-scatter of the
                     gradients, prefetched one unit ahead so that only what the
                     micro-batch's slot (its compute, or the host's launches where they take
                     longer) cannot cover is exposed (FSDP2, DeepSpeed ZeRO-3)
                     with `overlap_dp`, ddp / ZeRO-1/2 gradient traffic overlaps the last
                     micro-batch's backward (DDP buckets), else it follows it (Megatron 2021)
    optimizer        the stage's parameters (1/dp of them with ZeRO) read and written once
    step             T = T_pipe + exposed gradient traffic + optimizer + fixed per-step time

Memory per GPU, on the worst stage:

    weights + gradients + optimizer state (sharded 1/dp by ZeRO stage 3, 2, 1 respectively)
    + activations of one micro-batch x micro-batches in flight (1F1B: min(m, pp) on the
      first stage; interleaved x (1 + (pp-1)/(pp v)))
    + the working set of the layer being run backward (and the logits on the last stage)
    + two gathered units with ZeRO-3 (the one computing and the one prefetched; a unit is
      one of the stage's layers)
    + PyTorch DDP's gradient buckets (a trace's plans: a copy of the gradients)

Data-parallel ranks are laid out next to the tensor-parallel ones (Megatron's order: tp
innermost, then dp, then pp), which decides whether a group stays inside a node.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.hardware.network import Cluster, collective_time_s, p2p_time_s
from perfcast.plan.plans import Plans

# Shares of compute that data-parallel traffic can hide behind. Assumptions, not measured:
# DDP's first gradient bucket is ready only after the last layers' backward and the last
# bucket's all-reduce starts when backward ends, so not all of backward covers the traffic;
# FSDP's prefetched all-gathers and reduce-scatters share SMs and memory bandwidth with the
# compute they overlap. Both are listed in every plan's assumptions.
DP_HIDDEN_BY_BACKWARD = 0.8
FSDP_HIDDEN_BY_COMPUTE = 0.9
OVERLAP_ASSUMPTION = (
    f"data-parallel traffic hides behind at most {DP_HIDDEN_BY_BACKWARD:.0%} of backward (DDP, "
    f"ZeRO-1/2) or {FSDP_HIDDEN_BY_COMPUTE:.0%} of compute (FSDP prefetch), and one layer "
    "unit's share of it is always exposed (assumed, not measured)"
)

GIB = float(1 << 30)


@dataclass
class PlanCosts:
    """Arrays, one entry per plan."""

    step_s: np.ndarray
    samples_per_s: np.ndarray
    pipeline_s: np.ndarray
    bubble_frac: np.ndarray
    tp_comm_s: np.ndarray
    pp_comm_s: np.ndarray
    dp_comm_s: np.ndarray  # total gradient / parameter traffic per step
    dp_exposed_s: np.ndarray  # the part of it the step waits for
    recompute_s: np.ndarray
    optimizer_s: np.ndarray
    host_exposed_s: np.ndarray  # step time the host's launches add beyond the GPU's work
    weights_b: np.ndarray
    grads_b: np.ndarray
    optimizer_b: np.ndarray
    activations_b: np.ndarray
    transient_b: np.ndarray
    peak_b: np.ndarray


def _local(p: Plans, cluster: Cluster) -> np.ndarray:
    """Data-parallel ranks on one node (tp innermost, then dp)."""
    per_node = np.maximum(1, cluster.gpus_per_node // np.maximum(p.tp, 1))
    return np.minimum(p.dp, per_node)


def evaluate(
    workload: object,
    p: Plans,
    cluster: Cluster,
    overlap_dp: bool = True,
    fixed_s: float = 0.0,
) -> PlanCosts:
    """Cost and memory of every plan in `p` for `workload` (see the module docstring)."""
    w = workload
    st = w.stage_times(p)  # type: ignore[attr-defined]
    dp, tp, pp = (x.astype(np.float64) for x in (p.dp, p.tp, p.pp))
    v = p.v.astype(np.float64)
    m = p.m.astype(np.float64)
    compute = st.fwd + st.bwd + st.recompute
    t_mb = np.maximum(compute, st.host)
    # Point-to-point between stages: 1/tp of the boundary activations per GPU, crossing a
    # node when a stage's tp x dp ranks fill it; then an all-gather inside the TP group.
    nbytes = w.p2p_bytes(p)  # type: ignore[attr-defined]
    cross = (p.tp * p.dp) >= cluster.gpus_per_node
    p2p_gather = collective_time_s(
        cluster, "allgather", nbytes * tp, tp, np.minimum(tp, cluster.gpus_per_node)
    )
    p2p = p2p_time_s(cluster, nbytes, cross) + p2p_gather
    pp_comm_mb = np.where(p.pp > 1, 2 * v * p2p, 0.0)
    slot = t_mb + pp_comm_mb
    bubble_slots = (pp - 1) / v
    pipeline = (m + bubble_slots) * slot

    params = w.params_stage(p)  # type: ignore[attr-defined]
    wb, gb, ob = w.bytes_per_param()  # type: ignore[attr-defined]
    grad_wire = getattr(w, "grad_bytes", 4)
    local = _local(p, cluster)
    g_bytes = params * grad_wire
    w_bytes = params * wb
    gather = params * (getattr(w, "gather_bytes", 0) or wb)
    ar = collective_time_s(cluster, "allreduce", g_bytes, dp, local, algorithm="auto")
    rs = collective_time_s(cluster, "reducescatter", g_bytes, dp, local)
    ag = collective_time_s(cluster, "allgather", gather, dp, local)
    z = p.zero
    # ZeRO-2 keeps only its shard of the gradients, so with several micro-batches it
    # reduce-scatters after each one's backward (DeepSpeed stage 2 under gradient
    # accumulation); ZeRO-1 keeps them whole until the step and reduces once.
    rs_each_mb = (z == 2) & (p.m > 1)
    once = np.where(z == 0, ar, np.where(z <= 2, np.where(rs_each_mb, 0.0, rs) + ag, 0.0))
    per_mb_rs = np.where(rs_each_mb, rs, 0.0)
    per_mb_fsdp = np.where(z == 3, 2 * ag + rs, 0.0)
    # FSDP's units (and DDP's last bucket) are the stage's layers, not the model's.
    units = np.maximum(1.0, np.ceil(max(1, int(getattr(w, "n_layers", 1))) / pp))
    # Traffic hides behind the micro-batch's slot, not only its GPU work: where the host
    # sets the pace, the GPU idles between launches and the link works meanwhile (a faster
    # link that shortened the GPU work exposed more traffic).
    stretch = np.where(compute > 0, t_mb / np.maximum(compute, 1e-30), 1.0)
    bwd_slot = st.bwd * stretch
    if overlap_dp:
        exposed_once = np.maximum(once - DP_HIDDEN_BY_BACKWARD * bwd_slot, once / units)
        exposed_rs = m * np.maximum(per_mb_rs - DP_HIDDEN_BY_BACKWARD * bwd_slot, per_mb_rs / units)
    else:
        exposed_once, exposed_rs = once, m * per_mb_rs
    exposed_fsdp = m * (
        np.maximum(per_mb_fsdp - FSDP_HIDDEN_BY_COMPUTE * t_mb, 0.0) + per_mb_fsdp / units
    )
    exposed_once = exposed_once + exposed_rs
    per_mb_fsdp = per_mb_fsdp + per_mb_rs
    dp_comm = once + m * per_mb_fsdp
    dp_exposed = np.where(p.dp > 1, exposed_once + exposed_fsdp, 0.0)
    dp_comm = np.where(p.dp > 1, dp_comm, 0.0)
    opt_params = np.where(z >= 1, params / dp, params)
    # How far the GPU runs behind the host when backward's last launch is made: the work of
    # the micro-batches the host enqueued faster than the GPU ran them (with a pipeline,
    # the last one's).
    gpu_lag = np.maximum(compute - st.host, 0.0) * np.where(p.pp > 1, 1.0, m)
    optimizer = w.optimizer_s(opt_params, gpu_lag, 1.0 / pp)  # type: ignore[attr-defined]
    step = pipeline + dp_exposed + optimizer + fixed_s
    # The bubble's share of the whole step (the pipeline's own share is (pp-1)/v over
    # m + (pp-1)/v slots; traffic, optimizer and fixed time lower it).
    bubble = bubble_slots * slot / np.maximum(step, 1e-30)

    # Memory of the worst stage.
    w_mem = np.where(z == 3, w_bytes / dp, w_bytes)
    g_mem = np.where(z >= 2, params * gb / dp, params * gb)
    o_mem = np.where(z >= 1, params * ob / dp, params * ob)
    act_mb = w.act_bytes_stage(p)  # type: ignore[attr-defined]
    inflight = np.where(p.pp > 1, np.minimum(m, pp), 1.0)
    inter = np.where(p.v > 1, 1 + (pp - 1) / (pp * v), 1.0)
    a_mem = act_mb * inflight * inter
    trans = w.transient_bytes(p)  # type: ignore[attr-defined]
    if hasattr(w, "last_stage_logits"):
        # The last stage holds one micro-batch's activations and the logits.
        last = act_mb + w.last_stage_logits(p) + trans
        first = a_mem + trans
        worst_act = np.where(p.pp > 1, np.maximum(first, last), first)
        trans = worst_act - a_mem
    gathered = np.where(z == 3, 2 * gather / units, 0.0)
    # PyTorch DDP's gradient buckets, a second copy of the gradients by default
    # (gradient_as_bucket_view=False), as `whatif ddp`'s memory counts them; Megatron's DDP
    # reduces in its own gradient buffer (a model description: 0 bytes).
    buckets = np.where((z == 0) & (p.dp > 1), params * getattr(w, "ddp_bucket_bytes", 0), 0.0)
    gathered = gathered + buckets
    peak = w_mem + g_mem + o_mem + a_mem + trans + gathered + getattr(w, "fixed_bytes", 0.0)
    batch = p.batch.astype(np.float64)
    return PlanCosts(
        step_s=step,
        samples_per_s=batch / step,
        pipeline_s=pipeline,
        bubble_frac=bubble,
        tp_comm_s=(m + bubble_slots) * st.tp_comm,
        pp_comm_s=(m + bubble_slots) * pp_comm_mb,
        dp_comm_s=dp_comm,
        dp_exposed_s=dp_exposed,
        recompute_s=(m + bubble_slots) * st.recompute,
        optimizer_s=optimizer,
        host_exposed_s=(m + bubble_slots) * (t_mb - compute),
        weights_b=w_mem,
        grads_b=g_mem,
        optimizer_b=o_mem,
        activations_b=a_mem,
        transient_b=trans + gathered,
        peak_b=peak,
    )
