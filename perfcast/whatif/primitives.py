"""Graph transformation primitives: select, scale, remove, insert, fuse, reschedule, add lanes.

Every optimization model is written with these. They edit the graph they are
given in place: `perfcast.whatif.runner` hands each model a copy.

A custom what-if in a few lines:

    from perfcast.whatif import primitives as P
    g = graph.copy()
    P.scale(g, P.select(g, name=r"gemm|matmul"), 0.5)      # GEMMs twice as fast
    P.remove(g, P.select(g, op=r"aten::_local_scalar_dense", kind="sync"))
    timeline = perfcast.sim.simulate(g)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from perfcast.analysis.notes import ONE_TIME_NS
from perfcast.arrays import sorted_unique, split_by
from perfcast.errors import OptionValueError
from perfcast.graph.model import NONE, Graph, Lane, NodeKind, Source
from perfcast.graph.phases import Phase

_KIND_NAMES = {
    "cpu": (NodeKind.CPU,),
    "launch": (NodeKind.LAUNCH,),
    "sync": (NodeKind.SYNC,),
    "runtime": (NodeKind.RUNTIME, NodeKind.LAUNCH, NodeKind.SYNC),
    "gpu": (NodeKind.GPU,),
    "kernel": (NodeKind.GPU,),
    "wait": (NodeKind.WAIT,),
    "host": (NodeKind.CPU, NodeKind.LAUNCH, NodeKind.SYNC, NodeKind.RUNTIME, NodeKind.WAIT),
}
_PHASE_NAMES = {
    "dataloader": Phase.DATALOADER,
    "data": Phase.DATALOADER,
    "forward": Phase.FORWARD,
    "backward": Phase.BACKWARD,
    "optimizer": Phase.OPTIMIZER,
    "communication": Phase.COMMUNICATION,
    "graph": Phase.GRAPH,
}


def rank_steps(graph: Graph, nodes: np.ndarray) -> tuple[int, str]:
    """How many (rank, step) pairs `nodes` span, and how a per-step figure says so: what-if
    assumptions give counts and times per step and rank, never summed over ranks."""
    c = graph.cols
    nodes = nodes[c["iteration"][nodes] >= 0]
    if nodes.size == 0:
        return 1, "in the step"
    pairs = np.unique(c["rank"][nodes].astype(np.int64) << 32 | c["iteration"][nodes])
    ranks = np.unique(c["rank"][nodes]).size
    if ranks > 1:
        return pairs.size, per_step_of(ranks, pairs.size)
    if pairs.size > 1:
        return pairs.size, f"per step (mean of {pairs.size} steps)"
    return 1, "in the step"


def per_step_of(ranks: int, rank_steps: int) -> str:
    """How a mean over `rank_steps` (rank, step) pairs of `ranks` ranks reads: "per step" on
    one rank, and on several, that it is per rank too (a reader took "per step" for the
    whole job's step)."""
    if ranks > 1:
        return f"per step and rank (mean of {ranks:,} ranks, {rank_steps:,} rank-steps)"
    return "per step"


def per_count(n: float, per: int) -> str:
    """A count divided over `per` rank-steps: whole when it is, else one decimal."""
    x = n / max(per, 1)
    return f"{x:,.0f}" if abs(x - round(x)) < 0.05 else f"{x:,.1f}"


def split_list(value: str) -> list[str]:
    """An option's list value: items joined with '+' (the spec syntax keeps ',' between
    options), ',' also accepted from the Python API."""
    return [p.strip() for p in re.split(r"[+,]", value) if p.strip()]


def check_pattern(pattern: str | None, option: str = "") -> re.Pattern[str] | None:
    """An option's regular expression, compiled; refused in one line when it is not one,
    naming the what-if and option it was given to (`option`, e.g. "faster-op: pattern")."""
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except (re.error, TypeError) as exc:
        given = f"{option}={pattern!r}" if option else repr(pattern)
        raise OptionValueError(
            f"{given} is not a valid regular expression ({exc})",
            hint=f"to match it as written, escape it: {re.escape(pattern)}",
        ) from None


def name_mask(names: list[str], pattern: str | None) -> np.ndarray:
    """Per name: whether the regular expression `pattern` finds it (or it holds the
    pattern as it is); all True for no pattern."""
    pat = check_pattern(pattern)
    if pat is None or pattern is None:  # the same test: mypy needs `pattern` narrowed
        return np.ones(len(names), dtype=bool)
    # A name pasted as it is (a kernel's `(`, `*` and `<...>` are regex syntax) names itself.
    return np.array([bool(pat.search(n)) or pattern in n for n in names], dtype=bool)


def node_ids(nodes: Any, graph: Graph | None = None) -> np.ndarray:
    """`nodes` as an array of node ids; a pattern or names passed where ids belong is an
    OptionValueError saying so (it was NumPy's 'invalid literal for int()'), and so is an
    id outside `graph` (NumPy read -1 as the last node)."""
    try:
        ids = np.asarray(nodes)
        if ids.dtype.kind not in "iu" and ids.size:
            raise TypeError
        ids = ids.astype(np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise OptionValueError(
            f"nodes must be node ids (integers, as select() returns them), not {nodes!r:.80}"
        ) from None
    if graph is not None and ids.size:
        n = len(graph)
        outside = ids[(ids < 0) | (ids >= n)]
        if outside.size:
            raise OptionValueError(
                f"node id {int(outside[0])} is not in the graph (ids 0 to {n - 1}, as select() "
                "returns them)"
            )
    return ids


def _node_id(graph: Graph, node: Any, what: str) -> int:
    if isinstance(node, bool) or not isinstance(node, (int, np.integer)):
        raise OptionValueError(f"{what} must be one node id (an integer), not {node!r:.80}")
    return int(node_ids([node], graph)[0])


def _lane_id(graph: Graph, lane: Any) -> int:
    if isinstance(lane, bool) or not isinstance(lane, (int, np.integer)):
        raise OptionValueError(f"lane must be a lane id (an integer), not {lane!r:.80}")
    if not 0 <= int(lane) < len(graph.lanes):
        raise OptionValueError(
            f"lane {int(lane)} is not in the graph (lanes 0 to {len(graph.lanes) - 1}; "
            "add_lane() makes a new one)"
        )
    return int(lane)


def _duration(dur: Any, what: str = "dur") -> np.ndarray:
    try:
        d = np.asarray(dur, dtype=np.float64)
    except (TypeError, ValueError):
        raise OptionValueError(f"{what} must be a duration in ns, not {dur!r:.80}") from None
    if not (np.isfinite(d) & (d >= 0) & (d <= MAX_SCALED_NS)).all():
        raise OptionValueError(f"{what} must be a finite duration in ns >= 0, not {dur!r:.80}")
    return np.rint(d).astype(np.int64)


def select(
    graph: Graph,
    *,
    name: str | None = None,
    op: str | None = None,
    module: str | None = None,
    kind: str | Iterable[str] | None = None,
    klass: Iterable[int] | None = None,
    phase: str | Iterable[str] | None = None,
    lane: int | Iterable[int] | None = None,
    stream: int | None = None,
    rank: int | None = None,
    iteration: int | None = None,
    alive_only: bool = True,
) -> np.ndarray:
    """Node ids matching every given criterion.

    name/op/module are regular expressions on the node's own name, on the name
    of the CPU op it is attributed to, and on its enclosing nn.Module or
    record_function scope; kind is one of cpu, launch, sync, runtime,
    gpu/kernel, wait, host; phase is dataloader, forward, backward, optimizer
    or communication; klass takes hardware.classify.KernelClass values.
    """
    c = graph.cols
    n = len(graph)
    mask = graph.alive.copy() if alive_only else np.ones(n, dtype=bool)
    if name is not None:
        nm = name_mask(graph.names, name)
        idx = c["name"]
        mask &= (idx >= 0) & nm[np.maximum(idx, 0)]
    if op is not None:
        mask &= _op_mask(graph, op)
    if module is not None:
        mask &= _scope_mask(graph, module)
    if kind is not None:
        kinds = [kind] if isinstance(kind, str) else _listed(kind, "kind")
        unknown_kinds = [k for k in kinds if not isinstance(k, str) or k not in _KIND_NAMES]
        if unknown_kinds:
            raise OptionValueError(
                f"unknown node kind {unknown_kinds[0]!r}: kinds are {', '.join(_KIND_NAMES)}"
            )
        allowed = [int(k) for kn in kinds for k in _KIND_NAMES[kn]]
        mask &= np.isin(c["kind"], allowed)
    if klass is not None:
        mask &= np.isin(c["klass"], _whole(_listed(klass, "klass"), "klass"))
    if phase is not None:
        phases = [phase] if isinstance(phase, str) else _listed(phase, "phase")
        unknown = [p for p in phases if not isinstance(p, str) or p not in _PHASE_NAMES]
        if unknown:
            raise OptionValueError(
                f"unknown phase {unknown[0]!r}: phases are {', '.join(_PHASE_NAMES)} "
                "(several joined with '+', e.g. phases=forward+backward)"
            )
        mask &= np.isin(c["phase"], [int(_PHASE_NAMES[p]) for p in phases])
    if lane is not None:
        lanes_wanted = _whole([lane] if isinstance(lane, int) else _listed(lane, "lane"), "lane")
        mask &= np.isin(c["lane"], lanes_wanted)
    if stream is not None:
        (stream,) = _whole([stream], "stream")
        lanes = [i for i, ln in enumerate(graph.lanes) if ln.is_gpu and ln.tid == stream]
        mask &= np.isin(c["lane"], lanes)
    if rank is not None:
        (rank,) = _whole([rank], "rank")  # "0" matched nothing, in silence
        mask &= c["rank"] == rank
    if iteration is not None:
        (iteration,) = _whole([iteration], "iteration")
        mask &= c["iteration"] == iteration
    return np.flatnonzero(mask)


def _listed(values: Any, what: str) -> list[Any]:
    try:
        return list(values)
    except TypeError:
        raise OptionValueError(
            f"{what} must be a value or a list of them, not {values!r:.80}"
        ) from None


def _whole(values: list[Any], what: str) -> list[int]:
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, np.integer))]
    if bad:
        raise OptionValueError(f"{what} must be an integer, not {bad[0]!r:.80}")
    return [int(v) for v in values]


