"""Every what-if option given a value it cannot use gets a one-line error, never an internal
one: each model's every option with empty, negative, non-finite, huge and wrong-kind values
on a recorded GPU trace."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import perfcast
from perfcast.errors import PerfcastError
from perfcast.whatif.registry import MODEL_MODULES, get_model

TRACE = Path(__file__).parents[1] / "benchmarks/accuracy/recorded/traces/h100/mlp_fused.json.gz"
ODD_VALUES = ("", "0", "-1", "nan", "inf", "-inf", "abc", "1e99", "0.0001", "forward+nope")


@pytest.fixture(scope="module")
def table() -> perfcast.EventTable:
    return perfcast.load(str(TRACE))


@pytest.mark.parametrize("model", sorted(MODEL_MODULES))
def test_odd_option_values_are_refused_in_one_line(table, model: str) -> None:
    fields = [f.name for f in dataclasses.fields(get_model(model).Options)]
    for field in fields:
        for value in ODD_VALUES:
            spec = f"{model}:{field}={value}"
            try:
                perfcast.predict(table, spec)
            except PerfcastError as exc:
                assert "\n" not in str(exc), spec
            except Exception as exc:  # an internal error: the bug this test is for
                pytest.fail(f"{spec}: {type(exc).__name__}: {exc}")


def test_a_yes_no_option_refuses_other_words() -> None:
    """`shapes=maybe` once read as false, silently."""
    from perfcast.whatif.registry import build_options

    assert build_options("remove-host-sync", {"shapes": "Yes"}).shapes is True
    assert build_options("remove-host-sync", {"shapes": "off"}).shapes is False
    with pytest.raises(PerfcastError, match=r"shapes=maybe .* is not true or false"):
        build_options("remove-host-sync", {"shapes": "maybe"})
