"""Damaged traces: what is salvaged, and that the notes say what happened, where, and why."""

from __future__ import annotations

import copy
import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

import perfcast
from perfcast.errors import PerfcastError
from perfcast.ingest import reader
from tests.conftest import write_json
from tests.tracegen import TraceBuilder


def _steps_doc(n: int = 3) -> dict[str, Any]:
    """n steps of 1 ms, each an op launching a kernel that outlasts the step's CPU range."""
    b = TraceBuilder()
    for step in range(n):
        t0 = step * 1000
        b.step(step + 1, t0, 1000)
        b.op("aten::linear", t0 + 10, 300)
        b.launch("volta_sgemm_128x64_nn", t0 + 20, 5, t0 + 900, 400, stream=7)
    return b.doc()


def _without(doc: dict[str, Any], key: str, name: str) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    for e in doc["traceEvents"]:
        if e.get("name") == name:
            del e[key]
    return doc


def _notes(table: perfcast.EventTable) -> str:
    return " | ".join(table.ranks[0].warnings)


def test_a_step_without_dur_is_left_out_not_a_0_ms_step(write_trace) -> None:
    """A ProfilerStep range without 'dur' read as 0 long: a 0 ms step, and the next step
    took in its time (merged), with a note blaming GPU times out of order."""
    whole = perfcast.load(write_trace(_steps_doc()))
    table = perfcast.load(write_trace(_without(_steps_doc(), "dur", "ProfilerStep#2")))
    assert [it.name for it in table.iterations] == ["ProfilerStep#1", "ProfilerStep#3"]
    notes = _notes(table)
    assert "ProfilerStep#2 has no 'dur'" in notes and "left out of the steps" in notes
    assert "out of order" not in notes
    # The step after the gap is timed from when the work before it was done, as it was.
    assert table.iterations[1].dur_ns == whole.iterations[2].dur_ns
    assert table.iterations[0].dur_ns == whole.iterations[0].dur_ns


def test_the_last_step_without_dur_is_named_not_said_to_hold_no_work(write_trace) -> None:
    table = perfcast.load(write_trace(_without(_steps_doc(), "dur", "ProfilerStep#3")))
    assert [it.name for it in table.iterations] == ["ProfilerStep#1", "ProfilerStep#2"]
    notes = _notes(table)
    assert "ProfilerStep#3 has no 'dur'" in notes and "holds no work" not in notes


def test_a_trace_whose_only_step_has_no_dur_says_so(write_trace) -> None:
    doc = _without(_steps_doc(1), "dur", "ProfilerStep#1")
    table = perfcast.load(write_trace(doc))
    assert not table.ranks[0].has_steps and table.ranks[0].untimed_steps == ["ProfilerStep#1"]
    notes = perfcast.summary(table, correct=False).ranks[0].notes
    assert any("ProfilerStep#1 has no 'dur'" in n for n in notes)
    assert any("no ProfilerStep#N with a duration" in n for n in notes)
    assert not any("no ProfilerStep#N in this trace" in n for n in notes)
    assert table.iterations[0].dur_ns > 0
    # plan refuses it for what it is (it printed "infG samples/s" and divide-by-zero warnings).
    with pytest.raises(
        PerfcastError,
        match=r"no ProfilerStep range with a duration \("
        r"ProfilerStep#1 lacks 'dur'\)",
    ):
        perfcast.plan(table, gpus=8, gpu="h100")


def test_a_step_recorded_twice_keeps_the_range_with_a_duration(write_trace) -> None:
    """2021-era traces record ProfilerStep#N as an op too: one without 'dur' is no loss."""
    doc = _steps_doc(2)
    events = doc["traceEvents"]
    for e in list(events):
        if e.get("name", "").startswith("ProfilerStep#"):
            twin = dict(e, cat="cpu_op")
            del twin["dur"]
            events.append(twin)
    table = perfcast.load(write_trace(doc))
    assert [it.name for it in table.iterations] == ["ProfilerStep#1", "ProfilerStep#2"]
    assert "has no 'dur'" not in _notes(table)


