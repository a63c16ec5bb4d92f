"""Work spread over local processes, or a Ray cluster when asked: one trace file per task.

Many-rank folders are loaded with a process pool (the standard library's
concurrent.futures); one process per core at most, and only when the input
is big enough for the pool's start-up to pay off.

`ray_backend(address)` sends the same tasks to Ray instead (`pip install 'ray>=2.9'`, or
`'.[ray]'` in the checkout; `perfcast plan --ray [ADDRESS]`): the same function runs on the
same items, results come back in input order, and nothing else in the code path changes.
Ray is never imported unless asked for.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import multiprocessing
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MIN_FILES = 4
MIN_BYTES = 32 << 20  # below this, forking costs more than it saves


def worker_count(paths: Sequence[str]) -> int:
    """How many processes to use for these files (1: stay in this process)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if not cores or cores < 2 or len(paths) < MIN_FILES:
        return 1
    if multiprocessing.current_process().daemon:
        # Inside a multiprocessing.Pool worker (a user's, or a harness's): such a process may
        # start no children ("daemonic processes are not allowed to have children").
        return 1
    total = sum(os.path.getsize(p) for p in paths if os.path.isfile(p))
    if total < MIN_BYTES:
        return 1
    return min(cores, len(paths))


# The active Ray backend: None (local processes) or {"address": ...}.
_RAY: dict[str, Any] | None = None
# Tasks in flight at once on Ray: enough to keep a cluster busy, few enough that results
# (a rank's columns) do not pile up in this process's memory.
RAY_WINDOW = 64


@contextlib.contextmanager
def ray_backend(address: str | None = None) -> Iterator[None]:
    """Run `map_ordered` on Ray inside this block: `address` of a running cluster
    ("ray://host:10001", "auto"), or None for a local instance started here."""
    global _RAY
    try:
        import ray
    except ImportError:
        from perfcast.errors import PerfcastError

        raise PerfcastError("Ray is not installed", hint="pip install 'ray>=2.9'") from None
    started = False
    if not ray.is_initialized():
        if address:
            _check_reachable(address)
        # Ray's INFO lines ("Connecting to existing Ray cluster ...") are not the user's
        # business: perfcast says what it loads; warnings and errors still show.
        kwargs: dict[str, Any] = {
            "ignore_reinit_error": True,
            "log_to_driver": False,
            "logging_level": logging.WARNING,
        }
        if address:
            kwargs["address"] = address
        else:
            kwargs["include_dashboard"] = False
        try:
            ray.init(**kwargs)
        except Exception as exc:  # ConnectionError, TimeoutError, or Ray's bare Exception
            from perfcast.errors import PerfcastError

            # The cluster, the address or this machine's resources are at fault, not
            # perfcast: it read as an internal error asking for a bug report (exit 3).
            where = f"connect to the Ray cluster at {address}" if address else "start Ray here"
            raise PerfcastError(
                f"could not {where} ({type(exc).__name__}: {exc})",
                hint="check the address and the cluster, or leave out --ray to load the "
                "rank files with this machine's processes",
            ) from None
        started = True
    previous, _RAY = _RAY, {"address": address}
    try:
        yield
    finally:
        _RAY = previous
        if started:
            ray.shutdown()


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Refuse at once an address where nothing listens: Ray retried for minutes, printing
    its own connection warnings, before it gave up (`--ray 10.0.0.9:6379` with no cluster)."""
    host_port = address.removeprefix("ray://")
    host, sep, port = host_port.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return  # "auto", or a form Ray resolves itself
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        from perfcast.errors import PerfcastError

        raise PerfcastError(
            f"no Ray cluster answers at {address} ({exc.strerror or type(exc).__name__})",
            hint="start the cluster (ray start --head) or check the address, or leave out "
            "--ray to load the rank files with this machine's processes",
        ) from None


def backend() -> str:
    """ "ray" inside `ray_backend`, else "local"."""
    return "ray" if _RAY is not None else "local"


def _ray_map(fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
    import ray

    remote = ray.remote(fn)
    refs: list[Any] = []
    nxt = 0
    for i in range(len(items)):
        while nxt < len(items) and nxt < i + RAY_WINDOW:
            refs.append(remote.remote(items[nxt]))
            nxt += 1
        # Results come back as read-only views of Ray's object store; callers may write
        # into them (the loader re-interns name columns in place), so hand over copies.
        yield copy.deepcopy(ray.get(refs[i]))
        refs[i] = None  # let Ray free the result


def map_ordered(fn: Callable[[T], R], items: Sequence[T], workers: int) -> Iterator[R]:
    """fn over items, results in input order; on Ray inside `ray_backend`, else in-process
    when workers <= 1, else on a local process pool."""
    if _RAY is not None and len(items) > 1:
        yield from _ray_map(fn, items)
        return
    if workers <= 1:
        for item in items:
            yield fn(item)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        yield from pool.map(fn, items)
