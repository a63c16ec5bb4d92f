"""cuda-graphs: capture each step's forward/backward/optimizer and replay it with one launch.

Assumptions: shapes are static and the captured region holds no host
synchronization (capture would fail; syncs found inside are assumed moved
out, and counted). All CPU work of the captured region — Python, dispatcher,
launches — is replaced by one graph launch; kernels keep their measured
durations and run back to back with the trace's own measured stream gap.
Graph launch cost: a few microseconds, roughly constant for straight-line
graphs (NVIDIA technical blog, "Constant Time Launch for Straight-Line CUDA
Graphs and Other Performance Enhancements", 2023).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.errors import NotApplicableError
from perfcast.graph.model import Graph, NodeKind, Source
from perfcast.whatif import primitives as P

SUMMARY = "replay each step's GPU work from a captured CUDA graph (phases=forward,backward,...)"

GRAPH_LAUNCH_NS = 2_500


@dataclass
class Options:
    phases: str = "forward,backward,optimizer"
    graph_launch_us: float = GRAPH_LAUNCH_NS / 1000


def apply(graph: Graph, options: Options) -> Graph:
    c = graph.cols
    phases = [p.strip() for p in options.phases.split(",") if p.strip()]
    if not (c["kind"] == NodeKind.GPU).any():
        raise NotApplicableError("cuda-graphs: the trace has no GPU work")
    host = P.select(graph, kind="host", phase=phases)
    host = host[c["iteration"][host] >= 0]
    if host.size == 0:
        raise NotApplicableError(f"cuda-graphs: no CPU work in phases {options.phases}")
    lat = graph.nominal.get("launch_latency_ns", 5_000)
    gap = graph.nominal.get("stream_gap_ns", 1_000)
    n_sync = 0
    n_kernels = 0
    removed_cpu = 0
    keys = np.stack([c["rank"][host], c["iteration"][host]], axis=1)
    for rank, it in np.unique(keys, axis=0).tolist():
        region = host[(c["rank"][host] == rank) & (c["iteration"][host] == it)]
        launches = region[c["kind"][region] == NodeKind.LAUNCH]
        if launches.size == 0:
            continue
        n_sync += int((c["kind"][region] == NodeKind.SYNC).sum())
        first = int(launches[np.argmin(c["order"][launches])])
        gpu = np.flatnonzero(np.isin(c["launch"], launches) & graph.alive)
        n_kernels += gpu.size
        c["launch"][gpu] = first
        c["launch_w"][gpu] = lat
        c["stream_w"][gpu] = np.minimum(c["stream_w"][gpu], gap)
        c["launch_order"][gpu] = c["order"][first]
        P.set_duration(
            graph, np.array([first]), int(options.graph_launch_us * 1000), Source.MODELLED
        )
        c["name"][first] = graph.intern("cudaGraphLaunch")
        rest = region[region != first]
        removed_cpu += int(c["dur"][rest].sum())
        P.remove(graph, rest)
    if n_kernels == 0:
        raise NotApplicableError("cuda-graphs: no kernels are launched in the selected phases")
    graph.assumptions.append(
        f"{n_kernels:,} GPU tasks replayed from CUDA graphs; {removed_cpu / 1e6:.2f} ms of CPU "
        f"work and launches removed; graph launch {options.graph_launch_us:g} µs"
    )
    if n_sync:
        graph.assumptions.append(
            f"{n_sync} host synchronizations inside the captured region are assumed moved out "
            "(capture cannot contain them)"
        )
    return graph