def test_ops_without_dur_are_counted_and_the_first_located(write_trace) -> None:
    """A missing CPU 'dur' became 0 without a word (only GPU work was counted)."""
    doc = _without(_steps_doc(), "dur", "aten::linear")
    index = next(i for i, e in enumerate(doc["traceEvents"]) if e["name"] == "aten::linear")
    notes = _notes(perfcast.load(write_trace(doc)))
    says = f"3 CPU ops or ranges have no 'dur' (the first: event #{index}, 'aten::linear')"
    assert says in notes


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        (
            "ts",
            None,
            "events without a readable time were skipped (the first: event #{i}, "
            "'ts' is missing (or null)",
        ),
        (
            "dur",
            -5,
            "events with a negative 'dur' were read as 0 long (the first: event #{i}, "
            "'aten::linear')",
        ),
    ],
)
def test_notes_on_bad_times_give_the_first_events_index(
    write_trace, key: str, value: Any, says: str
) -> None:
    doc = _steps_doc()
    events = doc["traceEvents"]
    # Wrong-typed elements before it shift the decoded slice against the file's list.
    events.insert(0, {"ph": "X", "name": 5, "ts": 1, "dur": 1})
    events.insert(1, "not an event")
    i = next(k for k, e in enumerate(events) if isinstance(e, dict) and e["name"] == "aten::linear")
    events[i][key] = value
    assert says.format(i=i) in _notes(perfcast.load(write_trace(doc)))


def test_the_event_index_counts_every_element_of_a_big_trace(tmp_path: Path) -> None:
    """Slices after the first (a few MB each) count on from where the last one ended."""
    b = TraceBuilder()
    for k in range(60_000):
        b.op("aten::add", k * 10, 5, note="x" * 60)
    b.events[45_678]["dur"] = -1
    table = perfcast.load(b.write(tmp_path / "big.json"))
    assert "(the first: event #45,678, 'aten::add')" in _notes(table)


# ---------------------------------------------------------------------------------------------
# A "]" inside damage is not the end of the event list.


def _ops_trace(n: int) -> bytes:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1}
        for i in range(n)
    ]
    return json.dumps({"schemaVersion": 1, "traceEvents": events}).encode()


def test_a_bracket_in_damage_mid_list_does_not_end_it(tmp_path: Path) -> None:
    """Damage holding a "]" was read as the end of the event list: every event after it was
    taken for the header and lost, and the note said "every event kept"."""
    data = _ops_trace(2_000)
    at = data.index(b'{"ph"', len(data) // 2)
    path = tmp_path / "t.json"
    path.write_bytes(data[:at] + b"], " + data[at:])
    table = perfcast.load(path)
    info = table.ranks[0]
    assert len(table) == 1_998  # the damage and the two events it joins are one stretch
    assert "skipped 1 damaged stretch" in info.salvage_note
    assert not any("every event kept" in w for w in info.warnings)


def test_a_corrupt_gzip_stream_says_what_it_lost(shared_traces: Path, tmp_path: Path) -> None:
    """64 bytes of a gzip stream damaged halfway: zlib inflates garbage to the end (its
    checksum fails there), and a "]" in the garbage ended the event list: half the events
    were gone, the note said "lost about 753 of 1,159,569 bytes (0.1%)" and another "after
    the whole event list (every event kept)"."""
    data = bytearray((shared_traces / "resnet50_v100_nw0_2021.json.gz").read_bytes())
    mid = len(data) // 2
    for i in range(mid, mid + 64):
        data[i] ^= 0xFF
    path = tmp_path / "corrupt.json.gz"
    path.write_bytes(bytes(data))
    info = perfcast.load(path).ranks[0]
    note = info.salvage_note
    assert "the gzip stream is corrupt" in note
    assert _share(note) == pytest.approx(50, abs=3), note
    assert not any("every event kept" in w for w in info.warnings)


def _share(note: str) -> float:
    return float(re.search(r"\(([\d.]+)%\)$", note).group(1))


# ---------------------------------------------------------------------------------------------
# A rank file nothing of which can be read is left out of its folder; alone, it is an error.


def _rank_folder(tmp_path: Path, n: int = 3) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    for r in range(n):
        doc = dict(_steps_doc(2), distributedInfo={"rank": r, "world_size": n})
        (folder / f"worker{r}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    return folder


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda d: d[:10], "no data could be decompressed: the gzip stream ends early"),
        (
            lambda d: gzip.compress(gzip.decompress(d)[:40]),
            "is not valid JSON and nothing could be salvaged",
        ),
    ],
    ids=["gzip-header-only", "cut-in-the-header"],
)
def test_a_rank_cut_before_its_first_event_is_left_out(tmp_path: Path, damage, says) -> None:
    folder = _rank_folder(tmp_path)
    bad = folder / "worker1.json.gz"
    bad.write_bytes(damage(bad.read_bytes()))
    with pytest.raises(PerfcastError, match=says) as alone:
        perfcast.load(bad)
    assert str(bad) in str(alone.value)
    table = perfcast.load(folder)
    assert [r.rank for r in table.ranks] == [0, 2]
    notes = " ".join(table.ranks[0].folder_notes)
    assert "1 rank file could not be read and was left out: worker1.json.gz: " + says in notes
    assert "holds 2 of the job's 3 ranks" in notes
    assert "keep outputs out" not in notes


