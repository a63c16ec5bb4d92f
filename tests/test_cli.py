"""The `perfcast` command in-process: JSON shapes, exports, errors and exit codes."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import re
from pathlib import Path

import pytest

from perfcast.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"


def _json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_summary_json(capsys):
    doc = _json(capsys, "summary", str(EXAMPLE), "--json")
    rank = doc["ranks"][0]
    assert rank["rank"] == 0 and rank["device"] == "NVIDIA A100-PG509-200"
    its = rank["iterations"]
    assert [it["name"] for it in its] == ["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"]
    for it in its:
        g = it["gpu"]
        parts = g["compute_ms"] + g["communication_exposed_ms"] + g["memcpy_exposed_ms"]
        assert parts + g["idle_ms"] == pytest.approx(it["measured_ms"], rel=1e-9)
        assert 0 <= g["communication_overlap_pct"] <= 100
    assert rank["top_kernels"][0]["name"].startswith("ncclKernel_AllReduce")


def test_replay_json_and_export(capsys, tmp_path):
    out = tmp_path / "replay.json"
    doc = _json(capsys, "replay", str(EXAMPLE), "--json", "--export-trace", str(out))
    assert isinstance(doc["unresolved_dependencies"], int)
    for it in doc["ranks"][0]["iterations"]:
        assert it["simulated_ms"] == pytest.approx(it["measured_ms"], rel=0.01)
    trace = json.loads(out.read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    # Both worlds the text reports: as traced, and without the profiler (the step replay
    # leads with), which the export left out.
    assert names == {"simulated, as traced · rank 0", "simulated, without the profiler · rank 0"}
    assert any(e["ph"] == "s" for e in trace["traceEvents"])  # launch arrows
    # Each op is one slice spanning its children (a step is one slice, not its self-time
    # pieces), and slices on a thread nest: none ends inside another and outlives it.
    traced_pid = next(
        e["pid"]
        for e in trace["traceEvents"]
        if e.get("name") == "process_name" and e["args"]["name"].startswith("simulated, as")
    )
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == traced_pid]
    steps = [e for e in slices if e["cat"] == "cpu_op" and e["name"].startswith("ProfilerStep#")]
    assert [e["name"] for e in steps] == ["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"]
    for e, it in zip(steps, doc["ranks"][0]["iterations"], strict=True):
        assert 0.9 * it["simulated_ms"] < e["dur"] / 1e3 <= it["simulated_ms"] + 1e-6
    by_tid: dict[int, list[tuple[int, int]]] = {}
    for e in slices:
        if e["cat"] in ("cpu_op", "launch", "runtime"):
            by_tid.setdefault(e["tid"], []).append((round(e["ts"] * 1e3), -round(e["dur"] * 1e3)))
    for spans in by_tid.values():
        open_ends: list[int] = []
        for ts, neg in sorted(spans):
            end = ts - neg
            while open_ends and open_ends[-1] <= ts:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1]
            open_ends.append(end)
    # A launch-queue counter track per GPU stream: never negative, empty at the end.
    queue = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert queue and all(e["name"].startswith("launch queue · ") for e in queue)
    by_track: dict[str, list[int]] = {}
    for e in sorted(queue, key=lambda e: e["ts"]):
        by_track.setdefault(e["name"], []).append(e["args"]["pending"])
    for levels in by_track.values():
        assert min(levels) >= 0 and levels[-1] == 0 and max(levels) >= 1


def test_whatif_json_and_side_by_side_export(capsys, tmp_path):
    out = tmp_path / "whatif.json.gz"
    doc = _json(
        capsys,
        "whatif",
        str(EXAMPLE),
        "--apply",
        "cuda-graphs",
        "--apply",
        "faster-op:pattern=nccl,factor=2,where=gpu",
        "--json",
        "--export-trace",
        str(out),
    )
    assert doc["predicted_ms"] < doc["baseline_ms"]
    assert doc["speedup"] == pytest.approx(doc["baseline_ms"] / doc["predicted_ms"])
    # The speedup a profiled run would show is in the JSON too, as the text prints it.
    assert doc["speedup_traced"] == pytest.approx(doc["traced_ms"] / doc["predicted_traced_ms"])
    assert [a["name"] for a in doc["applied"]] == ["cuda-graphs", "faster-op"]
    assert len(doc["iterations"]) == 3
    trace = json.loads(gzip.decompress(out.read_bytes()))
    procs = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert procs == {
        "baseline (without the profiler) · rank 0",
        "predicted (without the profiler) · rank 0",
    }
    # Every arrow has one start and one end, its id unique across both timelines.
    ends: dict[int, list[str]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] in ("s", "f"):
            ends.setdefault(e["id"], []).append(e["ph"])
    assert ends and all(sorted(v) == ["f", "s"] for v in ends.values())


def test_export_is_written_in_batches_as_one_document(tmp_path, monkeypatch):
    """The export is encoded a batch of events at a time (a thousand ranks' export held
    7 GB as one list): with batches of 7 events, plain and gzipped files hold the same
    document as one batch makes."""
    import perfcast
    from perfcast.report import perfetto
    from perfcast.sim.timeline import simulate

    tl = simulate(perfcast.dependency_graph(perfcast.load(EXAMPLE)))
    whole = list(perfetto.timeline_events(tl, "a", pid_base=1000))
    for name in ("t.json", "t.json.gz"):
        monkeypatch.setattr(perfetto, "EXPORT_BATCH", 7)
        perfetto.export_timelines([("a", tl), ("b", tl)], str(tmp_path / name))
        data = (tmp_path / name).read_bytes()
        doc = json.loads(gzip.decompress(data) if name.endswith(".gz") else data)
        assert doc["otherData"]["generator"] == "perfcast"
        events = doc["traceEvents"]
        assert len(events) == 2 * len(whole)
        assert [e["name"] for e in events[: len(whole)]] == [e["name"] for e in whole]
        # Flow ids stay unique across the two timelines.
        ids = [e["id"] for e in events if e["ph"] == "s"]
        assert len(ids) == len(set(ids))


def test_advise_json(capsys):
    doc = _json(capsys, "advise", str(EXAMPLE), "--json")
    sug = doc["suggestions"]
    assert sug and all({"name", "predicted_ms", "speedup", "explanation"} <= set(s) for s in sug)
    assert [s["predicted_ms"] for s in sug] == sorted(s["predicted_ms"] for s in sug)


def test_summary_terminal_output(capsys):
    assert main(["summary", str(EXAMPLE), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "step #4" in out and "top kernels" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"hello", "is not JSON"),
        (b'{"foo": 1}', "no 'traceEvents'"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1', "nothing could be salvaged"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, content, message):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    before = hashlib.sha256(content).hexdigest()
    assert main(["summary", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(bad) in err and message in err
    assert "Traceback" not in err
    assert hashlib.sha256(bad.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]


def test_missing_path_and_unknown_model(capsys, tmp_path):
    assert main(["replay", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["whatif", str(EXAMPLE), "--apply", "warp-drive"]) == 2
    assert "unknown optimization" in capsys.readouterr().err


def test_not_applicable_is_a_clear_error(capsys, tmp_path):
    trace = {
        "traceEvents": [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#1",
                "pid": 1,
                "tid": 1,
                "ts": 0,
                "dur": 100,
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::add",
                "pid": 1,
                "tid": 1,
                "ts": 10,
                "dur": 50,
            },
        ]
    }
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(trace))
    assert main(["whatif", str(path), "--apply", "ddp"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perfcast: error:") and "ddp" in err


def test_refuses_to_overwrite_the_input(capsys, tmp_path):
    copy = tmp_path / "t.json.gz"
    copy.write_bytes(EXAMPLE.read_bytes())
    assert main(["replay", str(copy), "--export-trace", str(copy)]) == 2
    assert "overwrite" in capsys.readouterr().err
    assert copy.read_bytes() == EXAMPLE.read_bytes()


@pytest.mark.parametrize("command", ["summary", "replay", "advise"])
def test_show_renders_a_saved_result_again(capsys, tmp_path, command):
    saved = tmp_path / f"{command}.json"
    assert main([command, str(EXAMPLE), "--json"]) == 0
    saved.write_text(capsys.readouterr().out)
    assert main(["show", str(saved)]) == 0
    assert capsys.readouterr().out.strip()
    assert main(["show", str(saved), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(saved.read_text())


def test_show_renders_a_saved_whatif_with_its_memory(capsys, tmp_path):
    """A what-if's memory estimate survives the JSON round trip (it came back a dict and
    crashed the renderer)."""
    saved = tmp_path / "whatif.json"
    shaped = (
        Path(__file__).resolve().parents[1]
        / "benchmarks/accuracy/recorded/traces"
        / ("live-h200-2026-11-26/mlp.amp.json.gz")
    )
    args = ["whatif", str(shaped), "--apply", "cuda-graphs"]
    assert main([*args, "--json", "-q"]) == 0
    saved.write_text(capsys.readouterr().out)
    assert json.loads(saved.read_text())["memory"]["peak_bytes"] > 0
    assert main([*args, "-q"]) == 0
    live = capsys.readouterr().out
    assert main(["show", str(saved), "-q"]) == 0
    shown = capsys.readouterr().out
    assert "peak memory per rank" in shown
    assert shown == live


def test_show_renders_a_saved_whatif_with_its_gain_tree(capsys, tmp_path):
    """`whatif --tree --json` saves the gain per call path; show drew the prediction and
    dropped the tree without a word."""
    saved = tmp_path / "whatif.json"
    args = ["whatif", str(EXAMPLE), "--apply", "remove-host-sync", "--tree", "-q"]
    assert main([*args, "--json"]) == 0
    saved.write_text(capsys.readouterr().out)
    assert main(args) == 0
    live = capsys.readouterr().out
    assert main(["show", str(saved), "-q"]) == 0
    shown = capsys.readouterr().out
    assert "where the gain lands" in shown
    assert shown == live


def test_advise_refuses_an_unknown_device_before_loading(capsys):
    assert main(["advise", str(EXAMPLE), "--device", "tpu", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perfcast: error: --device 'tpu': unknown GPU") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_whatif_without_shapes_says_memory_is_not_estimated(capsys):
    """No op shapes and no [memory] events: no near-zero peak that 'fits' anything."""
    assert main(["whatif", str(EXAMPLE), "--apply", "batch-size:factor=2", "--json", "-q"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory"] is None
    assert any("memory: not estimated" in n for n in data["notes"])


def test_show_of_a_summary_prints_what_the_summary_printed(capsys, tmp_path):
    saved = tmp_path / "summary.json"
    assert main(["summary", str(EXAMPLE), "--json"]) == 0
    saved.write_text(capsys.readouterr().out)
    assert main(["summary", str(EXAMPLE)]) == 0
    live = capsys.readouterr().out
    assert main(["show", str(saved)]) == 0
    assert capsys.readouterr().out == live  # all ten top rows, not five


def test_show_refuses_other_files(capsys, tmp_path):
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    assert main(["show", str(other)]) == 2
    assert "not a perfcast result" in capsys.readouterr().err


def test_show_says_when_the_file_is_empty_or_missing_as_the_other_commands_say(capsys, tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert main(["show", str(empty)]) == 2
    assert f"{empty}: is empty" in capsys.readouterr().err
    assert main(["show", str(tmp_path / "nope.json")]) == 2
    missing = capsys.readouterr().err
    assert main(["summary", str(tmp_path / "nope.json")]) == 2
    assert missing == capsys.readouterr().err  # "...: no such file or folder"


def test_a_saved_result_given_as_a_trace_points_to_show(capsys, tmp_path):
    saved = tmp_path / "summary.json"
    assert main(["summary", str(EXAMPLE), "--json", "-q"]) == 0
    saved.write_text(capsys.readouterr().out)
    assert main(["advise", str(saved)]) == 2
    err = capsys.readouterr().err
    assert "is a result saved with --json, not a trace" in err
    assert f"perfcast show {saved}" in err


@pytest.mark.parametrize("options", [[], ["--bottom-up"], ["--focus", "Linear"]])
def test_show_renders_a_saved_tree_as_tree_prints_it(capsys, tmp_path, options):
    """show refused tree results ("run perfcast tree again"); they render as tree does."""
    saved = tmp_path / "tree.json"
    assert main(["tree", str(EXAMPLE), *options, "--json", "-q"]) == 0
    saved.write_text(capsys.readouterr().out)
    assert main(["tree", str(EXAMPLE), *options, "-q"]) == 0
    live = capsys.readouterr().out
    assert main(["show", str(saved), "-q"]) == 0
    assert capsys.readouterr().out == live
    assert main(["show", str(saved), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(saved.read_text())


def test_show_renders_a_saved_plan_as_plan_prints_it(capsys, tmp_path):
    saved = tmp_path / "plan.json"
    assert main(["plan", str(EXAMPLE), "--gpus", "4", "--json"]) == 0
    saved.write_text(capsys.readouterr().out)
    assert main(["plan", str(EXAMPLE), "--gpus", "4"]) == 0
    live = capsys.readouterr().out
    assert main(["show", str(saved)]) == 0
    shown = capsys.readouterr().out

    def steady(text: str) -> list[str]:
        # The search's own time differs between runs, and a longer figure wraps the
        # header's line differently (a loaded machine: "... in 1,234 ms, ... 40" + "GiB").
        return re.sub(r"evaluated in [\d,]+ ms", "evaluated in - ms", text).split()

    assert steady(shown) == steady(live) and "dp4 tp1 pp1" in shown
    assert main(["show", str(saved), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(saved.read_text())


@pytest.mark.parametrize(
    "command",
    [
        ["analyze", str(EXAMPLE), "--only", "idle,launches"],
        ["diff", str(EXAMPLE), str(EXAMPLE), "--apply", "amp"],
    ],
)
def test_show_renders_saved_analyses_and_diffs_as_their_commands_did(capsys, tmp_path, command):
    """They were refused ("run it again"), though every other command's result is shown."""
    saved = tmp_path / "result.json"
    assert main([*command, "--json", "-q"]) == 0
    saved.write_text(capsys.readouterr().out)
    assert main([*command, "-q"]) == 0
    live = capsys.readouterr().out
    assert main(["show", str(saved)]) == 0
    assert capsys.readouterr().out == live
    assert main(["show", str(saved), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(saved.read_text())


# ---------------------------------------------------------------------------------------------
# The error model: one line per error, no tracebacks unless asked, bugs called bugs.

MARKUP = Path(__file__).parent / "data" / "fuzz" / "regressions" / "markup_in_names.json.gz"


def test_names_with_control_characters_reach_no_terminal(capsys):
    # Kernel and device names holding escape sequences, line breaks and Rich markup.
    assert main(["summary", str(MARKUP)]) == 0
    out = capsys.readouterr().out
    assert "\x1b[31m" not in out and "\\x1b[31mred" in out
    assert "[bold red]x[/bold red]" in out  # markup is printed as text, not interpreted
    assert main(["whatif", str(MARKUP), "--apply", "amp"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"perfcast: error: {MARKUP}: amp:")
    assert "'[red]GPU[/red]\\n'" in err


def test_an_internal_error_is_one_line_and_debug_shows_the_traceback(capsys, monkeypatch):
    import perfcast.analysis.summary as summary

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(summary, "summarize", broken)
    assert main(["summary", str(MARKUP)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"perfcast: internal error while processing {MARKUP}: KeyError")
    assert "please report it" in err and "--debug" in err
    assert main(["--debug", "summary", str(MARKUP)]) == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.rstrip().count("\n") > 3
    assert main(["summary", str(MARKUP), "--debug"]) == 3  # after the command, too
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content",
    ["[" * 5000 + "]" * 5000, '{"ranks": ' + "[" * 5000 + "]" * 5000 + "}", '[{"a": 1}]', "{"],
    ids=["deep-list", "deep-value", "list", "cut"],
)
def test_show_refuses_hostile_files_in_one_line(capsys, tmp_path, content):
    path = tmp_path / "result.json"
    path.write_text(content)
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"perfcast: error: {path}: ")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("faster-op:pattern=(", "not a valid regular expression"),
        ("remove-host-sync:op=[", "not a valid regular expression"),
        ("batch-size:factor=1e26", "out of range"),
        ("faster-op:factor=inf", "out of range"),
        ("ddp:bucket_mb=nan", "out of range"),
    ],
)
def test_hostile_whatif_options_are_clean_errors(capsys, spec, message):
    assert main(["whatif", str(EXAMPLE), "--apply", spec]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize(
    "argv",
    [
        ["report", str(EXAMPLE), "-o", "{dir}"],
        ["whatif", str(EXAMPLE), "--apply", "batch-size:factor=2", "--export-trace", "{dir}"],
        ["tree", str(EXAMPLE), "--speedscope", "{dir}"],
        ["report", str(EXAMPLE), "-o", "{ro}/r.html"],
        ["whatif", str(EXAMPLE), "--apply", "batch-size:factor=2", "--export-trace", "{ro}/t.json"],
        ["tree", str(EXAMPLE), "--folded", "{ro}/t.folded"],
    ],
)
def test_unwritable_outputs_are_one_line_errors(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An output that is a folder, or that the OS refuses, is a one-line error (exit 2); it
    was an internal error (exit 3) that named the report's temporary file."""
    import os

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if os.access(ro, os.W_OK):  # root writes anywhere: use a virtual file system instead
        ro = Path("/proc")
    args = [a.format(dir=tmp_path, ro=ro) for a in argv]
    assert main([*args, "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and ("is a folder" in err or "cannot write the output" in err)
    assert ".perfcast-report-" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["analyze", "MISSING", "--csv", "{file}"], "--csv output is a file, not a folder"),
        (["diff", "MISSING", "MISSING", "--parquet", "{file}"], "--parquet output is a file"),
        (["analyze", "MISSING", "--csv", " "], "the --csv folder is empty"),
        (["whatif", "MISSING", "--apply", "amp", "--export-trace", ""], "output path is empty"),
    ],
)
def test_export_folders_are_checked_before_the_trace_is_read(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A table export that cannot be a folder fails at once (the trace named here does not
    exist, so reading it first would give another error), and an empty output path blames
    the option, not the trace."""
    afile = tmp_path / "afile"
    afile.write_text("keep")
    missing = str(tmp_path / "missing.json")
    args = [a.format(file=afile).replace("MISSING", missing) for a in argv]
    assert main([*args, "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err
    assert "missing.json" not in err
    assert afile.read_text() == "keep"


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "{inp}", "--export-trace", "{inp}/replay.json"],
        ["report", "{inp}", "-o", "{inp}/r.html"],
        ["analyze", "{inp}", "--only", "kernels", "--csv", "{inp}"],
        ["analyze", "{inp}", "--only", "kernels", "--parquet", "{inp}/sub/tables"],
        ["tree", "{inp}", "--speedscope", "{inp}/t.json"],
        ["diff", str(EXAMPLE), "{inp}", "--csv", "{inp}/x"],
    ],
)
def test_no_output_goes_into_an_input_folder(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A replay exported into the folder of rank traces was read back as rank 1 by the next
    command; every output inside an input folder is refused, before any work."""
    inp = tmp_path / "ranks"
    inp.mkdir()
    (inp / "rank0.json.gz").write_bytes(EXAMPLE.read_bytes())
    assert main([*(a.format(inp=inp) for a in argv), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "refusing to write into the input folder" in err
    assert [p.name for p in inp.iterdir()] == ["rank0.json.gz"]


def test_a_missing_export_folder_is_created(tmp_path: Path) -> None:
    out = tmp_path / "new" / "tables"
    assert main(["analyze", str(EXAMPLE), "--only", "kernels", "--csv", str(out), "-q"]) == 0
    assert any(out.glob("*.csv"))


@pytest.mark.parametrize("command", ["summary", "replay", "advise", "tree", "analyze"])
def test_a_trace_without_events_is_refused(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every command printed empty tables and "step 0.00 ms" for an empty event list and
    exited 0; it is an error now (the API still loads it as an empty table)."""
    path = tmp_path / "empty.json"
    path.write_text('{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1}]}')
    assert main([command, str(path), "-q"]) == 2
    err = capsys.readouterr().err
    assert "holds no complete events" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["plan", str(EXAMPLE), "--gpus", "8", "--top", "-5"], "--top must be at least 1"),
        (["plan", str(EXAMPLE), "--gpus", "8", "--global-batch", "0"], "--global-batch"),
        (["summary", str(EXAMPLE), "--top", "-5"], "--top must be at least 1"),
        (["analyze", str(EXAMPLE), "--rows", "-1"], "--rows must be at least 1"),
        (
            [
                "whatif",
                str(EXAMPLE),
                "--apply",
                "batch-size:factor=2",
                "--tree",
                "--min-pct",
                "200",
            ],
            "--min-pct must be between 0 and 100",
        ),
        (["plan", "--model", "gpt-22b", "--gpus", "8", "--memory-gb", "0"], "--memory-gb"),
    ],
)
def test_counts_below_one_are_refused_before_any_work(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """These ran and printed a [:-5] slice of the plans, empty tables, or a whole prediction
    before the option was checked."""
    assert main([*argv, "-q"]) == 2
    out = capsys.readouterr()
    assert needle in out.err and out.out == ""
    # The option is at fault, not the trace: the message does not start with its path.
    assert out.err.startswith(f"perfcast: error: {needle}")


H200_TRACE = (
    Path(__file__).resolve().parents[1]
    / "benchmarks/accuracy/recorded/traces/live-h200-2026-11-26/mlp.amp.json.gz"
)


def test_every_json_result_names_the_traced_real_and_measured_step(capsys):
    """Issue 11: each iteration carries traced_ms, real_ms, measured_real_ms and the
    correction's source; the advice carries the measured unprofiled step too."""
    for command in ("summary", "replay"):
        doc = _json(capsys, command, str(H200_TRACE), "--json")
        for it in doc["ranks"][0]["iterations"]:
            assert it["traced_ms"] == it["measured_ms"] > 0
            assert it["real_ms"] > 0 and it["measured_real_ms"] > 0 and it["source"] == "fit"
    doc = _json(capsys, "whatif", str(H200_TRACE), "--apply", "remove-host-sync", "--json")
    for it in doc["iterations"]:
        assert {"traced_ms", "real_ms", "measured_real_ms", "source"} <= set(it)
    doc = _json(capsys, "advise", str(H200_TRACE), "--json")
    assert doc["measured_real_ms"] > 0 and doc["traced_ms"] > 0


def test_summary_and_replay_text_show_the_measured_unprofiled_step(capsys):
    """README: summary, replay and whatif show the measured step beside the estimate (the
    summary showed it only in --json, and replay's header read 'measured so')."""
    doc = _json(capsys, "summary", str(H200_TRACE), "--json")
    measured = doc["ranks"][0]["iterations"][0]["measured_real_ms"]
    assert main(["summary", str(H200_TRACE), "-q"]) == 0
    assert f"measured without the profiler: {measured:,.2f} ms per step" in capsys.readouterr().out
    assert main(["replay", str(H200_TRACE), "-q"]) == 0
    out = capsys.readouterr().out
    assert "measured so" not in out
    # Said once, as summary says it: a column repeated the trace's one median on every step.
    assert f"measured without the profiler: {measured:,.2f} ms per step" in out
    assert out.count(f"{measured:,.2f}") == 1 and "measured w/o" not in out


def test_a_trace_without_collectives_says_so(capsys):
    assert main(["analyze", str(H200_TRACE), "--only", "collectives"]) == 0
    out = capsys.readouterr().out
    assert "no collectives in the trace" in out and "collectives: collectives" not in out


def test_whatif_text_shows_peak_memory_before_and_after(capsys):
    trace = (
        Path(__file__).resolve().parents[1]
        / "benchmarks/accuracy/recorded/traces/live-h200-2026-11-26/transformer.amp.json.gz"
    )
    assert main(["whatif", str(trace), "--apply", "activation-checkpointing"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    line = out[out.index("peak memory per rank") :]
    before, after = (float(x) for x in line.split()[4:7:2])
    assert after < before  # checkpointing frees activations
    assert "fits" in line and "H200" in line
    doc = _json(capsys, "whatif", str(trace), "--apply", "activation-checkpointing", "--json")
    assert doc["baseline_memory"]["peak_bytes"] > doc["memory"]["peak_bytes"]
    assert "assumes (memory): " in out and "saved activations" in out
    assert "cudnn.benchmark" not in out  # no convolutions in a transformer


def test_whatif_text_warns_a_cnn_of_cudnn_autotuning_on_its_first_steps(capsys):
    """The model's peak is a steady step's; under cuDNN's benchmark mode a CNN's first steps
    peak higher (measured 1.8x on ResNet-50), and its memory assumptions say so."""
    trace = (
        Path(__file__).resolve().parents[1]
        / "benchmarks/accuracy/recorded/traces/h100/r50_foreach.json.gz"
    )
    assert main(["whatif", str(trace), "--apply", "batch-size:factor=2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "assumes (memory): " in out and "torch.backends.cudnn.benchmark=True" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["summary", "x.json", "--top", "abc"],
        ["plan", "--gpus", "abc"],
        ["replay", "x.json", "--engine", "turbo"],
        ["summary"],
        ["no-such-command"],
    ],
)
def test_option_errors_are_one_line(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "error:" in err and "usage:" not in err


def test_a_many_rank_export_puts_every_rank_on_one_clock(tmp_path, shared_traces) -> None:
    """Each rank's replay starts at 0; the export shifts them by the offsets that aligned
    their collectives, so one all-reduce ends at about the same time on every rank (its
    arrows were up to 7.5 ms apart, half of them backwards). The shifts are stated in the
    document's otherData and each rank's process args."""
    from tests.perfetto_import import import_trace

    out = tmp_path / "dlrm.json"
    assert main(["replay", str(shared_traces / "dlrm_v100_8rank"), "--export-trace", str(out)]) == 0
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    gaps = []
    for a, b, _ in import_trace(events).flows:
        if events[a]["pid"] != events[b]["pid"]:  # across ranks: a collective's
            ends = [events[i]["ts"] + events[i]["dur"] for i in (a, b)]
            gaps.append(abs(ends[0] - ends[1]))
    gaps.sort()
    assert len(gaps) > 50 and gaps[len(gaps) // 2] < 100  # µs: a wait, not a clock offset
    shifts = doc["otherData"]["clock shift (µs)"]["simulated, as traced"]
    assert len(shifts) == 8 and min(shifts.values()) == 0 and max(shifts.values()) > 1000
    named = {
        e["args"]["name"]: e["args"]["clock shift (µs)"]
        for e in events
        if e.get("name") == "process_name"
    }
    assert named["simulated, as traced · rank 2"] == shifts["rank 2"]


def test_a_many_rank_export_draws_each_collective_once_with_its_wait(
    tmp_path, shared_traces
) -> None:
    """A matched collective is replayed as an arrival, a barrier and a transfer; the export
    drew them as a 0 µs slice and a short one under the kernel's name (136 slices per side
    for the trace's 64 NCCL kernels). One slice per kernel now, from the arrival to the
    transfer's end, saying how long it waited for the other ranks; every collective and
    launch arrow ends on a slice of its track."""
    out = tmp_path / "dlrm.json"
    folder = shared_traces / "dlrm_v100_8rank"
    assert main(["replay", str(folder), "--export-trace", str(out), "-q"]) == 0
    events = json.loads(out.read_text())["traceEvents"]
    nccl = [e for e in events if e["ph"] == "X" and e["name"].startswith("ncclKernel")]
    per_side = len(nccl) // 2
    traced = 0
    for f in sorted(folder.glob("*.json.gz")):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        traced += sum(e.get("name", "").startswith("ncclKernel") for e in doc["traceEvents"])
    assert per_side == traced == 64 and all(e["dur"] > 0 for e in nccl)
    waited = [e for e in nccl if "waiting for the other ranks (µs)" in e["args"]]
    assert waited and all(
        e["args"]["waiting for the other ranks (µs)"] + e["args"]["transfer (µs)"]
        == pytest.approx(e["dur"], abs=1e-3)
        for e in waited
    )
    slices: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in events:
        if e["ph"] == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for e in events:
        if e["ph"] in ("s", "f") and e["cat"] in ("collective", "launch"):
            spans = slices[(e["pid"], e["tid"])]
            assert any(a - 1e-6 <= e["ts"] <= b + 1e-6 for a, b in spans), e


def test_gpu_work_overlapping_its_predecessor_gets_a_track_of_its_own(
    tmp_path, shared_traces
) -> None:
    """Programmatic dependent launch on a B200 starts kernels before their stream
    predecessor ends (74 pairs in this trace); on one track a viewer draws them badly."""
    out = tmp_path / "b200.json"
    trace = shared_traces / "tracelens_b200_vllm_eager_rank0.json.gz"
    assert main(["replay", str(trace), "--export-trace", str(out), "-q"]) == 0
    events = json.loads(out.read_text())["traceEvents"]
    tracks: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in events:
        if e["ph"] == "X" and e["cat"] == "gpu":
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    assert len(tracks) > 1
    for spans in tracks.values():
        spans.sort()
        assert all(b[0] >= a[1] - 1e-6 for a, b in itertools.pairwise(spans))


def _overlapping_kernels_trace(path: Path) -> Path:
    """Three steps whose kernels all claim the same 5 ms at the trace's start, before the
    calls that launched them: a damaged trace (found by the bad-input review)."""
    from tests.tracegen import TraceBuilder

    b = TraceBuilder()
    for step in range(3):
        t0 = step * 1000
        b.step(step + 1, t0, 900)
        b.op("aten::linear", t0 + 10, 300, **{"Input Dims": [[8, 64], [32, 64], [32]]})
        b.launch("volta_sgemm_128x64_nn", t0 + 20, 5, t0 + 30, 200, stream=7)
        b.launch("ncclKernel_AllReduce_RING_LL_Sum_float", t0 + 60, 5, t0 + 70, 300, stream=13)
        b.op("Optimizer.step#SGD.step", t0 + 820, 60)
    doc = b.doc()
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["ts"], e["dur"] = 30, 5000
    path.write_text(json.dumps(doc))
    return path


def test_steps_done_before_the_previous_step_take_no_time(tmp_path, capsys):
    """Step 2's and 3's kernels end with step 1's: their steps took 0 ms, not -3 ms (a step's
    time runs from the previous step's completion), in the trace's figures and the replay's."""
    trace = _overlapping_kernels_trace(tmp_path / "t.json")
    assert main(["replay", str(trace), "--json"]) == 0
    captured = capsys.readouterr()
    steps = json.loads(captured.out)["ranks"][0]["iterations"]
    assert [round(s["traced_ms"], 2) for s in steps] == [5.03, 0.0, 0.0]
    assert [round(s["simulated_ms"], 2) for s in steps] == [5.03, 0.0, 0.0]
    assert "2 step(s) completed before the step before them" in captured.out  # its notes


def test_export_of_gpu_work_before_time_zero_finishes(tmp_path):
    """The Perfetto export's overlap tracks looped forever on a slice that starts before
    time zero (a prediction on a damaged trace placed GPU work at -12 ms)."""
    trace = _overlapping_kernels_trace(tmp_path / "t.json")
    out = tmp_path / "w.json"
    spec = "faster-op:pattern=nccl,factor=2"
    assert main(["whatif", str(trace), "--apply", spec, "--export-trace", str(out)]) == 0
    assert json.loads(out.read_text())["traceEvents"]


def test_outputs_follow_links_and_write_through_fifos(tmp_path):
    """An output path that is a symbolic link writes the link's target (the link stays); a
    FIFO (or /dev/stdout) is written through, not replaced by a regular file."""
    import os
    import threading

    target = tmp_path / "real.html"
    target.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    assert main(["report", str(EXAMPLE), "-o", str(link), "--quiet"]) == 0
    assert link.is_symlink() and target.read_text().startswith("<!")

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    assert main(["tree", str(EXAMPLE), "--folded", str(fifo), "--quiet"]) == 0
    reader.join(timeout=60)
    assert fifo.is_fifo() and got and b";" in got[0]


@pytest.mark.parametrize("device", ["h100,h200", "h100,host=0", ""])
def test_advise_device_is_one_gpu_name(device, capsys):
    """--device was pasted into device:target=NAME: "h100,h200" ran with an option "h200"
    (a "not applicable" line, exit 0), "h100,host=0" complained of an option never given,
    and "" was ignored."""
    assert main(["advise", str(EXAMPLE), "--device", device]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device" in err


def test_bad_focus_regex_is_refused_before_any_output(capsys):
    """`whatif --tree --focus '['` printed its whole prediction, then failed on the regex."""
    spec = ["whatif", str(EXAMPLE), "--apply", "amp", "--tree", "--focus", "["]
    assert main(spec) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "bad regular expression '['" in captured.err


def test_show_reads_a_gzipped_result(tmp_path, capsys):
    saved = tmp_path / "s.json.gz"
    assert main(["summary", str(EXAMPLE), "--json"]) == 0
    saved.write_bytes(gzip.compress(capsys.readouterr().out.encode()))
    assert main(["show", str(saved)]) == 0
    assert "ddp_a100_rank0" in capsys.readouterr().out
    saved.write_bytes(saved.read_bytes()[:100])
    assert main(["show", str(saved)]) == 2


def test_long_step_tables_show_their_ends(tmp_path, capsys):
    """A trace of thousands of steps printed every one (20,000 steps: a minute of table
    rendering); tables of more than 40 steps show the first and last 15, --json has all."""
    from tests.tracegen import TraceBuilder

    b = TraceBuilder()
    for step in range(60):
        t0 = step * 1000
        b.step(step + 1, t0, 900)
        b.launch("volta_sgemm_128x64_nn", t0 + 20, 5, t0 + 30, 200, stream=7)
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(b.doc()))
    for command in ("summary", "replay"):
        assert main([command, str(trace)]) == 0
        out = capsys.readouterr().out
        assert "… 30 more" in out and "step #15 " in out and "step #46 " in out
        assert "step #30 " not in out
    assert len(_json(capsys, "summary", str(trace), "--json")["ranks"][0]["iterations"]) == 60


def test_a_multi_rank_prediction_says_which_rank_sets_the_step(shared_traces, capsys) -> None:
    """advise on 8 ranks printed 14.41 ms where replay's rank 0 shows 11.01: each step is its
    slowest rank's, and the header now says so."""
    folder = str(shared_traces / "dlrm_v100_8rank")
    for argv in (["advise", folder], ["whatif", folder, "--apply", "amp:dtype=fp16"]):
        assert main(argv) == 0
        out = " ".join(capsys.readouterr().out.split())  # the line wraps at 80 columns
        assert "8 ranks: each step counted at its slowest rank" in out


def test_whatif_list_shows_defaults_and_takes_json(capsys, monkeypatch) -> None:
    """`whatif --list --json` printed text, and the list showed no defaults (faster-op with
    no pattern makes every node of the trace faster: '.')."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["whatif", "--list", "--json"]) == 0
    models = json.loads(capsys.readouterr().out)
    by_name = {m["name"]: m for m in models}
    assert by_name["faster-op"]["options"]["pattern"] == "."
    assert by_name["fused-optimizer"]["options"]["kind"] == "foreach"
    assert main(["whatif", "--list"]) == 0
    text = capsys.readouterr().out
    out = " ".join(text.split())
    assert "defaults: pattern=., factor=2.0, where=all, module=auto" in out
    # A wrapped description keeps its indent (piped, it wrapped to column 0).
    lines = [ln for ln in text.split("\nauto: ")[0].splitlines() if ln.strip()]
    assert [ln.split()[0] for ln in lines if not ln.startswith(" ")] == list(by_name)
    assert all(ln.startswith(" " * 24) for ln in lines if ln.startswith(" "))


@pytest.mark.parametrize("columns", [80, 60, 50])
def test_advise_table_keeps_every_column_on_a_narrow_terminal(
    columns: int, monkeypatch, capsys
) -> None:
    """At 80 columns the optimization's name wrapped into three lines and, once it kept its
    width, rich cropped the last column off; at 60 the name read 'torch- / compil'."""
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["advise", str(EXAMPLE)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [ln for ln in lines if re.match(r"^ *\d+ +\S", ln) and "×" in ln]
    assert rows, lines[:12]
    for row in rows:
        assert len(row) <= columns
        assert row.rstrip().endswith("%")  # 'from trace' is there
    if columns == 80:  # the longest name the advisor gives here fits whole
        assert any("torch-compile:mode=reduce-overhead" in r for r in rows)


def test_whatif_tree_piped_is_as_wide_as_tree(monkeypatch, capsys) -> None:
    """`tree | cat` printed 160 columns, `whatif --tree | cat` 80: call paths cut mid-word."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["whatif", str(EXAMPLE), "--apply", "cuda-graphs", "--tree"]) == 0
    widest = max(len(line) for line in capsys.readouterr().out.splitlines())
    assert 80 < widest <= 160


def test_tree_keeps_deep_names_readable(shared_traces, monkeypatch, capsys) -> None:
    """30 levels of frames on the SGLang trace pushed the leaves off a 150-column line
    ('aten::ma…', 'hi…'); past half the room each level of the guides takes one column."""
    monkeypatch.setenv("COLUMNS", "150")
    path = shared_traces / "tracelens_mi300x_sglang_qwen3_8b.json.gz"
    assert main(["tree", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 150 for line in lines)
    assert any(line.rstrip().endswith("└ aten::mm") for line in lines)


def test_multi_rank_summary_shows_each_rank_without_the_profiler(
    shared_traces, monkeypatch, capsys
) -> None:
    """The one-rank table had a 'w/o profiler' column and the ranks table none, so the
    14.41 ms advise leads with (the slowest rank's) was nowhere in summary."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["summary", str(shared_traces / "dlrm_v100_8rank")]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = " ".join(lines[:5])
    assert "w/o" in head and "profiler" in head
    rank3 = next(ln for ln in lines if re.match(r"^\W*3 ", ln))
    assert "18.71" in rank3 and "14.41" in rank3
    assert any(re.match(r"^\W*7\* ", ln) for ln in lines)  # the straggler, marked
    assert all(len(ln) <= 80 for ln in lines)


def test_a_reader_that_stops_reading_is_not_a_failure() -> None:
    """`perfcast analyze T | head -1`: rich exited 1 on the closed pipe, which fails a
    `set -o pipefail` script; the reader's choice, exit 0 and nothing on stderr."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "perfcast", "analyze", str(EXAMPLE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0, err
    assert b"Traceback" not in err and b"error" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "{ex}", "--gpus", str(10**30)], "gpus must be at most 1,048,576"),
        (["plan", "--model", "gpt-1.7b", "--gpus", "8", "--gpus-per-node", str(10**20)],
         "gpus_per_node must be at most"),
        (["plan", "--model", "gpt-1.7b", "--gpus", "8", "--link", ""], "link is empty"),
        (["plan", "--model", "{tmp}", "--gpus", "8"], "is a folder, not a file"),
        (["plan", "--model", "{ex}", "--gpus", "8"], "a trace?"),
        (["whatif", "{ex}", "--apply", "torch-compile", "--apply", "torch-compile"],
         "torch-compile is given twice"),
        (["whatif", "{ex}", "--apply", "ddp:gpus=4", "--apply", "zero"],
         "ddp and zero cannot be applied together"),
        (["whatif", "{ex}", "--apply", "faster-op:pattern='gemm,factor=2"], "is never closed"),
        (["calibrate", "-o", ""], "-o is empty"),
        (["calibrate", "--workers", str(10**30)], "--workers must be from 1 to 256"),
        (["calibrate", "-o", "{ex}/c.json"], "is a file, not a folder"),
        (["tree", "{ex}", "--speedscope", "{tmp}/same", "--folded", "{tmp}/same"],
         "--speedscope and --folded both name"),
        (["replay", "{ex}", "--export-trace", "{ex}/x.json"], "is a file, not a folder"),
        (["show", ""], "the result path is empty"),
        (["whatif", "{ex}", "--apply", "batch-size", "--depth", "3"], "add --tree"),
        (["whatif", "--list", "--apply", "nope"], "give it alone"),
        (["whatif", "{ex}", "--apply", "ddp:grad_bytes=3"], "grad_bytes must be 1, 2, 4 or 8"),
    ],
)  # fmt: skip
def test_options_beyond_reason_are_one_line_errors(capsys, tmp_path, argv, message):
    """Each was a traceback, a hang, a silent overwrite or an accepted contradiction."""
    filled = [a.format(ex=EXAMPLE, tmp=tmp_path) for a in argv]
    assert main(filled) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_pipes_devices_and_saved_lists_are_refused_in_one_line(capsys, tmp_path):
    import os

    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)  # reading one waited forever for a writer
    for argv in (["summary", str(fifo)], ["show", str(fifo)], ["summary", "/dev/null"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ("is a pipe" in err or "is a device" in err), err
    listed = tmp_path / "list.json"
    listed.write_text('[{"name": "amp"}]')
    assert main(["show", str(listed)]) == 2
    assert "holds a JSON list, not a saved result" in capsys.readouterr().err


def test_output_that_cannot_be_written_or_encoded(tmp_path):
    """A full disk and an ASCII-only stdout were internal errors (exit 3); a huge COLUMNS
    laid tables out that wide (minutes and gigabytes)."""
    import os
    import subprocess
    import sys

    run = [sys.executable, "-m", "perfcast", "summary", str(EXAMPLE), "--keep-profiler-cost"]
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    done = subprocess.run(run, capture_output=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            done = subprocess.run(run, stdout=full, stderr=subprocess.PIPE, timeout=300)
        assert done.returncode == 2
        assert b"cannot write the output (No space left on device)" in done.stderr
    env = {**os.environ, "COLUMNS": "100000000"}
    done = subprocess.run(
        [*run[:3], "analyze", str(EXAMPLE), "--only", "kernels"],
        capture_output=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0
    assert max(map(len, done.stdout.decode().splitlines())) <= 1000


def test_checkpointing_of_named_modules_may_repeat(capsys):
    """Each activation-checkpointing:module= selects its own modules, as module='A|B' does."""
    two = ["--apply", "activation-checkpointing:module=conv2d"]
    two += ["--apply", "activation-checkpointing:module=batch_norm"]
    assert main(["whatif", str(EXAMPLE), *two, "--json"]) == 0
    both = json.loads(capsys.readouterr().out)["predicted_ms"]
    one = ["--apply", "activation-checkpointing:module='conv2d|batch_norm'"]
    assert main(["whatif", str(EXAMPLE), *one, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["predicted_ms"] == pytest.approx(both)


def test_summary_of_many_ranks_says_every_ranks_notes(
    capsys, tmp_path: Path, shared_traces: Path
) -> None:
    """Past four ranks the summary details only the slowest and the fastest: a cut rank 5
    of the 8-rank DLRM showed '-' in its row and its truncation note nowhere."""
    import gzip
    import shutil

    folder = tmp_path / "ranks"
    shutil.copytree(shared_traces / "dlrm_v100_8rank", folder)
    raw = gzip.decompress((folder / "worker5.json.gz").read_bytes())
    (folder / "worker5.json.gz").write_bytes(gzip.compress(raw[: len(raw) // 2]))
    assert main(["summary", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "rank 5: truncated trace" in " ".join(out.split())


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "MISSING", "--export-trace", "-"],
        ["whatif", "MISSING", "--apply", "amp", "--export-trace", "-"],
        ["tree", "MISSING", "--speedscope", "-"],
        ["report", "MISSING", "-o", "-"],
    ],
)
def test_a_dash_output_is_refused_not_written_as_a_file(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """`--export-trace -` wrote a file named '-' after the whole replay; standard output
    carries the report, so '-' is refused at once (the trace is not even read)."""
    monkeypatch.chdir(tmp_path)
    args = [a.replace("MISSING", str(tmp_path / "missing.json")) for a in argv]
    assert main([*args, "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'-' (standard output)" in err and "missing" not in err
    assert not (tmp_path / "-").exists()


def test_standard_output_as_the_export_is_refused_before_the_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--export-trace /dev/stdout` failed after the replay when piped (the temporary file
    went beside /proc/self/fd/1's 'pipe:[...]') and, redirected to a file, replaced that
    file under the --json output, which was lost. Any path that is this process's standard
    output or error is refused before the trace is read."""
    import os
    import subprocess
    import sys

    missing = str(tmp_path / "missing.json")
    for path in ("/dev/stdout", "/dev/stderr"):
        assert main(["replay", missing, "--export-trace", path, "-q"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "standard" in err and "missing" not in err, err
    # In a real shell: piped, and redirected to a file the export would have replaced.
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root}
    cmd = [sys.executable, "-m", "perfcast", "replay", str(EXAMPLE), "--json"]
    piped = subprocess.run(
        [*cmd, "--export-trace", "/dev/stdout"], capture_output=True, env=env, timeout=120
    )
    assert piped.returncode == 2 and b"standard output" in piped.stderr
    assert piped.stdout == b"" and len(piped.stderr.strip().splitlines()) == 1
    out = tmp_path / "out.txt"
    with out.open("wb") as fh:
        redirected = subprocess.run(
            [*cmd, "--export-trace", str(out)], stdout=fh, stderr=subprocess.PIPE, env=env
        )
    assert redirected.returncode == 2 and out.read_bytes() == b""
    # /dev/null takes anything.
    assert main(["replay", str(EXAMPLE), "--export-trace", os.devnull, "-q"]) == 0


def test_an_unwritable_export_is_refused_before_the_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An export into a folder the OS refuses was found unwritable only after the whole
    replay (calibrate checked first, replay and whatif did not): it is refused before the
    trace is read now (the trace named here does not exist)."""
    import os

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if os.access(ro, os.W_OK):  # root writes anywhere: use a virtual file system instead
        ro = Path("/proc")
    missing = str(tmp_path / "missing.json")
    for argv in (
        ["replay", missing, "--export-trace", f"{ro}/t.json"],
        ["whatif", missing, "--apply", "amp", "--export-trace", f"{ro}/t.json"],
    ):
        assert main([*argv, "-q"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "cannot write the output" in err and "missing" not in err


def test_a_replaced_output_keeps_its_permissions(tmp_path: Path) -> None:
    """An export over an existing 0600 file left it 0644 (the new file's mode): a private
    file stays private; a new one gets the umask's mode."""
    import os
    import stat

    out = tmp_path / "private.json"
    out.write_text("old")
    out.chmod(0o600)
    assert main(["replay", str(EXAMPLE), "--export-trace", str(out), "-q"]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and out.read_text().startswith("{")
    new = tmp_path / "new.json"
    assert main(["replay", str(EXAMPLE), "--export-trace", str(new), "-q"]) == 0
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~mask


def test_summary_top_lists_say_what_their_percent_is_of(capsys):
    """Summary's top kernels count % of kernel time, its scopes % of all GPU time and
    analyze's top kernels % of their kind: the kernels' and ops' titles did not say."""
    assert main(["summary", str(H200_TRACE), "-q"]) == 0
    out = capsys.readouterr().out
    assert "top kernels (launched in the steps; %: of their kernel time)" in out
    assert "top CPU ops (outermost calls only; %: of their CPU time)" in out


def test_advise_headline_groups_thousands_as_the_tables_do(tmp_path, capsys):
    """advise printed 'step 43424.58 ms' where replay's table printed 43,425.36."""
    trace = tmp_path / "long.json"
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 1,
            "tid": 1,
            "ts": 0.0,
            "dur": 1_500_000.0,
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0.0,
            "dur": 1_600_000.0,
        },
    ]
    trace.write_text(json.dumps({"traceEvents": events}))
    assert main(["advise", str(trace), "-q"]) == 0
    out = capsys.readouterr().out
    assert "step 1,600.00 ms" in out, out
    assert main(["whatif", str(trace), "--apply", "faster-op:factor=2", "-q"]) == 0
    out = capsys.readouterr().out
    assert "1,600.00 ms" in out and "1600.00" not in out, out
    assert main(["replay", str(trace), "-q"]) == 0
    out = capsys.readouterr().out
    assert "1,600.00" in out and "1600.00" not in out, out


def test_summary_says_its_gpu_split_is_by_time(capsys):
    """A step's GPU split counts the next step's work that starts before it ends (a trace's
    last step has none after it, and its copies read about half the others' on HTA's 16-rank
    A100 trace); the caption only said the columns add up to the step."""
    assert main(["summary", str(H200_TRACE), "-q"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "split the step by time" in out and "next step that starts before this one ends" in out
