"""What every result should say about its input: salvaged data, missing steps, warnings."""

from __future__ import annotations

from perfcast.events import EventTable, RankInfo


def rank_notes(info: RankInfo) -> list[str]:
    notes = list(info.warnings)
    if info.truncated:
        notes.append(f"truncated trace: {info.salvage_note}")
    if not info.has_steps:
        notes.append("no ProfilerStep#N in this trace: the whole trace is one window")
    return notes


def input_notes(table: EventTable) -> list[str]:
    """Notes for all ranks, each prefixed with its rank when there are several."""
    many = len(table.ranks) > 1
    return [
        f"rank {info.rank}: {note}" if many else note
        for info in table.ranks
        for note in rank_notes(info)
    ]
