"""The fuzz campaign's own bookkeeping (the campaign itself runs for hours, outside the suite)."""

from __future__ import annotations

import pytest

from benchmarks import fuzz_campaign


@pytest.mark.parametrize(
    "path",
    ["/tmp/fuzz/inputs/in-1.json.gz", ".bench/fuzz/inputs/in-1.json.gz", "rel/in-1.json"],
)
def test_errors_group_by_kind_whatever_the_output_folder(path: str) -> None:
    """Absolute and relative input paths blank alike, so one kind of error is one group."""
    message = f"perfcast: error: {path}: is not JSON (line 3, column 7)\n"
    assert fuzz_campaign._normalize_message(message) == "perfcast: error: PATH: is not JSON (...)"