def _op_mask(graph: Graph, pattern: str) -> np.ndarray:
    """Nodes attributed to an op whose name matches (GPU work: the op that launched it)."""
    idx = graph.cols["op_name"]
    nm = name_mask(graph.names, pattern)
    return (idx >= 0) & nm[np.maximum(idx, 0)]


def _scope_mask(graph: Graph, pattern: str) -> np.ndarray:
    """Nodes inside a module or record_function scope whose name matches."""
    idx = graph.cols["scope"]
    nm = name_mask(graph.names, pattern)
    return (idx >= 0) & nm[np.maximum(idx, 0)]


# The longest a scaled task may last (a day): beyond it a factor is a typo, and int64 sums
# of such durations would overflow.
MAX_SCALED_NS = 86_400 * 10**9


def scale(
    graph: Graph, nodes: np.ndarray, factor: float | np.ndarray, source: Source = Source.SCALED
) -> None:
    """Multiply node durations by `factor` (0.5 = twice as fast; a finite number >= 0)."""
    c = graph.cols
    nodes = node_ids(nodes, graph)
    try:
        if factor is None:  # NumPy reads None as nan
            raise TypeError
        f = np.asarray(factor, dtype=np.float64)
    except (TypeError, ValueError):
        raise OptionValueError(f"a duration factor must be a number, not {factor!r:.80}") from None
    if not (np.isfinite(f) & (f >= 0)).all():
        bad = f[~(np.isfinite(f) & (f >= 0))].ravel()[0]
        raise OptionValueError(f"a duration factor must be a finite number >= 0, not {bad}")
    scaled = c["dur"][nodes] * f
    if scaled.size and float(scaled.max()) > MAX_SCALED_NS:
        raise OptionValueError(
            f"a duration factor makes a task last {float(scaled.max()) / 8.64e13:.3g} days: "
            "no step runs that long"
        )
    set_duration(graph, nodes, np.rint(scaled).astype(np.int64), source)


