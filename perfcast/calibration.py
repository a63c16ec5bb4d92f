"""Machine constants that a trace without the optimization cannot show, measured here.

Some what-ifs add work that the baseline trace never ran: with DataLoader workers
the main process must receive each batch from a worker process; with activation
checkpointing every checkpointed region pays torch.utils.checkpoint's own
bookkeeping. How long those take depends on the machine and the OS far more
than on the model. On this project's 2-core VM, receiving a batch costs the main
thread 0.4-1.2 ms plus 0.2-0.4 ms per tensor, the longer the workers sat idle
the more: PyTorch's default `file_descriptor` sharing strategy passes every
tensor's shared-memory file descriptor over a fresh Unix-socket connection to
the worker (with an authentication handshake), and every message between
processes wakes a CPU, from a deeper idle state the longer it slept.

`perfcast calibrate` measures these costs with small synthetic microbenchmarks,
independent of any user workload, and writes them to a JSON file that the
models read (`PERFCAST_CALIBRATION` names another file, or `off` to ignore it).
A model that used a calibration says so, and on which machine it was measured,
in the prediction's assumptions. Run it on the machine that trains.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from perfcast.errors import PerfcastError
from perfcast.machine import machine_id
from perfcast.paths import not_a_file, user_cache_dir

ENV = "PERFCAST_CALIBRATION"
FORMAT = 2


@dataclass(frozen=True)
class DataLoaderCosts:
    """What handing a batch of k tensors from a worker process to the main process costs.

    On the main thread: batch_ms[i] + tensor_ms[i] * k after the workers sat idle for
    gaps_ms[i] (a longer idle gap means a deeper CPU idle state to wake the worker from: on
    this project's VM 0.4 ms after 2 ms, 1.3 ms after 32 ms, for one tensor); between and
    beyond the measured gaps, interpolated in log(gap) and held at the ends. On the worker,
    beyond building the batch: worker_batch_ms + worker_tensor_ms * k (shared-memory storage
    for the collated tensors, pickling, serving the file descriptors)."""

    gaps_ms: list[float]
    batch_ms: list[float]
    tensor_ms: list[float]
    worker_batch_ms: float
    worker_tensor_ms: float
    workers: int
    sharing_strategy: str
    # "k=<tensors>,gap=<ms>" -> median receive ms; "k=<tensors>,worker" -> worker extra CPU ms
    samples: dict[str, float]

    def receive_ms(self, tensors: int, gap_ms: float) -> float:
        k = max(tensors, 1)
        per_gap = [b + t * k for b, t in zip(self.batch_ms, self.tensor_ms)]
        if not per_gap:
            return 0.0
        return _interp_log(gap_ms, self.gaps_ms, per_gap)

    def worker_ms(self, tensors: int) -> float:
        return self.worker_batch_ms + self.worker_tensor_ms * max(tensors, 1)


def _interp_log(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """ys at x, linear in log(x) between the (ascending) xs, constant beyond them."""
    if x <= xs[0] or len(xs) == 1:
        return ys[0]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            w = (math.log(x) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
            return ys[i - 1] + w * (ys[i] - ys[i - 1])
    return ys[-1]


@dataclass(frozen=True)
class CheckpointCosts:
    """torch.utils.checkpoint's own cost per step (forward + backward), beyond the recomputed
    forward itself: region_ms per checkpointed region plus op_ms per op recomputed in it
    (saved-tensor hooks, RNG state, the recompute's bookkeeping)."""

    region_ms: float
    op_ms: float
    use_reentrant: bool
    samples: dict[str, float]  # ops in the region -> measured extra ms

    def extra_ms(self, regions: int, ops: int) -> float:
        return self.region_ms * regions + self.op_ms * ops

    def noisy(self) -> bool:
        """Whether a larger region measured cheaper than a smaller one by more than a tenth,
        or any extra below zero (the machine was busy while it ran; the fit is then not to
        be trusted)."""
        vals = [v for _, v in sorted((int(k), v) for k, v in self.samples.items())]
        if any(v < 0 for v in vals):  # costs no time below zero: the baseline runs were slowed
            return True
        # Differences under 0.01 ms are timer noise, not a cheaper region.
        return any(b < 0.9 * a - 0.01 for a, b in itertools.pairwise(vals))


@dataclass(frozen=True)
class ProfilerCosts:
    """What torch.profiler adds to a step per recorded event on this machine (ns): an op and
    each recorded input (record_shapes), an op without shapes, a Python frame (with_stack), a
    [memory] event, and a runtime call (CUPTI; None when measured without a GPU). See
    perfcast.real.measure."""

    op_ns: float
    input_ns: float
    op_no_shapes_ns: float
    python_ns: float
    memory_ns: float
    runtime_ns: float | None
    note: str = ""
    # Not a profiler cost: this CPU's time per small ATen op (torch.neg on a 32x32 CPU
    # tensor) without the profiler, to compare hosts (`device:host=FILE`). None in files
    # written before it was measured.
    host_op_ns: float | None = None
    # How much longer the ops' own work runs in a profiled training step, beyond the
    # per-event costs, measured on a reference CNN step (perfcast.real.measure); None in files
    # written before it was measured (the project's constant is used then).
    work_share: float | None = None

    def noisy(self) -> str:
        """Why the per-op costs cannot both be right ("" when they can): record_shapes records
        all an op without it does and more, so an op costs no less with it; and on the
        machines measured so far it cost 1-2x as much (8 calibrations; 4x in the oldest), so
        far more means the rounds were disturbed (a busy machine)."""
        with_shapes = self.op_ns + self.input_ns  # the one-input op timed with record_shapes
        plain = self.op_no_shapes_ns
        if plain <= 0:
            return ""
        ratio = with_shapes / plain
        if ratio < _MIN_SHAPES_RATIO:
            return f"an op measured cheaper with record_shapes than without ({ratio:.2f}x)"
        if ratio > _MAX_SHAPES_RATIO:
            return f"an op measured {ratio:.0f}x as costly with record_shapes as without"
        return ""


# Bounds of an op's profiler cost with record_shapes over without, beyond which a calibration
# says it was disturbed (timer noise on a 1.8 µs cost: 10% below; the highest seen: 4x).
_MIN_SHAPES_RATIO = 0.9
_MAX_SHAPES_RATIO = 8.0


@dataclass(frozen=True)
class Calibration:
    machine: dict[str, Any]
    created: str
    dataloader: DataLoaderCosts | None
    checkpoint: CheckpointCosts | None
    path: str = ""
    profiler: ProfilerCosts | None = None

    def source(self) -> str:
        """Where the numbers come from, for assumption texts."""
        host = self.machine.get("hostname", "?")
        return f"calibrated on {host} ({self.created[:10]}, {self.path or 'in memory'})"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("path")
        d["format"] = FORMAT
        return d


def default_path() -> Path:
    return user_cache_dir() / "calibration.json"


def _configured_path() -> Path | None:
    value = os.environ.get(ENV, "").strip()
    if value.lower() in ("off", "none", "0"):
        return None
    return Path(value) if value else default_path()


def is_active_path(path: str | Path) -> bool:
    """Whether the models read a calibration written to `path` (the default file, or the one
    $PERFCAST_CALIBRATION names)."""
    configured = _configured_path()
    return configured is not None and Path(path).resolve() == configured.resolve()


_cache: dict[tuple[str, float], Calibration] = {}


def active() -> Calibration | None:
    """The calibration the models use: $PERFCAST_CALIBRATION, else the default file if any."""
    path = _configured_path()
    if path is None:
        return None
    try:
        mtime = path.stat().st_mtime
    except OSError:
        if os.environ.get(ENV, "").strip():
            raise PerfcastError(
                f"calibration file not found ({ENV} names it); run "
                f"'perfcast calibrate -o {path}' or set {ENV}=off",
                path=str(path),
            ) from None
        return None
    key = (str(path), mtime)
    if key not in _cache:
        _cache.clear()
        _cache[key] = load(path)
    return _cache[key]


def load(path: str | Path) -> Calibration:
    p = Path(path)
    special = not_a_file(p)
    if special:
        raise PerfcastError(f"{special} (a calibration file)", path=str(p))
    try:
        raw = json.loads(p.read_text())
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        if raw.get("format") != FORMAT:
            raise ValueError(f"format {raw.get('format')!r}, expected {FORMAT}")
        dl = raw.get("dataloader")
        ck = raw.get("checkpoint")
        pr = raw.get("profiler")
        cal = Calibration(
            machine=dict(raw["machine"]),
            created=str(raw["created"]),
            dataloader=DataLoaderCosts(**dl) if dl else None,
            checkpoint=CheckpointCosts(**ck) if ck else None,
            path=str(p),
            profiler=ProfilerCosts(**pr) if pr else None,
        )
        _check_values(cal)
        return cal
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        # RecursionError: json nested past the interpreter's limit, a damaged file too.
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise PerfcastError(
            f"not a perfcast calibration file ({why}); run 'perfcast calibrate' again "
            f"or set {ENV}=off",
            path=str(p),
        ) from None


# A per-event profiler cost or a host op above this (1 ms) is no measurement of this kind.
_MAX_EVENT_NS = 1e6


def _number(name: str, value: object, low: float, high: float) -> None:
    """ValueError unless `value` is a real number in [low, high] (the message names it)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(float(value)) or not low <= float(value) <= high:  # type: ignore[arg-type]
        raise ValueError(f"{name} is {value!r}, expected a number from {low:g} to {high:g}")


def _check_values(cal: Calibration) -> None:
    """The values the models compute with, in range: a hand-edited or damaged file fails
    here with its field's name, not as an internal error (or a step slower without the
    profiler than with it) in whatever model reads it later."""
    pr = cal.profiler
    if pr is not None:
        for name in ("op_ns", "input_ns", "op_no_shapes_ns", "python_ns", "memory_ns"):
            _number(f"profiler.{name}", getattr(pr, name), 0.0, _MAX_EVENT_NS)
        for name in ("runtime_ns", "host_op_ns"):
            if getattr(pr, name) is not None:
                _number(f"profiler.{name}", getattr(pr, name), 0.0, _MAX_EVENT_NS)
        if pr.work_share is not None:
            _number("profiler.work_share", pr.work_share, 0.0, 1.0)
    dl = cal.dataloader
    if dl is not None:
        lists = {"gaps_ms": dl.gaps_ms, "batch_ms": dl.batch_ms, "tensor_ms": dl.tensor_ms}
        for name, values in lists.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"dataloader.{name} is not a list of numbers")
            for v in values:
                _number(f"dataloader.{name}", v, -1e3 if name == "tensor_ms" else 0.0, 1e4)
        if len({len(v) for v in lists.values()}) != 1:
            raise ValueError("dataloader.gaps_ms, batch_ms and tensor_ms differ in length")
        if min(dl.gaps_ms) <= 0:
            raise ValueError("dataloader.gaps_ms must be above 0")
        _number("dataloader.worker_batch_ms", dl.worker_batch_ms, -1e3, 1e4)
        _number("dataloader.worker_tensor_ms", dl.worker_tensor_ms, -1e3, 1e4)
    ck = cal.checkpoint
    if ck is not None:
        _number("checkpoint.region_ms", ck.region_ms, -1e3, 1e4)
        _number("checkpoint.op_ms", ck.op_ms, -1e3, 1e4)
        if not isinstance(ck.samples, dict) or not all(
            isinstance(k, str) and k.isdigit() for k in ck.samples
        ):
            raise ValueError("checkpoint.samples is not a map of op counts to ms")
        for v in ck.samples.values():
            _number("checkpoint.samples", v, -1e4, 1e4)


def save(cal: Calibration, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps(cal.to_dict(), indent=2) + "\n")
        tmp.replace(p)  # atomic: a model never reads a half-written file
    except OSError:
        tmp.unlink(missing_ok=True)  # no stray file beside a target that could not be written
        raise
    return p


def cpu_model() -> str:
    """The CPU's marketing name (Linux /proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "host_id": machine_id(socket.gethostname()),  # what for_trace compares
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        import torch

        info["torch"] = str(torch.__version__)  # TorchVersion: a str subclass encoders refuse
    except ImportError:
        pass
    return info


# ---------------------------------------------------------------------------------------------
# Measurements (need torch).


class _Tensors:
    """A dataset whose samples are `k` small tensors: receiving it costs the hand-off alone."""

    def __init__(self, k: int) -> None:
        self.k = k

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, idx: int) -> tuple[Any, ...]:
        import torch

        return tuple(torch.full((256,), float(idx)) for _ in range(self.k))


