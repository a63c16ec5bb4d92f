"""dataloader-overlap: DataLoader worker processes prepare batches while the step runs.

With `num_workers=N`, N worker processes each build whole batches (fetch,
decode, augment, collate) while the main thread trains; the main thread only
receives finished batches (torch.utils.data.DataLoader docs, "Single- and
Multi-process Data Loading"). The trace shows the loading done on the main
thread (phase "dataloader": `enumerate(DataLoader)#...__next__` and the work
inside it). Per step:

- T_dl: the step's data-loading host time, measured (as earlier what-ifs left
  it); n: batches fetched in the step (outermost data-loading ops, usually 1);
- T_rest': the rest of the step, found by replaying the graph with the data
  loading cut to the receive overhead (so it includes GPU time, composes with
  earlier what-ifs, and reflects CPU contention below);
- steady state: a worker needs T_dl per batch, so N workers deliver a batch
  every T_dl / N; the main thread receives one per step, waiting when the
  workers lag: its data time = max(n * receive, T_dl / N - T_rest');
- receive: the main thread's cost of taking one finished batch from the worker
  queue. It is not in a trace without workers, and it is mostly operating-system
  cost: with PyTorch's default `file_descriptor` sharing strategy every tensor
  of the batch arrives as a shared-memory file descriptor fetched over its own
  Unix-socket connection to the worker, so it costs per batch plus per tensor,
  and more the longer the workers sat idle (a deeper CPU idle state to wake):
  0.4-1.2 ms per batch plus 0.2-0.4 ms per tensor on a 2-core VM. Taken, in
  order, from `overhead_ms` (per batch), else from `perfcast calibrate`
  (batch_ms + tensor_ms * tensors after the workers idled as long as the main
  thread is away between batches, i.e. the step without its loading; measured
  on this machine: see perfcast.calibration), else an assumed 0.05 ms per batch. The
  tensors per batch are counted in the trace: the tensors default_collate
  builds at the end of each fetch (`aten::stack`, and `torch.tensor` of
  numbers, seen as `aten::lift_fresh`), at least 1;
- where the workers run: `worker_cores=K` says they are confined to K cores of
  their own (taskset, sched_setaffinity in worker_init_fn): they then deliver a
  batch every T_dl / min(N, K) and do not slow the main thread;
- CPU contention, only when `cores` is given and `worker_cores` is not: main
  thread plus workers need 1 + N*u cores, u = min(1, T_dl / (N * T_step)) being
  a worker's busy share of the new step time. When that exceeds `cores`, every
  thread runs (1 + N*u) / cores times slower (fair sharing): the main thread's
  host work outside data loading (scaled) and the workers' T_dl. The workers
  are slowed too because they share the same cores: slowing only the main
  thread would let 2 workers and the main thread on 2 cores finish 10 ms of CPU
  work in a 4 ms step. The main thread is counted as always busy (an upper
  bound on its demand, since it sleeps while waiting for a batch). T_step
  depends on the slowdown and the slowdown on T_step; the fixed point is found
  by bisection (the slowdown falls as the step grows, so there is exactly one).

A trace whose loader already uses workers (`_MultiProcessingDataLoaderIter`) is
refused: its main-thread data time is waiting for workers, not loading work.
New data-loading time is spread over the step's data-loading nodes in
proportion to their durations (modelled). Not modelled: pin-memory thread
costs, worker start-up (persistent_workers=False re-forks each epoch), and
GPU-side effects; the workers' per-batch time is taken to be the measured
main-thread loading time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfcast import calibration
from perfcast.errors import NotApplicableError, OptionValueError
from perfcast.events import EventTable
from perfcast.graph.model import Graph, NodeKind, Source
from perfcast.graph.phases import Phase, event_phases
from perfcast.sim.timeline import simulate
from perfcast.whatif import primitives as P

SUMMARY = (
    "DataLoader worker processes load batches in parallel "
    "(workers=N, cores=C or worker_cores=K, overhead_ms=receive cost per batch)"
)

# torch.utils.data's iterator when num_workers > 0: the trace's loading is already in workers.
_MULTI = "_MultiProcessingDataLoaderIter"
_BISECT_STEPS = 14  # slowdown found to (f_max - 1) / 2**14
# Replays that lengthen the main thread's wait for a batch until no step is shorter than
# the workers' pace (a wait of its own length on top of the deficit converges in 2-3).
_BOUND_ROUNDS = 4
_BOUND_SLACK_NS = 1_000
_SCALED_HOST = ("cpu", "launch", "sync", "runtime")
# Receive cost per batch when neither overhead_ms nor a calibration is given: an assumption
# for a server CPU, not a measurement (this project's 2-core VM measured 0.4-3 ms with
# `perfcast calibrate`; the recorded H100 rows num_workers 0 -> 4 / 8 come within 6% with it).
_DEFAULT_RECEIVE_MS = 0.05
# default_collate's outputs: torch.stack per tensor field; torch.tensor(numbers) per number field.
_COLLATE_OUTPUTS = ("aten::stack", "aten::lift_fresh")


@dataclass
class Options:
    workers: int = 2
    cores: int | None = None  # CPU cores available to the process; None: no contention
    worker_cores: int | None = None  # cores the workers are confined to (their own)
    overhead_ms: float | None = None  # receive cost per batch; None: calibration or 0.05 ms


@dataclass
class _Step:
    rank: int
    iteration: int
    dl: np.ndarray  # data-loading host nodes
    t_dl: float  # ns
    batches: int
    tensors: int  # tensors per batch (collate outputs), at least 1


def check_options(options: Options) -> None:
    """Values the model cannot take (the registry calls this when it builds the options)."""
    if options.workers < 1:
        raise OptionValueError("dataloader-overlap: workers must be at least 1")
    if options.cores is not None and options.cores < 1:
        raise OptionValueError("dataloader-overlap: cores must be at least 1")
    if options.worker_cores is not None and options.worker_cores < 1:
        raise OptionValueError("dataloader-overlap: worker_cores must be at least 1")
    if options.overhead_ms is not None and options.overhead_ms < 0:
        raise OptionValueError("dataloader-overlap: overhead_ms must be >= 0")


def apply(graph: Graph, options: Options) -> Graph:
    steps, multi = _steps(graph)
    if not steps and multi:
        raise NotApplicableError(
            "dataloader-overlap: the DataLoader already uses worker processes "
            "(_MultiProcessingDataLoaderIter): its main-thread data time is waiting for "
            "workers, not loading work this model could move"
        )
    if not steps:
        raise NotApplicableError(
            "dataloader-overlap: the trace shows no data loading inside its steps "
            "(no DataLoader / _DataLoaderIter / enumerate(DataLoader) ops; loading may "
            "happen outside the profiled steps)"
        )
    w = options.workers
    # Batches in flight at once: the workers' own cores bound their parallelism.
    par = w if options.worker_cores is None else min(w, options.worker_cores)
    cost = _hand_off_cost(options, graph.table)
    contended = options.cores is not None and options.worker_cores is None
    dl_all = np.concatenate([s.dl for s in steps])
    rest = _rest_host(graph, steps, dl_all)
    base = {(s.rank, s.iteration): s for s in steps}
    index = {it.index: (it.rank, it.index) for it in graph.iterations}
    # How long the main thread is away between two receives (the step without its loading):
    # the longer the workers sit idle, the deeper the CPU idle state the hand-off wakes them from.
    gap_ms = {k: 0.0 for k in base}
    for span, (_, _, _, sim) in zip(graph.iterations, simulate(graph).iteration_ns()):
        key = index.get(span.index)
        if key in base:
            gap_ms[key] = max(float(sim) - base[key].t_dl, 0.0) / base[key].batches / 1e6
    overhead = {k: s.batches * cost.receive_ms(s.tensors, gap_ms[k]) * 1e6 for k, s in base.items()}
    # A worker's time per step's batches: the loading itself plus its side of the hand-off.
    work = {k: s.t_dl + s.batches * cost.worker_ms(s.tensors) * 1e6 for k, s in base.items()}

    def replayed(g: Graph) -> dict[tuple[int, int], float]:
        out = {}
        for span, (_, _, _, sim) in zip(g.iterations, simulate(g).iteration_ns()):
            key = index.get(span.index)
            if key in base:
                out[key] = float(sim)
        return out

    def step_times(f: float) -> dict[tuple[int, int], float]:
        """Replayed step time with data loading cut to the receive overhead, host work x f."""
        g = graph.copy()
        for s in steps:
            _set_total(g, s.dl, overhead[(s.rank, s.iteration)], Source.MODELLED)
        if f != 1.0:
            P.scale(g, rest, f)
        return replayed(g)

    def solve(f: float) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float]]:
        """(rest of step T_rest', new step time) per step at slowdown f."""
        sim = step_times(f)
        t_rest = {k: max(sim.get(k, 0.0) - overhead[k], 0.0) for k in base}
        t_new = {k: max(t_rest[k] + overhead[k], work[k] * f / par) for k in base}
        return t_rest, t_new

    def demand(t_new: dict[tuple[int, int], float]) -> float:
        total_dl = sum(work.values())
        total = sum(t_new.values())
        u = min(1.0, total_dl / (w * total)) if total > 0 else 1.0
        return 1.0 + w * u

    f = 1.0
    t_rest, t_new = solve(1.0)
    if contended and options.cores is not None and demand(t_new) > options.cores:
        lo, hi = 1.0, (1.0 + w) / options.cores
        for _ in range(_BISECT_STEPS):
            mid = (lo + hi) / 2
            if demand(solve(mid)[1]) / options.cores > mid:
                lo = mid
            else:
                hi = mid
        f = (lo + hi) / 2
        t_rest, t_new = solve(f)

    new_dl = {}
    for s in steps:
        k = (s.rank, s.iteration)
        new_dl[k] = max(overhead[k], work[k] * f / par - t_rest[k])
        _set_total(graph, s.dl, new_dl[k], Source.MODELLED)
    if f > 1.0:
        P.scale(graph, rest, f)
    # The workers cannot hand over batches faster than they make them: a step takes at
    # least work x f / par. The main thread's wait set from T_rest can hide under the GPU
    # work still running from the step before, and the replayed step came out shorter than
    # that bound (one worker at 72.4 ms a batch: 59.2 ms steps); lengthened until it holds.
    for _ in range(_BOUND_ROUNDS):
        short = {
            k: work[k] * f / par - t
            for k, t in replayed(graph).items()
            if work[k] * f / par - t > _BOUND_SLACK_NS
        }
        if not short:
            break
        for s in steps:
            k = (s.rank, s.iteration)
            if k in short:
                new_dl[k] += short[k]
                _set_total(graph, s.dl, new_dl[k], Source.MODELLED)
    before = sum(s.t_dl for s in steps)
    after = sum(new_dl.values())
    n = len(steps)
    if options.worker_cores is not None:
        contention = (
            f"workers on {options.worker_cores} core(s) of their own: "
            f"{par} batch(es) prepared at a time, main thread not slowed"
        )
    elif options.cores is None:
        contention = "no CPU contention assumed: cores unknown (pass cores=N)"
    elif f > 1.0:
        contention = (
            f"{w} workers + main thread on {options.cores} cores: host work and workers "
            f"{f:.2f}x slower (fair sharing)"
        )
    else:
        contention = (
            f"{w} workers + main thread need {demand(t_new):.2f} of {options.cores} cores: "
            "no contention"
        )
    tensors = sorted({s.tensors for s in steps})
    batches = sum(s.batches for s in steps)
    receive_ms = sum(overhead.values()) / batches / 1e6
    mean_gap = sum(gap_ms[k] * s.batches for k, s in base.items()) / batches
    graph.assumptions.append(
        f"dataloader-overlap with {w} workers: main-thread data time per step "
        f"{before / n / 1e6:.2f} -> {after / n / 1e6:.2f} ms = max(receive, "
        f"(T_dl + worker hand-off)/{par} - rest of step), workers as fast as the measured "
        f"main-thread loading; hand-off of a batch of {'/'.join(map(str, tensors))} "
        f"tensor(s): {cost.text}; receive {receive_ms:.2f} ms per batch after the main thread's "
        f"{mean_gap:.1f} ms away; {contention}"
    )
    return graph


def _steps(graph: Graph) -> tuple[list[_Step], int]:
    """Per (rank, iteration): the data-loading host nodes, their time and batch count;
    and how many steps were skipped because their DataLoader already uses workers."""
    c = graph.cols
    dl = P.select(graph, kind="host", phase="dataloader")
    dl = dl[(c["iteration"][dl] >= 0) & (c["kind"][dl] != NodeKind.WAIT)]
    if dl.size == 0:
        return [], 0
    tops, tensors, multi = _top_loader_ops(graph)
    out = []
    skipped = 0
    # The nodes of each (rank, iteration), grouped by one sort of a combined key (a 2-D
    # np.unique and a mask per step took seconds on a 235k-node, 8-rank trace).
    key = _step_key(c["rank"][dl], c["iteration"][dl])
    order = np.argsort(key, kind="stable")
    keys, first = np.unique(key[order], return_index=True)
    for k, nodes in zip(keys.tolist(), np.split(dl[order], first[1:])):
        rank, it = k >> 32, k & 0xFFFFFFFF
        if (rank, it) in multi:
            skipped += 1
            continue
        t = float(c["dur"][nodes].sum())
        if t <= 0:
            continue
        out.append(
            _Step(rank, it, nodes, t, max(tops.get((rank, it), 0), 1), tensors.get((rank, it), 1))
        )
    return out, skipped


def _top_loader_ops(
    graph: Graph,
) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int], set[tuple[int, int]]]:
    """Batches per step (outermost data-loading ops: one `__next__` per batch), tensors per
    batch (most collate outputs seen in one batch of the step), and the steps whose loader is
    already multi-process."""
    table = graph.table
    if table is None or len(table) == 0:
        return {}, {}, set()
    phase = event_phases(table)
    rows = np.flatnonzero((phase == Phase.DATALOADER) & (table.iteration >= 0))
    par = table.parent[rows]
    top = rows[(par < 0) | (phase[np.maximum(par, 0)] != Phase.DATALOADER)]
    out: dict[tuple[int, int], int] = {}
    multi: set[tuple[int, int]] = set()
    names = table.names
    collated = _collate_outputs(table, top)
    tensors: dict[tuple[int, int], int] = {}
    for r, it, nm, k in zip(
        table.rank[top].tolist(), table.iteration[top].tolist(), table.name[top].tolist(), collated
    ):
        out[(r, it)] = out.get((r, it), 0) + 1
        tensors[(r, it)] = max(tensors.get((r, it), 1), k)
        if _MULTI in names[nm]:
            multi.add((r, it))
    return out, tensors, multi


