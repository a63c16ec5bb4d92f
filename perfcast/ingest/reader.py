"""Bytes in, `RawTrace` out: gzip, JSON decoding, and salvage of cut-off files.

A killed training job leaves a trace cut anywhere, often inside the gzip
stream. We keep every complete event before the cut and say how much was lost.
"""

from __future__ import annotations

import contextlib
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from perfcast.errors import TraceFormatError
from perfcast.ingest.schema import FastEvent, RawEvent, RawTrace

_GZIP_MAGIC = b"\x1f\x8b"
EventList = list[Any]  # RawEvent or FastEvent structs (same attribute names)
_CHUNK = 1 << 22
_MAX_SALVAGE_TRIES = 40
_TRAILER = re.compile(rb"\}\s*(?:,|\]|$)")
_FIRST_BYTE = re.compile(rb"\s*(\S)")
_ERROR_AT = re.compile(r"\(byte (\d+)\)")  # msgspec: "JSON is malformed: ... (byte 123)"


@dataclass
class Decoded:
    trace: RawTrace
    truncated: bool = False
    note: str | None = None
    warning: str | None = None  # data kept but altered (invalid UTF-8 replaced)
    # Events decoded a slice at a time (memory stays bounded); None: use trace.traceEvents.
    chunks: Iterator[EventList] | None = None

    def event_chunks(self) -> Iterator[EventList]:
        if self.chunks is not None:
            return self.chunks
        return iter([self.trace.traceEvents or []])


