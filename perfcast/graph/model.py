"""The dependency graph that the simulator replays and what-ifs transform.

Nodes live in lanes: a lane is one CPU thread or one GPU stream of a rank.
A CPU thread is cut into a gap-free chain of nodes: runtime calls, and the
CPU work between them (segments), split at every op boundary so each segment
belongs to one op. GPU lanes hold kernels, copies and memsets in stream order.

Only dependencies that cannot be recomputed from the lanes are stored as
edges (cross-stream waits, cross-thread waits, collectives). Thread order,
stream order, launch -> kernel and "this sync waits for the last work on its
stream" are derived by `perfcast.graph.lower` from the graph as it is at replay
time, so a transformed graph (work added, removed, reordered) replays right.

Every node keeps where its duration comes from (`source`): measured from the
trace, scaled by a rule, or modelled by a formula.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

NONE = -1


class NodeKind(enum.IntEnum):
    CPU = 0  # CPU work between runtime calls (inside an op, or an idle gap)
    LAUNCH = 1  # runtime call that enqueues GPU work
    SYNC = 2  # runtime call that blocks the thread until GPU work is done
    RUNTIME = 3  # any other runtime call (malloc, event record, ...)
    GPU = 4  # kernel, copy or memset on a stream
    WAIT = 5  # CPU gap that waits for another thread


class GpuKind(enum.IntEnum):
    NONE = -1
    KERNEL = 0
    MEMCPY = 1
    MEMSET = 2


class SyncKind(enum.IntEnum):
    NONE = -1
    STREAM = 0  # waits for the last work enqueued on one stream
    DEVICE = 1  # waits for the last work on every stream of the device
    COPY = 2  # a blocking copy: waits for its own copy


class Source(enum.IntEnum):
    MEASURED = 0
    SCALED = 1
    MODELLED = 2
    CORRECTED = 3  # measured, less the profiler's own cost


class EdgeType(enum.IntEnum):
    CROSS_STREAM = 0  # event record -> stream wait event (GPU to GPU)
    CROSS_THREAD = 1  # a thread resumes when another thread's work ends
    COLLECTIVE = 2  # the same collective on two ranks
    DATA = 3  # added by a what-if


@dataclass
class Lane:
    rank: int
    is_gpu: bool
    pid: int  # process id, or device for GPU lanes
    tid: int  # thread id, or stream for GPU lanes
    name: str


@dataclass
class IterationSpan:
    """A step as the replay sees it: see events.Iteration for how its time is counted."""

    rank: int
    name: str
    measured_ns: int
    start_node: int  # first node of the step on its thread (NONE: whole-trace window)
    end_node: int  # last node of the step's CPU range
    index: int = NONE  # iteration index (the nodes' `iteration` column)


# Node columns and their dtypes; `Graph.append` and `Graph.take` rely on this list.
NODE_COLUMNS: dict[str, type] = {
    "kind": np.int8,
    "lane": np.int32,
    "order": np.float64,  # position in its lane (measured start, or between neighbours)
    "launch_order": np.float64,  # GPU: when it was enqueued (its launch's position)
    "dur": np.int64,  # duration the simulator uses (ns)
    "dur_measured": np.int64,
    "start_measured": np.int64,  # relative to the rank's origin
    "source": np.int8,
    "event": np.int32,  # row in the EventTable, NONE for inserted nodes
    "op": np.int32,  # enclosing CPU op row (what the node is attributed to)
    "op_name": np.int32,  # that op's name (index into Graph.names)
    "scope": np.int32,  # enclosing nn.Module / record_function scope name, NONE if none
    "phase": np.int8,
    "iteration": np.int32,
    "name": np.int32,  # index into Graph.names
    "gpu_kind": np.int8,
    "klass": np.int8,  # hardware.classify.KernelClass, NONE when unknown
    "launch": np.int32,  # GPU: node of the launching call
    "launch_w": np.int64,  # GPU start >= launch end + launch_w
    "stream_w": np.int64,  # GPU start >= stream predecessor end + stream_w
    "release": np.int64,  # earliest start when nothing else constrains it
    "sync_kind": np.int8,
    "sync_lane": np.int32,  # SYNC on a stream: which lane
    "sync_w": np.int64,  # SYNC end >= waited work end + sync_w
    "queue_w": np.int64,  # LAUNCH end >= end of the entry that frees its queue slot + queue_w
    "nbytes": np.int64,
    "rank": np.int32,
}

NO_RELEASE = np.iinfo(np.int64).min // 4

# Columns that default to zero (durations, weights, sizes) rather than NONE.
_ZERO_DEFAULT = frozenset(
    ("dur", "dur_measured", "start_measured", "launch_w", "stream_w", "sync_w", "queue_w", "nbytes")
)


def column_default(key: str, source: Source | None = None) -> int:
    """What a node column holds when not given: 0, NO_RELEASE, the source given, else NONE."""
    if key in _ZERO_DEFAULT:
        return 0
    if key == "release":
        return NO_RELEASE
    if key == "source":
        return int(source if source is not None else Source.MODELLED)
    return NONE


def _frozen(a: np.ndarray) -> np.ndarray:
    """A read-only view of `a` (a shares-memory copy that cannot write through)."""
    v = a.view()
    v.flags.writeable = False
    return v


@dataclass
class Graph:
    """Node columns (arrays of equal length), lanes, extra edges, iteration spans."""

    cols: dict[str, np.ndarray]
    lanes: list[Lane]
    names: list[str]
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_w: np.ndarray
    edge_type: np.ndarray
    edge_at_end: np.ndarray  # True: the edge bounds the destination's end, not its start
    iterations: list[IterationSpan]
    rank_origin_ns: dict[int, int]
    device_names: dict[int, str | None]
    # Added to a rank's times to put every rank on one clock (collectives aligned).
    rank_clock_ns: dict[int, int] = field(default_factory=dict)
    unresolved: dict[str, int] = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)
    removed: np.ndarray | None = None
    # Latencies measured on the trace at build time (launch latency, stream gap).
    nominal: dict[str, int] = field(default_factory=dict)
    # The EventTable it was built from (shapes, device properties); shared, never modified.
    table: Any = field(default=None, repr=False)
    _name_index: dict[str, int] = field(default_factory=dict, repr=False)
    # step_boundaries' cache: (the iterations list it was made from, its length, the ids).
    _boundaries: tuple[list[IterationSpan], int, np.ndarray] | None = field(
        default=None, repr=False
    )

    def __len__(self) -> int:
        return int(self.cols["kind"].shape[0])

    def __eq__(self, other: object) -> bool:
        # The generated one compared arrays into arrays: `a == b` raised ValueError.
        from perfcast.arrays import same_value

        return same_value(self, other)

    def __repr__(self) -> str:
        # The generated repr printed every column (50k characters for a 27k-event trace).
        ranks = sorted({ln.rank for ln in self.lanes})
        alive = int(self.alive.sum())
        return (
            f"Graph({len(self):,} nodes ({alive:,} alive), {self.edge_src.size:,} edges beside "
            f"lane order, "
            f"{len(self.lanes)} lanes, rank(s) {ranks[:8]}{'...' if len(ranks) > 8 else ''}, "
            f"{len(self.iterations)} steps, {len(self.assumptions)} assumptions)"
        )

    @property
    def alive(self) -> np.ndarray:
        if self.removed is None:
            return np.ones(len(self), dtype=bool)
        return ~self.removed

    def copy(self, writable: Collection[str] | None = None) -> Graph:
        """A deep copy; what-ifs never modify the graph they are given.

        With `writable`, only those node columns are copied: the other columns and the edges
        are read-only views of this graph's (writing one in place raises; replacing it, as
        `append`, `add_edges` and `drop_edges` do, is fine). For a derived graph that changes
        a few columns of a large trace (the profiler-cost correction changes two of ~30)."""
        g = copy.copy(self)
        if writable is None:
            g.cols = {k: v.copy() for k, v in self.cols.items()}
            edges = [a.copy() for a in self._edge_arrays()]
        else:
            g.cols = {k: v.copy() if k in writable else _frozen(v) for k, v in self.cols.items()}
            edges = [_frozen(a) for a in self._edge_arrays()]
        g.edge_src, g.edge_dst, g.edge_w, g.edge_type, g.edge_at_end = edges
        g.lanes = list(self.lanes)
        g.names = list(self.names)
        g._name_index = dict(self._name_index)
        g.iterations = list(self.iterations)
        g.unresolved = dict(self.unresolved)
        g.nominal = dict(self.nominal)
        g.device_names = dict(self.device_names)
        g.rank_origin_ns = dict(self.rank_origin_ns)
        g.rank_clock_ns = dict(self.rank_clock_ns)
        g.assumptions = list(self.assumptions)
        g.removed = None if self.removed is None else self.removed.copy()
        return g

    def step_boundaries(self) -> np.ndarray:
        """Sorted ids of the nodes where steps start and end. Cached for the iterations list
        it was made from (held, so its id cannot be reused): what-ifs remove nodes one rank
        at a time, and rebuilding it on every removal cost O(ranks^2) (5 of advise's 113 s
        on 1,024 ranks)."""
        cached = self._boundaries
        if cached is None or cached[0] is not self.iterations or cached[1] != len(cached[0]):
            ids = [s.start_node for s in self.iterations if s.start_node >= 0]
            ids += [s.end_node for s in self.iterations if s.end_node >= 0]
            ids_a = np.unique(np.array(ids, dtype=np.int64))
            self._boundaries = cached = (self.iterations, len(self.iterations), ids_a)
        return cached[2]

    def _edge_arrays(self) -> list[np.ndarray]:
        return [self.edge_src, self.edge_dst, self.edge_w, self.edge_type, self.edge_at_end]

    def intern(self, name: str) -> int:
        """Index of a name in `names`, adding it if new."""
        if len(self._name_index) != len(self.names):
            self._name_index = {n: i for i, n in enumerate(self.names)}
        idx = self._name_index.get(name)
        if idx is None:
            idx = len(self.names)
            self.names.append(name)
            self._name_index[name] = idx
        return idx

    def lane_index(self, gpu: bool) -> dict[tuple[int, int, int], int]:
        """(rank, pid or device, tid or stream) -> lane, for GPU or CPU lanes."""
        return {(ln.rank, ln.pid, ln.tid): i for i, ln in enumerate(self.lanes) if ln.is_gpu == gpu}

    def cpu_lanes_of(self, rank: np.ndarray, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
        """The CPU lane of each (rank, pid, tid), -1 where the graph has none; one dict lookup
        per distinct thread, not per row."""
        from perfcast.arrays import combine_codes

        if rank.size == 0:
            return np.zeros(0, dtype=np.int64)
        codes, rows = combine_codes(
            rank.astype(np.int64), pid.astype(np.int64), tid.astype(np.int64)
        )
        lane_of = self.lane_index(gpu=False)
        per_thread = [lane_of.get((int(r), int(p), int(t)), -1) for r, p, t in rows.tolist()]
        return np.array(per_thread, dtype=np.int64)[codes]

    def name_of(self, node: int) -> str:
        # NONE (host time outside every op) must not index from the end: it read as the
        # last name a what-if interned.
        i = int(self.cols["name"][node])
        return self.names[i] if i >= 0 else "(outside any op)"

    def append(self, **values: np.ndarray | int | float) -> np.ndarray:
        """Add nodes; columns not given take defaults. Returns the new node ids."""
        lengths = {np.size(v) for v in values.values()}
        m = max(lengths) if lengths else 0
        start = len(self)
        for key, dtype in NODE_COLUMNS.items():
            v = values.get(key, column_default(key))
            arr: np.ndarray = np.broadcast_to(np.asarray(v, dtype=dtype), (m,))
            self.cols[key] = np.concatenate([self.cols[key], arr])
        if self.removed is not None:
            self.removed = np.concatenate([self.removed, np.zeros(m, dtype=bool)])
        return np.arange(start, start + m)

    def remove(self, nodes: np.ndarray) -> None:
        if self.removed is None:
            self.removed = np.zeros(len(self), dtype=bool)
        self.removed[nodes] = True

    def add_edges(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        w: np.ndarray | int,
        etype: EdgeType,
        at_end: bool = False,
    ) -> None:
        src = np.atleast_1d(np.asarray(src, dtype=np.int32))
        dst = np.atleast_1d(np.asarray(dst, dtype=np.int32))
        self.edge_src = np.concatenate([self.edge_src, src])
        self.edge_dst = np.concatenate([self.edge_dst, dst])
        self.edge_w = np.concatenate(
            [self.edge_w, np.broadcast_to(np.asarray(w, dtype=np.int64), src.shape)]
        )
        self.edge_type = np.concatenate(
            [self.edge_type, np.full(src.shape, int(etype), dtype=np.int8)]
        )
        self.edge_at_end = np.concatenate(
            [self.edge_at_end, np.full(src.shape, at_end, dtype=bool)]
        )

    def drop_edges(self, drop: np.ndarray) -> None:
        """Delete the edges where the boolean mask `drop` is set."""
        if drop.any():
            keep = ~drop
            self.edge_src = self.edge_src[keep]
            self.edge_dst = self.edge_dst[keep]
            self.edge_w = self.edge_w[keep]
            self.edge_type = self.edge_type[keep]
            self.edge_at_end = self.edge_at_end[keep]

    def check_invariants(self) -> list[str]:
        problems = []
        n = len(self)
        for k, v in self.cols.items():
            if v.shape[0] != n:
                problems.append(f"column {k} has length {v.shape[0]}, expected {n}")
        if (self.cols["dur"] < 0).any():
            problems.append("negative durations")
        gpu = np.flatnonzero(self.cols["kind"] == NodeKind.GPU)
        bad_lane = [int(i) for i in gpu if not self.lanes[int(self.cols["lane"][i])].is_gpu]
        if bad_lane:
            problems.append(f"{len(bad_lane)} GPU nodes on CPU lanes")
        if self.edge_src.size and (
            (self.edge_src < 0).any() or (self.edge_src >= n).any() or (self.edge_dst >= n).any()
        ):
            problems.append("edge endpoints out of range")
        return problems
