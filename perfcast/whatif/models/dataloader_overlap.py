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
  workers lag: its data time = max(n * overhead, T_dl / N - T_rest').
  `overhead_ms` (0.05 ms per batch) is an assumed cost of receiving a batch from
  the worker queue (unpickling tensor handles from shared memory), not measured.
  It is the weak point: profiles of real worker runs in benchmarks/accuracy show
  1.3-2.7 ms per step on a 2-core machine; set it from a profile with workers;
- CPU contention, only when `cores` is given: main thread plus workers need
  1 + N*u cores, u = min(1, T_dl / (N * T_step)) being a worker's busy share
  of the new step time. When that exceeds `cores`, every thread runs
  (1 + N*u) / cores times slower (fair sharing): the main thread's host work
  outside data loading (scaled) and the workers' T_dl. The workers are slowed
  too because they share the same cores: slowing only the main thread would let
  2 workers and the main thread on 2 cores finish 10 ms of CPU work in a 4 ms
  step. The main thread is counted as always busy (an upper bound on its
  demand, since it sleeps while waiting for a batch). T_step depends on the
  slowdown and the slowdown on T_step; the fixed point is found by bisection
  (the slowdown falls as the step grows, so there is exactly one).

A trace whose loader already uses workers (`_MultiProcessingDataLoaderIter`) is
refused: its main-thread data time is waiting for workers, not loading work.
New data-loading time is spread over the step's data-loading nodes in
proportion to their durations (modelled). Not modelled: pin-memory thread
costs, worker start-up (persistent_workers=False re-forks each epoch), and
GPU-side effects; the workers' per-batch time is taken to be the measured
main-thread loading time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.analysis.phases import Phase, event_phases
from perfcast.errors import NotApplicableError
from perfcast.graph.model import Graph, NodeKind, Source
from perfcast.sim.timeline import simulate
from perfcast.whatif import primitives as P

SUMMARY = "DataLoader worker processes load batches in parallel (workers=N, cores=C)"

# torch.utils.data's iterator when num_workers > 0: the trace's loading is already in workers.
_MULTI = "_MultiProcessingDataLoaderIter"
_BISECT_STEPS = 14  # slowdown found to (f_max - 1) / 2**14
_SCALED_HOST = ("cpu", "launch", "sync", "runtime")


@dataclass
class Options:
    workers: int = 2
    cores: int | None = None  # CPU cores available to the process; None: no contention
    overhead_ms: float = 0.05  # main-thread cost of receiving one batch (assumed)


@dataclass
class _Step:
    rank: int
    iteration: int
    dl: np.ndarray  # data-loading host nodes
    t_dl: float  # ns
    batches: int


def apply(graph: Graph, options: Options) -> Graph:
    if options.workers < 1:
        raise NotApplicableError("dataloader-overlap: workers must be at least 1")
    if options.cores is not None and options.cores < 1:
        raise NotApplicableError("dataloader-overlap: cores must be at least 1")
    if options.overhead_ms < 0:
        raise NotApplicableError("dataloader-overlap: overhead_ms must be >= 0")
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
    overhead = options.overhead_ms * 1e6
    dl_all = np.concatenate([s.dl for s in steps])
    rest = _rest_host(graph, steps, dl_all)
    base = {(s.rank, s.iteration): s for s in steps}
    index = {it.index: (it.rank, it.index) for it in graph.iterations}

    def step_times(f: float) -> dict[tuple[int, int], float]:
        """Replayed step time with data loading cut to the receive overhead, host work x f."""
        g = graph.copy()
        for s in steps:
            _set_total(g, s.dl, s.batches * overhead, Source.MODELLED)
        if f != 1.0:
            P.scale(g, rest, f)
        out = {}
        for span, (_, _, _, sim) in zip(g.iterations, simulate(g).iteration_ns()):
            key = index.get(span.index)
            if key in base:
                out[key] = float(sim)
        return out

    def solve(f: float) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float]]:
        """(rest of step T_rest', new step time) per step at slowdown f."""
        sim = step_times(f)
        t_rest = {k: max(sim.get(k, 0.0) - base[k].batches * overhead, 0.0) for k in base}
        t_new = {k: max(t_rest[k] + base[k].batches * overhead, base[k].t_dl * f / w) for k in base}
        return t_rest, t_new

    def demand(t_new: dict[tuple[int, int], float]) -> float:
        total_dl = sum(s.t_dl for s in steps)
        total = sum(t_new.values())
        u = min(1.0, total_dl / (w * total)) if total > 0 else 1.0
        return 1.0 + w * u

    f = 1.0
    t_rest, t_new = solve(1.0)
    if options.cores is not None and demand(t_new) > options.cores:
        lo, hi = 1.0, (1.0 + w) / options.cores
        for _ in range(_BISECT_STEPS):
            mid = (lo + hi) / 2
            if demand(solve(mid)[1]) / options.cores > mid:
                lo = mid
            else:
                hi = mid
        f = (lo + hi) / 2
        t_rest, t_new = solve(f)

    before = after = 0.0
    for s in steps:
        k = (s.rank, s.iteration)
        new_dl = max(s.batches * overhead, s.t_dl * f / w - t_rest[k])
        _set_total(graph, s.dl, new_dl, Source.MODELLED)
        before += s.t_dl
        after += new_dl
    if f > 1.0:
        P.scale(graph, rest, f)
    n = len(steps)
    if options.cores is None:
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
    graph.assumptions.append(
        f"dataloader-overlap with {w} workers: main-thread data time per step "
        f"{before / n / 1e6:.2f} -> {after / n / 1e6:.2f} ms = max({options.overhead_ms:g} ms "
        f"receive overhead per batch, T_dl/{w} - rest of step), workers as fast as the measured "
        f"main-thread loading; {contention}; the receive cost is assumed, not in the trace "
        "(1.3-2.7 ms per step measured in this project's CPU benchmark: set overhead_ms)"
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
    tops, multi = _top_loader_ops(graph)
    out = []
    skipped = 0
    keys = np.unique(np.stack([c["rank"][dl], c["iteration"][dl]], axis=1), axis=0)
    for rank, it in keys.tolist():
        if (rank, it) in multi:
            skipped += 1
            continue
        nodes = dl[(c["rank"][dl] == rank) & (c["iteration"][dl] == it)]
        t = float(c["dur"][nodes].sum())
        if t <= 0:
            continue
        out.append(_Step(rank, it, nodes, t, max(tops.get((rank, it), 0), 1)))
    return out, skipped


def _top_loader_ops(graph: Graph) -> tuple[dict[tuple[int, int], int], set[tuple[int, int]]]:
    """Batches per step (outermost data-loading ops: one `__next__` per batch), and the
    steps whose loader is already multi-process."""
    table = graph.table
    if table is None or len(table) == 0:
        return {}, set()
    phase = event_phases(table)
    rows = np.flatnonzero((phase == Phase.DATALOADER) & (table.iteration >= 0))
    par = table.parent[rows]
    top = rows[(par < 0) | (phase[np.maximum(par, 0)] != Phase.DATALOADER)]
    out: dict[tuple[int, int], int] = {}
    multi: set[tuple[int, int]] = set()
    names = table.names
    for r, it, nm in zip(
        table.rank[top].tolist(), table.iteration[top].tolist(), table.name[top].tolist()
    ):
        out[(r, it)] = out.get((r, it), 0) + 1
        if _MULTI in names[nm]:
            multi.add((r, it))
    return out, multi


def _rest_host(graph: Graph, steps: list[_Step], dl_all: np.ndarray) -> np.ndarray:
    """Host work outside data loading in the steps that load data (what contention slows)."""
    c = graph.cols
    host = P.select(graph, kind=_SCALED_HOST)
    keys = {(s.rank, s.iteration) for s in steps}
    mine = np.array(
        [(r, i) in keys for r, i in zip(c["rank"][host].tolist(), c["iteration"][host].tolist())],
        dtype=bool,
    )
    return np.setdiff1d(host[mine], dl_all)


def _set_total(graph: Graph, nodes: np.ndarray, total: float, source: Source) -> None:
    """Spread `total` ns over nodes in proportion to their current durations."""
    c = graph.cols
    cur = c["dur"][nodes].astype(np.float64)
    s = cur.sum()
    share = cur / s if s > 0 else np.full(nodes.size, 1.0 / max(nodes.size, 1))
    P.set_duration(graph, nodes, np.rint(share * total).astype(np.int64), source)
