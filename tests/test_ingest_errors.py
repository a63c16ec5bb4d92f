"""Bad input: every unusable file is a TraceFormatError naming it; cut or corrupt files salvage."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import re
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

import perfcast
from perfcast.errors import PerfcastError, TraceFormatError
from perfcast.events import EventTable
from perfcast.ingest import reader

EVENT = {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2}


def assert_format_error(path: Path, match: str | None = None) -> TraceFormatError:
    with pytest.raises(TraceFormatError, match=match) as info:
        perfcast.load(path)
    err = info.value
    assert str(path) in str(err)
    assert err.path == str(path)
    assert isinstance(err, PerfcastError) and err.exit_code == 2
    assert "\n" not in str(err)  # the CLI prints it as one line
    return err


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"hello, world", "not JSON"),
        (b"<html><body>404</body></html>", "not JSON"),
        (b"\x00\x01\x02\x03", "not JSON"),
        (b"42", "not JSON"),
        (b'"a string"', "not JSON"),
        (b"null", "not JSON"),
        (b"{}", "traceEvents"),
        (b'{"traceEvents": null, "schemaVersion": 1}', "traceEvents"),
        (b'{"schemaVersion": 1, "deviceProperties": []}', "traceEvents"),
        (b'{"traceEvents": 5}', "not a Kineto trace"),
        (b'{"traceEvents": {"ph": "X"}}', "not a Kineto trace"),
        (b'{"traceEvents": [1, 2, 3]}', "not a Kineto trace"),
        (b"[1, 2, 3]", "not a Kineto trace"),
        (b'[["ph", "X"]]', "not a Kineto trace"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1e999}]}', "not a Kineto trace"),
        (b"{", "ends inside its header, before its event list began"),
        (b'{"traceEvents": [', "nothing could be salvaged"),
        (b'{"traceEvents": [{"ph": "X", "ts"', "nothing could be salvaged"),
        (b'{"traceEvents": [{"ph": "X"} {"ph": "X"}]}', "nothing could be salvaged"),
        (b"", "empty"),
        (b"  \n\t ", "empty"),
    ],
)
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_bad_content(tmp_path: Path, content: bytes, match: str, gz: bool):
    path = tmp_path / ("bad.json.gz" if gz else "bad.json")
    path.write_bytes(gzip.compress(content) if gz else content)
    assert_format_error(path, match)


def test_empty_gz_file(tmp_path: Path):
    path = tmp_path / "empty.json.gz"
    path.write_bytes(b"")
    assert_format_error(path, "empty")


@pytest.mark.parametrize("n", [2, 5, 10])
def test_gzip_header_only(tmp_path: Path, n: int):
    path = tmp_path / "cut.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": []}', mtime=0)[:n])
    assert_format_error(path, "no data could be decompressed")


def test_gzip_header_only_says_to_copy_it_again(tmp_path: Path):
    path = tmp_path / "cut.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": []}', mtime=0)[:5])
    err = assert_format_error(path, "no data could be decompressed: .*cut off")
    assert err.hint and "copy the .gz again" in err.hint and "finished writing" in err.hint


def test_corrupt_gzip_says_to_check_and_copy_it_again(tmp_path: Path, capsys):
    from perfcast.cli.main import main

    path = tmp_path / "bad.json.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00" + b"garbage" * 20)  # a gzip header, then no deflate data
    err = assert_format_error(path, "no data could be decompressed: the gzip stream is corrupt")
    assert err.hint and "damaged or not gzip data" in err.hint and "gunzip -t" in err.hint
    assert main(["summary", str(path)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.count("\n") == 0 and "gunzip -t" in line and "Traceback" not in line


def test_json_nested_too_deep_says_what_to_pass(tmp_path: Path, capsys):
    from perfcast.cli.main import main

    path = tmp_path / "deep.json"
    path.write_text('{"a": ' * 5000 + "1" + "}" * 5000)
    err = assert_format_error(path, "nested deeper than 200 levels with no 'traceEvents' list")
    assert "not a Kineto trace, or a damaged one" in str(err)
    assert err.hint and "the file torch.profiler wrote" in err.hint
    assert main(["summary", str(path)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.count("\n") == 0 and "torch.profiler wrote" in line and "Traceback" not in line


def test_gzip_cut_before_the_first_event(tmp_path: Path):
    path = tmp_path / "cut.json.gz"
    data = gzip.compress(b'{"schemaVersion": 1, "traceEvents": [{"ph": "X"}]}', mtime=0)
    path.write_bytes(data[:-16])
    assert_format_error(path, "nothing could be salvaged")


def test_not_gzip_despite_its_name(tmp_path: Path):
    path = tmp_path / "trace.json.gz"
    path.write_bytes(b"PK\x03\x04 a zip file")
    assert_format_error(path, "not JSON")


def test_missing_path(tmp_path: Path):
    assert_format_error(tmp_path / "nope.json.gz", "no such file")
    assert_format_error(tmp_path / "no_folder", "no such file")


def test_folder_without_traces(tmp_path: Path):
    folder = tmp_path / "run"
    folder.mkdir()
    assert_format_error(folder, "no trace files")
    (folder / "README.txt").write_text("not a trace")
    (folder / "trace.json.tmp").write_text("{}")
    (folder / "sub.json").mkdir()  # a folder with a trace-like name is not a trace
    assert_format_error(folder, "no trace files")


def test_folder_with_one_rank_cut_before_its_first_event_reads_the_others(
    tmp_path: Path, write_trace
):
    """It stopped the whole folder (an empty rank file was left out, and said to be)."""
    write_trace({"traceEvents": [EVENT], "distributedInfo": {"rank": 0}}, "run/a.json")
    bad = write_trace(
        {"traceEvents": [EVENT, "x"] * 3, "distributedInfo": {"rank": 1}}, "run/b.json"
    )
    bad.write_bytes(bad.read_bytes()[:5])  # cut before its first event: nothing to salvage
    err = assert_format_error(bad)  # alone, an error naming it
    table = perfcast.load(tmp_path / "run")
    assert [r.rank for r in table.ranks] == [0]
    why = str(err).removeprefix(f"{bad}: ")
    assert f"1 rank file could not be read and was left out: b.json: {why}" in " ".join(
        table.ranks[0].folder_notes
    )


def test_files_that_hold_no_trace_are_left_out_of_a_folder(tmp_path: Path, write_trace):
    """`perfcast advise run --json > run/advise.json` made the folder unreadable (the shell
    creates the file empty before perfcast reads the folder); so did a saved result, or a
    timeline perfcast exported. They are left out, and the first rank's warnings say so."""
    write_trace({"traceEvents": [EVENT], "distributedInfo": {"rank": 0}}, "run/a.json")
    (tmp_path / "run" / "advise.json").write_bytes(b"")
    write_trace({"baseline_ms": 1.0}, "run/result.json")
    export = write_trace(
        {"traceEvents": [EVENT], "otherData": {"generator": "perfcast"}}, "run/rank-5.json"
    )
    table = perfcast.load(tmp_path / "run")
    assert [r.rank for r in table.ranks] == [0]
    note = next(w for w in table.ranks[0].warnings if "not read" in w)
    assert "3 files" in note and "advise.json is empty" in note and "result.json" in note
    assert "rank-5.json is a timeline perfcast wrote" in note
    # A summary says it once, on top, where API and --json users look first.
    summary = perfcast.summary(table, correct=False)
    assert summary.notes == [note] and note not in summary.ranks[0].notes
    # Given on its own, each is still an error naming it.
    assert_format_error(export, "timeline perfcast wrote")
    assert_format_error(tmp_path / "run" / "advise.json", "is empty")
    # A folder of nothing but such files says so, and why, naming the first.
    (tmp_path / "run" / "a.json").unlink()
    err = assert_format_error(tmp_path / "run", r"folder holds no readable trace: advise\.json")
    assert "advise.json is empty; rank-5.json is a timeline" in str(err)