def set_duration(
    graph: Graph, nodes: np.ndarray, dur: np.ndarray | int, source: Source = Source.MODELLED
) -> None:
    c = graph.cols
    nodes = node_ids(nodes, graph)
    c["dur"][nodes] = np.maximum(np.asarray(dur, dtype=np.int64), 0)
    c["source"][nodes] = np.maximum(c["source"][nodes], int(source))


def remove(graph: Graph, nodes: np.ndarray) -> None:
    """Take nodes out of the graph. Their lanes close up; edges from them pass to
    their lane predecessor. Step boundary nodes keep their place with zero time."""
    nodes = node_ids(nodes, graph)
    if nodes.size == 0:
        return
    # Nodes that mark where steps start and end are zeroed, never removed.
    keep = np.isin(nodes, graph.step_boundaries())
    if keep.any():
        set_duration(graph, nodes[keep], 0, Source.MODELLED)
        graph.cols["sync_kind"][nodes[keep]] = NONE
    graph.remove(nodes[~keep])


def remove_gpu_work(graph: Graph, gpu_nodes: np.ndarray, remove_launches: bool = True) -> None:
    """Remove GPU tasks and, when all their work is gone, the calls that launched them."""
    c = graph.cols
    gpu_nodes = np.asarray(gpu_nodes, dtype=np.int64)
    remove(graph, gpu_nodes)
    if not remove_launches or gpu_nodes.size == 0:
        return
    launches = sorted_unique(c["launch"][gpu_nodes])
    launches = launches[launches >= 0]
    if launches.size == 0:
        return
    # Which of these launches still start live GPU work. Only the candidates' own ids are
    # looked up (a table over their range), not every live launch made distinct: callers
    # that remove work group by group made the latter O(groups x nodes).
    live_gpu = (c["kind"] == NodeKind.GPU) & graph.alive
    live_launch = c["launch"][live_gpu]
    hit = live_launch[np.isin(live_launch, launches, kind="table")]
    gone = launches[~np.isin(launches, hit)]
    # A launch that took a one-time cost (lazy initialisation, module loading) keeps it: the
    # work it launched going away does not make the first use cheaper.
    remove(graph, gone[c["dur_measured"][gone] < ONE_TIME_NS])


