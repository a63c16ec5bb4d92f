"""User-annotation and module-scope breakdowns: `record_function` ranges and `nn.Module`
scopes (`with_modules=True` or `with_stack=True`), with the GPU time each one launched.

For every name: the count and duration statistics of its ranges (HTA's
`get_gpu_user_annotation_breakdown` reports the same for the CPU ranges, `use_gpu_annotation=
False`, and for their GPU-side copies, `gpu_user_annotation`), the CPU time of its outermost
ranges (a scope nested in one of the same name is not counted twice), and the GPU time of
the kernels, copies and memsets launched inside it (inclusive: a kernel counts for every
enclosing scope, once per name).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfcast.analysis.common import NS_PER_MS, NS_PER_US, group_stats
from perfcast.analysis.notes import input_notes
from perfcast.events import NONE, EventTable, Kind
from perfcast.frames import Tables, plain

MODULE_PREFIX = "nn.Module: "


@dataclass
class ScopeTime:
    """One annotation, module or GPU annotation name on a rank: count, durations (ms total,
    µs statistics), CPU and GPU ms and kernels."""

    rank: int
    kind: str  # "annotation" (record_function), "module", "gpu annotation"
    name: str
    count: int
    total_ms: float  # summed durations of its ranges (nested same-name ranges count twice)
    mean_us: float
    min_us: float
    max_us: float
    std_us: float
    cpu_ms: float  # outermost ranges of the name only
    gpu_ms: float  # GPU work launched inside (inclusive); for GPU annotations: their time
    kernels: int


@dataclass(repr=False)
class Scopes(Tables):
    """Result of `scopes`; table: scopes (annotations, modules, GPU annotations)."""

    scopes: list[ScopeTime]
    notes: list[str] = field(default_factory=list)

    ROW_TYPES = {"scopes": ScopeTime}  # noqa: RUF012


def scopes(table: EventTable, top: int = 30) -> Scopes:
    """Time per record_function annotation, nn.Module scope and GPU annotation, per rank.

    >>> import perfcast
    >>> r = scopes(perfcast.load("perfcast/examples/ddp_a100_rank0.json.gz"))
    >>> r.to_pandas().sort_values("gpu_ms").tail()                      # doctest: +SKIP
    """
    out = Scopes([], notes=input_notes(table))
    names = table.names
    is_step = table.step_marker_names()
    is_module = np.array([n.startswith(MODULE_PREFIX) for n in names], dtype=bool)
    kind = table.kind
    annot = table.annotation_mask()
    module = (kind == Kind.PYTHON_FUNCTION) & is_module[table.name]
    gpu_annot = (kind == Kind.GPU_ANNOTATION) & ~is_step[table.name]
    scope_code = np.full(len(table), -1, dtype=np.int8)
    scope_code[annot] = 0
    scope_code[module] = 1
    scope_code[gpu_annot] = 2
    labels = ("annotation", "module", "gpu annotation")
    rows = np.flatnonzero(scope_code >= 0)
    if rows.size == 0:
        out.notes.append("no record_function annotations or module scopes in this trace")
        return out
    n_names = len(names)
    key = (table.rank[rows].astype(np.int64) * 3 + scope_code[rows]) * n_names + table.name[rows]
    stats = group_stats(key, table.dur[rows])

    # CPU time: ranges with no enclosing range of the same name.
    cpu_rows = rows[scope_code[rows] < 2]
    nested = np.zeros(cpu_rows.size, dtype=bool)
    cur = table.parent[cpu_rows].astype(np.int64)
    own = table.name[cpu_rows]
    for _ in range(256):
        live = cur >= 0
        if not live.any():
            break
        c = np.maximum(cur, 0)
        nested |= live & (table.name[c] == own) & (scope_code[c] >= 0)
        cur = np.where(live, table.parent[c], NONE)
    outer = cpu_rows[~nested]
    okey = (table.rank[outer].astype(np.int64) * 3 + scope_code[outer]) * n_names + table.name[
        outer
    ]
    ostats = group_stats(okey, table.dur[outer])
    cpu_of = dict(zip(ostats.keys.tolist(), ostats.sum.tolist()))

    # GPU time launched inside each scope: walk up from every launch call, one pair
    # (GPU row, scope name) per level, then keep each pair once.
    gpu = np.flatnonzero(table.is_gpu() & (table.launch >= 0))
    pairs_g, pairs_k = [], []
    cur = table.parent[table.launch[gpu]].astype(np.int64)
    for _ in range(256):
        live = cur >= 0
        if not live.any():
            break
        c = np.maximum(cur, 0)
        hit = live & (scope_code[c] >= 0) & (scope_code[c] < 2)
        if hit.any():
            h = np.flatnonzero(hit)
            pairs_g.append(gpu[h])
            pairs_k.append(
                (table.rank[c[h]].astype(np.int64) * 3 + scope_code[c[h]]) * n_names
                + table.name[c[h]]
            )
        cur = np.where(live, table.parent[c], NONE)
    gpu_of: dict[int, tuple[float, int]] = {}
    if pairs_g:
        pg = np.concatenate(pairs_g)
        pk = np.concatenate(pairs_k)
        uniq = np.unique(np.stack([pk, pg], axis=1), axis=0)
        g = group_stats(uniq[:, 0], table.dur[uniq[:, 1]])
        gpu_of = {k: (s, int(c)) for k, s, c in zip(g.keys.tolist(), g.sum.tolist(), g.count)}

    kept: dict[tuple[int, int], int] = {}
    for i in np.argsort(-stats.sum, kind="stable").tolist():
        k = int(stats.keys[i])
        rc, name_i = divmod(k, n_names)
        rank, code = divmod(rc, 3)
        if kept.get((rank, code), 0) >= top:
            continue
        kept[(rank, code)] = kept.get((rank, code), 0) + 1
        gpu_ns, n_k = gpu_of.get(k, (0.0, 0))
        if code == 2:
            gpu_ns, n_k = float(stats.sum[i]), 0
        out.scopes.append(
            ScopeTime(
                rank=rank,
                kind=labels[code],
                name=names[name_i],
                count=int(stats.count[i]),
                total_ms=stats.sum[i] / NS_PER_MS,
                mean_us=stats.mean[i] / NS_PER_US,
                min_us=stats.min[i] / NS_PER_US,
                max_us=stats.max[i] / NS_PER_US,
                std_us=stats.std[i] / NS_PER_US,
                cpu_ms=cpu_of.get(k, 0.0) / NS_PER_MS if code < 2 else 0.0,
                gpu_ms=gpu_ns / NS_PER_MS,
                kernels=n_k,
            )
        )
    out.scopes.sort(key=lambda s: (s.rank, s.kind, -s.total_ms))
    return plain(out)
