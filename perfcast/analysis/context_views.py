"""Views of a calling-context tree: nodes elided or focused, hot spots bottom-up, and the
module / source line / op that name where a node sits."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from perfcast.analysis.context import (
    KIND_NAMES,
    LEVEL_TEXT,
    CompiledCode,
    ContextIndex,
    ContextTree,
    Coverage,
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
        cpu_self_ns=index.cpu_self_ns,
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


# An nn.Module scope as the profiler names it: the class and the instance's number.
_MODULE_INSTANCE = re.compile(r"^(nn\.Module: .+?)_\d+$")
FOLD_MIN = 3  # siblings of one module class folded into one node from this many on


def fold_repeated(tree: ContextTree, min_count: int = FOLD_MIN) -> tuple[ContextTree, int]:
    """The tree with sibling instances of one module class (`Qwen3DecoderLayer_0` ...
    `_35` under one parent) folded into one node, `nn.Module: Qwen3DecoderLayer x36`, when
    there are at least `min_count` of them; their subtrees merge the same way, level by
    level. Times add up; nothing is dropped. Returns the tree and how many nodes folded."""
    folded_total = 0
    for _ in range(32):  # one level of nesting per pass; a tree is not deeper than this
        index = tree.index
        labels = list(index.labels)
        cls_of_label = np.full(len(labels), -1, dtype=np.int64)
        cls_names: dict[str, int] = {}
        for i, text in enumerate(labels):
            m = _MODULE_INSTANCE.match(text)
            if m:
                cls_of_label[i] = cls_names.setdefault(m.group(1), len(cls_names))
        node_cls = cls_of_label[index.label.astype(np.int64)]
        node_cls[0] = -1
        cand = np.flatnonzero(node_cls >= 0)
        if cand.size == 0:
            break
        key = np.stack([index.parent[cand].astype(np.int64), node_cls[cand]], axis=1)
        _, group, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
        group = group.reshape(-1)
        fold = counts[group] >= min_count
        if not fold.any():
            break
        # Only the outermost foldable groups this pass: an inner group counted per parent
        # now would be labelled with one block's count once the blocks merge (Linear ×3
        # holding 9); it folds in the next pass, among all its merged siblings.
        folds = np.zeros(len(index), dtype=bool)
        folds[cand[fold]] = True
        above = _propagate_down(index.parent, index.level_start, folds)
        inner = above[np.maximum(index.parent[cand].astype(np.int64), 0)] > 0
        fold &= ~inner  # the outermost foldable groups are never inner: some stay
        names = {v: k for k, v in cls_names.items()}
        new_label = index.label.astype(np.int64).copy()
        # One id per text across passes too: a group folded in an earlier pass and its
        # twin folded now must stay one label (`sites` counts distinct labels as instances).
        interned = {text: i for i, text in enumerate(labels)}
        for node, cls, n in zip(
            cand[fold].tolist(), node_cls[cand[fold]].tolist(), counts[group[fold]].tolist()
        ):
            text = f"{names[cls]} ×{n}"
            if text not in interned:
                interned[text] = len(labels)
                labels.append(text)
            new_label[node] = interned[text]
        folded_total += int(fold.sum())
        relabeled = ContextIndex(**{**index.__dict__, "labels": labels, "label": new_label})
        tree = project(
            ContextTree(**{**tree.__dict__, "index": relabeled}),
            np.ones(len(index), dtype=bool),
        )
    return tree, folded_total


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
    from perfcast.errors import OptionError

    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise OptionError(f"bad regular expression {pattern!r}: {exc}") from None
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
    path: str  # the place: module (class), user source line and op, or a condensed path
    value: float
    node: int  # a node of the tree on that path (-1 when it stands for a group of them)


@dataclass
class HotSpot:
    name: str
    kind: str  # "kernel", "copy", "op"
    value: float  # of the metric, over every path (an op's less the ops listed inside it)
    calls: int
    paths: list[CallPath]


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


@dataclass
class Site:
    """A place in the program: the module (class, and how many instances), the line of the
    user's code, the op it called, and how much of something lands there."""

    module: str | None
    source: str | None
    op: str | None
    path: str  # the condensed call path of its largest node
    value: float
    share: float  # of the positive total

    def text(self) -> str:
        return " · ".join(x for x in (self.module, self.source, self.op) if x) or self.path


