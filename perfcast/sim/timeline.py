"""`simulate(graph) -> Timeline`: replayed start and end of every node, and step times."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.graph.model import NONE, Graph
from perfcast.sim.engine import Replay, replay_fast, replay_reference
from perfcast.sim.lower import Lowered, lower


@dataclass
class Timeline:
    graph: Graph
    lowered: Lowered
    replay: Replay
    start: np.ndarray  # per graph node (removed nodes: -1)
    end: np.ndarray

    def iteration_ns(self) -> list[tuple[int, str, int, int]]:
        """(rank, name, measured ns, simulated ns) for every iteration."""
        g = self.graph
        out = []
        alive = g.alive
        for span in g.iterations:
            if span.start_node == NONE:
                on_rank = (g.cols["rank"] == span.rank) & alive
                sim = int(self.end[on_rank].max() - self.start[on_rank].min())
            else:
                sim = int(self.end[span.end_node] - self.start[span.start_node])
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
