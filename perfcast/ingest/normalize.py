"""RawTrace (decoded structs) -> EventTable columns for one rank.

Column extraction is done with `np.fromiter` over the event list, one column
at a time: each pass is a tight generator, far cheaper than per-event dict
work, and only events of the kinds that carry a field are visited for it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np

from perfcast.events import (
    GLOO_RANGE_PREFIX,
    GPU_KINDS,
    MEM_DEVICE_CPU,
    NCCL_RANGE_PREFIX,
    NONE,
    STEP_PREFIX,
    Kind,
)
from perfcast.ingest.schema import (
    CATEGORY_KIND,
    FWDBWD_FLOW_CATS,
    LAUNCH_FLOW_CATS,
    FastEvent,
)

_STREAM_RE = re.compile(r"(?:stream|Stream)\s*(\d+)")
_DIGITS_RE = re.compile(r"-?\d+")
# String pids/tids that are not numbers ("Spans", "Traces") get ids below this.
_STRING_ID_BASE = -(1 << 40)
# Integers outside int64 (a corrupt or hand-edited file) are treated as missing.
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
# Times beyond ~146 years in ns are garbage; the bound also keeps ts + dur inside int64.
_TIME_LIMIT = 1 << 62
_BAD_TIME = _INT64_MIN  # marks an unreadable time (never a valid value under the limit)
# Shape strings ("Input Dims") longer than this are ignored: real ones are a few hundred
# bytes, and the what-if models parse them (perfcast.ingest.input_dims).
MAX_SHAPE_CHARS = 1 << 16


class Interner:
    """Maps strings to small ints; shared across ranks so tables concatenate.

    A name with control characters (a terminal escape sequence, a line break) is stored
    with them escaped: names end up on terminals and in reports, and never legitimately
    hold them.
    """

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.names: list[str] = []

    def __call__(self, s: str) -> int:
        idx = self.index.get(s)
        if idx is None:
            idx = len(self.names)
            self.index[s] = idx
            self.names.append(s if s.isprintable() else printable(s))
        return idx


def printable(s: str) -> str:
    """`s` with every non-printable character written as an escape (\\x1b, \\u202e)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


@dataclass
class RankColumns:
    """Columns of one rank before concatenation; see EventTable for meanings."""

    cols: dict[str, np.ndarray]
    flows: dict[str, Any]
    thread_names: dict[tuple[int, int], str]
    n_dropped: int
    warnings: list[str] = field(default_factory=list)
    long_shapes: int = 0  # shape strings over MAX_SHAPE_CHARS, ignored
    first_dropped: str | None = None  # the first unreadable time, e.g. "'dur' is nan"
    negative_dur: int = 0  # durations below 0, read as 0
    first_negative: str | None = None  # the first of them, e.g. "event #12, 'aten::add'"
    untimed_gpu: int = 0  # kernels, copies and memsets without a duration (read as 0)
    # Ops and ranges without a duration (read as 0), step markers aside (the loader leaves
    # those out of the steps, with a note of their own).
    untimed_cpu: int = 0
    first_untimed: str | None = None
    window_end_ns: int | None = None  # Kineto's "Record Window End" marker, when written


def _to_int_id(value: Any, strings: dict[str, int]) -> int:
    if isinstance(value, (int, float)) and _INT64_MIN <= value < _INT64_MAX:
        return int(value)
    if isinstance(value, (int, float)):
        value = str(value)  # out of range (or nan): a named id like the strings below
    if isinstance(value, str):
        m = _STREAM_RE.search(value)
        if m:
            return int(m.group(1))
        if _DIGITS_RE.fullmatch(value.strip()) and _INT64_MIN <= int(value) < _INT64_MAX:
            return int(value)
        idx = strings.get(value)
        if idx is None:
            idx = _STRING_ID_BASE - len(strings)
            strings[value] = idx
        return idx
    return 0


