"""Every Kineto generation's names, in one place.

The raw JSON is decoded straight into these msgspec structs; fields a struct
does not name are skipped by the decoder, which is why decoding is several
times faster and leaner than building generic dicts. A new PyTorch release
that renames an argument is an edit of a `field(name=...)` here.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import field

from perfcast.events import Kind


class RawArgs(msgspec.Struct, gc=False):
    # Ids. 2021 traces spell "external id" in lower case.
    external_id: Any = field(default=None, name="External id")
    external_id_2021: Any = field(default=None, name="external id")
    correlation: Any = None
    seq: Any = field(default=None, name="Sequence number")
    fwd_tid: Any = field(default=None, name="Fwd thread id")
    # GPU side.
    device: Any = None
    stream: Any = None
    grid: Any = None
    block: Any = None
    nbytes: Any = field(default=None, name="bytes")
    # cuda_sync events (Kineto 2023+): which stream/event a stream waits on.
    wait_on_stream: Any = None
    wait_on_corr: Any = field(default=None, name="wait_on_cuda_event_record_corr_id")
    # [memory] instant events.
    mem_bytes: Any = field(default=None, name="Bytes")
    mem_total: Any = field(default=None, name="Total Allocated")
    mem_device_type: Any = field(default=None, name="Device Type")
    # Shapes (record_shapes=True).
    input_dims: Any = field(default=None, name="Input Dims")
    input_types: Any = field(default=None, name="Input type")
    # Collectives: on NCCL kernels (recent) or the record_param_comms op.
    coll_name: Any = field(default=None, name="Collective name")
    coll_in: Any = field(default=None, name="In msg nelems")
    coll_out: Any = field(default=None, name="Out msg nelems")
    coll_group: Any = field(default=None, name="Group size")
    coll_dtype: Any = field(default=None, name="dtype")
    coll_ranks: Any = field(default=None, name="Process Group Ranks")
    # "M" metadata events carry their value here.
    name: Any = None


class RawEvent(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    id: Any = None
    s: Any = None
    bp: Any = None
    args: RawArgs | None = None


class RawTrace(msgspec.Struct, gc=False):
    traceEvents: list[RawEvent] | None = None  # noqa: N815 (JSON key)
    deviceProperties: Any = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = None  # noqa: N815
    schemaVersion: Any = None  # noqa: N815


# The fast path: ids typed as int64 with -1 for "absent", so columns are read without a
# conversion per value. A file whose ids are not plain integers fails validation here and
# is decoded again with the lenient structs above.
I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class FastArgs(msgspec.Struct, frozen=True, gc=False):
    external_id: I64 = field(default=-1, name="External id")
    external_id_2021: I64 = field(default=-1, name="external id")
    correlation: I64 = -1
    seq: I64 = field(default=-1, name="Sequence number")
    fwd_tid: I64 = field(default=-1, name="Fwd thread id")
    device: I64 = -1
    stream: I64 = -1
    grid: Any = None
    block: Any = None
    nbytes: Any = field(default=None, name="bytes")
    wait_on_stream: Any = None
    wait_on_corr: Any = field(default=None, name="wait_on_cuda_event_record_corr_id")
    mem_bytes: Any = field(default=None, name="Bytes")
    mem_total: Any = field(default=None, name="Total Allocated")
    mem_device_type: Any = field(default=None, name="Device Type")
    input_dims: Any = field(default=None, name="Input Dims")
    input_types: Any = field(default=None, name="Input type")
    coll_name: Any = field(default=None, name="Collective name")
    coll_in: Any = field(default=None, name="In msg nelems")
    coll_out: Any = field(default=None, name="Out msg nelems")
    coll_group: Any = field(default=None, name="Group size")
    coll_dtype: Any = field(default=None, name="dtype")
    coll_ranks: Any = field(default=None, name="Process Group Ranks")
    name: Any = None


NO_ARGS = FastArgs()


class FastEvent(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    id: Any = None
    s: Any = None
    bp: Any = None
    args: FastArgs = NO_ARGS


# A trace may also be a bare array of events (chrome://tracing allows it).
RawEventList = list[RawEvent]


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
