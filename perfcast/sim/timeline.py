"""`simulate(graph) -> Timeline`: replayed start and end of every node, and step times."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.graph.lower import Lowered, lower
from perfcast.graph.model import NONE, Graph, NodeKind
from perfcast.sim.engine import Replay, replay_fast, replay_reference


@dataclass
class Timeline:
    graph: Graph
    lowered: Lowered
    replay: Replay
    start: np.ndarray  # per graph node (removed nodes: -1)
    end: np.ndarray

    def iteration_ns(self) -> list[tuple[int, str, int, int]]:
        """(rank, name, measured ns, simulated ns) for every iteration.

        A step completes when its CPU range ends and its GPU work is done; its
        time runs from the previous step's completion (see events.Iteration).
        """
        g = self.graph
        c = g.cols
        out = []
        alive = g.alive
        gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & alive)
        gpu_end: dict[int, int] = {}
        if gpu.size:
            its = c["iteration"][gpu]
            ok = its >= 0
            if ok.any():
                ends = np.full(int(its.max()) + 1, -1, dtype=np.int64)
                np.maximum.at(ends, its[ok], self.end[gpu[ok]])
                gpu_end = {i: int(e) for i, e in enumerate(ends.tolist()) if e >= 0}
        prev_done: dict[int, int] = {}
        for span in g.iterations:
            if span.start_node == NONE:
                on_rank = (c["rank"] == span.rank) & alive
                sim = int(self.end[on_rank].max() - self.start[on_rank].min())
            else:
                done = max(int(self.end[span.end_node]), gpu_end.get(span.index, -1))
                begin = prev_done.get(span.rank, int(self.start[span.start_node]))
                prev_done[span.rank] = done
                sim = done - begin
            out.append((span.rank, span.name, span.measured_ns, sim))
        return out


def simulate(graph: Graph, engine: str = "fast") -> Timeline:
    """Replay the graph. `engine="reference"` runs the pure-Python oracle."""
    low = lower(graph)
    rep = replay_reference(low) if engine == "reference" else replay_fast(low)
    start = np.full(len(graph), -1, dtype=np.int64)
    end = np.full(len(graph), -1, dtype=np.int64)
    start[low.nodes] = rep.start
    end[low.nodes] = rep.end
    return Timeline(graph=graph, lowered=low, replay=rep, start=start, end=end)
