"""The run without the profiler: the profiler's own cost estimated and taken out of host work.

`profiler_cost` takes a per-event cost out of a graph; `estimate` holds the defaults and the
records results report. Fitting the cost to measured steps needs replays: analysis.real_step.
"""

from perfcast.real.estimate import Correction, StepEstimate, default_cost, measured_real_steps
from perfcast.real.profiler_cost import (
    OFF,
    ProfilerCost,
    ProfilerSettings,
    Removed,
    remove_profiler_cost,
)

__all__ = [
    "OFF",
    "Correction",
    "ProfilerCost",
    "ProfilerSettings",
    "Removed",
    "StepEstimate",
    "default_cost",
    "measured_real_steps",
    "remove_profiler_cost",
]