def test_ranks_numbered_by_place_count_only_the_traces(tmp_path: Path, write_trace):
    """Files that name no rank are numbered by their place in the folder: a skipped file
    before them shifted them (x.json and y.json became ranks 2 and 3); a saved JSON list
    (`whatif --list --json`) read as one more, empty rank."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "a.json").write_bytes(b"")
    write_trace([{"name": "amp", "options": {}}], "run/models.json")
    write_trace({"traceEvents": [EVENT]}, "run/x.json")
    write_trace({"traceEvents": [EVENT]}, "run/y.json")
    table = perfcast.load(tmp_path / "run")
    assert [(r.rank, Path(r.path).name) for r in table.ranks] == [(0, "x.json"), (1, "y.json")]
    assert {it.rank for it in table.iterations} == {0, 1}
    note = next(w for w in table.ranks[0].warnings if "not read" in w)
    assert "models.json holds no trace events" in note


def test_a_perfcast_export_is_not_read_as_a_trace(tmp_path: Path) -> None:
    """A replay's Perfetto export was read as a trace: the profiler's cost taken out twice."""
    from perfcast.cli.main import main

    out = tmp_path / "replay.json.gz"
    example = Path(__file__).parents[1] / "perfcast/examples/ddp_a100_rank0.json.gz"
    assert main(["replay", str(example), "--export-trace", str(out), "-q"]) == 0
    assert_format_error(out, "timeline perfcast wrote")


def test_two_files_claim_one_rank(tmp_path: Path, write_trace):
    trace = {"traceEvents": [EVENT], "distributedInfo": {"rank": 3, "world_size": 4}}
    write_trace(trace, "run/a.json")
    second = write_trace(trace, "run/b.json.gz")
    with pytest.raises(TraceFormatError, match="rank 3") as info:
        perfcast.load(tmp_path / "run")
    assert str(second) in str(info.value)
    assert str(tmp_path / "run" / "a.json") in str(info.value)


def test_a_folder_is_not_a_file_name(tmp_path: Path):
    with pytest.raises(TraceFormatError, match="folder"):
        reader.read_bytes(str(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_unreadable_file(tmp_path: Path, write_trace):
    path = write_trace({"traceEvents": [EVENT]})
    path.chmod(0)
    try:
        assert_format_error(path, "permission")
    finally:
        path.chmod(0o644)


def test_bad_events_inside_a_good_file_are_skipped(write_trace):
    events = [
        EVENT,
        {"ph": "X", "cat": "cpu_op", "name": "no time", "pid": 1, "tid": 1},
        {"ph": "X", "name": 7, "pid": None, "tid": [1], "ts": "3.5", "dur": "1"},
        {"ph": "Z", "name": "unknown phase", "ts": 1},
        {},
        {"ph": "s", "cat": "ac2g", "id": "x", "ts": 1},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 4, "dur": -3, "args": {"grid": "big"}},
    ]
    table = perfcast.load(write_trace({"traceEvents": events}))
    assert table.check_invariants() == []
    # Fields of the wrong type drop their event (a number as a name, a list as a thread).
    assert table.names_of(np.arange(len(table))) == ["aten::add", "k"]
    assert table.ts.tolist() == [1000, 4000]
    assert table.dur.tolist() == [2000, 0]
    dropped, no_time, negative = table.ranks[0].warnings
    assert dropped.startswith("dropped 1 events whose fields have the wrong type")
    assert "event #2 at byte " in dropped and "'name' is a number, expected a string" in dropped
    assert no_time.startswith(
        "1 events without a readable time were skipped (the first: event #1, 'ts' is missing"
    )
    assert negative == (
        "1 events with a negative 'dur' were read as 0 long (the first: event #6, 'k')"
    )


def test_trace_without_events(write_trace):
    table = perfcast.load(write_trace({"traceEvents": [], "schemaVersion": 1}))
    assert len(table) == 0
    assert table.iterations == []
    assert table.check_invariants() == []
    assert table.ranks[0].warnings == ["the trace holds no complete events"]


# ---------------------------------------------------------------------------------------------
# Fuzz: real traces cut anywhere, and with corrupt bytes.

FUZZ_SOURCES = [
    "hta_mi250_minitoy_train.json.gz",
    "tracelens_h100_bert_small.json.gz",
    "dlrm_v100_8rank/worker3.json.gz",
]
N_CUTS = 64
N_CORRUPT = 24


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def offsets(size: int, n: int) -> list[int]:
    """n cut points spread over [1, size), plus the edges where formats break."""
    spread = np.linspace(1, size - 1, n).astype(int).tolist()
    edges = [1, 2, 9, 10, 11, 20, size - 9, size - 8, size - 4, size - 2, size - 1]
    return sorted({k for k in spread + edges if 0 < k < size})


def is_prefix_of(part: EventTable, full: EventTable) -> bool:
    m = len(part)
    rows = np.arange(m)
    return (
        m <= len(full)
        and np.array_equal(part.ts, full.ts[:m])
        and np.array_equal(part.kind, full.kind[:m])
        and part.names_of(rows) == full.names_of(rows)
    )


class Fuzzer:
    """Loads each case in its own folder; records anything but a clean load or a format error."""

    def __init__(self, root: Path, full: EventTable):
        self.root = root
        self.full = full
        self.failures: list[str] = []
        self.outcomes = {"complete": 0, "salvaged": 0, "error": 0}
        self.n = 0

    def case(self, label: str, name: str, data: bytes, *, cut: bool) -> None:
        self.n += 1
        folder = self.root / f"case{self.n}"
        folder.mkdir()
        path = folder / name
        path.write_bytes(data)
        digest = sha256(path)
        try:
            table = perfcast.load(path)
        except TraceFormatError as exc:
            self.outcomes["error"] += 1
            if str(path) not in str(exc):
                self.failures.append(f"{label}: error does not name the file: {exc}")
            table = None
        except Exception as exc:
            self.failures.append(f"{label}: {type(exc).__name__}: {exc}")
            table = None
        if sha256(path) != digest:
            self.failures.append(f"{label}: the input was modified")
        if os.listdir(folder) != [name]:
            self.failures.append(f"{label}: files written next to the input: {os.listdir(folder)}")
        path.unlink()
        if table is not None:
            self.check(label, table, cut=cut)

    def check(self, label: str, table: EventTable, *, cut: bool) -> None:
        problems = table.check_invariants()
        info = table.ranks[0]
        if info.truncated:
            self.outcomes["salvaged"] += 1
            if not info.salvage_note:
                problems.append("truncated without a salvage note")
        else:
            self.outcomes["complete"] += 1
            if info.salvage_note:
                problems.append(f"a salvage note but not truncated: {info.salvage_note}")
        if cut:
            # A cut keeps a prefix of the events; losing any of them must be reported.
            if not is_prefix_of(table, self.full):
                problems.append("the salvaged rows are not a prefix of the full trace")
            if not info.truncated and len(table) != len(self.full):
                problems.append(f"lost {len(self.full) - len(table)} rows without saying so")
        if problems:
            self.failures.append(f"{label}: {problems}")


@pytest.mark.parametrize("source", FUZZ_SOURCES, ids=lambda s: Path(s).name.split(".")[0])
def test_fuzz_cut_and_corrupt(shared_traces: Path, tmp_path: Path, source: str):
    src = shared_traces / source
    src_digest = sha256(src)
    src_listing = sorted(os.listdir(src.parent))
    gz_bytes = src.read_bytes()
    json_bytes = gzip.decompress(gz_bytes)
    full = perfcast.load(src)
    assert not full.ranks[0].truncated
    fuzz = Fuzzer(tmp_path, full)

    # Cut the compressed stream (a killed job writing .json.gz).
    for k in offsets(len(gz_bytes), N_CUTS):
        fuzz.case(f"gz[:{k}]", "trace.json.gz", gz_bytes[:k], cut=True)
    # Cut the JSON, written plain and as a complete gzip of the cut JSON.
    for k in offsets(len(json_bytes), N_CUTS):
        part = json_bytes[:k]
        fuzz.case(f"json[:{k}]", "trace.json", part, cut=True)
        fuzz.case(f"gzip(json[:{k}])", "trace.json.gz", gzip.compress(part, 1), cut=True)

    # Corrupt 1-3 random bytes (seeded) of the JSON and of the compressed stream.
    rng = random.Random(f"perfcast-fuzz-{source}")
    for data, name in ((json_bytes, "trace.json"), (gz_bytes, "trace.json.gz")):
        for _ in range(N_CORRUPT):
            buf = bytearray(data)
            where = sorted(rng.randrange(len(buf)) for _ in range(rng.randint(1, 3)))
            for i in where:
                buf[i] = rng.randrange(256)
            fuzz.case(f"{name} corrupt at {where}", name, bytes(buf), cut=False)

    print(source, fuzz.n, "cases:", fuzz.outcomes)
    assert fuzz.failures == [], "\n".join(fuzz.failures[:20])
    assert fuzz.n >= 3 * 60
    # Cuts in the body salvage; cuts in the gzip header or before the first event do not.
    assert fuzz.outcomes["salvaged"] >= 2 * N_CUTS, fuzz.outcomes
    assert fuzz.outcomes["error"] > 0, fuzz.outcomes
    assert sha256(src) == src_digest
    assert sorted(os.listdir(src.parent)) == src_listing


def test_salvage_keeps_events_before_a_corrupt_byte(tmp_path: Path, write_trace):
    events = [dict(EVENT, ts=float(i), name=f"op{i}") for i in range(200)]
    data = bytearray(write_trace({"traceEvents": events}).read_bytes())
    i = data.index(b'"op150"')
    data[i] = 0x07  # an invalid character in the middle of the events
    path = tmp_path / "corrupt.json"
    path.write_bytes(bytes(data))
    table = perfcast.load(path)
    info = table.ranks[0]
    assert info.truncated
    # Only the damaged event is lost: reading resumes at the next event.
    assert table.names_of(np.arange(len(table))) == [f"op{i}" for i in range(200) if i != 150]
    assert "skipped 1 damaged stretch of the event list (first at byte " in info.salvage_note
    assert "kept 199 complete events" in info.salvage_note
    span = len(json.dumps(events[150])) + 2  # the event and the ", " after it
    assert f"lost {span} of the file's {len(data):,} bytes" in info.salvage_note


def test_invalid_utf8_in_a_name_keeps_every_event(tmp_path: Path, write_trace):
    events = [dict(EVENT, ts=float(i), name=f"op{i}") for i in range(10)]
    data = bytearray(write_trace({"traceEvents": events}).read_bytes())
    i = data.index(b"op5")
    data[i : i + 2] = b"\xe2\x82"  # a multi-byte character cut short
    path = tmp_path / "latin.json"
    path.write_bytes(bytes(data))
    table = perfcast.load(path)
    assert len(table) == 10
    assert table.name_of(5) == "\ufffd5"
    assert not table.ranks[0].truncated
    assert any("UTF-8" in w for w in table.ranks[0].warnings)


# ---------------------------------------------------------------------------------------------
# What was lost, in bytes of the file on disk (issue 15: a 93% cut reported as "0.0%").


def _big_trace(n: int) -> bytes:
    events = [dict(EVENT, ts=float(i), name=f"op{i}") for i in range(n)]
    return json.dumps({"traceEvents": events, "schemaVersion": 1}).encode()


def _share(note: str) -> float:
    return float(re.search(r"\(([\d.]+)%\)$", note).group(1))


def test_a_gzip_stream_damaged_early_loses_the_rest_of_the_file(tmp_path: Path):
    # Stored (level 0) deflate blocks: a damaged block header stops zlib right there.
    data = gzip.compress(_big_trace(20_000), compresslevel=0, mtime=0)
    header = 10  # walk the stored blocks (a header byte, LEN, NLEN, LEN bytes) past 7%
    while header < len(data) * 7 // 100:
        length = data[header + 1] | data[header + 2] << 8
        assert length ^ (data[header + 3] | data[header + 4] << 8) == 0xFFFF
        header += 5 + length
    assert 0.07 < header / len(data) < 0.2
    broken = bytearray(data)
    broken[header + 3] ^= 0xFF  # its length check (NLEN) no longer matches
    path = tmp_path / "stored.json.gz"
    path.write_bytes(bytes(broken))
    info = perfcast.load(path).ranks[0]
    assert info.truncated and "the gzip stream is corrupt" in info.salvage_note
    # Damaged deflate data can inflate wrong values that still parse: said, not hidden.
    assert "may carry wrong names and times" in info.salvage_note
    m = re.search(r"the ([\d,]+) bytes from byte ([\d,]+) on could not be read", info.salvage_note)
    assert m, info.salvage_note
    found = int(m.group(2).replace(",", ""))
    assert header - 128 <= found <= header + 4  # the damaged block header, within zlib's reach
    assert _share(info.salvage_note) == pytest.approx(100 * (1 - header / len(data)), abs=0.3)

    # Compressed data damaged at 7%: zlib inflates garbage and notices only at the end (the
    # checksum); the garbage is skipped, and the note still counts 93% of the file lost.
    data = gzip.compress(_big_trace(20_000), compresslevel=6, mtime=0)
    at = len(data) * 7 // 100
    path = tmp_path / "deflate.json.gz"
    path.write_bytes(data[:at] + b"\xff" * 64 + data[at + 64 :])
    table = perfcast.load(path)
    note = table.ranks[0].salvage_note
    assert "the gzip stream is corrupt" in note and "too damaged to read" in note
    assert _share(note) == pytest.approx(93, abs=2), note
    assert 0.06 * 20_000 < len(table) < 0.075 * 20_000  # what came before the damage
    assert table.names_of(np.arange(len(table))) == [f"op{i}" for i in range(len(table))]


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gzip"])
def test_a_cut_file_says_what_followed_the_cut_is_unknown(tmp_path: Path, gz: bool):
    data = _big_trace(5_000)
    data = gzip.compress(data, mtime=0) if gz else data
    path = tmp_path / ("cut.json.gz" if gz else "cut.json")
    path.write_bytes(data[: len(data) * 7 // 100])  # 93% of the file never written
    table = perfcast.load(path)
    note = table.ranks[0].salvage_note
    assert table.ranks[0].truncated and 0 < len(table) < 5_000
    assert "cut off" in note and "how much that was is unknown" in note
    assert f"kept {len(table):,} complete events" in note
    # Only the unfinished event at the cut is counted as dropped; no share of the file is
    # claimed lost, since what followed the cut was never in it.
    assert "(the unfinished one at the cut, " in note and "bytes, dropped)" in note
    assert "of the file's" not in note and "%" not in note


def test_damage_early_in_a_big_slice_costs_one_event_not_a_minute(tmp_path: Path):
    """The old reader retried a 4 MB decode at every event boundary after the damage."""
    data = bytearray(_big_trace(120_000))  # ~10 MB: two slices and more
    clean = tmp_path / "clean.json"
    clean.write_bytes(bytes(data))
    i = data.index(b'"op1000"')
    data[i] = 0x07
    path = tmp_path / "big.json"
    path.write_bytes(bytes(data))
    # The same file undamaged, loaded just before under the same load (and warming the
    # compiled code): the damaged one may cost a few slices more, not a retry per event.
    start = time.perf_counter()
    perfcast.load(clean)
    clean_s = time.perf_counter() - start
    start = time.perf_counter()
    table = perfcast.load(path)
    assert time.perf_counter() - start < 3 * clean_s + 2
    assert len(table) == 120_000 - 1
    assert "op1000" not in set(table.names)


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (b"PK\x03\x04 zipped", "a zip archive"),
        (zlib.compress(b'{"traceEvents": []}'), "zlib data without a gzip header"),
        (
            gzip.compress(gzip.compress(b'{"traceEvents": []}', mtime=0), mtime=0),
            "gzip inside gzip",
        ),
        (b"<html><body>404</body></html>", "HTML or XML"),
        (b"SQLite format 3\x00\x10\x00", "an SQLite database, such as an Nsight Systems"),
        (b"\x80\x04\x95\x10\x00", "a Python pickle"),
    ],
    # Named ids: bytes in an id would differ between xdist workers if they held a timestamp.
    ids=["zip", "zlib", "gzip-in-gzip", "html", "sqlite", "pickle"],
)
def test_other_formats_are_named(tmp_path: Path, content: bytes, what: str):
    path = tmp_path / "trace.json.gz"
    path.write_bytes(content)
    assert_format_error(path, f"is not JSON \\(it looks like {what}")


def test_wrong_typed_events_are_located_in_the_json(tmp_path: Path, write_trace):
    events = [EVENT, dict(EVENT, ph=["X"]), dict(EVENT, ts=5.0)]
    data = json.dumps({"traceEvents": events}).encode()
    path = tmp_path / "trace.json.gz"
    path.write_bytes(gzip.compress(data))
    (note,) = perfcast.load(path).ranks[0].warnings
    at = data.index(b'{"ph": ["X"]')
    assert f"event #1 at byte {at:,} of the inflated JSON: 'ph' is an array" in note


def test_depth_limit_on_a_value_the_cut_left_open() -> None:
    """A value nested past the limit and never closed (a cut file) is nulled to the end,
    where the reader's salvage takes over; one that closes is nulled up to its bracket."""
    from perfcast.ingest.reader import flatten_deep

    open_ = b'[{"a": ' + b"[" * 12 + b"1"
    new, replaced, first = flatten_deep(open_, limit=5)
    assert (new, replaced, first) == (b'[{"a": [[[null', 1, 10)
    closed = b'[{"a": ' + b"[" * 12 + b"1" + b"]" * 12 + b"}]"
    new, replaced, first = flatten_deep(closed, limit=5)
    assert (new, replaced, first) == (b'[{"a": [[[null]]]}]', 1, 10)


