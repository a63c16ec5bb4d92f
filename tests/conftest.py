"""Shared fixtures: the real traces in /work/shared/traces and tiny hand-made traces."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# The shared folder sits next to the repository: <root>/shared/traces, <root>/main/tests.
SHARED_TRACES = Path(__file__).parents[2] / "shared" / "traces"

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
    """Print the recorded accuracy table (every GPU and CPU row) when its test ran."""
    table = config.cache.get("perfcast/recorded_table", None)
    if table:
        terminalreporter.section("recorded accuracy (python -m benchmarks.accuracy)")
        terminalreporter.write_line(table)


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The folder of real traces; tests that need it are skipped where it is absent."""
    if not (SHARED_TRACES / "MANIFEST.md").is_file():
        pytest.skip(f"real traces not available at {SHARED_TRACES}")
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
