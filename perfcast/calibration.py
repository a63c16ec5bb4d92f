"""Machine constants that a trace without the optimization cannot show, measured here.

Some what-ifs add work that the baseline trace never ran: with DataLoader workers
the main process must receive each batch from a worker process; with activation
checkpointing every checkpointed region pays torch.utils.checkpoint's own
bookkeeping. How long those take depends on the machine and the OS far more
than on the model: receiving one tensor costs a few tens of microseconds on bare
metal and about a millisecond on a small VM, because PyTorch's default
`file_descriptor` sharing strategy passes every tensor's shared-memory file
descriptor over a fresh Unix-socket connection to the worker (with an
authentication handshake), and every message between processes is a cross-core
wake-up.

`perfcast calibrate` measures these costs with small synthetic microbenchmarks,
independent of any user workload, and writes them to a JSON file that the
models read (`PERFCAST_CALIBRATION` names another file, or `off` to ignore it).
A model that used a calibration says so, and on which machine it was measured,
in the prediction's assumptions. Run it on the machine that trains.
"""

from __future__ import annotations

import json
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

ENV = "PERFCAST_CALIBRATION"
FORMAT = 1


@dataclass(frozen=True)
class DataLoaderCosts:
    """What handing a batch of k tensors from a worker process to the main process costs:
    on the main thread, receive_ms(k) = batch_ms + tensor_ms * k; on the worker, beyond
    building the batch, worker_ms(k) = worker_batch_ms + worker_tensor_ms * k (shared-memory
    storage for the collated tensors, pickling, serving the file descriptors)."""

    batch_ms: float
    tensor_ms: float
    worker_batch_ms: float
    worker_tensor_ms: float
    workers: int
    sharing_strategy: str
    # tensors per batch -> {"receive_ms": main-thread median, "worker_ms": worker extra CPU}
    samples: dict[str, dict[str, float]]

    def receive_ms(self, tensors: int) -> float:
        return self.batch_ms + self.tensor_ms * max(tensors, 1)

    def worker_ms(self, tensors: int) -> float:
        return self.worker_batch_ms + self.worker_tensor_ms * max(tensors, 1)


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


@dataclass(frozen=True)
class Calibration:
    machine: dict[str, Any]
    created: str
    dataloader: DataLoaderCosts | None
    checkpoint: CheckpointCosts | None
    path: str = ""

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
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "perfcast" / "calibration.json"


def _configured_path() -> Path | None:
    value = os.environ.get(ENV, "").strip()
    if value.lower() in ("off", "none", "0"):
        return None
    return Path(value) if value else default_path()


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
                f"{path}: calibration file not found ({ENV} names it); run "
                f"'perfcast calibrate --out {path}' or set {ENV}=off"
            ) from None
        return None
    key = (str(path), mtime)
    if key not in _cache:
        _cache.clear()
        _cache[key] = load(path)
    return _cache[key]


def load(path: str | Path) -> Calibration:
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        if raw.get("format") != FORMAT:
            raise ValueError(f"format {raw.get('format')!r}, expected {FORMAT}")
        dl = raw.get("dataloader")
        ck = raw.get("checkpoint")
        return Calibration(
            machine=dict(raw["machine"]),
            created=str(raw["created"]),
            dataloader=DataLoaderCosts(**dl) if dl else None,
            checkpoint=CheckpointCosts(**ck) if ck else None,
            path=str(p),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PerfcastError(
            f"{p}: not a perfcast calibration file ({exc}); run 'perfcast calibrate' again "
            f"or set {ENV}=off"
        ) from None


def save(cal: Calibration, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(cal.to_dict(), indent=2) + "\n")
    tmp.replace(p)  # atomic: a model never reads a half-written file
    return p


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "cpu_model": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
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


def _pin(cpus: tuple[int, ...], worker_id: int) -> None:
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
    repeat: int = 15,
) -> DataLoaderCosts:
    """For batches of k small tensors: the median time of `next()` while the workers have a
    batch ready (the main thread's receive), and the CPU time the workers spend per batch
    beyond what building it costs in-process (Linux: from /proc/PID/task/*/schedstat).
    Each is fitted as a + b * k by least squares."""
    import functools

    torch = _require_torch()
    from torch.utils.data import DataLoader

    init = functools.partial(_pin, tuple(worker_cpus)) if worker_cpus else None
    receive: dict[int, float] = {}
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
        times = []
        for _ in range(repeat):
            time.sleep(0.02)  # the workers fill their prefetch queue: next() only receives
            start = time.perf_counter()
            next(it)
            times.append((time.perf_counter() - start) * 1e3)
        cpu_after = _cpu_ns(pids)
        receive[k] = statistics.median(times)
        if cpu_before is not None and cpu_after is not None:
            extra[k] = max((cpu_after - cpu_before) / repeat - build_ns, 0.0) / 1e6
        del it, loader
    batch_ms, tensor_ms = _fit_line(receive)
    worker_batch_ms, worker_tensor_ms = (
        _fit_line(extra) if len(extra) == len(receive) else (0.0, 0.0)
    )
    return DataLoaderCosts(
        batch_ms=round(batch_ms, 4),
        tensor_ms=round(tensor_ms, 4),
        worker_batch_ms=round(worker_batch_ms, 4),
        worker_tensor_ms=round(worker_tensor_ms, 4),
        workers=workers,
        sharing_strategy=str(torch.multiprocessing.get_sharing_strategy()),
        samples={
            str(k): {"receive_ms": round(receive[k], 4), "worker_ms": round(extra.get(k, 0), 4)}
            for k in receive
        },
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
    fitted as region_ms + op_ms * ops."""
    torch = _require_torch()
    from torch.utils.checkpoint import checkpoint

    def per_call(fn: Callable[[], None]) -> float:
        for _ in range(10):
            fn()
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            times.append((time.perf_counter() - start) * 1e3 / repeat)
        return statistics.median(times)

    extra: dict[int, float] = {}
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

        extra[2 * pairs] = per_call(checkpointed) - per_call(plain) - per_call(forward)
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
    repeat = 7 if quick else 15
    return Calibration(
        machine=machine_info(),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        dataloader=measure_dataloader(workers, worker_cpus, repeat=repeat),
        checkpoint=measure_checkpoint(repeat=40 if quick else 100),
    )
