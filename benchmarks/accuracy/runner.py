"""Measure real optimizations on real workloads and compare with perfcast's predictions.

For each workload the baseline is profiled once with ``perfcast.capture`` (the trace is shared
by all of that workload's rows); then, for each optimization, the baseline and the optimized
variant are timed without the profiler and ``perfcast.predict(trace_dir, apply=[spec])`` is
asked for the predicted step time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.accuracy.recorded_rows import RECORDED_DIR
from perfcast import calibration

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "accuracy.json"
DEFAULT_TRACES = REPO_ROOT / ".bench" / "accuracy-traces"

# What perfcast is asked to apply for each real optimization: the single place to keep in step
# with perfcast's what-if spec grammar. Options that describe the set-up rather than the
# optimization (where the workers run, how many regions are checkpointed) are added by
# predict_spec().
PREDICT_SPECS: dict[str, str | None] = {
    "dataloader-workers": "dataloader-overlap:workers=2",
    "foreach-adam": "fused-optimizer:kind=foreach",
    "remove-item-sync": "remove-host-sync",
    "activation-checkpointing": "activation-checkpointing",
    "batch-size-x2": "batch-size:factor=2",
    "amp": "amp",
    "cuda-graphs": "cuda-graphs",
    "fused-adam": "fused-optimizer:kind=fused",
    "torch-compile": "torch-compile",
    # perfcast has no model of memory formats: a guessed conv speedup would only restate
    # the guess, so this row is measured and left unpredicted.
    "channels-last": None,
}

MISS = 0.10  # rows off by more than this get the explanation below
# What perfcast's models cannot see, found by looking at the rows that missed on the CPU
# machine (stated, not tuned away: see README "Accuracy").
MISS_EXPLANATIONS = {
    "dataloader-workers": (
        "the hand-off costs come from 'perfcast calibrate' (synthetic batches); what is left, "
        "measured on dlrm, whose step is bound by the workers' single core: (1) the profiler "
        "inflates the baseline step more (side by side: 8.3 ms profiled vs 6.4 ms without, "
        "+29%) than the loading the workers take over (4.6 vs 3.8 ms, +22%; op-heavy "
        "compute pays 0.46 us per recorded op, Python-heavy loading records few ops), so the "
        "trace overstates what "
        "is left after the move; (2) the workers' hand-off CPU for real dlrm batches, read "
        "from their schedstat, is 1.0-1.5 ms per batch against 1.0 ms calibrated on "
        "synthetic ones; (3) these rows are the noisiest: the same code measured dlrm at "
        "1.06-1.23x across runs"
    ),
    "batch-size-x2": (
        "on the CPU, per-sample cost grows with batch size once activations leave the "
        "caches; the model scales op time linearly with batch and cannot see caches"
    ),
    "activation-checkpointing": (
        "the model recomputes all forward work (the benchmark checkpoints only the blocks) "
        "and adds torch.utils.checkpoint's bookkeeping as calibrated on small Linear/ReLU "
        "regions; bookkeeping that grows with tensor size (recomputed activations allocated "
        "again) is not in the calibration"
    ),
}
# Relative interquartile range of window times above which a row is flagged as noisy (other
# load on the machine); its measured speedup deserves less trust.
NOISY = 0.10


@dataclass(frozen=True)
class Timing:
    """How many steps to run.

    Baseline and variant are measured in alternating rounds (so drift on a shared machine hits
    both alike); each round times ``windows`` windows of ``window`` steps, a window as a whole.
    """

    warmup: int
    rounds: int
    windows: int
    window: int
    profile_warmup: int


# On CUDA a window of several steps keeps host/device overlap intact (one synchronize per
# window rather than per step, which would hide exactly what remove-item-sync removes).
TIMINGS: dict[tuple[bool, str], Timing] = {
    (True, "cpu"): Timing(warmup=4, rounds=12, windows=2, window=4, profile_warmup=3),
    (False, "cpu"): Timing(warmup=10, rounds=6, windows=3, window=5, profile_warmup=5),
    (True, "cuda"): Timing(warmup=10, rounds=3, windows=2, window=10, profile_warmup=5),
    (False, "cuda"): Timing(warmup=25, rounds=5, windows=3, window=10, profile_warmup=10),
}


def _setup(device: str, threads: int | None, seed: int) -> int:
    import numpy as np
    import torch

    if threads is None:
        # Leave half the cores for DataLoader workers so dataloader-workers has room to run.
        threads = max(1, (os.cpu_count() or 2) // 2)
    torch.set_num_threads(threads)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if device == "cuda":
        torch.backends.cudnn.benchmark = True
        # Every row profiles its baseline, and cuda-graphs rows capture graphs in between.
        # Kineto builds that tear CUPTI down after each trace crash on a later re-init once
        # a graph was captured (torch.compile sets the same for its own CUDA graphs); newer
        # builds never tear down unless this is "1". Set before the first profiler starts.
        os.environ.setdefault("TEARDOWN_CUPTI", "0")
    return threads


def _split_cpus(threads: int) -> tuple[set[int], tuple[int, ...]] | None:
    """(CPUs for the training process, CPUs for DataLoader workers), or None if too few.

    Without pinning, Linux's wake-affine placement often stacks the workers onto the training
    process's CPU on small machines, and the worker variant then swings between a speedup
    and a slowdown from one run to the next.
    """
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    main = min(threads, len(cpus) - 1)
    return set(cpus[:main]), tuple(cpus[main:])


def cpu_label() -> str:
    """The CPU as recorded rows name it: model and core count."""
    return f"{calibration.cpu_model()} ({os.cpu_count()} cores)"


def machine_info(device: str, threads: int) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "cpu_model": calibration.cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": threads,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda_version"] = torch.version.cuda
    return info


def _time_windows(trainer: Any, timing: Timing, warmup: int) -> list[float]:
    for _ in range(warmup):
        trainer.step()
    trainer.synchronize()
    per_step = []
    for _ in range(timing.windows):
        start = time.perf_counter()
        for _ in range(timing.window):
            trainer.step()
        trainer.synchronize()
        per_step.append((time.perf_counter() - start) * 1e3 / timing.window)
    return per_step


def _gib(n_bytes: int) -> float:
    return round(n_bytes / 2**30, 4)


def peak_memory_gib(trainer: Any, steps: int = 2, resident_bytes: int = 0) -> float | None:
    """``torch.cuda.max_memory_allocated()`` over ``steps`` steps of ``trainer``, less
    ``resident_bytes`` (what other live trainers hold), in GiB; None off CUDA. Issue 17's
    memory check compares perfcast's predicted peak with this."""
    import torch

    if trainer.device.type != "cuda":
        return None
    trainer.synchronize()
    torch.cuda.reset_peak_memory_stats(trainer.device)
    for _ in range(steps):
        trainer.step()
    trainer.synchronize()
    return _gib(torch.cuda.max_memory_allocated(trainer.device) - resident_bytes)


