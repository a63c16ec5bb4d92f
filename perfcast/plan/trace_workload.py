"""Per-layer costs read once from a trace: the workload the plan search scales.

Why not replay the graph per plan: a plan changes the batch per GPU, splits layers across
GPUs and adds collectives; thousands of plans would need thousands of replays (about a second
each on a large trace). Instead the trace is read once into measured costs, and each plan
scales them by rules; `perfcast whatif` (the zero / tensor-parallel / pipeline-parallel
models) replays one chosen plan on the graph when a user wants the detailed timeline.

Read from the rank's steps (median step; kernels of the last complete step):

- forward and backward GPU time, split into the linear layers' GEMMs (kernels launched under
  aten::linear / addmm / mm / matmul and their backward nodes: what tensor parallelism
  splits), other compute-bound kernels (convolutions, attention) and memory-bound kernels;
  measured collectives are left out (each plan models its own) and calibrate the intra-node
  bus bandwidth when their sizes are known;
- a fixed cost per kernel (the 5th percentile of kernel durations, as the other what-ifs
  take it): GPU time scales with the micro-batch as n_kernels x fixed + (rest) x mb / batch;
- host time of forward + backward (first forward op to last backward op): a micro-batch
  takes at least this long however fast the GPU is (launch-bound steps);
- optimizer time (its host span to its last kernel), scaled by the parameters a GPU updates;
- whatever else the step spends (data loading, synchronizations): a fixed time per step;
- layers: the forward split at every weight-bearing op (conv / linear), each group's forward
  GPU time measured, backward taken in proportion (pipeline stages are contiguous groups of
  balanced time).

Scaling rules a plan applies: tensor parallelism divides the linear layers' GEMM time by tp
and adds an all-reduce of each unit's output forward and backward (Megatron: column-parallel
layers, then a row-parallel one, formed as `whatif tensor-parallel` forms them); everything
else stays replicated. AMP on an fp32 trace
scales compute-bound and memory-bound GPU time and the host time of forward and backward as
`whatif amp:dtype=bf16` changes them on the trace's own graph (`AmpEffect`: achieved 16-bit
efficiency, the casts and their CPU dispatch), so plan and whatif agree. Another GPU
(`--gpu`) scales compute-bound kernels by the peak ratio and memory-bound ones by the
bandwidth ratio.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from perfcast.analysis.common import traced_device
from perfcast.analysis.comms import allreduced_per_step
from perfcast.analysis.notes import no_gpu_work
from perfcast.errors import NotApplicableError
from perfcast.events import EventTable, Kind
from perfcast.graph.model import Graph, NodeKind
from perfcast.graph.phases import Phase, collective_kernel_mask, event_phases
from perfcast.hardware.classify import KernelClass, classify_names
from perfcast.hardware.network import Cluster, collective_time_s
from perfcast.memory_model.facts import TraceFacts, trace_facts
from perfcast.memory_model.model import cudnn_autotune_note, inputs_from_facts
from perfcast.plan.analytic import StageTimes
from perfcast.plan.plans import Plans
from perfcast.whatif.models._parallel_common import balanced_max as _balanced_max

if TYPE_CHECKING:
    from perfcast.analysis.real_step import RealWorld
    from perfcast.hardware.devices import DeviceSpec

_LINEAR_OP = re.compile(r"^aten::(linear|addmm|mm|matmul)$|^(Addmm|Mm|Linear|Matmul)Backward\d*$")
_WEIGHT_OP = re.compile(r"^aten::(conv\d?d|convolution|linear|addmm|matmul|embedding)$")
_COMPUTE = (KernelClass.MATMUL, KernelClass.CONV, KernelClass.ATTENTION)


@dataclass
class TraceWorkload:
    """Measured costs of one rank's step, ready to be scaled per plan."""

    name: str
    cluster: Cluster
    facts: TraceFacts
    batch: int
    step_s: float
    n_groups: int
    group_fwd_s: np.ndarray  # per layer group, forward GPU seconds at the trace's batch
    fwd_lin_s: float
    fwd_cb_s: float  # other compute-bound
    fwd_mem_s: float
    bwd_lin_s: float
    bwd_cb_s: float
    bwd_mem_s: float
    n_kernels: float  # forward + backward kernels per step
    fixed_kernel_s: float
    host_s: float
    optimizer_s_measured: float
    fixed_s: float
    optimizer_host_s: float
    tp_bytes_per_sample: float  # bytes of one tensor-parallel all-reduce per sample
    tp_pairs: int
    linear_share: float
    measured_comm_s: float
    amp_ratio_cb: float = 1.0  # AMP: compute-bound GPU time after / before (AmpEffect)
    amp_ratio_mem: float = 1.0
    amp_ratio_host: float = 1.0
    dev_ratio_cb: float = 1.0
    dev_ratio_mem: float = 1.0
    grad_bytes: int = 4
    # Full activation checkpointing at the traced batch, as the memory model places it on
    # this trace's forward (repeated blocks, else regions of equal op counts): the bytes the
    # regions keep, the largest region's recompute peak, and the forward host time that
    # backward runs again. None: from the layer groups.
    ckpt_kept_bytes: float | None = None
    ckpt_region_bytes: float | None = None
    host_fwd_s: float = 0.0
    # The memory model's working set at its forward / backward peak beyond weights,
    # gradients, optimizer state, activations and the workspace, at the traced batch; and
    # the 16-bit weight copies an autocast trace keeps. None: the largest adjacent pair of
    # saved tensors.
    peak_work_bytes: float | None = None
    autocast_copy_bytes: float = 0.0
    ddp_bucket_bytes: int = 4  # per parameter: DDP's fp32 gradient buckets
    source: str = "trace"
    assumptions: list[str] = field(default_factory=list)

    @property
    def n_layers(self) -> int:
        return self.n_groups

    @property
    def tokens_per_sample(self) -> int:
        return 1

    @property
    def tp_max(self) -> int:
        return self.cluster.gpus_per_node if self.tp_pairs > 0 else 1  # TP inside a node

    def tp_ok(self, tp: np.ndarray) -> np.ndarray:
        return (tp == 1) | (self.tp_pairs > 0)

    # -- costs -------------------------------------------------------------------------
    def _scale(self, p: Plans) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(linear, other compute-bound, memory-bound) multipliers per plan."""
        amp = p.amp > 0
        cb = np.where(amp, self.amp_ratio_cb, 1.0) * self.dev_ratio_cb
        mem = np.where(amp, self.amp_ratio_mem, 1.0) * self.dev_ratio_mem
        lin = cb / p.tp
        return lin, cb, mem

    def stage_times(self, p: Plans) -> StageTimes:
        lin, cb, mem = self._scale(p)
        frac = p.mb / self.batch
        share = self._stage_share(p)
        fixed = self.n_kernels * self.fixed_kernel_s * share
        tot_f = self.fwd_lin_s + self.fwd_cb_s + self.fwd_mem_s
        tot_b = self.bwd_lin_s + self.bwd_cb_s + self.bwd_mem_s
        f_fix = fixed * tot_f / max(tot_f + tot_b, 1e-12)
        b_fix = fixed - f_fix
        fvar = (self.fwd_lin_s * lin + self.fwd_cb_s * cb + self.fwd_mem_s * mem) * share
        bvar = (self.bwd_lin_s * lin + self.bwd_cb_s * cb + self.bwd_mem_s * mem) * share
        fwd = f_fix + np.maximum(fvar - f_fix, 0.0) * frac
        bwd = b_fix + np.maximum(bvar - b_fix, 0.0) * frac
        nbytes = self.tp_bytes_per_sample * p.mb * np.where(p.amp > 0, 0.5, 1.0)
        local = np.minimum(p.tp, self.cluster.gpus_per_node)
        ar = collective_time_s(self.cluster, "allreduce", nbytes, p.tp, local, algorithm="auto")
        comm = self.tp_pairs * ar * share
        fwd = fwd + comm
        bwd = bwd + comm
        rec = np.where(p.ckpt == 2, fwd, 0.0)
        # Recomputing runs the forward's ops again on the host too.
        host_s = self.host_s + np.where(p.ckpt == 2, self.host_fwd_s, 0.0)
        host = host_s * share * np.where(p.amp > 0, self.amp_ratio_host, 1.0)
        return StageTimes(fwd, bwd, rec, 2 * comm + np.where(p.ckpt == 2, comm, 0.0), host)

    def _stage_share(self, p: Plans) -> np.ndarray:
        """Share of the forward time on the slowest of `pp` contiguous, balanced stages."""
        out = np.ones(len(p))
        for k in np.unique(p.pp).tolist():
            out[p.pp == k] = _balanced_max(self.group_fwd_s, int(k)) / max(
                float(self.group_fwd_s.sum()), 1e-12
            )
        return out

    def params_stage(self, p: Plans) -> np.ndarray:
        n = float(self.facts.params)
        lin = self.linear_share
        return n * ((1 - lin) + lin / p.tp) / p.pp

    def act_bytes_stage(self, p: Plans) -> np.ndarray:
        a = float(self.facts.activation_bytes)
        amp = np.where((p.amp > 0) & (self.facts.act_bytes_per_elem == 4), 0.5, 1.0)
        lin = self._linear_act_share()
        tp_scale = (1 - lin) + lin / p.tp
        per = a * p.mb / self.batch * amp * tp_scale / p.pp
        inputs = self._group_input_bytes() * p.mb / self.batch * amp / p.pp
        return np.where(p.ckpt == 2, inputs, per)

    def transient_bytes(self, p: Plans) -> np.ndarray:
        s = [x.nbytes for x in self.facts.saved]
        pair = float(max((s[i] + s[i + 1] for i in range(len(s) - 1)), default=s[0] if s else 0))
        if self.peak_work_bytes is not None:
            # The largest pair on top of every activation and gradient counted tensors that
            # are never live together: ResNet-50's plan was 6.04 GiB where the memory model
            # says 5.56 and the GPU measured 5.6.
            pair = self.peak_work_bytes
        amp = np.where((p.amp > 0) & (self.facts.act_bytes_per_elem == 4), 0.5, 1.0)
        one_region = (
            self.ckpt_region_bytes
            if self.ckpt_region_bytes is not None
            else self.facts.activation_bytes / max(self.n_groups, 1)
        )
        # Under full checkpointing, backward runs one region at a time: its recompute peak
        # (the same region at any pipeline depth) holds the working set of the layer being
        # run backward, which is not added again.
        work = np.where(p.ckpt == 2, max(float(pair), float(one_region)), float(pair))
        copies = np.where(p.amp > 0, self.facts.params * 2.0, self.autocast_copy_bytes) / p.pp
        return work * p.mb / self.batch * amp + copies

    def _linear_act_share(self) -> float:
        total = self.facts.activation_bytes
        lin = sum(s.nbytes for s in self.facts.saved if s.linear)
        return lin / total if total else 0.0

    def _group_input_bytes(self) -> float:
        if self.ckpt_kept_bytes is not None:
            return self.ckpt_kept_bytes
        # Full checkpointing keeps one input per layer group (the group's first saved tensor).
        s = self.facts.saved
        if not s:
            return 0.0
        step = max(1, len(s) // max(self.n_groups, 1))
        return float(sum(x.nbytes for x in s[::step]))

    def p2p_bytes(self, p: Plans) -> np.ndarray:
        s = self.facts.saved
        mid = s[len(s) // 2].nbytes if s else 0
        return mid * p.mb / self.batch / p.tp

    def optimizer_s(
        self,
        params_gpu: np.ndarray,
        gpu_lag_s: np.ndarray | float = 0.0,
        tensor_share: np.ndarray | float = 1.0,
    ) -> np.ndarray:
        """Time the optimizer adds after backward. GPU time scales with the parameters a GPU
        updates; host time (a for-loop optimizer's launches) with the parameter tensors it
        holds, `tensor_share` of them: a pipeline stage holds 1/pp, sharding leaves every
        tensor (a shard of each) on every rank. The host starts the optimizer while the GPU
        still runs backward work queued `gpu_lag_s` ahead of it, so only its host time
        beyond that lag adds to the step: max(GPU, host - lag)."""
        n = max(float(self.facts.params), 1.0)
        return _optimizer_added(
            self.optimizer_s_measured * params_gpu / n,
            self.optimizer_host_s * tensor_share,
            gpu_lag_s,
        )

    def bytes_per_param(self) -> tuple[int, int, int]:
        from perfcast.memory_model.model import OPT_STATE_BYTES

        state = OPT_STATE_BYTES.get(self.facts.optimizer, 8)
        return 4, 4, state

    @property
    def fixed_bytes(self) -> float:
        return float(inputs_from_facts(self.facts).workspace_bytes)


def _optimizer_added(gpu_s: Any, host_s: Any, gpu_lag_s: Any) -> np.ndarray:
    """Time the optimizer adds after backward: its GPU time, or its host time beyond the
    GPU's lag behind the host (the host starts it while backward's kernels drain)."""
    return np.maximum(gpu_s, np.maximum(host_s - gpu_lag_s, 0.0))


@dataclass(frozen=True)
class HostCorrection:
    """A trace's steps and host time without the profiler's own cost, from the replay of the
    corrected graph (perfcast.analysis.real_step): the world `whatif` predicts in."""

    step_ns: dict[int, float]  # iteration index -> the step replayed without the profiler
    host_ns: dict[tuple[int, int], tuple[float, float]]  # (iteration, phase) -> (kept, traced)
    assumption: str

    def kept(self, iteration: int, phases: tuple[Phase, ...]) -> float:
        """Share of the host time of `phases` in `iteration` left without the profiler."""
        kept = traced = 0.0
        for ph in phases:
            k, t = self.host_ns.get((iteration, int(ph)), (0.0, 0.0))
            kept, traced = kept + k, traced + t
        return kept / traced if traced > 0 else 1.0


def host_correction(rw: RealWorld) -> HostCorrection:
    """The steps and host time of a trace replayed without the profiler's own cost."""
    g = rw.graph
    kept, traced, keys = _host_sums(g)
    host_ns = {k: (a, b) for k, a, b in zip(keys, kept, traced, strict=True)}
    step_ns = {
        span.index: float(sim)
        for span, (_, _, _, sim) in zip(g.iterations, rw.real.iteration_ns(), strict=True)
    }
    return HostCorrection(step_ns, host_ns, rw.correction.assumption())


