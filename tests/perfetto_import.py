"""What Perfetto's JSON importer makes of an exported trace, for tests: its sort order, the
slice stack of each track, and how it binds flow arrows (v1 s/f events and v2 bind_id on
complete events). Written from the rules of Perfetto's trace processor (trace_sorter.h,
slice_tracker.cc, flow_tracker.cc, json_trace_parser_impl.cc): events are read by time,
complete events at one time the longest first and before any other event there; a slice
leaves its track's stack only when a later slice begins after its end; a v1 arrow binds to
the top of the stack when read, a v2 one to the slice that carries it; an arrow is drawn
from the slice that starts first."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

_LAST = 2**63


def to_ns(x: float) -> int:
    """A JSON µs value as Perfetto reads it (CoerceToTs: whole numbers exact, else rounded)."""
    if float(x) == math.trunc(x):
        return int(x) * 1000
    return math.floor(x * 1000.0 + 0.5) if x >= 0 else -math.floor(-x * 1000.0 + 0.5)


def track(e: dict[str, Any]) -> tuple[int, int]:
    pid, tid = e["pid"], e.get("tid", 0)
    return (pid, pid if tid == 0 and pid != 0 else tid)


@dataclass
class Imported:
    """flows: (index of the slice it comes out of, index of the one it goes into, cat) as
    Perfetto draws them (from the earlier slice); parent: each slice's enclosing slice (-1 at
    the top of its track); errors: what it would count or drop."""

    flows: list[tuple[int, int, str | None]] = field(default_factory=list)
    parent: dict[int, int] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))

    def error(self, kind: str, example: Any) -> None:
        self.errors[kind] += 1
        if len(self.examples[kind]) < 3:
            self.examples[kind].append(example)


def import_trace(events: list[dict[str, Any]]) -> Imported:
    out = Imported()

    def key(i: int) -> tuple[int, int, int]:
        e = events[i]
        ts = to_ns(e["ts"])
        return (ts, _LAST - to_ns(e["dur"]) if e["ph"] == "X" else _LAST, i)

    order = sorted((i for i, e in enumerate(events) if e["ph"] in ("X", "s", "f")), key=key)
    stacks: dict[tuple[int, int], list[tuple[int, int, int]]] = defaultdict(list)
    pending: dict[tuple[int, int], list[Any]] = defaultdict(list)
    v1: dict[tuple[Any, Any, Any], int] = {}
    v2: dict[int, int] = {}
    start = {i: to_ns(events[i]["ts"]) for i in order}

    def connect(existing: int, new: int, cat: str | None) -> None:
        # FlowTracker: the arrow comes out of whichever slice starts first.
        if start[existing] > start[new]:
            existing, new = new, existing
        out.flows.append((existing, new, cat))

    for i in order:
        e = events[i]
        t = track(e)
        ts = start[i]
        st = stacks[t]
        if e["ph"] == "X":
            dur = to_ns(e["dur"])
            while st:
                s0, e0, _ = st[-1]
                if e0 < ts or (e0 == ts and not (e0 == s0 and dur == 0)):
                    st.pop()
                    continue
                if ts < e0 < ts + dur:
                    out.error("slice overlaps an open slice on its track (spilled)", (e, st[-1]))
                break
            out.parent[i] = st[-1][2] if st else -1
            st.append((ts, ts + dur, i))
            for fid, cat in pending.pop(t, []):
                connect(v1[fid], i, cat)
            if "bind_id" in e:
                bid = e["bind_id"]
                if e.get("flow_out") and not e.get("flow_in"):
                    if bid in v2:
                        out.error("flow v2 id begun twice", e)
                    else:
                        v2[bid] = i
                elif e.get("flow_in") and not e.get("flow_out"):
                    if bid in v2:
                        connect(v2[bid], i, None)
                    else:
                        out.error("flow v2 end without a start", e)
                else:
                    out.error("flow v2 without one direction", e)
        else:
            fid = (e["id"], e.get("cat"), e.get("name"))
            if e["ph"] == "f" and e.get("bp") != "e":
                pending[t].append((fid, e.get("cat")))
                continue
            if not st:
                out.error(f"flow {e['ph']} with no slice on its track", e)
                continue
            s0, e0, j = st[-1]
            if not s0 <= ts <= e0:
                out.error(f"flow {e['ph']} binds to a slice that already ended", (e, events[j]))
            if e["ph"] == "s":
                if fid in v1:
                    out.error("flow v1 id begun twice", e)
                v1[fid] = j
            elif fid in v1:
                connect(v1[fid], j, e.get("cat"))
            else:
                out.error("flow f before its s", e)
    return out
