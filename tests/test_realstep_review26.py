"""Session-26 review of the step without the profiler and its calibration files."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfcast import calibration
from perfcast.errors import PerfcastError


def test_calibration_nested_too_deeply_is_a_clear_error(tmp_path: Path) -> None:
    # json.loads raises RecursionError past the interpreter's limit: that escaped load()
    # and the CLI reported an internal error about the trace, not the calibration file.
    path = tmp_path / "cal.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(PerfcastError, match="nested too deeply"):
        calibration.load(path)
