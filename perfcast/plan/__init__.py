"""Plan the run the user has not made yet: data / tensor / pipeline parallelism, ZeRO and
FSDP sharding, micro-batches, checkpointing and AMP, searched and checked against memory.

    from perfcast.plan import plan_trace, plan_model
    plan_trace(perfcast.load("trace.json.gz"), gpus=64, gpu="h100").best[0]
    perfcast.plan("trace.json.gz", gpus=64)   # the same as plan_trace (this package is callable)
    plan_model("gpt-175b", gpus=64, gpu="a100-80gb", global_batch=64)

A trace is read once into measured per-layer costs (`trace_workload`), a model description
into analytic ones (`analytic`); `cost.evaluate` prices every plan from those in one
vectorized pass, `search` prunes what does not fit and ranks the rest.
"""

from __future__ import annotations

import dataclasses
import math
import os
from functools import partial
from typing import Any

import numpy as np

from perfcast import _make_callable
from perfcast.analysis.common import traced_device
from perfcast.analysis.notes import input_notes, no_gpu_work, refuse_counter_trace
from perfcast.errors import NotApplicableError, OptionError, PerfcastError, whole_number
from perfcast.events import EventTable
from perfcast.hardware.devices import DeviceSpec, lookup_device
from perfcast.hardware.network import Cluster, calibrated_from, make_cluster
from perfcast.plan.analytic import AnalyticWorkload
from perfcast.plan.desc import PRESETS, ModelDesc, load_desc
from perfcast.plan.plans import Plans
from perfcast.plan.search import PlanResult, PlanRow, search
from perfcast.plan.trace_workload import (
    AmpEffect,
    TraceWorkload,
    amp_effect,
    host_correction,
    trace_workload,
)

__all__ = [
    "PRESETS",
    "AnalyticWorkload",
    "ModelDesc",
    "PlanResult",
    "Plans",
    "TraceWorkload",
    "load_desc",
    "make_cluster",
    "plan_model",
    "plan_trace",
    "search",
    "trace_workload",
]


def _check_counts(
    gpus: Any, global_batch: Any, top: Any, gpus_per_node: Any, memory_gb: Any = None
) -> None:
    """The plan's counts are integers of at least 1 (global_batch may be None: the default),
    and the memory a positive number of GB."""
    if memory_gb is not None and not (
        isinstance(memory_gb, (int, float))
        and not isinstance(memory_gb, bool)
        and math.isfinite(memory_gb)
        and memory_gb > 0
    ):
        raise OptionError(f"memory_gb must be a number more than 0, not {memory_gb!r}")

    for name, value in (
        ("gpus", gpus),
        ("global_batch", global_batch),
        ("top", top),
        ("gpus_per_node", gpus_per_node),
    ):
        if value is None and name == "global_batch":
            continue
        whole_number(name, value, maximum=_MOST.get(name))


# Beyond any machine or batch there is (a larger count overflowed the plans' int64 arrays
# or printed plans of 10^11 seconds).
_MOST = {
    "gpus": 1 << 20,
    "global_batch": 1 << 30,
    "gpus_per_node": 1024,
    "batch": 1 << 30,
    "nics_per_node": 1024,
}


def _check_arguments(names: dict[str, Any], counts: dict[str, Any], what: str = "plan") -> None:
    """Names (GPU, links) are strings or None; optional counts are integers of at least 1:
    a wrong type stops here with its name, not as an AttributeError deep in the cluster."""
    for name, value in names.items():
        # A GPU may also be a DeviceSpec of the user's own (a part perfcast does not list).
        allowed = (str, DeviceSpec) if name == "gpu" else (str,)
        if value is not None and not isinstance(value, allowed):
            raise OptionError(f"{what}: {name} must be a name (a string), not {value!r}")
        if isinstance(value, str) and not value.strip():
            raise OptionError(f"{what}: {name} is empty: name one (or leave it out)")
    for name, value in counts.items():
        if value is not None:
            whole_number(f"{what}: {name}", value, maximum=_MOST.get(name))