@pytest.mark.parametrize(
    "fraction, steps, note",
    [
        (0.12, 1, "no runtime call or GPU event survived the cut"),
        (0.3, 2, "no runtime call or GPU event survived the cut"),
        (0.5, 3, "ProfilerStep#4 20%, ProfilerStep#5 0%, ProfilerStep#6 49%"),
        (0.58, 3, "the cut lost GPU-side events of some steps"),
        (0.9, 3, "the cut lost GPU-side events of some steps"),
        (0.99, 3, None),
    ],
)
def test_a_cut_that_lost_gpu_side_events_says_so_and_the_replay_holds(
    tmp_path: Path, fraction: float, steps: int, note: str | None
) -> None:
    """Kineto writes the GPU side after all CPU ops, so a cut keeps whole steps of ops with
    few or none of their launches: they read as an idle GPU. The note says which steps, by
    their share of ops with a launch (equal in every step of a complete trace), and what to
    do; nothing is removed, so the replay still reproduces every step."""
    example = Path(__file__).parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"
    data = gzip.decompress(example.read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: int(len(data) * fraction)])
    table = perfcast.load(cut)
    assert len(table.iterations) == steps
    warnings = " ".join(table.ranks[0].warnings)
    if note is None:
        assert "GPU side" not in warnings and "GPU-side" not in warnings
    else:
        assert note in warnings and "record fewer active steps" in warnings
    assert perfcast.replay(table, correct=False).max_abs_error_pct < 0.01


