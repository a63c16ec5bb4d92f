"""Discrete-event replay of a dependency graph."""

from perfcast.sim.timeline import Timeline, simulate

__all__ = ["Timeline", "simulate"]