def _to_opt_int(value: Any, lo: int = _INT64_MIN, hi: int = _INT64_MAX) -> int:
    if value is None or isinstance(value, bool):
        return NONE
    if not isinstance(value, int):
        try:
            value = int(value)
        except (TypeError, ValueError, OverflowError):
            return NONE
    return value if lo <= value <= hi else NONE


def _memory_device(device_type: Any, device_id: Any) -> int:
    """A [memory] event's allocator: MEM_DEVICE_CPU for c10's DeviceType 0 (CPU), the GPU's
    index for any other type with an index (CUDA, and HIP, which ROCm builds report as
    CUDA), else NONE (traces before the field, or a type without an index)."""
    kind = _to_opt_int(device_type)
    if kind == 0:
        return MEM_DEVICE_CPU
    index = _to_opt_int(device_id, 0, (1 << 15) - 1)
    return index if kind != NONE else NONE


def _to_opt_int32(value: Any) -> int:
    return _to_opt_int(value, -(1 << 31), (1 << 31) - 1)


# A plain decimal literal of microseconds ("1689360788493180.123").
_DECIMAL_US = re.compile(r"(-?)(\d{1,19})(?:\.(\d*))?")


def _time_ns(value: Any) -> int:
    """Microseconds -> integer nanoseconds, exact for integers; _BAD_TIME if unreadable.

    Integer µs (2021-2023 traces: epoch-based, ~1.7e15) must not go through float64:
    at 1.7e18 ns a double's spacing is 256 ns.
    """
    if type(value) is int:
        ns = value * 1000
        return ns if -_TIME_LIMIT < ns < _TIME_LIMIT else _BAD_TIME
    if type(value) is str:
        # The literal of a timestamp float64 would round (the precise decoder's): exact.
        m = _DECIMAL_US.fullmatch(value)
        if m:
            sign, whole, frac = m.group(1), int(m.group(2)), m.group(3) or ""
            ns = whole * 1000 + int((frac + "000")[:3]) + (len(frac) > 3 and frac[3] >= "5")
            ns = -ns if sign else ns
            return ns if -_TIME_LIMIT < ns < _TIME_LIMIT else _BAD_TIME
    if type(value) is not float:
        if value is None or isinstance(value, bool):
            return _BAD_TIME
        try:
            value = float(value)
        except (TypeError, ValueError):
            return _BAD_TIME
    if not -_TIME_LIMIT < value * 1000.0 < _TIME_LIMIT:  # also nan
        return _BAD_TIME
    # Whole and fractional µs apart: `value * 1000.0` rounds once more (±1 ns at 4e12 µs);
    # this is exact for ns-resolution floats below 2**43 µs (boot-relative clocks).
    whole = int(value)
    return whole * 1000 + round((value - whole) * 1000.0)


def _times_ns(values: list[Any]) -> np.ndarray:
    """_time_ns over a column, vectorized when every value is a plain number.

    Integers and floats below 2**53 µs are exact in float64, so the split into whole
    and fractional µs gives the same nanoseconds as the per-value path.
    """
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    kinds = set(map(type, values))
    if kinds <= {int, float}:
        try:
            arr = np.array(values, dtype=np.float64)
        except OverflowError:  # an integer beyond float64: the per-value path says "bad"
            return np.fromiter(map(_time_ns, values), dtype=np.int64, count=n)
        if (
            np.isfinite(arr).all()
            and (np.abs(arr) < 2.0**53).all()
            and (np.abs(arr) * 1000.0 < _TIME_LIMIT).all()
        ):
            whole = np.trunc(arr)
            return whole.astype(np.int64) * 1000 + np.rint((arr - whole) * 1000.0).astype(np.int64)
    if kinds == {str}:
        exact = _decimal_times_ns(values)
        if exact is not None:
            return exact
    return np.fromiter(map(_time_ns, values), dtype=np.int64, count=n)