def _free_cublas_workspaces(trainer: Any) -> None:
    """Trainers in one process share one cuBLAS handle per thread and stream, and with it one
    workspace (64 MiB on Hopper). Freed here, it is allocated again by whichever trainer runs
    next, so that trainer's peak counts it, as a process of its own would."""
    import torch

    if trainer.device.type != "cuda":
        return
    trainer.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def _allocated_bytes(trainer: Any) -> int:
    """What is allocated on the trainer's device now, after freeing the cuBLAS workspaces."""
    import torch

    if trainer.device.type != "cuda":
        return 0
    _free_cublas_workspaces(trainer)
    return int(torch.cuda.memory_allocated(trainer.device))


def _first_peak_gib(variant: Any, resident_bytes: int, steps: int = 2) -> float | None:
    """The peak from `variant`'s construction through its first `steps` steps, less
    `resident_bytes`: it includes what a first run allocates once (a CUDA graph's private
    pool at capture, cuDNN autotuning, compilation), which a steady-state step does not."""
    import torch

    if variant.device.type != "cuda":
        return None
    for _ in range(steps):
        variant.step()
    variant.synchronize()
    return _gib(torch.cuda.max_memory_allocated(variant.device) - resident_bytes)


def _resume_warmup(trainer: Any) -> int:
    # While the other side ran, DataLoader workers filled their prefetch queue (2 batches
    # each); drain it so the timed steps see the steady state, not a burst of ready batches.
    # On the H200 a host-bound side that followed the other ran its first window slow: the
    # transformer's bf16 variant measured [31.5, 26.3], [18.5, 17.6], [24.8, 21.6] ms in its
    # three rounds, fast only where it ran first. Five steps there, not two.
    settle = 5 if trainer.cfg.device == "cuda" else 2
    return settle + 2 * trainer.cfg.num_workers


