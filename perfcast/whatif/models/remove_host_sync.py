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

SUMMARY = "remove host-device synchronizations (.item(), .cpu(), explicit syncs) (op=REGEX)"


@dataclass
class Options:
    op: str | None = None  # only syncs inside ops matching this (e.g. _local_scalar_dense)
    include_explicit: bool = True  # also cudaDeviceSynchronize / cudaStreamSynchronize


def apply(graph: Graph, options: Options) -> Graph:
    c = graph.cols
    syncs = P.select(graph, kind="sync", op=options.op)
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
        )
    waited = int(np.sum(c["dur_measured"][syncs]))
    P.remove(graph, syncs)
    graph.assumptions.append(
        f"removed {syncs.size:,} synchronizations ({waited / 1e6:.2f} ms of measured blocking); "
        "their results are assumed not needed on the host within the step"
    )
    return graph
