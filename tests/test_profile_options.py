"""`perfcast profile`'s own options: given once, as every other command's, and handed on to
a launcher's workers without the user's output folder (they get it as an absolute path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfcast.capture.profiler import _drop_options, run_profile


def test_profile_refuses_an_output_given_twice_with_two_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # argparse kept the last: the traces went to b while the user also named a.
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with pytest.raises(SystemExit) as exc:
        run_profile(["-o", a, "--output", b, "--", "python", "train.py"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "given twice" in err and "perfcast profile --help" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    ("argv", "kept"),
    [
        (["-o", "t", "--wait", "2"], ["--wait", "2"]),
        (["-ot", "--json"], []),
        (["--output=t", "--overw", "--with-stack"], ["--with-stack"]),
        (["--outp", "t", "--repeat=2", "--max-steps", "9"], ["--repeat=2", "--max-steps", "9"]),
        (["--out", "t", "--js"], []),
    ],
)
def test_workers_get_the_options_without_the_output_json_and_overwrite(
    argv: list[str], kept: list[str]
) -> None:
    # The parent adds `-o ABSOLUTE`: the user's own -o beside it was two values for one option.
    assert _drop_options(argv, {"out", "json", "overwrite"}) == kept
