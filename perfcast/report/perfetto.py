"""Replayed timelines as a Chrome/Perfetto trace: one process per timeline and rank.

Baseline and prediction go side by side as separate processes; launch ->
kernel dependencies are drawn as flow arrows, and each GPU stream gets a counter track of its
launch queue (operations launched and not yet finished), so a prediction shows where the
queue fills or drains.
"""

from __future__ import annotations

import gzip
from typing import Any

import msgspec
import numpy as np

from perfcast.graph.model import EdgeType, NodeKind, Source
from perfcast.sim.timeline import Timeline

_EDGE_LABEL = {
    int(EdgeType.CROSS_STREAM): "cross-stream wait",
    int(EdgeType.CROSS_THREAD): "thread hand-off",
    int(EdgeType.COLLECTIVE): "collective",
    int(EdgeType.DATA): "dependency",
}
QUEUE_COUNTER_POINTS = 2_000  # samples per stream's launch-queue counter track, at most
QUEUE_COUNTER_BUDGET = 200_000  # samples over all streams of one timeline
_SOURCE_LABEL = {
    int(Source.MEASURED): "measured",
    int(Source.CORRECTED): "measured less the profiler's cost",
    int(Source.SCALED): "scaled",
    int(Source.MODELLED): "modelled",
}


def timeline_events(
    tl: Timeline, label: str, pid_base: int, flows: bool = True
) -> list[dict[str, Any]]:
    g = tl.graph
    c = g.cols
    alive = np.flatnonzero(g.alive)
    # CPU gaps outside any op are idle time: not drawn.
    drawn = alive[(c["kind"][alive] != NodeKind.CPU) | (c["op"][alive] >= 0)]
    events: list[dict[str, Any]] = []
    ranks = sorted({ln.rank for ln in g.lanes})
    pid_of = {r: pid_base + i for i, r in enumerate(ranks)}
    for r in ranks:
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": pid_of[r],
                "tid": 0,
                "args": {"name": f"{label} · rank {r}"},
            }
        )
        events.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": pid_of[r],
                "tid": 0,
                "args": {"sort_index": pid_of[r]},
            }
        )
    for i, ln in enumerate(g.lanes):
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid_of[ln.rank],
                "tid": i,
                "args": {"name": ln.name},
            }
        )
    names = g.names
    kind = c["kind"]
    start = (tl.start / 1000.0).tolist()  # µs, as Python floats for the encoder
    end = (tl.end / 1000.0).tolist()
    for node in drawn.tolist():
        lane = int(c["lane"][node])
        nm_idx = int(c["name"][node])
        name = names[nm_idx] if nm_idx >= 0 else "cpu"
        k = NodeKind(int(kind[node]))
        events.append(
            {
                "ph": "X",
                "cat": k.name.lower(),
                "name": name,
                "pid": pid_of[g.lanes[lane].rank],
                "tid": lane,
                "ts": start[node],
                "dur": end[node] - start[node],
                "args": {
                    "duration source": _SOURCE_LABEL.get(int(c["source"][node]), "?"),
                    "node": int(node),
                },
            }
        )
    events.extend(_queue_counters(tl, pid_of))
    if flows:
        gpu = alive[(kind[alive] == NodeKind.GPU) & (c["launch"][alive] >= 0)]
        live = g.alive
        for node in gpu.tolist():
            lnode = int(c["launch"][node])
            if not live[lnode]:
                continue
            fid = pid_base * 10_000_000 + node
            events.append(
                {
                    "ph": "s",
                    "id": fid,
                    "cat": "launch",
                    "name": "launch",
                    "pid": pid_of[int(c["rank"][lnode])],
                    "tid": int(c["lane"][lnode]),
                    "ts": start[lnode],
                }
            )
            events.append(
                {
                    "ph": "f",
                    "bp": "e",
                    "id": fid,
                    "cat": "launch",
                    "name": "launch",
                    "pid": pid_of[int(c["rank"][node])],
                    "tid": int(c["lane"][node]),
                    "ts": start[node],
                }
            )
        # Stored dependencies: cross-stream waits, thread hand-offs, collectives.
        for e, (src, dst, etype) in enumerate(
            zip(g.edge_src.tolist(), g.edge_dst.tolist(), g.edge_type.tolist())
        ):
            if not (live[src] and live[dst]):
                continue
            fid = pid_base * 10_000_000 + 5_000_000 + e
            cat = _EDGE_LABEL.get(int(etype), "dependency")
            events.append(
                {
                    "ph": "s",
                    "id": fid,
                    "cat": cat,
                    "name": cat,
                    "pid": pid_of[int(c["rank"][src])],
                    "tid": int(c["lane"][src]),
                    "ts": end[src],
                }
            )
            events.append(
                {
                    "ph": "f",
                    "bp": "e",
                    "id": fid,
                    "cat": cat,
                    "name": cat,
                    "pid": pid_of[int(c["rank"][dst])],
                    "tid": int(c["lane"][dst]),
                    "ts": start[dst],
                }
            )
    return events


def _queue_counters(tl: Timeline, pid_of: dict[int, int]) -> list[dict[str, Any]]:
    """A counter track per GPU stream: GPU operations launched and not yet finished, as the
    timeline has them (HTA's queue length: +1 when the launch call starts, -1 when the
    operation ends), cut to at most QUEUE_COUNTER_POINTS samples (fewer when many streams share
    QUEUE_COUNTER_BUDGET) keeping each bin's peak."""
    from perfcast.analysis.common import downsample_steps

    g = tl.graph
    c = g.cols
    gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & g.alive & (c["launch"] >= 0))
    gpu = gpu[g.alive[c["launch"][gpu]]]
    out: list[dict[str, Any]] = []
    lanes = np.unique(c["lane"][gpu]).tolist()
    # Many ranks: the tracks share a budget, so the counters never outweigh the timeline.
    points = max(50, min(QUEUE_COUNTER_POINTS, QUEUE_COUNTER_BUDGET // max(len(lanes), 1)))
    for lane in lanes:
        on = gpu[c["lane"][gpu] == lane]
        t = np.r_[tl.start[c["launch"][on]], tl.end[on]]
        d = np.r_[np.ones(on.size, np.int64), -np.ones(on.size, np.int64)]
        order = np.lexsort((d, t))  # at equal times the slot frees first
        t, q = t[order], np.cumsum(d[order])
        last_t, last_q = t[-1], q[-1]
        t, q = downsample_steps(t, q, points)
        if t[-1] != last_t or q[-1] != last_q:  # a bin's peak hides where the queue ends
            t, q = np.r_[t, last_t], np.r_[q, last_q]
        ln = g.lanes[lane]
        name = f"launch queue · {ln.name}"
        pid = pid_of[ln.rank]
        out.extend(
            {"ph": "C", "name": name, "pid": pid, "ts": ts / 1000.0, "args": {"pending": n}}
            for ts, n in zip(t.tolist(), q.tolist(), strict=True)
        )
    return out


def export_timelines(timelines: list[tuple[str, Timeline]], path: str) -> None:
    """Write labelled timelines side by side to `path` (.json or .json.gz)."""
    events: list[dict[str, Any]] = []
    for i, (label, tl) in enumerate(timelines):
        events.extend(timeline_events(tl, label, pid_base=1000 * (i + 1)))
    doc = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"generator": "perfcast"}}
    data = msgspec.json.encode(doc)
    if path.endswith(".gz"):
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        with open(path, "wb") as fh:
            fh.write(data)
