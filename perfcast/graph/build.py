"""EventTable -> Graph: lanes, links and edges, one module per edge family.

    lanes       program order of CPU threads and GPU streams
    launches    launch -> GPU task, attribution, launch / stream weights
    syncs       synchronizing calls, blocking copies, cross-stream waits
    threads     cross-thread hand-offs, forward -> backward
    collectives the same collective on several ranks
    steps       iteration spans

Weights are measured, so an untransformed replay reproduces the trace.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from perfcast.events import GPU_KINDS, NONE, EventTable, RankInfo
from perfcast.graph.acyclic import break_cycles, cyclic_node_count
from perfcast.graph.collectives import COLLECTIVE_WRITES, add_collective_waits, match_collectives
from perfcast.graph.host_collectives import enqueue_edges
from perfcast.graph.lanes import CPU_LANE_KINDS, NodeColumns, build_cpu_lanes, build_gpu_lanes
from perfcast.graph.launches import attribute_names, gpu_weights, link_launches, queue_weights
from perfcast.graph.lower import lower
from perfcast.graph.model import EdgeType, Graph, IterationSpan, Lane
from perfcast.graph.phases import enclosing_scopes, event_phases
from perfcast.graph.steps import iteration_spans
from perfcast.graph.syncs import (
    SYNC_MIN_NS,
    classify_runtime,
    cross_stream_edges,
    split_blocking_copies,
    sync_weights,
)
from perfcast.graph.threads import CROSS_THREAD_TOL_NS, cross_thread_waits, forward_backward_edges


def build_graph(table: EventTable, ranks: Collection[int] | None = None) -> Graph:
    """The dependency graph of every rank in the table, or of `ranks` only (their rows
    alone become nodes: what one rank's host and GPU did, without the waits for the
    others)."""
    phases = event_phases(table)
    scopes = enclosing_scopes(table)
    klass = _kernel_classes(table)
    acc = NodeColumns(parts={})
    lanes: list[Lane] = []
    iterations: list[IterationSpan] = []
    origins: dict[int, int] = {}
    devices: dict[int, str | None] = {}
    row_to_node = np.full(len(table), NONE, dtype=np.int64)
    edges: list[tuple[np.ndarray, np.ndarray, np.ndarray, int, bool]] = []
    unresolved = {
        "gpu_without_launch": 0,
        "gpu_start_unexplained": 0,
        "sync_without_target": 0,
        "cycles_broken": 0,
    }

    lane_kinds = table.kind_mask((*CPU_LANE_KINDS, *GPU_KINDS))
    renamed: set[tuple[str, str, str]] = set()  # (the trace's device name, the part, how)
    for info in table.ranks:
        rank = info.rank
        if ranks is not None and rank not in ranks:
            continue
        on_rank = table.rank_rows(rank)
        act = on_rank[lane_kinds[on_rank]]
        if act.size == 0:
            continue
        origin = int(table.ts[act].min())
        origins[rank] = origin
        part = devices[rank] = known_device_name(info)
        if info.device_name and part and part != info.device_name:
            renamed.add((info.device_name, part, _matched_how(info.device_name)))
        build_cpu_lanes(table, rank, origin, phases, acc, lanes, row_to_node)
        build_gpu_lanes(table, rank, origin, phases, klass, acc, lanes, row_to_node)

    cols = acc.columns()
    graph = Graph(
        cols=cols,
        lanes=lanes,
        names=table.names,  # shared: what-ifs copy before adding names
        edge_src=np.zeros(0, np.int32),
        edge_dst=np.zeros(0, np.int32),
        edge_w=np.zeros(0, np.int64),
        edge_type=np.zeros(0, np.int8),
        edge_at_end=np.zeros(0, bool),
        iterations=iterations,
        rank_origin_ns=origins,
        device_names=devices,
        unresolved=unresolved,
    )
    graph.names = list(table.names)
    graph.table = table
    link_launches(table, graph, row_to_node)
    attribute_names(table, graph, scopes)
    classify_runtime(table, graph, row_to_node)
    split_blocking_copies(graph)
    cross = cross_stream_edges(table, graph, row_to_node)
    gpu_weights(graph, cross, unresolved, edges)
    sync_weights(graph, unresolved)
    queue_weights(graph)
    cross_thread_waits(table, graph, edges)
    enqueue_edges(table, graph, edges)
    forward_backward_edges(table, graph, edges)
    for src, dst, w, etype, at_end in edges:
        graph.add_edges(src, dst, w, EdgeType(etype), at_end)
    collectives_across_ranks(graph, unresolved)
    iterations.extend(iteration_spans(table, graph, row_to_node))
    # A damaged or inconsistent trace can make the edges above contradict each other.
    graph.unresolved["cycles_broken"] = graph.unresolved.get("cycles_broken", 0) + break_cycles(
        graph
    )
    graph.assumptions.extend(
        [
            "GPU tasks start after their launch, their stream predecessor and any "
            "cross-stream wait, with the measured latency of whichever one delayed them",
            f"a synchronization that did not wait costs {SYNC_MIN_NS / 1000:.0f} µs of CPU time",
            "a CPU thread that resumed within "
            f"{CROSS_THREAD_TOL_NS / 1000:.0f} µs of another thread's work ending waited for it",
        ]
        + [
            f"the trace's GPU '{name}' is read as the device table's {part} ({how})"
            for name, part, how in sorted(renamed)
        ]
    )
    return graph


def collectives_across_ranks(graph: Graph, unresolved: dict[str, int]) -> None:
    """Cross-rank collective waits; dropped (and counted) if they would form a cycle."""
    if len({ln.rank for ln in graph.lanes}) < 2:
        return
    # Undone by cutting off what it appends and putting back what it overwrites, not from a
    # copy of the graph: the copy was the build's peak (64 MiB on 128 DLRM ranks, 503k nodes).
    n, n_edges, n_notes = len(graph), graph.edge_src.size, len(graph.assumptions)
    matches = match_collectives(graph)
    parts = np.array([x for m in matches.values() for x in m.values()], dtype=np.int64)
    written = {k: graph.cols[k][parts] for k in COLLECTIVE_WRITES}
    edge_dst, clock = graph.edge_dst.copy(), dict(graph.rank_clock_ns)
    if add_collective_waits(graph, matches) == 0:
        return
    if cyclic_node_count(lower(graph)):
        graph.cols = {k: v[:n].copy() for k, v in graph.cols.items()}
        for k, v in written.items():
            graph.cols[k][parts] = v
        edges = [a[:n_edges].copy() for a in graph._edge_arrays()]
        graph.edge_src, _, graph.edge_w, graph.edge_type, graph.edge_at_end = edges
        graph.edge_dst = edge_dst
        if graph.removed is not None:
            graph.removed = graph.removed[:n].copy()
        graph.rank_clock_ns = clock
        # match_collectives' notes go too, as they went with the copy.
        del graph.assumptions[n_notes:]
        graph.unresolved["collectives_unmatched"] = (
            graph.unresolved.get("collectives_unmatched", 0) + 1
        )


def _matched_how(name: str) -> str:
    from perfcast.hardware.devices import lookup_device

    if lookup_device(name) is not None:
        return "by its name"
    return "by its compute units and memory: the name matches no part"


def known_device_name(info: RankInfo) -> str | None:
    """The device as the hardware tables know it (ROCm may call every GPU "AMD Radeon
    Graphics": its compute-unit count and memory then tell), else the trace's own name."""
    try:
        from perfcast.hardware.devices import lookup_device_properties
    except ImportError:  # pragma: no cover
        return info.device_name
    spec = lookup_device_properties(info.device_properties) if info.device_properties else None
    return spec.name if spec is not None else info.device_name


def _kernel_classes(table: EventTable) -> np.ndarray:
    """KernelClass per name (NONE when the classifier is unavailable)."""
    try:
        from perfcast.hardware.classify import classify_names
    except ImportError:
        return np.full(len(table.names), NONE, dtype=np.int8)
    return np.asarray(classify_names(table.names), dtype=np.int8)
