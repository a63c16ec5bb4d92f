"""Mutations of real traces, as a careless tool, a crashed job or a hostile colleague makes them.

Shared by the property-based fuzz tests (tests/test_fuzz.py, small seeds committed in
tests/data/fuzz/) and the long campaign (benchmarks/fuzz_campaign.py, every real trace).
Each mutator takes a random generator and a mutable `Doc` (the decoded trace, or already
its bytes) and says in a few words what it did; `mutate` chains one to three of them and
returns the file's bytes. Everything is a function of the seed: the same seed, the same file.

Structural mutators edit the decoded JSON (wrong types, duplicated or shuffled events,
cyclic flows, nested or replicated steps, huge numbers, markup in names, hostile shape
strings); byte-level ones edit the serialized file (flips in the JSON or in the gzip stream,
cuts, garbage). Deep nesting is spliced into the text, since no JSON encoder writes it.
"""

from __future__ import annotations

import copy
import gzip
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

# One spec per what-if model, as both the fuzz tests and the campaign rotate through them.
WHATIF_SPECS = (
    "faster-op:pattern=.,factor=2",
    "amp",
    "fused-optimizer",
    "cuda-graphs",
    "fuse-elementwise",
    "torch-compile",
    "torch-compile:mode=reduce-overhead",
    "dataloader-overlap",
    "remove-host-sync",
    "device:target=h100",
    "ddp:gpus=4",
    "activation-checkpointing",
    "batch-size:factor=2",
    "zero:gpus=16,stage=3,params_mb=8",
    "tensor-parallel:tp=2",
    "pipeline-parallel:pp=2",
)

# Every field the ingest layer reads, events and args (see perfcast.ingest.schema).
EVENT_KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "s", "bp", "args")
ARG_KEYS = (
    "External id",
    "external id",
    "correlation",
    "Sequence number",
    "Fwd thread id",
    "device",
    "stream",
    "grid",
    "block",
    "bytes",
    "wait_on_stream",
    "wait_on_cuda_event_record_corr_id",
    "Bytes",
    "Total Allocated",
    "Device Type",
    "Input Dims",
    "Input type",
    "Collective name",
    "In msg nelems",
    "Out msg nelems",
    "Group size",
    "dtype",
    "Process Group Ranks",
    "name",
)
HEADER_KEYS = ("deviceProperties", "distributedInfo", "baseTimeNanoseconds", "schemaVersion")
CATEGORIES = (
    "cpu_op",
    "user_annotation",
    "python_function",
    "cuda_runtime",
    "cuda_driver",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_user_annotation",
    "cuda_sync",
    "Operator",
    "Runtime",
    "Kernel",
    "Memcpy",
    "cpu_instant_event",
    "ac2g",
    "fwdbwd",
    "Trace",
    "",
    "KERNEL",
)
MARKUP = (
    "[bold red]x[/bold red]",
    "[/]",
    "[link=file:///etc/passwd]x[/link]",
    "<script>alert(1)</script>",
    "</title><h1>x",
    "\x1b[31mred\x1b[0m",
    "\x1b]0;title\x07",
    "line\nbreak\r\nagain",
    "nul\x00byte",
    "\u202eright-to-left",
    "%s%n%x{0}{name}",
    "\\u0000",
    "ProfilerStep#",
    "ProfilerStep#1",
    "x" * 100_000,
    "😀" * 1000,
)
# A placeholder swapped for deep nesting after serialization.
_DEEP = "\u0000perfcast-deep\u0000"


def _wrong_value(rng: random.Random) -> Any:
    """A value of a type no field expects, or an extreme one of the right type."""
    return rng.choice(
        [
            {},
            {"a": 1, "b": [1, 2]},
            [],
            [1, 2, 3],
            [[[]]],
            None,
            True,
            False,
            0,
            -1,
            2**64,
            -(2**70),
            10**30,
            1.5,
            -0.0,
            1e308,
            -1e308,
            5e-324,
            "",
            "x",
            "123",
            "-7",
            "1e999",
            "stream 7",
            rng.choice(MARKUP),
        ]
    )


_HUGE = (2**63, 2**63 - 1, -(2**63) - 1, 2**64 + 1, 10**40, -(10**40), 1e300, -1e300, 2**53 + 1)