def _collate_outputs(table: EventTable, tops: np.ndarray) -> list[int]:
    """Per outermost loading op: the tensors default_collate built for the batch, i.e. its
    direct child ops named in _COLLATE_OUTPUTS from its first `aten::stack` on (per-sample
    `torch.tensor` calls before the collate are not batch outputs). 0 when there is no stack
    (a custom collate_fn: the caller assumes one tensor)."""
    ids = {name: i for i, name in enumerate(table.names) if name in _COLLATE_OUTPUTS}
    stack_id = ids.get("aten::stack", -1)
    out_ids = np.array(list(ids.values()), dtype=table.name.dtype)
    if stack_id < 0 or tops.size == 0:
        return [0] * int(tops.size)
    child = np.flatnonzero(np.isin(table.parent, tops) & np.isin(table.name, out_ids))
    result = []
    for top in tops.tolist():
        mine = child[table.parent[child] == top]
        mine = mine[np.argsort(table.ts[mine], kind="stable")]
        stacks = np.flatnonzero(table.name[mine] == stack_id)
        result.append(int(mine.size - stacks[0]) if stacks.size else 0)
    return result


@dataclass(frozen=True)
class _HandOff:
    """Moving one batch of k tensors from a worker to the main thread, in ms."""

    receive_ms: Callable[[int, float], float]  # main thread: (tensors, idle gap ms) -> ms
    worker_ms: Callable[[int], float]  # worker, beyond building the batch
    text: str


