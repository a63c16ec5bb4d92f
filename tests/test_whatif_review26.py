"""Session 26's review of the what-if options: each bad value is refused in one line that
names the what-if and the option, before any trace is read where the value alone says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfcast.errors import OptionError
from perfcast.whatif.registry import checked_specs

MLP = Path(__file__).parents[1] / "benchmarks/accuracy/recorded/traces/h100/mlp_base.json.gz"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("faster-op:pattern=(", "faster-op: pattern='(' is not a valid regular expression"),
        ("faster-op:module=[", "faster-op: module='[' is not a valid regular expression"),
        ("remove-host-sync:op=(", "remove-host-sync: op='(' is not a valid regular expression"),
        (
            "activation-checkpointing:module=(",
            "activation-checkpointing: module='(' is not a valid regular expression",
        ),
    ],
)
def test_a_bad_regular_expression_names_its_what_if_and_option(spec: str, says: str) -> None:
    """The error was "'(' is not a valid regular expression": with two patterns in one
    command (faster-op's pattern and module, or two --apply), it did not say which."""
    with pytest.raises(OptionError) as err:
        checked_specs([spec])
    assert str(err.value).startswith(says)
    assert "\n" not in str(err.value)
