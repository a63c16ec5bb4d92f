"""Dependency graph of CPU work, runtime calls and GPU tasks."""

from perfcast.graph.build import build_graph
from perfcast.graph.model import Graph, NodeKind

__all__ = ["Graph", "NodeKind", "build_graph"]