def _cluster_for(
    table: EventTable | None,
    gpu: str | DeviceSpec | None,
    link: str | None,
    inter: str | None,
    gpus_per_node: int,
    nics_per_node: int | None = None,
) -> Cluster:
    """The cluster to plan on: `gpu`, else the trace's GPU."""
    if gpu is not None:
        return make_cluster(
            gpu, intra=link, inter=inter, gpus_per_node=gpus_per_node, nics_per_node=nics_per_node
        )
    spec, named, _ = traced_device(table) if table is not None else (None, None, None)
    if spec is None and named is None:
        raise NotApplicableError(
            "the trace does not name its GPU", hint="pass --gpu (e.g. h100, a100-80gb)"
        )
    if spec is None:
        raise NotApplicableError(
            f"GPU '{named}' is not in perfcast's device table",
            hint="pass --gpu with a known one (e.g. h100, a100-80gb, mi300x)",
        )
    return make_cluster(
        spec,
        intra=link,
        inter=inter,
        gpus_per_node=gpus_per_node,
        nics_per_node=nics_per_node,
        named=named,  # a variant (an H800) runs over its own cut link
    )


def measured_busbw(
    table: EventTable, link: str, max_group: int | None = None
) -> tuple[float, str] | None:
    """The best bus bandwidth (GB/s) the trace's largest multi-GPU collective of 4 MiB or more
    reached (groups of at most `max_group` GPUs: inside one node), and a phrase saying which
    it was; None when the trace has none."""
    from perfcast.analysis.comms import collectives

    try:
        coll = collectives(table, link=link)
    except PerfcastError:
        return None
    rows = [
        r
        for r in coll.by_op
        if r.best_busbw_gbs
        and (r.size_bytes or 0) >= (4 << 20)
        and 1 < r.group_size <= (max_group or r.group_size)
    ]
    if not rows:
        return None
    best = max(rows, key=lambda r: r.size_bytes or 0)
    busbw = float(best.best_busbw_gbs or 0.0)
    return busbw, (
        f"{busbw:.0f} GB/s measured on the trace's {best.op} of "
        f"{(best.size_bytes or 0) / 2**20:.0f} MiB over {best.group_size} GPUs"
    )


# Below this share of the link's peak a measured collective is taken to hold waits for other
# ranks (or a slower link than the device table says), not a bandwidth to plan with.
MIN_CALIBRATION_SHARE = 0.25


def calibrate_cluster(
    table: EventTable, cluster: Cluster
) -> tuple[Cluster, str | None, str | None]:
    """The cluster with its intra-node bus bandwidth set from the trace's own large
    collectives inside one node, when they ran on this cluster's GPU and link; and a phrase
    for what was measured (or None), and one for why a measurement was not used (or None)."""
    from perfcast.hardware.interconnects import default_intra_node_link

    measured = measured_busbw(table, cluster.intra.name, cluster.gpus_per_node)
    if measured is None:
        return cluster, None, None
    busbw, what = measured
    traced = traced_device(table)[0]
    if traced is None or traced.name != cluster.device.name:
        why = f"{what}, on {traced.name if traced else 'an unnamed GPU'}: not used for another GPU"
        return cluster, None, why
    traced_link = default_intra_node_link(traced)
    if traced_link != cluster.intra:
        return cluster, None, f"{what}, over {traced_link.name}: not used for {cluster.intra.name}"
    peak = cluster.intra.bw_gbs_per_direction
    if busbw > peak:
        return cluster, None, f"{what}, above {cluster.intra.name}'s peak: not used"
    if busbw < MIN_CALIBRATION_SHARE * peak:
        share = math.floor(100 * busbw / peak)
        why = (
            f"{what}, {share}% of {cluster.intra.name}'s peak, under "
            f"{MIN_CALIBRATION_SHARE:.0%}: not used, taken as waits for other ranks (if these "
            "GPUs are joined by a slower link, name it)"
        )
        return cluster, None, why
    return calibrated_from(cluster, busbw, what), what, None


