"""How fast is the analysis battery? `perfcast analyze` vs `perfcast summary` vs HTA's same
analyses, side by side on one big trace.

    python benchmarks/bench_analyze.py [--repeat N] [--trace FILE] [--no-hta] [--hta-aten]

Each contender runs as a whole process (imports, load and analyses), under the same wrapper
as bench_ingest.py (wall time and peak RSS of a fresh child); repetitions are interleaved and
medians reported, with the ratios measured in this one run.

  summary   `perfcast summary FILE --json`
  analyze   `perfcast analyze FILE --json` (all ten analyses)
  hta       HolisticTraceAnalysis: load the trace folder, then the analyses that match
            perfcast's: kernel breakdown (+ temporal breakdown), idle time breakdown with
            interval statistics, kernel launch statistics, queue length summary and time
            blocked on a full queue, memory bandwidth summary, communication/computation
            overlap, user-annotation breakdown (CPU and GPU). Stragglers need several ranks
            (the trace has one). `get_aten_op_kernels_and_delay` loops over every launch in
            Python and takes minutes on this trace: only with --hta-aten.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import DEFAULT_TRACE, hta_rank_dir, measure

HTA_BATTERY = textwrap.dedent(
    """
    import json, logging, sys, time, warnings
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis
    t1 = time.perf_counter()
    ta = TraceAnalysis(trace_dir=sys.argv[1])
    t2 = time.perf_counter()
    rank = ta.t.get_ranks()[0]
    steps = {}
    def step(name, fn):
        t = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # report, do not hide
            steps[name + " (failed: " + type(exc).__name__ + ")"] = time.perf_counter() - t
            return
        steps[name] = time.perf_counter() - t
    step("kernels", lambda: (ta.get_gpu_kernel_breakdown(visualize=False),
                             ta.get_temporal_breakdown(visualize=False)))
    step("idle", lambda: ta.get_idle_time_breakdown(ranks=[rank], visualize=False,
                                                    show_idle_interval_stats=True))
    step("launches", lambda: ta.get_cuda_kernel_launch_stats(ranks=[rank], visualize=False))
    def queue():
        ql = ta.get_queue_length_time_series(ranks=[rank])
        ta.get_queue_length_summary(ranks=[rank])
        ta.get_time_spent_blocked_on_full_queue(ql)
    step("queue", queue)
    step("memory", lambda: ta.get_memory_bw_summary(ranks=[rank]))
    step("overlap", lambda: ta.get_comm_comp_overlap(visualize=False))
    step("scopes", lambda: (ta.get_gpu_user_annotation_breakdown(visualize=False),
                            ta.get_gpu_user_annotation_breakdown(use_gpu_annotation=False,
                                                                 visualize=False)))
    if len(sys.argv) > 2:
        step("ops", lambda: ta.get_aten_op_kernels_and_delay(ranks=[rank]))
    t3 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "analyses_s": t3 - t2,
                      "work_s": t3 - t1, "steps": steps}))
    """
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--hta-aten", action="store_true", help="also HTA's aten-op analysis")
    args = ap.parse_args(argv)
    trace = args.trace.resolve()
    if not trace.is_file():
        print(f"no trace at {trace}", file=sys.stderr)
        return 2
    import os
    import platform

    print(f"trace: {trace} ({trace.stat().st_size / 1e6:.1f} MB on disk)")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
        f"python {sys.version.split()[0]}"
    )
    py = sys.executable
    cli = [py, "-m", "perfcast.cli.main"]
    contenders = {
        "summary": [*cli, "summary", str(trace), "--json", "-q"],
        "analyze": [*cli, "analyze", str(trace), "--json", "-q"],
    }
    workdir = Path(tempfile.mkdtemp(prefix="bench_analyze_"))
    try:
        if not args.no_hta:
            hta_py, rank_dir = hta_rank_dir(workdir, trace)
            if hta_py is None:
                print(f"hta: {rank_dir}")
            else:
                contenders["hta"] = [str(hta_py), "-c", HTA_BATTERY, rank_dir] + (
                    ["aten"] if args.hta_aten else []
                )
        names = list(contenders)
        results: dict[str, list[dict]] = {n: [] for n in names}
        for rep in range(args.repeat):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for n in order:
                results[n].append(measure(contenders[n]))
            print(f"  repetition {rep + 1}/{args.repeat} done", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    def med(n: str, key: str = "wall_s") -> float:
        return statistics.median(r[key] for r in results[n])

    print(f"\nmedians of {args.repeat} interleaved runs (whole processes: imports, load, work)")
    print(f"{'':8} {'wall s':>7} {'peak RSS MiB':>13}")
    for n in names:
        print(f"{n:8} {med(n):7.2f} {med(n, 'maxrss_mib'):13.0f}")
    if "hta" in results:
        inner = [r["inner"] for r in results["hta"] if r.get("inner")]
        if inner:
            print(
                "\nHTA inside its process (medians): "
                f"load {statistics.median(i['load_s'] for i in inner):.2f} s, "
                f"analyses {statistics.median(i['analyses_s'] for i in inner):.2f} s"
            )
            for k in inner[0]["steps"]:
                vals = [i["steps"].get(k) for i in inner if k in i["steps"]]
                print(f"  {k:24} {statistics.median(vals):7.2f} s")
    print("\nratios")
    print(
        f"  perfcast analyze / perfcast summary    {med('analyze') / med('summary'):6.2f}x"
        "   (target: at most 2x)"
    )
    if "hta" in results:
        print(
            f"  HTA battery / perfcast analyze         {med('hta') / med('analyze'):6.2f}x"
            "   (target: at least 3x)"
        )
    out = {n: {"wall_s": med(n), "maxrss_mib": med(n, "maxrss_mib")} for n in names}
    print("\n" + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
