"""Every what-if model over every real trace, checked against rules any prediction must keep.

    python benchmarks/sanity_sweep.py [--traces DIR ...] [--jobs N] [--out FILE]

For each trace (the shared traces and their multi-rank folders, the GPU ground truth, the
project's recorded traces) the trace is loaded once and every spec in SPECS is predicted from
it, each in the same process, with the profiler's cost taken out as users get it. A row is an
anomaly when:

- the prediction raised anything but perfcast's own errors (a traceback for the user);
- the predicted step is not a finite positive number, or the speedup is beyond 20x either way;
- a model that can only remove work (fused-optimizer, remove-host-sync, dataloader-overlap,
  fuse-elementwise) predicts a slowdown of more than 2%;
- a model that only adds work per step (activation-checkpointing, batch-size x2 and x4)
  predicts a speedup of more than 1%;
- a move to an H200 is predicted slower than the same move to an H100 (same die, more memory
  bandwidth);
- a prediction's assumptions read 'nan'.

Refusals (NotApplicableError) are not anomalies; they are counted, with their messages in the
JSON. Exit status 1 when any anomaly is found.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
DEFAULT_DIRS = [
    SHARED / "traces",
    SHARED / "gpu-truth" / "traces" / "h100",
    REPO / "benchmarks" / "accuracy" / "recorded" / "traces",
]
SPECS = [
    "amp",
    "amp:dtype=fp16",
    "fused-optimizer:kind=foreach",
    "fused-optimizer:kind=fused",
    "cuda-graphs",
    "fuse-elementwise",
    "torch-compile",
    "torch-compile:mode=reduce-overhead",
    "dataloader-overlap:workers=4",
    "remove-host-sync",
    "device:target=h100",
    "device:target=h200",
    "device:target=a100-80gb",
    "device:target=mi300x",
    "ddp:gpus=8",
    "activation-checkpointing",
    "batch-size:factor=0.5",
    "batch-size:factor=2",
    "batch-size:factor=4",
    "zero:gpus=8,stage=2,params_mb=100",
    "tensor-parallel:tp=2",
    "pipeline-parallel:pp=2",
]
ONLY_FASTER = ("fused-optimizer", "remove-host-sync", "dataloader-overlap", "fuse-elementwise")
ONLY_SLOWER = ("activation-checkpointing", "batch-size:factor=2", "batch-size:factor=4")
MAX_SPEEDUP = 20.0


def targets(dirs: list[Path]) -> list[Path]:
    """Single trace files, and folders of rank files (one target per folder)."""
    out: list[Path] = []
    for d in dirs:
        # Execution traces (et/) are not Kineto traces.
        files = sorted(p for p in d.rglob("*.json.gz") if "et" not in p.relative_to(d).parts)
        for folder in sorted({p.parent for p in files}):
            here = [p for p in files if p.parent == folder]
            ranks = [p for p in here if p.name.startswith(("rank", "worker"))]
            out.extend([folder] if len(ranks) > 1 else here)
    return out


def sweep_one(path: str) -> list[dict[str, Any]]:
    """Every spec on one trace (runs in a worker process)."""
    import perfcast
    from perfcast.analysis.real_step import real_world
    from perfcast.errors import NotApplicableError, PerfcastError
    from perfcast.graph import build_graph
    from perfcast.whatif.registry import parse_spec
    from perfcast.whatif.runner import run_whatif

    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    try:
        table = perfcast.load(path)
        graph = build_graph(table)
        world = real_world(graph)
    except PerfcastError as exc:
        return [{"trace": path, "spec": "(load)", "status": "refused", "message": str(exc)}]
    except Exception:  # the point: catch what users would see as a traceback
        message = traceback.format_exc()[-2000:]
        return [{"trace": path, "spec": "(load)", "status": "exception", "message": message}]
    load_s = time.perf_counter() - t0
    for spec in SPECS:
        row: dict[str, Any] = {"trace": path, "spec": spec, "load_s": load_s}
        t = time.perf_counter()
        try:
            res, _, _ = run_whatif(table, [parse_spec(spec)], graph=graph, world=world)
            row.update(
                status="ok",
                baseline_ms=res.baseline_ms,
                predicted_ms=res.predicted_ms,
                speedup=res.speedup,
                assumptions=" ".join(res.assumptions),
            )
        except NotApplicableError as exc:
            row.update(status="refused", message=str(exc))
        except PerfcastError as exc:
            row.update(status="error", message=str(exc))
        except Exception:
            row.update(status="exception", message=traceback.format_exc()[-2000:])
        row["seconds"] = time.perf_counter() - t
        rows.append(row)
    return rows


def anomalies(rows: list[dict[str, Any]]) -> list[str]:
    """What breaks the module docstring's rules, one line each."""
    out = []
    by_trace: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_trace.setdefault(r["trace"], {})[r["spec"]] = r
        where = f"{Path(r['trace']).name} {r['spec']}"
        if r["status"] == "exception":
            out.append(f"{where}: exception: {r['message'].strip().splitlines()[-1]}")
            continue
        if r["status"] != "ok":
            continue
        pred, s = r["predicted_ms"], r["speedup"]
        if not (math.isfinite(pred) and pred > 0 and math.isfinite(s)):
            out.append(f"{where}: predicted {pred} ms, speedup {s}")
            continue
        if s > MAX_SPEEDUP or s < 1 / MAX_SPEEDUP:
            out.append(f"{where}: speedup {s:.3g}x")
        if r["spec"].startswith(ONLY_FASTER) and s < 0.98:
            out.append(f"{where}: a model that only removes work predicts {s:.3f}x")
        if r["spec"].startswith(ONLY_SLOWER) and s > 1.01:
            out.append(f"{where}: a model that only adds work predicts {s:.3f}x")
        if "nan" in r["assumptions"].lower().replace("nanosec", ""):
            out.append(f"{where}: 'nan' in the assumptions")
    for trace, specs in by_trace.items():
        h100, h200 = specs.get("device:target=h100"), specs.get("device:target=h200")
        both = h100 and h200 and h100["status"] == h200["status"] == "ok"
        if both and h200["predicted_ms"] > h100["predicted_ms"] * 1.001:
            out.append(
                f"{Path(trace).name}: -> H200 {h200['predicted_ms']:.2f} ms is slower than "
                f"-> H100 {h100['predicted_ms']:.2f} ms"
            )
    return out