def _let_workers_settle(trainer: Any, windows_ms: list[float]) -> None:
    """After a side with DataLoader workers stops, its workers still build the batches it
    asked for ahead (2 per worker). Measured on the 2-core AMD machine, the other side's
    first window after it ran up to 18% slower (cnn 29.6 -> 35.0 ms, dlrm 8.0 -> 10.0 ms)
    while they did, though they run on another CPU. Wait until they are done: each worker
    has at most 2 batches left, and one batch takes a worker at most `num_workers` steps of
    this side (else the workers, not the main process, would set the step time)."""
    workers = trainer.cfg.num_workers
    if workers <= 0 or not windows_ms:
        return
    step_s = statistics.median(windows_ms) / 1e3
    time.sleep(min(2.0, max(0.05, 2 * 2 * workers * step_s)))


@dataclass(frozen=True)
class PairTiming:
    baseline_ms: float
    optimized_ms: float
    noise: float  # the larger relative interquartile range of the two sides' windows
    baseline_windows_ms: tuple[float, ...] = ()
    optimized_windows_ms: tuple[float, ...] = ()


def _rel_iqr(values: list[float]) -> float:
    if len(values) < 4:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4)
    return (q3 - q1) / statistics.median(values)


def measure_pair(
    baseline: Any, variant: Any, timing: Timing, midway: Callable[[], None] | None = None
) -> PairTiming:
    """Median per-step wall time in ms of ``baseline`` and ``variant``, measured interleaved;
    ``midway`` runs between the middle two rounds (the baseline's trace is taken there, so
    that the rounds it is compared with are its neighbours)."""
    start = time.perf_counter()
    for _ in range(timing.warmup):
        variant.step()
    variant.synchronize()
    _let_workers_settle(variant, [(time.perf_counter() - start) * 1e3 / max(1, timing.warmup)])
    samples: tuple[list[float], list[float]] = ([], [])
    for r in range(timing.rounds):
        if midway is not None and r == timing.rounds // 2:
            midway()
        # Alternate who goes first so neither side always follows the other.
        order = ((0, baseline), (1, variant)) if r % 2 == 0 else ((1, variant), (0, baseline))
        for side, trainer in order:
            windows = _time_windows(trainer, timing, _resume_warmup(trainer))
            samples[side].extend(windows)
            _let_workers_settle(trainer, windows)
    return PairTiming(
        statistics.median(samples[0]),
        statistics.median(samples[1]),
        max(_rel_iqr(samples[0]), _rel_iqr(samples[1])),
        tuple(round(x, 4) for x in samples[0]),
        tuple(round(x, 4) for x in samples[1]),
    )