# Attribution columns a new node copies from the node it stands in for.
LIKE_KEYS = ("op", "op_name", "scope", "phase", "iteration", "rank", "klass", "gpu_kind")


def insert(
    graph: Graph,
    *,
    lane: int,
    after: int | None = None,
    before: int | None = None,
    dur: int | np.ndarray,
    kind: NodeKind,
    name: str,
    count: int = 1,
    source: Source = Source.MODELLED,
    like: int | None = None,
    near: bool = False,
    **cols: np.ndarray | int | float,
) -> np.ndarray:
    """Insert `count` nodes on `lane`, in order, right after `after` or right before `before`.

    `like` copies attribution (op, phase, iteration, rank) from an existing node. Positions
    are spread evenly between the neighbours, so later insertions still find room; with
    `near` they keep to the thousandth of the gap next to the anchor, so their order (a time
    in ns, compared with other lanes' to tell what was enqueued before what) stays the
    anchor's.
    """
    c = graph.cols
    lane = _lane_id(graph, lane)
    if after is not None:
        after = _node_id(graph, after, "after")
    if before is not None:
        before = _node_id(graph, before, "before")
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise OptionValueError(f"count must be a whole number >= 1, not {count!r:.80}")
    if (
        not isinstance(kind, (int, np.integer))
        or isinstance(kind, bool)
        or int(kind) not in {int(k) for k in NodeKind}
    ):
        raise OptionValueError(
            f"kind must be a NodeKind ({', '.join(k.name for k in NodeKind)}), not {kind!r:.80}"
        )
    dur = _duration(dur)
    if dur.ndim and dur.size not in (1, count):
        raise OptionValueError(f"dur holds {dur.size} durations for {count} node(s)")
    if like is not None:
        like = _node_id(graph, like, "like")
    lane_nodes = np.flatnonzero((c["lane"] == lane) & graph.alive)
    orders = np.sort(c["order"][lane_nodes])
    if after is not None:
        lo = float(c["order"][after])
        nxt = orders[orders > lo]
        hi = float(nxt[0]) if nxt.size else lo + 1.0
    elif before is not None:
        hi = float(c["order"][before])
        prv = orders[orders < hi]
        lo = float(prv[-1]) if prv.size else hi - 1.0
    else:
        lo = float(orders[-1]) if orders.size else 0.0
        hi = lo + 1.0
    pos = _spread(
        np.array([lo]),
        np.array([hi]),
        count,
        near_lo=near and after is not None,
        near_hi=near and before is not None,
    )[0]
    values: dict[str, np.ndarray | int | float] = {
        "kind": int(kind),
        "lane": lane,
        "order": pos,
        "dur": dur,
        "source": int(source),
        "name": graph.intern(name),
        "rank": graph.lanes[lane].rank,
    }
    if like is not None:
        for key in LIKE_KEYS:
            values[key] = int(c[key][like])
    values.update(cols)
    if "launch_order" not in values:
        values["launch_order"] = pos
    return graph.append(**values)


def fuse(
    graph: Graph, nodes: np.ndarray, dur: int, name: str, source: Source = Source.MODELLED
) -> int:
    """Replace a group of nodes on one lane by one node at the first one's place."""
    c = graph.cols
    nodes = node_ids(nodes, graph)
    if nodes.size == 0:
        raise OptionValueError("fuse needs at least one node")
    if np.unique(c["lane"][nodes]).size > 1:
        raise OptionValueError(
            "fuse takes nodes of one lane (one thread or stream); these are on "
            f"{np.unique(c['lane'][nodes]).size} (select(..., lane=N) picks one)"
        )
    first = int(nodes[np.argmin(c["order"][nodes])])
    set_duration(graph, np.array([first]), _duration(dur), source)
    c["name"][first] = graph.intern(name)
    rest = nodes[nodes != first]
    if c["kind"][first] == NodeKind.GPU:
        remove_gpu_work(graph, rest)
    else:
        remove(graph, rest)
    return first