def _hand_off_cost(options: Options, table: Any) -> _HandOff:
    if options.overhead_ms is not None:
        ms = options.overhead_ms
        return _HandOff(lambda k, gap: ms, lambda k: 0.0, f"receive {ms:g} ms (overhead_ms)")
    cal, fit = calibration.for_trace(table)
    if cal is not None and cal.dataloader is not None:
        dl = cal.dataloader
        return _HandOff(
            dl.receive_ms,
            dl.worker_ms,
            f"receive {dl.batch_ms[0]:g} + {dl.tensor_ms[0]:g} ms per tensor after "
            f"{dl.gaps_ms[0]:g} ms idle to {dl.batch_ms[-1]:g} + {dl.tensor_ms[-1]:g} after "
            f"{dl.gaps_ms[-1]:g} ms, worker {dl.worker_batch_ms:g} + "
            f"{dl.worker_tensor_ms:g} ms per tensor ({fit}, {dl.sharing_strategy} sharing)",
        )
    ms = _DEFAULT_RECEIVE_MS
    why = fit or "run 'perfcast calibrate' on the training machine"
    return _HandOff(
        lambda k, gap: ms,
        lambda k: 0.0,
        f"receive {ms:g} ms per batch and no worker-side hand-off assumed, not measured "
        f"({why}; it measured 0.4-3 ms per batch on a 2-core VM) or set overhead_ms",
    )