def test_a_folder_or_file_that_cannot_be_read_says_so(tmp_path: Path, monkeypatch) -> None:
    """A folder its user may not list was an internal error (PermissionError from listdir),
    and a file in a folder they may not enter read "no such file" (os.path.exists says
    False). Simulated: the tests run as root, who may read anything."""
    folder = tmp_path / "ranks"
    folder.mkdir()
    (folder / "rank0.json").write_text('{"traceEvents": []}')
    real_listdir, real_stat = os.listdir, os.stat

    def listdir(p: object) -> list[str]:
        if os.fspath(p) == str(folder):  # type: ignore[call-overload]
            raise PermissionError(13, "Permission denied", str(p))
        return real_listdir(p)  # type: ignore[call-overload]

    def stat(p: object, *args: object, **kw: object) -> os.stat_result:
        if os.fspath(p) == str(folder / "rank0.json"):  # type: ignore[call-overload]
            raise PermissionError(13, "Permission denied", str(p))
        return real_stat(p, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "listdir", listdir)
    assert_format_error(folder, r"folder cannot be listed \(Permission denied\)")
    monkeypatch.setattr(os, "stat", stat)
    assert_format_error(folder / "rank0.json", r"cannot be read \(Permission denied\)")
    assert_format_error(tmp_path / "missing.json", "no such file or folder")