def profile_baseline(trainer: Any, trace_dir: Path, timing: Timing) -> list[Path]:
    """Warm up, then capture into ``trace_dir``: one warm-up and 4 steps timed without the
    profiler, wait=1/warmup=1/active=3 profiled steps, one step and 2 more timed."""
    from perfcast.capture import capture, step

    trace_dir.mkdir(parents=True, exist_ok=True)
    for stale in trace_dir.glob("rank*.json.gz"):
        stale.unlink()  # a previous run's trace must not be mixed into this prediction
    for _ in range(timing.profile_warmup):
        trainer.step()
    trainer.synchronize()
    # As `perfcast profile` does by default: a few steps timed without the profiler before
    # and after the traced ones, written into the trace (predictions fit the profiler's cost
    # to them).
    with capture(trace_dir, wait=1, warmup=1, active=3, unprofiled=4, unprofiled_after=2) as cap:
        for _ in range(cap.schedule_steps or 0):
            trainer.step()
            step()  # explicit boundaries: they include the data fetch and the item() sync
        trainer.synchronize()
    return cap.trace_paths


def predict(trace_dir: Path, spec: str | None) -> tuple[float | None, float | None, str]:
    """(predicted_ms, predicted_baseline_ms, note) from ``perfcast.predict``."""
    import perfcast
    from perfcast.errors import NotApplicableError

    if spec is None:
        return None, None, "perfcast has no model for this optimization"
    try:
        table = perfcast.load(trace_dir)  # once, for the prediction and a no-change fallback
        try:
            result = perfcast.predict(table, [spec])
        except NotApplicableError as exc:
            # perfcast's verdict that the trace shows nothing this optimization would change:
            # a prediction of no change, recorded as such.
            base = perfcast.predict(table, [])
            note = f"not applicable, so no change predicted: {exc}"
            return float(base.baseline_ms), float(base.baseline_ms), note
    except Exception as exc:  # a failing prediction is a result to record, not a crash
        return None, None, f"prediction failed: {type(exc).__name__}: {exc}"
    return float(result.predicted_ms), float(result.baseline_ms), ""


def predict_spec(
    optimization: str, workload: str, preset: str, worker_cpus: Sequence[int]
) -> str | None:
    """PREDICT_SPECS[optimization] with the facts of this benchmark's set-up added: the cores
    the DataLoader workers run on, and how many checkpoint() calls a step of the workload
    makes (the models cannot read either from a trace without the optimization)."""
    from benchmarks.accuracy.workloads import checkpoint_regions

    spec = PREDICT_SPECS[optimization]
    if spec is None:
        return None
    if optimization == "dataloader-workers":
        where = f"worker_cores={len(worker_cpus)}" if worker_cpus else f"cores={os.cpu_count()}"
        return f"{spec},{where}"
    if optimization == "activation-checkpointing":
        return f"{spec}:regions={checkpoint_regions(workload, preset)}"
    return spec


def _speedup(baseline: float | None, optimized: float | None) -> float | None:
    if baseline is None or optimized is None or optimized <= 0:
        return None
    return baseline / optimized


def _row(
    workload: str,
    optimization: str,
    device: str,
    base_ms: float | None,
    opt_ms: float | None,
    pred_ms: float | None,
    pred_base_ms: float | None,
    note: str,
    noise: float | None = None,
    spec: str | None = None,
) -> dict[str, Any]:
    measured = _speedup(base_ms, opt_ms)
    predicted = _speedup(pred_base_ms, pred_ms)
    error = None
    if measured is not None and predicted is not None and measured > 0:
        error = abs(predicted - measured) / measured
    return {
        "workload": workload,
        "optimization": optimization,
        "device": device,
        "spec": spec,
        "baseline_measured_ms": _round(base_ms),
        "optimized_measured_ms": _round(opt_ms),
        "predicted_ms": _round(pred_ms),
        "predicted_baseline_ms": _round(pred_base_ms),
        "measured_speedup": _round(measured),
        "predicted_speedup": _round(predicted),
        "error": _round(error),
        "noise": _round(noise),
        "note": note,
    }


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None or math.isnan(x) else round(x, digits)


# Rows whose models read `perfcast calibrate` numbers.
CALIBRATED = ("dataloader-workers", "activation-checkpointing")


