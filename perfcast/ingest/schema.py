"""Every Kineto generation's names, in one place.

The raw JSON is decoded straight into these msgspec structs; fields a struct
does not name are skipped by the decoder, which is why decoding is several
times faster and leaner than building generic dicts. A new PyTorch release
that renames an argument is an edit of one row of ARG_FIELDS.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec
from msgspec import field

from perfcast.events import Kind

# Every argument we read, once: (attribute, JSON key, an integer id?). 2021 traces spell
# "external id" in lower case; cuda_sync events (Kineto 2023+) name the stream and event
# record a stream waits on; [memory] instant events carry Bytes / Total Allocated; shapes
# come with record_shapes=True; collectives on NCCL kernels (recent) or on the
# record_param_comms op; "M" metadata events carry their value in "name".
ARG_FIELDS: tuple[tuple[str, str, bool], ...] = (
    ("external_id", "External id", True),
    ("external_id_2021", "external id", True),
    ("correlation", "correlation", True),
    ("seq", "Sequence number", True),
    ("fwd_tid", "Fwd thread id", True),
    ("device", "device", True),
    ("stream", "stream", True),
    ("grid", "grid", False),
    ("block", "block", False),
    ("nbytes", "bytes", False),
    ("size", "size", False),
    ("wait_on_stream", "wait_on_stream", False),
    ("wait_on_corr", "wait_on_cuda_event_record_corr_id", False),
    ("mem_bytes", "Bytes", False),
    ("mem_total", "Total Allocated", False),
    ("mem_device_type", "Device Type", False),
    ("mem_device_id", "Device Id", False),
    ("input_dims", "Input Dims", False),
    ("input_types", "Input type", False),
    ("call_stack", "Call stack", False),
    ("concrete", "Concrete Inputs", False),
    ("coll_name", "Collective name", False),
    ("coll_in", "In msg nelems", False),
    ("coll_out", "Out msg nelems", False),
    ("coll_group", "Group size", False),
    ("coll_dtype", "dtype", False),
    ("coll_ranks", "Process Group Ranks", False),
    ("name", "name", False),
)
EVENT_FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id")

# The fast path types ids as int64 with -1 for "absent", so columns are read without a
# conversion per value, and types every event field (checks.EVENT_TYPES says the same in
# words): msgspec validates a well-formed slice while decoding it, at almost no cost. A
# slice that fails is decoded again with the lenient structs, which take anything, and
# each event is checked by perfcast.ingest.checks.
I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_FAST_TYPES: dict[str, Any] = {
    "ph": str,
    "cat": str,
    "name": str,
    "pid": I64 | str,
    "tid": I64 | str,
    "ts": int | float,
    "dur": int | float,
    "id": I64 | str,
}


def _args_struct(name: str, typed: bool) -> Any:
    fields = [
        (attr, I64, field(default=-1, name=key))
        if typed and is_id
        else (attr, Any, field(default=None, name=key))
        for attr, key, is_id in ARG_FIELDS
    ]
    return msgspec.defstruct(name, fields, frozen=typed, gc=False, module=__name__)


def _event_struct(
    name: str, typed: bool, args_type: Any, args_default: Any, text_ts: bool = False
) -> Any:
    fields: list[tuple[str, Any, Any]] = [
        (f, Any if not typed or (text_ts and f == "ts") else _FAST_TYPES[f], None)
        for f in EVENT_FIELDS
    ]
    fields.append(("args", args_type, args_default))
    return msgspec.defstruct(name, fields, gc=False, module=__name__)


RawArgs = _args_struct("RawArgs", typed=False)
FastArgs = _args_struct("FastArgs", typed=True)
NO_ARGS = FastArgs()
RawEvent = _event_struct("RawEvent", False, RawArgs | None, None)
FastEvent = _event_struct("FastEvent", True, FastArgs, NO_ARGS)
# The fast struct with an untyped "ts": with a float hook, the decoder hands over the text of
# timestamps a float64 cannot hold to the nanosecond (epoch microseconds with 3 decimals,
# ~1.7e15: the nearest double is up to 0.125 µs away).
PreciseEvent = _event_struct("PreciseEvent", True, FastArgs, NO_ARGS, text_ts=True)

# Microseconds from which a double's spacing exceeds 1 ns (2**43 µs ~ 101 days: epoch clocks).
INEXACT_US = float(2**43)


def exact_float(text: str) -> float | str:
    """msgspec's float hook for PreciseEvent: the literal itself where float64 would round it
    (a large value with decimals), else the float."""
    value = float(text)
    # A plain decimal literal only: one with an exponent is no Kineto time (and its float
    # says what it is in a message).
    plain = "." in text and "e" not in text and "E" not in text
    return text if plain and abs(value) >= INEXACT_US else value


def rounded_by_float(ts: Any) -> bool:
    """Whether a decoded timestamp is a float64 that may have rounded its literal (see
    exact_float): a large one. Whole or not: at epoch µs (spacing 0.25 µs) any decimals
    within 0.125 of a whole µs read as whole, and Kineto writes whole µs as integers."""
    return type(ts) is float and abs(ts) >= INEXACT_US


class Stamp(msgspec.Struct, gc=False):
    """Only an event's timestamp: decoded with exact_float, it restores the exact literals of
    events the lenient structs read as rounded floats (every other field is skipped)."""

    ts: Any = None


class RawTrace(msgspec.Struct, gc=False):
    """The header: what surrounds the event list, decoded on its own. The events are read
    slice by slice (reader.TraceReader); a second "traceEvents" key is skipped, not decoded."""

    deviceProperties: Any = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = None  # noqa: N815
    schemaVersion: Any = None  # noqa: N815
    # Which machine wrote it: Kineto's host_name (recent PyTorch), a user's hostname
    # metadata, and what `perfcast profile` records (calibration.machine_identity()).
    host_name: Any = None
    hostname: Any = None
    otherData: Any = None  # noqa: N815 (perfcast's own exports say so here)
    perfcast_machine: Any = None
    # Steps timed without the profiler before the traced window (perfcast's capture), and
    # after it.
    perfcast_unprofiled_step_ms: Any = None
    perfcast_unprofiled_after_step_ms: Any = None
    # True when the script ended inside its last ProfilerStep (no step boundary closed it).
    perfcast_last_step_open: Any = None


# Category -> Kind for every generation. Lookup is lower-cased.
CATEGORY_KIND: dict[str, Kind] = {
    # current (2022+)
    "cpu_op": Kind.CPU_OP,
    "user_annotation": Kind.USER_ANNOTATION,
    "python_function": Kind.PYTHON_FUNCTION,
    "cuda_runtime": Kind.RUNTIME,
    "cuda_driver": Kind.DRIVER,
    "kernel": Kind.KERNEL,
    "gpu_memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET,
    "gpu_user_annotation": Kind.GPU_ANNOTATION,
    "cuda_sync": Kind.CUDA_SYNC,
    "cuda_profiler_range": Kind.GPU_COUNTERS,
    # 2021 (PyTorch 1.8-1.10)
    "operator": Kind.CPU_OP,
    "runtime": Kind.RUNTIME,
    "memcpy": Kind.MEMCPY,
    "memset": Kind.MEMSET,
    "python": Kind.PYTHON_FUNCTION,
    "user annotation": Kind.USER_ANNOTATION,
    "gpu user annotation": Kind.GPU_ANNOTATION,
    "cpu_instant_event": Kind.MEMORY,
    # ROCm spellings seen in roctracer-based traces
    "hip_runtime": Kind.RUNTIME,
    "hip_driver": Kind.DRIVER,
}

# Flow categories that tie a runtime call to the GPU work it launched.
LAUNCH_FLOW_CATS = frozenset({"ac2g", "async_cpu_to_gpu", "async"})
FWDBWD_FLOW_CATS = frozenset({"fwdbwd", "forward_backward"})

# Runtime calls that enqueue no GPU work: a kernel or copy "launched" by one of them got its
# correlation id from another tool or a corrupt file (the loader drops such links).
NON_LAUNCHING_CALLS = re.compile(
    r"^(cuda|hip|cu)(Device|Stream|Event|Ctx)?Synchronize$"
    r"|^(cuda|hip|cu)(StreamWaitEvent|EventRecord|EventQuery|StreamQuery)"
)
