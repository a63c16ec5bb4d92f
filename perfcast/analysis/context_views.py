"""Views of a calling-context tree: nodes elided or focused, hot spots bottom-up, and the
module / source line / op that name where a node sits."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from perfcast.analysis.context import (
    ContextIndex,
    ContextTree,
    CtxKind,
    _depths,
    _intern_paths,
    _propagate_down,
    _sum_up,
    _Trie,
    is_library_frame,
    node_context,
    parse_frame,
)
from perfcast.events import NONE

# ---------------------------------------------------------------------------------------------
# Views: the same tree with some nodes elided, or only the paths through some nodes


def _reindex(index: ContextIndex, keep: np.ndarray) -> tuple[ContextIndex, np.ndarray]:
    """A new index without the nodes not in `keep` (their children move up to the nearest
    kept ancestor, and siblings that then share a label merge). Returns it and, per old
    node, its new node."""
    keep = keep.copy()
    keep[0] = True
    nearest = _propagate_down(index.parent, index.level_start, keep)
    items = np.flatnonzero(keep)[1:]  # every kept node but the root
    pos = np.full(len(index), NONE, dtype=np.int64)
    pos[items] = np.arange(items.size)
    up = nearest[np.maximum(index.parent[items], 0)]
    item_parent = np.where(up > 0, pos[np.maximum(up, 0)], NONE)
    depth, _ = _depths(item_parent)
    base = _Trie(
        parent=index.parent[:1].copy(),
        label=index.label[:1].copy(),
        kind=index.kind[:1].copy(),
        level_start=np.array([0, 1], dtype=np.int64),
        item_node=np.zeros(0, np.int32),
    )
    trie = _intern_paths(
        item_parent,
        index.label[items].astype(np.int64),
        index.kind[items].astype(np.int64),
        depth,
        np.zeros(items.size, np.int64),
        base,
    )
    new_of_old = np.zeros(len(index), dtype=np.int64)
    kept_old = nearest > 0
    new_of_old[kept_old] = trie.item_node[pos[nearest[kept_old]]]
    ctx = node_context(trie.parent, trie.level_start, trie.kind, trie.label, index.labels)
    row_node = np.where(index.row_node >= 0, new_of_old[np.maximum(index.row_node, 0)], NONE)
    new = ContextIndex(
        table=index.table,
        labels=index.labels,
        parent=trie.parent,
        label=trie.label,
        kind=trie.kind,
        level_start=trie.level_start,
        row_node=row_node.astype(np.int32),
        row_parent=index.row_parent,
        on_tree=index.on_tree,
        level=index.level,
        backward_attached=index.backward_attached,
        handed_to_caller=index.handed_to_caller,
        rank_nodes={r: int(new_of_old[n]) for r, n in index.rank_nodes.items()},
        **ctx,
    )
    return new, new_of_old


def project(tree: ContextTree, keep: np.ndarray) -> ContextTree:
    """The tree with the nodes not in `keep` elided: their own time goes to the nearest
    kept node above them, their children move up, and paths that become equal merge."""
    index, new_of_old = _reindex(tree.index, keep)
    n = len(index)
    excl = {}
    for k, v in tree.excl.items():
        excl[k] = np.bincount(new_of_old, weights=v.astype(np.float64), minlength=n)
        excl[k] = excl[k] if v.dtype.kind == "f" else np.rint(excl[k]).astype(np.int64)
    incl = {k: _sum_up(index.parent, index.level_start, v) for k, v in excl.items()}
    return ContextTree(
        index=index,
        excl=excl,
        incl=incl,
        coverage=tree.coverage,
        compiled=tree.compiled,
        selection=dict(tree.selection),
        steps=tree.steps,
        notes=list(tree.notes),
    )


def library_frames(index: ContextIndex) -> np.ndarray:
    """Nodes that are frames of PyTorch, the interpreter or the standard library."""
    frames = index.kind == CtxKind.FRAME
    out = np.zeros(len(index), dtype=bool)
    nodes = np.flatnonzero(frames)
    if nodes.size:
        labs = np.unique(index.label[nodes])
        lib = np.zeros(len(index.labels), dtype=bool)
        lib[labs] = [is_library_frame(index.labels[i]) for i in labs.tolist()]
        out[nodes] = lib[index.label[nodes]]
    return out


def matching(index: ContextIndex, pattern: str) -> np.ndarray:
    """Nodes whose label matches the regular expression (searched, case-sensitive)."""
    from perfcast.errors import PerfcastError

    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise PerfcastError(f"bad regular expression {pattern!r}: {exc}") from None
    hit = np.fromiter(
        (bool(rx.search(s)) for s in index.labels), dtype=bool, count=len(index.labels)
    )
    return hit[index.label]


def focus(tree: ContextTree, pattern: str) -> ContextTree:
    """Only the paths through nodes matching `pattern`: the subtrees of the matches, and
    their ancestors with the matches' time only (a match inside a match counts once)."""
    hit = matching(tree.index, pattern)
    inside = _propagate_down(tree.index.parent, tree.index.level_start, hit) >= 0
    excl = {k: np.where(inside, v, 0) for k, v in tree.excl.items()}
    incl = {k: _sum_up(tree.index.parent, tree.index.level_start, v) for k, v in excl.items()}
    out = ContextTree(
        index=tree.index,
        excl=excl,
        incl=incl,
        coverage=tree.coverage,
        compiled=tree.compiled,
        selection={**tree.selection, "focus": pattern},
        steps=tree.steps,
        notes=list(tree.notes),
    )
    if not hit.any():
        out.notes.append(f"no node matches --focus {pattern!r}")
    return out


