"""Collectives: per operation, message size, algorithm and bus bandwidth against the link.

Sizes follow the nccl-tests convention (doc/PERFORMANCE.md): the buffer of an all-reduce, the
output of an all-gather, the input of a reduce-scatter. algbw = bytes / kernel time; bus
bandwidth = algbw × factor (all-reduce 2(n−1)/n; all-gather, reduce-scatter, all-to-all
(n−1)/n; others 1), comparable to the link's peak (`hardware.interconnects`, the device's
usual intra-node link unless `link=` names one).

Sizes and group sizes come from the kernel's collective arguments (recent traces), else from
the CPU op that launched it (`record_param_comms`); the algorithm and protocol from the NCCL
kernel name (`..._RING_LL_...`). gloo's collectives (a CPU backend: `gloo:<op>` ranges on
its worker threads) are read from their own shapes, with no link to compare with unless
named. A collective's kernel time includes waiting for the last rank to arrive, so a bus
bandwidth far below the peak may be a straggler, not the link.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perfcast.analysis.common import (
    NS_PER_MS,
    NS_PER_US,
    device_spec,
    group_stats,
    nearest_ancestor,
)
from perfcast.analysis.notes import input_notes
from perfcast.errors import PerfcastError
from perfcast.events import NONE, EventTable
from perfcast.frames import Tables, plain
from perfcast.graph.phases import (
    collective_kernel_mask,
    host_collective_kind,
    host_collective_mask,
)
from perfcast.hardware.collectives import bus_bandwidth_factor, collective_from_kernel_name
from perfcast.hardware.interconnects import default_intra_node_link, lookup_link

_ALGO = re.compile(
    r"(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)", re.IGNORECASE
)
_PROTO = re.compile(r"_(LL128|LL|SIMPLE)(?:_|\(|$)", re.IGNORECASE)
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "f32": 4, "int": 4, "int32": 4, "i32": 4, "u32": 4, "uint32": 4,
    "half": 2, "float16": 2, "f16": 2, "bfloat16": 2, "bf16": 2, "short": 2, "int16": 2,
    "double": 8, "float64": 8, "f64": 8, "long": 8, "int64": 8, "i64": 8, "u64": 8,
    "uint64": 8, "byte": 1, "char": 1, "int8": 1, "uint8": 1, "i8": 1, "u8": 1, "bool": 1,
    "int8_t": 1, "uint8_t": 1, "float8": 1, "fp8": 1, "f8": 1,
}  # fmt: skip
_NAME_DTYPE = re.compile(
    r"_(f32|f16|bf16|f64|i32|i64|u8|i8|u32|u64|float|half|double|int8_t|uint8_t|int32_t|"
    r"int64_t|uint32_t|uint64_t|bfloat16|fp8_e4m3|fp8_e5m2)(?:\(|_|$)",
    re.IGNORECASE,
)


def dtype_bytes(name: str | None) -> int | None:
    """Bytes per element of a collective's dtype as traces spell it ("Float", "c10::Half",
    "bf16", "int8_t"); None if unknown."""
    if not name:
        return None
    key = name.lower().replace("c10::", "").replace("torch.", "").strip()
    key = key.replace("_t", "_t") if key.endswith("_t") else key
    if key in _DTYPE_BYTES:
        return _DTYPE_BYTES[key]
    if key.startswith("fp8") or key.startswith("float8"):
        return 1
    return _DTYPE_BYTES.get(key.rstrip("_t"))


@dataclass
class CollectiveGroup:
    """Calls of one collective op, size and algorithm on a rank: time (ms, µs per call),
    algorithm and bus bandwidth (GB/s) and % of the link's peak."""

    rank: int
    op: str  # allreduce, allgather, reducescatter, broadcast, alltoall, sendrecv, ...
    algorithm: str  # RING / TREE / ... from the kernel name ("" if it does not say)
    protocol: str  # LL / LL128 / SIMPLE
    dtype: str
    size_bytes: int | None  # per call, nccl-tests convention (None: the trace does not say)
    group_size: int
    count: int
    total_ms: float
    mean_us: float
    min_us: float
    algbw_gbs: float | None  # from the mean time
    busbw_gbs: float | None
    best_busbw_gbs: float | None  # from the fastest call
    link: str
    link_peak_gbs: float | None
    pct_of_peak: float | None  # best bus bandwidth / link peak


@dataclass
class CollectiveSummary:
    """One collective op on a rank: calls, total ms and MB, bus bandwidth in GB/s."""

    rank: int
    op: str
    count: int
    total_ms: float
    total_mb: float | None  # over the calls of known size (None: no call says its size)
    busbw_gbs: float | None  # summed bytes × factor / summed time