def read_bytes(path: str) -> tuple[bytes | bytearray, str | None]:
    """The file's (decompressed) content, and a note when the gzip stream was cut."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
            fh.seek(0)
            if head != _GZIP_MAGIC:
                return fh.read(), None
            return _gunzip(fh, path)
    except IsADirectoryError:
        raise TraceFormatError("is a folder, expected a trace file", path=path) from None
    except PermissionError:
        raise TraceFormatError("cannot be read (permission denied)", path=path) from None
    except FileNotFoundError:
        raise TraceFormatError("no such file", path=path) from None


def _gunzip(fh, path: str) -> tuple[bytearray, str | None]:
    out = bytearray()
    decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
    note = None
    while True:
        chunk = fh.read(_CHUNK)
        if not chunk:
            break
        try:
            out += decomp.decompress(chunk)
        except zlib.error as exc:
            note = f"the gzip stream is corrupt ({exc}); kept the {len(out):,} bytes before it"
            break
        # Concatenated gzip members (rare, but legal): start a new decompressor.
        while decomp.eof and decomp.unused_data:
            rest = decomp.unused_data
            decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                out += decomp.decompress(rest)
            except zlib.error:
                break
    if note is None and not decomp.eof:
        with contextlib.suppress(zlib.error):
            out += decomp.flush()
        note = f"the gzip stream ends early (file cut off); kept {len(out):,} decompressed bytes"
    if not out and note:
        raise TraceFormatError(f"no data could be decompressed: {note}", path=path)
    return out, note


_trace_decoder = msgspec.json.Decoder(RawTrace)
_list_decoder = msgspec.json.Decoder(list[RawEvent])  # type: ignore[valid-type]
_fast_list_decoder = msgspec.json.Decoder(list[FastEvent])  # type: ignore[valid-type]


_CHUNK_BYTES = 4 << 20
# Between two events of the array: "}" then "," then "{" (whitespace allowed).
_EVENT_GAP = re.compile(rb"\}\s*,\s*\{")
_COMMA = re.compile(rb"\s*,\s*")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_ARRAY_END = re.compile(rb"\}\s*\]")
_EMPTY_ARRAY = re.compile(rb"\s*\]")


class StreamFallback(Exception):  # noqa: N818 (a signal, not an error)
    """The file cannot be streamed (cut off, corrupt, unusual layout): read it whole."""


class StreamedTrace:
    """A trace decoded while it is read: events a few MB at a time, header at the end.

    Peak memory stays near the size of the columns instead of the JSON plus every
    decoded event. Anything unusual raises StreamFallback, and the caller reads the
    file whole (with salvage of cut-off data).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.header: RawTrace | None = None

    def _blocks(self) -> Iterator[bytes]:
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 (closed below, generator owns it)
        except OSError:
            raise StreamFallback from None
        with fh:
            gz = fh.read(2) == _GZIP_MAGIC
            fh.seek(0)
            decomp = zlib.decompressobj(16 + zlib.MAX_WBITS) if gz else None
            while True:
                block = fh.read(_CHUNK if decomp is None else 1 << 16)
                if not block:
                    break
                if decomp is None:
                    yield block
                    continue
                # Bounded output per call: a 3 MB gzip can hold 50 MB of JSON.
                while block:
                    try:
                        out = decomp.decompress(block, _CHUNK)
                    except zlib.error:
                        raise StreamFallback from None
                    if decomp.eof and decomp.unused_data:
                        raise StreamFallback  # several gzip members: rare, read whole
                    block = decomp.unconsumed_tail
                    yield out
            if decomp is not None and not decomp.eof:
                raise StreamFallback  # cut-off gzip stream: salvage path

    def chunks(self) -> Iterator[EventList]:
        buf = bytearray()
        blocks = self._blocks()
        prefix = b""
        # Up to and including the "[" of the event array.
        for block in blocks:
            buf += block
            m = _EVENTS_KEY.search(buf)
            if m:
                prefix = bytes(buf[: m.end()])
                del buf[: m.end()]
                break
        else:
            raise StreamFallback
        for block in blocks:
            buf += block
            while len(buf) > 2 * _CHUNK_BYTES:
                events, cut = self._next_slice(buf)
                if events is None:
                    break
                yield events
                del buf[:cut]
        # The rest: last events, "]", then the rest of the document.
        empty = _EMPTY_ARRAY.match(buf)
        if empty:
            self.header = self._decode_header(prefix, bytes(buf[empty.end() :]))
            return
        pos = 0
        while True:
            m = _ARRAY_END.search(buf, pos)
            if not m:
                raise StreamFallback
            events = self._decode_events(bytes(buf[: m.start() + 1]))
            if events is not None:
                header = self._try_header(prefix, bytes(buf[m.end() :]))
                if header is not None:
                    self.header = header
                    yield events
                    return
            pos = m.start() + 1

    def _next_slice(self, buf: bytearray) -> tuple[EventList | None, int]:
        """Decode about _CHUNK_BYTES of whole events from the front of buf."""
        pos = _CHUNK_BYTES
        while True:
            m = _EVENT_GAP.search(buf, pos)
            if not m:
                return None, 0
            events = self._decode_events(bytes(buf[: m.start() + 1]))
            if events is not None:
                return events, m.end() - 1  # the next slice starts at the "{"
            pos = m.end()  # that gap was inside an event (nested objects): try the next

    def _decode_events(self, body: bytes) -> EventList | None:
        piece = b"[" + body.lstrip(b", \t\r\n") + b"]"
        try:
            return _fast_list_decoder.decode(piece)
        except msgspec.ValidationError:
            pass  # ids that are not plain integers: the lenient structs take anything
        except (msgspec.DecodeError, UnicodeDecodeError):
            return None
        try:
            return _list_decoder.decode(piece)
        except msgspec.ValidationError as exc:
            raise TraceFormatError(
                f"is JSON but not a Kineto trace ({exc})",
                path=self.path,
                hint="expected an object with a 'traceEvents' list, as torch.profiler writes",
            ) from None
        except (msgspec.DecodeError, UnicodeDecodeError):
            return None

    def _try_header(self, prefix: bytes, suffix: bytes) -> RawTrace | None:
        try:
            return _trace_decoder.decode(prefix + b"]" + suffix)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            return None

    def _decode_header(self, prefix: bytes, suffix: bytes) -> RawTrace:
        header = self._try_header(prefix, suffix)
        if header is None:
            raise StreamFallback
        return header


