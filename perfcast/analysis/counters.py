"""GPU performance counters per kernel and per launching op, from a CUPTI range-profiler trace.

With `experimental_config=torch.profiler._ExperimentalConfig(profiler_metrics=[...])`,
torch.profiler asks CUPTI's range profiler for the metrics of every kernel. The kernels are
then replayed once per counter pass and written as `cuda_profiler_range` events that carry
the counter values and no usable time (HTA reads the same events with
`get_cupti_counter_data_with_operators`). The events name the kernel but not the call that
launched it, so the i-th range is paired with the rank's i-th kernel launch call, in order,
when both counts agree (CUPTI profiles the kernels in launch order); the launching op is the
innermost `aten::` op around that call. When the counts differ, no op is named: pairing them
would blame the wrong ops; except in a cut file, where what is left of both starts at the
same kernel and the shorter is paired with the start of the longer (said in the notes).

FLOPs, where the instruction metrics are among those recorded (`smsp__sass_thread_inst_
executed_op_{d,f,h}{add,mul,fma}_pred_on.sum`), count as Nsight Compute's roofline counts
them: add + mul + 2 x fma per precision. Tensor-core instructions are not in those metrics,
so matrix kernels on tensor cores show few FLOPs here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from perfcast.analysis.common import op_around
from perfcast.analysis.notes import input_notes
from perfcast.errors import PerfcastError
from perfcast.events import NONE, EventTable, Kind
from perfcast.frames import Tables
from perfcast.ingest.counters import read_counter_ranges

# Kernel launch calls of the CUDA and HIP runtimes and drivers (graph launches excluded:
# their kernels are not profiled one by one).
_LAUNCH = re.compile(
    r"^(cuda|hip|cu)(Ext)?(Module)?Launch(Cooperative)?Kernel(ExC|Ex|_v\d+)?(_ptsz)?$"
)
_FLOP_METRIC = re.compile(r"sass_thread_inst_executed_op_([dfh])(add|mul|fma)_pred_on\.sum$")
_PRECISION = {"d": "fp64", "f": "fp32", "h": "fp16"}


@dataclass
class CounterKernel:
    """One profiled kernel: its order on the rank, launching op and FLOPs per precision
    from its counters."""

    rank: int
    index: int  # order on the rank (the order CUPTI profiled the kernels in)
    kernel: str
    op: str  # the launching op; "" when the ranges could not be paired with launches
    flops_fp64: float | None  # None: the instruction metrics were not recorded
    flops_fp32: float | None
    flops_fp16: float | None


@dataclass
class CounterValue:
    """Every recorded value, one row per kernel and metric (pivot for a wide table)."""

    rank: int
    index: int
    metric: str
    value: float


@dataclass
class CounterOp:
    """Counter FLOPs per precision summed over the kernels one op launched (None: not
    recorded)."""

    rank: int
    op: str
    kernels: int
    flops_fp64: float | None
    flops_fp32: float | None
    flops_fp16: float | None


@dataclass
class CounterMetric:
    """One counter metric on a rank: its total over the kernels, and how many report it and
    how many are nonzero."""

    rank: int
    metric: str
    total: float
    kernels: int  # kernels that report it
    nonzero: int  # of those, with a value other than 0


@dataclass(repr=False)
class GpuCounters(Tables):
    """Result of `gpu_counters`; tables: by_op (main), by_metric, kernels, values."""

    by_op: list[CounterOp]
    by_metric: list[CounterMetric]
    kernels: list[CounterKernel]
    values: list[CounterValue]
    notes: list[str] = field(default_factory=list)

    ROW_TYPES = {  # noqa: RUF012
        "by_op": CounterOp,
        "by_metric": CounterMetric,
        "kernels": CounterKernel,
        "values": CounterValue,
    }


def _flops(values: dict[str, float]) -> dict[str, float] | None:
    """FLOPs per precision from the instruction metrics, None when none is recorded."""
    out = {"fp64": 0.0, "fp32": 0.0, "fp16": 0.0}
    seen = False
    for metric, value in values.items():
        m = _FLOP_METRIC.search(metric)
        if m:
            seen = True
            out[_PRECISION[m.group(1)]] += value * (2.0 if m.group(2) == "fma" else 1.0)
    return out if seen else None


def gpu_counters(table: EventTable, top: int = 30) -> GpuCounters:
    """Counters per kernel, per launching op and per metric, on every rank that has them.

    >>> import perfcast
    >>> r = gpu_counters(perfcast.load("counters.json.gz"))                 # doctest: +SKIP
    >>> r.to_pandas("values").pivot(index="index", columns="metric")       # doctest: +SKIP
    """
    out = GpuCounters([], [], [], [], notes=input_notes(table))
    is_launch = np.array([bool(_LAUNCH.match(n)) for n in table.names], dtype=bool)
    found_any = False
    with_counters = set(np.unique(table.rank[table.kind == Kind.GPU_COUNTERS]).tolist())
    launch_calls = table.kind_mask([Kind.RUNTIME, Kind.DRIVER]) & is_launch[table.name]
    for info in table.ranks:
        if info.rank not in with_counters:
            continue
        on = table.rank_rows(info.rank)
        found_any = True
        where = f"rank {info.rank}: " if len(table.ranks) > 1 else ""
        try:
            ranges, damaged = read_counter_ranges(info.path)
        except PerfcastError as exc:
            out.notes.append(f"{where}{exc}")
            continue
        if damaged:
            out.notes.append(f"{where}{damaged}")
        ranges.sort(key=lambda r: r.ts)  # stable: file order among equal times
        calls = on[launch_calls[on]]
        calls = calls[np.argsort(table.ts[calls], kind="stable")]
        paired = calls.size if calls.size == len(ranges) else 0
        if not paired and info.truncated and calls.size and ranges:
            # A cut file lost the tail of one sequence or both: what is left of each starts
            # at the same kernel, so the shorter pairs with the start of the longer.
            paired = min(calls.size, len(ranges))
            out.notes.append(
                f"{where}the file is cut: {len(ranges):,} counter ranges and {calls.size:,} "
                f"kernel launch calls are left; the first {paired:,} of each are paired"
            )
        if paired:
            ops = op_around(table, calls[:paired])
            op_names = [table.names[table.name[o]] if o != NONE else "" for o in ops.tolist()]
            op_names += [""] * (len(ranges) - paired)
        else:
            op_names = [""] * len(ranges)
            out.notes.append(
                f"{where}{len(ranges):,} counter ranges but {calls.size:,} kernel launch calls: "
                "the kernels are not paired with their ops (pairing in order would blame the "
                "wrong ones)"
            )
        per_op: dict[str, list[float]] = {}
        per_metric: dict[str, list[float]] = {}
        any_flops = False
        for i, (rng, op) in enumerate(zip(ranges, op_names, strict=True)):
            flops = _flops(rng.values)
            any_flops |= flops is not None
            f = flops or {}
            out.kernels.append(
                CounterKernel(
                    info.rank,
                    i,
                    rng.name,
                    op,
                    f.get("fp64"),
                    f.get("fp32"),
                    f.get("fp16"),
                )
            )
            for metric, value in rng.values.items():
                out.values.append(CounterValue(info.rank, i, metric, value))
                acc = per_metric.setdefault(metric, [0.0, 0, 0])
                acc[0] += value
                acc[1] += 1
                acc[2] += value != 0
            acc = per_op.setdefault(op or "(not paired)", [0, 0.0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += f.get("fp64", 0.0)
            acc[2] += f.get("fp32", 0.0)
            acc[3] += f.get("fp16", 0.0)
        ops_rows = [
            CounterOp(
                info.rank,
                op,
                int(a[0]),
                a[1] if any_flops else None,
                a[2] if any_flops else None,
                a[3] if any_flops else None,
            )
            for op, a in per_op.items()
        ]
        ops_rows.sort(key=lambda r: (-(r.flops_fp32 or 0) - (r.flops_fp16 or 0), -r.kernels))
        out.by_op.extend(ops_rows[:top])
        if len(ops_rows) > top:
            out.notes.append(f"{where}{len(ops_rows) - top} more ops not listed (--top)")
        out.by_metric.extend(
            CounterMetric(info.rank, m, a[0], int(a[1]), int(a[2]))
            for m, a in sorted(per_metric.items())
        )
        if not any_flops:
            out.notes.append(
                f"{where}no FLOP counts: the sass_thread_inst_executed_op_* metrics were not "
                "recorded"
            )
    if not found_any:
        out.notes.append(
            "no GPU counters in this trace (record them with torch.profiler's "
            "experimental_config=_ExperimentalConfig(profiler_metrics=[...]))"
        )
    return out