@dataclass(repr=False)
class Collectives(Tables):
    """Result of `collectives`; tables: by_op (per op, size, algorithm), summary (per op)."""

    by_op: list[CollectiveGroup]
    summary: list[CollectiveSummary]
    notes: list[str] = field(default_factory=list)

    ROW_TYPES = {"by_op": CollectiveGroup, "summary": CollectiveSummary}  # noqa: RUF012


def _args_source(table: EventTable, rows: np.ndarray) -> np.ndarray:
    """Per collective kernel, the row carrying its collective arguments: itself, else the
    nearest enclosing CPU event of its launch call that has them; NONE if none."""
    src = np.where(table.coll_name[rows] >= 0, rows, NONE).astype(np.int64)
    launch = table.launch[rows].astype(np.int64)
    cur = np.where((src < 0) & (launch >= 0), table.parent[np.maximum(launch, 0)], NONE)
    for _ in range(64):
        live = cur >= 0
        if not live.any():
            break
        hit = live & (table.coll_name[np.maximum(cur, 0)] >= 0)
        src[hit] = cur[hit]
        cur = np.where(live & ~hit, table.parent[np.maximum(cur, 0)], NONE)
    return src


# C++ type names PyTorch writes in "Input type" that the collective dtype table lacks.
_CPP_TYPES = {
    "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8",
    "unsigned char": "uint8", "c10::Half": "half", "c10::BFloat16": "bfloat16",
}  # fmt: skip


def _first_input_dtype(table: EventTable, row: int) -> str | None:
    """The dtype of an event's first input as its "Input type" names it (record_shapes)."""
    from perfcast.ingest.input_dims import parse_input_types

    t_idx = int(table.in_types[row])
    types = parse_input_types(table.names[t_idx]) if t_idx >= 0 else None
    first = types[0] if types else None
    return _CPP_TYPES.get(first, first) if first else None


def _launch_parents(table: EventTable, rows: np.ndarray) -> np.ndarray:
    """Per GPU row: the event enclosing its launching call (NONE without a launch)."""
    launch = table.launch[rows].astype(np.int64)
    return np.where(launch >= 0, table.parent[np.maximum(launch, 0)], NONE)


def _c10d_ops(names: list[str]) -> np.ndarray:
    """Per name: a `record_param_comms` or `c10d::` op (what a collective is called from)."""
    return np.array([n == "record_param_comms" or n.startswith("c10d::") for n in names], bool)


def _nearest_with_tensors(
    table: EventTable, start: np.ndarray, ops: np.ndarray, measure: Callable[[list[Any]], int]
) -> tuple[np.ndarray, dict[int, int]]:
    """From each `start` row up: the nearest event whose name `ops` marks and whose shapes
    hold a tensor (NONE where none), and per shapes id, `measure` of its tensors' shapes."""
    from perfcast.ingest.input_dims import parse_input_dims, tensor_shapes

    names = table.names
    measured: dict[int, int] = {}
    for i in np.unique(table.shapes[ops[table.name] & (table.shapes >= 0)]).tolist():
        tensors = [s for s in tensor_shapes(parse_input_dims(names[i])) if s]
        if tensors:
            measured[i] = measure(tensors)
    has = np.zeros(len(names), dtype=bool)
    has[list(measured)] = True
    sized = ops[table.name] & (table.shapes >= 0) & has[np.maximum(table.shapes, 0)]
    return nearest_ancestor(table, start, sized), measured


def enclosing_op_args(
    table: EventTable, rows: np.ndarray
) -> tuple[list[str | None], list[str | None], list[int]]:
    """For collective kernels whose trace has no collective arguments (older PyTorch): the
    op from the enclosing `nccl:<op>` range, and the size and dtype from the shapes of the
    nearest enclosing `record_param_comms` / `c10d::` op or `nccl:<op>` range that records a
    tensor (record_shapes). Per row: (op, dtype,
    elements), None / 0 where the trace does not say. See `enclosing_extent` for the
    other side of an all-gather or reduce-scatter."""
    names = table.names
    start = _launch_parents(table, rows)
    # The nearest enclosing nccl:<op> range that names a collective.
    op_of_name = [collective_from_kernel_name(n) if n.startswith("nccl:") else None for n in names]
    named = np.array([o is not None for o in op_of_name], dtype=bool)
    op_row = nearest_ancestor(table, start, named[table.name])
    # The nearest enclosing record_param_comms / c10d:: op or nccl:<op> range whose shapes
    # hold a tensor (DDP's c10d op records a TensorList without dims; the nccl: range inside
    # it records the bucket's flat tensor): its first tensor's elements.
    size_row, first_elems = _nearest_with_tensors(
        table, start, _c10d_ops(names) | named, lambda t: int(np.prod(t[0]))
    )

    ops = [op_of_name[int(table.name[r])] if r >= 0 else None for r in op_row.tolist()]
    dtypes: list[str | None] = []
    elems: list[int] = []
    for r in size_row.tolist():
        if r < 0:
            dtypes.append(None)
            elems.append(0)
            continue
        elems.append(first_elems[int(table.shapes[r])])
        dtypes.append(_first_input_dtype(table, r))
    return ops, dtypes, elems


