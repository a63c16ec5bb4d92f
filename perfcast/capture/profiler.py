"""Capture Kineto traces of a PyTorch training loop.

``capture()`` wraps ``torch.profiler.profile`` with a wait/warmup/active schedule and writes
one gzipped Chrome/Kineto trace per rank.  Training-step boundaries come either from explicit
``perfcast.capture.step()`` calls or, when the user never makes one, from a global optimizer
step post-hook, so an unmodified training script can be profiled (see ``run_profile``).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import re
import runpy
import shutil
import sys
import traceback
import warnings
import weakref
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from perfcast.capture.launch import (
    is_launched_worker,
    launcher_args,
    run_launcher,
    worker_command,
)
from perfcast.cli.options import OnceParser
from perfcast.ingest.reader import CYCLE_FOLDER
from perfcast.paths import native_stderr_to, unwritable_folder

__all__ = ["Capture", "MaxStepsReached", "active_capture", "capture", "run_profile", "step"]

# The capture currently inside its ``with`` block; torch cannot nest profilers, so one suffices.
_ACTIVE: Capture | None = None


class MaxStepsReached(SystemExit):
    """Raised from a step boundary to end a profiled script once ``max_steps`` is reached."""


def _current_rank() -> int:
    # Looked up when a trace is written, not at start: scripts usually initialise the
    # process group after the capture has begun (always so under ``perfcast profile``).
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # a broken distributed build must not lose the trace
        pass
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _resolve_activities(activities: Iterable[Any] | None) -> list[Any]:
    from torch.profiler import ProfilerActivity

    if activities is None:
        import torch

        acts = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        return acts
    resolved = []
    for act in activities:
        if isinstance(act, str):
            try:
                act = getattr(ProfilerActivity, act.upper())
            except AttributeError:
                raise ValueError(f"unknown profiler activity {act!r}") from None
        resolved.append(act)
    return resolved


@contextlib.contextmanager
def _profiler_output(cap: Capture) -> Iterator[None]:
    """Send what the profiler's C++ side writes to stderr (fd 2) to OUT/profiler.log while
    it starts, steps and stops; the script's own output is untouched (only these calls
    are redirected). `show_profiler_output` leaves it on the terminal."""
    if cap.show_profiler_output:
        yield
        return
    try:
        cap.out_dir.mkdir(parents=True, exist_ok=True)
    except OSError:  # an unwritable folder fails later, with its own message
        yield
        return
    with native_stderr_to(cap.out_dir / PROFILER_LOG):
        yield


def _synchronize() -> None:
    """Wait for the GPU, when torch has one in use (unprofiled timing windows end here)."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except Exception:  # timing without a synchronize beats no capture
        pass


def _another_profiler_running() -> bool:
    """Whether a torch profiler (the script's own) is recording already."""
    try:
        import torch

        return bool(torch._C._autograd._profiler_enabled())
    except Exception:  # an older or unusual build: nothing to tell
        return False


def _record(prof: Any, key: str, value: Any, running: bool = False) -> None:
    """Put a JSON value in the trace header under `key` (torch's metadata API): preset
    before the profiler starts, added while it runs (`running`)."""
    import json

    add = getattr(prof, "add_metadata_json", None)
    method = add if running else getattr(prof, "preset_metadata_json", None) or add
    if method is not None:
        # An older torch, or a profiler not recording: the trace just says less.
        with contextlib.suppress(Exception):
            method(key, json.dumps(value))


def _record_machine(prof: Any) -> None:
    """Put this machine's identity in the trace header ("perfcast_machine"), so that a
    calibration can be checked against the machine the trace comes from."""
    from perfcast.calibration import machine_identity

    _record(prof, "perfcast_machine", machine_identity())


PROFILER_LOG = "profiler.log"
# Steps run, untimed, after a trace is exported before the unprofiled window after it starts.
# Measured on the benchmark's CPU workloads (6-30 ms steps, median of 4 captures): the first
# step after the export ran 10-20% slower than the steps before the trace, the second 5-8%,
# the third 2%, later ones as before (caches and allocator refilled after the export).
AFTER_SETTLE_STEPS = 3
# The files perfcast profile writes (see Capture._trace_path): --overwrite may replace them
# (rank<R>.step<N>.json.gz: what versions before per-cycle folders wrote for --repeat).
_OWN_TRACE = re.compile(r"rank\d+(\.step\d+)?\.json\.gz")
# Its temporary files (_on_trace_ready, _write_trace), left behind when it is killed.
_OWN_TEMPORARY = re.compile(r"\.rank\d+(\.step\d+)?\.json\.gz\.\d+\.(json|tmp)")


