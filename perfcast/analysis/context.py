"""Calling-context tree: GPU and CPU time attributed to where in the program it came from.

A path runs from the Python frames (`with_stack=True`), through `nn.Module` scopes
(`with_modules=True`) and `record_function` ranges, to the ATen op, the runtime call and
the kernel or copy it launched. Events that share a call path share a node (call paths,
not events, as HPCToolkit's and pyinstrument's trees do), so a loop of 1,000 identical
steps is one path, and a recursive function keeps one node per depth of recursion.

How the path of an event is found:
  - CPU events (frames, scopes, ops, runtime calls) nest by time on their thread
    (`EventTable.parent`); `ProfilerStep#N` ranges are skipped, so steps merge.
  - GPU work hangs under the runtime call that launched it (correlation ids).
  - Backward ops run on autograd's own thread, which has no Python frames. Each one
    (with its `evaluate_function` wrapper) is attached to the forward op it differentiates
    (fwdbwd flows or sequence numbers), so a backward kernel reaches the model line that
    created it.
    Other work of that thread (gradient accumulation, DDP's all-reduce hooks) hangs under
    the Python `backward()` call that waited for it.
  - GPU work whose launching call is not in the trace, and step time outside every recorded
    event, go under nodes that say so.

A Python frame is named as the profiler records it, "file.py(84): forward", where 84 is the
first line of the function (the profiler records function entries, not the line of each
call); the module scope, the next frame and the op below it narrow the place down.

The structure (`ContextIndex`) is built once per table; a `ContextTree` adds the metrics of
a selection of events (a rank, a phase, a step). Everything is vectorized over rows with
NumPy: the only Python loops run over distinct names or over tree depths.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from perfcast.analysis.common import NO_LAUNCH, first_launch_correlation
from perfcast.analysis.convolution import CONVOLUTION_OPS, conv_cost, parse_concrete
from perfcast.analysis.roofline import (
    FUSED_ATTENTION,
    MATRIX_PRODUCTS,
    attention_flops,
    matrix_product_cost,
)
from perfcast.arrays import combine_codes, split_by
from perfcast.errors import OptionError
from perfcast.events import NONE, EventTable, Kind
from perfcast.frames import Tables
from perfcast.graph.phases import PHASE_LABELS, Phase, event_phases
from perfcast.ingest.input_dims import parse_input_dims, tensor_shapes


class CtxKind(enum.IntEnum):
    """What a node of the tree stands for."""

    ROOT = 0
    RANK = 1
    FRAME = 2  # a Python frame: "file.py(84): forward"
    MODULE = 3  # an nn.Module scope: "nn.Module: Linear_0"
    ANNOTATION = 4  # a record_function range
    OP = 5  # an ATen (or other CPU) op
    RUNTIME = 6  # a runtime or driver call
    KERNEL = 7
    COPY = 8  # memcpy or memset
    SPECIAL = 9  # a node perfcast adds to say something (e.g. work with no launch)


KIND_NAMES = {k: k.name.lower() for k in CtxKind}

METRICS = ("gpu_ns", "cpu_ns", "calls", "launches", "kernels", "copies", "flops", "bytes")

NO_LAUNCH_LABEL = "[GPU work whose launching call is not in the trace]"
EARLY_LAUNCH_LABEL = "[GPU work launched before the trace began]"
STEP_GAP_LABEL = "[step time outside any recorded event]"

# Levels of context a trace allows, best first.
LEVEL_PYTHON = "python"  # Python frames (with_stack=True)
LEVEL_MODULE = "module"  # nn.Module scopes or record_function ranges, no frames
LEVEL_OP = "op"  # op nesting only
LEVEL_TEXT = {
    LEVEL_PYTHON: "Python frames (with_stack=True)",
    LEVEL_MODULE: "module scopes and record_function ranges (no Python frames: "
    "record with with_stack=True for source lines)",
    LEVEL_OP: "op nesting only (no Python frames or module scopes: record with "
    "with_stack=True and with_modules=True for source lines)",
}

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<func>.+)$")
_EVALUATE = "autograd::engine::evaluate_function: "
_STEP = "ProfilerStep#"
# Frames of the interpreter, PyTorch, the standard library and perfcast's capture: hidden in
# the terminal view by default, so the user's own code and the model code stand out.
_LIBRARY_FILE = re.compile(
    r"^(?:torch/|<|threading\.py|multiprocessing/|runpy\.py|importlib/|contextlib\.py"
    r"|functools\.py|asyncio/|concurrent/|selectors\.py|queue\.py|abc\.py|typing\.py"
    r"|enum\.py|copy\.py|weakref\.py|_weakrefset\.py|site\.py|codecs\.py|traceback\.py"
    r"|warnings\.py|inspect\.py|dataclasses\.py|collections/|json/|logging/|tqdm/"
    r"|(?:.*/)?(?:site|dist)-packages/torch/"
    # perfcast's own capture (`perfcast profile` runs the script): its console script, the
    # CLI and the step hooks, above and inside the user's code.
    r"|(?:.*/)?perfcast\(\d+\)|(?:.*/)?perfcast/(?:cli/|capture/|__main__\.py))"
)
# Inductor's generated kernels: triton_{poi,red,per,tem,for}_fused_<ops>_<n>.
_INDUCTOR = re.compile(r"triton_(poi|red|per|tem|for)_(?:fused_)?(?P<ops>.*?)(?:_\d+)?$")
_COMPILED_REGION = re.compile(r"^Torch-Compiled Region|^## Call CompiledFxGraph|CompiledFunction")


def normalize_label(name: str) -> str:
    """The name a node shows: object addresses dropped, so repeated calls share a path."""
    return _ADDRESS.sub("", name)


def parse_frame(label: str) -> tuple[str, int, str] | None:
    """(file, line, function) of a Python frame label "file.py(84): forward", else None."""
    m = _FRAME.match(label)
    if m is None:
        return None
    return m.group("file"), int(m.group("line")), m.group("func")


def is_library_frame(label: str) -> bool:
    """A frame of PyTorch, the interpreter or the standard library (not the user's code)."""
    return bool(_LIBRARY_FILE.match(label))


# Op names with underscores that Inductor's kernel names contain (the name is the only
# source, and it joins op names with underscores too).
_COMPOUND_OPS = (
    "_unsafe_view",
    "_to_copy",
    "native_layer_norm",
    "native_batch_norm",
    "native_dropout",
    "log_softmax",
    "clamp_min",
    "clamp_max",
    "index_put",
    "index_select",
    "embedding_dense",
    "max_pool2d",
    "avg_pool2d",
    "new_zeros",
    "new_ones",
    "full_like",
    "zeros_like",
    "ones_like",
    "constant_pad_nd",
    "scatter_add",
    "slice_scatter",
    "select_scatter",
    "masked_fill",
    "leaky_relu",
    "hardtanh",
    "group_norm",
    "layer_norm",
    "batch_norm",
)


def inductor_fused_ops(name: str) -> list[str] | None:
    """The ops an Inductor kernel name says it fused ("triton_red_fused_add_mean_0" ->
    ["add", "mean"]), or None for other kernels. The name joins op names with underscores,
    so ops with underscores are recognized from a list; the kernel name is the only source."""
    m = _INDUCTOR.search(name)
    if m is None:
        return None
    text = m.group("ops")
    out: list[str] = []
    while text:
        text = text.lstrip("_")
        hit = next(
            (
                op
                for op in _COMPOUND_OPS
                if text == op.lstrip("_") or text.startswith(op.lstrip("_") + "_")
            ),
            None,
        )
        if hit is not None:
            out.append(hit)
            text = text[len(hit.lstrip("_")) :]
            continue
        token, _, text = text.partition("_")
        if token and not token.isdigit():
            out.append(token)
    return out


# ---------------------------------------------------------------------------------------------
# Tree construction helpers (generic over "items": event rows or the nodes of another tree)


def _depths(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depth of each item under the forest `parent` (NONE at roots), by pointer jumping.

    Returns (depth, cyclic): items on or under a cycle never reach a root; they are flagged
    and their depth is meaningless.
    """
    n = parent.shape[0]
    depth = (parent >= 0).astype(np.int64)
    nxt = parent.astype(np.int64)
    for _ in range(64):  # 2**64 levels: more than any tree; a cycle keeps going
        live = np.flatnonzero(nxt >= 0)
        if live.size == 0:
            return depth, np.zeros(n, dtype=bool)
        up = nxt[live]
        depth[live] += depth[up]
        nxt[live] = nxt[up]
    return depth, nxt >= 0


@dataclass
class _Trie:
    parent: np.ndarray  # node -> parent node (NONE for the root)
    label: np.ndarray  # node -> label index
    kind: np.ndarray  # node -> CtxKind
    level_start: np.ndarray  # nodes of depth d are level_start[d]:level_start[d+1]
    item_node: np.ndarray  # item -> node


def _intern_paths(
    item_parent: np.ndarray,
    item_label: np.ndarray,
    item_kind: np.ndarray,
    item_depth: np.ndarray,
    top_node: np.ndarray,
    base: _Trie,
) -> _Trie:
    """Merge items into call-path nodes, one depth at a time.

    An item of depth 0 hangs under `top_node[item]` (a node of `base`, the levels above
    the items: the root, the rank nodes); a deeper item under its parent item's node. Two
    items with the same parent node, kind and label are one node. Node ids grow with depth,
    so a level is a contiguous range and sums run bottom-up level by level.
    """
    parent_l = [base.parent]
    label_l = [base.label]
    kind_l = [base.kind]
    starts = list(base.level_start[:-1].tolist())
    n_nodes = int(base.parent.shape[0])
    item_node = np.full(item_parent.shape[0], NONE, dtype=np.int64)
    if item_parent.size == 0:
        return _Trie(
            base.parent, base.label, base.kind, base.level_start.copy(), item_node.astype(np.int32)
        )
    order = np.argsort(item_depth, kind="stable")
    bounds = np.searchsorted(item_depth[order], np.arange(int(item_depth.max()) + 2))
    n_labels = int(max(item_label.max(), base.label.max() if base.label.size else 0)) + 1
    k = len(CtxKind)
    base_levels = len(starts)
    for d in range(bounds.size - 1):
        items = order[bounds[d] : bounds[d + 1]]
        if items.size == 0:
            continue
        pnode = top_node[items].astype(np.int64) if d == 0 else item_node[item_parent[items]]
        key = (pnode * n_labels + item_label[items]) * k + item_kind[items]
        uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
        ids = n_nodes + np.arange(uniq.size)
        item_node[items] = ids[inv.reshape(-1)]
        parent_l.append(pnode[first])
        label_l.append(item_label[items][first])
        kind_l.append(item_kind[items][first])
        level = base_levels - 1 + d + 1  # the depth of these nodes in the tree
        while len(starts) <= level:
            starts.append(n_nodes)
        n_nodes += uniq.size
    starts.append(n_nodes)
    return _Trie(
        parent=np.concatenate(parent_l).astype(np.int32),
        label=np.concatenate(label_l).astype(np.int32),
        kind=np.concatenate(kind_l).astype(np.int8),
        level_start=np.array(starts, dtype=np.int64),
        item_node=item_node.astype(np.int32),
    )


def _propagate_down(
    trie_parent: np.ndarray, level_start: np.ndarray, own: np.ndarray
) -> np.ndarray:
    """Per node, the nearest node at or above it where `own` is set (NONE if none)."""
    out = np.where(own, np.arange(own.shape[0]), NONE).astype(np.int64)
    for d in range(1, level_start.shape[0] - 1):
        a, b = int(level_start[d]), int(level_start[d + 1])
        if a == b:
            continue
        seg = out[a:b]
        inherit = seg < 0
        seg[inherit] = out[trie_parent[a:b][inherit]]
    return out


def _sum_up(trie_parent: np.ndarray, level_start: np.ndarray, excl: np.ndarray) -> np.ndarray:
    """Inclusive sums: each node plus everything below it."""
    incl = excl.astype(np.float64 if excl.dtype.kind == "f" else np.int64, copy=True)
    for d in range(level_start.shape[0] - 2, 0, -1):
        a, b = int(level_start[d]), int(level_start[d + 1])
        if a == b:
            continue
        pa, pb = int(level_start[d - 1]), int(level_start[d])
        add = np.bincount(trie_parent[a:b] - pa, weights=incl[a:b], minlength=pb - pa)
        incl[pa:pb] += add.astype(incl.dtype)
    return incl


def node_context(
    parent: np.ndarray,
    level_start: np.ndarray,
    kind: np.ndarray,
    label: np.ndarray,
    labels: list[str],
) -> dict[str, np.ndarray]:
    """Per node, the nearest frame, user frame, module, scope and first op (ContextIndex)."""
    user = np.zeros(kind.shape[0], dtype=bool)
    frames = np.flatnonzero(kind == CtxKind.FRAME)
    if frames.size:
        labs = np.unique(label[frames])
        lib = np.zeros(len(labels), dtype=bool)
        lib[labs] = [is_library_frame(labels[i]) for i in labs.tolist()]
        user[frames] = ~lib[label[frames]]
    is_scope = (kind == CtxKind.MODULE) | (kind == CtxKind.ANNOTATION)
    # The op a line of code called: an op with no op between it and the nearest frame or
    # scope above it (so aten::linear, not the aten::addmm inside it).
    first_op = np.where(kind == CtxKind.OP, np.arange(kind.shape[0]), NONE).astype(np.int64)
    reset = (kind == CtxKind.FRAME) | is_scope
    for d in range(1, level_start.shape[0] - 1):
        a, b = int(level_start[d]), int(level_start[d + 1])
        if a == b:
            continue
        up = first_op[parent[a:b]]
        seg = first_op[a:b]
        take = ~reset[a:b] & (up >= 0)
        seg[take] = up[take]
    return {
        "frame": _propagate_down(parent, level_start, kind == CtxKind.FRAME),
        "user_frame": _propagate_down(parent, level_start, user),
        "module": _propagate_down(parent, level_start, kind == CtxKind.MODULE),
        "scope": _propagate_down(parent, level_start, is_scope),
        "first_op": first_op,
    }


# ---------------------------------------------------------------------------------------------
# The structure


@dataclass(repr=False)
class ContextIndex:
    """The calling-context tree of a table: its nodes and which node each event belongs to.

    Node 0 is the root. `row_node[r]` is the node of event row r: its own node for events on
    a path, the node of its nearest enclosing one for the rest (a ProfilerStep range, an
    event of a kind the tree leaves out), NONE for rows outside every thread (instants).
    """

    table: EventTable
    labels: list[str]
    parent: np.ndarray
    label: np.ndarray
    kind: np.ndarray
    level_start: np.ndarray
    row_node: np.ndarray
    row_parent: np.ndarray  # per row: its parent on the tree (after backward re-rooting)
    on_tree: np.ndarray  # per row: has a node of its own (not borrowed from an enclosing row)
    cpu_self_ns: np.ndarray  # per row: CPU time in it and in none of its children (cpu_self)
    level: str
    backward_attached: int  # backward ops attached to their forward op
    handed_to_caller: int  # other autograd-thread work attached to the backward() call
    # Per node, the nearest node at or above it (NONE if none) that is:
    frame: np.ndarray  # a Python frame
    user_frame: np.ndarray  # a frame of the user's code (not PyTorch or the interpreter)
    module: np.ndarray  # an nn.Module scope
    scope: np.ndarray  # an nn.Module scope or a record_function range
    first_op: np.ndarray  # the outermost op below the nearest frame or scope
    rank_nodes: dict[int, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.parent.shape[0])

    def __eq__(self, other: object) -> bool:
        # The generated one compared arrays into arrays: `a == b` raised ValueError.
        from perfcast.arrays import same_value

        return same_value(self, other)

    def __repr__(self) -> str:  # the dataclass's would print every array and the table
        return f"ContextIndex({len(self):,} nodes, level={self.level!r})"

    def name(self, node: int) -> str:
        return self.labels[int(self.label[node])]

    def path(self, node: int) -> list[int]:
        """Nodes from the root's child down to `node`."""
        out = []
        while node > 0:
            out.append(node)
            node = int(self.parent[node])
        return out[::-1]


def _tree_kinds(table: EventTable, labels_of_name: np.ndarray, is_module: np.ndarray) -> np.ndarray:
    """CtxKind per row, or -1 for rows the tree leaves out."""
    lut = np.full(max(Kind) + 1, -1, dtype=np.int8)
    lut[Kind.PYTHON_FUNCTION] = CtxKind.FRAME
    lut[Kind.USER_ANNOTATION] = CtxKind.ANNOTATION
    lut[Kind.CPU_OP] = CtxKind.OP
    lut[Kind.RUNTIME] = CtxKind.RUNTIME
    lut[Kind.DRIVER] = CtxKind.RUNTIME
    lut[Kind.KERNEL] = CtxKind.KERNEL
    lut[Kind.MEMCPY] = CtxKind.COPY
    lut[Kind.MEMSET] = CtxKind.COPY
    kind = lut[table.kind]
    # 2021-era traces record their ranges ("Optimizer.step#SGD.step") as CPU ops.
    kind[table.annotation_mask()] = CtxKind.ANNOTATION
    module_rows = (table.kind == Kind.PYTHON_FUNCTION) & is_module[table.name]
    kind[module_rows] = CtxKind.MODULE
    return kind


def _climb_to(parent: np.ndarray, start: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """From each start row, the nearest row at or above it (by `parent`) where `wanted`."""
    cur = start.astype(np.int64).copy()
    for _ in range(4096):
        bad = np.flatnonzero((cur >= 0) & ~wanted[np.maximum(cur, 0)])
        if bad.size == 0:
            break
        cur[bad] = parent[cur[bad]]
    return cur


_BACKWARD_CALL = re.compile(
    r"^torch/(?:_tensor\.py|autograd/[\w/]+\.py)\(\d+\): (?:backward|_engine_run_backward|grad)$"
)


def _attach_to_caller(
    table: EventTable, kind: np.ndarray, on_tree: np.ndarray, row_parent: np.ndarray
) -> int:
    """Hang top-level CPU work of autograd's threads (those that run evaluate_function ops)
    under the Python `backward()` frame whose time span contains it (the innermost such
    frame of the same rank). Returns how many rows moved."""
    if len(table) == 0:
        return 0
    is_call = np.fromiter(
        (bool(_BACKWARD_CALL.match(s)) for s in table.names), dtype=bool, count=len(table.names)
    )
    calls = np.flatnonzero((kind == CtxKind.FRAME) & is_call[table.name])
    if calls.size == 0:
        return 0
    orphan = np.flatnonzero(
        on_tree
        & (row_parent < 0)
        & np.isin(kind, [CtxKind.OP, CtxKind.ANNOTATION, CtxKind.RUNTIME])
    )
    is_eval = np.fromiter(
        (s.startswith(_EVALUATE) for s in table.names), dtype=bool, count=len(table.names)
    )
    ev = np.flatnonzero(is_eval[table.name])
    engine = set(zip(table.rank[ev].tolist(), table.pid[ev].tolist(), table.tid[ev].tolist()))
    keys = zip(table.rank[orphan].tolist(), table.pid[orphan].tolist(), table.tid[orphan].tolist())
    orphan = orphan[np.fromiter((k in engine for k in keys), dtype=bool, count=orphan.size)]
    if orphan.size == 0:
        return 0
    end = table.ts + table.dur
    # Sort the calls by (rank, start); look up each orphan's last call starting before it.
    order = calls[np.lexsort((table.ts[calls], table.rank[calls]))]
    moved = 0
    for r in np.unique(table.rank[orphan]).tolist():
        oc = order[table.rank[order] == r]
        orr = orphan[table.rank[orphan] == r]
        if oc.size == 0:
            continue
        pos = np.searchsorted(table.ts[oc], table.ts[orr], side="right") - 1
        cand = np.where(pos >= 0, oc[np.maximum(pos, 0)], NONE).astype(np.int64)
        # The latest call to start may have ended; an enclosing backward frame may not.
        for _ in range(8):
            bad = (cand >= 0) & (end[np.maximum(cand, 0)] < end[orr])
            if not bad.any():
                break
            up = table.parent[cand[bad]].astype(np.int64)
            up = np.where((up >= 0) & is_call[table.name[np.maximum(up, 0)]], up, NONE)
            cand[bad] = up
        ok = (cand >= 0) & (end[np.maximum(cand, 0)] >= end[orr])
        row_parent[orr[ok]] = cand[ok]
        moved += int(ok.sum())
    return moved


def _hand_to_stack_caller(
    table: EventTable,
    kind: np.ndarray,
    row_parent: np.ndarray,
    rows: np.ndarray,
    pos: np.ndarray,
    item_parent: np.ndarray,
    item_label: np.ndarray,
    item_kind: np.ndarray,
    labels: list[str],
) -> int:
    """`_attach_to_caller` for 2021-era traces, whose frames come from "Call stack"
    arguments: no event spans the backward() call, only the ops it ran first on the calling
    thread (`_make_grads`) carry it in their stack, and autograd's thread runs no
    evaluate_function wrapper. Top-level work of the threads that run backward ops
    (gradient accumulation, AccumulateGrad) moves under the innermost backward-call frame
    of the last such op of its rank before it, while that op's thread has not moved on
    (blocked in backward(), it records nothing until the call returns). Changes
    `item_parent` (the first `rows.size` items are `rows`); returns how many items moved."""
    bwd = pos[table.fwd_bwd[:, 1]] if table.fwd_bwd.size else np.zeros(0, np.int64)
    bwd = bwd[bwd >= 0]
    if bwd.size == 0:
        return 0
    thread, _ = combine_codes(table.rank[rows], table.pid[rows], table.tid[rows])
    on_engine = np.isin(thread, thread[bwd])
    r_parent = row_parent[rows]
    r_kind = kind[rows]
    orphan = np.flatnonzero(
        (r_parent < 0)
        & (item_parent[: rows.size] < 0)
        & on_engine
        & np.isin(r_kind, [CtxKind.OP, CtxKind.ANNOTATION, CtxKind.RUNTIME])
    )
    stack = table.stack[rows]
    cand = np.flatnonzero((stack >= 0) & ~on_engine & (r_kind == CtxKind.OP))
    if orphan.size == 0 or cand.size == 0:
        return 0
    # Only the ops whose own stack holds a backward call (a few per step) are looked up.
    ids = np.unique(stack[cand])
    in_call = [
        any(_BACKWARD_CALL.match(_stack_label(x)) for x in table.names[i].split(";"))
        for i in ids.tolist()
    ]
    cand = cand[np.isin(stack[cand], ids[np.array(in_call, dtype=bool)])]
    is_call = np.fromiter(
        (bool(_BACKWARD_CALL.match(s)) for s in labels), dtype=bool, count=len(labels)
    )
    # Their innermost backward-call frame on the tree.
    callers: list[int] = []
    frames: list[int] = []
    for c in cand.tolist():
        up = int(item_parent[c])
        for _ in range(4096):
            if up < 0 or (item_kind[up] == CtxKind.FRAME and is_call[item_label[up]]):
                break
            up = int(item_parent[up])
        if up >= 0:
            callers.append(c)
            frames.append(up)
    if not callers:
        return 0
    call = np.array(callers, dtype=np.int64)
    call_frame = np.array(frames, dtype=np.int64)
    ts = table.ts[rows]
    end = ts + table.dur[rows]
    # Until the calling thread's next top-level event after the op.
    until = np.full(call.size, np.iinfo(np.int64).max, dtype=np.int64)
    tops = np.flatnonzero(r_parent < 0)
    for code, members in split_by(thread[tops], ts[tops]):
        mine = np.flatnonzero(thread[call] == code)
        if mine.size == 0:
            continue
        t_ts = ts[tops[members]]
        nxt = np.searchsorted(t_ts, end[call[mine]], side="left")
        ok = nxt < t_ts.size
        until[mine[ok]] = t_ts[nxt[ok]]
    moved = 0
    rank = table.rank[rows]
    for r in np.unique(rank[orphan]).tolist():
        mine = np.flatnonzero(rank[call] == r)
        if mine.size == 0:
            continue
        mine = mine[np.argsort(ts[call[mine]], kind="stable")]
        orr = orphan[rank[orphan] == r]
        at = np.searchsorted(ts[call[mine]], ts[orr], side="right") - 1
        pick = mine[np.maximum(at, 0)]
        hit = (at >= 0) & (ts[orr] < until[pick])
        item_parent[orr[hit]] = call_frame[pick[hit]]
        moved += int(hit.sum())
    return moved


CPU_KINDS_ARR = np.array(
    [Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON_FUNCTION, Kind.RUNTIME, Kind.DRIVER],
    dtype=np.int8,
)


# Where 2021-era stacks name a file by its absolute path, the part later PyTorch versions
# leave out of python_function names (they write "torch/nn/modules/module.py(1051): ...").
_INSTALL_PREFIX = re.compile(r"^.*/(?:site-packages|dist-packages|lib/python\d[\d.]*)/")


def _stack_label(frame: str) -> str:
    """A frame of a "Call stack" argument as the tree names it."""
    return normalize_label(_INSTALL_PREFIX.sub("", frame.strip()))


def _call_stack_items(
    table: EventTable,
    kind: np.ndarray,
    row_parent: np.ndarray,
    rows: np.ndarray,
    pos: np.ndarray,
    intern: Callable[[str], int],
    first_item: int,
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Python frames from 2021-era "Call stack" arguments, as tree items.

    Each outermost op or range with a stack (its parent on the tree is no op) hangs under
    the chain of its frames, outermost first; under a range that has a stack of its own,
    only the frames below the range's (the range was entered in the frames they share).
    Chains of the same frames under the same parent become one path of the tree.
    Returns the positions (among `rows`) of the items that move, their new parent items,
    and the frame items to append: (parent, label, rank), numbered from `first_item`.
    """
    stack = table.stack
    r_stack = stack[rows]
    r_parent = row_parent[rows]
    parent_kind = np.where(r_parent >= 0, kind[np.maximum(r_parent, 0)], -1)
    starts = np.flatnonzero(
        (r_stack >= 0)
        & ((kind[rows] == CtxKind.OP) | (kind[rows] == CtxKind.ANNOTATION))
        & (parent_kind != CtxKind.OP)
    )
    empty = np.zeros(0, np.int64)
    if starts.size == 0:
        return empty, empty, (empty, empty, empty)
    par = r_parent[starts].astype(np.int64)
    par_stack = np.where(par >= 0, stack[np.maximum(par, 0)], NONE).astype(np.int64)
    rank = table.rank[rows[starts]].astype(np.int64)
    key = np.stack([rank, par, r_stack[starts].astype(np.int64), par_stack], axis=1)
    uniq, inv = np.unique(key, axis=0, return_inverse=True)
    inv = inv.reshape(-1)

    frames_of: dict[int, list[int]] = {}

    def frames(s: int) -> list[int]:
        f = frames_of.get(s)
        if f is None:
            text = table.names[s].split(";")
            f = frames_of[s] = [intern(_stack_label(x)) for x in reversed(text) if x.strip()]
        return f

    new_parent = np.full(uniq.shape[0], NONE, dtype=np.int64)
    f_parent: list[int] = []
    f_label: list[int] = []
    f_rank: list[int] = []
    for u, (r, p, s, ps) in enumerate(uniq.tolist()):
        chain = frames(s)
        shared = 0
        if ps >= 0:
            outer = frames(ps)
            while shared < min(len(chain), len(outer)) and chain[shared] == outer[shared]:
                shared += 1
        up = int(pos[p]) if p >= 0 else NONE
        for label in chain[shared:]:
            f_parent.append(up)
            f_label.append(label)
            f_rank.append(r)
            up = first_item + len(f_parent) - 1
        new_parent[u] = up if len(chain) > shared else (int(pos[p]) if p >= 0 else NONE)
    return (
        starts,
        new_parent[inv],
        (
            np.array(f_parent, dtype=np.int64),
            np.array(f_label, dtype=np.int64),
            np.array(f_rank, dtype=np.int64),
        ),
    )


def cpu_self(table: EventTable) -> np.ndarray:
    """CPU time of each CPU event that none of its children covers (ns; 0 for other rows).

    Events nest by time on their thread, but not always cleanly: a record_function range
    and a Python frame that start together can overlap without one containing the other,
    and a child's time would then count twice. Each event's start is moved past the end of
    the siblings before it, and into its parent, so the self times of a thread add up to
    the time it spent inside its outermost events.
    """
    n = len(table)
    out = np.zeros(n, dtype=np.int64)
    rows = np.flatnonzero(np.isin(table.kind, CPU_KINDS_ARR)) if n else np.zeros(0, np.int64)
    if rows.size == 0:
        return out
    parent = table.parent
    start = table.ts.astype(np.int64).copy()
    end = table.ts + table.dur
    is_row = np.zeros(n, dtype=bool)
    is_row[rows] = True
    depth, _ = _depths(np.where(is_row, parent, NONE))
    # Siblings share a parent; outermost events are siblings on their thread.
    group = parent.astype(np.int64).copy()
    tops = rows[parent[rows] < 0]
    if tops.size:
        thread, _ = combine_codes(
            table.rank[tops].astype(np.int64), table.pid[tops], table.tid[tops]
        )
        group[tops] = -2 - thread
    order = rows[np.lexsort((table.ts[rows], group[rows], depth[rows]))]
    bounds = np.searchsorted(depth[order], np.arange(int(depth[rows].max()) + 2))
    for d in range(bounds.size - 1):
        lvl = order[bounds[d] : bounds[d + 1]]
        if lvl.size == 0:
            continue
        p = parent[lvl]
        nested = p >= 0
        start[lvl[nested]] = np.maximum(start[lvl[nested]], start[p[nested]])
        # Overlapping siblings are rare: only their groups need a running maximum.
        g = group[lvl]
        same = g[1:] == g[:-1]
        bad = np.flatnonzero(same & (end[lvl[:-1]] > start[lvl[1:]]))
        for gid in np.unique(g[bad + 1]).tolist():
            members = lvl[g == gid]
            reach = np.maximum.accumulate(end[members])
            start[members[1:]] = np.maximum(start[members[1:]], reach[:-1])
    eff = np.maximum(end - start, 0)
    eff[~is_row] = 0
    kids = rows[parent[rows] >= 0]
    covered = np.bincount(parent[kids], weights=eff[kids].astype(np.float64), minlength=n)
    out[rows] = np.maximum(eff[rows] - np.rint(covered[rows]).astype(np.int64), 0)
    return out


def build_index(table: EventTable) -> ContextIndex:
    """The calling-context tree of every rank in `table` (structure only)."""
    n = len(table)
    labels: list[str] = []
    label_index: dict[str, int] = {}

    def intern(s: str) -> int:
        i = label_index.get(s)
        if i is None:
            i = len(labels)
            labels.append(s)
            label_index[s] = i
        return i

    root_label = intern("all")
    # Per distinct name (not per event): its label, and whether it is a module or a step.
    name_label = np.fromiter(
        (intern(normalize_label(s)) for s in table.names), dtype=np.int32, count=len(table.names)
    )
    is_module = np.fromiter(
        (s.startswith("nn.Module: ") for s in table.names), dtype=bool, count=len(table.names)
    )
    is_step = np.fromiter(
        (s.startswith(_STEP) for s in table.names), dtype=bool, count=len(table.names)
    )
    is_evaluate = np.fromiter(
        (s.startswith(_EVALUATE) for s in table.names), dtype=bool, count=len(table.names)
    )
    kind = _tree_kinds(table, name_label, is_module) if n else np.zeros(0, np.int8)
    if n:
        kind[is_step[table.name] & (kind == CtxKind.ANNOTATION)] = -1
        kind[is_step[table.name] & (kind == CtxKind.OP)] = -1
    on_tree = kind >= 0

    # Parents on the tree: CPU rows by nesting on their thread, skipping rows the tree
    # leaves out; GPU rows under their launching call.
    parent = table.parent.astype(np.int64) if n else np.zeros(0, np.int64)
    row_parent = _climb_to(parent, parent, on_tree) if n else parent
    is_gpu = table.is_gpu() if n else np.zeros(0, bool)
    row_parent[is_gpu] = table.launch[is_gpu]
    # A launch link to a row off the tree (never seen, but cheap to guard) counts as none.
    linked = row_parent >= 0
    row_parent[linked & ~on_tree[np.maximum(row_parent, 0)]] = NONE

    # Backward ops: attach the op (or its evaluate_function wrapper) to its forward op.
    attached = 0
    pairs = table.fwd_bwd
    if pairs.size:
        fwd = pairs[:, 0].astype(np.int64)
        bwd = pairs[:, 1].astype(np.int64)
        up = parent[bwd]
        wrapped = (up >= 0) & (table.kind[np.maximum(up, 0)] == Kind.CPU_OP)
        wrapped &= is_evaluate[table.name[np.maximum(up, 0)]]
        moved = np.where(wrapped, up, bwd)
        ok = on_tree[moved] & on_tree[fwd] & (moved != fwd)
        moved, fwd = moved[ok], fwd[ok]
        _, first = np.unique(moved, return_index=True)
        moved, fwd = moved[first], fwd[first]
        saved = row_parent[moved].copy()
        row_parent[moved] = fwd
        # A forward op inside its own backward's subtree would make a cycle: undo those.
        for _ in range(8):
            _, cyclic = _depths(np.where(on_tree, row_parent, NONE))
            undo = cyclic[moved] & (row_parent[moved] == fwd)
            if not undo.any():
                break
            row_parent[moved[undo]] = saved[undo]
        attached = int((row_parent[moved] == fwd).sum())

    # Other work of autograd's thread (gradient accumulation, DDP's all-reduce hooks) has
    # no forward op: it runs on behalf of the backward() call that waits for it.
    handed = _attach_to_caller(table, kind, on_tree, row_parent)

    # Levels above the events: the root, and one node per rank when there are several.
    ranks = table.rank_ids()
    multi = len(ranks) > 1
    base_parent = [NONE]
    base_label = [root_label]
    base_kind = [int(CtxKind.ROOT)]
    rank_nodes: dict[int, int] = {}
    if multi:
        for r in ranks:
            rank_nodes[r] = len(base_parent)
            base_parent.append(0)
            base_label.append(intern(f"rank {r}"))
            base_kind.append(int(CtxKind.RANK))
    base = _Trie(
        parent=np.array(base_parent, dtype=np.int32),
        label=np.array(base_label, dtype=np.int32),
        kind=np.array(base_kind, dtype=np.int8),
        level_start=np.array([0, 1, len(base_parent)] if multi else [0, 1], dtype=np.int64),
        item_node=np.zeros(0, np.int32),
    )
    top_of_rank = np.zeros(max(ranks, default=0) + 1, dtype=np.int64)
    for r, node in rank_nodes.items():
        top_of_rank[r] = node

    rows = np.flatnonzero(on_tree)
    pos = np.full(n, NONE, dtype=np.int64)
    pos[rows] = np.arange(rows.size)
    item_parent = np.where(row_parent[rows] >= 0, pos[np.maximum(row_parent[rows], 0)], NONE)
    item_label = name_label[table.name[rows]].astype(np.int64)
    item_kind = kind[rows].astype(np.int64)
    # GPU work with no launch: under one node that says so, per rank.
    # GPU work with no launch: under a node that says why, per rank. Work whose correlation
    # id precedes every launch the trace recorded was launched before the trace began.
    no_launch = np.flatnonzero(is_gpu[rows] & (item_parent < 0))
    item_rank = table.rank[rows]
    stack_frames = 0
    if not (kind == CtxKind.FRAME).any() and (table.stack >= 0).any():
        moved_items, new_parent, frames = _call_stack_items(
            table, kind, row_parent, rows, pos, intern, item_parent.size
        )
        item_parent[moved_items] = new_parent
        item_parent = np.concatenate([item_parent, frames[0]])
        item_label = np.concatenate([item_label, frames[1]])
        item_kind = np.concatenate([item_kind, np.full(frames[0].size, int(CtxKind.FRAME))])
        item_rank = np.concatenate([item_rank, frames[2]])
        stack_frames = int(frames[0].size)
        handed += _hand_to_stack_caller(
            table, kind, row_parent, rows, pos, item_parent, item_label, item_kind, labels
        )
    if no_launch.size:
        g = rows[no_launch]
        first = first_launch_correlation(table)[table.rank[g]]
        corr = table.correlation[g]
        # A rank that recorded no launch at all lost its CPU side (as the advisor reads it):
        # its work was not launched before the trace, its launches are just not in it.
        early = (corr >= 0) & (first != NO_LAUNCH) & (corr < first)
        why = early.astype(np.int64)  # 0: not in the trace, 1: before the trace
        labs = np.array([intern(NO_LAUNCH_LABEL), intern(EARLY_LAUNCH_LABEL)], dtype=np.int64)
        key = table.rank[g].astype(np.int64) * 2 + why
        need, inv = np.unique(key, return_inverse=True)
        syn = item_parent.size + np.arange(need.size)  # after any frame items before them
        item_parent = np.concatenate([item_parent, np.full(need.size, NONE)])
        item_parent[no_launch] = syn[inv.reshape(-1)]
        item_label = np.concatenate([item_label, labs[need % 2]])
        item_kind = np.concatenate([item_kind, np.full(need.size, int(CtxKind.SPECIAL))])
        item_rank = np.concatenate([item_rank, need // 2])
    # Time in a ProfilerStep range outside every event it holds (Python code on a trace
    # without stacks, or idle): under a node that says so, not mixed into the root's own.
    off = np.flatnonzero(~on_tree & np.isin(table.kind, [Kind.CPU_OP, Kind.USER_ANNOTATION]))
    anc = _climb_to(parent, parent[off], on_tree) if off.size else np.zeros(0, np.int64)
    loose = off[anc < 0]
    gap_items = np.full(max(ranks, default=0) + 1, NONE, dtype=np.int64)
    if loose.size:
        need = np.unique(table.rank[loose])
        gap_items[need] = item_parent.size + np.arange(need.size)
        item_parent = np.concatenate([item_parent, np.full(need.size, NONE)])
        item_label = np.concatenate([item_label, np.full(need.size, intern(STEP_GAP_LABEL))])
        item_kind = np.concatenate([item_kind, np.full(need.size, int(CtxKind.SPECIAL))])
        item_rank = np.concatenate([item_rank, need])
    depth, cyclic = _depths(item_parent)
    if cyclic.any():  # not expected after the undo above; never loop forever on bad data
        item_parent[cyclic] = NONE
        depth, _ = _depths(item_parent)
    top_node = top_of_rank[item_rank] if multi else np.zeros(item_parent.size, np.int64)
    trie = _intern_paths(item_parent, item_label, item_kind, depth, top_node, base)

    row_node = np.full(n, NONE, dtype=np.int32)
    row_node[rows] = trie.item_node[: rows.size]
    # Rows off the tree (ProfilerStep ranges) take the node of their nearest enclosing row
    # on it, or the node for step time outside recorded events.
    if off.size:
        gap_node = trie.item_node[np.maximum(gap_items[table.rank[off]], 0)]
        row_node[off] = np.where(anc >= 0, row_node[np.maximum(anc, 0)], gap_node)

    ctx = node_context(trie.parent, trie.level_start, trie.kind, trie.label, labels)
    has_frames = bool((kind == CtxKind.FRAME).any() or stack_frames) if n else False
    has_scopes = (
        bool(((kind == CtxKind.MODULE) | (kind == CtxKind.ANNOTATION)).any()) if n else False
    )
    level = LEVEL_PYTHON if has_frames else LEVEL_MODULE if has_scopes else LEVEL_OP
    return ContextIndex(
        table=table,
        labels=labels,
        parent=trie.parent,
        label=trie.label,
        kind=trie.kind,
        level_start=trie.level_start,
        row_node=row_node,
        row_parent=row_parent.astype(np.int32),
        on_tree=on_tree,
        cpu_self_ns=cpu_self(table),
        level=level,
        backward_attached=attached,
        handed_to_caller=handed,
        rank_nodes=rank_nodes,
        **ctx,
    )


# ---------------------------------------------------------------------------------------------
# Metrics


def op_flops(op: str, shapes: str, concrete: str | None = None) -> float:
    """FLOPs of one op from its input shapes (multiply-add = 2), 0 when they do not tell.

    Matrix products (mm, addmm, bmm, baddbmm, matmul, linear), scaled-dot-product attention
    and convolutions (a forward one needs its stride and padding, `concrete`: the op's
    "Concrete Inputs" as the table keeps them; `analysis.convolution`).
    """
    dims = tensor_shapes(parse_input_dims(shapes))
    if not dims:
        return 0.0
    if op in CONVOLUTION_OPS:
        cost = conv_cost(op, dims, parse_concrete(concrete), 1)
        return cost[0] if cost else 0.0
    name = op.removeprefix("aten::")
    if f"aten::{name}" in MATRIX_PRODUCTS:
        cost = matrix_product_cost(f"aten::{name}", dims, 1)
        return cost[0] if cost else 0.0
    if f"aten::{name}" in FUSED_ATTENTION:
        return attention_flops(f"aten::{name}", dims) or 0.0
    return 0.0


def _row_flops(table: EventTable, rows_op: np.ndarray) -> np.ndarray:
    """FLOPs per CPU op row, counted once: an op whose own children compute it (linear ->
    addmm, matmul -> mm) leaves the count to them."""
    flops = np.zeros(len(table), dtype=np.float64)
    if rows_op.size == 0:
        return flops
    has = rows_op[table.shapes[rows_op] >= 0]
    if has.size == 0:
        return flops
    key = np.stack([table.name[has], table.shapes[has], table.concrete[has]], axis=1)
    uniq, inv = np.unique(key, axis=0, return_inverse=True)
    per = np.array(
        [
            op_flops(table.names[n], table.names[s], table.names[c] if c >= 0 else None)
            for n, s, c in uniq.tolist()
        ],
        dtype=np.float64,
    )
    flops[has] = per[inv.reshape(-1)]
    counted = np.flatnonzero(flops > 0)
    # Zero every ancestor of a counted op: climb all counted rows one level at a time.
    cur = table.parent[counted].astype(np.int64)
    for _ in range(4096):
        live = cur >= 0
        if not live.any():
            break
        cur = cur[live]
        flops[cur] = 0.0
        cur = table.parent[cur].astype(np.int64)
    return flops


@dataclass
class Coverage:
    """How much of the GPU time the tree could put in context."""

    gpu_ns: int  # sum of kernel, copy and memset durations selected
    root_gpu_ns: int  # the root's inclusive GPU time (equals gpu_ns by construction)
    with_frame_ns: int  # GPU time whose path has a Python frame
    with_user_frame_ns: int  # ... a frame of the user's code (not PyTorch's or Python's)
    with_module_ns: int  # ... an nn.Module scope
    no_launch_ns: int  # GPU time whose launching call is not in the trace
    early_ns: int  # ... of which was launched before the trace began (earlier correlation)
    with_correlation_ns: int  # GPU time of events that carry a correlation id
    backward_attached: int

    @property
    def unattributed_pct(self) -> float:
        """Share of GPU time with no Python frame on its path."""
        return 100.0 * (self.gpu_ns - self.with_frame_ns) / self.gpu_ns if self.gpu_ns else 0.0

    @property
    def unattributed_launched_pct(self) -> float:
        """The same share among GPU work whose launch is in the trace."""
        launched = self.gpu_ns - self.no_launch_ns
        return 100.0 * (launched - self.with_frame_ns) / launched if launched > 0 else 0.0


@dataclass
class CompiledCode:
    """What the trace says about Triton / Inductor kernels and compiled regions."""

    kernels: int  # Inductor-generated (triton_*) kernels
    gpu_ns: int
    in_kernel_op_ns: int  # of which launched inside the op Inductor names after the kernel
    with_frame_ns: int  # of which have a Python frame on their path (the compiled call site)
    regions: int  # "Torch-Compiled Region" / CompiledFxGraph ranges seen
    top: list[tuple[str, list[str], int]]  # (kernel, fused ops from its name, ns)


@dataclass(repr=False)
class ContextTree(Tables):
    """Metrics of a selection of events on the calling-context tree. In a notebook it draws
    itself as `perfcast tree` prints it (its default view); its repr is one line."""

    RENDERER: ClassVar[tuple[str, str]] = ("perfcast.report.tree", "render_context_tree")

    index: ContextIndex
    excl: dict[str, np.ndarray]
    incl: dict[str, np.ndarray]
    coverage: Coverage
    compiled: CompiledCode | None
    selection: dict[str, object]
    steps: int  # profiler steps the selection spans (1 for a trace without steps)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.index)

    def __eq__(self, other: object) -> bool:
        # The generated one compared arrays into arrays: `a == b` raised ValueError.
        from perfcast.arrays import same_value

        return same_value(self, other)

    @property
    def level(self) -> str:
        return self.index.level

    def _tables(self) -> dict[str, Any]:
        """ "nodes": one row per node of the tree (node 0 the root): its parent, depth, name,
        kind, and every metric inclusive (`incl_<metric>`) and exclusive (`excl_<metric>`)."""
        index = self.index
        parent = np.asarray(index.parent, dtype=np.int64)
        cols: dict[str, Any] = {
            "node": np.arange(len(index)),
            "parent": parent,
            "depth": _depths(parent)[0],
            "name": [index.labels[i] for i in index.label.tolist()],
            "kind": [KIND_NAMES[CtxKind(k)] for k in index.kind.tolist()],
        }
        for k, v in self.incl.items():
            cols[f"incl_{k}"] = v
        for k, v in self.excl.items():
            cols[f"excl_{k}"] = v
        return {"nodes": cols}


def _phase_of(value: str | None) -> Phase | None:
    if value is None:
        return None
    for p, text in PHASE_LABELS.items():
        if value.lower() in (text, p.name.lower()):
            return p
    names = ", ".join(p.name.lower() for p in PHASE_LABELS)
    raise OptionError(f"unknown phase {value!r}", hint=f"one of {names}")


def select_rows(
    table: EventTable,
    rank: int | None = None,
    phase: str | None = None,
    step: str | int | None = None,
) -> tuple[np.ndarray, dict[str, object], int]:
    """Mask of the rows a tree counts, the selection as data, and the number of steps."""

    mask = np.ones(len(table), dtype=bool)
    sel: dict[str, object] = {}
    if rank is not None:
        if rank not in table.rank_ids():
            raise OptionError(
                f"no rank {rank} in {table.source()}", hint=f"ranks: {table.rank_ids()}"
            )
        mask &= table.rank == rank
        sel["rank"] = rank
    ph = _phase_of(phase)
    if ph is not None:
        mask &= event_phases(table) == int(ph)
        sel["phase"] = PHASE_LABELS[ph]
    its = [i for i, it in enumerate(table.iterations) if rank is None or it.rank == rank]
    if step is not None:
        want = [
            i
            for i in its
            if str(step) in (table.iterations[i].name, table.iterations[i].name.removeprefix(_STEP))
        ]
        if not want:
            # In the trace's order: sorted as text, #10 came before #5.
            names = list(dict.fromkeys(table.iterations[i].name for i in its))
            raise OptionError(f"no step {step!r} in {table.source()}", hint=f"steps: {names[:8]}")
        mask &= np.isin(table.iteration, want)
        sel["step"] = table.iterations[want[0]].name
        its = want
    n_steps = len({table.iterations[i].name for i in its}) or 1
    return mask, sel, n_steps


def context_tree(
    table: EventTable | ContextIndex,
    rank: int | None = None,
    phase: str | None = None,
    step: str | int | None = None,
) -> ContextTree:
    """The calling-context tree of the selected events (all ranks, phases and steps by
    default): per node inclusive and exclusive GPU time, CPU time, calls, launches,
    kernels, copies, FLOPs and bytes."""
    index = table if isinstance(table, ContextIndex) else build_index(table)
    t = index.table
    mask, sel, n_steps = select_rows(t, rank=rank, phase=phase, step=step)
    return _aggregate(index, mask, sel, n_steps)


def _aggregate(
    index: ContextIndex, mask: np.ndarray, sel: dict[str, object], n_steps: int
) -> ContextTree:
    t = index.table
    n_nodes = len(index)
    node = index.row_node
    use = mask & (node >= 0)
    is_gpu = t.is_gpu()
    kind = t.kind
    dur = t.dur

    def per_node(rows: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        if weights is None:
            return np.bincount(node[rows], minlength=n_nodes).astype(np.int64)
        return np.bincount(node[rows], weights=weights, minlength=n_nodes)

    excl: dict[str, np.ndarray] = {}
    gpu_rows = np.flatnonzero(use & is_gpu)
    excl["gpu_ns"] = np.rint(per_node(gpu_rows, dur[gpu_rows].astype(np.float64))).astype(np.int64)
    self_ns = index.cpu_self_ns
    cpu_rows = np.flatnonzero(use & np.isin(kind, CPU_KINDS_ARR))
    excl["cpu_ns"] = per_node(cpu_rows, self_ns[cpu_rows].astype(np.float64))
    excl["cpu_ns"] = np.rint(excl["cpu_ns"]).astype(np.int64)
    excl["calls"] = per_node(np.flatnonzero(use & index.on_tree))
    launched = np.zeros(len(t), dtype=bool)
    lk = t.launch[t.launch >= 0]
    launched[lk] = True
    excl["launches"] = per_node(np.flatnonzero(use & launched))
    excl["kernels"] = per_node(np.flatnonzero(use & (kind == Kind.KERNEL)))
    copies = np.flatnonzero(use & np.isin(kind, [Kind.MEMCPY, Kind.MEMSET]))
    excl["copies"] = per_node(copies)
    excl["bytes"] = np.rint(per_node(copies, np.maximum(t.nbytes[copies], 0).astype(np.float64)))
    excl["bytes"] = excl["bytes"].astype(np.int64)
    op_rows = np.flatnonzero(use & (kind == Kind.CPU_OP))
    flops = _row_flops(t, op_rows)
    excl["flops"] = per_node(op_rows, flops[op_rows])
    incl = {k: _sum_up(index.parent, index.level_start, v) for k, v in excl.items()}

    gpu_total = int(dur[gpu_rows].sum())
    g_nodes = node[gpu_rows]
    with_frame = int(dur[gpu_rows][index.frame[g_nodes] >= 0].sum())
    with_user = int(dur[gpu_rows][index.user_frame[g_nodes] >= 0].sum())
    with_module = int(dur[gpu_rows][index.module[g_nodes] >= 0].sum())
    no_launch = int(dur[gpu_rows][t.launch[gpu_rows] < 0].sum())
    early_label = index.labels.index(EARLY_LAUNCH_LABEL) if no_launch else NONE
    g_parent = index.parent[g_nodes]
    early = int(
        dur[gpu_rows][(t.launch[gpu_rows] < 0) & (index.label[g_parent] == early_label)].sum()
    )
    with_corr = int(dur[gpu_rows][t.correlation[gpu_rows] >= 0].sum())
    coverage = Coverage(
        gpu_ns=gpu_total,
        root_gpu_ns=int(incl["gpu_ns"][0]) if n_nodes else 0,
        with_frame_ns=with_frame,
        with_user_frame_ns=with_user,
        with_module_ns=with_module,
        no_launch_ns=no_launch,
        early_ns=early,
        with_correlation_ns=with_corr,
        backward_attached=index.backward_attached,
    )
    tree = ContextTree(
        index=index,
        excl=excl,
        incl=incl,
        coverage=coverage,
        compiled=_compiled(index, gpu_rows),
        selection=sel,
        steps=n_steps,
    )
    from perfcast.analysis.notes import input_notes

    # A cut or damaged input is said here too, after the level (which views print apart).
    level, *rest = _notes(tree)
    tree.notes = [level, *input_notes(t), *rest]
    if not use.any():
        chosen = ", ".join(f"{k} {v}" for k, v in sel.items()) or "the whole trace"
        tree.notes.append(f"no events in the selection ({chosen}): nothing to show")
    return tree


def _compiled(index: ContextIndex, gpu_rows: np.ndarray) -> CompiledCode | None:
    t = index.table
    names = t.names
    tri = np.fromiter(
        (inductor_fused_ops(s) is not None for s in names), dtype=bool, count=len(names)
    )
    region = np.fromiter(
        (bool(_COMPILED_REGION.search(s)) for s in names), dtype=bool, count=len(names)
    )
    k = gpu_rows[tri[t.name[gpu_rows]] & (t.kind[gpu_rows] == Kind.KERNEL)]
    cpu = np.isin(t.kind, [Kind.CPU_OP, Kind.USER_ANNOTATION])
    n_regions = int((cpu & region[t.name]).sum()) if len(t) else 0
    if k.size == 0 and n_regions == 0:
        return None
    node = index.row_node[k]
    # The kernel's own op: Inductor records an op named after the kernel around its launch.
    rp = index.row_parent
    launch = t.launch[k]
    op_row = np.where(launch >= 0, rp[np.maximum(launch, 0)], NONE)
    same = (op_row >= 0) & (t.name[np.maximum(op_row, 0)] == t.name[k])
    dur = t.dur[k]
    uniq, inv = np.unique(t.name[k], return_inverse=True)
    tot = np.bincount(inv.reshape(-1), weights=dur.astype(np.float64))
    top = [
        (names[int(uniq[i])], inductor_fused_ops(names[int(uniq[i])]) or [], int(tot[i]))
        for i in np.argsort(-tot)[:5].tolist()
    ]
    return CompiledCode(
        kernels=int(k.size),
        gpu_ns=int(dur.sum()),
        in_kernel_op_ns=int(dur[same].sum()),
        with_frame_ns=int(dur[index.frame[node] >= 0].sum()),
        regions=n_regions,
        top=top,
    )


def _notes(tree: ContextTree) -> list[str]:
    cov = tree.coverage
    notes = [f"context from {LEVEL_TEXT[tree.level]}"]
    if cov.gpu_ns and tree.level == LEVEL_PYTHON:
        text = f"{cov.unattributed_pct:.2f}% of GPU time has no Python frame on its path"
        if cov.no_launch_ns:
            why = []
            if cov.early_ns:
                why.append(
                    f"{100.0 * cov.early_ns / cov.gpu_ns:.2f}% was launched before the trace began"
                )
            if cov.no_launch_ns > cov.early_ns:
                missing = cov.no_launch_ns - cov.early_ns
                why.append(
                    f"{100.0 * missing / cov.gpu_ns:.2f}% has no launching call in the trace"
                )
            text += (
                f" ({'; '.join(why)}; of the GPU work launched inside the trace, "
                f"{cov.unattributed_launched_pct:.2f}%)"
            )
        notes.append(text)
    if cov.backward_attached:
        notes.append(
            f"{cov.backward_attached:,} backward ops of the trace (every step) are shown under "
            "the forward op they differentiate (autograd's thread records no Python frames)"
        )
    if tree.index.handed_to_caller:
        notes.append(
            f"{tree.index.handed_to_caller:,} other calls of autograd's thread (gradient "
            "accumulation, DDP hooks) are shown under the backward() call they ran for"
        )
    c = tree.compiled
    if c is not None and c.kernels:
        notes.append(
            f"{c.kernels:,} Inductor/Triton kernels ({c.gpu_ns / 1e6:.2f} ms): "
            f"{100.0 * c.in_kernel_op_ns / max(c.gpu_ns, 1):.0f}% launched inside the op "
            "named after the kernel, "
            + (
                f"{100.0 * c.with_frame_ns / max(c.gpu_ns, 1):.0f}% reach a Python frame (the "
                "compiled region's call site); "
                if tree.level == LEVEL_PYTHON
                else "the trace records no Python frames (with_stack=True shows the "
                "compiled region's call site); "
            )
            + "the source lines of the ops each kernel fused are not in the trace, only the "
            "op names its kernel name lists"
        )
    elif c is not None and c.regions:
        notes.append(
            f"{c.regions:,} torch.compile regions: frames inside them are not recorded; "
            "their work is attributed to the region's call site"
        )
    return notes
