"""remove-host-sync: drop `.item()` / `.cpu()` / `cudaDeviceSynchronize`-style waits.

Assumptions: the value the sync fetched is not needed on the host right away
(e.g. a loss logged every N steps, or read asynchronously), so the CPU goes on
launching work instead of waiting for the GPU. The copy itself still runs on
the GPU. Only the blocking part of the call is removed; a blocking copy keeps
its launch cost.

Not every sync is a read the user can drop. Each is told apart by the ops around it:

- a sync inside an op whose output *shape* depends on the data (`nonzero`, boolean-mask
  indexing `x[mask]` and `x[mask] = v`, `masked_select`, `unique`, `repeat_interleave`
  without `output_size`, `bincount`) is how the host learns the size to allocate: it stays
  unless `shapes=true` assumes the code was rewritten with static shapes (a mask multiply,
  `torch.nonzero_static`, an `output_size`);
- a blocking host-to-device copy (`.to(device)` from pageable memory, or without
  `non_blocking=True`) is removed, with the change it takes said: pinned memory and
  `non_blocking=True`;
- every other sync is a host read (`.item()`, `.cpu()`, an explicit synchronize) and is
  removed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from perfcast.errors import NotApplicableError
from perfcast.graph.model import Graph, NodeKind, Source, SyncKind
from perfcast.hardware.classify import copy_direction
from perfcast.whatif import primitives as P

_FREE = re.compile(r"Free")


def steps_overlap(options: dict[str, object]) -> bool:
    """Without the sync at its end a step runs into the next: the runner takes the speedup
    over the steps after the first (perfcast.whatif.runner.steady_ms)."""
    return True


SUMMARY = (
    "remove host-device synchronizations (.item(), .cpu(), explicit syncs, blocking input "
    "copies) (op=REGEX, reads=true: only host reads, shapes=true: also data-dependent shapes)"
)


# Ops whose sync is the host reading a tensor's value: `.item()`, `.cpu()` / `.to("cpu")`,
# `.tolist()`, `nonzero`, data-dependent shapes. The user's code asked for the value, so the
# user can defer or drop it; a sync inside a library's own op (DDP's event waits) is not theirs.
HOST_READS = (
    r"^aten::(item|_local_scalar_dense|to|_to_copy|copy_|nonzero|nonzero_static|is_nonzero"
    r"|equal|masked_select|_unique2?|unique_consecutive|unique_dim|repeat_interleave)$"
)


# Ops whose output shape depends on the values of their input: the host must read a count
# back before it can allocate the result (boolean-mask indexing and assignment go through
# nonzero; integer indexing does not sync at all).
SHAPE_OPS = re.compile(
    r"^aten::(nonzero|argwhere|masked_select|_unique2?|unique|unique_consecutive|unique_dim"
    r"|unique_dim_consecutive|repeat_interleave|index|index_put_|_index_put_impl_|bincount)$"
)

READ, H2D_COPY, SHAPE = 0, 1, 2


@dataclass
class Options:
    op: str | None = None  # only syncs inside ops matching this (e.g. _local_scalar_dense)
    include_explicit: bool = True  # also cudaDeviceSynchronize / cudaStreamSynchronize
    reads: bool = False  # only the syncs of host reads (HOST_READS), the ones user code makes
    shapes: bool = False  # also syncs that size data-dependent outputs (code made static)


def check_options(options: Options) -> None:
    """Values the model cannot take (the registry calls this when it builds the options)."""
    P.check_pattern(options.op, "remove-host-sync: op")


def classify_syncs(graph: Graph, syncs: np.ndarray) -> np.ndarray:
    """Per sync node: SHAPE (inside an op whose output shape depends on the data), H2D_COPY
    (its op copies host memory to the device) or READ (a host read or explicit sync)."""
    out = np.full(syncs.size, READ, dtype=np.int8)
    if syncs.size == 0 or graph.table is None:
        return out
    c = graph.cols
    # A blocking copy's GPU half: the copies launched from the same op as the sync. Told
    # apart first: an index tensor copied from the host inside `aten::index` is a copy to
    # pin, not a data-dependent shape (DLRM's syncs were refused as shapes).
    row = c["op"][syncs].astype(np.int64)
    copy = (row >= 0) & np.isin(row, c["op"][_h2d_copies(graph)])
    out[copy] = H2D_COPY
    out[~copy & (shape_op_of(graph, syncs) >= 0)] = SHAPE
    return out


def _h2d_copies(graph: Graph) -> np.ndarray:
    """The GPU nodes (alive, launched from an op) that copy host memory to the device."""
    c = graph.cols
    gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & (c["op"] >= 0) & graph.alive)
    h2d_names = np.array([copy_direction(n) == "HtoD" for n in graph.names], dtype=bool)
    return gpu[h2d_names[c["name"][gpu]]]


def copy_calls(graph: Graph, syncs: np.ndarray) -> np.ndarray:
    """The runtime calls that launched the host-to-device copies of these syncs' ops."""
    c = graph.cols
    copies = _h2d_copies(graph)
    calls = np.unique(c["launch"][copies[np.isin(c["op"][copies], c["op"][syncs])]])
    return calls[calls >= 0]


def blocking_ns(graph: Graph, syncs: np.ndarray) -> int:
    """The host time these syncs held as traced: their own, and for blocking host-to-device
    copies (syncs whose op launched one, as `classify_syncs` tells them) the copy calls too
    (a pageable cudaMemcpyAsync blocks inside the call, 3-40 ms on the 2021 V100 ResNet-50,
    where the synchronize after it takes 0.05 ms)."""
    c = graph.cols
    total = int(np.sum(c["dur_measured"][syncs]))
    return total + int(np.sum(c["dur_measured"][copy_calls(graph, syncs)]))