class Capture:
    """A profiling session; use through ``capture()`` as a context manager.

    After the ``with`` block, ``trace_paths`` lists the gzipped traces written, in order.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        record_shapes: bool = True,
        with_stack: bool = False,
        with_modules: bool = False,
        profile_memory: bool = False,
        activities: Iterable[Any] | None = None,
        max_steps: int | None = None,
        show_profiler_output: bool = False,
        unprofiled: int = 6,
        unprofiled_after: int | None = None,
    ) -> None:
        if wait < 0 or warmup < 0 or active < 1 or repeat < 0:
            raise ValueError("need wait >= 0, warmup >= 0, active >= 1 and repeat >= 0")
        if unprofiled < 0 or (unprofiled_after is not None and unprofiled_after < 0):
            raise ValueError("unprofiled and unprofiled_after must be >= 0")
        if max_steps is not None and max_steps < 1:
            raise ValueError("max_steps must be >= 1")
        self.out_dir = Path(out_dir)
        self.wait, self.warmup, self.active, self.repeat = wait, warmup, active, repeat
        self.record_shapes = record_shapes
        self.with_stack = with_stack
        self.with_modules = with_modules
        self.profile_memory = profile_memory
        self.activities = activities
        self.max_steps = max_steps
        # Kineto prints its own lines ("USDT: ... profiler_start") on the process's stderr;
        # they go to OUT/profiler.log unless asked for (see _profiler_output).
        self.show_profiler_output = show_profiler_output
        # Steps timed without the profiler before it starts (after one warm-up step), in two
        # windows with a device synchronize at their edges; written into every trace.
        self.unprofiled = unprofiled
        # And after the traced window (one cycle only: with more, the next cycle's wait
        # phase follows at once), after steps that absorb the trace's export: the two
        # sides bracket the profiled steps, so a machine drifting while they ran moves both.
        if unprofiled_after is None:
            unprofiled_after = unprofiled // 2
        self.unprofiled_after = unprofiled_after if repeat == 1 else 0
        #: per-step times (ms) of the unprofiled windows, once measured
        self.unprofiled_step_ms: list[float] = []
        #: the same for the window after the traced one
        self.unprofiled_after_step_ms: list[float] = []
        self._timing: list[float] = []  # window edge times (perf_counter)
        self._after_edges: list[float] = []
        self._after_seen = 0  # step boundaries since the trace was exported
        # Traces written before the window after them is timed: its times are added to them.
        self._held: list[Path] = []
        self.trace_paths: list[Path] = []
        #: training steps seen so far (explicit or from the optimizer hook)
        self.steps = 0
        #: trace cycles that ran to the end of their active phase
        self.cycles_completed = 0
        #: whether the stop flushed a cycle cut short (the last trace written is partial)
        self.wrote_partial = False
        self._stopping = False
        self._prof: Any = None
        self._hook: Any = None
        self._explicit = False
        # Only one optimizer drives automatic steps, so a loop that steps two optimizers
        # (e.g. sparse + dense) still counts one training step per iteration.
        self._driver: weakref.ref[Any] | None = None
        # The process that profiles: a child forked from it (a worker, a helper process)
        # inherits the capture and must neither step its profiler nor write its trace.
        self._pid = os.getpid()
        #: made by `perfcast profile` for the script it runs
        self.from_cli = False
        # A capture the script opens itself while `perfcast profile` runs it: it stands
        # aside (torch cannot nest profilers); its steps go to the running capture.
        self._inert = False

    @property
    def pre_steps(self) -> int:
        """Steps run before the profiler starts: a warm-up and the timed unprofiled ones."""
        return self.unprofiled + 1 if self.unprofiled else 0

    @property
    def post_steps(self) -> int:
        """Steps run after the traced window: those that absorb the export, then the timed
        unprofiled ones."""
        return self.unprofiled_after + AFTER_SETTLE_STEPS if self.unprofiled_after else 0

    @property
    def schedule_steps(self) -> int | None:
        """Steps the schedule needs to finish all cycles and the timing after them; None
        when it repeats forever."""
        if self.repeat == 0:
            return None
        cycles = (self.wait + self.warmup + self.active) * self.repeat
        return self.pre_steps + cycles + self.post_steps

    @property
    def finished(self) -> bool:
        """True once every scheduled trace cycle has been written."""
        return self.repeat > 0 and self.cycles_completed >= self.repeat

    @property
    def automatic(self) -> bool:
        """Whether steps are still taken from the optimizer hook."""
        return not self._explicit

    def __enter__(self) -> Capture:
        global _ACTIVE
        from torch.optim.optimizer import register_optimizer_step_post_hook

        if _ACTIVE is not None and _ACTIVE.from_cli:
            self._inert = True
            print(
                "perfcast: note: the script's own perfcast.capture() stands aside: "
                "perfcast profile is already capturing it",
                file=sys.stderr,
            )
            return self
        if _ACTIVE is not None:
            raise RuntimeError("a perfcast capture is already active; captures cannot nest")
        if _another_profiler_running():
            raise RuntimeError(
                "a torch profiler is already running: perfcast.capture starts its own (and "
                "times steps without one); stop the other profiler first"
            )
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.repeat != 1:
            # Each cycle goes to its own file, so torch's "clears events" warning is noise.
            warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
        if not self.unprofiled:
            self._start_profiler()
        self._hook = register_optimizer_step_post_hook(self._optimizer_hook)
        _ACTIVE = self
        return self

    def _start_profiler(self) -> None:
        import torch.profiler

        self._prof = torch.profiler.profile(
            activities=_resolve_activities(self.activities),
            schedule=torch.profiler.schedule(
                wait=self.wait, warmup=self.warmup, active=self.active, repeat=self.repeat
            ),
            on_trace_ready=self._on_trace_ready,
            record_shapes=self.record_shapes,
            with_stack=self.with_stack,
            with_modules=self.with_modules,
            profile_memory=self.profile_memory,
        )
        _record_machine(self._prof)
        # torch warns on a schedule without warm-up; the schedule is the user's choice.
        warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
        if self.unprofiled_step_ms:
            _record(self._prof, "perfcast_unprofiled_step_ms", self.unprofiled_step_ms)
        with _profiler_output(self):
            self._prof.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        global _ACTIVE
        if self._inert:
            return
        _ACTIVE = None
        self._remove_hook()
        prof, self._prof = self._prof, None
        if self._forked():
            return  # the parent owns the profiler and its trace
        try:
            if prof is not None:
                self._stopping = True
                try:
                    with _profiler_output(self):
                        # Stopping mid-cycle still flushes a partial trace through
                        # _on_trace_ready; its last ProfilerStep was opened by the last step
                        # boundary and never closed: what ran after the loop. The trace
                        # says so for the loader.
                        if not self.finished:
                            _record(prof, "perfcast_last_step_open", True, running=True)
                        prof.__exit__(exc_type, exc, tb)
                finally:
                    self._stopping = False
        finally:
            # The script ended before the window after the trace was timed: the trace goes
            # out without it.
            self._release_held()
        if exc_type is None and not self.from_cli and (why := self.untimed_after):
            warnings.warn(f"perfcast.capture: {why}", stacklevel=2)
        if exc_type is None and not self.trace_paths and not self.from_cli:
            # In a notebook nothing else would say so (perfcast profile says it itself).
            warnings.warn(
                f"perfcast.capture: no trace written to {self.out_dir}: {self.steps} step(s) "
                f"ran, the schedule needs {self.steps_for_a_trace}+ (fewer unprofiled steps, "
                "wait or warmup need fewer)",
                stacklevel=2,
            )

    @property
    def untimed_after(self) -> str | None:
        """Why the trace lacks the unprofiled steps after it, when every trace was written
        but the script ended before they were timed; else None."""
        if not (self.unprofiled_after and self.finished) or self.unprofiled_after_step_ms:
            return None
        return (
            f"the script ended {self._after_seen} step(s) after the trace, before the "
            f"{self.unprofiled_after} unprofiled steps after it were timed (they need "
            f"{self.post_steps} steps after the trace): "
            + (
                f"it carries only the {self.unprofiled} timed before it"
                if self.unprofiled
                else "it carries no unprofiled step"
            )
        )

    @property
    def steps_for_a_trace(self) -> int:
        """Training steps a run needs before its first trace holds one whole step."""
        return self.pre_steps + self.wait + self.warmup + 1

    def _forked(self) -> bool:
        return os.getpid() != self._pid

    def step(self) -> None:
        """Mark the end of one training step (explicit mode)."""
        if self._inert:
            if _ACTIVE is not None and _ACTIVE is not self:
                _ACTIVE.step()
            return
        if not self._explicit:
            # The user marks steps themselves; the optimizer hook would double count.
            self._explicit = True
            self._remove_hook()
            if self.steps > 0:
                # The hook already closed this iteration at its optimizer.step() (the usual
                # `opt.step(); perfcast.capture.step()` loop); advancing again would leave an
                # empty profiler step.
                return
        self._advance()

    def _remove_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _optimizer_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._explicit:
            return
        driver = self._driver() if self._driver is not None else None
        if driver is None:
            # First optimizer seen (or the previous one was garbage collected) drives steps.
            self._driver = weakref.ref(optimizer)
        elif driver is not optimizer:
            return
        # This runs inside the optimizer's "Optimizer.step#..." record_function, so that range
        # ends a few microseconds after the ProfilerStep it belongs to; explicit step() calls
        # give exact boundaries.
        self._advance()

    def _advance(self) -> None:
        if self._forked():
            return
        if self._prof is None:
            if self.unprofiled and not self.unprofiled_step_ms and _ACTIVE is self:
                self.steps += 1
                self._time_unprofiled()
            return
        self.steps += 1
        after_trace = bool(self._held)  # the trace was exported at an earlier boundary
        if not (self.finished and after_trace):
            # Once every cycle is written the schedule has nothing left to do: stepping it
            # (and redirecting stderr around that) only slowed the steps timed after it.
            with _profiler_output(self):
                self._prof.step()
        if after_trace:
            self._time_after()
        if (
            self.max_steps is not None
            and self.steps >= self.max_steps
            and (self.finished or self.repeat == 0)
            and not self._held
        ):
            raise MaxStepsReached(0)

    def _time_unprofiled(self) -> None:
        """At each step boundary before the profiler starts: the first closes the warm-up step;
        then up to three windows of steps are timed, each between two device
        synchronizations (one per window, not per step, so the CPU still runs ahead of the
        GPU inside it). Three, so that the median of the windows passes over one slow step
        (a first window still warming up, a pause of the script's own)."""
        import time

        _synchronize()
        self._timing.append(time.perf_counter())
        edges = self._timing
        windows = min(3, self.unprofiled)
        ends = [round(self.unprofiled * (k + 1) / windows) for k in range(windows)]
        done = len(edges) - 1  # timed steps so far
        if done < self.unprofiled:
            return
        per_step = []
        start = 0
        for e in ends:
            per_step.append((edges[e] - edges[start]) * 1e3 / (e - start))
            start = e
        self.unprofiled_step_ms = [round(x, 4) for x in per_step]
        self._start_profiler()

    def _time_after(self) -> None:
        """At each step boundary after the traced window: the first `AFTER_SETTLE_STEPS`
        steps absorb the export; one window of `unprofiled_after` steps follows, between two
        device synchronizations. Then the held traces are written with its times."""
        import time

        self._after_seen += 1
        if self._after_seen < AFTER_SETTLE_STEPS:
            return
        _synchronize()
        self._after_edges.append(time.perf_counter())
        edges = self._after_edges
        if len(edges) - 1 < self.unprofiled_after:
            return
        ms = (edges[-1] - edges[0]) * 1e3 / self.unprofiled_after
        self.unprofiled_after_step_ms = [round(ms, 4)]
        self._release_held()

    def _release_held(self) -> None:
        """The traces written before the window after them was timed get its times."""
        held, self._held = self._held, []
        if not self.unprofiled_after_step_ms:
            return  # the script ended first: the traces stand as written
        extra = {"perfcast_unprofiled_after_step_ms": self.unprofiled_after_step_ms}
        for final in held:
            self._amend(final, extra)

    def _trace_path(self, step_num: int) -> Path:
        name = f"rank{_current_rank()}.json.gz"
        if self.repeat == 1:
            return self.out_dir / name
        # Several cycles: one folder each (named by the step that ended it), holding every
        # rank's trace of that cycle, which is what a folder load takes as one run.
        return self.out_dir / f"step{step_num}" / name

    def _recorded_a_step(self) -> bool:
        """Whether the cycle being flushed at a stop holds a whole active step: stopped in
        its wait or warm-up, the trace would hold only the open step after the loop."""
        cycle = self.wait + self.warmup + self.active
        done = (self.steps - self.pre_steps) % cycle
        return done > self.wait + self.warmup

    def _on_trace_ready(self, prof: Any) -> None:
        if self._stopping and not self.finished and not self._recorded_a_step():
            return  # nothing of the training loop in it: no trace rather than an empty one
        final = self._trace_path(int(prof.step_num))
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp_json = final.with_name(f".{final.name}.{os.getpid()}.json")
        try:
            prof.export_chrome_trace(str(tmp_json))
        except BaseException:
            tmp_json.unlink(missing_ok=True)
            raise
        # Written at once, whole: a job stopped while the steps after it are timed (torchrun
        # stopping its workers, a scheduler's SIGTERM) keeps it; those steps' times are
        # added once measured (_release_held), after the timing.
        self._write_trace(tmp_json, final, {})
        if self._stopping and not self.finished:
            self.wrote_partial = True
        if not self._stopping and self.unprofiled_after:
            self._held.append(final)
        if not self._stopping:
            self.cycles_completed += 1

    def _write_trace(self, exported: Path, final: Path, extra: dict[str, Any]) -> None:
        """Gzip an exported trace to `final`, with `extra` as top-level keys put first."""
        try:
            with open(exported, "rb") as src:
                _gzip_with_keys(src, final, extra)
        finally:
            exported.unlink(missing_ok=True)
        self.trace_paths.append(final)

    def _amend(self, final: Path, extra: dict[str, Any]) -> None:
        """Rewrite a written trace with `extra` as top-level keys put first."""
        # Gone or unreadable: it stays as it was.
        with contextlib.suppress(OSError), gzip.open(final, "rb") as src:
            _gzip_with_keys(src, final, extra)


def _gzip_with_keys(src: Any, final: Path, extra: dict[str, Any]) -> None:
    """Write the JSON object read from `src` gzipped to `final` (atomically), `extra`'s keys
    first in it."""
    import json

    tmp_gz = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        with gzip.open(tmp_gz, "wb", compresslevel=6) as dst:
            head = src.read(1 << 16)
            brace = head.find(b"{")
            if extra and brace >= 0:
                # The export is one JSON object: open it with the extra keys.
                items = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in extra.items())
                head = head[: brace + 1] + items.encode() + b", " + head[brace + 1 :]
            dst.write(head)
            shutil.copyfileobj(src, dst, 1 << 20)
        # Atomic rename: readers never see a half-written trace.
        os.replace(tmp_gz, final)
    finally:
        tmp_gz.unlink(missing_ok=True)