def _decimal_times_ns(values: list[str]) -> np.ndarray | None:
    """The precise decoder's timestamp literals ("1689360788493180.123") as nanoseconds,
    vectorized; None unless every one is a positive literal with at most 3 decimals."""
    text = np.array(values)
    whole, _, frac = np.char.partition(text, ".").T
    digits = np.char.str_len(frac)
    if (
        (digits > 3).any()
        or not np.char.isdigit(whole).all()
        or not (np.char.isdigit(frac) | (digits == 0)).all()
        or (np.char.str_len(whole) > 15).any()
    ):
        return None
    ns = whole.astype(np.int64) * 1000 + np.char.ljust(frac, 3, "0").astype(np.int64)
    return ns if (ns < _TIME_LIMIT).all() else None


def _triple(value: Any) -> tuple[int, int, int]:
    if isinstance(value, list) and len(value) == 3:
        t = (_to_opt_int32(value[0]), _to_opt_int32(value[1]), _to_opt_int32(value[2]))
        if NONE not in t:
            return t
    return (0, 0, 0)


# Kineto's instant event at the end of the recorded window: no row, but its time bounds the
# steps (`RankColumns.window_end_ns`).
WINDOW_END_MARKER = "Record Window End"
WINDOW_END = -2


def classify(ev: Any, kind_cache: dict[tuple[Any, Any, Any], int]) -> int:
    """Kind of an event, or -1 for events we do not keep as rows (WINDOW_END for the
    window's end marker)."""
    ph = ev.ph
    cat = ev.cat
    key = (ph, cat, ev.name if ph in ("i", "I") else None)
    kind = kind_cache.get(key)
    if kind is None:
        kind = -1
        if ph == "X":
            kind = int(CATEGORY_KIND.get(str(cat).lower(), Kind.OTHER)) if cat else int(Kind.OTHER)
            # The profiler's own span ("Trace" category) is not program activity.
            if str(cat) == "Trace":
                kind = -1
        elif ph in ("i", "I") and ev.name == "[memory]":
            kind = int(Kind.MEMORY)
        elif ph in ("i", "I") and ev.name == WINDOW_END_MARKER:
            kind = WINDOW_END
        kind_cache[key] = kind
    return kind


# Decoded events are RawEvent or FastEvent structs (same attribute names).
Events = list[Any]


# Where an event is in the file: (slice number, index in the slice) -> its index in the
# trace's event list, for notes that name the first of a kind ("event #12").
EventIndex = Callable[[int, int], int]


def extract_rank(
    chunks: Iterable[Events], names: Interner, where: EventIndex | None = None
) -> RankColumns:
    """Columns of one rank from its events, given as one or more lists (decoded slices).

    Each slice is turned into columns and dropped before the next is decoded, so the
    decoded objects of a big trace never all exist at once. Besides the named columns,
    `cols["no_dur"]` marks the rows written without a duration (read as 0 long).
    """
    strings: dict[str, int] = {}
    kind_cache: dict[tuple[Any, Any, Any], int] = {}
    parts = [
        _extract_chunk(events, names, strings, kind_cache, _located(where, k))
        for k, events in enumerate(chunks)
    ]
    if not parts:
        parts = [_extract_chunk([], names, strings, kind_cache, None)]
    if len(parts) == 1:
        return parts[0]
    cols = {k: np.concatenate([p.cols[k] for p in parts]) for k in parts[0].cols}
    flows: dict[str, Any] = {k: [x for p in parts for x in p.flows[k]] for k in parts[0].flows}
    thread_names = {k: v for p in parts for k, v in p.thread_names.items()}
    long_shapes = sum(p.long_shapes for p in parts)
    return RankColumns(
        cols=cols,
        flows=flows,
        thread_names=thread_names,
        n_dropped=sum(p.n_dropped for p in parts),
        warnings=_shape_warning(long_shapes),
        long_shapes=long_shapes,
        first_dropped=next((p.first_dropped for p in parts if p.first_dropped), None),
        negative_dur=sum(p.negative_dur for p in parts),
        first_negative=next((p.first_negative for p in parts if p.first_negative), None),
        untimed_gpu=sum(p.untimed_gpu for p in parts),
        untimed_cpu=sum(p.untimed_cpu for p in parts),
        first_untimed=next((p.first_untimed for p in parts if p.first_untimed), None),
        window_end_ns=max(
            (p.window_end_ns for p in parts if p.window_end_ns is not None), default=None
        ),
    )


