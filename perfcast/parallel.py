"""Work spread over local processes: one trace file per task.

Many-rank folders are loaded with a process pool (the standard library's
concurrent.futures); one process per core at most, and only when the input
is big enough for the pool's start-up to pay off.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

MIN_FILES = 4
MIN_BYTES = 32 << 20  # below this, forking costs more than it saves


def worker_count(paths: Sequence[str]) -> int:
    """How many processes to use for these files (1: stay in this process)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if not cores or cores < 2 or len(paths) < MIN_FILES:
        return 1
    total = sum(os.path.getsize(p) for p in paths if os.path.isfile(p))
    if total < MIN_BYTES:
        return 1
    return min(cores, len(paths))


def map_ordered(fn: Callable[[T], R], items: Sequence[T], workers: int) -> Iterator[R]:
    """fn over items, results in input order; in-process when workers <= 1."""
    if workers <= 1:
        for item in items:
            yield fn(item)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        yield from pool.map(fn, items)
