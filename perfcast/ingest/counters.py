"""The counter values of CUPTI range-profiler events (`cuda_profiler_range`).

torch.profiler records GPU performance counters when asked for metrics
(`experimental_config=torch.profiler._ExperimentalConfig(profiler_metrics=[...])`): CUPTI's
range profiler then replays every kernel once per counter pass and writes one
`cuda_profiler_range` event per kernel, named after it, with each metric's value in `args`.
Those args have arbitrary names, so the event table does not keep them; this module reads
them again from the file, only when an analysis asks for them and the table holds such
events. The whole file is decoded once with the args left as raw bytes; only the counter
events' args are decoded further.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from perfcast.errors import PerfcastError
from perfcast.ingest.reader import fix_utf8, flatten_deep, read_inflated, scan

COUNTER_CATEGORY = "cuda_profiler_range"
# A counter trace holds one event per kernel of a few steps; past this inflated size the
# values are not read again (the analysis says so) rather than hold the whole file in memory.
MAX_REREAD_BYTES = 1 << 30
MAX_SALVAGE_BYTES = 256 << 20  # a damaged file is searched event by event up to this size
_NEEDLE = b'"cuda_profiler_range"'


class _Event(msgspec.Struct, gc=False):
    cat: Any = None
    name: Any = None
    ts: Any = None
    args: msgspec.Raw = msgspec.Raw(b"null")


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event] = []  # noqa: N815 (msgspec copies the default)


@dataclass
class CounterRange:
    """One kernel's counters, in file order."""

    name: str
    ts: float
    values: dict[str, float]  # metric name -> value (numbers only)


def _decode_whole(data: bytes) -> list[_Event]:
    try:
        return msgspec.json.decode(data, type=_Trace).traceEvents
    except RecursionError:
        # Values nested past the reader's limit become null, as the reader reads them.
        return msgspec.json.decode(flatten_deep(data)[0], type=_Trace).traceEvents


def _salvage(data: bytes) -> list[_Event]:
    """The counter events that are complete in a cut or damaged file, each decoded alone:
    the innermost object around each `"cuda_profiler_range"` string, when it closes."""
    if len(data) > MAX_SALVAGE_BYTES:
        return []
    needles: list[int] = []
    at = data.find(_NEEDLE)
    while at >= 0:
        needles.append(at)
        at = data.find(_NEEDLE, at + len(_NEEDLE))
    if not needles:
        return []
    pos, codes, before = scan(data)
    idx = np.searchsorted(pos, np.asarray(needles, dtype=np.int64))
    depth = np.where(idx < pos.size, before[np.minimum(idx, pos.size - 1)], 0)
    found: list[tuple[int, _Event]] = []
    # Per depth (usually one: the event list's), the openers one level up and the closers at
    # that level, by index into the structural characters: searched, not scanned, per event.
    for d in np.unique(depth).tolist():
        sel = np.flatnonzero(depth == d)
        openers = np.flatnonzero((codes == 123) & (before == d - 1))
        closers = np.flatnonzero((codes == 125) & (before == d))
        o = np.searchsorted(openers, idx[sel], side="left") - 1
        c = np.searchsorted(closers, idx[sel], side="left")
        for k in np.flatnonzero((o >= 0) & (c < closers.size)).tolist():
            first, last = int(pos[openers[o[k]]]), int(pos[closers[c[k]]])
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError, ValueError):
                ev = msgspec.json.decode(data[first : last + 1], type=_Event)
                found.append((needles[int(sel[k])], ev))
    found.sort(key=lambda pair: pair[0])
    return [ev for _, ev in found]


def read_counter_ranges(path: str) -> tuple[list[CounterRange], str | None]:
    """The `cuda_profiler_range` events of one trace file, in the order they were written,
    and a note when some could not be read (a cut or damaged file: every complete counter
    event is kept, as the reader keeps every complete event).

    Raises PerfcastError when the file cannot be read again or inflates past 1 GiB.
    """
    data, cut = read_inflated(path, MAX_REREAD_BYTES)
    if len(data) > MAX_REREAD_BYTES:
        raise PerfcastError(
            f"the counter values were not read again: the trace inflates past "
            f"{MAX_REREAD_BYTES >> 30} GiB"
        )
    if not _is_utf8(data):
        data = fix_utf8(data)
    note = None
    try:
        events = _decode_whole(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError):
        events = _salvage(data)
        found = data.count(_NEEDLE)
        note = (
            f"the file is {'cut' if cut else 'cut or damaged'}: the counters of "
            f"{len(events):,} of "
            f"the {found:,} counter events it holds were read"
            + ("" if len(data) <= MAX_SALVAGE_BYTES else " (too large to salvage)")
        )
    out: list[CounterRange] = []
    for ev in events:
        if ev.cat != COUNTER_CATEGORY:
            continue
        values: dict[str, float] = {}
        try:
            raw = msgspec.json.decode(ev.args)
        except (msgspec.DecodeError, RecursionError, ValueError):
            raw = None
        if isinstance(raw, dict):
            for key, value in sorted(raw.items()):  # by name: the file's order means nothing
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                if number and math.isfinite(value):
                    values[str(key)] = float(value)
        ts = ev.ts if isinstance(ev.ts, (int, float)) and not isinstance(ev.ts, bool) else 0.0
        out.append(CounterRange(str(ev.name) if ev.name is not None else "", float(ts), values))
    return out, note


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
