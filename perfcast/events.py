"""The normalized, columnar form of a trace: `EventTable`.

Every downstream package reads this and never the JSON. One row per complete
("X") event or memory instant event, across all ranks; columns are NumPy
arrays and names are interned into `names` (a row stores an index).
Times are integer nanoseconds on each rank's own clock (`RankInfo.base_ns`
says how to move them to a common clock).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    from pandas import DataFrame as PandasFrame
    from polars import DataFrame as PolarsFrame
    from pyarrow import Table as ArrowTable
else:
    # The DataFrame hand-offs' return types (here and in perfcast.frames): the optional
    # libraries' own types for type checkers, Any at runtime, so that typing.get_type_hints
    # resolves them without pandas installed and importing perfcast loads nothing more.
    PandasFrame = PolarsFrame = ArrowTable = Any

NONE = -1  # missing value in the integer id columns
MEM_DEVICE_CPU = -2  # mem_device of a [memory] event on the CPU's allocator


class Kind(enum.IntEnum):
    """What an event is, independent of the trace generation that wrote it."""

    CPU_OP = 0
    USER_ANNOTATION = 1
    PYTHON_FUNCTION = 2
    RUNTIME = 3  # cuda_runtime / hip runtime calls (launches, syncs, copies)
    DRIVER = 4  # cuda_driver (cuLaunchKernel from Triton, etc.)
    KERNEL = 5
    MEMCPY = 6
    MEMSET = 7
    GPU_ANNOTATION = 8  # gpu_user_annotation (ranges drawn on a stream)
    CUDA_SYNC = 9  # "cuda_sync" events Kineto draws on the GPU side
    MEMORY = 10  # [memory] instant events: allocations and frees
    OTHER = 11
    # "cuda_profiler_range": one kernel's CUPTI range-profiler counters (torch.profiler's
    # experimental_config profiler_metrics); the kernel itself is not timed.
    GPU_COUNTERS = 12


GPU_KINDS = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)
# torch.profiler's step ranges, ProfilerStep#N (N counts the profiler's steps).
STEP_PREFIX = "ProfilerStep#"
# gloo (a CPU backend) runs each collective on a worker thread of its own, under a user
# annotation named `gloo:<op>` (ProcessGroupGloo's profiling title) with the tensors' shapes.
GLOO_RANGE_PREFIX = "gloo:"
# NCCL's ranges inside c10d collectives (nccl:all_reduce, ...); they record their tensors.
NCCL_RANGE_PREFIX = "nccl:"
CPU_KINDS = (Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON_FUNCTION, Kind.RUNTIME, Kind.DRIVER)


@dataclass
class Iteration:
    """One profiler step (or the whole trace when it has none) on one rank.

    A step is complete when its CPU range has ended and all GPU work it
    launched has finished. Its time is measured from the previous step's
    completion to its own completion, so consecutive steps tile the timeline
    and their times add up to the total, however far the CPU runs ahead of the
    GPU. The first step's predecessor is not in the trace: its time runs from
    its own start, or from when the GPU work queued before the trace is done
    if that is later.
    """

    rank: int
    name: str
    start_ns: int  # the ProfilerStep range's start on the CPU
    end_ns: int  # completion: CPU range end or end of its GPU work, whichever is later
    cpu_end_ns: int = 0
    window_start_ns: int = 0  # previous step's completion (first step: see above)

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.window_start_ns


@dataclass
class RankInfo:
    """What one trace file told us about the process that wrote it."""

    rank: int
    path: str
    rank_by_order: bool = False  # numbered by its place in its folder (the file says none)
    device_name: str | None = None
    device_properties: dict[str, object] | None = None  # the first deviceProperties entry
    world_size: int | None = None
    backend: str | None = None
    base_ns: int = 0  # add to a timestamp to get baseTimeNanoseconds-aligned time
    schema_version: object = None
    has_steps: bool = True
    # ProfilerStep ranges written without a duration: left out of the steps (their end is
    # unknown), by name.
    untimed_steps: list[str] = field(default_factory=list)
    # Salvage information for truncated files: events lost is an estimate.
    truncated: bool = False
    tail_lost: bool = False  # the file stops inside the event list (a cut): later events lost
    salvage_note: str | None = None
    # What the salvaged loss came from: "cut", "corrupt" (gzip), "invalid" (NaN or Infinity)
    # or "damaged"; and with tail_lost, where and why reading stopped ("the file is cut off").
    damage: str | None = None
    tail_stop: str | None = None
    # With tail_lost: the step the cut fell in and those after it (their ends may be lost).
    cut_steps: list[str] = field(default_factory=list)
    n_events: int = 0
    warnings: list[str] = field(default_factory=list)
    # From the `perfcast` object perfcast's capture writes into the trace: steps timed without
    # the profiler before the traced window and after it (ms), and the machine that ran them.
    unprofiled_step_ms: list[float] = field(default_factory=list)
    unprofiled_after_step_ms: list[float] = field(default_factory=list)
    # The capture stopped inside the last ProfilerStep (the script ended mid-window): that
    # "step" holds what the script did after its loop, not a training step.
    last_step_open: bool = False
    # What the trace says about the machine it was taken on (None: nothing): "host_id"
    # (calibration.machine_id of its host name), "from" (which field said so), and what
    # `perfcast profile` records besides (cpu_model, cores, torch).
    machine: dict[str, object] | None = None
    # distributedInfo lists a gloo process group smaller than the world: gloo's ranges (which
    # do not say their group) cannot be matched across ranks or sized by the world.
    gloo_subgroups: bool = False
    # Of `warnings`, those about the whole folder of ranks (files left out, ranks that
    # disagree on the job's size), on its first rank: a summary says them once, on top.
    folder_notes: list[str] = field(default_factory=list)


@dataclass
class EventTable:
    """Columnar events of one or more ranks.

    Columns (length n):
      kind int8 (Kind), rank int32, pid int64, tid int64 (GPU rows: device, stream),
      ts int64 ns, dur int64 ns, name int32 (index into names),
      correlation int64, external_id int64, seq int64 (sequence number),
      fwd_tid int64, parent int32 (row of the enclosing CPU event, NONE at top),
      iteration int32 (index into iterations, NONE outside every step),
      grid int32 (n, 3), block int32 (n, 3), nbytes int64 (copies, memsets, memory),
      mem_total int64 (memory events: total allocated), mem_device int16 (memory events:
      the GPU's index, MEM_DEVICE_CPU for the CPU's allocator, NONE when not recorded),
      shapes int32 (index into names),
      in_types int32 (names: an op's "Input type", with record_shapes),
      stack int32 (names: an op's or range's "Call stack", the Python frames PyTorch
      1.8-1.10 recorded with with_stack=True, innermost first and ';'-separated),
      concrete int32 (names: a convolution op's "Concrete Inputs", the values of its
      scalar and list arguments, stride and padding among them; NONE on other ops),
      coll_name int32 (names), coll_in int64, coll_out int64, coll_group int32,
      coll_dtype int32 (names), coll_ranks int32 (names),
      wait_stream int64 and wait_corr int64 (cuda_sync rows: what a stream waits on).
    Links (row index pairs): launch_kernel (runtime -> GPU row, by correlation),
    fwd_bwd (forward op -> backward op).
    """

    names: list[str]
    kind: np.ndarray
    rank: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    name: np.ndarray
    correlation: np.ndarray
    external_id: np.ndarray
    seq: np.ndarray
    fwd_tid: np.ndarray
    parent: np.ndarray
    iteration: np.ndarray
    grid: np.ndarray
    block: np.ndarray
    nbytes: np.ndarray
    mem_total: np.ndarray
    mem_device: np.ndarray
    shapes: np.ndarray
    in_types: np.ndarray  # CPU ops: their "Input type" list as text (index into names)
    stack: np.ndarray  # CPU ops and ranges of 2021-era traces: "Call stack" (names)
    concrete: np.ndarray  # convolution ops: their "Concrete Inputs" as text (names)
    wait_stream: np.ndarray  # cuda_sync rows: the stream waited on
    wait_corr: np.ndarray  # cuda_sync rows: correlation of the cudaEventRecord waited on
    coll_name: np.ndarray
    coll_in: np.ndarray
    coll_out: np.ndarray
    coll_group: np.ndarray
    coll_dtype: np.ndarray
    coll_ranks: np.ndarray
    launch: np.ndarray  # GPU row -> launching runtime row (NONE if unknown)
    fwd_bwd: np.ndarray  # (m, 2) rows: forward op, backward op
    ranks: list[RankInfo]
    iterations: list[Iteration]
    # Thread names from "M" metadata events: (rank, pid, tid) -> name.
    thread_names: dict[tuple[int, int, int], str] = field(default_factory=dict)
    # Derived arrays, computed once: key -> (the columns read, the read-only result).
    _memo: dict[Any, tuple[tuple[np.ndarray, ...], Any]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    def __eq__(self, other: object) -> bool:
        # The generated one compared arrays into arrays: `a == b` raised ValueError.
        from perfcast.arrays import same_value

        return same_value(self, other)

    def _derived(self, key: Any, cols: tuple[np.ndarray, ...], make: Any) -> np.ndarray:
        """`make()` once per table, recomputed if one of `cols` was replaced since. Read-only:
        the graph builder asks per rank, and a thousand ranks made whole-table masks and
        sums a thousand times (O(ranks x events))."""

        def read_only() -> np.ndarray:
            value = np.asarray(make())
            value.flags.writeable = False
            return value

        return cast("np.ndarray", self.memo(key, cols, read_only))

    def memo(self, key: Any, cols: tuple[np.ndarray, ...], make: Any) -> Any:
        """`make()` once per table, recomputed if one of `cols` was replaced since; the
        caller must not change what it gets (copy it first)."""
        hit = self._memo.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], cols, strict=True)):
            return hit[1]
        value = make()
        self._memo[key] = (cols, value)
        return value

    def step_marker_names(self) -> np.ndarray:
        """Per name id: is it a ProfilerStep#N step marker (the profiler's step ranges, which
        span every phase of a step; 2021-era traces record them as CPU ops)."""
        return np.array([n.startswith(STEP_PREFIX) for n in self.names], dtype=bool)

    def annotation_mask(self) -> np.ndarray:
        """Read-only mask of the record_function ranges (step markers excepted): the
        `user_annotation` events, and 2021-era traces' ranges, which those traces record as
        CPU ops ("Optimizer.step#SGD.step", "enumerate(DataLoader)#..."): an ATen or custom
        op's name never holds a '#'."""

        def make() -> np.ndarray:
            hashed = np.array(["#" in n for n in self.names], dtype=bool)
            ranges = (self.kind == Kind.USER_ANNOTATION) | (
                (self.kind == Kind.CPU_OP) & hashed[self.name]
            )
            return ranges & ~self.step_marker_names()[self.name]

        return self._derived("annotations", (self.kind, self.name), make)

    def kind_mask(self, kinds: Any) -> np.ndarray:
        """Read-only mask of the rows whose kind is one of `kinds` (ints or Kinds)."""
        codes = tuple(sorted({int(k) for k in np.atleast_1d(np.asarray(kinds)).tolist()}))
        return self._derived(
            ("kind", codes),
            (self.kind,),
            lambda: np.isin(self.kind, np.array(codes, dtype=np.int8)),
        )

    def ends(self) -> np.ndarray:
        """Read-only ts + dur of every row."""
        return self._derived("end", (self.ts, self.dur), lambda: self.ts + self.dur)

    def rank_rows(self, rank: int) -> np.ndarray:
        """The rows of one rank, in row order."""
        order = self._derived(
            "rank_order", (self.rank,), lambda: np.argsort(self.rank, kind="stable")
        )
        ranks = self._derived("rank_sorted", (self.rank, order), lambda: self.rank[order])
        # In the column's own dtype: a mismatched needle makes NumPy convert the whole column.
        lo, hi = np.searchsorted(ranks, np.array([rank, rank + 1], dtype=ranks.dtype))
        return order[int(lo) : int(hi)]

    def __repr__(self) -> str:
        # The generated repr printed every column (100k+ characters): say what it holds.
        steps = len(self.iterations)
        cut = sum(r.truncated for r in self.ranks)
        cuts = all(r.damage == "cut" for r in self.ranks if r.truncated)
        how = "truncated" if cuts else "damaged"
        salvaged = f", salvaged from {cut} {how} file(s)" if cut else ""
        return (
            f"EventTable({len(self):,} events, {len(self.ranks)} rank(s) "
            f"{self.rank_ids()[:8]}{'...' if len(self.ranks) > 8 else ''}, {steps} steps, "
            f"{len(self.names):,} names{salvaged})"
        )

    def to_pandas(self) -> PandasFrame:
        """One row per event as a pandas DataFrame (needs pandas).

        A copy: editing the frame leaves the table unchanged. `kind` and the name columns
        are categoricals over the interned names. Times are integer ns on each rank's clock.

        >>> perfcast.load("trace.json.gz").to_pandas().groupby("name").dur.sum()  # doctest: +SKIP
        """
        from perfcast.frames import events_to_pandas

        return events_to_pandas(self)

    def to_arrow(self) -> ArrowTable:
        """One row per event as a pyarrow Table (names dictionary-encoded, no copy of codes).

        >>> perfcast.load("trace.json.gz").to_arrow().schema                     # doctest: +SKIP
        """
        from perfcast.frames import events_to_arrow

        return events_to_arrow(self)

    def to_polars(self) -> PolarsFrame:
        """One row per event as a polars DataFrame (through Arrow).

        >>> perfcast.load("trace.json.gz").to_polars().filter(kind="kernel")     # doctest: +SKIP
        """
        from perfcast.frames import events_to_polars

        return events_to_polars(self)

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    def name_of(self, row: int) -> str:
        return self.names[int(self.name[row])]

    def names_of(self, rows: np.ndarray) -> list[str]:
        names = self.names
        return [names[i] for i in self.name[rows].tolist()]

    def rows(self, kind: Kind | tuple[Kind, ...], rank: int | None = None) -> np.ndarray:
        """Row indices of the given kind(s), optionally on one rank."""
        mask = self.kind_mask((kind,) if isinstance(kind, Kind) else kind)
        if rank is None:
            return np.flatnonzero(mask)
        on_rank = self.rank_rows(rank)
        return on_rank[mask[on_rank]]

    def is_gpu(self) -> np.ndarray:
        return self.kind_mask(GPU_KINDS).copy()

    def rank_ids(self) -> list[int]:
        return [r.rank for r in self.ranks]

    def require_events(self) -> EventTable:
        """This table, or a PerfcastError when it holds no complete event: every analysis
        would print empty tables and 0 ms."""
        if len(self) == 0:
            from perfcast.errors import TraceFormatError

            # Why nothing is left, when events were there: unreadable times, wrong types.
            skipped = [
                w
                for r in self.ranks
                for w in [r.salvage_note or "", *r.warnings]
                if "were skipped" in w or w.startswith("dropped ") or "NaN or Infinity" in w
            ]
            raise TraceFormatError(
                "the trace holds no complete events: nothing to analyse"
                + (f" ({skipped[0]})" if skipped else ""),
                path=self.source(),
                # Events there, none usable: recording more steps would not help.
                hint="the events are there, but none can be used as written: the program "
                "that wrote the trace must write them as torch.profiler does"
                if skipped
                else "profile at least one step: torch.profiler with prof.step(), or "
                "`perfcast profile`",
            )
        return self

    def source(self) -> str:
        """The trace as a user names it in a message: its file, or the folder its ranks'
        files share."""
        import os

        paths = [r.path for r in self.ranks if r.path]
        if not paths:
            return "the trace"
        if len(paths) == 1:
            return paths[0]
        try:
            return os.path.commonpath([os.path.dirname(p) or "." for p in paths])
        except ValueError:  # paths on different drives
            return paths[0]

    def rank_info(self, rank: int) -> RankInfo:
        for info in self.ranks:
            if info.rank == rank:
                return info
        raise KeyError(rank)

    def check_invariants(self) -> list[str]:
        """Problems that would make every later stage wrong; empty when healthy."""
        problems = []
        n = len(self)
        for col in ("rank", "pid", "tid", "ts", "dur", "name", "parent", "iteration", "launch"):
            if getattr(self, col).shape[0] != n:
                problems.append(f"column {col} has the wrong length")
        if n and (self.dur < 0).any():
            problems.append(f"{int((self.dur < 0).sum())} events with negative duration")
        if n and ((self.name < 0) | (self.name >= len(self.names))).any():
            problems.append("name index out of range")
        gpu = np.flatnonzero(self.launch >= 0)
        if gpu.size:
            early = self.ts[gpu] < self.ts[self.launch[gpu]]
            if early.any():
                problems.append(f"{int(early.sum())} GPU events start before their launch")
        return problems