def _rest_host(graph: Graph, steps: list[_Step], dl_all: np.ndarray) -> np.ndarray:
    """Host work outside data loading in the steps that load data (what contention slows)."""
    c = graph.cols
    host = P.select(graph, kind=_SCALED_HOST)
    keys = np.array([_step_key(s.rank, s.iteration) for s in steps], dtype=np.int64)
    mine = np.isin(_step_key(c["rank"][host], c["iteration"][host]), keys)
    loading = np.zeros(len(c["kind"]), dtype=bool)
    loading[dl_all] = True
    host = host[mine]
    return host[~loading[host]]


def _step_key(rank: Any, iteration: Any) -> Any:
    """One int64 per (rank, iteration >= 0), for grouping and lookups in one pass."""
    return (np.asarray(rank, dtype=np.int64) << 32) | np.asarray(iteration, dtype=np.int64)


def _set_total(graph: Graph, nodes: np.ndarray, total: float, source: Source) -> None:
    """Spread `total` ns over nodes in proportion to their current durations."""
    c = graph.cols
    cur = c["dur"][nodes].astype(np.float64)
    s = cur.sum()
    share = cur / s if s > 0 else np.full(nodes.size, 1.0 / max(nodes.size, 1))
    P.set_duration(graph, nodes, np.rint(share * total).astype(np.int64), source)