def _compact(row: dict[str, Any]) -> dict[str, Any]:
    """A row as saved: no assumption text, the trace relative to the project's parent."""
    out = {k: v for k, v in row.items() if k != "assumptions"}
    trace = Path(out["trace"])
    if trace.is_relative_to(REPO.parent):
        out["trace"] = str(trace.relative_to(REPO.parent))
    if isinstance(out.get("message"), str) and out["status"] != "exception":
        out["message"] = out["message"][:240]
    for key in ("baseline_ms", "predicted_ms", "speedup", "seconds", "load_s"):
        if isinstance(out.get(key), float):
            out[key] = round(out[key], 4)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, nargs="*", default=DEFAULT_DIRS)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/sanity_sweep.json")
    args = ap.parse_args(argv)
    todo = [str(p) for p in targets(args.traces)]
    if not todo:
        print("sanity_sweep: no traces found", file=sys.stderr)
        return 2
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for got in pool.map(sweep_one, todo):
            rows.extend(got)
    wall = time.perf_counter() - started
    found = anomalies(rows)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    slowest = sorted((r for r in rows if "seconds" in r), key=lambda r: -r["seconds"])[:3]
    print(f"{len(todo)} traces x {len(SPECS)} specs: {len(rows)} predictions in {wall:.0f} s")
    print("  " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for r in slowest:
        print(f"  slowest: {Path(r['trace']).name} {r['spec']} {r['seconds']:.1f} s")
    print(f"{len(found)} anomalies" + (":" if found else ""))
    for line in found:
        print("  " + line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "traces": len(todo),
                "specs": SPECS,
                "counts": counts,
                "anomalies": found,
                "wall_s": round(wall, 1),
                "rows": [_compact(r) for r in rows],
            },
            indent=1,
            default=str,
        )
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
