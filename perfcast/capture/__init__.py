"""Trace capture: profile a training loop into gzipped Kineto traces (one per rank)."""

from perfcast.capture.profiler import (
    Capture,
    MaxStepsReached,
    active_capture,
    capture,
    run_profile,
    step,
)

__all__ = ["Capture", "MaxStepsReached", "active_capture", "capture", "run_profile", "step"]
