"""Bytes in, events and header out: gzip, JSON decoding, salvage of cut or damaged files.

One reader for every file, plain or gzipped, whole, cut off or damaged. The file is inflated
a block at a time; the event list is decoded a few MB of whole events at a time (memory
stays near the size of the columns, not the JSON); what surrounds the list (the header:
device properties, rank, base time) is decoded at the end.

Salvage. A killed job leaves a file cut anywhere, often inside the gzip stream; a flipped
bit leaves a damaged stretch in the middle. Every complete event is kept: those before a
damaged stretch and those after it (decoding resumes at the next event boundary, `},{`).
What was lost is reported in bytes of the file on disk (compressed bytes for gzip); after a
cut, what the file would have held is unknown and the note says so.

Limits, each with its own message: values nested deeper than MAX_DEPTH levels become null
(counted); a single event larger than MAX_EVENT_BYTES is skipped; a file that inflates
more than MAX_INFLATION times (and past 1 GiB) is refused as a gzip bomb; a header without
an event list in its first MAX_HEADER_BYTES is refused. Cost is linear in the inflated
size: a well-formed slice is decoded once, and the search for damage (bisection over event
boundaries) may decode at most DECODE_BUDGET times the data before giving up on the rest.
"""

from __future__ import annotations

import bisect
import errno
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from perfcast.errors import NotATraceError, TraceFormatError, UnreadableTraceError
from perfcast.ingest.checks import DropLog, check_event, json_type
from perfcast.ingest.schema import (
    FastEvent,
    PreciseEvent,
    RawEvent,
    RawTrace,
    Stamp,
    exact_float,
    rounded_by_float,
)

EventList = list[Any]  # RawEvent or FastEvent structs (same attribute names)

SLICE_BYTES = 4 << 20  # events are decoded about this many bytes at a time
MAX_DEPTH = 200  # deeper JSON values become null (msgspec recurses; Python's limit is 1000)
MAX_EVENT_BYTES = 64 << 20
MAX_HEADER_BYTES = 64 << 20
MAX_INFLATION = 250  # JSON traces compress 5-30x; far more is a decompression bomb
_BOMB_FLOOR = 1 << 30  # below this, any ratio is fine
DECODE_BUDGET = 32  # damage search: decoded bytes at most this many times the data read
_MAX_MERGE = 8  # event boundaries found inside one event (`},{` in nested args or a name)
_RECOVER_WINDOW = 1 << 20  # damage search: how far one step looks ahead
_MIN_WINDOW = 1 << 12  # ... right after damage
_MERGE_SPAN = 1 << 16  # ... and how far past a damaged byte it splits into pieces
_BAD_RUN_LIMIT = 1 << 20  # damage with little between: probe ahead instead (see _recover_step)
_PROBE_STRIDE = 1 << 20
_GOOD_RUN = 1 << 16

_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
_BLOCK = 1 << 22
_GZ_IN = 1 << 14  # small: inflated offsets map back to file offsets closely
_EVENT_GAP = re.compile(rb"\}\s*,\s*\{")
# Values JavaScript writes and JSON does not allow: a stretch holding one is not damage.
# (Also a number spelled from one, "NaN2.6": a writer's bug as well, said the same way.)
_NON_JSON_NUMBER = re.compile(rb":\s*-?(?:NaN|Infinity)[\w.+-]*\s*[,}\]]")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*')
# A PyTorch Execution Trace (ExecutionTraceObserver, Chakra) starts with its schema, then
# its op nodes; users hand it over by mistake since it is written beside the Kineto trace.
_EXECUTION_TRACE = re.compile(
    rb'^\s*\{\s*"schema"\s*:\s*"([^"\\]{0,64})"[^\[]{0,400}"nodes"\s*:\s*\['
)
_LEAD = re.compile(rb"[\s,]*")
# How many cut points a damaged header is tried at (each a small decode).
_MAX_HEADER_TRIES = 2_000
# After the event list's "]": more header keys, the object's end, or the end of the data.
_HEADER_START = re.compile(rb"\s*(?:,|\}|$)")
_NONSPACE = re.compile(rb"\S")
# An event's phase ("ph": "X"), which no trace header holds; looked for this far after a "]"
# that may end the event list.
_EVENT_PHASE = re.compile(rb'"ph"\s*:\s*"[A-Za-z]"')
_HEADER_PEEK = 1 << 20
_ERROR_AT = re.compile(r"\(byte (\d+)\)")

# What a file that is not JSON may be instead, for the message (after gzip is inflated).
_OTHER_FORMATS = (
    (_GZIP_MAGIC, "gzip inside gzip: inflate it once more"),
    (b"PK\x03\x04", "a zip archive: unpack it first"),
    (b"BZh", "bzip2: decompress it first"),
    (b"\xfd7zXZ\x00", "xz: decompress it first"),
    (b"\x28\xb5\x2f\xfd", "zstd: decompress it first"),
    (b"\x78\x01", "zlib data without a gzip header"),
    (b"\x78\x9c", "zlib data without a gzip header"),
    (b"\x78\xda", "zlib data without a gzip header"),
    (b"<", "HTML or XML (a download page saved instead of the file?)"),
    (b"SQLite format 3\x00", "an SQLite database, such as an Nsight Systems export"),
    # pickle protocols 2 to 5 (torch.save before 1.6, profiler objects saved whole)
    (b"\x80\x02", "a Python pickle"),
    (b"\x80\x03", "a Python pickle"),
    (b"\x80\x04", "a Python pickle"),
    (b"\x80\x05", "a Python pickle"),
    # Text in another encoding than UTF-8 (a trace saved by an editor or PowerShell): the
    # four-byte marks before the two-byte one they begin with.
    (b"\xff\xfe\x00\x00", "UTF-32 text: save it as UTF-8"),
    (b"\x00\x00\xfe\xff", "UTF-32 text: save it as UTF-8"),
    (b"\xff\xfe", "UTF-16 text: save it as UTF-8"),
    (b"\xfe\xff", "UTF-16 text: save it as UTF-8"),
)

_fast_list = msgspec.json.Decoder(list[FastEvent])  # type: ignore[valid-type]
_precise_list = msgspec.json.Decoder(
    list[PreciseEvent],  # type: ignore[valid-type]
    float_hook=exact_float,
)
# Events looked at to tell whether a trace's timestamps need the precise decoder.
_PRECISION_SAMPLE = 64
_lenient_list = msgspec.json.Decoder(list[RawEvent])  # type: ignore[valid-type]
_lenient_one = msgspec.json.Decoder(RawEvent)
# The lenient structs read "ts" as a float; these give back the literals a float64 rounds.
_stamps_list = msgspec.json.Decoder(list[Stamp], float_hook=exact_float)  # type: ignore[valid-type]
_stamp_one = msgspec.json.Decoder(Stamp, float_hook=exact_float)
_header_decoder = msgspec.json.Decoder(RawTrace)


# ---------------------------------------------------------------------------------------------
# Bytes: plain or gzip, cut or corrupt.


