"""`perfcast plan`: search parallelization plans for a trace or a described model."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from rich.table import Table

from perfcast.errors import PerfcastError


def register(sub: Any, add_common: Callable[[Any], None], table: dict[str, Any]) -> None:
    p = sub.add_parser(
        "plan",
        help="search data / tensor / pipeline parallel plans, sharding, micro-batch, "
        "checkpointing and AMP for N GPUs; prune what does not fit, rank the rest",
    )
    p.add_argument("path", nargs="?", help="trace file or folder of rank files")
    p.add_argument("--gpus", type=int, required=True, help="GPUs to plan for")
    p.add_argument("--gpu", help="GPU model (default: the trace's; h100 for --model)")
    p.add_argument(
        "--link", help="intra-node link: nvlink2/3/4/5, pcie3/4/5 (default: the GPU's usual)"
    )
    p.add_argument("--inter", help="inter-node link per GPU: ib-hdr, ib-ndr, 400gbe, ...")
    p.add_argument("--memory-gb", type=float, help="GPU memory to plan within (default: the GPU's)")
    p.add_argument(
        "--gpus-per-node",
        type=int,
        default=8,
        help="GPUs per node (default 8): --link joins them, --inter the nodes",
    )
    p.add_argument(
        "--nics-per-node",
        type=int,
        help="inter-node NICs per node, each an --inter link (default: one per GPU)",
    )
    p.add_argument(
        "--global-batch",
        type=int,
        help="samples per step over all GPUs (default: the trace's batch on every GPU; "
        "--gpus for --model)",
    )
    p.add_argument("--batch", type=int, help="the trace's per-GPU batch, when it has no shapes")
    p.add_argument(
        "--model",
        help="plan a described model instead of a trace: a preset (gpt-175b, llama3-8b, ...), "
        "a JSON file or inline JSON with layers, hidden, heads, seq, vocab",
    )
    p.add_argument(
        "--host-us-per-kernel",
        type=float,
        help="with --model: host (CPU) time per kernel launched, in us (default 26, the "
        "median of eager PyTorch steps on H100/H200 hosts; heavier frameworks cost more)",
    )
    p.add_argument("--top", type=int, default=10, help="how many plans to list (default 10)")
    from perfcast.cli.commands import add_correction_option

    add_correction_option(p)
    add_common(p)
    table["plan"] = cmd_plan


def cmd_plan(args: argparse.Namespace, ui: Any) -> int:
    from perfcast.hardware.network import check_names
    from perfcast.plan import plan_model, plan_trace

    if args.model and args.path:
        raise PerfcastError("give a trace PATH or --model, not both")
    if args.host_us_per_kernel is not None and not args.model:
        raise PerfcastError(
            "--host-us-per-kernel applies to --model only: a trace's own host time is measured"
        )
    if args.batch is not None and args.model:
        # It was ignored: a described model has no traced batch to size.
        raise PerfcastError(
            "--batch is a trace's per-GPU batch (when it has no shapes): with --model, give "
            "--global-batch"
        )
    if args.model and args.ray:
        raise PerfcastError(
            "--ray loads rank traces on a Ray cluster; a --model description loads none"
        )
    # Before the trace is loaded (minutes for a large one): a typo in a name failed after.
    check_names(args.gpu, args.link, args.inter)
    if args.model:
        host = (
            {}
            if args.host_us_per_kernel is None
            else {"host_us_per_kernel": args.host_us_per_kernel}
        )
        result = plan_model(
            args.model,
            args.gpus,
            gpu="h100" if args.gpu is None else args.gpu,
            link=args.link,
            inter=args.inter,
            memory_gb=args.memory_gb,
            global_batch=args.global_batch,
            gpus_per_node=args.gpus_per_node,
            nics_per_node=args.nics_per_node,
            top=args.top,
            **host,
        )
    else:
        if not args.path:
            raise PerfcastError("give a trace PATH or --model NAME")
        tbl = ui.load(args.path)
        result = plan_trace(
            tbl,
            args.gpus,
            gpu=args.gpu,
            link=args.link,
            inter=args.inter,
            memory_gb=args.memory_gb,
            global_batch=args.global_batch,
            batch=args.batch,
            gpus_per_node=args.gpus_per_node,
            nics_per_node=args.nics_per_node,
            top=args.top,
            keep_profiler_cost=not args.correct,
        )
    if args.json:
        ui.emit_json(result)
        return 0
    render(result, ui.out)
    return 0


def render(result: Any, console: Any) -> None:
    console.print(
        f"[bold]{result.gpus} x {result.device}[/bold], global batch {result.global_batch}: "
        f"{result.evaluated:,} plans evaluated in {result.search_ms:.0f} ms, "
        f"{result.fitting:,} fit in {result.capacity_gib:g} GiB"
    )
    console.print(result.cluster, style="dim")
    tokens = any(r.tokens_per_s for r in result.best)
    t = Table(show_edge=False, pad_edge=False, box=None)
    # On a narrow terminal the memory split gives the plan label its room (--json has it,
    # and "why the best plan" prints it for the best).
    split = console.width >= 110
    cols = ["#", "plan", "step", "tokens/s" if tokens else "samples/s", "GiB"]
    cols += ["W/G/O/A GiB"] if split else []
    for col in [*cols, "bubble", "comm"]:
        # The plan label wraps; the figures never shrink into "676…" on a narrow terminal.
        if col == "plan":
            t.add_column(col, justify="left", overflow="fold", min_width=12)
        else:
            t.add_column(col, justify="right", no_wrap=True, min_width=len(col))
    rows = ([result.baseline] if result.baseline else []) + list(result.best)
    for r in rows:
        rate = r.tokens_per_s if tokens else r.samples_per_s
        t.add_row(
            "trace" if r.rank == 0 else str(r.rank),
            r.label,
            _time(r.step_ms),
            _count(rate) if rate else "-",
            f"{r.peak_gib:.1f}",
            *(
                [
                    f"{r.weights_gib:.1f}/{r.grads_gib:.1f}/{r.optimizer_gib:.1f}/"
                    f"{r.activations_gib:.1f}"
                ]
                if split
                else []
            ),
            f"{r.bubble_pct:.0f}%",
            _time(r.exposed_comm_ms),
        )
    console.print(t)
    console.print(
        "plan: dp x tp x pp GPUs (/v: interleaved stages), mb: micro-batch x count"
        + ("; W/G/O/A: weights, gradients, optimizer state, activations" if split else ""),
        style="dim",
    )
    if result.best:
        console.print("[bold]why the best plan[/bold]")
        for reason in result.best[0].reasons:
            console.print(f"  - {reason}", markup=False)
    for note in result.notes:
        console.print(f"note: {note}", style="yellow", markup=False)
    console.print("[bold]assumptions[/bold]")
    for a in result.assumptions:
        console.print(f"  - {a}", markup=False, style="dim")


def _time(ms: float) -> str:
    return f"{ms:.1f} ms" if ms < 1000 else f"{ms / 1000:.2f} s"


def _count(x: float) -> str:
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"
