"""The calling-context tree for the HTML report's flame graph, as compact JSON columns.

One entry per call path (never per event), frames of PyTorch and the interpreter elided
as in the terminal view, and paths under a hundred-thousandth of both GPU and CPU time
folded into their parents, so a 53k-frame trace stays a few thousand nodes and the page
stays responsive.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perfcast.analysis.context import KIND_NAMES, LEVEL_TEXT, ContextTree, CtxKind, context_tree
from perfcast.analysis.context_views import CPU_AS_TRACED, library_frames, project
from perfcast.events import EventTable
from perfcast.report import shorten
from perfcast.report.tree import coverage_text

MIN_SHARE = 1e-5  # of the total GPU (or CPU) time: smaller paths fold into their parent
MAX_NAME_CHARS = 400


def flame_tree(tree: ContextTree) -> ContextTree:
    """The tree the flame graph draws: library frames elided, negligible paths folded."""
    shown = project(tree, ~library_frames(tree.index))
    keep = np.zeros(len(shown.index), dtype=bool)
    for m in ("gpu_ns", "cpu_ns"):
        total = float(shown.incl[m][0])
        if total > 0:
            keep |= shown.incl[m] >= total * MIN_SHARE
    keep[0] = True
    if not keep.all():
        shown = project(shown, keep)
    return shown


def flame_data(table: EventTable) -> dict[str, Any] | None:
    """JSON-ready columns of the flame graph, or None for a trace with no events."""
    if len(table) == 0:
        return None
    full = context_tree(table)
    tree = flame_tree(full)
    index = tree.index
    used = np.unique(index.label)
    remap = np.full(len(index.labels), -1, dtype=np.int64)
    remap[used] = np.arange(used.size)
    names = [shorten(index.labels[i], MAX_NAME_CHARS) for i in used.tolist()]
    cov = full.coverage
    return {
        "level": index.level,
        "level_text": LEVEL_TEXT[index.level],
        "kinds": [KIND_NAMES[k] for k in CtxKind],
        "names": names,
        "parent": index.parent.astype(int).tolist(),
        "name": remap[index.label].astype(int).tolist(),
        "kind": index.kind.astype(int).tolist(),
        "gpu": tree.incl["gpu_ns"].astype(int).tolist(),
        "cpu": tree.incl["cpu_ns"].astype(int).tolist(),
        "gpu_self": tree.excl["gpu_ns"].astype(int).tolist(),
        "cpu_self": tree.excl["cpu_ns"].astype(int).tolist(),
        "calls": tree.excl["calls"].astype(int).tolist(),
        "launches": tree.incl["launches"].astype(int).tolist(),
        "kernels": tree.incl["kernels"].astype(int).tolist(),
        "steps": tree.steps,
        "nodes_total": len(full.index),
        "library_frames_hidden": int(library_frames(full.index).sum()),
        "gpu_total_ns": cov.gpu_ns,
        "unattributed_pct": cov.unattributed_pct,
        # What `perfcast tree` says: "no Python frames recorded" where none were.
        "coverage_text": coverage_text(cov, index.level) if cov.gpu_ns else None,
        "no_launch_pct": 100.0 * cov.no_launch_ns / cov.gpu_ns if cov.gpu_ns else 0.0,
        # The icicle's CPU times are the profiled run's, as the tree's; the page's other
        # figures are without the profiler: say so, as `perfcast tree` does.
        "notes": [*full.notes, CPU_AS_TRACED],
    }
