"""Trace files of every Kineto generation -> `EventTable`."""

from perfcast.ingest.loader import load

__all__ = ["load"]
