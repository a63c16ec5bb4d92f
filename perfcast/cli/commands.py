"""Subcommands beyond `summary`: replay, whatif, advise, report (registered by main)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def register(sub: Any, add_common: Callable[[Any], None], table: dict[str, Any]) -> None:
    """Add this module's subcommands to the parser and the dispatch table."""
    return None
