"""Which phase of a training step each event belongs to.

A CPU event takes the phase of its nearest enclosing event that names one
(the DataLoader's `__next__`, `Optimizer.step`, an autograd backward
function, a collective); GPU work takes the phase of the call that launched
it. What names no phase inside a step is forward.
"""

from __future__ import annotations

import enum
import functools
import re

import numpy as np

from perfcast.events import GLOO_RANGE_PREFIX, NONE, EventTable, Kind
from perfcast.hardware.classify import COMMUNICATION_PATTERN


class Phase(enum.IntEnum):
    NONE = -1
    DATALOADER = 0
    FORWARD = 1
    BACKWARD = 2
    OPTIMIZER = 3
    COMMUNICATION = 4
    # GPU work replayed from a captured CUDA/HIP graph: the trace shows the cudaGraphLaunch
    # that started it, not the forward, backward or optimizer op each kernel came from.
    GRAPH = 5


PHASE_LABELS = {
    Phase.DATALOADER: "data loading",
    Phase.FORWARD: "forward",
    Phase.BACKWARD: "backward",
    Phase.OPTIMIZER: "optimizer",
    Phase.COMMUNICATION: "communication",
    Phase.GRAPH: "CUDA graph replay",
}
# Runtime calls that replay a captured graph.
GRAPH_LAUNCHES = ("cudaGraphLaunch", "hipGraphLaunch")

# How phases are recognised (the rules below), for messages that find one missing.
PHASE_RULES = (
    "forward is the CPU work inside a step (a ProfilerStep#N range, or the whole trace without "
    "one) in no DataLoader, optimizer (Optimizer.step, zero_grad), autograd backward "
    "(evaluate_function, ...Backward) or collective op"
)
GPU_PHASE_RULE = (
    "GPU work has the phase of the op that launched it (work a cudaGraphLaunch replays from "
    "outside any named phase is labelled a CUDA graph replay)"
)


def phase_names(phase: np.ndarray) -> list[str]:
    """The phases among `phase` values, in step order, as the what-ifs' `phases=` names them."""
    found = set(np.unique(phase).tolist())
    return [p.name.lower() for p in Phase if p != Phase.NONE and int(p) in found]


def in_phases(names: list[str]) -> str:
    """'in the optimizer phase', 'in the forward and backward phases'."""
    if len(names) == 1:
        return f"in the {names[0]} phase"
    return f"in the {', '.join(names[:-1])} and {names[-1]} phases"


_PATTERNS: list[tuple[Phase, re.Pattern[str]]] = [
    (Phase.DATALOADER, re.compile(r"DataLoader|dataloader|_DataLoaderIter|data_load")),
    (
        Phase.OPTIMIZER,
        re.compile(r"^Optimizer\.(step|zero_grad)|optimizer[._ ]?step|zero_grad|^## optimizer"),
    ),
    (
        Phase.BACKWARD,
        re.compile(
            r"^autograd::engine::evaluate_function|Backward\d*$|^## backward|backward"
            # DDP's reducer runs from autograd hooks: copying reduced buckets back to grads
            r"|^torch\.distributed\.ddp\.reducer::"
        ),
    ),
    (
        Phase.COMMUNICATION,
        re.compile(r"^nccl:|^c10d::|record_param_comms|^gloo:|allreduce|all_reduce|all_gather"),
    ),
    (Phase.FORWARD, re.compile(r"^## forward|^forward$|\.forward$")),
]


@functools.lru_cache(maxsize=1 << 16)
def phase_of_name(name: str) -> Phase:
    # Cached: every what-if's memory estimate reads the phases, over the same names.
    for phase, pat in _PATTERNS:
        if pat.search(name):
            return phase
    return Phase.NONE


def event_phases(table: EventTable) -> np.ndarray:
    """Phase per row (int8, Phase values; read-only, computed once per table)."""
    return table._derived(
        "phases",
        (table.kind, table.name, table.parent, table.launch, table.iteration, table.coll_name),
        lambda: _event_phases(table),
    )