def enclosing_extent(table: EventTable, rows: np.ndarray) -> np.ndarray:
    """Per collective kernel: the most elements of any one tensor of its enclosing `c10d::`
    or `record_param_comms` op (0 where none records shapes). `c10d::_allgather_base_`
    records (output, input): the all-gather's output, which the nccl: range inside it, holding
    only the input, does not show; likewise a reduce-scatter's input."""
    op, largest = _nearest_with_tensors(
        table,
        _launch_parents(table, rows),
        _c10d_ops(table.names),
        lambda t: max(int(np.prod(s)) for s in t),
    )
    return np.array(
        [largest[int(table.shapes[r])] if r >= 0 else 0 for r in op.tolist()], dtype=np.int64
    )


def collective_ops(table: EventTable, rows: np.ndarray) -> list[str | None]:
    """Per collective kernel, the collective its arguments name (or, in older traces, its
    enclosing `nccl:<op>` range), as this analysis reads it: NCCL runs an all-to-all as
    SendRecv kernels. None where neither says."""
    src = _args_source(table, rows)
    out = [
        collective_from_kernel_name(table.names[int(table.coll_name[s])]) if s >= 0 else None
        for s in src.tolist()
    ]
    missing = np.array([j for j, o in enumerate(out) if o is None], dtype=np.int64)
    if missing.size:
        ops, _, _ = enclosing_op_args(table, rows[missing])
        for j, o in zip(missing.tolist(), ops, strict=True):
            out[j] = o
    return out


def collectives(table: EventTable, link: str | None = None) -> Collectives:
    """Per collective op, size and algorithm: time, algbw, bus bandwidth and % of link peak.

    >>> import perfcast
    >>> r = collectives(perfcast.load("perfcast/examples/ddp_a100_rank0.json.gz"))
    >>> [row.op for row in r.summary]                                 # doctest: +SKIP
    ['allreduce']
    """
    link_spec = lookup_link(link) if link else None
    if link and link_spec is None:  # before the trace is read: a typo is a typo anywhere
        from perfcast.errors import OptionError

        raise OptionError(f"unknown link {link!r}", hint="e.g. nvlink4, pcie4, ib-ndr")
    out = Collectives([], [], notes=input_notes(table))
    host = host_collective_mask(table)
    rows = np.flatnonzero(collective_kernel_mask(table) | host)
    if rows.size == 0:
        out.notes.append(
            "no collectives in the trace (NCCL/RCCL kernels or gloo ranges): nothing to measure"
        )
        return out
    keys, unknown_group = _row_keys(table, rows, host)
    uniq = sorted(set(keys))
    index = {k: i for i, k in enumerate(uniq)}
    key_idx = np.array([index[k] for k in keys], dtype=np.int64)
    g = group_stats(key_idx, table.dur[rows])
    devices = {info.rank: device_spec(info) for info in table.ranks}
    for i, k in enumerate(g.keys.tolist()):
        rank, op, algo, proto, dt, size, gs, over_host = uniq[k]
        spec = devices.get(rank)
        # gloo moves data over the host's network stack: no GPU link to compare with.
        lk = link_spec or (default_intra_node_link(spec) if spec and not over_host else None)
        factor = _factor(op, gs)
        mean_ns = g.mean[i]
        algbw = size / mean_ns if size and mean_ns > 0 else None  # bytes/ns = GB/s
        busbw = algbw * factor if algbw is not None and factor is not None else None
        best = (size / g.min[i]) * factor if size and g.min[i] > 0 and factor else None
        peak = lk.bw_gbs_per_direction if lk else None
        out.by_op.append(
            CollectiveGroup(
                rank=rank,
                op=op,
                algorithm=algo,
                protocol=proto,
                dtype=dt,
                size_bytes=size if size or op == "barrier" else None,
                group_size=gs,
                count=int(g.count[i]),
                total_ms=g.sum[i] / NS_PER_MS,
                mean_us=mean_ns / NS_PER_US,
                min_us=g.min[i] / NS_PER_US,
                algbw_gbs=algbw,
                busbw_gbs=busbw,
                best_busbw_gbs=best,
                link=lk.name if lk else "",
                link_peak_gbs=peak,
                pct_of_peak=100.0 * best / peak if best is not None and peak else None,
            )
        )
    out.by_op.sort(key=lambda r: (r.rank, -r.total_ms))
    # Per (rank, op): bytes-weighted bus bandwidth over the calls of known size.
    agg: dict[tuple[int, str], list[float]] = {}
    for row in out.by_op:
        acc = agg.setdefault((row.rank, row.op), [0, 0.0, 0.0, 0.0, 0.0, 0])
        acc[0] += row.count
        acc[1] += row.total_ms
        if row.size_bytes is not None:
            acc[5] += 1
        if row.size_bytes and row.busbw_gbs is not None:
            f = _factor(row.op, row.group_size) or 0.0
            acc[2] += row.size_bytes * row.count
            acc[3] += row.total_ms
            acc[4] += row.size_bytes * row.count * f
    for (rank, op), (cnt, tot, nbytes, timed_ms, fbytes, sized) in sorted(agg.items()):
        out.summary.append(
            CollectiveSummary(
                rank=rank,
                op=op,
                count=int(cnt),
                total_ms=tot,
                total_mb=nbytes / 1e6 if sized else None,
                busbw_gbs=(fbytes / (timed_ms * NS_PER_MS)) if timed_ms > 0 else None,
            )
        )
    if any(r.size_bytes is None for r in out.by_op):
        out.notes.append(
            "some collectives carry no size (no collective arguments in the trace): their "
            "bandwidth is unknown"
        )
    if unknown_group:
        out.notes.append(
            "the trace lists gloo process groups smaller than the world, and a gloo range "
            "does not say which group ran it: those ranges' group size and bus bandwidth are "
            "unknown"
        )
    return plain(out)