def _host_sums(g: Graph) -> tuple[list[float], list[float], list[tuple[int, int]]]:
    """Host time per (iteration, phase): (durations now, durations as traced, keys)."""
    c = g.cols
    on_host = np.isin(c["kind"], [NodeKind.CPU, NodeKind.LAUNCH, NodeKind.RUNTIME]) & g.alive
    nodes = np.flatnonzero(on_host & (c["iteration"] >= 0) & (c["phase"] >= 0))
    key = c["iteration"][nodes].astype(np.int64) * 256 + c["phase"][nodes].astype(np.int64)
    uniq, inv = np.unique(key, return_inverse=True)
    now = np.bincount(inv, weights=c["dur"][nodes].astype(np.float64))
    traced = np.bincount(inv, weights=c["dur_measured"][nodes].astype(np.float64))
    keys = [(int(k) // 256, int(k) % 256) for k in uniq.tolist()]
    return now.tolist(), traced.tolist(), keys


@dataclass(frozen=True)
class AmpEffect:
    """What `whatif amp:dtype=bf16` does to the forward and backward of the trace: the plan
    search scales by the same per-kernel model (achieved 16-bit efficiency, the casts and
    their CPU dispatch), not by a datasheet peak ratio."""

    compute: float  # compute-bound GPU time after / before
    memory: float  # memory-bound GPU time (casts added) after / before
    host: float  # forward + backward host time after / before
    assumptions: list[str]
    dtype: str = "bf16"  # fp16 (with a grad scaler) on a GPU without bf16 math


def amp_effect(graph: Graph, device: str | None = None) -> AmpEffect | str:
    """The AMP what-if's effect on `graph` (bf16, or fp16 where the GPU has no bf16 math),
    or why it does not apply. `device` names the traced GPU where the trace does not."""
    from perfcast.errors import NotApplicableError
    from perfcast.whatif.registry import parse_spec
    from perfcast.whatif.runner import apply_specs

    named = f",device='{device}'" if device else ""
    try:
        dtype = "bf16"
        try:
            after, applied = apply_specs(graph, [parse_spec(f"amp:dtype=bf16{named}")])
        except NotApplicableError as exc:
            if "no native bf16" not in str(exc):
                raise
            dtype = "fp16"  # a V100: its AMP is fp16 with a grad scaler
            after, applied = apply_specs(graph, [parse_spec(f"amp:dtype=fp16{named}")])
    except NotApplicableError as exc:
        return str(exc)
    fb = (Phase.FORWARD, Phase.BACKWARD)

    def gpu_ns(g: Graph) -> tuple[float, float]:
        c = g.cols
        on = (c["kind"] == NodeKind.GPU) & g.alive & np.isin(c["phase"], [int(p) for p in fb])
        klass = c["klass"]
        comm = klass == int(KernelClass.COMMUNICATION)
        cb = np.isin(klass, [int(k) for k in _COMPUTE])
        dur = c["dur"].astype(np.float64)
        return float(dur[on & cb].sum()), float(dur[on & ~cb & ~comm].sum())

    def host_ns(g: Graph) -> float:
        now, _, keys = _host_sums(g)
        return sum(v for v, (_, ph) in zip(now, keys, strict=True) if ph in fb)

    (cb0, mem0), (cb1, mem1) = gpu_ns(graph), gpu_ns(after)
    h0, h1 = host_ns(graph), host_ns(after)
    return AmpEffect(
        compute=cb1 / cb0 if cb0 else 1.0,
        memory=mem1 / mem0 if mem0 else 1.0,
        host=h1 / h0 if h0 else 1.0,
        assumptions=[a for m in applied for a in m.assumptions],
        dtype=dtype,
    )


def _outermost_named(table: EventTable, rows: np.ndarray, pattern: re.Pattern[str]) -> np.ndarray:
    """Per row, whether it or an enclosing CPU event's name matches `pattern`."""
    match = np.array([bool(pattern.search(n)) for n in table.names], dtype=bool)
    hit = np.zeros(rows.size, dtype=bool)
    cur = rows.copy()
    for _ in range(64):
        live = cur >= 0
        if not live.any():
            break
        c = np.maximum(cur, 0)
        hit |= live & match[table.name[c]]
        cur = np.where(live, table.parent[c], -1)
    return hit


def trace_workload(
    table: EventTable,
    cluster: Cluster,
    rank: int | None = None,
    batch: int | None = None,
    host: HostCorrection | None = None,
    amp: AmpEffect | None = None,
    tp_units: float | None = None,
) -> TraceWorkload:
    """Read the workload of one rank (the first by default) from a loaded trace; with `host`,
    its step and host times are taken without the profiler's own cost; `tp_units`: the
    tensor-parallel units per step the what-if forms on the trace's graph."""
    facts = trace_facts(table, rank)
    rank = facts.rank
    its = [it for it in table.iterations if it.rank == rank]
    if not facts.has_gpu:
        raise NotApplicableError(f"{no_gpu_work(table)}: there is nothing to plan over GPUs")
    if not its or not table.rank_info(rank).has_steps:
        untimed = table.rank_info(rank).untimed_steps  # ranges written without their end
        which = (
            f"no ProfilerStep range with a duration ({', '.join(untimed[:3])} "
            f"lack{'s' if len(untimed) == 1 else ''} 'dur')"
            if untimed
            else "no ProfilerStep ranges"
        )
        raise NotApplicableError(
            f"the trace has {which}: plan needs at least one training step "
            "(record with torch.profiler's schedule and prof.step(), or `perfcast profile`)"
        )
    b0 = batch or facts.batch
    notes: list[str] = []
    if not b0:
        # No shapes: plan in units of the trace's own batch (micro-batches of 1, 2, ...
        # traced batches).
        b0 = 1
        notes.append(
            "the trace has no input shapes (record_shapes=False): batch sizes are in units of "
            "the traced batch, and activation memory is unknown (counted as 0)"
        )
    if not facts.params:
        grads, elements = allreduced_per_step(table).get(rank, (0.0, 0.0))
        if grads:
            facts.param_numels = [int(elements)]
            notes.append(
                f"parameters estimated from the trace's gradient all-reduces: "
                f"{grads / 2**20:.0f} MiB per step = {elements / 1e6:.1f} M gradients"
            )
        else:
            notes.append(
                "parameters unknown (no shapes, no sized all-reduces): weights, gradients and "
                "optimizer state are counted as 0; pass a trace with record_shapes=True"
            )
    # Every per-step input (collectives, GPU and host time) from one step: the median one,
    # whose own time is the step time (mixing the median time with the last step's parts
    # took a 119 ms all-reduce from a 346 ms step whose median all-reduce was 60 ms).
    durs = np.array([it.dur_ns for it in its], dtype=np.float64)
    median_at = int(np.argmin(np.abs(durs - np.median(durs))))
    picked = its[median_at]
    step = next(i for i, it in enumerate(table.iterations) if it is picked)
    step_s = float(durs[median_at]) / 1e9
    traced_step_s = step_s
    phases = event_phases(table)
    in_step = (table.rank == rank) & (table.iteration == step)
    k = np.flatnonzero(in_step & table.is_gpu())
    comm_mask = collective_kernel_mask(table)[k]
    comm_s = float(table.dur[k[comm_mask]].sum()) / 1e9
    k = k[~comm_mask]
    classes = np.asarray(classify_names(table.names), dtype=np.int16)[table.name[k]]
    cb = np.isin(classes, [int(c) for c in _COMPUTE])
    launch = table.launch[k]
    lin = np.zeros(k.size, dtype=bool)
    has = launch >= 0
    lin[has] = _outermost_named(table, table.parent[launch[has]], _LINEAR_OP)
    lin &= cb
    ph = phases[k]
    dur = table.dur[k].astype(np.float64) / 1e9

    def part(phase: Phase, mask: np.ndarray) -> float:
        return float(dur[(ph == phase) & mask].sum())

    fwd = ph == Phase.FORWARD
    bwd = ph == Phase.BACKWARD
    fl, fc, fm = part(Phase.FORWARD, lin), part(Phase.FORWARD, cb & ~lin), part(Phase.FORWARD, ~cb)
    bl, bc, bm = (
        part(Phase.BACKWARD, lin),
        part(Phase.BACKWARD, cb & ~lin),
        part(Phase.BACKWARD, ~cb),
    )
    from perfcast.whatif.kernels import fixed_cost_ns

    fixed = fixed_cost_ns(table.dur[k]) / 1e9
    n_k = float((fwd | bwd).sum())
    # Host busy time of forward + backward and of the optimizer: the steps' top-level ops
    # on every thread, less the time they spent blocked in synchronizing calls.
    ops = np.flatnonzero(in_step & np.isin(table.kind, [Kind.CPU_OP, Kind.USER_ANNOTATION]))
    host_fb = _host_busy(table, ops, phases, (Phase.FORWARD, Phase.BACKWARD))
    host_fwd = _host_busy(table, ops, phases, (Phase.FORWARD,))
    host_opt = _host_busy(table, ops, phases, (Phase.OPTIMIZER,))
    if host is not None:
        step_s = host.step_ns.get(step, step_s * 1e9) / 1e9
        host_fb *= host.kept(step, (Phase.FORWARD, Phase.BACKWARD))
        host_fwd *= host.kept(step, (Phase.FORWARD,))
        host_opt *= host.kept(step, (Phase.OPTIMIZER,))
    gpu_opt = float(dur[ph == Phase.OPTIMIZER].sum())
    opt_s = max(host_opt, gpu_opt)
    gpu_fb = fl + fc + fm + bl + bc + bm
    host_s = host_fb
    # As the plans count it (TraceWorkload.optimizer_s): the optimizer's host time overlaps
    # the GPU's lag behind the host at the end of backward.
    opt_added = float(_optimizer_added(gpu_opt, host_opt, max(gpu_fb - host_s, 0.0)))
    fixed_step = max(0.0, step_s - max(gpu_fb, host_s) - opt_added - comm_s)
    # Layer groups: forward kernels by the latest weight op launched before them.
    fops = ops[phases[ops] == Phase.FORWARD]
    wmask = np.array([bool(_WEIGHT_OP.search(n)) for n in table.names], dtype=bool)
    wops = fops[wmask[table.name[fops]]]
    wts = np.sort(table.ts[wops])
    fk = k[fwd & has]
    if wts.size and fk.size:
        g = np.searchsorted(wts, table.ts[table.launch[fk]], side="right") - 1
        g = np.clip(g, 0, wts.size - 1)
        groups = np.bincount(g, weights=table.dur[fk] / 1e9, minlength=wts.size)
    else:
        groups = np.array([fl + fc + fm])
    # Tensor-parallel units: column layers, then a row layer, as the what-if forms them
    # (`tp_units`), else every two linear layers; the all-reduce carries the row layer's
    # output, taken as the size of the layer's input per sample.
    lin_saved = [s for s in facts.saved if s.linear]
    pairs = 0  # without shapes (nothing saved by a linear layer) the all-reduce is unsized
    if lin_saved:
        pairs = round(tp_units) if tp_units is not None else len(lin_saved) // 2
    tp_bytes = float(np.mean([s.nbytes for s in lin_saved])) / b0 if lin_saved else 0.0
    spec, _, identified = traced_device(table)
    dev_cb = dev_mem = 1.0
    assumptions = [identified] if identified else []
    if spec is not None and spec.name != cluster.device.name:
        fb = cb & (fwd | bwd)
        dev_cb, dtypes = _compute_ratio(table, k[fb], classes[fb], dur[fb], spec, cluster.device)
        dev_mem = spec.mem_bw_gbs / cluster.device.mem_bw_gbs
        assumptions.append(
            f"trace recorded on {spec.name}, planned for {cluster.device.name}: compute-bound "
            f"kernels x{dev_cb:.2f} (per kernel, the peaks of the dtype it runs in on each: "
            f"{dtypes}), memory-bound x{dev_mem:.2f} (bandwidth)"
        )
    elif spec is None:
        assumptions.append(
            f"the trace's device ({facts.device_name or 'unknown'}) is not in the table: its "
            f"measured times are taken as {cluster.device.name} times"
        )
    w = TraceWorkload(
        name=table.ranks[0].path if table.ranks else "trace",
        cluster=cluster,
        facts=facts,
        batch=int(b0),
        step_s=step_s,
        n_groups=int(groups.size),
        group_fwd_s=np.asarray(groups, dtype=np.float64),
        fwd_lin_s=fl,
        fwd_cb_s=fc,
        fwd_mem_s=fm,
        bwd_lin_s=bl,
        bwd_cb_s=bc,
        bwd_mem_s=bm,
        n_kernels=n_k,
        fixed_kernel_s=fixed,
        host_s=host_s,
        optimizer_s_measured=gpu_opt,
        optimizer_host_s=host_opt,
        fixed_s=fixed_step,
        tp_bytes_per_sample=tp_bytes,
        tp_pairs=pairs,
        linear_share=facts.linear_param_numel / facts.params if facts.params else 0.0,
        measured_comm_s=comm_s,
        amp_ratio_cb=amp.compute if amp else 1.0,
        amp_ratio_mem=amp.memory if amp else 1.0,
        amp_ratio_host=amp.host if amp else 1.0,
        dev_ratio_cb=dev_cb,
        dev_ratio_mem=dev_mem,
        host_fwd_s=min(host_fwd, host_s),
        assumptions=assumptions,
    )
    w.peak_work_bytes, w.autocast_copy_bytes = _peak_working_set(facts)
    ckpt = _checkpoint_bytes(facts)
    if ckpt is not None:
        w.ckpt_kept_bytes, w.ckpt_region_bytes, how = ckpt
        w.assumptions.append(f"full-ckpt plans: {how}")
    w.assumptions.extend(notes)
    if host is not None:
        w.assumptions.append(host.assumption)
    w.assumptions.extend(
        [
            f"from rank {rank}'s trace: batch {b0} per GPU, step {step_s * 1e3:.1f} ms "
            + (
                f"without the profiler, {traced_step_s * 1e3:.1f} traced "
                if host is not None
                else "as traced "
            )
            + f"({picked.name}, the median of {len(its)}; every figure here from it), "
            f"forward GPU {(fl + fc + fm) * 1e3:.1f} ms, backward "
            f"{(bl + bc + bm) * 1e3:.1f} ms (linear layers {(fl + bl) * 1e3:.1f} ms), host "
            f"forward+backward {host_s * 1e3:.1f} ms, optimizer {opt_s * 1e3:.1f} ms (host "
            f"{host_opt * 1e3:.1f}, GPU {gpu_opt * 1e3:.1f}), other "
            f"{fixed_step * 1e3:.1f} ms per step; {int(groups.size)} layer groups",
            "per-plan costs are scaled from these measurements (not replayed): GPU time "
            "linear in the micro-batch beyond a fixed cost per kernel; backward per layer "
            "group in proportion to its forward",
        ]
    )
    if host_opt > 0.05 * step_s:
        w.assumptions.append(
            f"ZeRO and FSDP plans keep the optimizer's {host_opt * 1e3:.1f} ms of host time "
            "on every rank (FSDP2 and DeepSpeed step a shard of every parameter tensor; "
            "torch's ZeroRedundancyOptimizer gives each rank whole tensors and would cut a "
            "for-loop optimizer's host time by up to the data-parallel degree); a pipeline "
            "stage holds 1/pp of the tensors and its share of that time"
        )
    if comm_s:
        w.assumptions.append(
            f"the trace's own collectives ({comm_s * 1e3:.1f} ms per step) are replaced by "
            "each plan's modelled ones"
        )
    other = _model_parallel_traffic(table, rank, len(its))
    if other:
        w.assumptions.append(
            f"the trace also runs {other} per step: model-parallel traffic (an embedding's "
            "all-to-all, a sharded layer's gathers) that no plan models, so every plan leaves "
            "it out and is optimistic by up to its time"
        )
    if pairs == 0 and lin_saved:
        # Shapes recorded, but a single linear layer (a CNN's classifier) has no column /
        # row pair to split: re-recording would change nothing.
        w.assumptions.append(
            f"{len(lin_saved)} linear layer{'s' if len(lin_saved) > 1 else ''} per step, no "
            "column/row pair to split: tensor parallelism not offered"
        )
    elif pairs == 0 and fl + bl > 0:
        w.assumptions.append(
            "the linear layers' shapes are not in the trace (record_shapes=False): tensor "
            "parallelism not offered"
        )
    elif pairs == 0:
        w.assumptions.append("no linear layers in the trace: tensor parallelism not offered")
    autotune = cudnn_autotune_note(facts)
    if autotune:
        w.assumptions.append(f"memory: {autotune}")
    return w


def _compute_ratio(
    table: EventTable,
    rows: np.ndarray,
    classes: np.ndarray,
    dur: np.ndarray,
    source: DeviceSpec,
    target: DeviceSpec,
) -> tuple[float, str]:
    """Compute-bound GPU time on `target` over its time on `source`, kernel by kernel at the
    peak of the dtype each runs in there: an fp32 GEMM stays fp32 (PyTorch leaves matmul
    TF32 off), an fp32 convolution runs in TF32 where the device has TF32 tensor cores
    (cuDNN's default), as the device what-if reads them. And the dtypes, time-weighted."""
    from perfcast.hardware import convs_in_tf32
    from perfcast.whatif.kernels import kernel_dtype

    total = float(dur.sum())
    if total <= 0:
        return 1.0, "no compute-bound kernels"
    src_tf32, dst_tf32 = convs_in_tf32(source), convs_in_tf32(target)
    scaled = 0.0
    share: dict[str, float] = {}
    # Per distinct (kernel name, class): a step holds thousands of kernels, few names.
    keys = np.stack([table.name[rows].astype(np.int64), classes.astype(np.int64)], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    per_key = np.bincount(inverse.ravel(), weights=dur, minlength=len(uniq))
    for (name_id, klass), d in zip(uniq.tolist(), per_key.tolist()):
        name = table.names[name_id]
        src, dst = kernel_dtype(name, klass, src_tf32), kernel_dtype(name, klass, dst_tf32)
        scaled += d * source.peak(src) / target.peak(dst)
        key = src if src == dst else f"{src} -> {dst}"
        share[key] = share.get(key, 0.0) + d
    parts = sorted(share.items(), key=lambda kv: -kv[1])
    return scaled / total, ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in parts)


def _peak_working_set(facts: TraceFacts) -> tuple[float, float]:
    """(bytes the memory model's forward / backward peak holds beyond weights, gradients,
    optimizer state, activations, the workspace and autocast's weight copies; those copies)
    at the traced batch. The optimizer's temporaries are left out, as the plans leave them."""
    from perfcast.memory_model.model import estimate

    inp = inputs_from_facts(facts)
    est = estimate(replace(inp, optimizer_impl="fused"))  # fused: no optimizer temporaries
    held = (
        est.weights_bytes
        + est.grads_bytes
        + est.optimizer_bytes
        + est.activations_bytes
        + est.workspace_bytes
        + inp.extra_bytes
    )
    return max(0.0, float(est.peak_bytes - held)), float(inp.extra_bytes)


def _checkpoint_bytes(facts: TraceFacts) -> tuple[float, float, str] | None:
    """(bytes the checkpointed regions keep, the largest region's recompute peak, the memory
    model's note) at the traced batch, as `whatif activation-checkpointing` places the
    regions; None when the trace's forward shows none."""
    from perfcast.memory_model.model import checkpointed_inputs

    inp = checkpointed_inputs(inputs_from_facts(facts))
    if inp is None or not inp.recompute_bytes:
        return None
    return (
        float(sum(inp.saved_bytes)),
        float(max(inp.recompute_bytes)),
        inp.assumptions[-1],
    )


def _model_parallel_traffic(table: EventTable, rank: int, steps: int) -> str:
    """The rank's collectives other than all-reduce and broadcast (which data parallelism
    and its start-up run), per step: "alltoall 850.0 MB in 4.20 ms, ..."; "" when none.
    Only those the steps launched: DDP's all-reduces queued before the trace began carry no
    launch and no arguments, and read as unnamed traffic."""
    from perfcast.analysis.comms import collective_kernel_mask, ops_and_sizes

    in_steps = (table.iteration >= 0) & (table.rank == rank)
    rows = np.flatnonzero(collective_kernel_mask(table) & in_steps)
    if rows.size == 0:
        return ""
    ops, sizes = ops_and_sizes(table, rows)
    size: dict[str, float] = {}
    ms: dict[str, float] = {}
    for op, nbytes, dur in zip(ops, sizes, table.dur[rows].tolist(), strict=True):
        if op in ("allreduce", "broadcast", "barrier"):
            continue
        size[op] = size.get(op, 0.0) + nbytes / max(steps, 1)
        ms[op] = ms.get(op, 0.0) + dur / 1e6 / max(steps, 1)
    return ", ".join(
        f"{op} {size[op] / 1e6:,.1f} MB in {ms[op]:.2f} ms" if size[op] else f"{op} {ms[op]:.2f} ms"
        for op in sorted(size)
    )


def _union_ns(start: np.ndarray, end: np.ndarray) -> float:
    if start.size == 0:
        return 0.0
    o = np.argsort(start, kind="stable")
    s, e = start[o], np.maximum.accumulate(end[o])
    # A new run starts where a span begins after every earlier one ended.
    new = np.r_[True, s[1:] > e[:-1]]
    run = np.cumsum(new) - 1
    first = s[new]
    last = np.zeros(first.size, dtype=np.int64)
    np.maximum.at(last, run, e)
    return float((last - first).sum())


_SYNC = re.compile(r"Synchronize|^cudaMemcpy$|^hipMemcpy$|^cudaStreamWaitEvent$")


def _host_busy(
    table: EventTable, ops: np.ndarray, phases: np.ndarray, which: tuple[Phase, ...]
) -> float:
    """Seconds of top-level ops in the given phases, less their blocking syncs."""
    if ops.size == 0:
        return 0.0
    cpu = np.isin(table.kind[np.maximum(table.parent[ops], 0)], [Kind.CPU_OP, Kind.USER_ANNOTATION])
    is_step = np.array([n.startswith("ProfilerStep") for n in table.names], dtype=bool)
    par = table.parent[ops]
    top = ops[(par < 0) | ~cpu | is_step[table.name[np.maximum(par, 0)]]]
    top = top[~is_step[table.name[top]] & np.isin(phases[top], [int(p) for p in which])]
    # The union of their spans: the main thread may sit in a call (backward) while the
    # autograd thread works, which is one stretch of host time, not two.
    busy = _union_ns(table.ts[top], table.ts[top] + table.dur[top])
    sync_name = np.array([bool(_SYNC.search(n)) for n in table.names], dtype=bool)
    steps = np.unique(table.iteration[ops])
    rt = np.flatnonzero(
        (table.kind == Kind.RUNTIME)
        & sync_name[table.name]
        & np.isin(table.iteration, steps)
        & (table.rank == table.rank[ops[0]])
        & np.isin(phases, [int(p) for p in which])
    )
    busy -= float(table.dur[rt].sum())
    return max(busy, 0.0) / 1e9