def shape_op_of(graph: Graph, syncs: np.ndarray) -> np.ndarray:
    """Per sync node: the trace's name id of the innermost enclosing op whose output shape
    depends on the data (SHAPE_OPS), or -1."""
    from perfcast.analysis.common import nearest_ancestor

    table = graph.table
    if syncs.size == 0 or table is None:
        return np.full(syncs.size, -1, dtype=np.int64)
    is_shape = np.array([bool(SHAPE_OPS.match(n)) for n in table.names], dtype=bool)
    hit = nearest_ancestor(table, graph.cols["op"][syncs], is_shape[table.name])
    return np.where(hit >= 0, table.name[np.maximum(hit, 0)], -1).astype(np.int64)


def inside_ops(graph: Graph, syncs: np.ndarray, pattern: str) -> np.ndarray:
    """Per sync node: whether it runs inside an op whose name matches (its own op or any op
    around it: `aten::item` holds the `_local_scalar_dense` that waits)."""
    from perfcast.analysis.common import nearest_ancestor
    from perfcast.events import Kind

    table = graph.table
    if table is None or syncs.size == 0:
        return np.isin(syncs, P.select(graph, kind="sync", op=pattern))
    named = P.name_mask(table.names, pattern)[table.name]
    rows = graph.cols["op"][syncs].astype(np.int64)
    hit = nearest_ancestor(table, rows, (table.kind == Kind.CPU_OP) & named)
    return (rows >= 0) & (hit >= 0)


def apply(graph: Graph, options: Options) -> Graph:
    c = graph.cols
    syncs = P.select(graph, kind="sync")
    if options.op:
        syncs = syncs[inside_ops(graph, syncs, options.op)]
    if options.reads:
        syncs = np.intersect1d(syncs, P.select(graph, kind="sync", op=HOST_READS))
    syncs = syncs[c["iteration"][syncs] >= 0] if (c["iteration"][syncs] >= 0).any() else syncs
    if not options.include_explicit:
        syncs = syncs[c["sync_kind"][syncs] == SyncKind.COPY]
    # Freeing memory synchronizes too, but that is the allocator's doing, not a host read.
    frees = np.array([bool(_FREE.search(graph.names[i])) for i in c["name"][syncs]], dtype=bool)
    syncs = syncs[~frees] if syncs.size else syncs
    if syncs.size == 0:
        raise NotApplicableError(
            "remove-host-sync: the trace has no host-device synchronization inside its steps"
            + (f" matching op '{options.op}'" if options.op else "")
            + (
                " that reads a tensor on the host (.item(), .cpu(), nonzero, ...)"
                if options.reads
                else ""
            )
        )
    kind = classify_syncs(graph, syncs)
    per, where = P.rank_steps(graph, syncs)
    kept = syncs[kind == SHAPE] if not options.shapes else syncs[:0]
    if kept.size == syncs.size:
        raise NotApplicableError(
            f"remove-host-sync: the trace's {P.per_count(kept.size, per)} host-device "
            f"synchronization{'s' * (kept.size != 1)} {where} all size the output of an op "
            "whose shape depends on the data (nonzero, boolean-mask indexing, unique, ...): "
            "the host needs them",
            hint="shapes=true predicts the step with that code rewritten to static shapes "
            "(a mask multiply, torch.nonzero_static, repeat_interleave's output_size)",
        )

    def ms(nodes: np.ndarray) -> str:
        return f"{blocking_ns(graph, nodes) / per / 1e6:.2f} ms of measured blocking"

    def count(nodes: np.ndarray, one: str, many: str) -> str:
        n = P.per_count(nodes.size, per)
        return f"{n} {one if n == '1' else many}"

    reads = syncs[kind == READ]
    copies = syncs[kind == H2D_COPY]
    shaped = syncs[kind == SHAPE] if options.shapes else syncs[:0]
    # A pageable copy blocks inside its own call (the host stages the data), 2 ms a batch on
    # the 2021 V100 ResNet-50: from pinned memory with non_blocking=True the call only
    # enqueues the copy, in a launch's time.
    calls = copy_calls(graph, copies) if copies.size else copies
    launch_ns = P.median_launch_ns(graph)
    calls = calls[c["dur"][calls] > launch_ns]
    P.set_duration(graph, calls, launch_ns, Source.MODELLED)
    P.remove(graph, syncs[(kind != SHAPE) | options.shapes])
    sync, syncs_ = "synchronization", "synchronizations"
    if reads.size:
        graph.assumptions.append(
            f"removed {count(reads, sync, syncs_)} {where} ({ms(reads)}); their results are "
            "assumed not needed on the host within the step"
        )
    if copies.size:
        what = count(copies, "blocking host-to-device copy", "blocking host-to-device copies")
        graph.assumptions.append(
            f"removed the wait of {what} {where} ({ms(copies)}): assumes the source in pinned "
            "memory (DataLoader(pin_memory=True) or tensor.pin_memory()) and "
            ".to(device, non_blocking=True); their copy calls take a launch's time "
            f"({launch_ns / 1000:.1f} µs, the trace's median)"
        )
    if shaped.size:
        graph.assumptions.append(
            f"removed {count(shaped, sync, syncs_)} {where} sizing data-dependent outputs "
            f"({ms(shaped)}): assumes the code rewritten to static shapes (shapes=true)"
        )
    if kept.size:
        graph.assumptions.append(
            f"kept {count(kept, sync, syncs_)} {where} ({ms(kept)}) inside ops whose output "
            "shape depends on the data (nonzero, boolean-mask indexing, unique, ...): the host "
            "needs them to size the result (shapes=true assumes static shapes)"
        )
    return graph
