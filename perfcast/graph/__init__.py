"""Dependency graph of CPU work, runtime calls and GPU tasks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perfcast.graph.model import Graph, NodeKind

if TYPE_CHECKING:
    from perfcast.graph.build import build_graph

__all__ = ["Graph", "NodeKind", "build_graph"]


def __getattr__(name: str) -> Any:
    # The builder pulls in numba; modules that only need the model or phases skip it.
    if name == "build_graph":
        from perfcast.graph.build import build_graph

        return build_graph
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
