"""The error model. The CLI prints one line per error and exits with its code.

    PerfcastError (exit 2)  a problem with the user's input or request: the message says
                            which file, where in it and what to do.
    InternalError (exit 3)  an invariant of perfcast itself failed (a bug, not the user's
                            doing): the message says so, names the trace, asks for a report.

Any other exception that reaches the CLI is reported as an internal error too; only
`perfcast --debug` shows tracebacks.
"""

from __future__ import annotations

REPORT_HINT = "please report it with this line and, if you can share it, the trace"


_MAX_LINE = 1200  # a trace's 100,000-character kernel name must not become the message


def one_line(text: str) -> str:
    """`text` as one printable line: whitespace folded, other control characters escaped
    (a name with a terminal escape sequence in it prints as text), and the middle of a very
    long message elided (its start names the file, its end says what to do)."""
    text = " ".join(text.split())
    if not text.isprintable():
        text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    if len(text) > _MAX_LINE:
        text = f"{text[: _MAX_LINE * 2 // 3]} [...] {text[-_MAX_LINE // 3 :]}"
    return text


class PerfcastError(Exception):
    """A problem with the user's input or request; never a bug in perfcast."""

    exit_code = 2

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None):
        self.path = path
        self.hint = hint
        text = f"{path}: {message}" if path else message
        if hint:
            text = f"{text} ({hint})"
        super().__init__(one_line(text))


class OptionError(PerfcastError):
    """A command-line option or an API argument of the wrong type, out of range or unknown:
    the message names it, and the command line does not put the trace's path in front of it
    (the trace is not at fault)."""


class TraceFormatError(PerfcastError):
    """The file is not a usable Kineto / Chrome trace."""


class NotATraceError(TraceFormatError):
    """The file holds no trace at all (empty, not JSON, JSON without events, a timeline
    perfcast exported): in a folder of ranks it is left out, and said to be. `output`: it is
    JSON of another kind (a saved result, an export), likely written into the folder."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        hint: str | None = None,
        output: bool = False,
    ) -> None:
        super().__init__(message, path=path, hint=hint)
        self.output = output


class UnreadableTraceError(TraceFormatError):
    """Nothing of the file can be read: no permission, cut or damaged before its first
    event. In a folder of ranks it is left out (the other ranks are read), and said to be;
    given alone, it is an error."""


class NotApplicableError(PerfcastError):
    """A what-if that does not apply to this trace (e.g. ddp on a CPU-only trace)."""


class OptionValueError(OptionError, NotApplicableError):
    """A what-if option with a value the model cannot take (gpus=0, dtype=fp8): an OptionError
    to the caller, and still a NotApplicableError to code that tries what-ifs one by one."""


class InternalError(RuntimeError):
    """perfcast broke one of its own invariants (e.g. a dependency cycle the graph builder
    should have removed). Not the user's fault: the message asks for a report."""

    exit_code = 3

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.path = path
        where = f" while processing {path}" if path else ""
        super().__init__(one_line(f"internal error{where}: {message}; {REPORT_HINT}"))


def describe_internal(exc: BaseException, path: str | None) -> str:
    """The one line for an unexpected exception: what it was, on which trace, what to do."""
    if isinstance(exc, InternalError):
        text = str(exc)
        if path and exc.path is None:
            text = text.replace("internal error:", f"internal error while processing {path}:", 1)
        return f"{text} (--debug shows the traceback)"
    detail = one_line(str(exc))
    if len(detail) > 200:
        detail = detail[:200] + "..."
    kind = type(exc).__name__
    where = f" while processing {path}" if path else ""
    return (
        f"internal error{where}: {kind}{': ' + detail if detail else ''}; {REPORT_HINT} "
        "(--debug shows the traceback)"
    )


def whole_number(
    name: str, value: object, minimum: int | None = 1, maximum: int | None = None
) -> int:
    """An integer argument (a count, a size, a rank) of at least `minimum` (None: any): a
    wrong type or value stops where it enters, with its name, instead of as a slice that
    means something else (top=-1: all but one) or a TypeError from deep inside."""
    import numbers

    # numbers.Integral: numpy's integers too (a count taken from an array); not a bool.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise OptionError(f"{name} must be an integer, not {value!r}")
    number = int(value)
    if minimum is not None and number < minimum:
        raise OptionError(f"{name} must be at least {minimum}, not {number}")
    if maximum is not None and number > maximum:
        raise OptionError(f"{name} must be at most {maximum:,}, not {number:,}")
    return number