def capture(
    out_dir: str | os.PathLike[str],
    *,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    repeat: int = 1,
    record_shapes: bool = True,
    with_stack: bool = False,
    with_modules: bool = False,
    profile_memory: bool = False,
    activities: Iterable[Any] | None = None,
    max_steps: int | None = None,
    show_profiler_output: bool = False,
    unprofiled: int = 6,
    unprofiled_after: int | None = None,
) -> Capture:
    """Profile the enclosed training loop into ``out_dir/rank{R}.json.gz`` (with ``repeat``
    other than 1: ``out_dir/step{N}/rank{R}.json.gz``, one folder per cycle).

    Use as ``with capture("traces") as cap: ...``; steps are marked by ``step()`` or, if it is
    never called, by every ``optimizer.step()`` of the first optimizer seen.  ``activities``
    defaults to CPU plus CUDA when available (ProfilerActivity values or "cpu"/"cuda").
    ``max_steps`` ends the program (``MaxStepsReached``, a SystemExit) once that many steps
    ran and the schedule is complete. The profiler's own stderr lines go to
    ``out_dir/profiler.log`` unless ``show_profiler_output``. Before the profiler starts, one
    warm-up step runs, then ``unprofiled`` steps are timed without the profiler (three windows,
    each between device synchronizations); the times go into every trace
    (``perfcast_unprofiled_step_ms``), and perfcast fits its profiler-cost correction to them.
    With one cycle (``repeat=1``), ``unprofiled_after`` more steps (default: half as many)
    are timed after the traced window, following ``AFTER_SETTLE_STEPS`` that absorb the export
    (``perfcast_unprofiled_after_step_ms``, added to the trace, written at once, when they are
    timed: a job stopped meanwhile keeps its trace).
    """
    return Capture(
        out_dir,
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=repeat,
        record_shapes=record_shapes,
        with_stack=with_stack,
        with_modules=with_modules,
        profile_memory=profile_memory,
        activities=activities,
        max_steps=max_steps,
        show_profiler_output=show_profiler_output,
        unprofiled=unprofiled,
        unprofiled_after=unprofiled_after,
    )


