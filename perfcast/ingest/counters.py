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

import gzip
import math
from dataclasses import dataclass
from typing import Any

import msgspec

from perfcast.errors import PerfcastError
from perfcast.ingest.reader import flatten_deep

COUNTER_CATEGORY = "cuda_profiler_range"
# A counter trace holds one event per kernel of a few steps; past this inflated size the
# values are not read again (the analysis says so) rather than hold the whole file in memory.
MAX_REREAD_BYTES = 1 << 30


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


def read_counter_ranges(path: str) -> list[CounterRange]:
    """The `cuda_profiler_range` events of one trace file, in the order they were written.

    Raises PerfcastError when the file cannot be decoded whole (a cut or damaged file keeps
    its other events in the table; only these values are lost) or is too large to read again.
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
            fh.seek(0)
            if head == b"\x1f\x8b":
                with gzip.GzipFile(fileobj=fh) as gz:
                    data = gz.read(MAX_REREAD_BYTES + 1)
            else:
                data = fh.read(MAX_REREAD_BYTES + 1)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise PerfcastError(f"the counter values could not be read again ({exc})") from None
    if len(data) > MAX_REREAD_BYTES:
        raise PerfcastError(
            f"the counter values were not read again: the trace inflates past "
            f"{MAX_REREAD_BYTES >> 30} GiB"
        )
    try:
        try:
            events = msgspec.json.decode(data, type=_Trace).traceEvents
        except UnicodeDecodeError:
            # Invalid UTF-8 becomes U+FFFD, as the reader reads it.
            data = bytes(data).decode("utf-8", errors="replace").encode()
            events = msgspec.json.decode(data, type=_Trace).traceEvents
        except RecursionError:
            # Values nested past the reader's limit become null, as the reader reads them.
            events = msgspec.json.decode(flatten_deep(data)[0], type=_Trace).traceEvents
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError) as exc:
        raise PerfcastError(
            f"the counter values could not be decoded (the file is damaged or cut: {exc})"
        ) from None
    out: list[CounterRange] = []
    for ev in events:
        if ev.cat != COUNTER_CATEGORY:
            continue
        values: dict[str, float] = {}
        if ev.cat == COUNTER_CATEGORY:
            try:
                raw = msgspec.json.decode(ev.args)
            except (msgspec.DecodeError, RecursionError, ValueError):
                raw = None
            if isinstance(raw, dict):
                for key, value in raw.items():
                    number = isinstance(value, (int, float)) and not isinstance(value, bool)
                    if number and math.isfinite(value):
                        values[str(key)] = float(value)
        ts = ev.ts if isinstance(ev.ts, (int, float)) and not isinstance(ev.ts, bool) else 0.0
        out.append(CounterRange(str(ev.name) if ev.name is not None else "", float(ts), values))
    return out
