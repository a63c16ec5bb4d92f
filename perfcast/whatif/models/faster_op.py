"""faster-op: chosen ops or kernels run k times faster.

Assumptions: only the selected nodes change; everything that depends on them
moves as the replay says. CPU work is matched by the op it runs in, GPU work
by its kernel name or by the op that launched it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.errors import NotApplicableError, OptionValueError
from perfcast.graph.model import Graph
from perfcast.whatif import primitives as P

SUMMARY = (
    "selected ops/kernels k× faster (pattern=REGEX or a name as written, factor=K, "
    "where=gpu|cpu|all)"
)


@dataclass
class Options:
    pattern: str = "."
    factor: float = 2.0
    where: str = "all"  # gpu, cpu or all
    module: str | None = None


def check_options(options: Options) -> None:
    """Values the model cannot take (the registry calls this when it builds the options)."""
    if options.factor <= 0:
        raise OptionValueError("faster-op needs factor > 0")
    if options.where not in ("gpu", "cpu", "all"):
        raise OptionValueError(
            f"faster-op: where={options.where} is not gpu, cpu or all",
            hint="where=gpu matches kernels, where=cpu CPU ops, where=all both",
        )
    P.check_pattern(options.pattern, "faster-op: pattern")
    P.check_pattern(options.module, "faster-op: module")


def apply(graph: Graph, options: Options) -> Graph:
    chosen = []
    if options.where in ("gpu", "all"):
        by_name = P.select(graph, kind="gpu", name=options.pattern, module=options.module)
        by_op = P.select(graph, kind="gpu", op=options.pattern, module=options.module)
        chosen.append(np.union1d(by_name, by_op))
    if options.where in ("cpu", "all"):
        chosen.append(P.select(graph, kind="host", op=options.pattern, module=options.module))
    nodes = np.unique(np.concatenate(chosen)) if chosen else np.zeros(0, np.int64)
    if nodes.size == 0:
        raise _nothing_matches(graph, options)
    P.scale(graph, nodes, 1.0 / options.factor)
    graph.assumptions.append(
        f"{nodes.size:,} nodes matching '{options.pattern}' ({options.where}) run "
        f"{options.factor:g}× faster"
    )
    return graph


def _nothing_matches(graph: Graph, options: Options) -> NotApplicableError:
    """Why nothing matched: what was searched (kernels by name and launching op, CPU work by
    its op) and how much of it the trace has."""
    c = graph.cols
    inside = f" inside modules matching '{options.module}'" if options.module else ""
    n_gpu = P.select(graph, kind="gpu", module=options.module).size
    host = P.select(graph, kind="host", module=options.module)
    n_ops = np.unique(c["op"][host][c["op"][host] >= 0]).size
    counts = []  # (how many, what, how it is matched) for what `where` searched
    if options.where in ("gpu", "all"):
        counts.append((n_gpu, "GPU kernels/copies", "by name or launching op"))
    if options.where in ("cpu", "all"):
        counts.append((n_ops, "CPU ops", "by op name"))
    if all(n == 0 for n, _, _ in counts):
        what = " and no ".join(kind for _, kind, _ in counts)
        if options.module:
            hint = (
                "check module=; `perfcast analyze --only scopes` (perfcast.scopes() in "
                "Python) lists the trace's modules"
            )
        elif options.where == "gpu" and n_ops:
            hint = f"where=cpu or where=all searches the trace's {n_ops:,} CPU ops"
        elif options.where == "cpu" and n_gpu:
            hint = f"where=gpu or where=all searches the trace's {n_gpu:,} GPU kernels/copies"
        else:
            hint = (
                "no kernels or ops were profiled: record a training step with torch.profiler's "
                "CPU and CUDA activities; `perfcast summary` shows what the trace has"
            )
        return NotApplicableError(
            f"faster-op: the trace has no {what}{inside} for pattern '{options.pattern}' "
            f"to match (where={options.where})",
            hint=hint,
        )
    what = " and ".join(f"{n:,} {kind} ({how})" for n, kind, how in counts)
    return NotApplicableError(
        f"faster-op: pattern '{options.pattern}' matches none of the trace's {what}{inside}",
        hint="the pattern is a regular expression searched within each name, e.g. "
        "pattern=gemm or pattern=aten::mm; `perfcast summary --top 50` "
        "(perfcast.summary(t, top=50)) lists the top kernels and "
        "ops by name",
    )