def _calibrate(traces_dir: Path, worker_cpus: Sequence[int], log: Any) -> dict[str, Any]:
    """Run `perfcast calibrate` in this process, with the benchmark's CPU pinning, and point
    the predictions at it: what a user does once on the machine that trains."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "excessive" workers: they have CPUs of their own
        cal = calibration.measure(workers=2, worker_cpus=worker_cpus)
    path = calibration.save(cal, traces_dir / "calibration.json")
    os.environ[calibration.ENV] = str(path)
    print(f"calibrated: {path}", file=log)
    return cal.to_dict()


def run(
    workloads: Sequence[str],
    optimizations: Sequence[str],
    *,
    device: str,
    quick: bool,
    traces_dir: Path,
    threads: int | None = None,
    seed: int = 0,
    pin: bool = True,
    log: Any = sys.stderr,
    recorder: Recorder | None = None,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Run every applicable (workload, optimization) pair; returns the results document.

    With a `recorder`, each row is also written as a recorded row (with its baseline trace)
    as soon as it is measured, and rows it already holds are skipped: a run cut short, or
    stopped at `deadline` (a `time.monotonic()` value; no new workload or row starts after
    it), resumes where it stopped."""
    from benchmarks.accuracy.workloads import OPTIMIZATIONS, TrainConfig, Trainer

    threads = _setup(device, threads, seed)
    timing = TIMINGS[(quick, device)]
    preset = "cuda" if device == "cuda" else ("quick" if quick else "full")
    split = _split_cpus(threads) if pin else None
    base_cfg = TrainConfig(
        device=device, preset=preset, seed=seed, worker_cpus=split[1] if split else ()
    )
    saved_affinity = os.sched_getaffinity(0) if split else None
    saved_env = os.environ.get(calibration.ENV)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    cal: dict[str, Any] | None = None
    longest_row_s = 0.0  # no row starts that the longest so far would carry past `deadline`
    todo: dict[str, list[str]] = {}
    try:
        if split:
            os.sched_setaffinity(0, split[0])
        todo = {
            w: [
                o
                for o in optimizations
                if OPTIMIZATIONS[o].applies_to(w, device) and not (recorder and recorder.has(w, o))
            ]
            for w in workloads
        }
        if any(o in CALIBRATED for opts in todo.values() for o in opts):
            cal = _calibrate(traces_dir, base_cfg.worker_cpus, log)
            if recorder:
                recorder.save_calibration(traces_dir / "calibration.json")
        for workload in workloads:
            opts = todo[workload]
            if not opts or _past(deadline, longest_row_s):
                continue
            baseline = Trainer(workload, base_cfg)
            try:
                # The baseline's peak alone, before any variant shares the device with it.
                base_peak = peak_memory_gib(baseline, steps=timing.profile_warmup)
                for name in opts:
                    if _past(deadline, longest_row_s):
                        print(f"[{workload}] time is up: {name} and later rows left", file=log)
                        break
                    trace_dir = traces_dir / device / workload / name
                    row_start = time.monotonic()
                    row = _run_row(workload, name, baseline, base_cfg, trace_dir, timing, log)
                    row["baseline_peak_mem_gib"] = base_peak
                    row_s = time.monotonic() - row_start
                    longest_row_s = max(longest_row_s, row_s)
                    print(f"[{workload}] {name}: row took {row_s:.0f} s", file=log)
                    rows.append(row)
                    if recorder:
                        recorder.add(row, baseline.batch_size, name in CALIBRATED)
            finally:
                baseline.close()
    finally:
        if saved_affinity is not None:
            os.sched_setaffinity(0, saved_affinity)
        if saved_env is None:
            os.environ.pop(calibration.ENV, None)
        else:
            os.environ[calibration.ENV] = saved_env
    return {
        "machine": machine_info(device, threads),
        "config": {
            "quick": quick,
            "preset": preset,
            "seed": seed,
            "timing": vars(timing),
            "main_cpus": sorted(split[0]) if split else None,
            "worker_cpus": list(split[1]) if split else None,
            "wall_s": round(time.perf_counter() - started, 1),
            # Applicable rows not started (time was up) and not already recorded; rows whose
            # variant failed are in `rows`, unmeasured, and a rerun tries them again.
            "rows_left": sum(len(opts) for opts in todo.values()) - len(rows),
            "rows_failed": sum(r["optimized_measured_ms"] is None for r in rows),
        },
        "calibration": cal,
        "rows": rows,
    }