def pin_worker(cpus: tuple[int, ...], worker_id: int) -> None:
    """A DataLoader worker_init_fn (bind with functools.partial) keeping workers on `cpus`."""
    os.sched_setaffinity(0, cpus)


def _require_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise PerfcastError(
            "perfcast calibrate needs PyTorch in this environment: pip install torch"
        ) from None
    return torch


def measure_dataloader(
    workers: int = 2,
    worker_cpus: Sequence[int] = (),
    tensors: Sequence[int] = (1, 2, 4, 8),
    gaps_ms: Sequence[float] = (1, 4, 16, 64),
    repeat: int = 15,
) -> DataLoaderCosts:
    """For batches of k small tensors: the median time of `next()` after the main thread was
    away for each gap while the workers, their batches ready, sat idle (the main thread's
    receive); and the CPU time the workers spend per batch beyond what building it costs
    in-process (Linux: from /proc/PID/task/*/schedstat). Per gap, receive is fitted as
    a + b * k by least squares; so is the worker's extra."""
    import functools

    torch = _require_torch()
    from torch.utils.data import DataLoader

    init = functools.partial(pin_worker, tuple(worker_cpus)) if worker_cpus else None
    receive: dict[tuple[int, float], float] = {}
    extra: dict[int, float] = {}
    for k in tensors:
        dataset: Any = _Tensors(k)  # a map-style dataset; torch's Dataset needs torch to subclass
        in_process = iter(DataLoader(dataset, batch_size=4, num_workers=0))
        for _ in range(3):
            next(in_process)
        build_start = time.thread_time_ns()
        for _ in range(4 * repeat):
            next(in_process)
        build_ns = (time.thread_time_ns() - build_start) / (4 * repeat)
        loader: Any = DataLoader(
            dataset,
            batch_size=4,
            num_workers=workers,
            persistent_workers=True,
            worker_init_fn=init,
        )
        it = iter(loader)
        for _ in range(2 * workers + 2):
            next(it)
        pids = [w.pid for w in getattr(it, "_workers", [])]
        cpu_before = _cpu_ns(pids)
        for gap in gaps_ms:
            times = []
            for _ in range(repeat):
                time.sleep(gap / 1e3)  # the workers fill their prefetch queue, then idle
                start = time.perf_counter()
                next(it)
                times.append((time.perf_counter() - start) * 1e3)
            receive[(k, gap)] = statistics.median(times)
        cpu_after = _cpu_ns(pids)
        if cpu_before is not None and cpu_after is not None:
            batches = repeat * len(gaps_ms)
            extra[k] = max((cpu_after - cpu_before) / batches - build_ns, 0.0) / 1e6
        del it, loader
    fits = [_fit_line({k: receive[(k, gap)] for k in tensors}) for gap in gaps_ms]
    worker_batch_ms, worker_tensor_ms = (
        _fit_line(extra) if len(extra) == len(tensors) else (0.0, 0.0)
    )
    samples = {f"k={k},gap={gap:g}": round(v, 4) for (k, gap), v in receive.items()}
    samples.update({f"k={k},worker": round(v, 4) for k, v in extra.items()})
    return DataLoaderCosts(
        gaps_ms=[float(g) for g in gaps_ms],
        batch_ms=[round(b, 4) for b, _ in fits],
        tensor_ms=[round(t, 4) for _, t in fits],
        worker_batch_ms=round(worker_batch_ms, 4),
        worker_tensor_ms=round(worker_tensor_ms, 4),
        workers=workers,
        sharing_strategy=str(torch.multiprocessing.get_sharing_strategy()),
        samples=samples,
    )