def active_capture() -> Capture | None:
    """The capture currently running, if any."""
    return _ACTIVE


def step() -> None:
    """Mark the end of a training step for the active capture; a no-op without one.

    The first call switches the capture from optimizer-hook steps to explicit steps.
    """
    if _ACTIVE is not None:
        _ACTIVE.step()


# ---------------------------------------------------------------------------------------------
# perfcast profile [options] -- python train.py args...

# Interpreter flags that take a value as the next argument (python -W error train.py).
_PY_FLAGS_WITH_VALUE = {"-W", "-X", "--check-hash-based-pycs"}


def _fail(msg: str) -> int:
    # The same one-line form as every other command's errors.
    from perfcast.errors import one_line

    print(f"perfcast: error: {one_line(msg)}", file=sys.stderr)
    return 2


def _parse_target(cmd: Sequence[str]) -> tuple[str, str, list[str]]:
    """Split ``python [flags] script.py args`` into (kind, target, args).

    kind is "path" or "module"; the leading interpreter is optional.
    """
    args = list(cmd)
    if args and Path(args[0]).name.startswith("python") and not args[0].endswith(".py"):
        args.pop(0)
        while args and args[0].startswith("-") and args[0] != "-":
            flag = args.pop(0)
            if flag == "-m":
                if not args:
                    raise ValueError("-m needs a module name")
                return "module", args[0], args[1:]
            if flag.startswith("-m"):  # python -mpkg.mod
                return "module", flag[2:], args
            if flag == "-c":
                raise ValueError("python -c is not supported; profile a script or a module")
            if flag in _PY_FLAGS_WITH_VALUE:
                if not args:
                    raise ValueError(f"{flag} needs a value")
                args.pop(0)
            # Other interpreter flags (-u, -O, -B, ...) do not matter in-process.
    if not args:
        raise ValueError("no script given after '--' (expected: -- python train.py ...)")
    return "path", args[0], args[1:]