def _located(where: EventIndex | None, chunk: int) -> Callable[[int], int] | None:
    return None if where is None else lambda i: where(chunk, i)


def _shape_warning(n: int) -> list[str]:
    if not n:
        return []
    return [f"{n:,} 'Input Dims' values longer than {MAX_SHAPE_CHARS:,} characters were ignored"]


def _extract_chunk(
    events: Events,
    names: Interner,
    strings: dict[str, int],
    kind_cache: dict[tuple[Any, Any, Any], int],
    where: Callable[[int], int] | None,
) -> RankColumns:
    kinds_all = [classify(ev, kind_cache) for ev in events]
    window_end_ns = None
    if WINDOW_END in kind_cache.values():  # a few entries: no pass over the events without it
        marks = _times_ns(
            [ev.ts for ev, k in zip(events, kinds_all, strict=False) if k == WINDOW_END]
        )
        marks = marks[marks != _BAD_TIME]
        window_end_ns = int(marks.max()) if marks.size else None
    rows = [ev for ev, k in zip(events, kinds_all, strict=False) if k >= 0]
    kinds = np.fromiter((k for k in kinds_all if k >= 0), dtype=np.int8, count=len(rows))
    n = len(rows)

    def event_no(row: int) -> str:
        """Where row `row` is in the file, for a note: "event #12" (its index in the event
        list), or "" where unknown. Only for the first of a kind: a pass over the slice."""
        if where is None:
            return ""
        return f"event #{where(int(np.flatnonzero(np.array(kinds_all) >= 0)[row])):,}"

    ts = _times_ns([ev.ts for ev in rows])
    durs = [ev.dur for ev in rows]
    no_dur = np.zeros(n, dtype=bool)
    if None in durs:  # one C-level scan; the mask only where some duration is missing
        # An instant ([memory]) has no duration; an op, a range or GPU work should.
        no_dur = np.fromiter((d is None for d in durs), dtype=bool, count=n)
        no_dur &= kinds != Kind.MEMORY
        durs = [0 if d is None else d for d in durs]
    dur = _times_ns(durs)
    del durs
    # Rows whose time we cannot read are dropped and counted, the first named for the note.
    bad_ts = ts == _BAD_TIME
    bad = bad_ts | (dur == _BAD_TIME)
    n_dropped = int(bad.sum())
    first_dropped = None
    if n_dropped:
        i = int(np.argmax(bad))
        field_name = "ts" if bad_ts[i] else "dur"
        value = getattr(rows[i], field_name)
        shown = "missing (or null)" if value is None else f"{value!r:.40}"
        first_dropped = ", ".join(filter(None, (event_no(i), f"'{field_name}' is {shown}")))
    dur[bad] = 0
    ts[bad] = 0
    negative = dur < 0
    negative_dur = int(negative.sum())
    first_negative = None
    if negative_dur:
        i = int(np.argmax(negative))
        first_negative = ", ".join(filter(None, (event_no(i), f"'{_name_of(rows[i])}'")))
    dur = np.maximum(dur, 0)
    # Work without a duration reads as taking no time: said, not assumed silently. GPU work
    # is counted apart (its time is the step's GPU time); step markers are the loader's.
    no_dur &= ~bad
    gpu_rows = np.isin(kinds, GPU_KINDS)
    untimed_gpu = int((no_dur & gpu_rows).sum())

    name = np.fromiter(
        (names(nm if isinstance(nm := ev.name, str) else str(nm)) for ev in rows),
        dtype=np.int32,
        count=n,
    )
    untimed_cpu = 0
    first_untimed = None
    untimed = np.flatnonzero(no_dur & ~gpu_rows)
    if untimed.size:
        called = np.unique(name[untimed])
        steps = [k for k in called.tolist() if names.names[k].startswith(STEP_PREFIX)]
        untimed = untimed[~np.isin(name[untimed], steps)]
        untimed_cpu = int(untimed.size)
        if untimed_cpu:
            i = int(untimed[0])
            first_untimed = ", ".join(filter(None, (event_no(i), f"'{_name_of(rows[i])}'")))

    pid = np.fromiter(
        (p if type(p := ev.pid) is int else _to_int_id(p, strings) for ev in rows),
        dtype=np.int64,
        count=n,
    )
    tid = np.fromiter(
        (t if type(t := ev.tid) is int else _to_int_id(t, strings) for ev in rows),
        dtype=np.int64,
        count=n,
    )

    args = [ev.args for ev in rows]
    fast = bool(rows) and isinstance(rows[0], FastEvent)  # the reader never mixes kinds

    def arg_col(attr: str) -> np.ndarray:
        if fast:  # typed ints, -1 when absent: no conversion per value
            return np.fromiter(map(attrgetter(attr), args), dtype=np.int64, count=n)
        return np.fromiter(
            (_to_opt_int(getattr(a, attr)) if a is not None else NONE for a in args),
            dtype=np.int64,
            count=n,
        )

    correlation = arg_col("correlation")
    external_id = arg_col("external_id")
    ext_old = arg_col("external_id_2021")
    external_id = np.where(external_id == NONE, ext_old, external_id)
    seq = arg_col("seq")
    fwd_tid = arg_col("fwd_tid")

    is_gpu = np.isin(
        kinds, [Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, Kind.GPU_ANNOTATION, Kind.CUDA_SYNC]
    )
    # GPU rows: pid is the device, tid the stream; prefer the explicit args.
    gpu_idx = np.flatnonzero(is_gpu)
    if gpu_idx.size:
        gpu_args = [args[i] for i in gpu_idx.tolist()]
        dev = np.fromiter(
            (_to_opt_int(a.device) if a is not None else NONE for a in gpu_args),
            dtype=np.int64,
            count=gpu_idx.size,
        )
        stream = np.fromiter(
            (_to_opt_int(a.stream) if a is not None else NONE for a in gpu_args),
            dtype=np.int64,
            count=gpu_idx.size,
        )
        pid[gpu_idx] = np.where(dev >= 0, dev, pid[gpu_idx])
        tid[gpu_idx] = np.where(stream >= 0, stream, tid[gpu_idx])

    grid = np.zeros((n, 3), dtype=np.int32)
    block = np.zeros((n, 3), dtype=np.int32)
    kern_idx = np.flatnonzero(kinds == Kind.KERNEL)
    for i in kern_idx.tolist():
        a = args[i]
        if a is not None:
            grid[i] = _triple(a.grid)
            block[i] = _triple(a.block)

    nbytes = np.full(n, NONE, dtype=np.int64)
    mem_total = np.full(n, NONE, dtype=np.int64)
    mem_device = np.full(n, NONE, dtype=np.int16)
    for i in np.flatnonzero((kinds == Kind.MEMCPY) | (kinds == Kind.MEMSET)).tolist():
        a = args[i]
        if a is not None:
            nbytes[i] = _to_opt_int(a.nbytes)
    # ROCm 6.2 writes a copy's size on its runtime call ("size": "2560"), not on the copy:
    # kept there, and handed to the copy it launches (loader).
    for i in np.flatnonzero(kinds == Kind.RUNTIME).tolist():
        a = args[i]
        if a is not None and a.size is not None and "Mem" in str(rows[i].name):
            nbytes[i] = _to_opt_int(a.size)
    for i in np.flatnonzero(kinds == Kind.MEMORY).tolist():
        a = args[i]
        if a is not None:
            nbytes[i] = _to_opt_int(a.mem_bytes)
            mem_total[i] = _to_opt_int(a.mem_total)
            mem_device[i] = _memory_device(a.mem_device_type, a.mem_device_id)

    wait_stream = np.full(n, NONE, dtype=np.int64)
    wait_corr = np.full(n, NONE, dtype=np.int64)
    for i in np.flatnonzero(kinds == Kind.CUDA_SYNC).tolist():
        a = args[i]
        if a is not None:
            wait_stream[i] = _to_opt_int(a.wait_on_stream)
            wait_corr[i] = _to_opt_int(a.wait_on_corr)

    shapes = np.full(n, NONE, dtype=np.int32)
    in_types = np.full(n, NONE, dtype=np.int32)
    concrete = np.full(n, NONE, dtype=np.int32)
    long_shapes = 0
    # Ops, and the collective ranges gloo and NCCL record as user annotations with their
    # tensors' shapes (gloo:*, and nccl:* where DDP's c10d op records only a TensorList);
    # other annotations keep none, so nothing else reads shapes it did not before.
    shaped = np.flatnonzero(kinds == Kind.CPU_OP)
    annotated = np.flatnonzero(kinds == Kind.USER_ANNOTATION)
    ranges = [
        i
        for i in annotated.tolist()
        if str(rows[i].name).startswith((GLOO_RANGE_PREFIX, NCCL_RANGE_PREFIX))
    ]
    if ranges:
        shaped = np.union1d(shaped, ranges)
    for i in shaped.tolist():
        a = args[i]
        if a is not None and a.input_dims is not None:
            text = _compact(a.input_dims)
            if text is None:
                long_shapes += 1
            else:
                shapes[i] = names(text)
        if a is not None and a.input_types is not None:
            types = _compact(a.input_types)
            if types is not None:
                in_types[i] = names(types)
        # Stride, padding and dilation (a convolution's output size, so its FLOPs) are in
        # its "Concrete Inputs" only; other ops' are not read, so they are not kept.
        if a is not None and a.concrete is not None and "conv" in str(rows[i].name):
            text = _compact(a.concrete)
            if text is not None:
                concrete[i] = names(text)

    # PyTorch 1.8-1.10 wrote with_stack's Python frames as each op's "Call stack" argument
    # (innermost first, ';'-separated), where later versions write python_function events.
    stack = np.full(n, NONE, dtype=np.int32)
    for i in np.flatnonzero((kinds == Kind.CPU_OP) | (kinds == Kind.USER_ANNOTATION)).tolist():
        a = args[i]
        if a is not None and isinstance(text := a.call_stack, str) and text:
            stack[i] = names(text)

    coll_name = np.full(n, NONE, dtype=np.int32)
    coll_in = np.full(n, NONE, dtype=np.int64)
    coll_out = np.full(n, NONE, dtype=np.int64)
    coll_group = np.full(n, NONE, dtype=np.int32)
    coll_dtype = np.full(n, NONE, dtype=np.int32)
    coll_ranks = np.full(n, NONE, dtype=np.int32)
    for i, a in enumerate(args):
        if a is not None and a.coll_name is not None:
            coll_name[i] = names(str(a.coll_name))
            coll_in[i] = _to_opt_int(a.coll_in)
            coll_out[i] = _to_opt_int(a.coll_out)
            coll_group[i] = _to_opt_int32(a.coll_group)
            if a.coll_dtype is not None:
                coll_dtype[i] = names(str(a.coll_dtype))
            if a.coll_ranks is not None and (ranks := _compact(a.coll_ranks)) is not None:
                coll_ranks[i] = names(ranks)

    cols: dict[str, np.ndarray] = {
        "kind": kinds,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "name": name,
        "correlation": correlation,
        "external_id": external_id,
        "seq": seq,
        "fwd_tid": fwd_tid,
        "grid": grid,
        "block": block,
        "nbytes": nbytes,
        "mem_total": mem_total,
        "mem_device": mem_device,
        "shapes": shapes,
        "in_types": in_types,
        "stack": stack,
        "concrete": concrete,
        "wait_stream": wait_stream,
        "wait_corr": wait_corr,
        "coll_name": coll_name,
        "coll_in": coll_in,
        "coll_out": coll_out,
        "coll_group": coll_group,
        "coll_dtype": coll_dtype,
        "coll_ranks": coll_ranks,
    }
    cols["no_dur"] = no_dur
    if n_dropped:
        keep = ~bad
        cols = {k: v[keep] for k, v in cols.items()}

    flows = _extract_flows(events, strings)
    thread_names = _thread_names(events, strings)
    return RankColumns(
        cols=cols,
        flows=flows,
        thread_names=thread_names,
        n_dropped=n_dropped,
        warnings=_shape_warning(long_shapes),
        long_shapes=long_shapes,
        first_dropped=first_dropped,
        negative_dur=negative_dur,
        first_negative=first_negative,
        untimed_gpu=untimed_gpu,
        untimed_cpu=untimed_cpu,
        first_untimed=first_untimed,
        window_end_ns=window_end_ns,
    )


