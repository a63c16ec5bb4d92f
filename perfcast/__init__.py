"""perfcast: predict how much faster a PyTorch training step gets, from its profiler trace."""

from perfcast.errors import PerfcastError
from perfcast.events import EventTable, Kind
from perfcast.ingest import load

__version__ = "0.1.0"

__all__ = ["EventTable", "Kind", "PerfcastError", "__version__", "load"]