class _OneLineParser(OnceParser):
    """Errors in one line, as every other command gives them, not the usage block; an
    option given twice with two values refused, as every other command refuses it."""

    def error(self, message: str) -> Any:
        self.exit(2, f"perfcast profile: error: {message} (see `perfcast profile --help`)\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="perfcast profile",
        description="Run a training script in-process under the PyTorch profiler and write "
        "one gzipped Kineto trace per rank. After '--' a torchrun command (or python -m "
        "torch.distributed.run) profiles every worker it starts.",
        usage="perfcast profile [options] -- python train.py [args...]\n"
        "       perfcast profile [options] -- torchrun [torchrun options] train.py [args...]",
    )
    # --output, as report's and calibrate's (--out still reads as it).
    parser.add_argument(
        "-o",
        "--output",
        dest="out",
        metavar="OUT",
        default="./perfcast-traces",
        help="trace folder (default ./perfcast-traces)",
    )
    parser.add_argument("--wait", type=int, default=1, help="steps skipped per cycle (default 1)")
    parser.add_argument("--warmup", type=int, default=1, help="profiler warm-up steps (default 1)")
    parser.add_argument(
        "--active", type=int, default=3, help="steps recorded per cycle (default 3)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="cycles (default 1; 0: until the end); with several, each cycle's traces go to "
        "their own folder, OUT/step<N>/",
    )
    parser.add_argument("--with-stack", action="store_true", help="record Python stacks")
    parser.add_argument("--with-modules", action="store_true", help="record nn.Module scopes")
    parser.add_argument("--memory", action="store_true", help="profile memory allocations")
    parser.add_argument(
        "--unprofiled-steps",
        type=int,
        default=6,
        metavar="N",
        help="steps timed without the profiler before it starts (after one warm-up step), "
        "written into the trace so predictions fit the profiler's cost to them (default 6; 0: "
        "none). With the defaults a script needs at least 10 steps for a trace; fewer and "
        "the run says how many it needed",
    )
    parser.add_argument(
        "--unprofiled-after-steps",
        type=int,
        default=None,
        metavar="N",
        help="steps timed without the profiler after the traced window (after 3 steps that "
        "absorb the export; with --repeat 1 only); default: half of --unprofiled-steps",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the trace paths as JSON on stdout at the end"
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        metavar="N",
        help="end the script after N steps (never before the capture finished)",
    )
    parser.add_argument(
        "--run-to-end",
        action="store_true",
        help="let the script run to its end after the last trace is written (default: "
        "stop it at the next step, unless --max-steps says otherwise or --repeat 0)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the traces a previous `perfcast profile` left in the folder "
        "(default: refuse to write into a folder that holds traces)",
    )
    parser.add_argument(
        "--show-profiler-output",
        action="store_true",
        help="show the profiler's own messages on stderr (default: OUT/profiler.log)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _bad_option(ns: argparse.Namespace) -> str | None:
    """The first option whose value the schedule cannot take, named as the user typed it."""
    if not ns.out.strip():
        return "-o is empty: name the folder to write the traces to"
    for flag, value, least in (
        ("--wait", ns.wait, 0),
        ("--warmup", ns.warmup, 0),
        ("--active", ns.active, 1),
        ("--repeat", ns.repeat, 0),
        ("--unprofiled-steps", ns.unprofiled_steps, 0),
        ("--unprofiled-after-steps", ns.unprofiled_after_steps, 0),
        ("--max-steps", ns.max_steps, 1),
    ):
        if value is not None and value < least:
            return f"{flag} must be at least {least}, not {value}"
    if ns.repeat != 1 and ns.unprofiled_after_steps:
        return (
            "--unprofiled-after-steps times steps after the one traced window: with --repeat "
            f"{ns.repeat} the next cycle follows at once; use --repeat 1 or leave it out"
        )
    return None


def run_profile(argv: list[str]) -> int:
    """Implement ``perfcast profile [options] -- python train.py args...``; returns exit code."""
    if "--" in argv:
        cut = argv.index("--")
        opt_argv, cmd = argv[:cut], argv[cut + 1 :]
    else:
        opt_argv, cmd = argv, None
    ns = _build_parser().parse_args(opt_argv)
    if cmd is None:
        cmd = list(ns.command)
    elif ns.command:
        return _fail(f"unexpected arguments before '--': {' '.join(ns.command)}")
    bad = _bad_option(ns)
    if bad:
        return _fail(bad)
    try:
        import torch.profiler  # noqa: F401  (fail here, with a clear line, not mid-script)
    except ImportError:
        return _fail("PyTorch is not installed in this environment (pip install torch)")
    try:
        kind, target, script_args = _parse_target(cmd)
    except ValueError as exc:
        return _fail(str(exc))

    try:
        launcher = launcher_args(cmd, kind, target, script_args)
    except ValueError as exc:
        return _fail(str(exc))
    # A launcher's workers share the folder their parent prepared.
    problem = None if is_launched_worker() else _prepare_out(Path(ns.out), ns.overwrite)
    if problem:
        return _fail(problem)
    try:
        # Validate the schedule before running anything.
        cap = Capture(
            ns.out,
            wait=ns.wait,
            warmup=ns.warmup,
            active=ns.active,
            repeat=ns.repeat,
            with_stack=ns.with_stack,
            with_modules=ns.with_modules,
            profile_memory=ns.memory,
            max_steps=ns.max_steps,
            show_profiler_output=ns.show_profiler_output,
            unprofiled=ns.unprofiled_steps,
            unprofiled_after=ns.unprofiled_after_steps,
        )
    except ValueError as exc:
        return _fail(str(exc))
    cap.from_cli = True
    if ns.max_steps is None and not ns.run_to_end and ns.repeat > 0:
        # Stop at the first step boundary once every trace is written (documented).
        cap.max_steps = cap.schedule_steps

    if launcher is not None:
        return _profile_through_launcher(launcher, opt_argv, ns)
    if kind == "path":
        script = Path(target)
        if script.is_dir():
            return _fail(f"{target} is a folder, not a script (python -m runs a package)")
        if not script.is_file():
            return _fail(f"script not found: {target}")
        sys_path0 = str(script.resolve().parent)
        argv0 = str(script)
    else:
        import importlib.util

        sys_path0 = os.getcwd()
        sys.path.insert(0, sys_path0)
        try:
            found = importlib.util.find_spec(target) is not None
        except (ImportError, ValueError):
            found = False
        finally:
            sys.path.remove(sys_path0)
        if not found:
            return _fail(f"module not found: {target}")
        argv0 = target

    saved_argv, saved_path = sys.argv, list(sys.path)
    # Mirror what `python script.py` would see: its own argv and its folder on sys.path.
    sys.argv = [argv0, *script_args]
    sys.path.insert(0, sys_path0)
    rc = 0
    stopped = interrupted = False
    out = Path(ns.out)
    made_out = not out.exists()
    try:
        with cap:
            try:
                if kind == "path":
                    runpy.run_path(str(script), run_name="__main__")
                else:
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
            except MaxStepsReached:
                stopped = True
            except SystemExit as exc:
                rc = _exit_code(exc)
            except KeyboardInterrupt:
                # Ctrl-C: the capture still flushes what it recorded (said below).
                interrupted, rc = True, 130
    except Exception as exc:
        # The script failed: show its traceback like python would (its own frames, not
        # perfcast's or runpy's); traces are still flushed.
        _print_script_traceback(exc)
        rc = 1
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
    if cap._forked():
        # A child the script forked ran on to the end of the script: it leaves as the script
        # would, without reporting (or writing) the parent's traces.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    if not cap.trace_paths and made_out:
        _remove_if_empty(out)
    if interrupted:
        written = ", ".join(p.relative_to(out).as_posix() for p in cap.trace_paths)
        _fail(
            f"interrupted after {cap.steps} step(s); "
            + (
                f"wrote {len(cap.trace_paths)} trace(s) to {out}: {written}"
                + (" (the last one partial)" if cap.wrote_partial else "")
                if cap.trace_paths
                else "no trace written"
            )
        )
        return rc

    if cap.steps == 0 and rc != 0 and not stopped:
        _fail(
            f"the script failed (exit status {rc}) before its first training step: no trace "
            f"written to {out}"
        )
        return rc
    if cap.steps == 0:
        return _fail(
            "no training steps seen (no optimizer.step() or perfcast.capture.step() call): "
            "no trace written"
        )
    if not cap.trace_paths:
        need = cap.steps_for_a_trace
        if rc != 0 and not stopped:
            # The script's own failure is the news (its traceback is above); its exit status
            # is kept, as running it without perfcast would.
            _fail(
                f"the script failed (exit status {rc}) after {cap.steps} step(s), before a "
                f"trace was written (the schedule needs {need}+ steps)"
            )
            return rc
        return _fail(f"no trace written: only {cap.steps} step(s) ran, the schedule needs {need}+")
    if ns.json and not is_launched_worker():
        import json

        doc = {
            "steps": cap.steps,
            "traces": [str(p) for p in cap.trace_paths],
            "unprofiled_step_ms": cap.unprofiled_step_ms,
            "unprofiled_after_step_ms": cap.unprofiled_after_step_ms,
        }
        print(json.dumps(doc))
    else:
        names = ", ".join(p.relative_to(out).as_posix() for p in cap.trace_paths)
        print(
            f"perfcast: {cap.steps} steps seen; wrote {len(cap.trace_paths)} trace(s) to {out}: "
            f"{names}",
            # A launched worker's line is part of the launcher's log, not the command's output.
            file=sys.stderr if is_launched_worker() else sys.stdout,
        )
    if stopped and ns.max_steps is None:
        print(
            f"perfcast: the capture is complete: stopped the script after step {cap.steps} "
            "(--run-to-end lets it finish)",
            file=sys.stderr,
        )
    if rc == 0 and (why := cap.untimed_after):
        print(f"perfcast: warning: {why}", file=sys.stderr)
    if cap.schedule_steps is not None and not cap.finished:
        what = (
            "the last trace is partial"
            if cap.wrote_partial
            else f"{cap.cycles_completed} of {ns.repeat} cycle(s) written (the last one stopped "
            "before an active step: no trace of it)"
        )
        print(
            f"perfcast: warning: the script ended before the schedule finished "
            f"({cap.steps}/{cap.schedule_steps} steps); {what}",
            file=sys.stderr,
        )
    return rc


def _drop_options(argv: list[str], dests: set[str]) -> list[str]:
    """`argv` without the options whose destinations are `dests`, their values included,
    however the user spelled them (`-o X`, `-oX`, `--output=X`, an abbreviation such as
    `--overw`): the workers get the folder as an absolute path, and `-o` given twice with
    two values is refused."""
    actions = _build_parser()._option_string_actions
    out: list[str] = []
    skip_value = False
    for arg in argv:
        if skip_value:
            skip_value = False
            continue
        name, eq, _ = arg.partition("=")
        if arg.startswith("--"):
            # argparse's abbreviations: an exact name, else the one long option it begins.
            hits = [name] if name in actions else [o for o in actions if o.startswith(name)]
            action = actions[hits[0]] if len(hits) == 1 else None
        elif arg.startswith("-") and len(arg) > 1:
            action, eq = actions.get(arg[:2]), ("=" if len(arg) > 2 else "")
        else:
            action = None
        if action is not None and action.dest in dests:
            skip_value = action.nargs != 0 and not eq
            continue
        out.append(arg)
    return out


def _profile_through_launcher(launcher: list[str], opt_argv: list[str], ns: Any) -> int:
    """Run torchrun with `perfcast profile` as every worker; report the traces they wrote."""
    out = Path(ns.out)
    # The workers take the same options; the parent alone prepares the folder and reports.
    passed = _drop_options(opt_argv, {"json", "overwrite", "out"})
    try:
        command = worker_command(launcher, [*passed, "-o", str(out.resolve())])
    except ValueError as exc:
        return _fail(str(exc))
    rc = run_launcher(command)
    _, files = _files_written_to(out)
    traces = sorted(
        (p for p in files if _OWN_TRACE.fullmatch(p.name)),
        key=lambda p: _in_step_order(p.relative_to(out).as_posix()),
    )
    if not traces:
        return _fail(f"the launcher exited with status {rc} and no worker wrote a trace to {out}")
    if ns.json:
        import json

        print(json.dumps({"traces": [str(p) for p in traces], "launcher_exit_status": rc}))
    else:
        names = ", ".join(p.relative_to(out).as_posix() for p in traces)
        print(f"perfcast: the workers wrote {len(traces)} trace(s) to {out}: {names}")
    if rc != 0:
        print(f"perfcast: warning: the launcher exited with status {rc}", file=sys.stderr)
    return rc


def _prepare_out(out: Path, overwrite: bool) -> str | None:
    """Refuse a folder that already holds traces (the analysis would mix old and new
    ranks); with --overwrite, remove the ones perfcast wrote. Returns the problem, if any."""
    if out.exists() and not out.is_dir():
        return f"{out} exists and is not a folder; choose another -o"
    unwritable = _unwritable(out)
    if unwritable:
        return unwritable
    if not out.is_dir():
        return None  # made by the run itself, once it starts
    cycles, files = _files_written_to(out)
    traces = sorted(
        (p for p in files if p.name.endswith((".json", ".json.gz")) or _is_leftover(p)),
        key=lambda p: _in_step_order(p.relative_to(out).as_posix()),
    )
    if not traces:
        return None
    names = [p.relative_to(out).as_posix() for p in traces]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    if not overwrite:
        return (
            f"{out} already holds traces ({shown}); write to another folder with -o, "
            "or pass --overwrite to replace them"
        )
    foreign = [n for n, p in zip(names, traces, strict=True) if not _is_own(p)]
    if foreign:
        return (
            f"{out} holds trace files perfcast profile did not write ({', '.join(foreign[:3])}); "
            "--overwrite only replaces its own: choose another folder with -o"
        )
    for path in traces:
        path.unlink(missing_ok=True)  # another node's parent may have been first
    (out / PROFILER_LOG).unlink(missing_ok=True)
    for folder in cycles:
        with contextlib.suppress(OSError):  # one that holds other files stays
            folder.rmdir()
    return None


def _files_written_to(out: Path) -> tuple[list[Path], list[Path]]:
    """The per-cycle folders in `out` and the files in it and in them, where a capture
    writes its traces; none when `out` is not a folder."""
    if not out.is_dir():
        return [], []
    cycles = [p for p in out.iterdir() if p.is_dir() and CYCLE_FOLDER.fullmatch(p.name)]
    return cycles, [p for folder in (out, *cycles) for p in folder.iterdir() if p.is_file()]


def _in_step_order(name: str) -> tuple[list[int], str]:
    """Sort key: step5/ before step10/, rank2 before rank10."""
    return [int(x) for x in re.findall(r"\d+", name)], name


def _is_leftover(path: Path) -> bool:
    """A temporary file of a `perfcast profile` that was killed while writing its trace."""
    return bool(_OWN_TEMPORARY.fullmatch(path.name))


def _is_own(path: Path) -> bool:
    """A trace (or temporary file) that `perfcast profile` writes, where it writes it: named
    as it names them and, for a trace, holding the keys it records at the top (a user's own
    rank0.json.gz copied into the folder is not its to delete)."""
    if _is_leftover(path):
        return True
    if not _OWN_TRACE.fullmatch(path.name):
        return False
    try:
        with gzip.open(path, "rb") as fh:
            return b'"perfcast_' in fh.read(1 << 16)
    except (OSError, EOFError):  # not gzip, cut short, unreadable: not provably ours
        return False


def _unwritable(out: Path) -> str | None:
    """Why traces cannot be written to `out`, before the script runs: the profiler's own
    export fails silently, and the script would train to the end for nothing."""
    why = unwritable_folder(out)
    return f"cannot write traces to {out} ({why}); choose another -o" if why else None


def _print_script_traceback(exc: BaseException) -> None:
    """The script's exception as `python script.py` shows it: from the script's first
    frame, without perfcast's and runpy's frames above it."""
    tb = exc.__traceback__
    while tb is not None and (
        tb.tb_frame.f_code.co_filename == __file__
        or tb.tb_frame.f_globals.get("__name__") == "runpy"
    ):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def _remove_if_empty(out: Path) -> None:
    """A folder this run made and wrote no trace to goes again, with its log when that holds
    only the profiler's start and stop lines (anything else may say why: it stays)."""
    log = out / PROFILER_LOG
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if log.is_file() and all(
            line.startswith("USDT:") for line in log.read_text().splitlines() if line.strip()
        ):
            log.unlink()
        out.rmdir()


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints the message and exits 1
    return 1