def _row_keys(table: EventTable, rows: np.ndarray, host: np.ndarray) -> tuple[list[tuple], bool]:
    """Per collective row: (rank, op, algorithm, protocol, dtype, size in bytes, group size,
    over the host), and whether a gloo range's group was unknown."""
    src = _args_source(table, rows)
    names = table.names
    # Per distinct kernel name: op, algorithm, protocol, dtype from the name.
    by_name = {}
    for i in np.unique(table.name[rows]).tolist():
        nm = names[i]
        host_kind = host_collective_kind(nm)
        if host_kind is not None:  # gloo: no algorithm, protocol or dtype in the name
            by_name[i] = (host_kind, "", "", "")
            continue
        a = _ALGO.search(nm)
        p = _PROTO.search(nm)
        d = _NAME_DTYPE.search(nm)
        by_name[i] = (
            collective_from_kernel_name(nm) or "collective",
            a.group(1).upper() if a else "",
            p.group(1).upper() if p else "",
            d.group(1) if d else "",
        )
    has = src >= 0
    s = np.maximum(src, 0)
    coll_op = [
        (collective_from_kernel_name(names[c]) if c >= 0 else None)
        for c in np.where(has, table.coll_name[s], NONE).tolist()
    ]
    dtype_idx = np.where(has, table.coll_dtype[s], NONE)
    n_in = np.where(has, table.coll_in[s], NONE)
    n_out = np.where(has, table.coll_out[s], NONE)
    group = np.where(has, table.coll_group[s], NONE)
    # Without collective arguments, the enclosing ranges may still say (record_shapes); a
    # gloo range carries its own tensors' shapes.
    on_host = host[rows]
    missing = np.flatnonzero(~has & ~on_host)
    fb_op, fb_dtype, fb_n = enclosing_op_args(table, rows[missing])
    fallback = {int(j): (o, d, k) for j, o, d, k in zip(missing, fb_op, fb_dtype, fb_n)}
    extent = dict(zip(missing.tolist(), enclosing_extent(table, rows[missing]).tolist()))
    own = np.flatnonzero(on_host)
    fallback.update(
        {int(j): (None, d, k) for j, d, k in zip(own.tolist(), *_own_shapes(table, rows[own]))}
    )

    keys: list[tuple] = []
    unknown_group = False
    for j, r in enumerate(rows.tolist()):
        op, algo, proto, name_dt = by_name[int(table.name[r])]
        op = coll_op[j] or op
        dt = names[int(dtype_idx[j])] if dtype_idx[j] >= 0 else name_dt
        if j in fallback:
            f_op, f_dtype, f_n = fallback[j]
            # The kernel name says SendRecv for an all-to-all: the range knows better.
            op = f_op or op
            dt = f_dtype or dt
            if f_n:
                n_in[j] = f_n
        rank = int(table.rank[r])
        gs = int(group[j]) if group[j] > 0 else (table.rank_info(rank).world_size or 0)
        big, small = extent.get(j, 0), int(n_in[j])
        if op in ("allgather", "reducescatter") and small > 0 and big > small:
            # The enclosing c10d op's larger tensor is the gathered output (the scattered
            # input); their ratio is the group, which the world size need not be.
            n_in[j], n_out[j] = (small, big) if op == "allgather" else (big, small)
            if group[j] <= 0 and big % small == 0:
                gs = big // small
        if on_host[j] and table.rank_info(rank).gloo_subgroups:
            gs = 0  # a gloo range does not say which of the trace's groups ran it
            unknown_group = True
        if on_host[j] and op == "allgather":
            n_out[j] = n_in[j] * gs if gs > 0 else 0  # the range holds one rank's input
        size = _size_bytes(op, int(n_in[j]), int(n_out[j]), dtype_bytes(dt))
        keys.append((rank, op, algo, proto, dt, size, gs, bool(on_host[j])))
    return keys, unknown_group