_INSTANCE = re.compile(r"_\d+$")


def sites(
    index: ContextIndex, weights: np.ndarray, top: int = 5, min_share: float = 0.01
) -> list[Site]:
    """The `top` places with the most (positive) `weights`, a per-node exclusive measure,
    grouped by (module class, user source line, op): the same line in twelve instances of
    a layer is one site. Sites under `min_share` of the total are left out."""
    nodes = np.flatnonzero(weights > 0)
    if nodes.size == 0:
        return []
    frame = np.where(index.user_frame[nodes] >= 0, index.user_frame[nodes], index.frame[nodes])
    lab = index.label.astype(np.int64)
    big = len(index.labels) + 1
    # Scopes by class: "nn.Module: TimesformerLayer_3" -> "TimesformerLayer".
    scope = np.where(index.module[nodes] >= 0, index.module[nodes], index.scope[nodes])
    scope_lab = np.where(scope >= 0, lab[np.maximum(scope, 0)], -1)
    classes: dict[str, int] = {}
    cls_of = {
        int(m): classes.setdefault(_INSTANCE.sub("", index.labels[int(m)]), len(classes))
        for m in np.unique(scope_lab[scope_lab >= 0]).tolist()
    }
    scope_key = np.array([cls_of.get(int(m), -1) for m in scope_lab.tolist()], np.int64) + 1

    def key_of(col: np.ndarray) -> np.ndarray:
        return np.where(col >= 0, lab[np.maximum(col, 0)], -1) + 1

    key = (scope_key * big + key_of(frame)) * big + key_of(index.first_op[nodes])
    _, inv = np.unique(key, return_inverse=True)
    inv = inv.reshape(-1)
    tot = np.bincount(inv, weights=weights[nodes])
    gross = float(tot.sum())
    out = []
    for i in np.argsort(-tot, kind="stable")[:top].tolist():
        share = float(tot[i]) / gross
        if share < min_share:
            break
        members = nodes[inv == i]
        biggest = int(members[np.argmax(weights[members])])
        module, source, op = site_parts(index, biggest)
        instances = np.unique(scope_lab[inv == i])
        if module is not None and instances.size > 1:
            module = f"{_INSTANCE.sub('', module)} ({instances.size} instances)"
        out.append(Site(module, source, op, short_path(index, biggest), float(tot[i]), share))
    return out


@dataclass
class MoreSpots:
    """What a bottom-up list left out past its `top`: how many kernels (and copies) or
    ops, and their time."""

    kind: str  # "kernel" (kernels and copies) or "op"
    count: int
    value: float


def hot_spots(
    tree: ContextTree, metric: str = "gpu_ns", top: int = 10, paths: int = 3
) -> list[HotSpot]:
    """Bottom-up: the kernels (and copies) and the ops called from a line of code (the
    outermost op below a frame or scope) with the most `metric`, each with the `paths`
    call sites that reach it the most. Each list adds up to at most the root's `metric`."""
    return _hot_spots(tree, metric, top, paths)[0]


