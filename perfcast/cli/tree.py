"""`perfcast tree`: GPU and CPU time on the calling context (Python frames, modules, ops),
and `perfcast whatif --tree`: where a prediction's gain lands."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from perfcast.errors import OptionError


def register(sub: Any, add_common: Callable[[Any], None], table: dict[str, Any]) -> None:
    p = sub.add_parser(
        "tree",
        help="GPU and CPU time per call path: Python frames, modules, ops, kernels",
        description="The calling-context tree of a trace: from the Python frames "
        "(with_stack=True), through nn.Module scopes and record_function ranges, to the op, "
        "the runtime call and the kernel. Without stacks it falls back to module scopes, "
        "then op nesting, and says which.",
    )
    p.add_argument("path", help="trace file or folder of rank files")
    add_view_options(p)
    p.add_argument("--rank", type=int, help="only this rank")
    p.add_argument(
        "--phase",
        help="only this phase: forward, backward, optimizer, dataloader, communication, graph "
        "(CUDA graph replays)",
    )
    p.add_argument("--step", help="only this step (ProfilerStep#N, or N)")
    p.add_argument(
        "--metric",
        choices=["gpu", "cpu"],
        help="what sizes the tree (default: GPU time, CPU time for a trace without GPU work)",
    )
    p.add_argument(
        "--bottom-up",
        action="store_true",
        help="also list the hot kernels and ops with the call paths that reach them",
    )
    p.add_argument(
        "--top", type=int, help="kernels and ops (each) listed by --bottom-up (default 10)"
    )
    p.add_argument(
        "--instances",
        action="store_true",
        help="one node per module instance (Layer_0, Layer_1, ...); by default three or "
        "more instances of one class under one parent fold into one node, 'Layer ×N'",
    )
    p.add_argument("--speedscope", metavar="FILE.json", help="write the tree for speedscope")
    p.add_argument(
        "--folded", metavar="FILE.txt", help="write folded stacks (flamegraph.pl, inferno)"
    )
    add_common(p)
    table["tree"] = cmd_tree


def add_view_options(p: argparse.ArgumentParser) -> None:
    """Options shared by `tree` and `whatif --tree`."""
    p.add_argument("--depth", type=int, help="show at most this many levels below the root")
    p.add_argument(
        "--min-pct",
        type=float,
        default=1.0,
        help="collapse call paths below this share of the total (default 1)",
    )
    p.add_argument("--focus", metavar="REGEX", help="only the call paths through matching nodes")
    p.add_argument(
        "--all-frames",
        action="store_true",
        help="keep the frames of PyTorch, the interpreter and perfcast (hidden by default)",
    )


def check_focus(args: argparse.Namespace) -> None:
    """Refuse a broken --focus pattern before any work: `whatif --tree` printed its whole
    prediction before the tree found the pattern broken."""
    import re

    from perfcast.errors import OptionError

    if getattr(args, "focus", None):
        try:
            re.compile(args.focus)
        except re.error as exc:
            raise OptionError(f"--focus: bad regular expression {args.focus!r}: {exc}") from None


PIPED_WIDTH = 160  # columns when the output is not a terminal and COLUMNS is unset


def widen_when_piped(ui: Any) -> None:
    """Piped to a file or a pager: rich's 80 columns would cut the call paths to "v…"."""
    if not ui.out.is_terminal and "COLUMNS" not in os.environ:
        ui.out.width = PIPED_WIDTH


def cmd_tree(args: argparse.Namespace, ui: Any) -> int:
    from perfcast.analysis.context import context_tree
    from perfcast.analysis.context_views import (
        focus,
        library_frames,
        matching,
        project,
        tree_result,
    )
    from perfcast.cli.commands import _check_output, writing

    check_focus(args)
    if args.top is not None and not args.bottom_up:
        # It did nothing without --bottom-up, text or --json: said, as whatif says --focus.
        raise OptionError("--top counts the hot spots of --bottom-up: add --bottom-up")
    for out in (args.speedscope, args.folded):
        _check_output(out, args.path)
    if (
        args.speedscope
        and args.folded
        and os.path.abspath(args.speedscope) == os.path.abspath(args.folded)
    ):
        raise OptionError(
            f"--speedscope and --folded both name {args.folded}: the second would overwrite "
            "the first; give each its own file"
        )
    widen_when_piped(ui)
    table = ui.load(args.path)
    tree = context_tree(table, rank=args.rank, phase=args.phase, step=args.step)
    metric = {"gpu": "gpu_ns", "cpu": "cpu_ns", None: None}[args.metric]
    if args.speedscope or args.folded:
        from perfcast.report.speedscope import write_folded, write_speedscope

        if args.focus and not matching(tree.index, args.focus).any():
            # An export of nothing: speedscope refuses a file without profiles, and an
            # empty folded file reads as a tool that failed.
            raise OptionError(
                f"--focus {args.focus!r} matches no call path of this trace: nothing to write",
                hint="check the pattern against `perfcast tree` (it searches frame, module, "
                "op and kernel names, case-sensitive)",
            )
        shown = focus(tree, args.focus) if args.focus else tree
        if not args.all_frames:
            shown = project(shown, ~library_frames(shown.index))
        if args.speedscope:
            with writing(args.speedscope):
                write_speedscope(shown, args.speedscope, name=_name(args.path))
            ui.note(f"wrote {args.speedscope} (open it at www.speedscope.app)")
        if args.folded:
            m = metric or ("gpu_ns" if tree.coverage.gpu_ns else "cpu_ns")
            with writing(args.folded):
                write_folded(shown, args.folded, metric=m)
            ui.note(f"wrote {args.folded} ({'GPU' if m == 'gpu_ns' else 'CPU'} ns per path)")
    result = tree_result(
        tree,
        metric=metric,
        depth=args.depth,
        min_pct=args.min_pct,
        focus_re=args.focus,
        all_frames=args.all_frames,
        bottom_up=args.bottom_up,
        top=10 if args.top is None else args.top,
        fold=not args.instances,
    )
    if args.json:
        ui.emit_json(result)
        return 0
    from perfcast.report.tree import render_tree

    render_tree(result, ui.out)
    return 0


def _name(path: str) -> str:
    import os

    return os.path.basename(path.rstrip("/")) or path


def whatif_tree(table: Any, base: Any, predicted: Any, args: argparse.Namespace, ui: Any) -> Any:
    """`perfcast whatif --tree`: the gain per call path, printed after the prediction (or
    returned for --json)."""
    from perfcast.analysis.context import build_index
    from perfcast.analysis.context_gain import attribute_gain
    from perfcast.analysis.context_views import focus, library_frames, project, tree_rows

    gain = attribute_gain(build_index(table), base, predicted)
    tree = gain.tree
    if args.focus:
        tree = focus(tree, args.focus)
    if not args.all_frames:
        tree = project(tree, ~library_frames(tree.index))
    rows = tree_rows(tree, "path_saved_ns", depth=args.depth, min_pct=args.min_pct)
    if args.json:
        return {
            "steps": gain.steps,
            "min_pct": args.min_pct,
            "step_saved_ms": gain.step_saved_ms,
            "lead_not_kept_ms": gain.lead_not_kept_ms,
            "method": gain.method,
            "sites": gain.sites,
            "notes": gain.tree.notes,
            "rows": rows,
        }
    from perfcast.report.tree import render_gain_tree

    widen_when_piped(ui)
    render_gain_tree(gain, rows, ui.out, args.min_pct)
    return None