def ops_and_sizes(table: EventTable, rows: np.ndarray) -> tuple[list[str], list[int]]:
    """Per collective row: its collective ("allreduce", ..., "collective" when nothing says)
    and its size in bytes (nccl-tests convention; 0 when the trace does not say)."""
    keys, _ = _row_keys(table, rows, host_collective_mask(table))
    return [k[1] for k in keys], [int(k[5] or 0) for k in keys]


def bus_bytes(table: EventTable, rows: np.ndarray) -> np.ndarray:
    """Per collective row, the bytes its bus bandwidth counts (size x the op's factor, the
    nccl-tests convention): its time at a link's peak is bus_bytes / peak. 0 where the trace
    does not say its size or group."""
    keys, _ = _row_keys(table, rows, host_collective_mask(table))
    out = np.zeros(len(keys), dtype=np.float64)
    for j, (_, op, _, _, _, size, gs, _) in enumerate(keys):
        factor = _factor(op, gs)
        if size and factor:
            out[j] = size * factor
    return out


def _own_shapes(table: EventTable, rows: np.ndarray) -> tuple[list[str | None], list[int]]:
    """Per gloo range: the dtype of its first tensor and the elements of all its tensors (a
    coalesced all-reduce or a list all-to-all holds several; record_shapes)."""
    from perfcast.graph.host_collectives import tensor_sizes

    dtypes: list[str | None] = []
    elems: list[int] = []
    for r in rows.tolist():
        elems.append(sum(tensor_sizes(table, r)))
        dtypes.append(_first_input_dtype(table, r))
    return dtypes, elems


def _factor(op: str, n: int) -> float | None:
    if n < 1:
        return None
    try:
        return bus_bandwidth_factor(op, n)
    except ValueError:
        return None


def allreduced_per_step(table: EventTable) -> dict[int, tuple[float, float]]:
    """Bytes and elements all-reduced per step, per rank, from sized collectives (under
    DDP: the gradients, one element per parameter whatever their dtype; fp32 where the
    trace does not say). `ddp` sizes its buckets by the bytes, `zero` and `plan` count
    parameters by the elements, when a trace has no shapes."""
    try:
        rows = collectives(table).by_op
    except PerfcastError:
        return {}
    steps: dict[int, int] = {}
    for it in table.iterations:
        steps[it.rank] = steps.get(it.rank, 0) + 1
    out: dict[int, tuple[float, float]] = {}
    for r in rows:
        if r.op == "allreduce" and r.size_bytes:
            per_step = r.size_bytes * r.count / steps.get(r.rank, 1)
            nbytes, elements = out.get(r.rank, (0.0, 0.0))
            out[r.rank] = (nbytes + per_step, elements + per_step / (dtype_bytes(r.dtype) or 4))
    return out


def _size_bytes(op: str, n_in: int, n_out: int, elem: int | None) -> int:
    """Bytes moved per call in the nccl-tests convention; 0 when unknown."""
    if elem is None:
        return 0
    if op == "allgather":
        n = n_out if n_out > 0 else n_in
    elif op == "reducescatter":
        n = n_in if n_in > 0 else n_out
    else:
        n = n_in if n_in > 0 else n_out
    return max(n, 0) * elem