def test_an_unreadable_rank_is_left_out(tmp_path: Path, monkeypatch) -> None:
    """No read permission stopped the folder; alone, the error gave no hint. Simulated: the
    tests run as root, who may read anything."""
    folder = _rank_folder(tmp_path)
    bad = folder / "worker2.json.gz"
    real_open = open

    def fake_open(path: Any, *args: Any, **kw: Any) -> Any:
        if str(path) == str(bad):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kw)

    monkeypatch.setattr(reader, "open", fake_open, raising=False)
    with pytest.raises(PerfcastError, match=r"permission denied\) \(`ls -l` shows who"):
        perfcast.load(bad)
    table = perfcast.load(folder)
    assert [r.rank for r in table.ranks] == [0, 1]
    assert "worker2.json.gz: cannot be read (permission denied)" in table.ranks[0].folder_notes[0]


def test_an_unreadable_rank_keeps_its_place_in_the_numbering(tmp_path: Path) -> None:
    """Files that name no rank are numbered by their place: an unreadable rank file is a
    rank, a file that is no trace is not."""
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("a", "b", "c"):
        (folder / f"{name}.json").write_text(json.dumps(_steps_doc(1)))
    (folder / "b.json").write_text('{"schemaVersion": 1, "traceEv')
    (folder / "0_result.json").write_text(json.dumps({"notes": []}))
    table = perfcast.load(folder)
    assert [(r.rank, Path(r.path).name) for r in table.ranks] == [(0, "a.json"), (2, "c.json")]


def test_no_advice_to_keep_outputs_out_for_empty_or_zeroed_ranks(tmp_path: Path) -> None:
    folder = _rank_folder(tmp_path)
    (folder / "worker1.json.gz").write_bytes(b"")
    (folder / "worker2.json.gz").unlink()
    (folder / "worker2.json").write_bytes(b"\0" * 1000)
    notes = " ".join(perfcast.load(folder).ranks[0].folder_notes)
    assert "worker1.json.gz is empty" in notes and "worker2.json" in notes
    assert "keep outputs out" not in notes
    (folder / "advise.json").write_text(json.dumps({"notes": ["x"], "ranked": []}))
    notes = " ".join(perfcast.load(folder).ranks[0].folder_notes)
    assert "advise.json is a result saved with --json" in notes and "keep outputs out" in notes


def test_a_folder_of_no_trace_says_so_naming_the_folder(tmp_path: Path) -> None:
    """It named its config.json as if that were the trace given."""
    folder = tmp_path / "junk"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"lr": 0.1}))
    (folder / "README.txt").write_text("x")
    with pytest.raises(PerfcastError) as info:
        perfcast.load(folder)
    assert str(info.value).startswith(
        f"{folder}: folder holds no readable trace: config.json is JSON but has no "
        "'traceEvents' list"
    )


def test_a_symbolic_link_loop_is_named_as_one(tmp_path: Path) -> None:
    """It said "check its permissions"."""
    (tmp_path / "a.json").symlink_to("b.json")
    (tmp_path / "b.json").symlink_to("a.json")
    with pytest.raises(PerfcastError, match="symbolic link that leads back to itself") as info:
        perfcast.load(tmp_path / "a.json")
    assert "permissions" not in str(info.value)


# ---------------------------------------------------------------------------------------------
# The words for a loss match the damage: a cut, a corrupt gzip stream, invalid values.


def _example_json() -> bytes:
    example = Path(perfcast.__file__).parent / "examples" / "ddp_a100_rank0.json.gz"
    return gzip.decompress(example.read_bytes())


def _all_notes(table: perfcast.EventTable) -> list[str]:
    from perfcast.analysis.notes import input_notes

    return input_notes(table)


