"""Bring measured sets from outside the project into its recorded rows (run once per set).

    python -m benchmarks.accuracy.import_recorded gpu-truth /path/to/shared/gpu-truth
    python -m benchmarks.accuracy.import_recorded kineto-v100 /path/to/shared/traces
    python -m benchmarks.accuracy.import_recorded live .bench/gpu-run/recorded

Traces are copied byte-identical; the rows say where every number came from.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.accuracy.recorded_rows import (
    RECORDED_DIR,
    ROWS_DIR,
    RecordedRow,
    load_rows,
    write_rows,
)

GPU_TRUTH_SOURCE = "gpu-truth-2026-11"
V100_SOURCE = "kineto-v100-2021"


def _workload(config: str) -> str:
    if config.startswith("r50_nw"):
        return "resnet50-dataloader"
    if config.startswith("r50_"):
        return "resnet50"
    if config.startswith("mlp_"):
        return "mlp16"
    return config.split("_")[0]


def import_gpu_truth(root: Path) -> list[RecordedRow]:
    """Rows from gpu-truth's pairs.jsonl and measurements.jsonl; its H100 traces copied."""
    meas = {}
    for line in (root / "measurements.jsonl").read_text().splitlines():
        m = json.loads(line)
        meas[(m["config"], m["gpu"])] = m
    h100 = "NVIDIA H100 80GB HBM3"
    rows = []
    copied: set[str] = set()
    for line in (root / "pairs.jsonl").read_text().splitlines():
        p = json.loads(line)
        base = meas[(p["baseline"], h100)]  # predictions always start from the H100 trace
        var = meas[(p["variant"], p["gpu"])]
        trace = Path("traces/h100") / Path(p["baseline_trace"]).name
        if str(trace) not in copied:
            (RECORDED_DIR / trace).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / p["baseline_trace"], RECORDED_DIR / trace)
            copied.add(str(trace))
        is_device = p["gpu"] != h100
        tag = "h200" if is_device else "h100"
        notes = []
        spec = p["perfcast_whatif"]
        if p["change"].startswith("torch.compile") and spec == "fuse-elementwise":
            # The set predates the torch-compile model (fuse-elementwise is its GPU half).
            spec = "torch-compile"
        if spec == "cuda-graphs" and "no loss.item()" in p["change"]:
            # The variant dropped the step's sync as well: say so, as cuda-graphs now keeps
            # syncs it finds (syncs=split) unless told they were moved out.
            spec = "cuda-graphs:syncs=move"
        if "workers" in base:
            notes.append(f"DataLoader num_workers={base['workers']} on {base['cpus']} CPUs")
            if spec.startswith("dataloader-overlap"):
                # A set-up fact the user knows and the trace does not show.
                spec += f",cores={base['cpus']}"
        if not var.get("step_ms_windows"):
            notes.append("variant timed once (no windows recorded); it has no trace")
        rows.append(
            RecordedRow(
                id=f"{tag}/{p['baseline']}->{p['variant']}",
                source=GPU_TRUTH_SOURCE,
                device=h100,
                processor="gpu",
                workload=_workload(p["baseline"]),
                baseline=p["baseline"],
                variant=p["variant"],
                change=p["change"],
                spec=spec,
                baseline_trace=str(trace),
                measured="unprofiled",
                baseline_ms=base["step_ms"],
                variant_ms=var["step_ms"],
                baseline_windows_ms=base.get("step_ms_windows", []),
                variant_windows_ms=var.get("step_ms_windows", []),
                baseline_traced_ms=base.get("traced_ms"),
                variant_traced_ms=var.get("traced_ms"),
                variant_device=p["gpu"] if is_device else None,
                batch=base.get("bs"),
                variant_batch=var.get("bs"),
                baseline_peak_mem_gib=base.get("peak_mem_gib"),
                variant_peak_mem_gib=var.get("peak_mem_gib"),
                notes="; ".join(notes),
            )
        )
    return rows


def import_kineto_v100(traces: Path) -> list[RecordedRow]:
    """The ResNet-50 V100 DataLoader pair (kineto tb_plugin samples): only traced steps."""
    import perfcast

    names = ("resnet50_v100_nw0_2021.json.gz", "resnet50_v100_nw4_2021.json.gz")
    medians = []
    for name in names:
        dst = RECORDED_DIR / "traces" / "v100" / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(traces / name, dst)
        table = perfcast.load(dst)
        medians.append(statistics.median(it.dur_ns / 1e6 for it in table.iterations))
    return [
        RecordedRow(
            id="v100/resnet50_nw0->nw4",
            source=V100_SOURCE,
            device="Tesla V100-DGXS-32GB",
            processor="gpu",
            workload="resnet50-dataloader",
            baseline="resnet50_v100_nw0_2021",
            variant="resnet50_v100_nw4_2021",
            change="DataLoader num_workers 0 -> 4",
            spec="dataloader-overlap:workers=4",
            baseline_trace=f"traces/v100/{names[0]}",
            measured="traced",
            baseline_ms=round(medians[0], 3),
            variant_ms=round(medians[1], 3),
            baseline_traced_ms=round(medians[0], 3),
            variant_traced_ms=round(medians[1], 3),
            notes=(
                "the source published two profiled runs and no unprofiled times: both sides "
                "are median ProfilerStep times of their traces (the variant's trace is "
                f"traces/v100/{names[1]})"
            ),
        )
    ]


def import_live(root: Path) -> list[str]:
    """Copy what `live --record SOURCE --recorded-dir root` wrote elsewhere (on a borrowed GPU
    machine) into the project's recorded rows: each source's rows file, the traces and the
    calibration its rows name, byte-identical. A source the project already has is refused,
    so recorded rows are never overwritten. Returns the sources."""
    rows = load_rows(root=root)  # checks ids and that every trace and calibration is there
    sources = sorted({r.source for r in rows})
    clash = [s for s in sources if (ROWS_DIR / f"{s}.jsonl").exists()]
    if clash:
        raise FileExistsError(f"the project already has rows for {', '.join(clash)}")
    for rel in sorted({f for r in rows for f in (r.baseline_trace, r.calibration) if f}):
        (RECORDED_DIR / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, RECORDED_DIR / rel)
    for source in sources:
        ROWS_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / "rows" / f"{source}.jsonl", ROWS_DIR / f"{source}.jsonl")
    return sources


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.accuracy.import_recorded")
    parser.add_argument("what", choices=("gpu-truth", "kineto-v100", "live"))
    parser.add_argument(
        "root",
        type=Path,
        help="gpu-truth folder, the shared traces folder, or a live run's --recorded-dir",
    )
    args = parser.parse_args(argv)
    if args.what == "live":
        try:
            sources = import_live(args.root)
        except (FileExistsError, ValueError) as exc:
            print(f"import_recorded: {exc}", file=sys.stderr)
            return 2
        print(f"imported {', '.join(sources) or 'nothing'} into {RECORDED_DIR}")
        return 0
    if args.what == "gpu-truth":
        rows, source = import_gpu_truth(args.root), GPU_TRUTH_SOURCE
    else:
        rows, source = import_kineto_v100(args.root), V100_SOURCE
    out = ROWS_DIR / f"{source}.jsonl"
    write_rows(out, rows)
    print(f"wrote {len(rows)} rows to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