def _hot_spots(
    tree: ContextTree, metric: str, top: int, paths: int
) -> tuple[list[HotSpot], list[MoreSpots]]:
    """`hot_spots`, and per list what `top` left out."""
    index = tree.index
    kind = index.kind
    incl = tree.incl[metric].astype(np.float64)
    called = (kind == CtxKind.OP) & (index.first_op == np.arange(len(index)))
    # An op called from a line inside another one (a custom op's Python body, the ops of a
    # compiled region, a recursive call) keeps its own time; the outer op keeps the rest,
    # so no time is listed twice and the ops add up to at most the root's time.
    outer = _propagate_down(index.parent, index.level_start, called)[np.maximum(index.parent, 0)]
    nested = np.flatnonzero(called & (index.parent >= 0) & (outer >= 0))
    op_value = incl.copy()
    np.subtract.at(op_value, outer[nested], incl[nested])
    out: list[HotSpot] = []
    more: list[MoreSpots] = []
    groups = (
        ("kernel", np.isin(kind, [CtxKind.KERNEL, CtxKind.COPY]), incl),
        ("op", called, op_value),
    )
    for kname, mask, value in groups:
        nodes = np.flatnonzero(mask & (value > 0))
        if nodes.size == 0:
            continue
        key = index.label[nodes].astype(np.int64) * len(CtxKind) + kind[nodes]
        uniq, inv = np.unique(key, return_inverse=True)
        inv = inv.reshape(-1)
        tot = np.bincount(inv, weights=value[nodes])
        cnt = np.bincount(inv, weights=tree.excl["calls"][nodes].astype(np.float64))
        ranked = np.argsort(-tot, kind="stable")
        if ranked.size > top:
            rest = ranked[max(top, 0) :]
            more.append(MoreSpots(kname, int(rest.size), float(tot[rest].sum())))
        for i in ranked[:top].tolist():
            members = nodes[inv == i]
            w = np.zeros(len(index), dtype=np.float64)
            # A kernel's place is its parent's (the op that launched it), not the kernel.
            at = index.parent[members] if kname == "kernel" else members
            np.add.at(w, at, value[members])
            lab = int(uniq[i]) // len(CtxKind)
            k = CtxKind(int(uniq[i]) % len(CtxKind))
            out.append(
                HotSpot(
                    name=index.labels[lab],
                    kind="copy" if k == CtxKind.COPY else kname,
                    value=float(tot[i]),
                    calls=int(cnt[i]),
                    paths=[
                        CallPath(s.text(), s.value, -1)
                        for s in sites(index, w, top=paths, min_share=0.0)
                    ],
                )
            )
    return out, more


# ---------------------------------------------------------------------------------------------
# A tree as rows to show: what `perfcast tree` prints and --json writes


@dataclass
class TreeRow:
    id: int  # node of the tree
    parent: int  # row id of its parent (-1 for the root)
    depth: int
    name: str
    kind: str
    incl: dict[str, float]
    excl: dict[str, float]
    hidden: int = 0  # children below the threshold or the depth limit, not shown
    hidden_value: float = 0.0  # their `metric`, summed


