"""Where perfcast keeps files of its own (never next to the user's traces)."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    """perfcast's folder in the user's cache: $XDG_CACHE_HOME/perfcast, else ~/.cache/perfcast.
    Not created here."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "perfcast"
