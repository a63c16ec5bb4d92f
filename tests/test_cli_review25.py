"""Command-line review (session 25): options given twice, flag names, help defaults, checks
before loading, per-step JSON in advise, Ray start-up failures, and 80-column output."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from perfcast.cli.main import build_parser, main

# No trace is read where this is given: every such case fails or prints before loading one.
MISSING = "/nonexistent/trace.json"
EXAMPLE = Path(__file__).resolve().parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


def _small_trace(path: Path) -> Path:
    from tests.tracegen import linear_steps

    return linear_steps(3, shapes=True, optimizer=True).write(path)


@pytest.mark.parametrize(
    "argv",
    [
        ["summary", MISSING, "--top", "3", "--top", "5"],
        ["analyze", MISSING, "--only", "kernels", "--only", "idle"],
        ["tree", MISSING, "--to", "3", "--top=4"],  # an abbreviation and the = form
        ["plan", MISSING, "--gpus", "8", "--gpus", "16"],
    ],
)
def test_an_option_given_twice_with_two_values_is_refused(capsys, argv):
    # argparse kept the last value silently: `--top 3 --top 5` listed 5 rows.
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "given twice" in err and "give it once" in err
    assert f"perfcast {argv[0]} --help" in err


def test_the_same_value_twice_is_accepted_and_leaves_no_trace_in_the_arguments(capsys):
    # Same value: harmless. The load fails next, so parsing went through.
    assert main(["summary", MISSING, "--top", "3", "--top", "3"]) == 2
    assert "no such file" in capsys.readouterr().err
    args = build_parser().parse_args(["summary", MISSING, "--top", "3"])
    assert args.top == 3 and not any(k.startswith("_") for k in vars(args))


def test_repeatable_options_still_repeat():
    args = build_parser().parse_args(["whatif", MISSING, "--apply", "amp", "--apply", "zero"])
    assert args.apply == ["amp", "zero"]


def test_output_files_take_one_flag_name(capsys):
    # report said -o/--output, calibrate and profile -o/--out: the same concept, two flags.
    assert "-o FILE, --output FILE" in _help(capsys, "report")
    assert "-o FILE, --output FILE" in _help(capsys, "calibrate")
    # --out still reads as --output (an abbreviation), as it did before.
    assert build_parser().parse_args(["calibrate", "--out", "c.json"]).out == "c.json"
    assert build_parser().parse_args(["report", MISSING, "--out", "r.html"]).output == "r.html"


def test_profile_help_names_its_flag_and_default():
    from perfcast.capture.profiler import _build_parser

    parser = _build_parser()
    text = " ".join(parser.format_help().split())
    assert "-o OUT, --output OUT" in text and "(default ./perfcast-traces)" in text
    assert parser.parse_args(["--out", "t"]).out == "t"


def test_advise_takes_gpu_as_plan_does():
    assert build_parser().parse_args(["advise", MISSING, "--gpu", "h100"]).device == "h100"
    assert build_parser().parse_args(["advise", MISSING, "--device", "h100"]).device == "h100"


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("summary", "to list (default 10)"),
        ("analyze", "in the terminal (default 12)"),
        ("calibrate", "to measure with (default 2,"),
        # diff's tables, not analyze's names (its help gave analyze's as the example)
        ("diff", "(ops.csv, kernels.csv, phases.csv, predicted.csv, steps.csv)"),
    ],
)
def test_help_states_the_defaults(capsys, command, said):
    assert said in _help(capsys, command)


def test_tree_top_without_bottom_up_is_refused_before_loading(capsys):
    # It listed nothing more or less, text or --json: the hot spots are --bottom-up's.
    assert main(["tree", MISSING, "--top", "3"]) == 2
    err = capsys.readouterr().err
    assert err == "perfcast: error: --top counts the hot spots of --bottom-up: add --bottom-up\n"
    assert "(each) listed by --bottom-up (default 10)" in _help(capsys, "tree")


def test_tree_top_with_bottom_up_lists_that_many(tmp_path, capsys):
    trace = str(_small_trace(tmp_path / "t.json"))
    assert main(["tree", trace, "--bottom-up", "--top", "1", "--json", "-q"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(h["kind"] for h in doc["bottom_up"]) == ["kernel", "op"]  # one of each


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--gpu", "z9000"], "unknown GPU 'z9000'"),
        (["--link", "foo"], "unknown link 'foo'"),
        (["--inter", "foo"], "unknown link 'foo'"),
        (["--link", "ib-ndr"], "'ib-ndr' is a link between nodes"),
        (["--inter", "nvlink4"], "'nvlink4' joins the GPUs of a node"),
    ],
)
def test_plan_checks_hardware_names_before_loading_the_trace(capsys, option, said):
    # They were checked after the load: a typo cost the load of a large trace first (here
    # the trace is missing, so a name checked after it would never be reached).
    assert main(["plan", MISSING, "--gpus", "8", *option]) == 2
    assert said in capsys.readouterr().err


def test_plan_refuses_batch_with_a_model(capsys):
    # --batch sizes a trace without shapes; with --model it was silently ignored.
    assert main(["plan", "--model", "llama3-8b", "--gpus", "8", "--batch", "4"]) == 2
    assert "with --model, give --global-batch" in capsys.readouterr().err


def test_plan_help_states_the_defaults(capsys):
    text = _help(capsys, "plan")
    assert "plans to list (default 10)" in text
    assert "--gpus-per-node GPUS_PER_NODE GPUs per node (default 8)" in text


def test_advise_json_carries_each_step_as_the_other_commands_do(tmp_path, capsys):
    # README: results carry, per step, traced_ms, real_ms, measured_real_ms and the
    # correction's source; advise gave only the means.
    trace = str(_small_trace(tmp_path / "t.json"))
    assert main(["replay", trace, "--json", "-q"]) == 0
    replayed = json.loads(capsys.readouterr().out)["ranks"][0]["iterations"]
    assert main(["advise", trace, "--json", "-q"]) == 0
    saved = capsys.readouterr().out
    steps = json.loads(saved)["iterations"]
    keys = ("name", "traced_ms", "real_ms", "measured_real_ms", "source")
    assert [{k: s[k] for k in keys} for s in steps] == [{k: s[k] for k in keys} for s in replayed]
    assert [s["rank"] for s in steps] == [0, 0, 0]
    # A saved advice still renders.
    (tmp_path / "advice.json").write_text(saved)
    assert main(["show", str(tmp_path / "advice.json")]) == 0


def test_a_ray_cluster_that_does_not_start_is_a_user_error(tmp_path, capsys, monkeypatch):
    # A local Ray instance timing out on a loaded machine ended as "internal error ...
    # please report it" (exit 3): the cluster or the address is at fault, not perfcast.
    import types

    def init(**kwargs):
        raise ConnectionError("could not reach the head node\nat 10.0.0.1:6379")

    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init, shutdown=lambda: None)
    monkeypatch.setitem(sys.modules, "ray", fake)
    # The address answers (its own check is tests/test_ray_backend.py's); init fails.
    monkeypatch.setattr("perfcast.parallel._check_reachable", lambda address: None)
    trace = str(_small_trace(tmp_path / "t.json"))
    assert main(["summary", trace, "--ray", "ray://10.0.0.1:10001"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert err.startswith("perfcast: error: ") and (
        "could not connect to the Ray cluster at ray://10.0.0.1:10001 "
        "(ConnectionError: could not reach the head node at 10.0.0.1:6379)" in err
    )
    assert "leave out --ray" in err


def test_diff_prints_the_ops_legend_next_to_the_tables(tmp_path, capsys):
    # The legend of the ops table came before the prediction's lines, far from its table.
    trace = str(_small_trace(tmp_path / "t.json"))
    spec = "faster-op:pattern=sgemm,factor=2"
    assert main(["diff", trace, trace, "--apply", spec, "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    legend = next(i for i, ln in enumerate(lines) if ln.startswith("ops: CPU time per step"))
    prediction = next(i for i, ln in enumerate(lines) if ln.startswith("predicted from A"))
    first_table = next(i for i, ln in enumerate(lines) if ln.startswith("ops "))
    assert prediction < legend < first_table


def test_tree_says_how_much_it_hides_within_80_columns(capsys, monkeypatch):
    # "… 5 more below 1% or deeper than " was cropped at the edge: the hidden time, at the
    # end of the line, was lost and the phrase ended mid-word.
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["tree", str(EXAMPLE), "--depth", "3", "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    more = [ln for ln in lines if "more (" in ln]
    assert more and all(len(ln) <= 80 for ln in lines)
    for ln in more:
        assert re.search(r"… \d+ more \([\d,.]+ ms\) ", ln), ln
        assert ln.endswith(("…", "deeper than 3")), ln