def _event_phases(table: EventTable) -> np.ndarray:
    name_phase = np.array([phase_of_name(n) for n in table.names], dtype=np.int8)
    n = len(table)
    own = name_phase[table.name] if n else np.zeros(0, np.int8)
    # GPU-side annotations and kernels do not name phases by themselves here.
    own = np.where(np.isin(table.kind, [Kind.KERNEL, Kind.GPU_ANNOTATION]), Phase.NONE, own)
    phase = own.astype(np.int8)
    parent = table.parent
    # Pointer jumping: each pass lets unnamed rows look one more level up.
    look = parent.copy()
    for _ in range(64):
        pending = (phase == Phase.NONE) & (look >= 0)
        if not pending.any():
            break
        idx = np.flatnonzero(pending)
        phase[idx] = phase[look[idx]]
        look[idx] = parent[look[idx]]
    _backward_threads(table, own, phase)
    launched = table.launch >= 0
    phase[launched] = phase[table.launch[launched]]
    graph_launch = np.array([n in GRAPH_LAUNCHES for n in table.names], dtype=bool)
    if graph_launch.any():
        # A graph replayed inside a named phase (torch.compile's per-region graphs: the
        # backward graph launches from autograd's backward) keeps that phase; one launched
        # from code that names nothing (a whole step captured and replayed) is labelled a
        # replay, not given the forward default below.
        replayed = np.flatnonzero(launched & (phase == Phase.NONE))
        replayed = replayed[graph_launch[table.name[table.launch[replayed]]]]
        phase[replayed] = Phase.GRAPH
    # Collective kernels are communication whatever launched them.
    phase[collective_kernel_mask(table)] = Phase.COMMUNICATION
    # Inside a step, CPU work that names nothing is forward (the model's own code);
    # the step markers themselves span every phase and take none.
    is_step = table.step_marker_names()
    in_step = (phase == Phase.NONE) & (table.iteration != NONE) & ~is_step[table.name]
    phase[in_step] = Phase.FORWARD
    return phase


_EVALUATE_FUNCTION = "autograd::engine::evaluate_function"


def _backward_threads(table: EventTable, own: np.ndarray, phase: np.ndarray) -> None:
    """CPU work that names no phase on autograd's own thread is backward. PyTorch 1.8-1.10
    names a backward node by itself ("CudnnConvolutionBackward"), and its gradient
    accumulation ("torch::autograd::AccumulateGrad" -> aten::add_) named nothing: it went
    to the forward default (161 kernels a step on the 2021 V100 ResNet-50). A thread is
    autograd's when some of its ops name backward and none names forward, the optimizer or
    data loading (DDP's collectives may run there too), and it is not the training loop's."""
    cpu = np.flatnonzero(np.isin(table.kind, [Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.RUNTIME]))
    if cpu.size == 0 or any(n.startswith(_EVALUATE_FUNCTION) for n in table.names):
        return  # later traces put every backward op inside autograd's own named range
    threads, inv = np.unique(
        np.stack([table.rank[cpu], table.pid[cpu], table.tid[cpu]], axis=1),
        axis=0,
        return_inverse=True,
    )
    inv = inv.reshape(-1)
    o = own[cpu]
    count = threads.shape[0]
    backward = np.bincount(inv, weights=o == Phase.BACKWARD, minlength=count) > 0
    other = (o == Phase.FORWARD) | (o == Phase.OPTIMIZER) | (o == Phase.DATALOADER)
    mixed = np.bincount(inv, weights=other, minlength=count) > 0
    # The training loop's thread (its step markers; a rank's only thread) runs forward
    # itself, and on a CPU job backward too: never autograd's own.
    marker = table.step_marker_names()[table.name[cpu]]
    loop = np.bincount(inv, weights=marker, minlength=count) > 0
    # Without step markers the loop's thread cannot be told: nothing is moved.
    ranks_with_loop = set(threads[loop, 0].tolist())
    rank_of = np.unique(threads[:, 0], return_inverse=True)[1].reshape(-1)
    alone = np.bincount(rank_of)[rank_of] == 1
    has_loop = np.array([r in ranks_with_loop for r in threads[:, 0].tolist()], dtype=bool)
    autograd = backward & ~mixed & ~loop & ~alone & has_loop
    if not autograd.any():
        return
    rows = cpu[autograd[inv] & (phase[cpu] == Phase.NONE) & (table.iteration[cpu] != NONE)]
    phase[rows] = Phase.BACKWARD


