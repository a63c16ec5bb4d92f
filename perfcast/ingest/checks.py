"""Types at the door: the JSON type each event field must have, and what was dropped.

The fast decoder types every event field it reads (`schema.FastEvent`), so a well-formed
trace is validated by msgspec while it is decoded. A slice that fails that is decoded again
with the lenient structs (fields of any type) and every event is checked here. An event
with a field of the wrong type (a list where a name should be, an object as a timestamp)
is dropped and counted: it never reaches the graph. Values inside `args` are optional
extras and some real traces write them as strings ("stream": "7"); one of an unexpected
type counts as absent (the normalizer converts each one defensively).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# (field, accepted Python types, what the message says is expected); None is always allowed.
EVENT_TYPES: tuple[tuple[str, tuple[type, ...], str], ...] = (
    ("ph", (str,), "a string"),
    ("cat", (str,), "a string"),
    ("name", (str,), "a string"),
    ("pid", (int, str), "a whole number or a string"),
    ("tid", (int, str), "a whole number or a string"),
    ("ts", (int, float), "a number"),
    ("dur", (int, float), "a number"),
    ("id", (int, str), "a whole number or a string"),
)


def json_type(value: Any) -> str:
    """How JSON would name the value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    return "an object"


def check_event(ev: Any) -> str | None:
    """Why the (lenient) event must be dropped, or None to keep it.

    Keeps what it can: a pid or tid beyond 64 bits becomes a named id, like "Spans".
    """
    for attr, types, expected in EVENT_TYPES:
        value = getattr(ev, attr)
        if value is None:
            continue
        if type(value) is bool or not isinstance(value, types):
            # a float where a whole number goes: the value says more than "a number"
            shown = repr(value) if isinstance(value, float) else json_type(value)
            return f"'{attr}' is {shown}, expected {expected}"
    for attr in ("pid", "tid"):
        value = getattr(ev, attr)
        if type(value) is int and not INT64_MIN <= value <= INT64_MAX:
            setattr(ev, attr, str(value))
    return None


@dataclass
class DropLog:
    """Events dropped while reading, by reason, with the first of each for the message."""

    counts: Counter[str] = field(default_factory=Counter)
    first: dict[str, str] = field(default_factory=dict)

    def add(
        self, key: str, detail: str, index: int | None, offset: int | None, unit: str = ""
    ) -> None:
        """Count one drop; `key` groups them ("'ph'"), `detail` is the first one's story;
        `offset` is a byte offset into the JSON, `unit` how to name it."""
        self.counts[key] += 1
        if key not in self.first:
            where = []
            if index is not None:
                where.append(f"event #{index:,}")
            if offset is not None:
                where.append(f"byte {offset:,}{unit}")
            self.first[key] = f"{' at '.join(where)}: {detail}" if where else detail

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def note(self) -> str | None:
        """One line for the trace's notes, or None when nothing was dropped."""
        if not self.counts:
            return None
        parts = [f"{key} {n:,}" for key, n in self.counts.most_common()]
        key = self.counts.most_common(1)[0][0]
        return (
            f"dropped {self.total:,} events whose fields have the wrong type or cannot be read "
            f"({', '.join(parts)}; first: {self.first[key]})"
        )
