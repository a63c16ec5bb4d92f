"""Compiling hot loops with numba, with its cache kept out of site-packages.

numba caches compiled code next to the module by default, i.e. inside the
installed package: that may be read-only, and files left there survive an
uninstall and can shadow a later install. perfcast's cache lives in the user's
cache folder instead; where no folder is writable, code is compiled per process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfcast.paths import user_cache_dir

try:  # numba is optional: callers fall back to plain Python without it.
    import numba

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - depends on the environment
    numba = None  # type: ignore[assignment]
    HAVE_NUMBA = False


def _cache_dir() -> Path | None:
    path = user_cache_dir() / "numba"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return path if os.access(path, os.W_OK) else None


def compile_loop(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn compiled with numba (cached when possible), or fn itself without numba."""
    if not HAVE_NUMBA:
        return fn
    cache = _cache_dir()
    if cache is not None and not os.environ.get("NUMBA_CACHE_DIR"):
        numba.config.CACHE_DIR = str(cache)  # type: ignore[attr-defined]
    return numba.njit(cache=cache is not None, nogil=True)(fn)