@dataclass
class Doc:
    """A trace being mutated: decoded JSON until a byte-level mutator turns it into bytes."""

    obj: Any
    gz: bool
    data: bytes | None = None  # set once serialized
    splices: dict[str, str] = field(default_factory=dict)  # placeholder -> raw JSON text

    def events(self) -> list[Any]:
        if isinstance(self.obj, dict) and isinstance(self.obj.get("traceEvents"), list):
            return self.obj["traceEvents"]
        if isinstance(self.obj, list):
            return self.obj
        return []

    def dicts(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if isinstance(e, dict)]

    def text(self) -> bytes:
        """The JSON text (deep nesting spliced in); the bytes once a byte mutator ran."""
        if self.data is not None:
            return self.data
        text = msgspec.json.encode(self.obj)
        for key, raw in self.splices.items():
            text = text.replace(msgspec.json.encode(key), raw.encode())
        return text

    def file_bytes(self) -> bytes:
        if self.data is not None:
            return self.data
        raw = self.text()
        return gzip.compress(raw, compresslevel=1, mtime=0) if self.gz else raw


Mutator = Callable[[random.Random, Doc], str]


def _pick(rng: random.Random, items: list[Any], k: int) -> list[Any]:
    return rng.sample(items, min(k, len(items))) if items else []


def _by_cat(doc: Doc, *cats: str) -> list[dict[str, Any]]:
    want = {c.lower() for c in cats}
    return [e for e in doc.dicts() if str(e.get("cat", "")).lower() in want]


