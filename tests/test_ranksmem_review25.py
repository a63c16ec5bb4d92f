"""Memory on many ranks: what the graph build, the replay and the JSON output hold at their
peaks (structural checks: which buffers exist, never an RSS threshold)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import perfcast
import perfcast.graph.build as build
from perfcast.graph.lower import Lowered
from perfcast.graph.model import EdgeType, Graph
from perfcast.sim.timeline import simulate

TWO_RANKS = Path(__file__).parent / "data" / "fuzz" / "seeds" / "dlrm_v100_2rank"


@pytest.fixture(scope="module")
def table() -> perfcast.EventTable:
    return perfcast.load(str(TWO_RANKS))


def _state(g: Graph) -> tuple:
    return (
        {k: (v.dtype, v.tolist()) for k, v in g.cols.items()},
        [a.tolist() for a in g._edge_arrays()],
        dict(g.rank_clock_ns),
        list(g.assumptions),
    )


def test_collective_waits_are_added_without_a_copy_of_the_graph(
    table: perfcast.EventTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The undo point for a cycle was a deep copy of every node column: on 128 ranks the
    # build's peak (64 MiB of 503k nodes beside the graph itself).
    copies: list[object] = []
    real_copy = Graph.copy

    def counting_copy(self: Graph, writable: object = None) -> Graph:
        copies.append(writable)
        return real_copy(self, writable)  # type: ignore[arg-type]

    monkeypatch.setattr(Graph, "copy", counting_copy)
    g = build.build_graph(table)
    assert "collectives_unmatched" not in g.unresolved
    assert (g.edge_type == EdgeType.COLLECTIVE).any()
    assert copies == []


def test_a_cycle_undoes_the_collective_waits_exactly(
    table: perfcast.EventTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Undone by cutting the appended nodes and edges and putting back the overwritten
    # columns: the graph is the one built without cross-rank waits, counted as unmatched.
    with monkeypatch.context() as m:
        m.setattr(build, "add_collective_waits", lambda graph, matches=None: 0)
        without = build.build_graph(table)
    with monkeypatch.context() as m:
        m.setattr(build, "cyclic_node_count", lambda low: 1)
        undone = build.build_graph(table)
    assert undone.unresolved.pop("collectives_unmatched") == 1
    assert undone.unresolved == without.unresolved
    assert _state(undone) == _state(without)
    assert len(undone) < len(build.build_graph(table))
    assert np.array_equal(undone.cols["dur"], without.cols["dur"])


def test_a_timeline_keeps_no_dependency_arrays_nor_a_second_copy_of_the_times(
    table: perfcast.EventTable,
) -> None:
    # Each timeline held the lowered graph (its CSR dependency arrays, used by the replay
    # only) and copies of the replayed times: 47 MiB a timeline on 128 DLRM ranks, of which
    # about 27 served nothing after the replay.
    g = build.build_graph(table)
    tl = simulate(g)
    assert not any(isinstance(v, Lowered) for v in vars(tl).values())
    assert np.shares_memory(tl.start, tl.replay.start) and np.shares_memory(tl.end, tl.replay.end)
    assert tl.nodes.tolist() == list(range(len(g)))
    # With nodes removed the times are per graph node, -1 for the removed ones.
    cut = g.copy()
    cut.remove(np.array([0]))
    tl_cut = simulate(cut)
    assert tl_cut.start[0] == -1 and tl_cut.end[0] == -1
    assert tl_cut.start[1:].tolist() == tl_cut.replay.start.tolist()
    assert tl_cut.nodes.tolist() == list(range(1, len(g)))
