"""Shared fixtures: the real traces in /work/shared/traces and tiny hand-made traces."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Real traces (the project's shared collection, see its MANIFEST.md): $PERFCAST_TRACES, else
# the shared folder next to the repository (<root>/shared/traces, <root>/main/tests).
TRACES_ENV = "PERFCAST_TRACES"
SHARED_TRACES = Path(
    os.environ.get(TRACES_ENV, "").strip() or Path(__file__).parents[2] / "shared" / "traces"
)
NO_TRACES = (
    f"real traces not found at {SHARED_TRACES} (no MANIFEST.md there); set {TRACES_ENV} "
    "to a folder holding the project's shared traces to run these tests"
)

WriteTrace = Callable[..., Path]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: reads a big real trace (seconds); -m 'not slow'")
    # A `perfcast calibrate` file in the developer's cache must not change expected numbers;
    # tests that want a calibration point PERFCAST_CALIBRATION at their own file.
    os.environ["PERFCAST_CALIBRATION"] = "off"


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller, before any test runs
        session.config.cache.set("perfcast/recorded_table", None)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print the recorded accuracy table (every GPU and CPU row) when its test ran, and say,
    not just count, why real-trace tests were skipped (a fresh clone has none)."""
    table = config.cache.get("perfcast/recorded_table", None)
    if table:
        terminalreporter.section("recorded accuracy (python -m benchmarks.accuracy)")
        terminalreporter.write_line(table)
    skipped = terminalreporter.stats.get("skipped", [])
    n = sum(1 for report in skipped if NO_TRACES in str(report.longrepr))
    if n:
        terminalreporter.write_line(f"{n} tests skipped: {NO_TRACES}", yellow=True, bold=True)


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The folder of real traces; tests that need it are skipped where it is absent (and the
    end of the run says how many, and why)."""
    if not (SHARED_TRACES / "MANIFEST.md").is_file():
        pytest.skip(NO_TRACES)
    return SHARED_TRACES


def write_json(path: Path, obj: Any, *, gz: bool | None = None) -> Path:
    """Write `obj` as JSON to `path`, gzipped when `gz` (default: by the .gz suffix)."""
    data = json.dumps(obj).encode()
    if gz is None:
        gz = path.suffix == ".gz"
    if gz:
        data = gzip.compress(data, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture
def write_trace(tmp_path: Path) -> WriteTrace:
    """`write_trace(obj, name="trace.json", gz=None)` -> path of `obj` written under tmp_path.

    `obj` is a trace dict, a bare list of events, or any JSON value (for bad-input tests);
    a name ending in .gz is gzipped. `name` may hold folders ("ranks/rank0.json").
    """

    def write(obj: Any, name: str = "trace.json", gz: bool | None = None) -> Path:
        return write_json(tmp_path / name, obj, gz=gz)

    return write