def test_a_cut_before_the_first_step_does_not_say_the_trace_has_none(tmp_path: Path) -> None:
    """It said "no ProfilerStep#N in this trace", as if the job had recorded no steps."""
    doc = _steps_doc()
    steps = [e for e in doc["traceEvents"] if e["name"].startswith("ProfilerStep#")]
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e not in steps] + steps
    data = json.dumps(doc).encode()
    path = tmp_path / "cut.json"
    path.write_bytes(data[: data.index(b'"ProfilerStep#1"') - 20])
    notes = _all_notes(perfcast.load(path))
    assert "no ProfilerStep#N in what survived the cut" in " ".join(notes)
    assert not any("no ProfilerStep#N in this trace" in n for n in notes)
    # A whole trace without steps still says it has none.
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e not in steps]
    path.write_text(json.dumps(doc))
    assert "no ProfilerStep#N in this trace" in " ".join(_all_notes(perfcast.load(path)))


def _stored_gzip_damaged_at(data: bytes, share: float) -> bytes:
    """`data` gzipped in stored (level 0) blocks, the first block header past `share` of
    the file damaged: zlib stops right there, as at damage it cannot inflate past."""
    gz = gzip.compress(data, compresslevel=0, mtime=0)
    header = 10
    while header < len(gz) * share:
        header += 5 + (gz[header + 1] | gz[header + 2] << 8)
    broken = bytearray(gz)
    broken[header + 3] ^= 0xFF
    return bytes(broken)


def test_a_corrupt_gzip_stream_is_not_called_a_cut(tmp_path: Path) -> None:
    """A full-length file with a corrupt gzip stream said "the file is cut off while
    ProfilerStep#6's events were being written", "the cut lost GPU-side events", "truncated
    trace", and to let the job finish the trace."""
    path = tmp_path / "corrupt.json.gz"
    path.write_bytes(_stored_gzip_damaged_at(_example_json(), 0.6))
    table = perfcast.load(path)
    info = table.ranks[0]
    assert info.truncated and info.tail_lost and info.damage == "corrupt"
    notes = " | ".join(_all_notes(table))
    assert "the gzip stream is corrupt (from about byte " in notes
    assert (
        "while ProfilerStep#" in notes and "may be missing events written after that point" in notes
    )
    assert "damaged trace: the gzip stream is corrupt" in notes
    assert "copy the file again" in notes
    for wrong in ("cut off", "the cut", "truncated trace", "let the job finish"):
        assert wrong not in notes, wrong


def test_events_skipped_for_nan_are_said_to_be_and_the_advice_fits(tmp_path: Path) -> None:
    """Every runtime call's duration NaN: the notes advised recording fewer steps or letting
    the job finish the trace, and called it a truncated trace."""
    text = json.dumps(_steps_doc())
    text = re.sub(r'("cat": "cuda_runtime", [^}]*"dur": )5', r"\1NaN", text)
    path = tmp_path / "nan.json"
    path.write_text(text)
    table = perfcast.load(path)
    assert table.ranks[0].damage == "invalid"
    notes = " | ".join(_all_notes(table))
    assert "invalid values in the trace: skipped 3 events holding NaN or Infinity" in notes
    assert "and no runtime call survived the skipping of events holding NaN" in notes
    assert "should write null or a number" in notes
    for wrong in ("truncated trace", "let the job finish", "Kineto writes them after"):
        assert wrong not in notes, wrong


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "NaN2.5"])
def test_a_few_nan_durations_are_named(tmp_path: Path, literal: str) -> None:
    """Three durations NaN said only "skipped 3 damaged stretches" (when written "NaN2.5")."""
    text = json.dumps(_steps_doc())
    text = re.sub(r'("name": "aten::linear", [^}]*"dur": )300', rf"\g<1>{literal}", text)
    path = tmp_path / "nan.json"
    path.write_text(text)
    note = perfcast.load(path).ranks[0].salvage_note
    assert note.startswith("skipped 3 events holding NaN or Infinity, which JSON does not allow")
    assert "damaged stretch" not in note


def test_damage_mid_file_is_not_called_truncated(tmp_path: Path) -> None:
    data = _ops_trace(1_000)
    at = data.index(b'{"ph"', len(data) // 2)
    path = tmp_path / "t.json"
    path.write_bytes(data[:at] + b"@@@@###garbage, " + data[at:])
    table = perfcast.load(path)
    notes = " | ".join(_all_notes(table))
    assert "damaged trace: skipped 1 damaged stretch" in notes
    assert "truncated" not in notes and "cut" not in notes


def test_a_trace_whose_every_time_is_missing_is_not_told_to_profile_a_step(
    tmp_path: Path,
) -> None:
    doc = _steps_doc()
    for e in doc["traceEvents"]:
        e.pop("ts", None)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PerfcastError) as info:
        perfcast.load(path).require_events()
    said = str(info.value)
    assert "events without a readable time were skipped (the first: event #0, 'ts'" in said
    assert "profile at least one step" not in said and "none can be used as written" in said


