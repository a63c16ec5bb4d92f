"""The same figure is the same wherever perfcast shows it: across commands, their text and
--json outputs, and the Python API."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import perfcast
from perfcast.cli.main import main
from tests.tracegen import TraceBuilder

EXAMPLE = Path(__file__).resolve().parents[1] / "perfcast" / "examples" / "ddp_a100_rank0.json.gz"


def test_replay_keeping_the_profiler_cost_shows_no_step_without_the_profiler(capsys):
    """With --keep-profiler-cost each step's real_ms is its traced time: replay's table said so
    under "without profiler ms" while summary and the report show no such column."""
    assert main(["replay", str(EXAMPLE), "--keep-profiler-cost", "-q"]) == 0
    kept = capsys.readouterr().out.split("┘")[0]  # the step table
    assert "profiler" not in kept and "222.44" in kept
    assert main(["summary", str(EXAMPLE), "--keep-profiler-cost", "-q"]) == 0
    assert "profiler" not in capsys.readouterr().out.split("GPU columns")[0]
    # Without the flag the column is there, with the estimate summary shows.
    assert main(["replay", str(EXAMPLE), "-q"]) == 0
    text = capsys.readouterr().out.split("┘")[0]
    assert main(["summary", str(EXAMPLE), "-q", "--json"]) == 0
    real = json.loads(capsys.readouterr().out)["ranks"][0]["iterations"][0]["real_ms"]
    assert "profiler" in text and f"{real:.2f}" in text


def _rank_file(path: Path, rank: int, kernels: list[str]) -> None:
    b = TraceBuilder()
    b.step(1, 0, 100)
    for i, name in enumerate(kernels):
        b.launch(name, 10 + 10 * i, 5, 20 + 10 * i, 4)
    doc = b.doc()
    doc["distributedInfo"] = {"rank": rank, "world_size": 2, "backend": "nccl"}
    path.write_text(json.dumps(doc))


def test_a_ranks_top_lists_are_the_same_in_its_folder_and_alone(tmp_path):
    """Kernels of equal time were listed in the order their names were first read: in a
    folder, another rank's file could read one first, and the rank's top list differed."""
    folder = tmp_path / "ranks"
    folder.mkdir()
    _rank_file(folder / "rank0.json", 0, ["alpha_kernel"])
    _rank_file(folder / "rank1.json", 1, ["zeta_kernel", "alpha_kernel"])
    both = perfcast.summary(perfcast.load(str(folder)), top=1, correct=False)
    alone = perfcast.summary(perfcast.load(str(folder / "rank1.json")), top=1, correct=False)
    assert [rs.rank for rs in both.ranks] == [0, 1] and alone.ranks[0].rank == 1
    for name in ("top_kernels", "top_ops", "top_scopes"):
        assert getattr(both.ranks[1], name) == getattr(alone.ranks[0], name), name
    assert both.ranks[1].top_kernels[0].name == "alpha_kernel"
    # analyze's launch statistics pick each rank's top kernels the same way
    rows = perfcast.launch_stats(perfcast.load(str(folder)), top=1).by_kernel
    alone_rows = perfcast.launch_stats(perfcast.load(str(folder / "rank1.json")), top=1).by_kernel
    assert [r for r in rows if r.rank == 1] == alone_rows
    assert alone_rows[0].name == "alpha_kernel"


def test_tree_names_kernels_as_the_other_tables_do(capsys):
    """Every table drops CUDA's "void " before a kernel's name (--json keeps it); `tree`,
    `tree --bottom-up` and `whatif --tree` printed it, so one kernel read two ways."""
    assert main(["summary", str(EXAMPLE), "-q", "--keep-profiler-cost"]) == 0
    assert "cudnn::ops::nchwToNhwcKernel<" in capsys.readouterr().out
    for argv in (
        ["tree", str(EXAMPLE), "--bottom-up", "--min-pct", "0.5"],
        ["whatif", str(EXAMPLE), "--apply", "cuda-graphs", "--tree", "--min-pct", "0.5"],
    ):
        assert main([*argv, "-q"]) == 0
        out = capsys.readouterr().out
        # a name starts after a tree guide or a bottom-up call count
        assert re.search(r"([─├└] |×  )cudnn::", out), argv
        assert not re.search(r"([─├└] |×  )void ", out), argv


def test_summary_steps_table_has_the_gpu_busy_time_its_json_has(capsys):
    """--json gave each step's GPU busy time; `to_pandas("steps")` left it out."""
    assert main(["summary", str(EXAMPLE), "-q", "--json", "--keep-profiler-cost"]) == 0
    its = json.loads(capsys.readouterr().out)["ranks"][0]["iterations"]
    steps = perfcast.summary(perfcast.load(str(EXAMPLE)), correct=False).to_pandas("steps")
    assert list(steps["gpu_busy_ms"]) == [it["gpu"]["busy_ms"] for it in its]
    assert list(steps["gpu_idle_ms"] + steps["gpu_busy_ms"]) == [
        pytest.approx(it["traced_ms"]) for it in its
    ]


def test_replay_names_the_device_as_summary_does(capsys) -> None:
    """replay's `device` was the device table's match ("A100-SXM4-40GB") where summary and
    the report show the trace's own name ("NVIDIA A100-PG509-200"): one GPU, two names.
    The match is `device_model` beside it."""
    docs = {}
    for command in ("summary", "replay"):
        assert main([command, str(EXAMPLE), "--json", "-q"]) == 0
        docs[command] = json.loads(capsys.readouterr().out)
    summary, replay = docs["summary"], docs["replay"]
    assert replay["ranks"][0]["device"] == summary["ranks"][0]["device"] == "NVIDIA A100-PG509-200"
    assert replay["ranks"][0]["device_model"] == "A100-SXM4-40GB"
