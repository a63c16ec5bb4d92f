"""Subcommands beyond `summary`: replay, whatif, advise, show, report, calibrate (registered
by main)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.text import Text

from perfcast.errors import OptionError, PerfcastError
from perfcast.paths import not_a_file, standard_stream, unwritable_folder


def add_correction_option(p: Any) -> None:
    p.add_argument(
        "--keep-profiler-cost",
        dest="correct",
        action="store_false",
        help="leave the profiler's own cost in: predict the profiled run, as traced",
    )


def register(sub: Any, add_common: Callable[[Any], None], table: dict[str, Any]) -> None:
    """Add this module's subcommands to the parser and the dispatch table."""
    p = sub.add_parser("replay", help="replay the trace in the simulator: measured vs simulated")
    p.add_argument("path", help="trace file or folder of rank files")
    p.add_argument(
        "--export-trace",
        metavar="OUT.json",
        help="write the simulated timeline for Perfetto (.json or .json.gz)",
    )
    p.add_argument(
        "--engine",
        choices=["fast", "reference"],
        default="fast",
        help="replay loop: compiled (default) or the pure-Python oracle",
    )
    add_correction_option(p)
    add_common(p)
    table["replay"] = cmd_replay

    p = sub.add_parser("whatif", help="predict the step time after one or more optimizations")
    p.add_argument("path", nargs="?", help="trace file or folder of rank files")
    p.add_argument(
        "--apply",
        action="append",
        default=[],
        metavar="NAME[:key=value,...]",
        help="optimization to apply (repeat to compose: code changes apply in one order, "
        "capture last, whatever their order here; faster-op, device and scale-out keep "
        "their places; dataloader-overlap after all of them); "
        "`perfcast whatif --list` shows them",
    )
    p.add_argument("--list", action="store_true", help="list the available optimizations")
    p.add_argument(
        "--export-trace",
        metavar="OUT.json",
        help="write baseline and predicted timelines side by side for Perfetto",
    )
    p.add_argument("--tree", action="store_true", help="show where the gain lands, per call path")
    from perfcast.cli.tree import add_view_options

    add_view_options(p)
    add_correction_option(p)
    add_common(p)
    table["whatif"] = cmd_whatif

    p = sub.add_parser("advise", help="rank every applicable optimization by predicted gain")
    p.add_argument("path", help="trace file or folder of rank files")
    # --gpu as plan names the same thing (--device kept: README and scripts use it).
    p.add_argument(
        "--device",
        "--gpu",
        dest="device",
        metavar="GPU",
        help="also evaluate moving to this GPU (e.g. h100)",
    )
    add_correction_option(p)
    add_common(p)
    table["advise"] = cmd_advise

    p = sub.add_parser("show", help="render a saved --json result again, without the trace")
    p.add_argument(
        "result",
        help="a file written by `perfcast summary|replay|whatif|advise|analyze|diff|plan|tree "
        "... --json > FILE`",
    )
    add_common(p)
    table["show"] = cmd_show

    p = sub.add_parser("report", help="write a self-contained HTML report")
    p.add_argument("path", help="trace file or folder of rank files")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="HTML file to write")
    add_correction_option(p)
    add_common(p)
    table["report"] = cmd_report

    p = sub.add_parser(
        "calibrate",
        help="measure this machine's profiler cost per event, host speed, DataLoader hand-off "
        "and checkpoint costs for the models",
    )
    # --output, as report's: the same concept, the same flag (--out still reads as it).
    p.add_argument(
        "-o",
        "--output",
        dest="out",
        metavar="FILE",
        help="file to write (default: $PERFCAST_CALIBRATION, else "
        "~/.cache/perfcast/calibration.json, which the models read)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        help=f"DataLoader workers to measure with (default 2, at most {MAX_CALIBRATION_WORKERS})",
    )
    p.add_argument(
        "--worker-cpus",
        metavar="LIST",
        help="CPUs the workers are pinned to, as in your job (e.g. 4-7 or 1,3)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="fewer repetitions: about 8 s where a full run takes 15 (2 cores, measured on "
        "this project's machine; a busy machine takes longer)",
    )
    add_common(p)
    table["calibrate"] = cmd_calibrate


def _check_output(path: str | None, inputs: str) -> None:
    """Refuse, before any work, an output that would overwrite the user's input, land in
    an input folder, mix with the report on standard output, or cannot be written."""
    import os

    if path is None:
        return
    if not path.strip():
        raise OptionError("the output path is empty", hint="give a file name")
    if path == "-":
        # Standard output carries the report (text or --json): a file named '-' was made.
        raise OptionError(
            "'-' (standard output) is not an output file here: the report goes there",
            hint="give a file name (./- for a file named '-')",
        )
    stream = standard_stream(path)
    if stream:
        raise OptionError(
            f"{path} is this command's {stream}, where its report and notes go: the two "
            "would be mixed",
            hint="give a file name",
        )
    if os.path.exists(inputs) and os.path.exists(path) and os.path.samefile(path, inputs):
        raise PerfcastError(
            "refusing to overwrite the input trace", path=path, hint="choose another output file"
        )
    _refuse_folder(path)
    parent = os.path.dirname(os.path.abspath(path))
    refuse_inside_input(parent, inputs, path)
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise PerfcastError(f"cannot write the output: {parent} is a file, not a folder", path=path)
    if not os.path.isdir(parent):
        raise PerfcastError("output folder does not exist", path=path)
    _refuse_unwritable(path)


def refuse_inside_input(folder: str, inputs: str, path: str) -> None:
    """Refuse an output in, or under, a folder given as input: the next run on that folder
    would read a written trace as one more rank."""
    import os

    if not os.path.isdir(inputs):
        return
    inside = os.path.realpath(inputs)
    where = os.path.realpath(folder)
    if where == inside or where.startswith(inside.rstrip(os.sep) + os.sep):
        raise PerfcastError(
            "refusing to write into the input folder (perfcast leaves its input as it is; "
            "the next run on the folder could take a written file for one more rank)",
            path=path,
            hint="choose a folder outside it",
        )


# More DataLoader workers than any machine's cores to measure with.
MAX_CALIBRATION_WORKERS = 256


def _refuse_unwritable(path: str) -> None:
    """An output whose folder cannot be made or written to, refused before the work that
    would fill it. A file is written beside its target (a link's) and renamed over it; a
    FIFO or device that exists is written through, so it is the one to ask."""
    import os
    import stat

    target = os.path.realpath(path)
    try:
        through = not stat.S_ISREG(os.stat(target).st_mode)
    except OSError:
        through = False
    if through:
        if not os.access(target, os.W_OK):
            raise PerfcastError(
                "cannot write the output (permission denied)",
                path=path,
                hint="choose a file you can write to",
            )
        return
    why = unwritable_folder(os.path.dirname(target))
    if why:
        raise PerfcastError(
            f"cannot write the output ({why})", path=path, hint="choose a folder you can write to"
        )


def _refuse_folder(path: str) -> None:
    import os

    if os.path.isdir(path):
        raise PerfcastError("the output is a folder", path=path, hint="give a file name inside it")


@contextmanager
def writing(path: str) -> Iterator[None]:
    """An output that cannot be written (no permission, a read-only or virtual file system)
    is a one-line error, not an internal one."""
    try:
        yield
    except OSError as exc:
        raise PerfcastError(
            f"cannot write the output ({exc.strerror or exc})",
            path=path,
            hint="choose a file in a folder you can write to",
        ) from None


def _export(timelines: list[tuple[str, Any]], path: str | None, ui: Any) -> None:
    """Write labelled timelines for Perfetto, when asked to."""
    if not path:
        return
    from perfcast.report.perfetto import export_timelines

    with writing(path):
        export_timelines(timelines, path)
    ui.note(f"wrote {path} (open it at ui.perfetto.dev)")


def _output(result: Any, render: str, args: argparse.Namespace, ui: Any) -> int:
    """The result as JSON with --json, else drawn by perfcast.report.terminal.<render>."""
    if args.json:
        ui.emit_json(result)
        return 0
    from perfcast.display import render_summary
    from perfcast.report import terminal

    if render == "render_summary":
        # Every row the saved summary holds (it was cut to its own --top when saved).
        render_summary(result, ui.out)
        return 0
    if render == "render_diff":
        from perfcast.report.analyses_terminal import render_diff

        # Every row the saved diff holds (`diff` shows its --top, which it saved).
        longest = max(
            len(result.ops), len(result.kernels), len(result.phases), len(result.steps), 1
        )
        render_diff(result, ui.out, rows=longest)
        return 0
    if render == "render_tree":
        from perfcast.cli.tree import widen_when_piped
        from perfcast.report.tree import render_tree

        widen_when_piped(ui)  # as `perfcast tree` draws it
        render_tree(result, ui.out)
        return 0
    if render == "render_plan":
        from perfcast.cli.plan import render as render_plan

        render_plan(result, ui.out)
        return 0
    if render == "render_analyses":
        from perfcast.report.analyses_terminal import render_analyses

        render_analyses(result, ui.out)
        return 0
    getattr(terminal, render)(result, ui.out)
    return 0


def cmd_replay(args: argparse.Namespace, ui: Any) -> int:
    from perfcast.analysis.real_step import real_world
    from perfcast.analysis.replay import replay_result
    from perfcast.graph import build_graph
    from perfcast.sim import simulate

    _check_output(args.export_trace, args.path)
    table = ui.load(args.path)
    graph = build_graph(table)
    tl = simulate(graph, engine=args.engine)
    world = real_world(graph, correct=args.correct, traced=tl)
    # Both worlds the text reports: the replay as traced and the step without the profiler.
    timelines = [("simulated, as traced", tl)]
    if world.real is not tl:
        timelines.append(("simulated, without the profiler", world.real))
    _export(timelines, args.export_trace, ui)
    return _output(replay_result(tl, world), "render_replay", args, ui)


def cmd_whatif(args: argparse.Namespace, ui: Any) -> int:
    from perfcast.whatif.registry import checked_specs, describe_models, model_defaults
    from perfcast.whatif.runner import run_whatif

    if args.list and (args.apply or args.path):
        raise OptionError(
            "--list prints the what-ifs and reads no trace: give it alone (perfcast whatif --list)"
        )
    if not args.tree:
        given = [
            flag
            for flag, value in (
                ("--depth", args.depth is not None),
                ("--min-pct", args.min_pct != 1.0),
                ("--focus", args.focus is not None),
                ("--all-frames", args.all_frames),
            )
            if value
        ]
        if given:
            raise OptionError(f"{given[0]} shapes the gain tree: add --tree")
    if args.list:
        models = [(name, doc, model_defaults(name)) for name, doc in describe_models()]
        if args.json:
            ui.out.print_json(data=[{"name": n, "summary": d, "options": o} for n, d, o in models])
            return 0
        from rich.table import Table

        # A table, so that a description wrapped at the terminal's width keeps its indent.
        listing = Table(box=None, show_header=False, pad_edge=False)
        listing.add_column(no_wrap=True, min_width=24)
        listing.add_column()
        for name, doc, defaults in models:
            options = ", ".join(f"{k}={'auto' if v is None else v}" for k, v in defaults.items())
            listing.add_row(
                name,
                Text.assemble(doc, "\n", (f"defaults: {options or 'no options'}", "dim")),
            )
        ui.out.print(listing)
        ui.out.print(
            Text(
                "auto: decided from the trace, or left out where the trace cannot say (a "
                "filter such as module= or op=: none; dataloader-overlap's cores= and "
                "worker_cores=: no CPU contention); NAME:key=value,... sets an option"
            )
        )
        return 0
    from perfcast.cli.tree import check_focus

    check_focus(args)
    if not args.path:
        raise PerfcastError("no trace given", hint="perfcast whatif PATH --apply NAME")
    if not args.apply:
        raise PerfcastError(
            "nothing to apply", hint="add --apply NAME, see `perfcast whatif --list`"
        )
    specs = checked_specs(args.apply)  # unknown options and bad types before the load
    _check_output(args.export_trace, args.path)
    table = ui.load(args.path)
    result, base_tl, pred_tl = run_whatif(table, specs, correct=args.correct)
    world = "without the profiler" if args.correct else "as traced"
    _export(
        [(f"baseline ({world})", base_tl), (f"predicted ({world})", pred_tl)],
        args.export_trace,
        ui,
    )
    if args.tree:
        from perfcast.cli.tree import whatif_tree

        if args.json:
            ui.emit_json({**vars(result), "tree": whatif_tree(table, base_tl, pred_tl, args, ui)})
            return 0
        _output(result, "render_whatif", args, ui)
        whatif_tree(table, base_tl, pred_tl, args, ui)
        return 0
    return _output(result, "render_whatif", args, ui)


def cmd_advise(args: argparse.Namespace, ui: Any) -> int:
    from perfcast.advisor.advisor import advise

    if args.device is not None:
        from perfcast.whatif.kernels import check_device_name

        # Checked before loading: a typo would only show as a "not applicable" line deep in
        # the advice.
        check_device_name(args.device, "--device ")
    advice = advise(ui.load(args.path), target_device=args.device, correct=args.correct)
    return _output(advice, "render_advice", args, ui)


def cmd_show(args: argparse.Namespace, ui: Any) -> int:
    """Re-render a saved result: its kind is told by the keys it has."""
    import gzip
    import zlib

    import msgspec

    from perfcast.advisor.advisor import Advice
    from perfcast.analysis.battery import Analyses
    from perfcast.analysis.context_views import TreeResult
    from perfcast.analysis.diff import TraceDiff
    from perfcast.analysis.replay import ReplayResult
    from perfcast.analysis.summary import Summary
    from perfcast.plan.search import PlanResult
    from perfcast.whatif.runner import WhatIfResult

    if not args.result:
        raise PerfcastError("the result path is empty: give a file saved with --json")
    if not os.path.exists(args.result):
        raise PerfcastError("no such file or folder", path=args.result)
    special = not_a_file(args.result)
    if special:
        raise PerfcastError(special, path=args.result)
    try:
        with open(args.result, "rb") as fh:
            data = fh.read()
        if not data.strip():
            raise PerfcastError(
                "is empty",
                path=args.result,
                hint="save a result with `perfcast COMMAND TRACE --json > FILE`",
            )
        if data[:2] == b"\x1f\x8b":  # a result saved through gzip, like the traces
            data = gzip.decompress(data)
        if data.lstrip()[:1] == b"[":
            raise PerfcastError(
                "holds a JSON list, not a saved result (a saved result is one object: "
                "`perfcast COMMAND TRACE --json > FILE`)",
                path=args.result,
            )
        # Only the top-level keys (msgspec.Raw skips the values): deep nesting is not read.
        top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
        keys = set(top)
    except (
        OSError,
        EOFError,
        zlib.error,
        msgspec.DecodeError,
        msgspec.ValidationError,
        RecursionError,
    ) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise PerfcastError(f"cannot read a saved result ({why})", path=args.result) from None
    # Each kind by keys only its results have (two of them, for the analyses and diff).
    kinds: list[tuple[set[str], Any, str]] = [
        ({"suggestions"}, Advice, "render_advice"),
        ({"unresolved_dependencies"}, ReplayResult, "render_replay"),
        ({"applied"}, WhatIfResult, "render_whatif"),
        ({"idle", "launches", "queue", "roofline", "scopes"}, Analyses, "render_analyses"),
        ({"step", "phases"}, TraceDiff, "render_diff"),
        ({"ranks"}, Summary, "render_summary"),
        ({"best", "evaluated", "fitting"}, PlanResult, "render_plan"),
        ({"paths", "selection", "coverage", "level_text"}, TreeResult, "render_tree"),
    ]
    for marks, cls, render in kinds:
        if len(keys & marks) >= min(2, len(marks)):
            try:
                result = msgspec.json.decode(data, type=cls)
                gain = None
                if cls is WhatIfResult and "tree" in keys and not args.json:
                    from perfcast.analysis.context_gain import SavedWhatifTree

                    gain = msgspec.json.decode(data, type=SavedWhatifTree).tree
            except (msgspec.ValidationError, RecursionError) as exc:
                why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
                raise PerfcastError(f"not a perfcast result ({why})", path=args.result) from None
            _output(result, render, args, ui)
            if gain is not None:  # saved by `whatif --tree --json`: the gain tree too
                from perfcast.cli.tree import widen_when_piped
                from perfcast.report.tree import render_gain_tree

                widen_when_piped(ui)  # as `whatif --tree` draws it, after the prediction
                render_gain_tree(gain, gain.rows, ui.out, gain.min_pct)  # type: ignore[arg-type]
            return 0
    raise PerfcastError(
        "not a perfcast result",
        path=args.result,
        hint=f"show re-renders {_SHOWN}: write one with "
        "`perfcast summary|replay|whatif|advise|analyze|diff|plan|tree ... --json > FILE`",
    )


_SHOWN = "summary, replay, whatif, advise, analyze, diff, plan and tree results"


def cmd_report(args: argparse.Namespace, ui: Any) -> int:
    from perfcast.report.html import write_report

    _check_output(args.output, args.path)
    table = ui.load(args.path)
    with writing(args.output):
        caveats = write_report(table, args.output, correct=args.correct)
    for caveat in caveats:  # what the page's first card warns of, said here too
        ui.note(f"note: {caveat}")
    ui.note(f"wrote {args.output}")
    if args.json:
        # The caveats too: with -q the notes above are not printed, and a script reading
        # the JSON would take a damaged or warm-up-only trace's page at its word.
        ui.emit_json({"output": args.output, "caveats": caveats})
    return 0


def _cpu_list(text: str | None) -> tuple[int, ...]:
    if text is None:
        return ()
    cpus: list[int] = []
    bad = PerfcastError(f"--worker-cpus {text!r}: expected CPU numbers and ranges like 4-7 or 1,3")
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            first, last = int(lo), int(hi or lo)
            if last < first:  # 7-4 would pin to nothing, silently
                raise bad
            cpus.extend(range(first, last + 1))
    except ValueError:
        raise bad from None
    return tuple(cpus)


def cmd_calibrate(args: argparse.Namespace, ui: Any) -> int:
    import dataclasses
    import os
    import time
    import warnings

    from perfcast import calibration

    worker_cpus = _cpu_list(args.worker_cpus)
    unknown = sorted(set(worker_cpus) - set(range(os.cpu_count() or 1)))
    if unknown:
        raise PerfcastError(
            f"--worker-cpus: this machine has no CPU {unknown[0]} "
            f"(CPUs 0-{(os.cpu_count() or 1) - 1})"
        )
    if args.out is not None and not args.out.strip():
        raise OptionError("-o is empty: name the calibration file to write")
    if not 1 <= args.workers <= MAX_CALIBRATION_WORKERS:
        raise OptionError(
            f"--workers must be from 1 to {MAX_CALIBRATION_WORKERS}, not {args.workers}"
        )
    # -o names a file, whatever it is called; PERFCAST_CALIBRATION=off (no calibration in
    # use) leaves the default place to write to.
    out = args.out or os.environ.get(calibration.ENV, "").strip() or None
    if args.out is None and out is not None and out.lower() in ("off", "none", "0"):
        out = None
    target = out or str(calibration.default_path())
    # Before a minute of measuring, not after (save() creates missing folders).
    if out is not None:
        _refuse_folder(out)
    _refuse_unwritable(target)
    # ~20 s on an idle 2-core VM, 4 s of it the workers' deliberate idle gaps; a busy machine
    # takes longer (the timing loops share the cores), and says so below.
    ui.note(
        "measuring the profiler's cost, host speed, DataLoader hand-off and checkpoint "
        "costs (15-60 s) ..."
    )
    started = time.monotonic()
    with warnings.catch_warnings():
        # torch warns about "excessive" workers when the process is pinned to fewer CPUs.
        warnings.simplefilter("ignore")
        try:
            cal = calibration.measure(args.workers, worker_cpus, quick=args.quick)
        except (RuntimeError, OSError) as exc:  # e.g. workers that could not start
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise PerfcastError(f"calibration failed: {first}") from None
    with writing(target):
        cal = dataclasses.replace(cal, path=str(calibration.save(cal, target)))
    ui.note(f"measured in {time.monotonic() - started:.0f} s")
    if args.json:
        ui.emit_json(cal.to_dict())
        return 0
    from perfcast.report import terminal

    terminal.calibration(cal, ui.out)
    return 0
