"""Calling-context trees for the viewers people already use.

- speedscope (https://www.speedscope.app): its JSON file format, one "evented" profile per
  metric. A tree of aggregated call paths is written as if each path ran once, for its
  inclusive time: a node opens where its previous sibling closed, its children fill it
  from its start, and its own (exclusive) time follows them. speedscope's "left heavy"
  and "sandwich" views then show the tree and the callers of any frame.
- folded stacks ("frame;frame;frame value" per line), which flamegraph.pl, inferno,
  speedscope and many others read.

Exports take the tree as the user chose to see it (library frames elided or not); a
trace's many events never appear one by one, only their call paths.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from perfcast import __version__
from perfcast.analysis.context import ContextTree, CtxKind, parse_frame
from perfcast.errors import PerfcastError
from perfcast.paths import write_output

SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"
METRIC_NAMES = {"gpu_ns": "GPU time (kernels, copies, memsets)", "cpu_ns": "CPU time"}


def _dfs_order(tree: ContextTree, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Nodes with inclusive `metric` > 0 in depth-first order (children by size, largest
    first), and for each whether it is a leaf of that order. The root is left out."""
    index = tree.index
    incl = tree.incl[metric]
    parent = index.parent
    keep = incl > 0
    kids = np.flatnonzero((parent >= 0) & keep)
    # Children sorted by parent, then by size: one lexsort, then a Python DFS over kept
    # nodes only (call paths, not events: a few thousand in practice).
    kids = kids[np.lexsort((-incl[kids], parent[kids]))]
    start = np.searchsorted(parent[kids], np.arange(len(index) + 1))
    order: list[int] = []
    stack = kids[start[0] : start[1]][::-1].tolist()
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(kids[start[node] : start[node + 1]][::-1].tolist())
    return np.array(order, dtype=np.int64), start


def _frames(tree: ContextTree, nodes: np.ndarray) -> tuple[list[dict[str, Any]], np.ndarray]:
    """speedscope frames for the labels of `nodes` (one per label and kind) and the frame
    index of each node."""
    index = tree.index
    key = index.label[nodes].astype(np.int64) * len(CtxKind) + index.kind[nodes]
    uniq, inv = np.unique(key, return_inverse=True)
    frames: list[dict[str, Any]] = []
    for k in uniq.tolist():
        label = index.labels[k // len(CtxKind)]
        frame: dict[str, Any] = {"name": label}
        if CtxKind(k % len(CtxKind)) == CtxKind.FRAME:
            parsed = parse_frame(label)
            if parsed is not None:
                frame["file"], frame["line"] = parsed[0], parsed[1]
        frames.append(frame)
    return frames, inv.reshape(-1)


def speedscope_document(tree: ContextTree, name: str = "perfcast") -> dict[str, Any]:
    """The tree as a speedscope file: one evented profile for GPU time (when the trace has
    any) and one for CPU time, in nanoseconds, sharing one frame table."""
    metrics = [m for m in ("gpu_ns", "cpu_ns") if int(tree.incl[m][0]) > 0]
    index = tree.index
    orders = {m: _dfs_order(tree, m)[0] for m in metrics}
    # The root's own time (hidden library frames' time lands there): a frame of its own.
    roots = [np.zeros(1, np.int64)] if any(int(tree.excl[m][0]) > 0 for m in metrics) else []
    every = np.unique(np.concatenate([*orders.values(), *roots] or [np.zeros(0, np.int64)]))
    frames, inv = _frames(tree, every)
    frame_of = np.full(len(index), -1, dtype=np.int64)
    frame_of[every] = inv
    profiles = []
    for m in metrics:
        profiles.append(_evented(tree, m, orders[m], frame_of))
    return {
        "$schema": SCHEMA_URL,
        "shared": {"frames": frames},
        "profiles": profiles,
        "name": name,
        "activeProfileIndex": 0,
        "exporter": f"perfcast {__version__}",
    }


def _evented(
    tree: ContextTree, metric: str, order: np.ndarray, frame_of: np.ndarray
) -> dict[str, Any]:
    parent = tree.index.parent
    incl = tree.incl[metric]
    events: list[dict[str, Any]] = []
    # Walk the DFS order keeping the open nodes; a node opens where the last closed one
    # (its previous sibling or its parent's start) left the clock.
    open_nodes: list[int] = []
    open_at: list[int] = []
    clock = 0
    for node in order.tolist():
        p = int(parent[node])
        while open_nodes and open_nodes[-1] != p:
            done = open_nodes.pop()
            end = open_at.pop() + int(incl[done])
            events.append({"type": "C", "frame": int(frame_of[done]), "at": end})
            clock = end
        events.append({"type": "O", "frame": int(frame_of[node]), "at": clock})
        open_nodes.append(node)
        open_at.append(clock)
    while open_nodes:
        done = open_nodes.pop()
        end = open_at.pop() + int(incl[done])
        events.append({"type": "C", "frame": int(frame_of[done]), "at": end})
        clock = end
    total = int(incl[0])
    if total > clock and frame_of[0] >= 0:  # the root's own time, after its children
        events.append({"type": "O", "frame": int(frame_of[0]), "at": clock})
        events.append({"type": "C", "frame": int(frame_of[0]), "at": total})
    return {
        "type": "evented",
        "name": METRIC_NAMES.get(metric, metric),
        "unit": "nanoseconds",
        "startValue": 0,
        "endValue": total,
        "events": events,
    }


def folded_lines(tree: ContextTree, metric: str = "gpu_ns") -> list[str]:
    """One "frame;frame;...;frame value" line per node with exclusive `metric` (integer
    nanoseconds). `;` in a name becomes `:`, and line breaks become spaces."""
    index = tree.index
    excl = tree.excl[metric]
    order, _ = _dfs_order(tree, metric)
    clean: dict[int, str] = {}
    lines = []
    stack: list[tuple[int, str]] = []  # (node, its path)
    parent = index.parent
    root_own = int(excl[0])
    if root_own > 0:  # time no child holds (hidden library frames' own time lands here)
        lines.append(f"{_folded_name(index.labels[int(index.label[0])])} {root_own}")
    for node in order.tolist():
        p = int(parent[node])
        while stack and stack[-1][0] != p:
            stack.pop()
        lab = int(index.label[node])
        name = clean.get(lab)
        if name is None:
            name = _folded_name(index.labels[lab])
            clean[lab] = name
        path = f"{stack[-1][1]};{name}" if stack else name
        stack.append((node, path))
        value = int(excl[node])
        if value > 0:
            lines.append(f"{path} {value}")
    return lines


def _folded_name(label: str) -> str:
    return label.replace(";", ":").replace("\n", " ").replace("\r", " ")


def _write_atomic(path: str, text: str) -> None:
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise PerfcastError("output folder does not exist", path=path)
    write_output(path, text.encode("utf-8"))


def write_speedscope(tree: ContextTree, path: str, name: str = "perfcast") -> None:
    doc = speedscope_document(tree, name=name)
    _write_atomic(path, json.dumps(doc, separators=(",", ":"), ensure_ascii=False))


def write_folded(tree: ContextTree, path: str, metric: str = "gpu_ns") -> None:
    lines = folded_lines(tree, metric)
    _write_atomic(path, "\n".join(lines) + ("\n" if lines else ""))
