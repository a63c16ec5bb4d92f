"""faster-op: chosen ops or kernels run k times faster.

Assumptions: only the selected nodes change; everything that depends on them
moves as the replay says. CPU work is matched by the op it runs in, GPU work
by its kernel name or by the op that launched it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.errors import NotApplicableError
from perfcast.graph.model import Graph
from perfcast.whatif import primitives as P

SUMMARY = "selected ops/kernels k× faster (pattern=REGEX, factor=K, where=gpu|cpu|all)"


@dataclass
class Options:
    pattern: str = "."
    factor: float = 2.0
    where: str = "all"  # gpu, cpu or all
    module: str | None = None


def apply(graph: Graph, options: Options) -> Graph:
    if options.factor <= 0:
        raise NotApplicableError("faster-op needs factor > 0")
    chosen = []
    if options.where in ("gpu", "all"):
        by_name = P.select(graph, kind="gpu", name=options.pattern, module=options.module)
        by_op = P.select(graph, kind="gpu", op=options.pattern, module=options.module)
        chosen.append(np.union1d(by_name, by_op))
    if options.where in ("cpu", "all"):
        chosen.append(P.select(graph, kind="host", op=options.pattern, module=options.module))
    nodes = np.unique(np.concatenate(chosen)) if chosen else np.zeros(0, np.int64)
    if nodes.size == 0:
        raise NotApplicableError(f"faster-op: nothing matches pattern '{options.pattern}'")
    P.scale(graph, nodes, 1.0 / options.factor)
    graph.assumptions.append(
        f"{nodes.size:,} nodes matching '{options.pattern}' ({options.where}) run "
        f"{options.factor:g}× faster"
    )
    return graph
