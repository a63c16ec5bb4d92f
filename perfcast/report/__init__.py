"""Renderers: terminal tables, HTML, Perfetto, flame graphs. They format; they compute nothing."""


def display_name(name: str) -> str:
    """A name as the tables show it: a CUDA kernel's `void` return type dropped (every
    kernel has it, and in a narrow column the wrap put it on a line of its own). --json and
    --csv keep the full name."""
    return name[5:] if name.startswith("void ") else name


def shorten(text: str, width: int) -> str:
    """`text` cut to `width` characters, an ellipsis marking the cut (at least the ellipsis)."""
    if len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + "…"
