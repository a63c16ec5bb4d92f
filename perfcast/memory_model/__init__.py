"""Memory model: peak memory per rank and step, from a trace or a model description."""

from perfcast.memory_model.facts import SavedTensor, TraceFacts, trace_facts
from perfcast.memory_model.model import (
    MemoryEstimate,
    MemoryInputs,
    apply_changes,
    estimate,
    inputs_from_facts,
    predict_peak_memory,
)

__all__ = [
    "MemoryEstimate",
    "MemoryInputs",
    "SavedTensor",
    "TraceFacts",
    "apply_changes",
    "estimate",
    "inputs_from_facts",
    "predict_peak_memory",
    "trace_facts",
]