def _name_of(ev: Any) -> str:
    """An event's name for a note (short: a name can be megabytes)."""
    name = ev.name if isinstance(ev.name, str) else str(ev.name)
    return printable(name[:80] + ("..." if len(name) > 80 else ""))


def _compact(value: Any) -> str | None:
    """A list arg as text (Python's repr: JSON syntax for lists of numbers); None if it is
    longer than MAX_SHAPE_CHARS."""
    if not isinstance(value, str):
        try:
            value = repr(value)
        except (RecursionError, MemoryError):  # nesting is capped by the reader; to be sure
            return None
    return value if len(value) <= MAX_SHAPE_CHARS else None


def _extract_flows(events: Events, strings: dict[str, int]) -> dict[str, Any]:
    """Flow endpoints: (pid, tid, ts_ns, id) for launch and forward/backward flows."""
    launch_s: list[tuple[int, int, int, int]] = []
    launch_f: list[tuple[int, int, int, int]] = []
    fb_s: list[tuple[int, int, int, int]] = []
    fb_f: list[tuple[int, int, int, int]] = []
    for ev in events:
        ph = ev.ph
        if ph not in ("s", "f", "t"):
            continue
        cat = ev.cat
        fid = _to_opt_int(ev.id)
        if fid == NONE:
            continue
        ts = _time_ns(ev.ts)
        if ts == _BAD_TIME:
            continue
        rec = (_to_int_id(ev.pid, strings), _to_int_id(ev.tid, strings), ts, fid)
        if cat in LAUNCH_FLOW_CATS:
            (launch_s if ph == "s" else launch_f).append(rec)
        elif cat in FWDBWD_FLOW_CATS:
            (fb_s if ph == "s" else fb_f).append(rec)
    return {"launch_s": launch_s, "launch_f": launch_f, "fwdbwd_s": fb_s, "fwdbwd_f": fb_f}


def _thread_names(events: Events, strings: dict[str, int]) -> dict[tuple[int, int], str]:
    out: dict[tuple[int, int], str] = {}
    for ev in events:
        if ev.ph == "M" and ev.name == "thread_name" and ev.args is not None:
            value = ev.args.name
            if isinstance(value, str):
                name = value if value.isprintable() else printable(value)
                out[(_to_int_id(ev.pid, strings), _to_int_id(ev.tid, strings))] = name
    return out