def _past(deadline: float | None, margin_s: float = 0.0) -> bool:
    return deadline is not None and time.monotonic() + margin_s >= deadline


def _median_traced_ms(traces: Sequence[Path]) -> float | None:
    import perfcast

    its = perfcast.load(traces[0]).iterations if traces else []
    return statistics.median(it.dur_ns / 1e6 for it in its) if its else None


class Recorder:
    """Writes live rows in the recorded format (see recorded_rows), one line per row as soon as
    it is measured, with the baseline trace copied beside them."""

    def __init__(self, source: str, device_name: str, root: Path) -> None:
        from benchmarks.accuracy.recorded_rows import load_rows

        self.source = source
        self.device_name = device_name
        self.root = root
        self.path = root / "rows" / f"{source}.jsonl"
        rows = load_rows([self.path], root) if self.path.exists() else []
        others = sorted({r.device for r in rows} - {device_name})
        if others:
            # One source is one machine: its rows share a calibration and a device name.
            raise ValueError(
                f"{self.path} holds rows measured on {', '.join(others)}, not on this "
                f"{device_name}: resume it there, or record under another source name"
            )
        self.done = {r.id for r in rows}
        self.calibration: str | None = None

    def row_id(self, workload: str, optimization: str) -> str:
        return f"{self.source}/{workload}/{optimization}"

    def has(self, workload: str, optimization: str) -> bool:
        return self.row_id(workload, optimization) in self.done

    def save_calibration(self, path: Path) -> None:
        import shutil

        # A resumed run calibrates again; its rows point at its own calibration, and the
        # first call's (which its rows name) is kept: <source>.json, <source>b.json, ...
        for suffix in ["", *"bcdefghijklmnopqrstuvwxyz"]:
            rel = f"calibrations/{self.source}{suffix}.json"
            if not (self.root / rel).exists():
                break
        else:
            raise ValueError(
                f"{self.root / 'calibrations'}: too many calibrations of {self.source}"
            )
        (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, self.root / rel)
        self.calibration = rel

    def add(self, row: dict[str, Any], batch: int, calibrated: bool) -> None:
        import msgspec

        from benchmarks.accuracy.recorded_rows import RecordedRow

        if row["baseline_measured_ms"] is None or row["optimized_measured_ms"] is None:
            return  # the variant failed: nothing measured to record
        workload, name = row["workload"], row["optimization"]
        traced_ms = row["baseline_traced_ms"]
        # Each row's own baseline trace, taken between its middle rounds.
        trace = f"traces/{self.source}/{workload}.{name}.json.gz"
        dst = self.root / trace
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(Path(row["trace_paths"][0]).read_bytes())
        rec = RecordedRow(
            id=self.row_id(workload, name),
            source=self.source,
            device=self.device_name,
            processor="gpu" if self.device_name != cpu_label() else "cpu",
            workload=workload,
            baseline=f"{workload} baseline",
            variant=name,
            change=name,
            spec=row["spec"],
            baseline_trace=trace,
            measured="unprofiled",
            baseline_ms=row["baseline_measured_ms"],
            variant_ms=row["optimized_measured_ms"],
            baseline_windows_ms=list(row.get("baseline_windows_ms", [])),
            variant_windows_ms=list(row.get("optimized_windows_ms", [])),
            baseline_traced_ms=None if traced_ms is None else round(traced_ms, 4),
            batch=batch,
            variant_batch=batch * 2 if name == "batch-size-x2" else batch,
            calibration=self.calibration if calibrated else None,
            baseline_peak_mem_gib=row.get("baseline_peak_mem_gib"),
            variant_peak_mem_gib=row.get("variant_peak_mem_gib"),
            variant_first_peak_mem_gib=row.get("variant_first_peak_mem_gib"),
            notes=row["note"],
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab") as f:
            f.write(msgspec.json.encode(rec) + b"\n")
        self.done.add(rec.id)


def _run_row(
    workload: str,
    name: str,
    baseline: Any,
    base_cfg: Any,
    trace_dir: Path,
    timing: Timing,
    log: Any,
) -> dict[str, Any]:
    """Measure one pair. The baseline is re-measured for every row, interleaved with the
    variant, and traced between the middle rounds (``trace_dir``): the measured baseline the
    prediction is scored against brackets the trace, as `perfcast profile` brackets it with
    unprofiled steps, so drift between a trace and rows taken minutes later stays out."""
    from benchmarks.accuracy.workloads import OPTIMIZATIONS, Trainer

    device = base_cfg.device
    base_ms: float | None = None
    opt_ms: float | None = None
    noise: float | None = None
    windows: tuple[list[float], list[float]] = ([], [])
    notes = []
    variant = None
    traces: list[Path] = []

    variant_peak: float | None = None
    first_peak: float | None = None

    def take_trace() -> None:
        traces.extend(profile_baseline(baseline, trace_dir, timing))

    try:
        # What the baseline holds between steps, so the variant's peak can be told apart.
        base_resident = _allocated_bytes(baseline)
        if device == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(baseline.device)
        variant = Trainer(workload, OPTIMIZATIONS[name].apply(base_cfg))
        first_peak = _first_peak_gib(variant, base_resident)
        pair = measure_pair(baseline, variant, timing, midway=take_trace)
        _free_cublas_workspaces(baseline)  # for the variant to allocate its own
        variant_peak = peak_memory_gib(variant, resident_bytes=base_resident)
        base_ms, opt_ms, noise = pair.baseline_ms, pair.optimized_ms, pair.noise
        windows = (list(pair.baseline_windows_ms), list(pair.optimized_windows_ms))
        if noise > NOISY:
            notes.append(f"noisy: window times spread {100 * noise:.0f}%")
    except Exception as exc:  # e.g. torch.compile unavailable; keep the other rows
        notes.append(f"variant failed: {type(exc).__name__}: {exc}")
    finally:
        if variant is not None:
            variant.close()
    if not traces:  # the variant failed before the middle rounds
        take_trace()
    print(f"[{workload}] {name}: baseline traced: {traces[0].name}", file=log)
    spec = predict_spec(name, workload, base_cfg.preset, base_cfg.worker_cpus)
    pred_ms, pred_base_ms, pred_note = predict(trace_dir, spec)
    if pred_note:
        notes.append(pred_note)
    if name == "batch-size-x2":
        notes.append("times are per step; each step has twice the samples")
    row = _row(
        workload,
        name,
        device,
        base_ms,
        opt_ms,
        pred_ms,
        pred_base_ms,
        "; ".join(notes),
        noise,
        spec,
    )
    row["baseline_windows_ms"], row["optimized_windows_ms"] = windows
    row["variant_peak_mem_gib"] = variant_peak
    row["variant_first_peak_mem_gib"] = first_peak
    row["trace_paths"] = [str(p) for p in traces]
    row["baseline_traced_ms"] = _median_traced_ms(traces)
    print(
        f"[{workload}] {name}: baseline {_fmt(base_ms, '.2f')} ms, optimized "
        f"{_fmt(opt_ms, '.2f')} ms, measured speedup {_fmt(row['measured_speedup'], '.3f')}, "
        f"predicted {_fmt(row['predicted_speedup'], '.3f')}",
        file=log,
    )
    return row


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    header = (
        "| workload | optimization | device | baseline ms | optimized ms | measured x "
        "| predicted x | error | note |"
    )
    lines = [header, "|" + "---|" * 9]
    for r in rows:
        err = "-" if r["error"] is None else f"{100 * r['error']:.1f}%"
        base, opt = r["baseline_measured_ms"], r["optimized_measured_ms"]
        lines.append(
            f"| {r['workload']} | {r['optimization']} | {r['device']} "
            f"| {_fmt(base, '.2f')} | {_fmt(opt, '.2f')} "
            f"| {_fmt(r['measured_speedup'], '.3f')} | {_fmt(r['predicted_speedup'], '.3f')} "
            f"| {err} | {r['note']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.accuracy.workloads import OPTIMIZATIONS, WORKLOADS

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.accuracy live",
        description="Measure real optimizations and compare with perfcast's predictions.",
    )
    parser.add_argument("--quick", action="store_true", help="small models, few steps")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="default: cuda when available, else cpu",
    )
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument(
        "--optimizations", nargs="+", choices=list(OPTIMIZATIONS), default=list(OPTIMIZATIONS)
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results JSON")
    parser.add_argument(
        "--traces-dir", type=Path, default=DEFAULT_TRACES, help="where baseline traces are written"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: half the cores)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--record",
        metavar="SOURCE",
        default=None,
        help="also write each row in the recorded format to recorded/rows/SOURCE.jsonl (with "
        "its baseline trace); rows already there are skipped, so an interrupted run resumes",
    )
    parser.add_argument(
        "--recorded-dir",
        type=Path,
        default=RECORDED_DIR,
        help="where recorded rows, traces and calibrations go (default: the project's)",
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="start no new row after this many minutes, nor one that the longest row so far "
        "would carry past them (use with --record, then run again)",
    )
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="do not pin the trainer and DataLoader workers to separate CPUs",
    )
    args = parser.parse_args(argv)

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("benchmarks.accuracy: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    skipped = [o for o in args.optimizations if OPTIMIZATIONS[o].needs_cuda and device != "cuda"]
    if skipped and args.optimizations != list(OPTIMIZATIONS):
        print(
            f"benchmarks.accuracy: skipping CUDA-only {', '.join(skipped)} on {device}",
            file=sys.stderr,
        )

    recorder = None
    if args.record:
        name = torch.cuda.get_device_name() if device == "cuda" else cpu_label()
        try:
            recorder = Recorder(args.record, name, args.recorded_dir)
        except ValueError as exc:
            print(f"benchmarks.accuracy: {exc}", file=sys.stderr)
            return 2
    deadline = None if args.max_minutes is None else time.monotonic() + 60 * args.max_minutes
    doc = run(
        args.workloads,
        args.optimizations,
        device=device,
        quick=args.quick,
        traces_dir=args.traces_dir,
        threads=args.threads,
        seed=args.seed,
        pin=args.pin,
        recorder=recorder,
        deadline=deadline,
    )
    for row in doc["rows"]:
        if row.get("error") is not None and row["error"] > MISS:
            row["explanation"] = MISS_EXPLANATIONS.get(row["optimization"], "not yet explained")
    errors = sorted(r["error"] for r in doc["rows"] if r.get("error") is not None)
    doc["summary"] = {
        "rows_predicted": len(errors),
        "median_error": statistics.median(errors) if errors else None,
        "max_error": errors[-1] if errors else None,
        "rows_over_10pct": sum(e > MISS for e in errors),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(markdown_table(doc["rows"]))
    print(f"\nwrote {args.out} ({len(doc['rows'])} rows, {doc['config']['wall_s']} s)")
    left, failed = doc["config"]["rows_left"], doc["config"]["rows_failed"]
    if failed:
        print(f"{failed} rows failed (their notes say why); a rerun with --record tries them again")
    if recorder:
        print(f"{left} rows left" + (": run the same command again to resume" if left else ""))
    # Nothing measured is a failure, unless a resumed run found every row already recorded.
    return 0 if doc["rows"] or (recorder and not left) else 2