def wrong_types(rng: random.Random, doc: Doc) -> str:
    """Put a value of the wrong type (or an extreme one) in event and args fields."""
    events = doc.dicts()
    n = rng.choice([1, 1, 3, 20, max(len(events) // 10, 1)])
    where = []
    for ev in _pick(rng, events, n):
        if rng.random() < 0.5:
            key = rng.choice(EVENT_KEYS)
            ev[key] = _wrong_value(rng)
        else:
            key = rng.choice(ARG_KEYS)
            args = ev.get("args")
            if not isinstance(args, dict):
                args = ev["args"] = {}
            args[key] = _wrong_value(rng)
        where.append(key)
    return f"wrong types in {len(where)} events ({', '.join(sorted(set(where))[:6])})"


def drop_fields(rng: random.Random, doc: Doc) -> str:
    events = doc.dicts()
    key = rng.choice(EVENT_KEYS)
    victims = _pick(rng, events, rng.choice([1, 10, len(events)]))
    for ev in victims:
        ev.pop(key, None)
    return f"removed '{key}' from {len(victims)} events"


def huge_numbers(rng: random.Random, doc: Doc) -> str:
    keys = ("ts", "dur", "pid", "tid", "id")
    arg_keys = (
        "correlation",
        "External id",
        "Total Allocated",
        "Bytes",
        "bytes",
        "stream",
        "device",
        "In msg nelems",
        "Group size",
        "Sequence number",
    )
    victims = _pick(rng, doc.dicts(), rng.choice([1, 5, 50]))
    for ev in victims:
        value = rng.choice(_HUGE)
        r = rng.random()
        if r < 0.4:
            ev[rng.choice(keys)] = value
        elif r < 0.8:
            args = ev.setdefault("args", {})
            if isinstance(args, dict):
                args[rng.choice(arg_keys)] = value
        else:
            args = ev.setdefault("args", {})
            if isinstance(args, dict):
                args[rng.choice(["Input Dims", "grid", "block"])] = rng.choice(
                    [[[value, 3]], [value, 1, 1], [[2**31, 2**31], [2**40]]]
                )
    return f"huge numbers in {len(victims)} events"


def duplicate_events(rng: random.Random, doc: Doc) -> str:
    events = doc.events()
    if not events:
        return "no events to duplicate"
    i = rng.randrange(len(events))
    j = min(len(events), i + rng.choice([1, 10, 100, len(events)]))
    piece = copy.deepcopy(events[i:j])
    times = rng.choice([1, 2, 5])
    at = rng.randrange(len(events) + 1)
    for _ in range(times):
        events[at:at] = copy.deepcopy(piece)
    return f"duplicated {len(piece)} events x{times}"


def shuffle_events(rng: random.Random, doc: Doc) -> str:
    events = doc.events()
    if rng.random() < 0.5:
        rng.shuffle(events)
        return f"shuffled all {len(events)} events"
    i = rng.randrange(len(events) + 1)
    j = min(len(events), i + rng.randrange(2, 200))
    window = events[i:j]
    rng.shuffle(window)
    events[i:j] = window
    return f"shuffled events {i}..{j}"


def shift_times(rng: random.Random, doc: Doc) -> str:
    """Out-of-order, negative and colliding times."""
    victims = _pick(rng, doc.dicts(), rng.choice([1, 10, 100]))
    how = rng.choice(["negate", "reverse", "same", "negative_dur", "jitter"])
    base = rng.choice([0, 1, 1_700_000_000_000_000])
    for ev in victims:
        ts = ev.get("ts")
        if not isinstance(ts, (int, float)):
            continue
        if how == "negate":
            ev["ts"] = -ts
        elif how == "reverse":
            ev["ts"] = base + 10**7 - (ts % 10**7)
        elif how == "same":
            ev["ts"] = base
        elif how == "negative_dur":
            ev["dur"] = -abs(ev.get("dur") or 1) if isinstance(ev.get("dur"), (int, float)) else -5
        else:
            ev["ts"] = ts + rng.uniform(-1000, 1000)
    return f"times: {how} on {len(victims)} events"


def cyclic_flows(rng: random.Random, doc: Doc) -> str:
    """Launch and forward/backward flows that point backwards, in circles, or nowhere."""
    events = doc.dicts()
    timed = [e for e in events if isinstance(e.get("ts"), (int, float)) and e.get("ph") == "X"]
    if len(timed) < 2:
        return "no events for flows"
    flows = []
    ids = [rng.choice([1, 2, 3, rng.randrange(1 << 20)]) for _ in range(rng.choice([1, 5, 50]))]
    for fid in ids:
        a, b = rng.sample(timed, 2)
        cat = rng.choice(["ac2g", "fwdbwd", "async", "async_cpu_to_gpu"])
        for ph, ev in (("s", a), ("f", b), ("s", b), ("f", a)):
            flows.append(
                {
                    "ph": ph,
                    "id": fid,
                    "pid": ev.get("pid"),
                    "tid": ev.get("tid"),
                    "ts": ev.get("ts"),
                    "cat": cat,
                    "name": cat,
                    "bp": "e",
                }
            )
    doc.events().extend(flows)
    return f"{len(ids)} cyclic flows"


def duplicate_correlations(rng: random.Random, doc: Doc) -> str:
    """Correlation ids that collide, or that tie a kernel to a launch long after it."""
    with_corr = [
        e for e in doc.dicts() if isinstance(e.get("args"), dict) and "correlation" in e["args"]
    ]
    if len(with_corr) < 2:
        return "no correlations"
    values = [e["args"]["correlation"] for e in with_corr]
    how = rng.choice(["collide", "shuffle", "one"])
    victims = _pick(rng, with_corr, rng.choice([2, 20, len(with_corr)]))
    for ev in victims:
        if how == "collide":
            ev["args"]["correlation"] = rng.choice(values)
        elif how == "shuffle":
            ev["args"]["correlation"] = rng.choice(values[:50])
        else:
            ev["args"]["correlation"] = values[0]
    # Matching External ids, so ops and kernels tie up across the trace as well.
    if rng.random() < 0.5:
        for ev in victims:
            ev["args"]["External id"] = ev["args"]["correlation"]
    return f"correlations: {how} on {len(victims)} events"


def change_categories(rng: random.Random, doc: Doc) -> str:
    victims = _pick(rng, doc.dicts(), rng.choice([1, 10, 100]))
    for ev in victims:
        if rng.random() < 0.8:
            ev["cat"] = rng.choice(CATEGORIES)
        else:
            ev["ph"] = rng.choice(["X", "i", "I", "B", "E", "s", "f", "t", "M", "C", "b", "e", "?"])
    return f"changed the category or phase of {len(victims)} events"


def mangle_steps(rng: random.Random, doc: Doc) -> str:
    """Nested, replicated, overlapping, renamed, retyped or missing ProfilerSteps."""
    events = doc.events()
    steps = [e for e in doc.dicts() if str(e.get("name", "")).startswith("ProfilerStep")]
    timed = [
        e
        for e in doc.dicts()
        if e.get("ph") == "X"
        and isinstance(e.get("ts"), (int, float))
        and isinstance(e.get("dur"), (int, float))
    ]
    how = rng.choice(["nest", "replicate", "overlap", "rename", "retype", "remove", "invent"])
    if how == "nest" and steps:
        lo = min(s["ts"] for s in steps if isinstance(s.get("ts"), (int, float))) - 1
        hi = max(s["ts"] + s.get("dur", 0) for s in steps if isinstance(s.get("ts"), (int, float)))
        outer = dict(steps[0], name=f"ProfilerStep#{rng.randrange(100)}", ts=lo, dur=hi - lo + 2)
        events.append(outer)
        inner = dict(steps[-1], name=f"ProfilerStep#{rng.randrange(100)}")
        inner["dur"] = max(float(inner.get("dur") or 0) / 3, 0)
        events.append(inner)
    elif how == "replicate" and steps:
        for s in _pick(rng, steps, 3):
            for k in range(rng.choice([1, 3])):
                dup = dict(s)
                if isinstance(dup.get("ts"), (int, float)):
                    dup["ts"] = dup["ts"] + rng.choice([0, 1, -1, 1000 * k])
                events.append(dup)
    elif how == "overlap" and steps:
        for s in steps:
            if isinstance(s.get("dur"), (int, float)):
                s["dur"] = s["dur"] * rng.choice([1.5, 3, 100])
    elif how == "rename" and steps:
        for s in steps:
            s["name"] = rng.choice(["ProfilerStep#1", "ProfilerStep#", "ProfilerStep#x", "Step"])
    elif how == "retype" and steps:
        for s in steps:
            s["cat"] = rng.choice(CATEGORIES)
            if rng.random() < 0.3:
                s["ph"] = rng.choice(["i", "B", "E"])
    elif how == "remove" and steps:
        for s in steps:
            events.remove(s)
    elif timed:
        # Steps made up over random spans of the trace, on random threads.
        for k in range(rng.choice([1, 2, 5])):
            a = rng.choice(timed)
            events.append(
                {
                    "ph": "X",
                    "cat": rng.choice(["user_annotation", "cpu_op", "kernel"]),
                    "name": f"ProfilerStep#{k}",
                    "pid": a.get("pid"),
                    "tid": a.get("tid"),
                    "ts": a["ts"],
                    "dur": a["dur"] * rng.choice([1, 10, 1000]),
                }
            )
        how = "invent"
    return f"steps: {how}"


def deep_nesting(rng: random.Random, doc: Doc) -> str:
    depth = rng.choice([64, 300, 999, 1000, 3000, 100_000])
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
    raw = opener * depth + "1" + closer * depth
    key = f"{_DEEP}{len(doc.splices)}"
    doc.splices[key] = raw
    where = rng.choice(["args", "event", "header", "field", "dims"])
    events = doc.dicts()
    if where == "header" and isinstance(doc.obj, dict):
        doc.obj[rng.choice([*HEADER_KEYS, "extra"])] = key
    elif where == "event" and doc.events():
        doc.events().insert(rng.randrange(len(doc.events()) + 1), key)
    elif events:
        ev = rng.choice(events)
        if where == "field":
            ev[rng.choice(EVENT_KEYS)] = key
        else:
            args = ev.get("args")
            if not isinstance(args, dict):
                args = ev["args"] = {}
            args["Input Dims" if where == "dims" else rng.choice(ARG_KEYS)] = key
    return f"nesting {depth} deep in {where}"


def markup_names(rng: random.Random, doc: Doc) -> str:
    victims = _pick(rng, doc.dicts(), rng.choice([1, 10, 100]))
    for ev in victims:
        text = rng.choice(MARKUP)
        r = rng.random()
        if r < 0.6:
            ev["name"] = text
        elif r < 0.8:
            ev["cat"] = text
        else:
            args = ev.setdefault("args", {})
            if isinstance(args, dict):
                args[rng.choice(["Collective name", "dtype", "name", "Process Group Ranks"])] = text
    if isinstance(doc.obj, dict) and rng.random() < 0.3:
        doc.obj["deviceProperties"] = [{"name": rng.choice(MARKUP), "id": 0}]
    return f"markup in the names of {len(victims)} events"


def hostile_shapes(rng: random.Random, doc: Doc) -> str:
    texts = [
        "[" * 100_000,
        "[[1, 2]",
        "9" * 50_000,
        "(" * 1000 + ")" * 1000,
        "[1e999]",
        "[[" + ",".join(["1"] * 200_000) + "]]",
        "__import__('os').system('true')",
        "[[-1, -2]]",
        "[[18446744073709551616, 3]]",
        "[[2**64]]",
        "((1, 2),)",
        "[[1, 2], 'x', None, {}]",
        "[" * 500 + "]" * 500,
        "",
    ]
    ops = [e for e in doc.dicts() if str(e.get("cat", "")).lower() in ("cpu_op", "operator")]
    victims = _pick(rng, ops or doc.dicts(), rng.choice([1, 10, 100]))
    for ev in victims:
        args = ev.get("args")
        if not isinstance(args, dict):
            args = ev["args"] = {}
        args["Input Dims"] = rng.choice(texts)
    return f"hostile Input Dims in {len(victims)} ops"


def mangle_header(rng: random.Random, doc: Doc) -> str:
    if not isinstance(doc.obj, dict):
        return "no header"
    key = rng.choice(
        [*HEADER_KEYS, "traceEvents", "distributedInfo.rank", "deviceProperties[0]", "hostname"]
    )
    value = _wrong_value(rng)
    if key == "distributedInfo.rank":
        doc.obj["distributedInfo"] = {
            "rank": rng.choice([-1, 2**40, 2**70, "3", [1], None, 1.5]),
            "world_size": rng.choice([0, -2, 2**70, "8", None]),
            "backend": rng.choice(["nccl", 5, None, {}]),
        }
    elif key == "deviceProperties[0]":
        keys = ("id", "name", "numSms", "totalGlobalMem", "computeMajor")
        doc.obj["deviceProperties"] = [{k: _wrong_value(rng) for k in keys}]
    elif key == "traceEvents":
        if rng.random() < 0.5:
            doc.obj["traceEvents"] = value
        else:  # the list repeated under a second key: last one wins in JSON
            doc.obj["traceEvents2"] = doc.obj.get("traceEvents")
    else:
        doc.obj[key] = value
    return f"header: {key}"


def flip_bytes(rng: random.Random, doc: Doc) -> str:
    """Flip bytes of the JSON, or of the gzip stream when the file is gzipped."""
    data = bytearray(doc.file_bytes())
    n = rng.choice([1, 1, 2, 5, 50])
    lo = 10 if doc.gz else 0  # keep the gzip header: a flip there is just "not gzip"
    if len(data) <= lo:
        return "too short to flip"
    for _ in range(n):
        i = rng.randrange(lo, len(data))
        if rng.random() < 0.5:
            data[i] ^= 1 << rng.randrange(8)
        else:
            data[i] = ord(rng.choice('{}[]",:0\\\x00'))
    doc.data = bytes(data)
    return f"flipped {n} bytes of the {'gzip' if doc.gz else 'JSON'}"


def cut(rng: random.Random, doc: Doc) -> str:
    data = doc.file_bytes()
    frac = rng.choice([rng.random(), rng.uniform(0.95, 1.0), rng.uniform(0.0, 0.05)])
    at = int(len(data) * frac)
    doc.data = data[:at]
    return f"cut the {'gzip' if doc.gz else 'JSON'} at {frac:.1%}"


def garbage(rng: random.Random, doc: Doc) -> str:
    data = doc.file_bytes()
    junk = rng.choice(
        [
            bytes(rng.randrange(256) for _ in range(rng.choice([1, 16, 4096]))),
            b"\x00" * 1000,
            b"\xef\xbb\xbf",
            b"}]}",
            b'{"traceEvents": [',
            gzip.compress(b"more", mtime=0),
        ]
    )
    where = rng.choice(["append", "prepend", "insert"])
    if where == "append":
        doc.data = data + junk
    elif where == "prepend":
        doc.data = junk + data
    else:
        i = rng.randrange(len(data) + 1)
        doc.data = data[:i] + junk + data[i:]
    return f"{len(junk)} garbage bytes ({where})"


def recompress(rng: random.Random, doc: Doc) -> str:
    """Gzip framing oddities: several members, raw deflate, zlib header."""
    raw = doc.text()
    how = rng.choice(["members", "zlib", "double"])
    if how == "members":
        mid = rng.randrange(len(raw) + 1)
        doc.data = gzip.compress(raw[:mid], mtime=0) + gzip.compress(raw[mid:], mtime=0)
    elif how == "zlib":
        doc.data = zlib.compress(raw)
    else:
        doc.data = gzip.compress(gzip.compress(raw, mtime=0), mtime=0)
    return f"compression: {how}"


STRUCTURAL: dict[str, Mutator] = {
    "wrong_types": wrong_types,
    "drop_fields": drop_fields,
    "huge_numbers": huge_numbers,
    "duplicate_events": duplicate_events,
    "shuffle_events": shuffle_events,
    "shift_times": shift_times,
    "cyclic_flows": cyclic_flows,
    "duplicate_correlations": duplicate_correlations,
    "change_categories": change_categories,
    "mangle_steps": mangle_steps,
    "deep_nesting": deep_nesting,
    "markup_names": markup_names,
    "hostile_shapes": hostile_shapes,
    "mangle_header": mangle_header,
}
BYTES: dict[str, Mutator] = {
    "flip_bytes": flip_bytes,
    "cut": cut,
    "garbage": garbage,
    "recompress": recompress,
}
MUTATORS: dict[str, Mutator] = {**STRUCTURAL, **BYTES}


@dataclass
class Seed:
    """A real trace to start from. Its events are kept as their JSON text, one by one, so a
    mutation decodes only the window it uses (big seeds stay cheap to mutate)."""

    path: Path
    gz: bool
    header: Any  # the document without its events (None for a bare event list)
    events: list[bytes]

    def __repr__(self) -> str:  # short: hypothesis prints the arguments of a failing case
        return f"Seed({self.path.name}, {len(self.events)} events)"

    @classmethod
    def read(cls, path: str | Path) -> Seed:
        p = Path(path)
        raw = p.read_bytes()
        gz = raw[:2] == b"\x1f\x8b"
        text = gzip.decompress(raw) if gz else raw
        doc = msgspec.json.decode(text, type=dict[str, msgspec.Raw] | list[msgspec.Raw])
        if isinstance(doc, list):
            return cls(p, gz, None, [bytes(e) for e in doc])
        events = doc.pop("traceEvents", None)
        listed = msgspec.json.decode(events, type=list[msgspec.Raw]) if events else []
        header = {k: msgspec.json.decode(v) for k, v in doc.items()}
        return cls(p, gz, header, [bytes(e) for e in listed])

    def document(self, start: int = 0, stop: int | None = None) -> Any:
        """A fresh, decoded copy of the trace with events[start:stop] (mutators edit it)."""
        events = msgspec.json.decode(b"[" + b",".join(self.events[start:stop]) + b"]")
        if self.header is None:
            return events
        return {**msgspec.json.decode(msgspec.json.encode(self.header)), "traceEvents": events}


def mutate(
    rng: random.Random,
    seed: Seed,
    names: list[str] | None = None,
    max_events: int | None = None,
) -> tuple[bytes, bool, list[str]]:
    """(file bytes, gzipped?, what was done): 1-3 structural mutations, maybe one byte-level.

    `names` picks the mutators (in order) instead of drawing them.
    """
    start, stop = 0, None
    if max_events is not None and len(seed.events) > max_events:
        # A contiguous window of events: big seeds stay quick to run.
        start = rng.randrange(len(seed.events) - max_events + 1)
        stop = start + max_events
    gz = seed.gz if rng.random() < 0.8 else not seed.gz
    doc = Doc(obj=seed.document(start, stop), gz=gz)
    if names is None:
        names = rng.sample(sorted(STRUCTURAL), rng.choice([1, 1, 2, 3]))
        if rng.random() < 0.35:
            names.append(rng.choice(sorted(BYTES)))
        elif rng.random() < 0.1:
            names = [rng.choice(sorted(BYTES))]
    done = []
    for name in names:
        fn = MUTATORS[name]
        if name in STRUCTURAL and doc.data is not None:
            continue  # already bytes
        done.append(f"{name}: {fn(rng, doc)}")
    data = doc.file_bytes()
    # A byte-level mutator decides the framing itself (recompress makes gzip of plain JSON).
    is_gz = data[:2] == b"\x1f\x8b"
    return data, is_gz, done