def reschedule(graph: Graph, nodes: np.ndarray, new_order: np.ndarray) -> None:
    """Change nodes' positions in their lanes (e.g. to prioritize communication)."""
    nodes = node_ids(nodes, graph)
    try:
        order = np.asarray(new_order, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise OptionValueError(f"new_order must be numbers, not {new_order!r:.80}") from None
    if order.size not in (1, nodes.size) or not np.isfinite(order).all():
        raise OptionValueError(
            f"new_order must be one finite position per node ({nodes.size}), not {new_order!r:.80}"
        )
    graph.cols["order"][nodes] = order


def add_lane(graph: Graph, rank: int, is_gpu: bool, pid: int, tid: int, name: str) -> int:
    """A new stream or thread (e.g. a communication stream); returns its lane id."""
    ranks = {ln.rank for ln in graph.lanes}
    if (
        isinstance(rank, bool)
        or not isinstance(rank, (int, np.integer))
        or (ranks and rank not in ranks)
    ):
        raise OptionValueError(
            f"rank {rank!r:.40} is not in the graph (ranks {', '.join(map(str, sorted(ranks)))})"
        )
    graph.lanes.append(Lane(rank=rank, is_gpu=is_gpu, pid=pid, tid=tid, name=name))
    return len(graph.lanes) - 1


def move(graph: Graph, nodes: np.ndarray, lane: int) -> None:
    """Run nodes on another lane (keeping their order keys)."""
    graph.cols["lane"][node_ids(nodes, graph)] = _lane_id(graph, lane)


def median_launch_ns(graph: Graph, default: int = 5_000) -> int:
    c = graph.cols
    launches = np.flatnonzero((c["kind"] == NodeKind.LAUNCH) & graph.alive)
    if launches.size == 0:
        return default
    return int(np.median(c["dur_measured"][launches]))


def like_columns(graph: Graph, nodes: np.ndarray) -> dict[str, np.ndarray]:
    """Attribution columns copied from existing nodes (as `primitives.insert(like=...)`)."""
    return {k: graph.cols[k][nodes].copy() for k in LIKE_KEYS}


def order_slots(
    graph: Graph, anchors: np.ndarray, k: int, *, after: bool, near: bool = False
) -> np.ndarray:
    """k evenly spaced order keys between each anchor and its live lane neighbour: its
    successor when `after`, else its predecessor (one order unit beyond the anchor where
    the lane has none). With `near` they keep to the thousandth of the gap next to the
    anchor, as `insert(near=True)` places them."""
    c = graph.cols
    alive = graph.alive
    out = np.empty((anchors.size, k), dtype=np.float64)
    lanes = c["lane"][anchors]
    # The anchors' lanes' live nodes, grouped with one sort (a whole-graph mask per lane
    # is O(lanes x nodes): minutes of advise on a thousand ranks).
    live = np.flatnonzero(alive)
    live = live[np.isin(c["lane"][live], lanes)]
    orders_of = {
        lane: c["order"][live[pos]] for lane, pos in split_by(c["lane"][live], c["order"][live])
    }
    empty = np.zeros(0, dtype=c["order"].dtype)
    for lane, sel in split_by(lanes):
        orders = orders_of.get(lane, empty)
        at = c["order"][anchors[sel]]
        if after:
            i = np.searchsorted(orders, at, side="right")
            lo = at
            hi = np.where(i < orders.size, orders[np.minimum(i, orders.size - 1)], at + 1.0)
        else:
            i = np.searchsorted(orders, at, side="left") - 1
            lo = np.where(i >= 0, orders[np.maximum(i, 0)], at - 1.0)
            hi = at
        out[sel] = _spread(lo, hi, k, near_lo=near and after, near_hi=near and not after)
    return out


def _spread(lo: np.ndarray, hi: np.ndarray, k: int, *, near_lo: bool, near_hi: bool) -> np.ndarray:
    """k evenly spaced keys inside each (lo, hi) gap, one row per gap: across the whole gap,
    or within its thousandth next to lo (`near_lo`) or next to hi (`near_hi`), so that the
    new nodes' order (a time in ns, compared across lanes) stays the anchor's."""
    frac = np.arange(1, k + 1) / (k + 1)
    width = (hi - lo)[:, None]
    if near_lo:
        return lo[:, None] + width * 1e-3 * frac[None, :]
    if near_hi:
        return hi[:, None] - width * 1e-3 * (1 - frac)[None, :]
    return lo[:, None] + width * frac[None, :]