_COLLECTIVE_NAME = re.compile(COMMUNICATION_PATTERN, re.IGNORECASE)


def collective_name_mask(names: list[str]) -> np.ndarray:
    """Per name: does it name communication between GPUs (hardware.classify's definition)?"""
    return np.fromiter(map(_names_collective, names), dtype=bool, count=len(names))


@functools.lru_cache(maxsize=1 << 16)
def _names_collective(name: str) -> bool:
    # Cached: the critical path asks this of a graph's every name after each replay.
    return bool(_COLLECTIVE_NAME.search(name))


def collective_kernel_mask(table: EventTable) -> np.ndarray:
    """Rows that are communication kernels (NCCL/RCCL, or carrying collective args);
    read-only, computed once per table."""

    def make() -> np.ndarray:
        if len(table) == 0:
            return np.zeros(0, dtype=bool)
        is_coll_name = collective_name_mask(table.names)
        return (table.kind == Kind.KERNEL) & (is_coll_name[table.name] | (table.coll_name >= 0))

    return table._derived("collective_kernels", (table.kind, table.name, table.coll_name), make)


# Collective kinds by the letters of an op's name, most specific first ("reducescatter" and
# "allreduce" both hold "reduce"; "allgather" holds "gather").
_KIND_BY_LETTERS = (
    ("alltoall", "alltoall"),
    ("allreduce", "allreduce"),
    ("allgather", "allgather"),
    ("reducescatter", "reducescatter"),
    ("broadcast", "broadcast"),
    ("barrier", "barrier"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("reduce", "reduce"),
    ("send", "sendrecv"),
    ("recv", "sendrecv"),
)


def collective_kind_of_op(op: str) -> str | None:
    """The collective an op name runs, whatever its spelling ("all_reduce", "_allgather_base_",
    "alltoall_base_", "barrier"); None when it names none."""
    key = re.sub(r"[^a-z]", "", op.lower())
    for letters, kind in _KIND_BY_LETTERS:
        if letters in key:
            return kind
    return None


def host_collective_kind(name: str) -> str | None:
    """The collective a CPU backend's range runs ("gloo:all_reduce" -> "allreduce",
    "gloo:barrier" -> "barrier"); None for any other name."""
    if not name.startswith(GLOO_RANGE_PREFIX):
        return None
    return collective_kind_of_op(name[len(GLOO_RANGE_PREFIX) :])


def host_collective_mask(table: EventTable) -> np.ndarray:
    """Rows that are a CPU backend's collectives (gloo's `gloo:<op>` ranges); read-only."""

    def make() -> np.ndarray:
        if len(table) == 0:
            return np.zeros(0, dtype=bool)
        named = np.array([host_collective_kind(nm) is not None for nm in table.names], bool)
        return (table.kind == Kind.USER_ANNOTATION) & named[table.name]

    return table._derived("host_collectives", (table.kind, table.name), make)


def enclosing_scopes(table: EventTable) -> np.ndarray:
    """Per row, the name index of the nearest enclosing module or user scope.

    Modules come from `with_modules`/`with_stack` traces (python_function events
    named "nn.Module: Linear_0"); scopes from record_function annotations.
    ProfilerStep ranges are not scopes.
    """
    n = len(table)
    if n == 0:
        return np.zeros(0, np.int32)
    is_module = np.array([nm.startswith("nn.Module: ") for nm in table.names], dtype=bool)
    is_scope = ((table.kind == Kind.PYTHON_FUNCTION) & is_module[table.name]) | (
        table.annotation_mask()
    )
    scope = np.where(is_scope, table.name, NONE).astype(np.int32)
    own = scope.copy()
    look = table.parent.copy()
    for _ in range(64):
        pending = (scope == NONE) & (look >= 0)
        if not pending.any():
            break
        idx = np.flatnonzero(pending)
        scope[idx] = own[look[idx]]
        look[idx] = table.parent[look[idx]]
    launched = table.launch >= 0
    scope[launched] = scope[table.launch[launched]]
    return scope
