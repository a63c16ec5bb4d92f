"""`perfcast analyze` (the HTA / TraceLens battery) and `perfcast diff A B` (registered by main)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from perfcast.errors import OptionError, PerfcastError


def register(sub: Any, add_common: Callable[[Any], None], table: dict[str, Any]) -> None:
    """Add `analyze` and `diff` to the parser and the dispatch table."""
    from perfcast.analysis.catalog import TITLES

    p = sub.add_parser(
        "analyze",
        help="kernel breakdown, idle time, launches, launch queue, memory, stragglers, "
        "collectives, roofline, scopes, kernels by op, GPU counters",
        description="Every trace analysis HTA and TraceLens offer, on every rank. Analyses: "
        + "; ".join(f"{k} ({title})" for k, title in TITLES.items()),
    )
    p.add_argument("path", help="trace file (.json/.json.gz) or folder of rank files")
    p.add_argument("--only", metavar="NAME,...", help=f"run only these ({', '.join(TITLES)})")
    p.add_argument("--top", type=int, default=10, help="rows per ranked table (default 10)")
    p.add_argument(
        "--rows", type=int, default=12, help="rows shown per table in the terminal (default 12)"
    )
    _add_exports(p, "ANALYSIS.TABLE.csv, e.g. idle.by_stream.csv")
    add_common(p)
    table["analyze"] = cmd_analyze

    p = sub.add_parser(
        "diff",
        help="compare two traces of the same program; --apply predicts B from A",
        description="Step time delta and, per op, kernel and phase, count and time deltas per "
        "step, largest first. With --apply, the what-ifs are applied to A and the prediction "
        "is put next to what B measured.",
    )
    p.add_argument("a", metavar="A", help="baseline trace file or folder of rank files")
    p.add_argument("b", metavar="B", help="changed trace file or folder of rank files")
    p.add_argument(
        "--apply",
        action="append",
        default=[],
        metavar="NAME[:key=value,...]",
        help="predict B from A with these what-ifs (repeat to compose; see `perfcast whatif "
        "--list`)",
    )
    p.add_argument("--top", type=int, default=20, help="rows per table (default 20)")
    # diff's own names: analyze's "ANALYSIS.TABLE.csv" example read as diff's.
    _add_exports(p, "ops.csv, kernels.csv, phases.csv, predicted.csv, steps.csv")
    add_common(p)
    table["diff"] = cmd_diff


def _add_exports(p: argparse.ArgumentParser, names: str) -> None:
    p.add_argument(
        "--csv",
        metavar="DIR",
        help=f"also write every table as a CSV file in DIR, one per table, named as the result "
        f"names it ({names})",
    )
    p.add_argument(
        "--parquet",
        metavar="DIR",
        help="also write every table as a Parquet file in DIR, named as with --csv (pyarrow)",
    )


def _check_exports(args: argparse.Namespace, *inputs: str) -> None:
    """Refuse an export folder that cannot be one before the trace is read (a large trace
    takes minutes), or that lies in an input folder; a missing folder is created when the
    tables are written."""
    import os

    from perfcast.cli.commands import refuse_inside_input

    for flag, folder in (("--csv", args.csv), ("--parquet", args.parquet)):
        if folder is None:
            continue
        if not folder.strip():
            raise OptionError(f"the {flag} folder is empty", hint="give a folder name")
        for given in inputs:
            refuse_inside_input(folder, given, folder)
        if os.path.exists(folder) and not os.path.isdir(folder):
            raise PerfcastError(
                f"the {flag} output is a file, not a folder",
                path=folder,
                hint="give a folder (it is created if missing)",
            )


def _write_exports(args: argparse.Namespace, tables: dict[str, Any], ui: Any) -> None:
    from perfcast.frames import write_tables

    for fmt, folder in (("csv", args.csv), ("parquet", args.parquet)):
        if folder:
            try:
                paths = write_tables(tables, folder, fmt)
            except OSError as exc:
                raise PerfcastError(f"cannot write tables ({exc.strerror})", path=folder) from None
            ui.note(f"wrote {len(paths)} {fmt} tables to {folder}")


def cmd_analyze(args: argparse.Namespace, ui: Any) -> int:
    from perfcast.analysis.battery import analyze, parse_only

    only = parse_only(args.only)  # bad names fail before the trace is read
    _check_exports(args, args.path)
    table = ui.load(args.path)
    result = analyze(table, only=only, top=args.top)
    _write_exports(args, result.tables(), ui)
    if args.json:
        ui.emit_json(result)
        return 0
    from perfcast.report.analyses_terminal import render_analyses

    render_analyses(result, ui.out, rows=args.rows)
    return 0


def cmd_diff(args: argparse.Namespace, ui: Any) -> int:
    from perfcast.api import diff
    from perfcast.frames import result_tables

    if args.apply:
        from perfcast.whatif.registry import checked_specs

        checked_specs(args.apply)  # a bad name or option fails before the traces are read
    _check_exports(args, args.a, args.b)
    a = ui.load(args.a)
    b = ui.load(args.b)
    result = diff(a, b, apply=args.apply or None, top=args.top)
    _write_exports(args, result_tables(result), ui)
    if args.json:
        ui.emit_json(result)
        return 0
    from perfcast.report.analyses_terminal import render_diff

    render_diff(result, ui.out, rows=args.top)
    return 0
