"""Errors a user can act on. The CLI prints `str(err)` as one line and exits with `exit_code`."""

from __future__ import annotations


class PerfcastError(Exception):
    """A problem with the user's input or request; never a bug in perfcast."""

    exit_code = 2

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None):
        self.path = path
        self.hint = hint
        text = f"{path}: {message}" if path else message
        if hint:
            text = f"{text} ({hint})"
        super().__init__(text)


class TraceFormatError(PerfcastError):
    """The file is not a usable Kineto / Chrome trace."""


class NotApplicableError(PerfcastError):
    """A what-if that does not apply to this trace (e.g. ddp on a CPU-only trace)."""
