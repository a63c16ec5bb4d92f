"""Which torch.optim class a trace ran, and what fusing or capturing it in a CUDA graph takes.

PyTorch records one `Optimizer.step#<Class>.step` range per optimizer step, so the class is
read off the trace. What each class supports is read off torch.optim's constructors
(PyTorch 2.13: the `fused`, `foreach` and `capturable` arguments of each class).
"""

from __future__ import annotations

import re

from perfcast.events import EventTable

TORCH_OPTIMIZERS = frozenset(
    {
        "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "ASGD", "LBFGS",
        "NAdam", "RAdam", "RMSprop", "Rprop", "SGD", "SparseAdam",
    }
)  # fmt: skip
# Classes with a fused implementation (torch 2.4+; Adagrad's ran on the CPU only until a
# later release added its CUDA kernel: torch 2.13's documentation says "CPU and CUDA").
FUSED_OPTIMIZERS = frozenset({"Adagrad", "Adam", "AdamW", "SGD"})
# Classes with `capturable=True`: the step count and its bias corrections kept on the GPU, so
# that a CUDA graph replay advances them.
CAPTURABLE_OPTIMIZERS = frozenset(
    {"Adadelta", "Adam", "AdamW", "Adamax", "ASGD", "NAdam", "RAdam", "RMSprop", "Rprop"}
)
# Classes that keep no step count on the host: their step captures as it is (SGD's momentum
# buffers live on the GPU; its constructor has no capturable argument).
CAPTURE_AS_IS = frozenset({"SGD"})

_OPTIMIZER_RANGE = re.compile(
    r"^Optimizer\.(?:step|zero_grad)#([A-Za-z_][\w.]*)\.(?:step|zero_grad)$"
)


def optimizer_classes(table: EventTable | None) -> frozenset[str]:
    """Every optimizer class the trace's `Optimizer.step#<Class>.step` ranges name (a
    wrapper and the optimizer it wraps: EMAOptimizer and Shampoo)."""
    if table is None:
        return frozenset()
    return frozenset(m.group(1) for name in table.names if (m := _OPTIMIZER_RANGE.match(name)))


def optimizer_class(table: EventTable | None) -> str | None:
    """The optimizer class the trace's `Optimizer.step#<Class>.step` ranges name, or None
    when there is none or more than one."""
    found = optimizer_classes(table)
    return next(iter(found)) if len(found) == 1 else None


def capture_support(optimizer: str | None) -> str:
    """How the optimizer's step goes into a CUDA graph: "capturable" (needs capturable=True),
    "as-is" (captures unchanged), "none" (a torch.optim class with no capturable option) or
    "unknown" (not a torch.optim class, or not known from the trace)."""
    if optimizer in CAPTURE_AS_IS:
        return "as-is"
    if optimizer in CAPTURABLE_OPTIMIZERS:
        return "capturable"
    if optimizer in TORCH_OPTIMIZERS:
        return "none"
    return "unknown"
