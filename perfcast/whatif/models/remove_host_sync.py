"""remove-host-sync: drop `.item()` / `.cpu()` / `cudaDeviceSynchronize`-style waits.

Assumptions: the value the sync fetched is not needed on the host right away
(e.g. a loss logged every N steps, or read asynchronously), so the CPU goes on
launching work instead of waiting for the GPU. The copy itself still runs on
the GPU. Only the blocking part of the call is removed; a blocking copy keeps
its launch cost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from perfcast.errors import NotApplicableError
from perfcast.graph.model import Graph, SyncKind
from perfcast.whatif import primitives as P

_FREE = re.compile(r"Free")

SUMMARY = (
    "remove host-device synchronizations (.item(), .cpu(), explicit syncs) "
    "(op=REGEX, reads=true: only host reads)"
)


# Ops whose sync is the host reading a tensor's value: `.item()`, `.cpu()` / `.to("cpu")`,
# `.tolist()`, `nonzero`, data-dependent shapes. The user's code asked for the value, so the
# user can defer or drop it; a sync inside a library's own op (DDP's event waits) is not theirs.
HOST_READS = (
    r"^aten::(item|_local_scalar_dense|to|_to_copy|copy_|nonzero|nonzero_static|is_nonzero"
    r"|equal|masked_select|_unique2?|unique_consecutive|unique_dim|repeat_interleave)$"
)


@dataclass
class Options:
    op: str | None = None  # only syncs inside ops matching this (e.g. _local_scalar_dense)
    include_explicit: bool = True  # also cudaDeviceSynchronize / cudaStreamSynchronize
    reads: bool = False  # only the syncs of host reads (HOST_READS), the ones user code makes


def apply(graph: Graph, options: Options) -> Graph:
    c = graph.cols
    syncs = P.select(graph, kind="sync", op=options.op)
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
    waited = int(np.sum(c["dur_measured"][syncs]))
    per, where = P.rank_steps(graph, syncs)
    count_text = P.per_count(syncs.size, per)
    P.remove(graph, syncs)
    graph.assumptions.append(
        f"removed {count_text} synchronization{'s' * (count_text != '1')} {where} "
        f"({waited / per / 1e6:.2f} ms of measured blocking); their results are assumed not "
        "needed on the host within the step"
    )
    return graph