# ---------------------------------------------------------------------------------------------
# What a file that is no JSON is.


@pytest.mark.parametrize("name", ["zeros.json", "zeros.json.gz"])
def test_a_file_of_zero_bytes_is_named_as_one(tmp_path: Path, name: str) -> None:
    """It read "looks like UTF-16 or UTF-32 text"."""
    path = tmp_path / name
    path.write_bytes(b"\0" * 5_000_000)  # past one block
    with pytest.raises(PerfcastError) as info:
        perfcast.load(path)
    assert "holds nothing but 5,000,000 zero bytes" in str(info.value)
    assert "UTF" not in str(info.value)


def test_utf16_without_a_byte_order_mark_is_named(tmp_path: Path) -> None:
    """It read "nothing could be salvaged (object keys must be strings (byte 1))"."""
    path = tmp_path / "t.json"
    path.write_bytes(json.dumps(_steps_doc()).encode("utf-16-le"))
    with pytest.raises(PerfcastError, match="UTF-16 text without a byte-order mark: save it"):
        perfcast.load(path)


def test_a_gz_file_that_is_not_gzip_says_so(tmp_path: Path) -> None:
    """Random bytes named .json.gz read "does not start with '{' or '['"."""
    path = tmp_path / "t.json.gz"
    path.write_bytes(bytes(range(7, 256)) * 20)
    with pytest.raises(PerfcastError, match=r"is not gzip data, though its name ends in \.gz"):
        perfcast.load(path)


@pytest.mark.parametrize("form", ["object", "list", "object-gz"])
def test_junk_after_a_whole_document_loses_nothing_before_it(tmp_path: Path, form: str) -> None:
    """Junk after the closing "}" lost the header's last fields ("read up to byte ...; those
    after it are lost"), though the document before it was whole."""
    doc = dict(_steps_doc(), baseTimeNanoseconds=1_700_000_000_000_000_000)
    doc["distributedInfo"] = {"rank": 3, "world_size": 4}  # the header's last field
    whole = json.dumps(doc["traceEvents"] if form == "list" else doc).encode()
    data = whole + b"\nGARBAGE{{"
    path = tmp_path / ("t.json.gz" if form.endswith("gz") else "t.json")
    path.write_bytes(gzip.compress(data) if form.endswith("gz") else data)
    table = perfcast.load(path)
    info = table.ranks[0]
    assert len(table) == len(perfcast.load(write_json(tmp_path / "w.json", doc)))
    if form != "list":
        assert info.rank == 3 and info.world_size == 4
    unit = " of the inflated JSON" if form.endswith("gz") else ""
    assert (
        f"the 10 bytes after the end of the JSON document (from byte {len(whole):,}{unit}) are "
        "not part of the trace and were ignored; nothing before them was lost"
    ) in info.warnings
    assert not info.truncated and "lost" not in " ".join(info.warnings).replace(
        "nothing before them was lost", ""
    )


def test_invalid_utf8_is_located(tmp_path: Path) -> None:
    data = json.dumps(_steps_doc()).encode()
    at = data.index(b"aten::linear", len(data) // 2)
    broken = data[:at] + b"\xff\xfe" + data[at:]
    for name, content, unit in (
        ("t.json", broken, ""),
        ("t.json.gz", gzip.compress(broken), " of the inflated JSON"),
    ):
        path = tmp_path / name
        path.write_bytes(content)
        warnings = perfcast.load(path).ranks[0].warnings
        says = f"invalid UTF-8 in strings was replaced by U+FFFD (first at byte {at:,}{unit})"
        assert says in warnings


def test_gpu_work_without_its_launching_call_is_counted(write_trace) -> None:
    """Kernels whose runtime calls are missing were placed by their GPU times without a
    word (38 of 60 in a trace with its cuda_runtime events removed)."""
    doc = _steps_doc()
    events = doc["traceEvents"]
    gone = [e for e in events if e.get("cat") == "cuda_runtime"][1:]
    doc["traceEvents"] = [e for e in events if e not in gone and e.get("ph") not in "sf"]
    notes = _notes(perfcast.load(write_trace(doc)))
    assert (
        "2 of the 3 GPU kernels, copies and memsets in the steps have no launching call in "
        "the trace (the first: 'volta_sgemm_128x64_nn'"
    ) in notes
    # A whole trace says nothing.
    assert "launching call" not in _notes(perfcast.load(write_trace(_steps_doc())))
