"""``perfcast profile -- torchrun ... train.py``: profile every rank a launcher starts.

The profiler has to run inside each worker process, so perfcast cannot wrap the launcher
in-process. Instead it rewrites the command so that the launcher starts
``python -m perfcast profile [the same options] -- train.py ...`` as each worker, runs it,
and reports the traces the workers wrote (one per rank, named by their ``RANK``). The
launcher's own options (``--nproc-per-node``, ``--nnodes``, rendezvous, ...) are kept as the
user gave them; torchrun's own parser finds where they end.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

# Set for the workers a launcher starts: the parent prepared the output folder, and the
# workers report to stderr so that the parent's report (or --json) is the command's output.
LAUNCHED_ENV = "PERFCAST_PROFILE_LAUNCHED"

_LAUNCHER_MODULES = ("torch.distributed.run",)


def is_launched_worker() -> bool:
    return os.environ.get(LAUNCHED_ENV) == "1"


def launcher_args(
    cmd: Sequence[str], kind: str, target: str, args: Sequence[str]
) -> list[str] | None:
    """The launcher's own arguments when ``cmd`` starts a launcher that perfcast can profile
    through (torchrun, ``python [flags] -m torch.distributed.run``); None for a plain script
    or module. ``kind``, ``target`` and ``args`` are the command as `_parse_target` read it."""
    if cmd and Path(cmd[0]).name == "torchrun":
        return list(cmd[1:])
    if kind == "module" and target in _LAUNCHER_MODULES:
        return list(args)
    if kind == "module" and target == "torch.distributed.launch":
        raise ValueError(
            "torch.distributed.launch is deprecated and passes --local-rank to the "
            "script; use torchrun (the same options) instead"
        )
    return None


def worker_command(launcher: Sequence[str], profile_options: Sequence[str]) -> list[str]:
    """The command that runs the launcher with ``perfcast profile`` as every worker.

    ``launcher``: the launcher's arguments, e.g. ``--nproc-per-node=2 train.py --lr 3``;
    ``profile_options``: perfcast profile's own options, passed on to each worker."""
    from torch.distributed.run import get_args_parser

    message = io.StringIO()
    try:
        with contextlib.redirect_stderr(message):
            parsed = get_args_parser().parse_args(list(launcher))
    except SystemExit:
        said = message.getvalue().strip().splitlines()
        why = said[-1].split(": error: ")[-1] if said else "could not read its arguments"
        raise ValueError(f"torchrun: {why}") from None
    if parsed.no_python:
        raise ValueError(
            "torchrun --no-python starts a program that is not Python; perfcast profile needs "
            "a Python script or module"
        )
    if parsed.run_path:
        raise ValueError(
            "torchrun --run-path runs the script by its path in torchrun's own process; "
            "perfcast profile needs each worker to start as a Python process: drop it"
        )
    script_at = len(launcher) - len(parsed.training_script_args) - 1
    if launcher[script_at] != parsed.training_script:
        script_at -= 1  # argparse dropped a "--" right after the script
    own = [a for a in launcher[:script_at] if a not in ("-m", "--module")]
    target = ["python", "-m", parsed.training_script] if parsed.module else [parsed.training_script]
    script_args = list(launcher[script_at + 1 :])  # as given, a "--" included
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *own,
        "-m",
        "perfcast",
        "profile",
        *profile_options,
        "--",
        *target,
        *script_args,
    ]


def run_launcher(command: Sequence[str]) -> int:
    """Run the rewritten launcher command; the workers know they were launched."""
    env = {**os.environ, LAUNCHED_ENV: "1"}
    try:
        return subprocess.run(list(command), env=env, check=False).returncode
    except KeyboardInterrupt:
        return 130
