"""`simulate(graph) -> Timeline`: replayed start and end of every node, and step times."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.arrays import split_by
from perfcast.graph.lower import lower
from perfcast.graph.model import NONE, Graph, IterationSpan, NodeKind
from perfcast.sim.engine import Replay, replay_fast, replay_reference


@dataclass
class StepWindow:
    """One iteration's window in the replay: [begin, done], completed by `end_node`;
    [host_begin, host_end] is its CPU range in the replay (NONE for a whole-trace window)."""

    span: IterationSpan
    begin: int
    done: int
    end_node: int
    host_begin: int = NONE
    host_end: int = NONE


@dataclass
class Timeline:
    graph: Graph
    # Compact index (the replay's) -> graph node. Not the whole lowered graph: its
    # dependency arrays served the replay only, and each timeline kept them alive (20 of
    # 47 MiB per timeline on 128 DLRM ranks; advise holds four at once).
    nodes: np.ndarray
    replay: Replay
    start: np.ndarray  # per graph node (removed nodes: -1)
    end: np.ndarray

    def step_windows(self) -> list[StepWindow]:
        """Where each iteration's time runs, as the replay has it.

        A step completes when its CPU range ends and its GPU work is done; its time runs from
        the previous step's completion (see events.Iteration). The first step's predecessor
        completed when the GPU work left from before the window was done. A trace without
        steps is one window over everything on its rank.
        """
        g = self.graph
        c = g.cols
        out = []
        alive = g.alive
        gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & alive & (c["iteration"] >= 0))
        last_gpu: dict[int, int] = {}
        if gpu.size:
            o = gpu[np.lexsort((self.end[gpu], c["iteration"][gpu]))]
            its = c["iteration"][o]
            ends = np.flatnonzero(np.r_[its[1:] != its[:-1], True])
            last_gpu = dict(zip(its[ends].tolist(), o[ends].tolist()))
        prev_done = self._backlog_done()
        prev_node: dict[int, int] = {}
        for span in g.iterations:
            if span.start_node == NONE:
                on_rank = np.flatnonzero((c["rank"] == span.rank) & alive)
                if on_rank.size == 0:
                    continue
                end_node = int(on_rank[np.argmax(self.end[on_rank])])
                begin = int(self.start[on_rank].min())
                host = (NONE, NONE)
            else:
                end_node = span.end_node
                host = (int(self.start[span.start_node]), int(self.end[end_node]))
                x = last_gpu.get(span.index, NONE)
                if x != NONE and self.end[x] > self.end[end_node]:
                    end_node = x
                begin = prev_done.get(span.rank, int(self.start[span.start_node]))
                if self.end[end_node] < begin and span.rank in prev_node:
                    # Done before the step before it (a damaged trace's GPU times): it
                    # completes with that step and takes no time.
                    end_node = prev_node[span.rank]
                prev_node[span.rank] = end_node
                prev_done[span.rank] = max(int(self.end[end_node]), begin)
            done = max(int(self.end[end_node]), begin)
            out.append(StepWindow(span, begin, done, end_node, *host))
        return out

    def iteration_ns(self) -> list[tuple[int, str, int, int]]:
        """(rank, name, measured ns, simulated ns) for every iteration (see step_windows)."""
        return [
            (w.span.rank, w.span.name, w.span.measured_ns, w.done - w.begin)
            for w in self.step_windows()
        ]

    def host_lead_drained_ns(self, skip_first: bool = False) -> dict[int, tuple[int, int]]:
        """Per rank with steps: (steps, how much of the host's lead over the GPU the steps
        drained), `skip_first` leaving each rank's first step out.

        The steps' windows sum to the host's time from the first step's CPU range to the
        last's, less what they drained: a host that began ahead of the GPU (work queued
        before the window) and ends less far ahead finished its steps' windows sooner than
        it issued them. Negative where the lead grew (the GPU paces the steps)."""
        by_rank: dict[int, list[StepWindow]] = {}
        for w in self.step_windows():
            if w.host_begin != NONE:
                by_rank.setdefault(w.span.rank, []).append(w)
        out: dict[int, tuple[int, int]] = {}
        for rank, windows in by_rank.items():
            windows = windows[1:] if skip_first else windows
            if windows:
                host = max(w.host_end for w in windows) - min(w.host_begin for w in windows)
                out[rank] = (len(windows), host - sum(w.done - w.begin for w in windows))
        return out

    def _backlog_done(self) -> dict[int, int]:
        """Per rank: when GPU work left from before the window (no step, enqueued before the
        trace) was done, if after the first step's start: the step before it completed then."""
        g = self.graph
        c = g.cols
        out: dict[int, int] = {}
        first: dict[int, int] = {}
        for span in g.iterations:
            if span.start_node != NONE and span.rank not in first:
                first[span.rank] = span.start_node
        if not first:
            return out
        backlog = backlog_nodes(g)
        by_rank = {rank: backlog[pos] for rank, pos in split_by(c["rank"][backlog])}
        for rank, node in first.items():
            on = by_rank.get(rank, backlog[:0])
            on = on[c["launch_order"][on] < c["order"][node]]
            if on.size:
                out[rank] = max(int(self.start[node]), int(self.end[on].max()))
        return out


def lead_not_kept_ns(
    base: Timeline, predicted: Timeline, skip_first: bool = False
) -> dict[int, float]:
    """Per rank, per step: how much more of the host's starting lead over the GPU the
    predicted steps drain than the traced ones did (ranks that drain no more: absent).

    A host that ran ahead of a slow GPU (tens of ms of queued work when the trace began) is
    still ahead in a prediction that makes the GPU faster, and the replayed steps finish
    that queue at the new GPU speed, each sooner than the host can issue the next: their
    windows sum to less than the host's time. A running job has no lead left after a few
    steps and pays the host's time every step; what the traced steps drained themselves
    is in the baseline's mean too, so only the excess counts."""
    traced = base.host_lead_drained_ns(skip_first)
    out: dict[int, float] = {}
    for rank, (steps, drained) in predicted.host_lead_drained_ns(skip_first).items():
        excess = drained - max(traced.get(rank, (0, 0))[1], 0)
        if excess > 0:
            out[rank] = excess / steps
    return out


def backlog_nodes(graph: Graph) -> np.ndarray:
    """GPU work in no step and launched by nothing in the trace: enqueued before it began."""
    c = graph.cols
    return np.flatnonzero(
        (c["kind"] == NodeKind.GPU) & graph.alive & (c["iteration"] < 0) & (c["launch"] < 0)
    )


def simulate(graph: Graph, engine: str = "fast") -> Timeline:
    """Replay the graph. `engine="reference"` runs the pure-Python oracle."""
    if engine not in ("fast", "reference"):
        from perfcast.errors import OptionError

        raise OptionError(f"engine must be 'fast' or 'reference', not {engine!r}")
    low = lower(graph)
    rep = replay_reference(low) if engine == "reference" else replay_fast(low)
    if low.n == len(graph):  # every node alive: compact ids are node ids, no copy needed
        start, end = rep.start, rep.end
    else:
        start = np.full(len(graph), -1, dtype=np.int64)
        end = np.full(len(graph), -1, dtype=np.int64)
        start[low.nodes] = rep.start
        end[low.nodes] = rep.end
    return Timeline(graph=graph, nodes=low.nodes, replay=rep, start=start, end=end)
