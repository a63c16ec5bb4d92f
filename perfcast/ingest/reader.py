"""Bytes in, `RawTrace` out: gzip, JSON decoding, and salvage of cut-off files.

A killed training job leaves a trace cut anywhere, often inside the gzip
stream. We keep every complete event before the cut and say how much was lost.
"""

from __future__ import annotations

import contextlib
import os
import re
import zlib
from dataclasses import dataclass

import msgspec

from perfcast.errors import TraceFormatError
from perfcast.ingest.schema import RawEvent, RawTrace

_GZIP_MAGIC = b"\x1f\x8b"
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
_list_decoder = msgspec.json.Decoder(list[RawEvent])


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
        note = (
            f"{cause}; salvaged {len(trace.traceEvents or []):,} complete events, "
            f"dropped the last {lost:,} bytes ({100.0 * lost / max(len(data), 1):.1f}% of the data)"
        )
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