def plan_trace(
    table: EventTable | str | os.PathLike[str],
    gpus: int,
    *,
    gpu: str | DeviceSpec | None = None,
    link: str | None = None,
    inter: str | None = None,
    memory_gb: float | None = None,
    global_batch: int | None = None,
    batch: int | None = None,
    gpus_per_node: int = 8,
    nics_per_node: int | None = None,
    top: int = 10,
    rank: int | None = None,
    keep_profiler_cost: bool = False,
    correct: bool | None = None,
) -> PlanResult:
    """Best plans for running the traced step on `gpus` GPUs (default: weak scaling, the
    trace's per-GPU batch on every GPU). The trace's step and host time are taken without
    the profiler's own cost, as `whatif` takes them, unless `keep_profiler_cost` (or
    `correct=False`, as the other API functions spell it)."""
    if correct is not None:
        if not isinstance(correct, (bool, np.bool_)):
            raise OptionError(f"plan_trace: correct must be True or False, not {correct!r}")
        if keep_profiler_cost is True and correct:
            raise OptionError(
                "plan_trace: correct=True and keep_profiler_cost=True say opposite things: give one"
            )
        keep_profiler_cost = not correct
    _check_counts(gpus, global_batch, top, gpus_per_node, memory_gb)
    _check_arguments(
        {"gpu": gpu, "link": link, "inter": inter},
        {"batch": batch, "nics_per_node": nics_per_node},
        "plan_trace",
    )
    if rank is not None:
        whole_number("plan_trace: rank", rank, minimum=None)
    if not isinstance(keep_profiler_cost, (bool, np.bool_)):  # "no" read as yes
        raise OptionError(
            f"plan_trace: keep_profiler_cost must be True or False, not {keep_profiler_cost!r}"
        )
    if isinstance(table, (str, os.PathLike)):
        from perfcast.ingest import load

        table = load(table)
    elif not isinstance(table, EventTable):
        raise OptionError(
            "plan_trace: the trace is a path (str or pathlib.Path) or a loaded EventTable, "
            f"not {type(table).__name__}"
        )
    # As every other API function and `perfcast plan`: an empty trace is said to be one,
    # not "CPU-only".
    table = table.require_events()
    refuse_counter_trace(table, "plan")
    if gpu is None and not table.is_gpu().any():
        raise NotApplicableError(f"{no_gpu_work(table)}: there is nothing to plan over GPUs")
    cluster = _cluster_for(table, gpu, link, inter, gpus_per_node, nics_per_node)
    cluster, cal, unused = calibrate_cluster(table, cluster)
    from perfcast.analysis.real_step import real_world
    from perfcast.graph.build import build_graph
    from perfcast.memory_model.facts import trace_facts

    # One replay with and without the profiler's cost gives the host time whatif starts
    # from, and the AMP what-if on that graph gives the AMP plans their scaling.
    facts = trace_facts(table, rank)
    # Only the planned rank's graph: its own host and GPU work is what the plan scales (a
    # 128-rank folder took 2.3x as long and 2.9x the memory when every rank was built).
    rw = real_world(build_graph(table, ranks={facts.rank}), correct=not keep_profiler_cost)
    host = None if keep_profiler_cost else host_correction(rw)
    fp32 = facts.act_bytes_per_elem == 4
    # A trace whose GPU is unknown is taken as the --gpu's run (as trace_workload takes it);
    # the AMP model reads its tables by a known GPU's name.
    unknown = traced_device(table)[0] is None
    named_gpu = None if gpu is None else gpu if isinstance(gpu, str) else gpu.name
    as_device = named_gpu if unknown else None
    amp_or_why: AmpEffect | str
    if not fp32:
        amp_or_why = "the trace already runs in 16 bits"
    elif as_device is not None and (lookup_device(as_device) is None or "'" in as_device):
        # A DeviceSpec of the user's own: the tables have nothing under its name.
        amp_or_why = (
            "the trace names no GPU, and the AMP model's efficiency tables are per known GPU "
            f"({as_device!r} is not one)"
        )
        as_device = None
    else:
        amp_or_why = amp_effect(rw.graph, as_device)
    amp = amp_or_why if isinstance(amp_or_why, AmpEffect) else None
    from perfcast.whatif.models.tensor_parallel import units_per_step

    tp_units = units_per_step(rw.graph, facts.rank)
    w = trace_workload(
        table, cluster, rank=rank, batch=batch, host=host, amp=amp, tp_units=tp_units
    )
    if amp is not None:
        w.assumptions.append(
            f"AMP plans ({amp.dtype} autocast) scale forward and backward as "
            f"`whatif amp:dtype={amp.dtype}"
            + (f",device='{as_device}'" if as_device else "")
            + "` "
            f"predicts on this trace: compute-bound GPU time x{amp.compute:.2f}, memory-bound "
            f"x{amp.memory:.2f} (casts added), host x{amp.host:.2f}"
        )
    elif fp32:
        w.assumptions.append(f"no AMP plans: {amp_or_why}")
    if cal:
        w.assumptions.append(f"intra-node bus bandwidth calibrated: {cal}")
    if unused:
        w.assumptions.append(f"the trace's own collectives: {unused}")
    gb = w.batch * gpus if global_batch is None else global_batch
    amp_choices = (0, 1) if amp is not None else (0,)
    world = max((i.world_size or 1) for i in table.ranks)
    # The traced configuration itself: its predicted step checks the scaling against what
    # the trace measured (on its own GPU count, which may exceed the search's).
    base = Plans.single(dp=world, mb=w.batch, m=1)
    capacity = memory_gb
    traced_spec = traced_device(table)[0]
    same_gpu = traced_spec is None or traced_spec.name == cluster.device.name
    if capacity is None and w.facts.device_bytes and traced_spec is not None and same_gpu:
        # On the trace's own GPU, its recorded totalGlobalMem, as whatif's memory reads it:
        # the device table's "80 GB" taken as GiB is 0.8 GiB more than an H100 has.
        capacity = round(w.facts.device_bytes / 2**30, 2)
    searched = partial(
        search, w, cluster, gpus, gb, capacity_gib=capacity, fixed_s=w.fixed_s, ckpt=(0, 2)
    )
    result = searched(top=top, amp=amp_choices, baseline=base)
    # What the input's own notes say (a truncated file, ranks missing from the folder) is
    # said here too: a plan from a damaged trace is no better than the trace.
    result.notes[:0] = input_notes(table)
    if amp is not None and result.best and result.best[0].plan["amp"]:
        # The best plan without AMP (only its best row is read: no second half-GPUs search).
        plain = searched(top=1, amp=(0,), half_gpus_note=False).best
        note = _amp_confidence(result.best[0], plain[0], amp.dtype) if plain else None
        if note:
            result.notes.append(note)
    if world > 1:
        result.notes.append(
            f"the trace ran on {world} ranks; its own collectives were replaced by modelled ones"
        )
    b = result.baseline
    off = b.step_ms / (w.step_s * 1e3) - 1 if b is not None and w.step_s > 0 else 0.0
    # On another GPU the traced configuration is meant to differ from the trace's step: the
    # note read as a scaling error ("+96.1%" for an H100 trace planned on an A100).
    if b is not None and abs(off) > 0.02 and same_gpu:
        why = (
            f": the trace ran {w.measured_comm_s * 1e3:.1f} ms of collective kernels per step "
            "(waiting for other ranks included), which the plans model afresh "
            f"({b.exposed_comm_ms:.1f} ms exposed here)"
            if w.measured_comm_s > 0
            else ""
        )
        result.notes.append(
            f"the traced configuration ({b.label}) is planned at {b.step_ms:.1f} ms, where the "
            f"trace's step is {w.step_s * 1e3:.1f} ms ({100 * off:+.1f}%)" + why
        )
    if not w.facts.params:
        from perfcast.graph.phases import Phase, event_phases

        trained = bool((event_phases(table) == Phase.BACKWARD).any())
        why = (
            "no shapes, no sized all-reduces"
            if trained
            else "the trace has no backward pass (inference?), so no gradients name them"
        )
        fix = (
            "trace with record_shapes=True for a plan that prices them"
            if trained
            else "plan a training step from a trace of one"
        )
        measured = w.facts.measured_peak_bytes
        seen = (
            f" (the trace's memory events measured {measured / 2**30:.1f} GiB per rank, which "
            "the plans' memory does not include)"
            if measured
            else ""
        )
        result.notes.append(
            f"the model's parameters are unknown ({why}): gradient traffic, weights and "
            f"optimizer state count as 0, so data parallelism looks free and every plan "
            f"fits{seen}; " + fix
        )
    return result


