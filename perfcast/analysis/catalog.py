"""The names and one-line titles of `perfcast analyze`'s analyses, in the report's order.

Kept apart from `battery` (which imports every analysis, numba among them) so that building
the command line costs nothing.
"""

from __future__ import annotations

TITLES: dict[str, str] = {
    "kernels": "GPU kernels by kind, top kernels",
    "idle": "GPU idle time per stream, by cause",
    "launches": "kernel launch statistics",
    "queue": "launch-queue length and blocked launches",
    "memory": "memory timeline and copy bandwidth",
    "stragglers": "stragglers across ranks",
    "collectives": "size, algorithm and bus bandwidth of each collective",
    "roofline": "per-op roofline from shapes",
    "scopes": "record_function and module scopes",
    "ops": "kernels by launching ATen op",
    "counters": "GPU performance counters per kernel and op (CUPTI range profiler)",
}