def _cpu_ns(pids: Sequence[int]) -> int | None:
    """CPU time of every thread of these processes (Linux schedstat), None where unreadable."""
    total = 0
    try:
        for pid in pids:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                    total += int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total if pids else None


def _fit_line(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares intercept and slope, both kept >= 0 (costs cannot be negative)."""
    xs = list(points)
    ys = [points[x] for x in xs]
    if len(xs) < 2:
        return max(ys[0], 0.0) if ys else 0.0, 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx, 0.0) if sxx else 0.0
    return max(my - slope * mx, 0.0), slope


def measure_checkpoint(repeat: int = 100, rounds: int = 7) -> CheckpointCosts:
    """Extra forward+backward time of one checkpointed region beyond its recomputed forward,
    for regions of 2, 8 and 16 small ops (Linear + ReLU pairs, non-reentrant checkpoint);
    fitted as region_ms + op_ms * ops.

    Each round times every size and variant in turn, and each size's extra is the median of
    its rounds: a machine busy for a while (a DataLoader's workers still exiting read as
    26 ms for 2 ops, against 0.5 measured alone) then spoils a round, not a size."""
    torch = _require_torch()
    from torch.utils.checkpoint import checkpoint

    def per_call(fn: Callable[[], None]) -> float:
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        return (time.perf_counter() - start) * 1e3 / repeat

    variants: dict[int, tuple[Callable[[], None], ...]] = {}
    for pairs in (1, 4, 8):
        region = torch.nn.Sequential(
            *[m for _ in range(pairs) for m in (torch.nn.Linear(64, 64), torch.nn.ReLU())]
        )
        x = torch.randn(32, 64, requires_grad=True)

        def plain(region: Any = region, x: Any = x) -> None:
            region(x).sum().backward()

        def checkpointed(region: Any = region, x: Any = x) -> None:
            checkpoint(region, x, use_reentrant=False).sum().backward()

        def forward(region: Any = region, x: Any = x) -> None:
            region(x)  # with grad, as the recompute runs

        variants[2 * pairs] = (checkpointed, plain, forward)
        for fn in variants[2 * pairs]:
            for _ in range(10):  # warm-up
                fn()
    per_round: dict[int, list[float]] = {ops: [] for ops in variants}
    for _ in range(rounds):
        for ops, (with_ckpt, without, recompute) in variants.items():
            per_round[ops].append(per_call(with_ckpt) - per_call(without) - per_call(recompute))
    extra = {ops: statistics.median(v) for ops, v in per_round.items()}
    region_ms, op_ms = _fit_line(extra)
    return CheckpointCosts(
        region_ms=round(region_ms, 4),
        op_ms=round(op_ms, 4),
        use_reentrant=False,
        samples={str(k): round(v, 4) for k, v in extra.items()},
    )


def measure(
    workers: int = 2,
    worker_cpus: Sequence[int] = (),
    quick: bool = False,
) -> Calibration:
    repeat = 5 if quick else 11
    return Calibration(
        machine=machine_info(),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        dataloader=measure_dataloader(workers, worker_cpus, repeat=repeat),
        checkpoint=measure_checkpoint(repeat=40 if quick else 100),
        profiler=measure_profiler(quick),
    )


def measure_profiler(quick: bool = False) -> ProfilerCosts:
    """The profiler's own cost per event here (perfcast.real.measure)."""
    from perfcast.real.measure import measure_profiler_cost, measure_work_share

    m = measure_profiler_cost(quick=quick)
    w = measure_work_share(m["op_ns"], m["input_ns"], quick=quick)
    if w["work_share"] is not None:
        rounds = w["work_share_rounds"]
        m["note"] += (
            f"; the ops' own work {100 * w['work_share']:.1f}% longer traced in a reference CNN "
            f"training step (median of {len(rounds)} profiled windows, "
            f"{100 * min(rounds):.1f}-{100 * max(rounds):.1f}%)"
        )
    return ProfilerCosts(
        op_ns=m["op_ns"],
        input_ns=m["input_ns"],
        op_no_shapes_ns=m["op_no_shapes_ns"],
        python_ns=m["python_ns"],
        memory_ns=m["memory_ns"],
        runtime_ns=m["runtime_ns"],
        note=m["note"],
        host_op_ns=m.get("host_op_ns"),
        work_share=w["work_share"],
    )


# ---------------------------------------------------------------------------------------------
# Which machine a calibration fits. The costs belong to the machine they were measured on;
# applied to a trace from another machine they mislead. Traces say little about their host:
# recent PyTorch writes "host_name" in the header, `perfcast profile` adds the identity
# below ("perfcast_machine"), torch's tensorboard_trace_handler puts the host in the file
# name (perfcast.ingest.loader reads all three into RankInfo.machine). Where none is there,
# the check cannot be made, and the prediction's assumptions say so.


def machine_identity() -> dict[str, Any]:
    """What `perfcast profile` records in a trace: host id, CPU model, cores, torch."""
    info: dict[str, Any] = {
        "host_id": machine_id(socket.gethostname()),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
    }
    try:
        import torch

        info["torch"] = str(torch.__version__)
    except ImportError:
        pass
    return info


def matches_trace(table: Any) -> tuple[Calibration | None, bool, str]:
    """(calibration, positively the trace's machine, sentence): for costs that must not be
    guessed across machines (the profiler's), only a recognised machine (or a file named in
    PERFCAST_CALIBRATION) counts; "could not be checked" does not."""
    cal, sentence = for_trace(table)
    if cal is None:
        return None, False, sentence
    named = bool(os.environ.get(ENV, "").strip())
    return cal, named or "the trace comes from" in sentence, sentence


def for_trace(table: Any) -> tuple[Calibration | None, str]:
    """The calibration to use for this trace, and a sentence saying which it is and whether
    it fits the trace's machine (None and the reason when it does not).

    Fits: the same host, or (for traces `perfcast profile` wrote) a host with the same CPU
    model and core count. Another host: not used, unless PERFCAST_CALIBRATION names the
    file (the user's explicit choice, and the sentence says so). Unknown: used, "could not
    be checked".
    """
    cal = active()
    if cal is None:
        return None, ""
    m = cal.machine
    cal_host = m.get("host_id") or (
        machine_id(str(m["hostname"])) if isinstance(m.get("hostname"), str) else None
    )
    ranks = getattr(table, "ranks", None) or []
    stated = [r.machine for r in ranks if isinstance(getattr(r, "machine", None), dict)]
    if not stated or cal_host is None:
        why = (
            "the calibration file does not record its host"
            if cal_host is None
            else "the trace does not say which machine it was taken on"
        )
        return (
            cal,
            f"{cal.source()}; whether it is the trace's machine could not be checked ({why})",
        )
    cpu = (m.get("cpu_model"), m.get("cores"))
    others = [
        t
        for t in stated
        if t.get("host_id") != cal_host and (t.get("cpu_model"), t.get("cores")) != cpu
    ]
    first = stated[0]
    if not others:
        same_host = all(t.get("host_id") == cal_host for t in stated)
        how = (
            "the same host" if same_host else f"a host with the same CPU ({cpu[0]}, {cpu[1]} cores)"
        )
        versions = sorted({str(t["torch"]) for t in stated if t.get("torch")})
        mine = m.get("torch")
        other_torch = [v for v in versions if mine and v != mine]
        torch_note = (
            f"; calibrated under torch {mine}, the trace ran torch {', '.join(other_torch)} "
            "(the profiler's costs may differ between versions)"
            if other_torch
            else ""
        )
        return (
            cal,
            f"{cal.source()}; the trace comes from {how} (per {first['from']}){torch_note}",
        )
    other = others[0]
    mismatch = (
        f"measured on host {cal_host} ({m.get('cpu_model', 'CPU unknown')}), but the trace "
        f"comes from host {other.get('host_id')} (per {other['from']})"
    )
    if os.environ.get(ENV, "").strip():
        return cal, f"{cal.source()}; {mismatch}: used because {ENV} names it"
    return None, (
        f"the calibration in {cal.path} was {mismatch}, so it is not used: run "
        f"'perfcast calibrate' on the training machine, or name the file in {ENV} to use it "
        "anyway"
    )