def _amp_confidence(best: PlanRow, alt: PlanRow, dtype: str = "bf16") -> str | None:
    """A note when the best plan owes its lead over the best one without AMP (`alt`) to AMP
    by less than the AMP model's measured error (as `advise` leaves such a gain unranked:
    the measured speedup may be as low as gain / (1 + band))."""
    from perfcast.advisor.advisor import _band, _bands

    band, pairs = _band(f"amp:dtype={dtype}", _bands())
    if band is None:
        return None
    gain = alt.step_ms / best.step_ms
    if gain / (1.0 + band) > 1.0:
        return None
    return (
        f"the best plans use AMP, predicted {gain:.2f}x faster than the best without it "
        f"({alt.label}: {alt.step_ms:.1f} ms); the AMP model has missed by up to "
        f"{100 * band:.0f}% on the project's {pairs} measured pair(s), more than this gain: "
        "measure one AMP step before relying on it"
    )


def plan_model(
    model: str | ModelDesc,
    gpus: int,
    *,
    gpu: str | DeviceSpec = "h100",
    link: str | None = None,
    inter: str | None = None,
    memory_gb: float | None = None,
    global_batch: int | None = None,
    gpus_per_node: int = 8,
    nics_per_node: int | None = None,
    top: int = 10,
    overlap_dp: bool = True,
    **workload_kw: Any,
) -> PlanResult:
    """Best plans for a described model (a preset name, JSON, or a `ModelDesc`)."""
    _check_counts(gpus, global_batch, top, gpus_per_node, memory_gb)
    _check_arguments(
        {"gpu": gpu, "link": link, "inter": inter}, {"nics_per_node": nics_per_node}, "plan_model"
    )
    if not isinstance(model, (str, ModelDesc)):
        raise OptionError(
            "plan_model: model is a preset name, a JSON file or inline JSON, or a ModelDesc, "
            f"not {type(model).__name__}"
        )
    known = {f.name for f in dataclasses.fields(AnalyticWorkload)} - {
        "desc",
        "cluster",
        "assumptions",
    }
    unknown = sorted(set(workload_kw) - known)
    if unknown:
        raise OptionError(
            f"plan_model: no option {unknown[0]!r}", hint="options: " + ", ".join(sorted(known))
        )
    desc = load_desc(model) if isinstance(model, str) else model
    cluster = make_cluster(
        gpu, intra=link, inter=inter, gpus_per_node=gpus_per_node, nics_per_node=nics_per_node
    )
    w = AnalyticWorkload(desc, cluster, **workload_kw)
    gb = gpus if global_batch is None else global_batch
    return search(
        w,
        cluster,
        gpus,
        gb,
        capacity_gib=memory_gb,
        top=top,
        overlap_dp=overlap_dp,
    )


_make_callable(__name__)  # perfcast.plan(...) is plan_trace(...)