def test_events_written_twice_are_counted_once(tmp_path: Path) -> None:
    """A file with events repeated (merged or concatenated twice) and shuffled gives the
    same table as the original, and says how many were repeats (they had lowered the step
    without the profiler by 1.35 ms: more ops, more profiler cost taken out)."""
    example = Path(perfcast.__file__).parent / "examples" / "ddp_a100_rank0.json.gz"
    doc = json.loads(gzip.decompress(example.read_bytes()))
    events = doc["traceEvents"]
    timed = [e for e in events if e.get("ph") == "X" and (e.get("dur") or 0) > 0]
    rng = random.Random(3)
    events.extend(json.loads(json.dumps(rng.sample(timed, 500))))
    rng.shuffle(events)
    path = tmp_path / "twice.json"
    path.write_text(json.dumps(doc))
    a, b = perfcast.load(example), perfcast.load(path)
    assert len(b.kind) == len(a.kind)
    assert any("500 events appear twice" in w for w in b.ranks[0].warnings)
    assert not any("appear twice" in w for w in a.ranks[0].warnings)
    steps = [it.real_ms for it in perfcast.summary(a).ranks[0].iterations]
    assert [it.real_ms for it in perfcast.summary(b).ranks[0].iterations] == steps


def _example_json() -> bytes:
    example = Path(__file__).parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"
    return gzip.decompress(example.read_bytes())


