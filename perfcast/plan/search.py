"""Plan search: every data / tensor / pipeline split of N GPUs with micro-batch, schedule,
sharding stage, checkpointing and AMP; the ones that fit, ranked by predicted step time.

All plans are enumerated into arrays and costed in one vectorized pass (`cost.evaluate`);
the search itself is a few NumPy operations, so thousands of plans take well under a second.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, fields
from typing import ClassVar

import numpy as np

from perfcast.errors import OptionError
from perfcast.frames import Columns, Tables, TypedColumns, rows_to_columns
from perfcast.hardware.network import Cluster
from perfcast.plan.cost import GIB, OVERLAP_ASSUMPTION, PlanCosts, evaluate
from perfcast.plan.plans import CKPT_NAMES, Plans, describe

# Memory a plan may use: the device minus a margin for the allocator's fragmentation, the
# CUDA context and NCCL's buffers (which live outside PyTorch's allocator).
USABLE = 0.92


@dataclass
class PlanRow:
    rank: int
    plan: dict[str, int]
    label: str
    step_ms: float
    samples_per_s: float
    tokens_per_s: float | None
    peak_gib: float
    weights_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    other_gib: float
    bubble_pct: float
    exposed_comm_ms: float
    reasons: list[str]


@dataclass(repr=False)
class PlanResult(Tables):
    """What `perfcast plan` prints: the best plans, how many were tried and kept. Tables:
    `best` (one row per plan, its degrees as columns dp, tp, pp, mb, m, v, zero, ckpt, sp,
    amp) and `baseline` (the trace's own configuration, when planning a trace)."""

    RENDERER: ClassVar[tuple[str, str]] = ("perfcast.cli.plan", "render")

    source: str
    gpus: int
    device: str
    cluster: str
    global_batch: int
    capacity_gib: float
    evaluated: int
    fitting: int
    # How long the search took: not part of the answer (two equal plans compare equal).
    search_ms: float = field(compare=False)
    best: list[PlanRow]
    baseline: PlanRow | None = None  # the trace's own configuration, when planning a trace
    assumptions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def _tables(self) -> dict[str, Columns]:
        def flat(rows: list[PlanRow]) -> Columns:
            cols = rows_to_columns(rows, PlanRow)
            del cols["plan"]  # a dict: one column per degree instead
            # Every degree a column, with no rows too (no plan fits): code that selects them runs.
            degrees = {f.name: [r.plan[f.name] for r in rows] for f in fields(Plans)}
            kinds = getattr(cols, "kinds", {}) | {f.name: "int" for f in fields(Plans)}
            ordered = {"rank": cols.pop("rank"), "label": cols.pop("label"), **degrees, **cols}
            return TypedColumns(ordered, kinds)

        tables = {"best": flat(self.best)}
        tables["baseline"] = flat([self.baseline] if self.baseline else [])
        return tables


def _pow2_upto(n: int) -> list[int]:
    out, k = [], 1
    while k <= n:
        out.append(k)
        k *= 2
    return out


def enumerate_plans(
    workload: object,
    gpus: int,
    global_batch: int,
    cluster: Cluster,
    *,
    zero: tuple[int, ...] = (0, 1, 2, 3),
    ckpt: tuple[int, ...] = (0, 1, 2),
    amp: tuple[int, ...] = (0,),
    max_tp: int | None = None,
    interleave: tuple[int, ...] = (1, 2, 4),
) -> Plans:
    """Every plan for `gpus` GPUs and a global batch of `global_batch` samples."""
    layers = int(getattr(workload, "n_layers", 1))
    tp_cap = min(cluster.gpus_per_node, int(getattr(workload, "tp_max", 1)), max_tp or 1 << 30)
    cols: dict[str, list[int]] = {
        k: [] for k in ("dp", "tp", "pp", "mb", "m", "v", "zero", "ckpt", "sp", "amp")
    }
    sp_ok = getattr(workload, "source", "") == "model description"
    # Besides every power of two up to the local batch: the whole local batch (no
    # micro-batching) and the trace's own per-GPU batch, so that the configuration the user
    # runs is among the plans (a batch of 10 per GPU has no power-of-two micro-batch above 2).
    traced_mb = int(getattr(workload, "batch", 0) or 0)
    for tp in _pow2_upto(tp_cap):
        if gpus % tp or not bool(np.all(workload.tp_ok(np.array([tp])))):  # type: ignore[attr-defined]
            continue
        for pp in range(1, min(layers, gpus // tp) + 1):
            if (gpus // tp) % pp:
                continue
            dp = gpus // (tp * pp)
            if global_batch % dp:
                continue
            per = global_batch // dp
            # Every power of two up to the local batch: a cap (64 once) left a large batch
            # that does not fit whole only tiny micro-batches, 10x slower than mb 1024.
            for mb in sorted({*_pow2_upto(per), per, traced_mb}):
                if mb < 1 or per % mb:
                    continue
                m = per // mb
                for v in interleave if pp > 1 else (1,):
                    if v > 1 and (layers % (pp * v) or m % pp):
                        continue
                    for z, c, s, a in itertools.product(
                        zero if dp > 1 else (0,),
                        ckpt,
                        (0, 1) if (tp > 1 and sp_ok) else (0,),
                        amp,
                    ):
                        for key, val in zip(cols, (dp, tp, pp, mb, m, v, z, c, s, a)):
                            cols[key].append(val)
    return Plans(**{k: np.array(v, dtype=np.int64) for k, v in cols.items()})


def _row(
    i: int, rank: int, p: Plans, c: PlanCosts, tokens: int | None, reasons: list[str]
) -> PlanRow:
    peak = float(c.peak_b[i])
    parts = (c.weights_b[i], c.grads_b[i], c.optimizer_b[i], c.activations_b[i])
    return PlanRow(
        rank=rank,
        plan=p.row(i),
        label=describe(p.row(i)),
        step_ms=float(c.step_s[i]) * 1e3,
        samples_per_s=float(c.samples_per_s[i]),
        tokens_per_s=float(c.samples_per_s[i]) * tokens if tokens else None,
        peak_gib=peak / GIB,
        weights_gib=float(parts[0]) / GIB,
        grads_gib=float(parts[1]) / GIB,
        optimizer_gib=float(parts[2]) / GIB,
        activations_gib=float(parts[3]) / GIB,
        other_gib=(peak - float(sum(parts))) / GIB,
        bubble_pct=100 * float(c.bubble_frac[i]),
        exposed_comm_ms=1e3 * float(c.dp_exposed_s[i] + c.tp_comm_s[i] + c.pp_comm_s[i]),
        reasons=reasons,
    )


def _reasons(i: int, p: Plans, c: PlanCosts, best_step: float) -> list[str]:
    r = p.row(i)
    step = float(c.step_s[i])
    out = []
    if best_step > 0 and step > best_step:
        out.append(f"{100 * (step / best_step - 1):.0f}% slower than the best")
    if r["pp"] > 1:
        out.append(
            f"pipeline bubble {100 * c.bubble_frac[i]:.0f}% of the step "
            f"((pp-1)/v = {(r['pp'] - 1) / r['v']:g} of {r['m']} micro-batch slots)"
        )
    if r["tp"] > 1:
        out.append(
            f"tensor-parallel collectives {1e3 * c.tp_comm_s[i]:.1f} ms on the critical path"
        )
    if r["dp"] > 1:
        out.append(
            f"gradient traffic {1e3 * c.dp_comm_s[i]:.1f} ms, "
            f"{1e3 * c.dp_exposed_s[i]:.1f} ms of it exposed"
        )
    if c.host_exposed_s[i] > 0.005 * step:
        out.append(
            f"host-bound: launching the kernels takes {1e3 * c.host_exposed_s[i]:.1f} ms longer "
            "than the GPU needs to run them (more work per GPU, a larger micro-batch or CUDA "
            "graphs would hide it)"
        )
    if r["ckpt"]:
        out.append(
            f"{CKPT_NAMES[r['ckpt']]} recomputation {1e3 * c.recompute_s[i]:.1f} ms buys "
            "activation memory"
        )
    out.append(
        f"memory {c.peak_b[i] / GIB:.1f} GiB: weights {c.weights_b[i] / GIB:.1f}, grads "
        f"{c.grads_b[i] / GIB:.1f}, optimizer {c.optimizer_b[i] / GIB:.1f}, activations "
        f"{c.activations_b[i] / GIB:.1f}, working set {c.transient_b[i] / GIB:.1f}"
    )
    return out


def _ms(x: float) -> str:
    """Milliseconds in plain figures (3 significant, no exponent: 2,140 not 2.14e+03)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def search(
    workload: object,
    cluster: Cluster,
    gpus: int,
    global_batch: int,
    *,
    capacity_gib: float | None = None,
    top: int = 10,
    overlap_dp: bool = True,
    fixed_s: float = 0.0,
    amp: tuple[int, ...] = (0,),
    ckpt: tuple[int, ...] = (0, 1, 2),
    zero: tuple[int, ...] = (0, 1, 2, 3),
    baseline: Plans | None = None,
    half_gpus_note: bool = True,
) -> PlanResult:
    """Enumerate, cost, prune by memory and rank plans for `workload` on `gpus` GPUs; with
    `half_gpus_note`, say when half of them would run the step faster (a second search)."""
    if gpus < 1:
        raise OptionError(f"gpus must be at least 1, not {gpus}")
    if global_batch < 1:
        raise OptionError("the global batch must be at least 1 sample")
    t0 = time.perf_counter()
    plans = enumerate_plans(workload, gpus, global_batch, cluster, amp=amp, ckpt=ckpt, zero=zero)
    if len(plans) == 0:
        raise OptionError(
            f"no plan splits a global batch of {global_batch} over {gpus} GPUs",
            hint="choose a global batch divisible by the data-parallel degrees",
        )
    costs = evaluate(workload, plans, cluster, overlap_dp=overlap_dp, fixed_s=fixed_s)
    cap_gib = capacity_gib if capacity_gib is not None else cluster.device.mem_gb
    cap = cap_gib * GIB * USABLE
    fits = costs.peak_b <= cap
    # Fastest first; within 0.5% of each other, the simpler plan (less recomputation,
    # sharding, model parallelism), then the smaller peak.
    simple = plans.ckpt + 0.5 * plans.zero + (plans.tp > 1) + (plans.pp > 1) + 0.2 * plans.amp
    step_key = np.round(np.log(costs.step_s) / np.log(1.005))
    order = np.lexsort((costs.peak_b, simple, step_key))
    ranked = order[fits[order]]
    search_ms = (time.perf_counter() - t0) * 1e3
    tokens = getattr(workload, "tokens_per_sample", 1)
    tokens = tokens if tokens and tokens > 1 else None
    best_step = float(costs.step_s[ranked[0]]) if ranked.size else 0.0
    rows = [
        _row(int(i), n + 1, plans, costs, tokens, _reasons(int(i), plans, costs, best_step))
        for n, i in enumerate(ranked[:top].tolist())
    ]
    result = PlanResult(
        source=str(getattr(workload, "source", "")),
        gpus=gpus,
        device=cluster.device.name,
        cluster=cluster.describe(),
        global_batch=global_batch,
        capacity_gib=cap_gib,
        evaluated=len(plans),
        fitting=int(fits.sum()),
        search_ms=search_ms,
        best=rows,
        assumptions=list(getattr(workload, "assumptions", [])),
    )
    result.assumptions.append(
        f"a plan fits when its predicted peak is within {USABLE:.0%} of {cap_gib:g} GiB "
        "(the rest for fragmentation, the CUDA context and NCCL buffers; an assumption)"
    )
    if overlap_dp:
        result.assumptions.append(OVERLAP_ASSUMPTION)
    if capacity_gib is not None and capacity_gib > cluster.device.mem_gb:
        result.notes.append(
            f"the memory given ({capacity_gib:g} GiB) is more than the {cluster.device.name} "
            f"has ({cluster.device.mem_gb:g} GiB): plans are kept that would not fit on it"
        )
    if not ranked.size:
        smallest = int(np.argmin(costs.peak_b))
        # The usable share is named: "the smallest needs 19.3 GiB" read as fitting in 20.
        result.notes.append(
            f"no plan fits in {cap_gib:g} GiB ({USABLE:.0%} of it usable, "
            f"{cap / GIB:.3g} GiB): the smallest needs "
            f"{costs.peak_b[smallest] / GIB:.3g} GiB ({describe(plans.row(smallest))})"
        )
    if half_gpus_note and rows and gpus >= 2:
        # Every plan uses all N GPUs: where the global batch leaves each too little work,
        # half of them may run the same step faster (and free the rest).
        half = enumerate_plans(
            workload, gpus // 2, global_batch, cluster, amp=amp, ckpt=ckpt, zero=zero
        )
        if len(half):
            hc = evaluate(workload, half, cluster, overlap_dp=overlap_dp, fixed_s=fixed_s)
            ok = np.flatnonzero(hc.peak_b <= cap)
            if ok.size:
                i = int(ok[np.argmin(hc.step_s[ok])])
                if hc.step_s[i] < 0.995 * best_step:
                    result.notes.append(
                        f"on {gpus // 2:,} GPUs the best plan ({describe(half.row(i))}) runs the "
                        f"step in {_ms(1e3 * hc.step_s[i])} ms, faster than the best on "
                        f"{gpus:,} ({_ms(1e3 * best_step)} ms): a global batch of "
                        f"{global_batch:,} leaves too little work per GPU for {gpus:,}"
                    )
    if baseline is not None:
        bc = evaluate(workload, baseline, cluster, overlap_dp=overlap_dp, fixed_s=fixed_s)
        result.baseline = _row(0, 0, baseline, bc, tokens, _reasons(0, baseline, bc, best_step))
        b = result.baseline
        # Only a configuration on no more GPUs than the search's can be kept instead.
        used = int(baseline.dp[0] * baseline.tp[0] * baseline.pp[0])
        if rows and used <= gpus and b.samples_per_s > rows[0].samples_per_s * 1.005:
            result.notes.append(
                f"the trace's own configuration ({b.label}: {b.samples_per_s:,.0f} samples/s) is "
                f"predicted faster than every plan searched (best {rows[0].samples_per_s:,.0f} "
                "samples/s): keep it, or widen the search (--global-batch)"
            )
    return result
