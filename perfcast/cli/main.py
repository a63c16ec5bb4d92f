"""The `perfcast` command. Every subcommand is `fn(args, ui) -> int`, testable in-process."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import msgspec
from rich.console import Console

from perfcast import __version__
from perfcast.cli.options import OnceParser
from perfcast.errors import (
    InternalError,
    OptionError,
    PerfcastError,
    describe_internal,
    one_line,
)


def _raise_broken_pipe() -> None:
    raise BrokenPipeError


# The widest line a table is laid out for: COLUMNS=100000000 made section rules of that
# many characters (minutes and gigabytes for one analysis).
MAX_WIDTH = 1000
# Errors a write to the output can end with: said as such, not as a bug of perfcast's.
_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _write_failed(exc: OSError) -> str:
    return f"perfcast: error: cannot write the output ({exc.strerror or exc})"


def _bounded(console: Console) -> Console:
    if console.width > MAX_WIDTH:
        console.width = MAX_WIDTH
    return console


class UI:
    """Where output goes: results to stdout, progress and notes to stderr."""

    def __init__(
        self, quiet: bool = False, json_mode: bool = False, ray: str | None = None
    ) -> None:
        self.quiet = quiet
        self.json_mode = json_mode
        self.ray = ray  # load rank files on Ray: "auto" (a local instance) or an address
        self.out = _bounded(Console(highlight=False, soft_wrap=False))
        self.err = _bounded(Console(stderr=True, highlight=False))
        # rich exits 1 when the reader goes away (`perfcast analyze T | head`); a closed
        # pipe is the reader's choice, not a failure: main's handler quiets it, exit 0.
        self.out.on_broken_pipe = _raise_broken_pipe  # type: ignore[method-assign]

    def note(self, text: str) -> None:
        if not self.quiet:
            self.err.print(text, style="yellow", markup=False, highlight=False)

    def emit_json(self, obj: Any) -> None:
        if sys.stdout is None:  # started with stdout closed: the result goes nowhere
            return
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(obj), indent=2).decode())
        sys.stdout.write("\n")

    def load(self, path: str):
        """Load a trace (refusing one without a single complete event: every command would
        print empty tables and 0 ms); on a terminal, a progress bar when it may take a
        second or more."""
        return self._load(path).require_events()

    def _load(self, path: str):
        if self.ray:
            from perfcast.parallel import ray_backend

            with ray_backend(None if self.ray == "auto" else self.ray):
                return self._load_here(path)
        return self._load_here(path)

    def _load_here(self, path: str):
        from perfcast.ingest import load

        if self.quiet or not self.err.is_terminal or _input_size(path) < 2_000_000:
            return load(path)
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("loading {task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} files"),
            TimeElapsedColumn(),
            console=self.err,
            transient=True,
        ) as bar:
            task = bar.add_task(os.path.basename(path.rstrip("/")) or path, total=None)

            def advance(current: str, done: int, total: int) -> None:
                bar.update(
                    task,
                    completed=done,
                    total=total,
                    description=os.path.basename(current) or "done",
                )

            return load(path, progress=advance)


def _input_size(path: str) -> int:
    if os.path.isdir(path):
        return sum(
            os.path.getsize(os.path.join(path, f))
            for f in os.listdir(path)
            if os.path.isfile(os.path.join(path, f))
        )
    return os.path.getsize(path) if os.path.exists(path) else 0


def cmd_summary(args: argparse.Namespace, ui: UI) -> int:
    from perfcast.analysis.summary import summarize
    from perfcast.report.terminal import render_summary

    table = ui.load(args.path)
    summary = summarize(table, top=args.top, real=args.correct)
    if args.json:
        ui.emit_json(summary)
    else:
        render_summary(summary, ui.out, top=args.top)
    return 0


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the machine-readable result")
    if p.prog.split()[-1] not in ("show", "calibrate"):  # the commands that read traces
        p.add_argument(
            "--ray",
            nargs="?",
            const="auto",
            metavar="ADDRESS",
            help="load a folder's rank files on a Ray cluster (a local one when no address "
            "is given; default: a local process pool)",
        )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress or notes on stderr")
    # Also accepted before the command (`perfcast --debug summary ...`); SUPPRESS keeps the
    # subcommand's default from overriding that.
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)


_DEBUG_HELP = "show the full traceback of an error (for bug reports)"


COMMANDS: dict[str, Callable[[argparse.Namespace, UI], int]] = {"summary": cmd_summary}


class _Parser(OnceParser):
    """argparse with one-line errors: the message and where to look, not the usage block."""

    # The command the arguments name, for errors the top-level parser reports about a
    # command's options (unrecognized arguments): its help is the one to read.
    command: str | None = None

    def error(self, message: str) -> NoReturn:
        where = (
            f"perfcast {self.command}" if self.prog == "perfcast" and self.command else self.prog
        )
        self.exit(2, f"{self.prog}: error: {message} (see `{where} --help`)\n")


def build_parser() -> _Parser:
    parser = _Parser(
        prog="perfcast",
        description="Predict how much faster a PyTorch training step gets, from its profiler "
        "trace (Kineto JSON, one file per rank).",
    )
    parser.add_argument("--version", action="version", version=f"perfcast {__version__}")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("summary", help="where the time of each step goes, per rank")
    p.add_argument("path", help="trace file (.json/.json.gz) or folder of rank files")
    p.add_argument(
        "--top", type=int, default=10, help="how many top kernels/ops to list (default 10)"
    )
    p.add_argument(
        "--keep-profiler-cost",
        dest="correct",
        action="store_false",
        help="do not estimate the steps without the profiler (faster: no replay)",
    )
    _add_common(p)
    _register_extra_commands(sub)
    # Listed for --help only: main() hands `profile` its arguments before parsing.
    sub.add_parser(
        "profile",
        help="run a training script under torch.profiler: "
        "perfcast profile [-o DIR] -- python train.py ...",
    )
    return parser


def _register_extra_commands(sub: Any) -> None:
    """Subcommands defined in other modules add themselves here."""
    from perfcast.cli import commands, tree

    commands.register(sub, _add_common, COMMANDS)
    from perfcast.cli import analyses

    analyses.register(sub, _add_common, COMMANDS)
    tree.register(sub, _add_common, COMMANDS)
    from perfcast.cli import plan

    plan.register(sub, _add_common, COMMANDS)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = bool(argv) and argv[0] == "--debug"
    # `perfcast profile -- python train.py` passes everything after the command through.
    if argv[debug:] and argv[debug] == "profile":
        from perfcast.capture.profiler import run_profile

        rest = argv[debug + 1 :]
        return _guard(lambda: run_profile(rest), debug=debug, subject=None)
    parser = build_parser()
    parser.command = next((a for a in argv if a in COMMANDS or a == "profile"), None)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    ui = UI(
        quiet=getattr(args, "quiet", False),
        json_mode=getattr(args, "json", False),
        ray=getattr(args, "ray", None),
    )
    # The file the command works on, for the one-line message of an error that does not name
    # one (diff: A, the trace its --apply changes).
    subject = (
        getattr(args, "path", None) or getattr(args, "result", None) or getattr(args, "a", None)
    )

    def run() -> int:
        _check_counts(args)
        return COMMANDS[args.command](args, ui)

    return _guard(run, debug=args.debug, subject=subject)


# Options that count something: at least 1 wherever a command has them. Checked here, for
# every command, before any work, so a bad value never costs a load and a prediction first.
_COUNTS = (
    "top",
    "rows",
    "gpus",
    "global_batch",
    "batch",
    "gpus_per_node",
    "nics_per_node",
    "workers",
)


def _check_counts(args: argparse.Namespace) -> None:
    for name in _COUNTS:
        value = getattr(args, name, None)
        if isinstance(value, int) and value < 1:
            raise OptionError(f"--{name.replace('_', '-')} must be at least 1, not {value}")
    depth = getattr(args, "depth", None)
    if isinstance(depth, int) and depth < 0:
        raise OptionError(f"--depth must be 0 or more, not {depth}")
    min_pct = getattr(args, "min_pct", None)
    if isinstance(min_pct, (int, float)) and not 0 <= min_pct <= 100:
        raise OptionError(f"--min-pct must be between 0 and 100, not {min_pct:g}")
    memory = getattr(args, "memory_gb", None)
    if isinstance(memory, (int, float)) and not 0 < memory < float("inf"):  # nan too
        raise OptionError(f"--memory-gb must be a number more than 0, not {memory:g}")


def _guard(fn: Callable[[], int], *, debug: bool, subject: str | None) -> int:
    """Run a command; every failure becomes one line on stderr and an exit code.

    Covers every subcommand (it wraps the dispatch): errors the user can act on
    (PerfcastError, exit 2), and anything else as an internal error (exit 3) that names
    the trace and asks for a report. `--debug` prints the traceback first.
    """
    try:
        return fn()
    except PerfcastError as exc:
        _print_traceback(debug)
        text = str(exc)
        # A what-if that does not apply names the trace; a bad option does not.
        named = exc.path is not None or isinstance(exc, OptionError)
        if not named and subject and subject not in text:
            text = f"{subject}: {text}"
        print(f"perfcast: error: {text}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("perfcast: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except OSError as exc:
        _print_traceback(debug)
        if exc.errno in _WRITE_ERRORS:
            print(_write_failed(exc), file=sys.stderr)
            return PerfcastError.exit_code
        print(f"perfcast: {one_line(describe_internal(exc, subject))}", file=sys.stderr)
        return InternalError.exit_code
    except MemoryError:
        _print_traceback(debug)
        where = f"{subject}: " if subject else ""
        print(
            f"perfcast: error: {where}ran out of memory (free some memory, or analyse fewer "
            "ranks or a shorter trace)",
            file=sys.stderr,
        )
        return PerfcastError.exit_code
    except Exception as exc:
        # Not the user's doing: a bug (CycleError from the simulator, an unexpected value).
        _print_traceback(debug)
        print(f"perfcast: {one_line(describe_internal(exc, subject))}", file=sys.stderr)
        return InternalError.exit_code


def _print_traceback(debug: bool) -> None:
    if debug:
        import traceback

        traceback.print_exc()


def _quiet_stdout() -> None:
    """The reader went away (`perfcast ... | head`): what is left in stdout's buffer goes
    nowhere, so that flushing it at exit does not fail the command (it exited 1)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a file descriptor (a test's capture),
        pass  # or no stdout at all (started with it closed: sys.stdout is None)


def entry() -> None:
    # The command line's process, not a notebook's: the objects of the modules imported so
    # far live as long as it does, and a full collection walked them each time (51 times
    # on a 256-rank summary: 1.1 of its 8.9 s in the collector, 0.5 s once frozen).
    import gc

    gc.collect()  # what the imports left for the collector is not kept forever
    gc.freeze()
    _encodable_streams()
    code = main()
    try:
        if sys.stdout is not None:  # None when the command was started with stdout closed
            sys.stdout.flush()
    except BrokenPipeError:  # output the reader stopped reading after main returned
        _quiet_stdout()
    except OSError as exc:  # a full disk under a redirected stdout
        _quiet_stdout()
        print(_write_failed(exc), file=sys.stderr)
        code = code or PerfcastError.exit_code
    sys.exit(code)


def _encodable_streams() -> None:
    """Output in an encoding that cannot hold the tables' characters (·, µ, ×, box
    lines: PYTHONIOENCODING=ascii) gets '?' for them rather than failing the command."""
    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None) or "utf-8"
        try:
            "·µ×─".encode(encoding)
        except (UnicodeEncodeError, LookupError):
            reconfigure = getattr(stream, "reconfigure", None)
            if reconfigure is not None:
                reconfigure(errors="replace")


if __name__ == "__main__":
    entry()