def decode(data: bytes | bytearray, path: str, gzip_note: str | None = None) -> Decoded:
    """Decode JSON into a RawTrace, salvaging a truncated or corrupt tail."""
    first = _FIRST_BYTE.match(data)  # not data.lstrip(): that copies the whole buffer
    stripped = first.group(1) if first else b""
    if not stripped:
        raise TraceFormatError(
            "is empty" if not gzip_note else f"is empty after decompression ({gzip_note})",
            path=path,
            hint="expected a Kineto/Chrome trace JSON written by torch.profiler",
        )
    if stripped not in (b"{", b"["):
        raise TraceFormatError(
            "is not JSON (it does not start with '{' or '[')",
            path=path,
            hint="expected a Kineto/Chrome trace JSON written by torch.profiler",
        )
    is_list = stripped == b"["
    try:
        trace = _decode_whole(data, is_list)
        _check_shape(trace, path)
        if gzip_note:
            return Decoded(trace, truncated=True, note=gzip_note)
        return Decoded(trace)
    except msgspec.ValidationError as exc:
        raise TraceFormatError(
            f"is JSON but not a Kineto trace ({exc})",
            path=path,
            hint="expected an object with a 'traceEvents' list, as torch.profiler writes",
        ) from None
    except msgspec.DecodeError as exc:
        # Nothing after the byte the parser choked on can be kept (a cut, or a corrupt byte
        # in the middle): search backwards from there, not from the end of the data.
        m = _ERROR_AT.search(str(exc))
        salvaged = _salvage(data, is_list, path, int(m.group(1)) if m else len(data))
        if salvaged is None:
            where = str(exc)
            raise TraceFormatError(
                f"is not valid JSON and nothing could be salvaged ({where})",
                path=path,
                hint="the file may be cut off before its first event, or not a trace",
            ) from None
        trace, kept_bytes = salvaged
        lost = len(data) - kept_bytes
        cause = gzip_note or f"the JSON is cut off or corrupt ({exc})"
        kept = f"salvaged {len(trace.traceEvents or []):,} complete events"
        if gzip_note:  # the compressed file was cut: what followed the cut is unknown
            note = f"{cause}; {kept}; the events after the cut are lost"
        else:
            share = 100.0 * lost / max(len(data), 1)
            note = f"{cause}; {kept}, dropped the last {lost:,} bytes ({share:.1f}% of the data)"
        return Decoded(trace, truncated=True, note=note)
    except UnicodeDecodeError as exc:
        # msgspec raises this (not DecodeError) for invalid UTF-8 inside a string: a name cut
        # mid-character, a flipped bit. Keep every event, with U+FFFD for the bad bytes.
        fixed = bytes(data).decode("utf-8", errors="replace").encode()
        if fixed == data:  # valid UTF-8 after all (and no endless recursion)
            raise TraceFormatError(f"is not valid JSON ({exc})", path=path) from None
        decoded = decode(fixed, path, gzip_note)
        decoded.warning = "invalid UTF-8 in strings was replaced by U+FFFD"
        return decoded


def _decode_whole(data: bytes | bytearray, is_list: bool) -> RawTrace:
    if is_list:
        return RawTrace(traceEvents=_list_decoder.decode(data))
    return _trace_decoder.decode(data)


def _check_shape(trace: RawTrace, path: str) -> None:
    if trace.traceEvents is None:
        raise TraceFormatError(
            "is JSON but has no 'traceEvents' list",
            path=path,
            hint="expected a Kineto/Chrome trace written by torch.profiler",
        )


def _salvage(
    data: bytes | bytearray, is_list: bool, path: str, error_at: int
) -> tuple[RawTrace, int] | None:
    """Cut after the last complete event and close the brackets; None if impossible."""
    view = bytes(data) if isinstance(data, bytearray) else data
    if is_list:
        start = view.find(b"[")
        closing = b"]"
    else:
        key = view.find(b'"traceEvents"')
        if key < 0:
            return None
        start = view.find(b"[", key)
        if start < 0:
            return None
        closing = b"]}"
    limit = min(error_at, len(view))
    for _ in range(_MAX_SALVAGE_TRIES):
        cut = view.rfind(b"}", start, limit)
        if cut < 0:
            return None
        limit = cut
        # Only a '}' followed by ',' or ']' (or the cut itself) can end an event.
        if not _TRAILER.match(view, cut):
            continue
        candidate = view[: cut + 1] + closing
        try:
            trace = _decode_whole(candidate, is_list)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            continue
        if trace.traceEvents is None:
            return None
        return trace, cut + 1
    return None


def trace_files_in(folder: str) -> list[str]:
    """Trace files in a folder (not recursive), sorted for a stable rank order."""
    names = sorted(os.listdir(folder))
    return [
        os.path.join(folder, n)
        for n in names
        if (n.endswith(".json") or n.endswith(".json.gz"))
        and os.path.isfile(os.path.join(folder, n))
    ]