def _children(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR children lists: the children of node i are order[start[i]:start[i + 1]]."""
    n = parent.shape[0]
    has = parent >= 0
    kids = np.flatnonzero(has)
    order = kids[np.argsort(parent[kids], kind="stable")]
    start = np.searchsorted(parent[order], np.arange(n + 1))
    return order, start


def tree_rows(
    tree: ContextTree,
    metric: str,
    depth: int | None = None,
    min_pct: float = 1.0,
    metrics: tuple[str, ...] | None = None,
    max_rows: int = 100_000,
) -> list[TreeRow]:
    """The nodes to show, depth first, children by |metric| (largest first): those whose
    |inclusive metric| is at least `min_pct` % of the total and at most `depth` levels
    below the root. The total is the root's value, or for a signed metric (a gain, which
    can be negative at some nodes) the sum of the absolute exclusive values."""
    index = tree.index
    incl = tree.incl[metric].astype(np.float64)
    excl = tree.excl[metric].astype(np.float64)
    total = float(np.abs(excl).sum()) if (excl < 0).any() else float(incl[0])
    floor = max(total * min_pct / 100.0, 0.0)
    names = metrics or tuple(tree.incl)
    order, start = _children(index.parent)
    mag = np.abs(incl)
    rows: list[TreeRow] = []

    def row(node: int, parent_row: int, d: int) -> TreeRow:
        return TreeRow(
            id=node,
            parent=parent_row,
            depth=d,
            name=index.name(node),
            kind=KIND_NAMES[CtxKind(int(index.kind[node]))],
            incl={k: float(tree.incl[k][node]) for k in names},
            excl={k: float(tree.excl[k][node]) for k in names},
        )

    stack: list[tuple[int, int, int]] = [(0, -1, 0)]
    while stack and len(rows) < max_rows:
        node, parent_row, d = stack.pop()
        r = row(node, parent_row, d)
        rows.append(r)
        me = len(rows) - 1
        kids = order[start[node] : start[node + 1]]
        if kids.size == 0:
            continue
        kids = kids[np.argsort(-mag[kids], kind="stable")]
        shown = (mag[kids] >= floor) & (mag[kids] > 0)
        if depth is not None and d >= depth:
            shown[:] = False
        hidden = kids[~shown & (mag[kids] > 0)]
        r.hidden = int(hidden.size)
        r.hidden_value = float(incl[hidden].sum())
        for k in kids[shown][::-1].tolist():
            stack.append((k, me, d + 1))
    return rows


@dataclass
class TreeResult:
    """What `perfcast tree` shows: the rows of the top-down tree and the bottom-up hot
    spots, with what the trace allowed (level, coverage) and what was selected."""

    paths: list[str]
    selection: dict[str, object]
    steps: int
    level: str
    level_text: str
    metric: str
    min_pct: float
    depth: int | None
    library_frames_hidden: int  # frame nodes elided (PyTorch, interpreter, stdlib)
    coverage: Coverage
    unattributed_pct: float
    unattributed_launched_pct: float
    compiled: CompiledCode | None
    notes: list[str]
    rows: list[TreeRow]
    bottom_up: list[HotSpot] | None = None
    instances_folded: int = 0  # module instances folded by class (fold_repeated)
    bottom_up_more: list[MoreSpots] = field(default_factory=list)  # past --top, per list


# The tree attributes the trace's own times: its CPU column is the profiled run's.
CPU_AS_TRACED = (
    "CPU ms are as traced, the profiler's own cost per op included (summary, whatif and "
    "advise take it out); GPU ms are the kernels' own"
)


def tree_result(
    tree: ContextTree,
    metric: str | None = None,
    depth: int | None = None,
    min_pct: float = 1.0,
    focus_re: str | None = None,
    all_frames: bool = False,
    bottom_up: bool = False,
    top: int = 10,
    fold: bool = True,
) -> TreeResult:
    """The view `perfcast tree` prints: library frames elided unless `all_frames`, only
    the paths through `focus_re` if given, repeated module instances folded by class
    unless `fold` is False; `metric` defaults to GPU time when there is any, else CPU
    time."""
    if metric is None:
        metric = "gpu_ns" if tree.coverage.gpu_ns > 0 else "cpu_ns"
    if focus_re:
        tree = focus(tree, focus_re)
    folded = 0
    if fold:
        tree, folded = fold_repeated(tree)
    hidden = 0
    if not all_frames:
        lib = library_frames(tree.index)
        hidden = int(lib.sum())
        if hidden:
            tree = project(tree, ~lib)
    rows = tree_rows(tree, metric, depth=depth, min_pct=min_pct)
    spots, more = _hot_spots(tree, metric, top, 3) if bottom_up else (None, [])
    cov = tree.coverage
    return TreeResult(
        paths=sorted({info.path for info in tree.index.table.ranks}),
        selection=dict(tree.selection),
        steps=tree.steps,
        level=tree.level,
        level_text=LEVEL_TEXT[tree.level],
        metric=metric,
        min_pct=min_pct,
        depth=depth,
        library_frames_hidden=hidden,
        coverage=cov,
        unattributed_pct=cov.unattributed_pct,
        unattributed_launched_pct=cov.unattributed_launched_pct,
        compiled=tree.compiled,
        notes=[*tree.notes, CPU_AS_TRACED],
        rows=rows,
        bottom_up=spots,
        instances_folded=folded,
        bottom_up_more=more,
    )
