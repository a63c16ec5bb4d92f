"""perfcast: predict how much faster a PyTorch training step gets, from its profiler trace."""

from perfcast.api import (
    advise,
    analyze,
    collectives,
    dependency_graph,
    diff,
    gpu_counters,
    idle_time,
    kernel_breakdown,
    launch_queue,
    launch_stats,
    memory,
    op_kernels,
    predict,
    replay,
    roofline,
    scopes,
    stragglers,
    summary,
    tree,
)
from perfcast.errors import (
    InternalError,
    NotApplicableError,
    OptionError,
    PerfcastError,
    TraceFormatError,
)
from perfcast.events import EventTable, Kind
from perfcast.ingest import load

__version__ = "0.1.0"

__all__ = [
    "EventTable",
    "InternalError",
    "Kind",
    "NotApplicableError",
    "OptionError",
    "PerfcastError",
    "TraceFormatError",
    "__version__",
    "advise",
    "analyze",
    "collectives",
    "dependency_graph",
    "diff",
    "gpu_counters",
    "idle_time",
    "kernel_breakdown",
    "launch_queue",
    "launch_stats",
    "load",
    "memory",
    "op_kernels",
    "predict",
    "replay",
    "roofline",
    "scopes",
    "stragglers",
    "summary",
    "tree",
]
