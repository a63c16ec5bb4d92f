"""Where perfcast keeps files of its own (never next to the user's traces), and where the
profiler's own messages go."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path


def not_a_file(path: str | os.PathLike[str], folders: bool = False) -> str | None:
    """Why `path` cannot be read as an input file (a pipe, a FIFO, a device: reading one
    may wait forever for a writer, and its contents cannot be read twice), else None; a
    folder is fine where `folders`. A path that does not exist is for the caller to say."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or (folders and stat.S_ISDIR(mode)):
        return None
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    if stat.S_ISFIFO(mode):
        return "is a pipe, not a file: save what it holds to a file first"
    return "is a device, not a file" if stat.S_ISCHR(mode) else "is not a regular file"


def unwritable_folder(folder: str | os.PathLike[str]) -> str | None:
    """Why files cannot be written into `folder`, else None, found before the work that
    would fill it: the folder (and any missing above it) is made, a temporary file written
    in it, and everything made removed again."""
    import tempfile

    target = Path(folder)
    made = []  # folders made for the probe, removed again: nothing is left on a failure
    current = target.absolute()
    while not current.exists() and current != current.parent:
        made.append(current)
        current = current.parent
    if not current.is_dir():
        return f"{current} is a file, not a folder"
    try:
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target, prefix=".perfcast-probe-"):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        for path in made:  # deepest first
            with contextlib.suppress(OSError):
                path.rmdir()
    return None


def standard_stream(path: str | os.PathLike[str]) -> str | None:
    """'standard output' or 'standard error' when `path` is this process's own (/dev/stdout,
    /proc/self/fd/1, the file stdout is redirected to), else None. /dev/null is never:
    what goes there is dropped, mixed or not."""
    if os.path.realpath(path) == os.devnull:
        return None
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    for fd, name in ((1, "standard output"), (2, "standard error")):
        try:
            own = os.fstat(fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino):
            return name
    return None


def user_cache_dir() -> Path:
    """perfcast's folder in the user's cache: $XDG_CACHE_HOME/perfcast, else ~/.cache/perfcast.
    Not created here."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "perfcast"


@contextlib.contextmanager
def native_stderr_to(path: str | os.PathLike[str]) -> Iterator[None]:
    """Send what native code writes to stderr (fd 2) to `path` (appended) for the duration.

    Kineto prints lines of its own ("USDT: ... profiler_start") on fd 2 each time a profiler
    starts or stops; Python's sys.stderr is flushed before and after so no message of ours
    is lost or misplaced. If `path` cannot be opened nothing is redirected.
    """
    try:
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(target, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)


def write_output(
    path: str | os.PathLike[str], data: bytes | bytearray | memoryview | Iterable[bytes]
) -> None:
    """Write `data` (bytes, or chunks of them as they are made, so that a large output is
    never whole in memory) to the user's output `path`, never leaving half a file behind.

    A regular file (new or replaced) is written to a temporary file beside it and renamed
    over it, with the permissions of the file it replaces (a private 0600 file stays
    private) or those a new file would get. A symbolic link is followed: its
    target is written that way and the link stays. Anything else that exists (a FIFO read by
    another program, /dev/stdout, /dev/null) is written through, as a shell redirection
    would: renaming over it would replace a device node with a file.
    """
    import stat
    import tempfile

    chunks = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    target = os.path.realpath(path)  # a link's target; the path itself otherwise
    try:
        mode: int | None = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        with open(target, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
        return
    fd, tmp = tempfile.mkstemp(prefix=".perfcast-", dir=os.path.dirname(target))
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
        # mkstemp makes it private; a new output is not, a replaced one keeps its mode.
        os.chmod(tmp, stat.S_IMODE(mode) if mode is not None else 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