def os_error_hint(exc: OSError) -> str | None:
    """What to do about a file the system will not open, by why."""
    if exc.errno == errno.ELOOP:
        return (
            "it is a symbolic link that leads back to itself: point it at the trace "
            "(`ls -l` shows where it points)"
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (
            "`ls -l` shows who may read it and its folders; ask their owner, or copy the "
            "trace where you can read it"
        )
    return None


class _Source:
    """Inflated blocks of a file. A cut or corrupt gzip stream ends the blocks early and is
    described in `problem`; `file_offset` maps an inflated offset to one in the file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.size = 0
        self.gz = False
        self.problem: str | None = None  # the gzip stream is cut or corrupt
        self.problem_at: int | None = None  # where, in bytes of the file
        self.trailing: str | None = None  # data after the end of the gzip stream
        self.cut = False  # the gzip stream just stops (as opposed to being corrupt)
        self.produced = 0
        self._marks_out: list[int] = [0]  # inflated offset ...
        self._marks_in: list[int] = [0]  # ... and the file offset consumed to produce it

    def open(self) -> Any:
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 (the generator closes it)
            self.size = os.fstat(fh.fileno()).st_size
            self.gz = fh.read(2) == _GZIP_MAGIC
            fh.seek(0)
            return fh
        except IsADirectoryError:
            raise TraceFormatError("is a folder, expected a trace file", path=self.path) from None
        except FileNotFoundError:
            raise UnreadableTraceError("no such file", path=self.path) from None
        except OSError as exc:
            why = "permission denied" if isinstance(exc, PermissionError) else exc.strerror
            raise UnreadableTraceError(
                f"cannot be read ({why or exc})", path=self.path, hint=os_error_hint(exc)
            ) from None

    def blocks(self) -> Iterator[bytes]:
        fh = self.open()
        with fh:
            if not self.gz:
                while block := fh.read(_BLOCK):
                    self._mark(len(block), fh.tell())
                    yield block
                return
            yield from self._inflate(fh)

    def _mark(self, n: int, consumed: int) -> None:
        self.produced += n
        self._marks_out.append(self.produced)
        self._marks_in.append(consumed)
        if self.produced > _BOMB_FLOOR and self.produced > MAX_INFLATION * max(self.size, 1):
            raise TraceFormatError(
                f"inflates to more than {MAX_INFLATION} times its size "
                f"({self.produced:,} bytes from {self.size:,}): not a trace, or a "
                "decompression bomb",
                path=self.path,
            )

    def _inflate(self, fh: Any) -> Iterator[bytes]:
        decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
        consumed = 0  # file bytes fully handed to zlib
        while True:
            block = fh.read(_GZ_IN)
            if not block:
                break
            data = block
            while data:
                if decomp.eof:
                    # Another gzip member (legal, rare), or junk after the stream.
                    if data[:2] != _GZIP_MAGIC:
                        rest = data + fh.read()
                        if rest.strip(b"\x00 \t\r\n"):
                            self.trailing = (
                                f"{len(rest):,} bytes after the end of the gzip stream were ignored"
                            )
                        return
                    decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
                before = decomp.copy()  # to find the damaged byte, should this fail
                try:
                    out = decomp.decompress(data, _BLOCK)
                except zlib.error as exc:
                    self.problem = f"the gzip stream is corrupt ({exc})"
                    good = _first_bad_byte(before, data)
                    self.problem_at = consumed + good
                    # What inflates before the damage is data too (all of it, when only
                    # the checksum at the end is wrong).
                    out = before.decompress(data[:good])
                    if out:
                        self._mark(len(out), consumed + good)
                        yield out
                    return
                left = len(decomp.unconsumed_tail) + (len(decomp.unused_data) if decomp.eof else 0)
                consumed += len(data) - left
                data = decomp.unused_data if decomp.eof else decomp.unconsumed_tail
                if out:
                    self._mark(len(out), consumed)
                    yield out
        if not decomp.eof:
            try:
                out = decomp.flush()
            except zlib.error:
                out = b""
            if out:
                self._mark(len(out), consumed)
                yield out
            self.problem = "the gzip stream ends early (the file is cut off)"
            self.problem_at = self.size
            self.cut = True

    def file_offset(self, pos: int) -> int:
        """The file offset that inflated offset `pos` came from: exact for plain files;
        for gzip, interpolated between the points where both offsets are known."""
        if not self.gz:
            return pos
        i = bisect.bisect_left(self._marks_out, pos)
        if i >= len(self._marks_out):
            return self._marks_in[-1]
        if i == 0 or self._marks_out[i] == pos:
            return self._marks_in[i]
        o0, o1 = self._marks_out[i - 1], self._marks_out[i]
        f0, f1 = self._marks_in[i - 1], self._marks_in[i]
        return f0 + round((f1 - f0) * (pos - o0) / max(o1 - o0, 1))


# ---------------------------------------------------------------------------------------------
# JSON structure, for the slow paths: where strings, nesting and list elements are.


def _first_bad_byte(state: Any, data: bytes) -> int:
    """Where in `data` the decompressor (`state`, before it saw `data`) fails: bisection."""
    lo, hi = 0, len(data)  # data[:lo] inflates; data[:hi] fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            state.copy().decompress(data[:mid])
            lo = mid
        except zlib.error:
            hi = mid
    return lo


def scan(data: bytes | bytearray | memoryview) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions of the structural characters `[]{},` outside strings, each one's code and
    the nesting depth before it (0 at the start of `data`). Vectorized, a window at a time."""
    a_all = np.frombuffer(data, dtype=np.uint8)
    window = 1 << 22
    in_str = 0
    depth = 0
    backslashes = 0  # trailing backslashes of the previous window (escape the next char)
    pos_parts, code_parts, depth_parts = [], [], []
    for w0 in range(0, a_all.size, window):
        a = a_all[w0 : w0 + window]
        quotes = np.flatnonzero(a == 34)
        is_bs = a == 92
        if quotes.size and (backslashes or is_bs.any()):
            idx = np.arange(a.size, dtype=np.int32)
            last_plain = np.maximum.accumulate(np.where(is_bs, -1, idx))
            prev = quotes - 1
            before = np.where(prev >= 0, last_plain[np.maximum(prev, 0)], -1)
            run = prev - before  # backslashes right before each quote
            run = np.where(before < 0, run + backslashes, run)
            quotes = quotes[(run & 1) == 0]
        toggles = np.zeros(a.size, dtype=np.int8)
        toggles[quotes] = 1
        parity = (np.cumsum(toggles, dtype=np.int32) + in_str) & 1
        structural = np.flatnonzero((a == 91) | (a == 93) | (a == 123) | (a == 125) | (a == 44))
        structural = structural[parity[structural] == 0]
        codes = a[structural]
        delta = np.where((codes == 91) | (codes == 123), 1, np.where(codes == 44, 0, -1))
        after = depth + np.cumsum(delta, dtype=np.int64)
        pos_parts.append(structural.astype(np.int64) + w0)
        code_parts.append(codes)
        depth_parts.append(after - delta)
        if after.size:
            depth = int(after[-1])
        in_str = int(parity[-1]) if a.size else in_str
        plain = np.flatnonzero(~is_bs)
        backslashes = (a.size - 1 - int(plain[-1])) if plain.size else backslashes + a.size
    if not pos_parts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, np.zeros(0, dtype=np.uint8), empty
    return np.concatenate(pos_parts), np.concatenate(code_parts), np.concatenate(depth_parts)


def flatten_deep(data: bytes | bytearray, limit: int = MAX_DEPTH) -> tuple[bytes, int, int | None]:
    """`data` with every value nested deeper than `limit` replaced by null.

    Returns (new data, how many values were replaced, offset of the first one).
    """
    pos, codes, before = scan(data)
    opener = (codes == 91) | (codes == 123)
    starts = pos[opener & (before == limit)]
    if starts.size == 0:
        return bytes(data), 0, None
    closes = pos[((codes == 93) | (codes == 125)) & (before == limit + 1)]
    # A value still open where the data ends (a cut file) runs to the end.
    ends = np.full(starts.size, len(data), dtype=np.int64)
    if closes.size:
        i = np.searchsorted(closes, starts)
        ends = np.where(i < closes.size, closes[np.minimum(i, closes.size - 1)] + 1, len(data))
    out = bytearray()
    prev = 0
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        if s < prev:  # inside a region already replaced
            continue
        out += data[prev:s]
        out += b"null"
        prev = e
    out += data[prev:]
    return bytes(out), int(starts.size), int(starts[0])


def _skip_space(data: bytes | bytearray, pos: int) -> int:
    """The first non-whitespace position at or after pos (an element's own first byte)."""
    m = _NONSPACE.search(data, pos)
    return m.start() if m else pos


def fix_utf8(data: bytes | bytearray) -> bytes:
    """Invalid UTF-8 replaced by U+FFFD, as the reader reads it."""
    return bytes(data).decode("utf-8", errors="replace").encode()


# ---------------------------------------------------------------------------------------------
# The reader.


class _Damage(Exception):  # noqa: N818 (a signal inside the reader)
    """A stretch of list elements failed to decode as JSON.

    kind: "closed" (a `]` ended the list at `at`), "truncated" (the data ends inside an
    element), "damage" (invalid JSON at `at`). `at` is relative to the stretch.
    """

    def __init__(self, kind: str, at: int, why: str) -> None:
        super().__init__(why)
        self.kind = kind
        self.at = at
        self.why = why


class _Repaired(Exception):  # noqa: N818 (a signal inside the reader)
    """A stretch was rewritten in place (deep values flattened, bad UTF-8 replaced)."""

    def __init__(self, end: int, old_end: int = 0) -> None:
        super().__init__("repaired")
        self.end = end
        self.old_end = old_end


@dataclass
class _Got:
    """A decoded stretch: events kept, elements looked at, and (why, element, offset) drops."""

    events: EventList
    seen: int
    drops: list[tuple[str, int, int | None]]
    kept_at: list[int] | None = None  # each event's element index, where some were dropped


def _why_invalid(piece: bytes | bytearray, exc: msgspec.ValidationError) -> str:
    """Why one list element is not an event, for the notes."""
    try:
        value = msgspec.json.decode(piece)
    except Exception:  # only for the message
        return f"cannot be read ({exc})"
    if not isinstance(value, dict):
        return f"the event is {json_type(value)}, not an object"
    if "args" in value and not isinstance(value["args"], (dict, type(None))):
        return f"'args' is {json_type(value['args'])}, expected an object"
    text = str(exc)
    return "a number is out of range" if "out of range" in text else f"cannot be read ({text})"


@dataclass
class Decoded:
    """What a file held besides its events: the header, and what reading it had to skip."""

    header: RawTrace
    truncated: bool = False
    tail_lost: bool = False  # the data stops inside the event list: later events are missing
    note: str | None = None  # salvage: what was lost, truthfully, one line
    warnings: list[str] = field(default_factory=list)
    # What the loss came from: "cut" (the file ends early), "corrupt" (a gzip stream), "invalid"
    # (only events holding NaN or Infinity were skipped) or "damaged" (anything else).
    damage: str | None = None
    stop: str | None = None  # with tail_lost: where and why reading stopped, for notes


class TraceReader:
    """Reads one trace file: `chunks()` yields its events slice by slice, then `result()`
    says what surrounded them and what was lost."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._src = _Source(path)
        self._buf = bytearray()
        self._base = 0  # inflated offset of _buf[0]
        self._blocks: Iterator[bytes] | None = None
        self._eof = False
        self._prefix: bytes | None = None  # the header up to and including the list's "["
        self._header: RawTrace | None = None
        self._closed = False  # the event list's "]" was seen
        self._cut_at: int | None = None  # the data ended inside the list, here (inflated)
        self._losses: list[tuple[int, int, str]] = []  # damaged stretches (inflated offsets)
        self._drops = DropLog()
        self._nested = 0  # values nested too deeply, read as null
        # The typed decoder: _fast_list, or _precise_list once timestamps show nanosecond
        # decimals on an epoch clock (see _needs_precision).
        self._fast: msgspec.json.Decoder[Any] = _fast_list
        self._nested_at: int | None = None  # the first one (inflated offset)
        self._utf8_fixed = False
        self._utf8_at: int | None = None  # the first invalid byte in an event (inflated offset)
        self._cut_header = False
        self._header_problem: str | None = None
        self._seen = 0  # list elements looked at
        # Per slice handed on: its first element's index and, where elements were dropped
        # from it, each event's own (see `event_index`).
        self._slices: list[tuple[int, list[int] | None]] = []
        self._kept = 0  # events handed on
        self._spent = 0  # bytes decoded in the search for damage
        self._window = _RECOVER_WINDOW
        self._bad_run = 0  # damaged bytes lately, less what decoded between (see _good)
        self._non_json_numbers = 0  # damaged stretches holding NaN or Infinity
        self._non_json_losses = 0  # ... of them, those skipped (not the one at a cut)
        self._gave_up = False  # the end of the data was too damaged to search

    # -- buffer ---------------------------------------------------------------------------

    def _fill(self, want: int) -> None:
        if self._blocks is None:
            self._blocks = self._src.blocks()
        while not self._eof and len(self._buf) < want:
            block = next(self._blocks, None)
            if block is None:
                self._eof = True
            else:
                self._buf += block

    def _consume(self, n: int) -> None:
        del self._buf[:n]
        self._base += n

    def _skip_lead(self) -> None:
        m = _LEAD.match(self._buf)
        if m and m.end():
            self._consume(m.end())

    # -- the parts of a trace ----------------------------------------------------------------

    def chunks(self) -> Iterator[EventList]:
        """The events, a list per slice; they are validated (wrong-typed ones dropped)."""
        self._open()
        yield from self._events()
        self._finish()

    def result(self) -> Decoded:
        """After `chunks()` is exhausted: the header and the notes."""
        header = self._header or RawTrace()
        warnings: list[str] = []
        if self._header_problem:
            warnings.append(self._header_problem)
        drop_note = self._drops.note()
        if drop_note:
            warnings.append(drop_note)
        if self._nested:
            warnings.append(
                f"{self._nested:,} values nested deeper than {MAX_DEPTH} levels were read "
                f"as null (first at byte {self._nested_at or 0:,}{self._json_unit()})"
            )
        if self._utf8_fixed:
            where = (
                f" (first at byte {self._utf8_at:,}{self._json_unit()})"
                if self._utf8_at is not None
                else " (in the header)"
            )
            warnings.append(f"invalid UTF-8 in strings was replaced by U+FFFD{where}")
        if self._src.trailing:
            warnings.append(self._src.trailing)
        if self._src.cut and self._events_whole() and not self._cut_header:
            warnings.append(
                "the gzip stream ends early, after the whole JSON: only its checksum is "
                "missing, so the data could not be verified"
            )
        note = self._salvage_note()
        tail_lost = not self._closed and (self._cut_at is not None or self._src.problem is not None)
        return Decoded(
            header=header,
            truncated=note is not None,
            tail_lost=tail_lost,
            note=note,
            warnings=warnings,
            damage=self._damage_kind() if note is not None else None,
            stop=self._stop() if tail_lost else None,
        )

    def _damage_kind(self) -> str:
        """What the salvage note's loss came from (see Decoded.damage)."""
        src = self._src
        if src.problem:
            return "cut" if src.cut else "corrupt"
        if self._cut_at is not None and not self._gave_up:
            return "cut"
        if self._losses and not self._gave_up and self._non_json_losses == len(self._losses):
            return "invalid"
        return "damaged"

    def _stop(self) -> str:
        """Where and why the event list stops short, for notes on what that lost."""
        src = self._src
        if src.problem and not src.cut:
            # Garbage inflates from the damage on; zlib may notice only at the end.
            at = self._file_offset(self._losses[0][0]) if self._losses else src.problem_at or 0
            return f"the gzip stream is corrupt (from about byte {at:,} of the file)"
        if self._gave_up and self._cut_at is not None:
            return (
                "the data is too damaged to read (from byte "
                f"{self._file_offset(self._cut_at):,} of the file)"
            )
        return "the file is cut off"

    def _open(self) -> None:
        """Read up to the event list's "[": the list itself, or the header's traceEvents."""
        while True:
            self._fill(1 << 16)
            m = _NONSPACE.search(self._buf)
            if m:
                self._consume(m.start())
                if self._buf.startswith(_BOM):
                    self._consume(len(_BOM))
                    continue
                break
            if self._eof:
                raise self._empty()
            self._consume(len(self._buf))
        first = self._buf[:1]
        if first in (b"{", b"[", b"\x00") and 0 in self._buf[:4]:
            # JSON holds no NUL byte: text in UTF-16 or UTF-32 (no byte-order mark, else it
            # is named below), or no text at all.
            error = self._nul_bytes()
            if error is not None:
                raise error
        if first == b"[":
            self._consume(1)
            return
        if first != b"{":
            if self._src.problem and self._src.produced == 0:
                raise self._empty()
            kind = next((k for magic, k in _OTHER_FORMATS if self._buf.startswith(magic)), None)
            what = f"it looks like {kind}" if kind else "it does not start with '{' or '['"
            if kind is None and self.path.endswith(".gz") and not self._src.gz:
                raise NotATraceError(
                    "is not gzip data, though its name ends in .gz, nor JSON (it starts with "
                    "neither gzip's bytes 1f 8b nor '{' or '[')",
                    path=self.path,
                    hint="a damaged copy, or another kind of file: copy the trace again from "
                    "where torch.profiler wrote it",
                )
            raise NotATraceError(
                f"is not JSON ({what})",
                path=self.path,
                hint="expected a Kineto/Chrome trace JSON (or .json.gz) written by torch.profiler",
            )
        start = 0
        while True:
            m = _EVENTS_KEY.search(self._buf, start)
            if m and (m.end() < len(self._buf) or self._eof):
                break
            if self._eof:
                raise self._no_event_list()
            if len(self._buf) > MAX_HEADER_BYTES:
                if (et := self._execution_trace()) is not None:
                    raise et
                raise NotATraceError(
                    f"has no 'traceEvents' list in its first {MAX_HEADER_BYTES >> 20} MiB",
                    path=self.path,
                    hint="expected a Kineto/Chrome trace JSON written by torch.profiler",
                )
            start = max(len(self._buf) - 64, 0)  # the key may straddle two blocks
            self._fill(len(self._buf) + _BLOCK)
        if m.end() >= len(self._buf):
            raise self._nothing("the file ends right after 'traceEvents'")
        if self._buf[m.end()] != ord("["):
            what = {ord("n"): "null", ord("{"): "an object", ord('"'): "a string"}.get(
                self._buf[m.end()], "not a list"
            )
            raise TraceFormatError(
                f"is JSON but not a Kineto trace ('traceEvents' at byte "
                f"{self._file_offset(self._base + m.end()):,} is {what}, expected a list)",
                path=self.path,
                hint="expected an object with a 'traceEvents' list, as torch.profiler writes",
            )
        self._prefix = bytes(self._buf[: m.end() + 1])
        self._consume(m.end() + 1)

    def _nul_bytes(self) -> TraceFormatError | None:
        """Why data with NUL bytes among its first four is no JSON: nothing but zero bytes,
        or text in UTF-16 or UTF-32 without a byte-order mark; None for a byte-order mark
        (named with the other formats)."""
        if self._buf.startswith(b"\x00\x00\xfe\xff"):
            return None
        if not self._buf[:16].strip(b"\x00"):  # a run of zeros, no text
            zeros = 0
            while True:  # count them, a block at a time
                run = len(self._buf) - len(self._buf.lstrip(b"\x00"))
                zeros += run
                if run < len(self._buf) or self._eof:
                    break
                self._consume(run)
                self._fill(_BLOCK)
            where = "holds nothing but" if not self._buf[run:] else "starts with"
            return UnreadableTraceError(
                f"{where} {zeros:,} zero bytes, as a file does whose data never reached the "
                "disk (the job or its machine stopped while it was being written)",
                path=self.path,
                hint="record the trace again, or copy it again from where it was written",
            )
        sample = bytes(self._buf[:256])
        width = "32" if sample.count(0) >= 0.6 * len(sample) else "16"
        return NotATraceError(
            f"is not JSON (it looks like UTF-{width} text without a byte-order mark: save it "
            "as UTF-8)",
            path=self.path,
            hint="expected a Kineto/Chrome trace JSON (or .json.gz) written by torch.profiler",
        )

    def _events(self) -> Iterator[EventList]:
        while not self._closed:
            self._fill(2 * SLICE_BYTES)
            self._skip_lead()
            if not self._buf:
                if self._eof:
                    if self._cut_at is None:  # the data ends after an event, with no "]"
                        self._cut_at = self._base
                    return
                continue
            if self._buf[0] == ord("]") and not self._events_follow(0):
                self._close_at(0)
                return
            if self._eof:
                # The rest: last events, "]" and the header. A cut right after an event's
                # comma leaves "},": without it the last whole event decodes as one.
                end = len(self._buf.rstrip(b" \t\r\n,"))
            else:
                m = _EVENT_GAP.search(self._buf, SLICE_BYTES)
                if m is None:
                    if len(self._buf) > MAX_EVENT_BYTES:
                        self._skip_oversized()
                    else:
                        self._fill(len(self._buf) + _BLOCK)  # one event longer than a slice
                    continue
                end = m.start() + 1
            for events in self._stretch(end):
                if events:
                    self._kept += len(events)
                    yield events

    def _stretch(self, end: int) -> list[EventList]:
        """The events of _buf[:end] (whole elements, or the rest of the data); consumes them.

        The fast path is one decode. Otherwise: a "]" that ends the list (with a header
        after it), or damage, searched for and skipped by `_recover`.
        """
        for _ in range(4):
            try:
                got = self._decode(0, end)
            except _Repaired as r:
                end = r.end
                continue
            except _Damage as d:
                if d.kind == "closed" and self._verify_close(d.at, closed_list=True):
                    events = self._before_close(d.at)
                    self._close_at(0)
                    return events
                break
            self._commit(got, 0)
            self._consume(end)
            return [got.events]
        # Final: nothing but the whitespace and comma the end of the data was stripped of
        # follows (else a cut inside the last event read as a damaged stretch).
        final = self._eof and not self._buf[end:].strip(b" \t\r\n,")
        return self._recover(end, final=final)

    def _unpadded(self, start: int, end: int) -> int:
        """`end` moved back over whitespace and commas to `start` at most: a comma before
        the list's "]" (hand-joined traces) is no cut-off last event."""
        while end > start and self._buf[end - 1] in b" \t\r\n,":
            end -= 1
        return end

    def _before_close(self, at: int) -> list[EventList]:
        """The events before the "]" at _buf[at] that ends the list; consumes them. A
        well-formed file's last stretch holds that "]": its events decode at once (the
        piece-by-piece search of `_recover`, kept for damage, took a fifth of the time to
        load a small rank file)."""
        for _ in range(4):
            end = self._unpadded(0, at)
            try:
                got = self._decode(0, end)
            except _Repaired as r:
                at += r.end - end  # rewritten in place: the "]" moved with the stretch
                continue
            except _Damage:
                break
            self._commit(got, 0)
            self._consume(at)
            return [got.events]
        return self._recover(at, final=True, closing=True)

    def _close_at(self, at: int) -> None:
        """The event list ends at _buf[at] ("]"): read and decode the header after it."""
        self._closed = True
        self._consume(at + 1)
        while not self._eof:
            if len(self._buf) > MAX_HEADER_BYTES:
                if self._header_before_junk(bytes(self._buf), more=True):
                    return
                self._header_problem = (
                    f"the {len(self._buf):,}+ bytes after the event list are not a trace "
                    "header and were ignored"
                )
                self._header = self._try_header(b"}")
                return
            self._fill(len(self._buf) + _BLOCK)
        header = self._try_header(bytes(self._buf))
        if header is None and self._header_before_junk(bytes(self._buf)):
            return
        if header is None:
            cut = self._src.problem or "the file is cut off or damaged"
            header, read_to = self._partial_header(bytes(self._buf))
            lost = (
                "its header fields after the list could not be read"
                if read_to == 0
                else "its header fields after the list were read up to byte "
                f"{self._file_offset(self._base + read_to):,}; those after it are lost"
            )
            # Every event is kept only where reading met no damage before the list's end: a
            # corrupt gzip stream may hide more (its checksum fails only at the end).
            whole = not self._losses and not (self._src.problem and not self._src.cut)
            where = "whole event list (every event kept)" if whole else "event list"
            self._header_problem = f"{cut} after the {where}: {lost}"
            self._cut_header = True
        self._header = header

    def _header_before_junk(self, suffix: bytes, more: bool = False) -> bool:
        """Whether `suffix` (what follows the list's "]") is a whole header followed by
        something else (junk written after the document): then the header is read, and the
        rest said to be ignored; nothing of the trace is lost. `more`: the data goes on."""
        end = 0  # a bare event list ends the document with its "]"
        if self._prefix is not None:
            pos, codes, depth = scan(suffix)
            closers = pos[(codes == ord("}")) & (depth == 0)]  # the document's own "}"
            if closers.size == 0:
                return False
            end = int(closers[0]) + 1
        if not suffix[end:].strip() and not more:
            return False
        header = self._try_header(suffix[:end])
        if header is None:
            return False
        self._header = header
        rest = f"{len(suffix) - end:,}{'+' if more else ''}"
        self._header_problem = (
            f"the {rest} bytes after the end of the JSON document (from byte "
            f"{self._base + end:,}{self._json_unit()}) are not part of the "
            "trace and were ignored; nothing before them was lost"
        )
        return True

    def _partial_header(self, suffix: bytes) -> tuple[RawTrace | None, int]:
        """The header fields of a cut or damaged `suffix` that precede the damage: the
        longest run of whole "key": value pairs (ended at a comma) that decodes, and where
        it ends in `suffix`; (the fields before the list, 0) when none does."""
        commas = [m.start() for m in re.finditer(rb",", suffix[:MAX_HEADER_BYTES])]
        for at in reversed(commas[-_MAX_HEADER_TRIES:]):
            if at == 0:
                break
            header = self._try_header(suffix[:at] + b"}")
            if header is not None:
                return header, at
        return self._try_header(b"}"), 0

    def _verify_close(self, at: int, closed_list: bool = False) -> bool:
        """Is the "]" at _buf[at] the end of the event list? If a header follows; or, where
        the decoder saw the list end there (`closed_list`), if the file ends within a
        header's length after it and what follows starts like one: a cut or damaged
        header must not cost the last event (the header's problem is said on its own); the
        "]" of a bare list (no header) where the file ends within that length (junk after
        it). Never where events follow it (see `_events_follow`)."""
        if self._events_follow(at):
            return False
        while not self._eof and len(self._buf) - at < MAX_HEADER_BYTES:
            self._fill(len(self._buf) + _BLOCK)
        if self._try_header(bytes(self._buf[at + 1 :])) is not None:
            return True
        if self._prefix is None:  # a bare list: what follows its "]" is no trace's
            return closed_list and self._eof
        return closed_list and self._eof and _HEADER_START.match(self._buf, at + 1) is not None

    def _events_follow(self, at: int) -> bool:
        """Whether events follow the "]" at _buf[at] closely: then it is a "]" inside
        damage (a corrupt gzip stream inflates garbage, holding brackets, on to its end),
        not the end of the list; a header holds no event phase ("ph")."""
        self._fill(at + 1 + _HEADER_PEEK)
        return _EVENT_PHASE.search(self._buf, at + 1, at + 1 + _HEADER_PEEK) is not None

    def _try_header(self, suffix: bytes) -> RawTrace | None:
        if self._prefix is None:  # a bare event list: nothing may follow it
            return RawTrace() if not suffix.strip() else None
        data = self._prefix + b"]" + suffix
        for _ in range(3):
            try:
                return _header_decoder.decode(data)  # type: ignore[no-any-return]
            except (msgspec.DecodeError, msgspec.ValidationError):
                return None
            except RecursionError:
                data, n, _at = flatten_deep(data)
                self._nested += n
            except UnicodeDecodeError:
                data = fix_utf8(data)
                self._utf8_fixed = True
        return None

    def _finish(self) -> None:
        if self._header is None:
            self._header = (self._try_header(b"}") if self._prefix else None) or RawTrace()
        if self._kept == 0 and (self._cut_at is not None or self._losses):
            raise self._nothing(self._src.problem or "the event list is cut off or damaged")
        if self._kept == 0 and self._drops.total and self._drops.total == self._seen:
            key = self._drops.counts.most_common(1)[0][0]
            raise TraceFormatError(
                f"is JSON but not a Kineto trace: none of its {self._seen:,} events can be "
                f"used ({self._drops.first[key]})",
                path=self.path,
                hint='expected events like {"ph": "X", "name": ..., "ts": ...}',
            )

    # -- decoding: trial decodes count nothing; the caller commits what it keeps ------------

    def _decode(self, start: int, end: int) -> _Got:
        """The elements of _buf[start:end] decoded as one list.

        Events looked at and dropped are returned, not counted (`_commit` counts what is
        kept), so the damage search may decode a stretch more than once. _Damage if the
        JSON is broken; _Repaired after a repair in place (a value nested too deeply
        became null, bad UTF-8 became U+FFFD; counted once, here): decode again.
        """
        data = bytearray(b"[")  # one copy of the stretch, not two
        with memoryview(self._buf) as view:
            data += view[start:end]
        data += b"]"
        for decoder in (self._fast, _lenient_list):
            try:
                events = decoder.decode(data)
            except msgspec.ValidationError:
                continue  # a field of the wrong type: the lenient structs, or one at a time
            except msgspec.DecodeError as exc:
                raise self._damage(exc, start, end) from None
            except RecursionError:
                new, n, first = flatten_deep(data)
                if n == 0:
                    raise _Damage("damage", 0, "nested too deeply") from None
                self._nested += n
                if self._nested_at is None and first is not None:
                    self._nested_at = self._base + start + first - 1
                raise self._repaired(start, end, new) from None
            except UnicodeDecodeError:
                self._utf8_fixed = True
                if self._utf8_at is None:  # msgspec's position is inside the string
                    try:
                        bytes(data).decode("utf-8")
                    except UnicodeDecodeError as exc:
                        self._utf8_at = self._base + start + exc.start - 1
                raise self._repaired(start, end, fix_utf8(data)) from None
            if decoder is _fast_list and self._needs_precision(events):
                self._fast = _precise_list
                events = _precise_list.decode(data)
            if decoder is not _lenient_list:
                return _Got(events, len(events), [])
            got = self._validated(events, data)
            # A field of another type (ROCm's "stream": "0x0") sends the whole slice here:
            # its epoch timestamps must stay as exact as the typed decoders keep them.
            if any(rounded_by_float(ev.ts) for ev in got.events):
                for ev, stamp in zip(events, _stamps_list.decode(data), strict=True):
                    if type(ev.ts) is float:
                        ev.ts = stamp.ts
            return got
        return self._one_by_one(data)

    @staticmethod
    def _needs_precision(events: EventList) -> bool:
        """Whether timestamps carry decimals a float64 rounds: large (epoch microseconds)
        floats. Rounded already, one may look whole (.001 reads as .0 at 1.7e15 µs): a tiny
        trace whose few times all had such decimals was read up to 125 ns off."""
        # Spread over the slice: a trace may open with metadata events at time 0.
        sample = events[:: max(1, len(events) // _PRECISION_SAMPLE)]
        return any(rounded_by_float(ev.ts) for ev in sample)

    def _repaired(self, start: int, end: int, data: bytes | bytearray) -> _Repaired:
        body = data[1:-1]
        self._buf[start:end] = body
        return _Repaired(start + len(body), end)

    def _commit(self, got: _Got, start: int) -> None:
        """Count what a decoded stretch at _buf[start] looked at and dropped."""
        for why, index, at in got.drops:
            key = why.split(" is ")[0] if why.startswith("'") else why.split(" (")[0]
            # Where to find the event: an offset in the JSON (of a gzip file: once inflated).
            offset = None if at is None else self._base + start + at
            self._drops.add(key, why, self._seen + index, offset, self._json_unit())
        if got.events:  # handed on as one slice (`chunks`): where its events are
            self._slices.append((self._seen, got.kept_at))
        self._seen += got.seen

    def event_index(self, chunk: int, i: int) -> int:
        """The index in the file's event list of event `i` of the `chunk`-th slice that
        `chunks()` yielded (a damaged stretch skipped counts as one element)."""
        start, kept_at = self._slices[chunk]
        return start + (kept_at[i] if kept_at is not None else i)

    def _damage(self, exc: msgspec.DecodeError, start: int, end: int) -> _Damage:
        """_Damage for a DecodeError on "[" + _buf[start:end] + "]" (positions from start)."""
        text = str(exc)
        m = _ERROR_AT.search(text)
        n = end - start
        if m is None:
            return _Damage("truncated", n, text)
        at = min(max(int(m.group(1)) - 1, 0), n)
        if "trailing characters" in text:
            # A "]" inside the stretch closed the list: the last one before `at`.
            close = self._buf.rfind(b"]", start, start + at)
            if close >= 0:
                return _Damage("closed", close - start, text)
        if "trailing comma" in text and self._buf[start + at : start + at + 1] == b"]":
            # "...},]": the list closed after a comma, if that "]" is the list's own (at
            # depth 1 of "[" + stretch) and not an array's inside an event.
            pos, codes, depth = scan(b"[" + bytes(self._buf[start : start + at + 1]))
            if pos.size and codes[-1] == ord("]") and depth[-1] == 1 and pos[-1] == at + 1:
                return _Damage("closed", at, text)
        return _Damage("damage", at, text)

    def _validated(self, events: EventList, data: bytes | bytearray) -> _Got:
        """Lenient events with wrong-typed fields dropped."""
        kept = []
        kept_at = []
        drops: list[tuple[str, int, int | None]] = []
        offsets: np.ndarray | None = None
        for i, ev in enumerate(events):
            why = check_event(ev)
            if why is None:
                kept.append(ev)
                kept_at.append(i)
                continue
            if offsets is None:
                offsets = self._element_offsets(data)
            at = _skip_space(data, int(offsets[i])) - 1 if i < offsets.size else None
            drops.append((why, i, at))
        return _Got(kept, len(events), drops, kept_at if drops else None)

    @staticmethod
    def _element_offsets(data: bytes | bytearray) -> np.ndarray:
        """Start offsets of the elements of the list in `data` (which begins with "[")."""
        pos, codes, before = scan(data)
        commas = pos[(codes == 44) & (before == 1)]
        return np.concatenate([[1], commas + 1])

    def _one_by_one(self, data: bytes | bytearray) -> _Got:
        """Each element of the list on its own: drop the unusable ones, keep the others."""
        pos, codes, before = scan(data)
        closes = pos[(codes == 93) & (before == 1)]
        if closes.size and data[int(closes[0]) + 1 :].strip():
            # The list's own "]" is inside the stretch (the header follows): say where.
            raise _Damage("closed", int(closes[0]) - 1, "the list ends inside the stretch")
        cuts = pos[((codes == 44) | (codes == 93)) & (before == 1)].tolist()
        kept: EventList = []
        kept_at: list[int] = []
        drops: list[tuple[str, int, int | None]] = []
        begin = 1
        for k, stop in enumerate(cuts):
            piece = data[begin:stop]
            at = _skip_space(data, begin) - 1
            begin = stop + 1
            if not piece.strip():
                continue
            try:
                ev = _lenient_one.decode(piece)
            except msgspec.ValidationError as exc:
                drops.append((_why_invalid(piece, exc), k, at))
                continue
            except RecursionError:
                drops.append((f"nested deeper than {MAX_DEPTH} levels", k, at))
                continue
            except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                drops.append((f"not valid JSON ({exc})", k, at))
                continue
            why = check_event(ev)
            if why is None:
                if rounded_by_float(ev.ts):
                    ev.ts = _stamp_one.decode(piece).ts
                kept.append(ev)
                kept_at.append(k)
            else:
                drops.append((why, k, at))
        return _Got(kept, len(cuts), drops, kept_at)

    # -- damage -----------------------------------------------------------------------------

    def _recover(self, end: int, final: bool, closing: bool = False) -> list[EventList]:
        """Decode _buf[:end] around damaged stretches, and consume it.

        The stretch is split at every `},{` into pieces; the longest runs of pieces that
        decode are kept; a piece that decodes with none of its next few neighbours is
        damaged and skipped (at the end of the data: cut off). `final`: nothing follows
        `end`. `closing`: _buf[end] is the "]" that ends the list (leave it there). Returns
        the events of each decoded run (a run comes from one decoder: one kind of struct).
        """
        out: list[EventList] = []
        end = self._fix_utf8_stretch(end)  # at once: damage often comes with bad UTF-8
        pos = 0  # start of the next piece
        repairs = 0
        while pos < end:
            if self._spent > DECODE_BUDGET * max(self._src.produced, 1) + (64 << 20):
                self._losses.append((self._base + pos, self._base + end, "unsearched"))
                pos = end
                break
            m = _LEAD.match(self._buf, pos)
            pos = m.end() if m else pos
            if pos >= end:
                break
            if self._buf[pos] == ord("]") and not closing and self._verify_close(pos):
                self._consume(pos)
                self._close_at(0)
                return out
            try:
                step = self._recover_step(pos, end, final, closing)
            except _Repaired as r:
                # A value nested too deeply, flattened where the step looked: each repair
                # removes what it found, so there are at most as many as such values.
                repairs += 1
                end += r.end - r.old_end
                if repairs > end:
                    raise  # cannot happen
                continue
            if step is None:  # wait for more data
                break
            got, new_pos, closed_at = step
            if got is not None:
                self._commit(got, pos)
                out.append(got.events)
            if closed_at is not None:
                self._consume(closed_at)
                self._close_at(0)
                return out
            pos = new_pos
        self._consume(min(pos, end))
        return out

    def _fix_utf8_stretch(self, end: int) -> int:
        """Replace invalid UTF-8 in _buf[:end] with U+FFFD; returns the stretch's new end."""
        try:
            with memoryview(self._buf) as view:
                str(view[:end], "utf-8")
        except UnicodeDecodeError as exc:
            fixed = fix_utf8(self._buf[:end])
            self._buf[:end] = fixed
            self._utf8_fixed = True
            if self._utf8_at is None:
                self._utf8_at = self._base + exc.start
            return len(fixed)
        return end

    def _recover_step(
        self, pos: int, end: int, final: bool, closing: bool
    ) -> tuple[_Got | None, int, int | None] | None:
        """One step of `_recover` from piece start `pos`: (decoded events or None, where the
        next piece starts, where the list closed or None); None to wait for more data.

        Looks at most _RECOVER_WINDOW bytes ahead (whole pieces), so a long damaged
        stretch costs a bounded amount per step, not the rest of the stretch each time.
        """
        if self._bad_run > _BAD_RUN_LIMIT:
            # A long stretch that is mostly damage (inflated garbage after a corrupt gzip
            # block): stop searching it piece by piece; probe a window every _PROBE_STRIDE
            # bytes, and search normally again once one decodes.
            m = _EVENT_GAP.search(self._buf, min(pos + _PROBE_STRIDE, end), end)
            nxt = m.end() - 1 if m else end
            if m is None and final and not closing:
                self._cut_at = self._base + pos
                self._gave_up = True
            else:
                self._losses.append((self._base + pos, self._base + nxt, "damaged"))
            self._bad_run = _BAD_RUN_LIMIT // 2  # one good window brings it back
            return None, nxt, None
        # The window: up to the first boundary past `_window` bytes (whole pieces only). It
        # doubles while decoding goes well and shrinks after damage, so dense damage costs
        # little per step and sparse damage is passed in large strides.
        limit, after = end, end
        if pos + self._window < end:
            m = _EVENT_GAP.search(self._buf, pos + self._window, end)
            if m:
                limit, after = m.start() + 1, m.end() - 1
        whole = self._attempt(pos, limit)
        if isinstance(whole, _Got):
            self._window = min(self._window * 2, _RECOVER_WINDOW)
            self._good(limit - pos)
            return whole, after, None
        self._window = _MIN_WINDOW
        if (
            whole.kind == "closed"
            and not closing
            and self._verify_close(pos + whole.at, closed_list=True)
        ):
            got = self._attempt(pos, self._unpadded(pos, pos + whole.at))
            return (got if isinstance(got, _Got) else None), pos + whole.at, pos + whole.at
        # Pieces (split at `},{`) up to a little past the damage only: dense damage then
        # costs little per step.
        scan_to = min(limit, pos + whole.at + _MERGE_SPAN)
        gaps = list(_EVENT_GAP.finditer(self._buf, pos, scan_to))
        if scan_to < limit and gaps:
            after = gaps[-1].end() - 1  # the pieces after the last boundary: a later step
            limit = gaps[-1].start() + 1
            gaps = gaps[:-1]
        starts = [pos] + [m.end() - 1 for m in gaps]  # piece i is _buf[starts[i]:ends[i]]
        ends = [m.start() + 1 for m in gaps] + [limit]
        k = len(starts)
        # Pieces before the damage: bisection, starting from msgspec's position as a guess.
        lo, hi = 0, k  # runs of pieces [0, j) decode for j <= lo, fail for j >= hi
        best: _Got | None = None
        guess = bisect.bisect_right(ends, pos + whole.at) if whole.kind != "truncated" else k - 1
        if 0 < guess < k:
            got = self._attempt(pos, ends[guess - 1])
            if isinstance(got, _Got):
                lo, best = guess, got
            else:
                hi = guess
        while hi - lo > 1:
            mid = (lo + hi) // 2
            got = self._attempt(pos, ends[mid - 1])
            if isinstance(got, _Got):
                lo, best = mid, got
            else:
                hi = mid
        if lo > 0:
            self._good(ends[lo - 1] - pos)
            return best, starts[lo], None
        # The first piece cannot start a run: an event cut by `},{` inside it (nested args,
        # a name)? Try it with its next neighbours; else it is damaged.
        for extra in range(1, _MAX_MERGE + 1):
            if extra >= k:
                break
            got = self._attempt(pos, ends[extra])
            if isinstance(got, _Got):
                self._good(ends[extra] - pos)
                return got, starts[extra + 1] if extra + 1 < k else after, None
        if not final and limit == end and k <= _MAX_MERGE + 1 and pos > 0:
            return None  # near the end of what is read so far: more data may complete it
        nxt = starts[1] if k > 1 else after
        non_json = _NON_JSON_NUMBER.search(self._buf, pos, nxt) is not None
        if k == 1 and limit == end and final and not closing:
            self._cut_at = self._base + pos  # the data ends inside this event
        else:
            self._losses.append((self._base + pos, self._base + nxt, "damaged"))
            self._seen += 1
            self._bad_run += nxt - pos
            self._non_json_losses += non_json
        self._non_json_numbers += non_json
        return None, nxt, None

    def _good(self, n: int) -> None:
        """n bytes decoded: a long enough run ends a stretch of damage."""
        if n >= _GOOD_RUN:
            self._bad_run = 0
        else:
            self._bad_run = max(self._bad_run - n, 0)

    def _attempt(self, a: int, b: int) -> _Got | _Damage:
        """Decode _buf[a:b] as a run of elements, counted against the search budget: all of
        it, or (a failure) as far as the decoder got."""
        try:
            got = self._decode(a, b)
        except _Damage as d:
            self._spent += min(b - a, d.at) + 256
            return d
        self._spent += b - a
        return got

    def _skip_oversized(self) -> None:
        """More than MAX_EVENT_BYTES without an event boundary: skip to the next one."""
        lost_from = self._base
        while True:
            m = _EVENT_GAP.search(self._buf, 1)
            if m:
                self._consume(m.end() - 1)
                break
            if self._eof:
                self._consume(len(self._buf))
                break
            self._consume(max(len(self._buf) - 16, 0))  # a boundary may straddle two blocks
            self._fill(len(self._buf) + _BLOCK)
        self._losses.append(
            (lost_from, self._base, f"larger than {MAX_EVENT_BYTES >> 20} MiB (one event)")
        )

    # -- messages ---------------------------------------------------------------------------

    def _file_offset(self, pos: int) -> int:
        return self._src.file_offset(pos)

    def _json_unit(self) -> str:
        """How byte offsets into the JSON are named: of a gzip file, once inflated."""
        return " of the inflated JSON" if self._src.gz else ""

    def _events_whole(self) -> bool:
        """The event list was read to its "]" with nothing skipped."""
        return self._closed and not self._losses and self._cut_at is None and not self._gave_up

    def _salvage_note(self) -> str | None:
        """What was lost, in bytes of the file on disk; None when nothing was.

        Two kinds of loss: damaged stretches that were skipped (reading went on after
        them), and everything from some point on: where a gzip stream stopped inflating,
        where the data ends inside the event list, or from where the rest was too damaged.
        A file that simply ends early (a cut) cannot say how much was never written.
        """
        src = self._src
        if self._events_whole() and (not src.problem or src.cut):
            return None  # a cut after the list: the header's warning or the footer's says so
        size = max(src.size, 1)
        tail_at = size  # from here on, everything is lost (file offsets)
        if src.problem_at is not None:
            tail_at = min(tail_at, src.problem_at)
        if self._cut_at is not None:
            tail_at = min(tail_at, self._file_offset(self._cut_at))
        spans = [
            (self._file_offset(a), min(self._file_offset(b), tail_at)) for a, b, _ in self._losses
        ]
        spans = [(a, b) for a, b in spans if a < tail_at]
        lost = sum(max(b - a, 0) for a, b in spans) + (size - tail_at)
        truncated = self._cut_at is not None or src.problem is not None
        cut_off = src.cut if src.problem else self._cut_at is not None and not self._gave_up
        parts: list[str] = []
        if src.problem:
            parts.append(src.problem)
        elif self._cut_at is not None and not self._gave_up:
            parts.append("the file ends inside the event list (cut off)")
        nan_only = bool(spans) and self._non_json_losses == len(self._losses)
        if nan_only:
            many = len(spans) > 1
            parts.append(
                f"skipped {len(spans):,} event{'s' * many} holding NaN or Infinity, which "
                f"JSON does not allow (first at byte {spans[0][0]:,}; the program that wrote "
                f"{'them' if many else 'it'} should write null or a number)"
            )
        elif spans:
            kinds = " or ".join(sorted({w for _, _, w in self._losses}))
            parts.append(
                f"skipped {len(spans):,} {kinds} stretch{'es' if len(spans) > 1 else ''} of "
                f"the event list (first at byte {spans[0][0]:,})"
            )
        if self._non_json_numbers and not nan_only:
            parts.append(
                f"{self._non_json_numbers:,} of the unreadable events "
                f"{'holds' if self._non_json_numbers == 1 else 'hold'} NaN or Infinity, "
                "which JSON does not allow (the program that wrote them should write null)"
            )
        if self._gave_up:
            parts.append(f"from byte {tail_at:,} on the data is too damaged to read")
        elif tail_at < src.size and not cut_off:
            parts.append(f"the {size - tail_at:,} bytes from byte {tail_at:,} on could not be read")
        if src.problem and not src.cut:
            # Damaged deflate data inflates garbage that can still read as events (names,
            # times and durations spliced from elsewhere) before the JSON breaks, and the
            # checksum that says so is only at the end: where the damage began is unknown.
            where = f"near byte {spans[0][0]:,}" if spans else "somewhere in the file"
            parts.append(
                "a corrupt gzip stream can also inflate wrong values that still read as "
                f"events: events from the damage ({where}) on may carry wrong names and times"
            )
        if cut_off:
            # The data just stops: whatever followed was never written (or is gone).
            parts.append("anything written after the cut is lost, and how much that was is unknown")
        if self._cut_header and not truncated:
            parts.append("the file is cut off or damaged after the event list")
        if not parts:
            return None
        share = 100.0 * lost / size
        sizes = "about " if src.gz else ""
        kept = f"{self._kept:,} complete event{'s' * (self._kept != 1)}"
        if cut_off and not spans and not self._gave_up:
            # Only the unfinished event at the cut was dropped from what the file holds; how
            # much was never written is said above ("unknown"), not counted as a share.
            dropped = (
                f"the unfinished one at the cut, {sizes}{lost:,} byte{'s' * (lost != 1)}, dropped"
                if lost
                else "the cut fell between two events"
            )
            return f"{'; '.join(parts)}; kept {kept} ({dropped})"
        return (
            f"{'; '.join(parts)}; kept {kept}; lost {sizes}{lost:,} "
            f"of the file's {src.size:,} bytes ({share:.1f}%)"
        )

    def _empty(self) -> TraceFormatError:
        problem = self._src.problem
        if problem and self._src.produced == 0:
            return UnreadableTraceError(
                f"no data could be decompressed: {problem}",
                path=self.path,
                hint=(
                    "copy the .gz again, once torch.profiler has finished writing it"
                    if self._src.cut
                    else "the .gz file is damaged or not gzip data: `gunzip -t` checks it; "
                    "copy it again from where torch.profiler wrote it"
                ),
            )
        return NotATraceError(
            "is empty" if not problem else f"is empty after decompression ({problem})",
            path=self.path,
            hint="expected a Kineto/Chrome trace JSON written by torch.profiler",
        )

    def _nothing(self, why: str) -> TraceFormatError:
        if self._non_json_numbers:
            return UnreadableTraceError(
                "is not valid JSON: its events hold NaN or Infinity, which JSON does not allow",
                path=self.path,
                hint="the program that wrote the trace should write null (or a number) there",
            )
        return UnreadableTraceError(
            f"is not valid JSON and nothing could be salvaged ({why})",
            path=self.path,
            hint="the file may be cut off before its first event, or not a trace",
        )

    def _execution_trace(self) -> NotATraceError | None:
        """The error for a PyTorch Execution Trace, read from the file's first bytes."""
        m = _EXECUTION_TRACE.match(bytes(self._buf[:4096]))
        if m is None:
            return None
        schema = m.group(1).decode("utf-8", "replace")
        return NotATraceError(
            f"is a PyTorch Execution Trace (schema {schema}), not a profiler trace",
            path=self.path,
            hint="pass the Kineto trace torch.profiler wrote in the same run: the JSON object "
            "with a 'traceEvents' list that tensorboard_trace_handler or export_chrome_trace "
            "writes",
        )

    def _no_event_list(self) -> TraceFormatError:
        """The whole file is in the buffer and has no "traceEvents" key: why?"""
        if (et := self._execution_trace()) is not None:
            return et
        data = bytes(self._buf)
        try:
            doc = msgspec.json.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
            if self._src.problem:
                return self._nothing(self._src.problem)
            if "truncated" in str(exc).lower() and data.lstrip().startswith(b"{"):
                # The parser's own words named neither where nor why (a killed job's file).
                return UnreadableTraceError(
                    f"ends inside its header, before its event list began ({self._src.produced:,} "
                    "bytes of JSON): there is no event to salvage",
                    path=self.path,
                    hint="the file was cut off while being written, by a killed job perhaps: "
                    "take the trace again, or copy it once torch.profiler has finished writing it",
                )
            return self._nothing(str(exc))
        except RecursionError:
            return TraceFormatError(
                f"is JSON nested deeper than {MAX_DEPTH} levels with no 'traceEvents' list: "
                "not a Kineto trace, or a damaged one",
                path=self.path,
                hint="pass the file torch.profiler wrote, a JSON object with a 'traceEvents' "
                "list; if this was one, copy it again",
            )
        if isinstance(doc, dict) and isinstance(doc.get("notes"), list):
            # Every result perfcast saves with --json has its notes.
            return NotATraceError(
                "is a result saved with --json, not a trace",
                path=self.path,
                hint=f"`perfcast show {self.path}` renders it again; the commands that "
                "read traces want the file torch.profiler wrote",
                output=True,
            )
        return NotATraceError(
            "is JSON but has no 'traceEvents' list",
            path=self.path,
            hint="expected a Kineto/Chrome trace written by torch.profiler",
            output=True,
        )


def read_bytes(path: str) -> bytes:
    """The file's inflated content (for tools and tests; perfcast itself streams)."""
    return read_inflated(path)[0]


def read_inflated(path: str, limit: int | None = None) -> tuple[bytes, bool]:
    """The file's inflated content, and whether a gzip stream in it is cut or corrupt (what
    inflated before the damage is kept). With `limit`, reading stops once the content is
    longer than `limit` bytes: the caller sees it is too large."""
    src = _Source(path)
    out = bytearray()
    for block in src.blocks():
        out += block
        if limit is not None and len(out) > limit:
            break
    return bytes(out), src.problem is not None


def _named_like_traces(folder: str) -> list[str]:
    """Paths in `folder` named like trace files, sorted. Hidden files are not traces (a
    writer's temporary files, e.g. `perfcast profile`'s held export)."""
    return [
        os.path.join(folder, n)
        for n in sorted(os.listdir(folder))
        if (n.endswith(".json") or n.endswith(".json.gz")) and not n.startswith(".")
    ]


def trace_files_in(folder: str) -> list[str]:
    """Trace files in a folder (not recursive), sorted for a stable rank order."""
    return [p for p in _named_like_traces(folder) if os.path.isfile(p)]


def not_files_in(folder: str) -> list[str]:
    """Names in `folder` that look like traces but are no readable file (a folder, a FIFO, a
    broken link): left out of the ranks, and said to be."""
    try:
        return [os.path.basename(p) for p in _named_like_traces(folder) if not os.path.isfile(p)]
    except OSError:
        return []


# `perfcast profile --repeat N` writes each cycle's traces to OUT/step<N>/.
CYCLE_FOLDER = re.compile(r"step\d+")


def cycle_folders_in(folder: str) -> list[str]:
    """The per-cycle folders of a `perfcast profile --repeat` run in `folder`, in step order."""
    try:
        names = [
            n
            for n in os.listdir(folder)
            if CYCLE_FOLDER.fullmatch(n) and os.path.isdir(os.path.join(folder, n))
        ]
    except OSError:
        return []
    return sorted(names, key=lambda n: int(n[4:]))