@pytest.mark.parametrize("tail", [b"}", b"},", b"},\n", b"},\n  "])
def test_a_cut_after_an_events_comma_keeps_that_event(tmp_path: Path, tail: bytes) -> None:
    """A cut that falls after a whole event (and its comma) loses nothing of the file."""
    data = _example_json()
    end = data.index(b"\n  },\n", len(data) // 2) + 4  # the "}" of an event
    path = tmp_path / "cut.json"
    path.write_bytes(data[:end] + tail[1:])
    table = perfcast.load(path)
    whole_events = data[:end].count(b'"ph":')
    assert len(table) + _not_rows(data[:end]) == whole_events
    assert "(the cut fell between two events)" in table.ranks[0].salvage_note


def _not_rows(data: bytes) -> int:
    """Events that are not table rows (flow arrows, metadata)."""
    return data.count(b'"ph": "s"') + data.count(b'"ph": "f"') + data.count(b'"ph": "M"')


@pytest.mark.parametrize("keep", [1, 40, 200])
def test_a_cut_or_damaged_header_after_the_list_keeps_every_event(
    tmp_path: Path, keep: int
) -> None:
    """The header after the event list (device, base time) cut `keep` bytes after the "]":
    every event is kept, the header fields before the cut are read, and it says so."""
    data = _example_json()
    close = data.index(b"]", data.rindex(b"\n  }\n"))  # the event list's own "]"
    full = perfcast.load(Path(__file__).parents[1] / "perfcast/examples/ddp_a100_rank0.json.gz")
    path = tmp_path / "cut.json"
    path.write_bytes(data[: close + keep])
    table = perfcast.load(path)
    info = table.ranks[0]
    assert len(table) == len(full)
    assert not info.truncated and info.salvage_note is None
    said = " ".join(info.warnings)
    assert "after the whole event list (every event kept)" in said
    # A damaged key, not a cut: the same.
    damaged = data[:close] + data[close:].replace(b'"traceName"', b'#traceName"')
    path.write_bytes(damaged)
    table = perfcast.load(path)
    assert len(table) == len(full) and "every event kept" in " ".join(table.ranks[0].warnings)


def test_a_gzip_without_its_footer_lost_nothing(tmp_path: Path) -> None:
    """The gzip stream's last 8 bytes (checksum, size) missing: the JSON is whole."""
    example = Path(__file__).parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"
    path = tmp_path / "nofooter.json.gz"
    path.write_bytes(example.read_bytes()[:-8])
    table = perfcast.load(path)
    info = table.ranks[0]
    assert len(table) == len(perfcast.load(example))
    assert not info.truncated and not info.tail_lost
    assert any("only its checksum is missing" in w for w in info.warnings)
    assert not any("GPU-side" in w for w in info.warnings)


def test_the_step_a_cut_fell_in_is_named(tmp_path: Path) -> None:
    """A cut drops a step's last launches and kernels together, so the step reads complete,
    only shorter: the step of the last event the file holds is named, also for one step."""
    data = _example_json()
    path = tmp_path / "cut.json"
    path.write_bytes(data[: int(len(data) * 0.99)])
    table = perfcast.load(path)
    last = table.iterations[-1].name
    said = " ".join(table.ranks[0].warnings)
    assert f"cut off while {last}'s events were being written" in said
    tree = perfcast.tree(table)
    assert any("cut off while" in n for n in tree.notes)
    assert any("truncated trace" in n for n in tree.notes)


@pytest.mark.parametrize("tail", [b"", b"\n", b"\n    "])
def test_a_cut_inside_an_event_after_its_nested_object_is_the_unfinished_event(
    tmp_path: Path, tail: bytes
) -> None:
    """A cut after an event's `"args": {...}` closed, before the event's own "}": with the
    trailing whitespace stripped, the end of the data was not taken as the end, and the
    unfinished event was reported as "skipped 1 damaged stretch" (29% of cuts near the end
    of a small trace)."""
    data = _example_json()
    start = data.index(b"\n  {\n", len(data) // 2) + 3  # an event's "{"
    args_end = data.index(b"\n    }", start) + len(b"\n    }")  # its args' "}"
    path = tmp_path / "cut.json"
    path.write_bytes(data[:args_end] + tail)
    note = perfcast.load(path).ranks[0].salvage_note
    assert "damaged" not in note and "the unfinished one at the cut" in note


def _small_trace_text() -> str:
    from tests.tracegen import linear_steps

    return json.dumps(linear_steps().doc())


@pytest.mark.parametrize(
    "field, literal, says",
    [
        ("dur", '"5"', "'dur' is a string"),
        ("dur", "1e300", "'dur' is 1e+300"),
        ("ts", "1.7e18", "'ts' is 1.7e+18"),  # epoch nanoseconds written as microseconds
        ("ts", "123456789012345678901234567890", "'ts' is 1234567890"),
        ("dur", "NaN", "NaN or Infinity, which JSON does not allow"),
        ("ts", "Infinity", "NaN or Infinity, which JSON does not allow"),
    ],
)
def test_every_time_unreadable_names_the_field(tmp_path, field, literal, says):
    """Every event's time out of range or of the wrong type: the error said "the trace holds
    no complete events ... profile at least one step", as if nothing had been recorded."""
    text = re.sub(rf'"{field}": [0-9.]+', f'"{field}": {literal}', _small_trace_text())
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(PerfcastError) as info:
        perfcast.load(path).require_events()
    assert says in str(info.value) and str(path) in str(info.value)


def test_negative_and_missing_durations_are_noted(tmp_path):
    doc = json.loads(_small_trace_text())
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            del e["dur"]
        elif e.get("cat") == "cpu_op":
            e["dur"] = -5
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    warnings = perfcast.load(path).ranks[0].warnings
    assert any("2 events with a negative 'dur' were read as 0 long" in w for w in warnings)
    assert any("2 GPU kernels, copies or memsets have no 'dur'" in w for w in warnings)


def test_a_float_pid_is_named_by_its_value(tmp_path):
    doc = json.loads(_small_trace_text())
    for e in doc["traceEvents"]:
        e["pid"] = 1.5
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    assert_format_error(path, match=r"'pid' is 1\.5, expected a whole number or a string")


def test_folder_entries_that_are_no_file_are_noted(tmp_path):
    """A FIFO, a broken link or a folder named like a rank's trace was skipped without a
    word: the job read as one rank fewer. Ranks of different job sizes are doubted too."""
    import os

    doc = json.loads(_small_trace_text())
    for r, size in ((0, 2), (1, 4)):
        d = dict(doc, distributedInfo={"rank": r, "world_size": size, "backend": "nccl"})
        (tmp_path / f"worker{r}.json").write_text(json.dumps(d))
    os.mkfifo(tmp_path / "worker2.json")
    (tmp_path / "worker3.json.gz").symlink_to(tmp_path / "gone.json.gz")
    (tmp_path / "worker4.json").mkdir()
    warnings = perfcast.load(tmp_path).ranks[0].warnings
    assert any(
        "3 entries of the folder named like a trace are no file" in w
        and "worker2.json, worker3.json.gz, worker4.json" in w
        for w in warnings
    ), warnings
    says = "disagree on the job's size (distributedInfo world_size 2, 4)"
    assert any(says in w for w in warnings)


@pytest.mark.parametrize(
    "encoding, says",
    [
        ("utf-16", "UTF-16 text"),
        ("utf-32", "UTF-32 text"),
        ("utf-16-be", "UTF-16 text without a byte-order mark"),
        ("utf-16-le", "UTF-16 text without a byte-order mark"),
        ("utf-32-le", "UTF-32 text without a byte-order mark"),
    ],
)
def test_other_text_encodings_are_named(tmp_path, encoding, says):
    path = tmp_path / "t.json"
    path.write_bytes(_small_trace_text().encode(encoding))
    assert_format_error(path, match=f"{says}.*save it as UTF-8")


@pytest.mark.parametrize("schema", ["1.0.1", "1.1.0-chakra.0.0.4"])
@pytest.mark.parametrize("gz", [False, True])
def test_execution_trace_is_named(
    tmp_path: Path, schema: str, gz: bool, capsys, write_trace
) -> None:
    """A PyTorch Execution Trace (written beside the Kineto trace by ExecutionTraceObserver)
    is named as such, with what to pass instead; in a folder it is left out, said so."""
    doc = {
        "schema": schema,
        "pid": 1,
        "time": "2024-04-29 16:23:47",
        "start_ts": 4071903410,
        "nodes": [{"id": 2, "name": "[pytorch|profiler|execution_trace|thread]"}],
    }
    raw = json.dumps(doc, indent=2).encode()
    p = tmp_path / ("et.json.gz" if gz else "et.json")
    p.write_bytes(gzip.compress(raw) if gz else raw)
    with pytest.raises(TraceFormatError, match=rf"Execution Trace \(schema {re.escape(schema)}\)"):
        perfcast.load(p)
    from perfcast.cli.main import main

    rc = main(["summary", str(p)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "'traceEvents' list that" in err
    write_trace({"traceEvents": [EVENT], "distributedInfo": {"rank": 0}}, "ranks/a.json")
    (tmp_path / "ranks" / "et.json").write_bytes(raw)
    t = perfcast.load(tmp_path / "ranks")
    note = " ".join(t.ranks[0].folder_notes)
    assert "et.json is a PyTorch Execution Trace" in note and "keep outputs" not in note


def test_a_dash_is_not_read_as_standard_input(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TraceFormatError, match=r"'-' \(standard input\) is not read") as info:
        perfcast.load("-")
    assert info.value.hint and "save the trace to a file" in info.value.hint
