"""The Perfetto export's launch-queue counters count launch calls, not kernels: a CUDA
graph's launch is one entry however many kernels it replays (as the analysis counts)."""

from __future__ import annotations

import json
from pathlib import Path

from perfcast.cli.main import main

GRAPH_TRACE = (
    Path(__file__).resolve().parents[1]
    / "benchmarks/accuracy/recorded/traces/h100/mlp_graph.json.gz"
)


def _max_pending(path: Path) -> int:
    doc = json.loads(path.read_text())
    pending = [
        e["args"]["pending"]
        for e in doc["traceEvents"]
        if e.get("ph") == "C" and e.get("name", "").startswith("launch queue")
    ]
    assert pending
    return max(pending)


def test_a_cuda_graph_launch_is_one_pending_launch(tmp_path: Path) -> None:
    # 3 cudaGraphLaunch calls of 4,722 kernels and 3 copies: the counter read up to 1,574
    # pending launches, where perfcast analyze's queue (and the replay's) never exceeds 2.
    out = tmp_path / "replay.json"
    assert main(["replay", str(GRAPH_TRACE), "--export-trace", str(out), "-q"]) == 0
    import perfcast

    queue_max = max(s.max_length for s in perfcast.analyze(str(GRAPH_TRACE)).queue.by_stream)
    assert _max_pending(out) <= max(queue_max, 2)