# ---------------------------------------------------------------------------------------------
# Bottom-up: the hot kernels and ops, with the call paths that reach them


@dataclass
class CallPath:
    path: str  # the path, condensed to modules, user frames and the outermost op
    value: float
    node: int


@dataclass
class HotSpot:
    name: str
    kind: str  # "kernel", "copy", "op"
    value: float  # of the metric, over every path (a recursive op counted once per path)
    calls: int
    paths: list[CallPath]


def _same_label_above(index: ContextIndex) -> np.ndarray:
    """Nodes with an ancestor of the same label and kind (recursion, re-entered ops)."""
    out = np.zeros(len(index), dtype=bool)
    nodes = np.arange(len(index))
    cur = index.parent.astype(np.int64).copy()
    key = index.label.astype(np.int64) * len(CtxKind) + index.kind
    live = cur > 0
    for _ in range(len(index.level_start)):
        idx = np.flatnonzero(live)
        if idx.size == 0:
            break
        a = cur[idx]
        out[nodes[idx]] |= key[a] == key[idx]
        cur[idx] = index.parent[a]
        live = cur > 0
    return out


def site_parts(index: ContextIndex, node: int) -> tuple[str | None, str | None, str | None]:
    """(module, source line, op) that name where a node sits: its nearest nn.Module scope
    (else record_function range),
    its nearest frame of the user's (not PyTorch's) code as "file:line (function)", and the
    outermost op of its path."""
    mod = int(index.module[node])
    if mod < 0:  # no nn.Module: a record_function range names the place instead
        mod = int(index.scope[node])
    uf = int(index.user_frame[node])
    if uf < 0:
        uf = int(index.frame[node])
    op = int(index.first_op[node])
    src = None
    if uf >= 0:
        parsed = parse_frame(index.name(uf))
        src = f"{parsed[0]}:{parsed[1]} ({parsed[2]})" if parsed else index.name(uf)
    module = index.name(mod).removeprefix("nn.Module: ") if mod >= 0 else None
    return module, src, (index.name(op) if op >= 0 else None)


def short_path(index: ContextIndex, node: int, keep_last: int = 6) -> str:
    """A readable path: modules, record_function ranges, the user's frames and the
    outermost op, ending at the node itself."""
    parts = []
    first_op = int(index.first_op[node])
    for p in index.path(node):
        k = index.kind[p]
        if (
            k in (CtxKind.MODULE, CtxKind.ANNOTATION, CtxKind.RANK, CtxKind.SPECIAL)
            or (k == CtxKind.FRAME and p == index.user_frame[p])
            or p in (first_op, node)
        ):
            name = index.name(p)
            if k == CtxKind.FRAME:
                parsed = parse_frame(name)
                if parsed:
                    name = f"{parsed[0].rsplit('/', 1)[-1]}:{parsed[1]} {parsed[2]}"
            parts.append(name)
    if len(parts) > keep_last:
        parts = ["…", *parts[-keep_last:]]
    return " ▸ ".join(parts)


def hot_spots(
    tree: ContextTree, metric: str = "gpu_ns", top: int = 10, paths: int = 3
) -> list[HotSpot]:
    """The kernels (and copies) and ops with the most `metric`, each with its top paths."""
    index = tree.index
    kind = index.kind
    incl = tree.incl[metric].astype(np.float64)
    calls = tree.incl["calls"]
    recursive = _same_label_above(index)
    out: list[HotSpot] = []
    groups = (
        ("kernel", np.isin(kind, [CtxKind.KERNEL, CtxKind.COPY])),
        ("op", (kind == CtxKind.OP) & ~recursive),
    )
    for kname, mask in groups:
        nodes = np.flatnonzero(mask & (incl > 0))
        if nodes.size == 0:
            continue
        key = index.label[nodes].astype(np.int64) * len(CtxKind) + kind[nodes]
        uniq, inv = np.unique(key, return_inverse=True)
        inv = inv.reshape(-1)
        tot = np.bincount(inv, weights=incl[nodes])
        cnt = np.bincount(inv, weights=tree.excl["calls"][nodes].astype(np.float64))
        for i in np.argsort(-tot, kind="stable")[:top].tolist():
            members = nodes[inv == i]
            members = members[np.argsort(-incl[members], kind="stable")][:paths]
            lab = int(uniq[i]) // len(CtxKind)
            k = CtxKind(int(uniq[i]) % len(CtxKind))
            out.append(
                HotSpot(
                    name=index.labels[lab],
                    kind="copy" if k == CtxKind.COPY else kname,
                    value=float(tot[i]),
                    calls=int(cnt[i]),
                    paths=[
                        CallPath(short_path(index, int(m)), float(incl[m]), int(m))
                        for m in members.tolist()
                    ],
                )
            )
    del calls
    return out
