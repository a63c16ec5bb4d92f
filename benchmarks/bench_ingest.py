"""How fast and lean is ingest? perfcast vs the JSON parse floor vs HTA, on one big trace.

    python benchmarks/bench_ingest.py [--repeat N] [--trace FILE] [--no-hta] [--profile]
                                      [--replicate K]

Every measurement runs in its own process, started by a fresh wrapper process that reports
the child's wall time and peak RSS (`getrusage(RUSAGE_CHILDREN)`), so no run inherits another's
memory or warm imports. Repetitions are interleaved (a, b, c, a, b, c, ...) so that drift of the
machine hits all contenders alike; medians are reported.

  floor     gunzip + orjson.loads of the file: what any JSON-based reader must pay.
  load      `perfcast.load(FILE)`: the ingest layer alone.
  summary   `python -m perfcast.cli.main summary FILE --json`: perfcast end to end.
  hta       HolisticTraceAnalysis `TraceAnalysis(trace_dir=...)` on a folder holding a copy of
            FILE, in its own venv (.bench/hta-venv, built on first use; --no-hta skips it).

`--replicate K` measures a K times larger input instead: FILE's events written K times, each
copy shifted past the previous one in time, with its correlation ids, flow ids and step
numbers offset (one gzipped file in a temporary folder): how time and memory grow.
"""

from __future__ import annotations

import argparse
import cProfile
import gzip
import importlib.util
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "hta_ddp_v100_rank1_memory.json.gz"
HTA_VENV = REPO / ".bench" / "hta-venv"
HTA_PACKAGES = (["HolisticTraceAnalysis", "pandas<3"], ["traceinsight", "pandas<3"])

# Runs CMD as a child; prints {"wall_s", "maxrss_mib", "rc", "stdout", "stderr"} as JSON.
WRAPPER = textwrap.dedent(
    """
    import json, resource, subprocess, sys, time
    t = time.perf_counter()
    p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
    wall = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"wall_s": wall, "maxrss_mib": rss, "rc": p.returncode,
                      "stdout": p.stdout[-4000:], "stderr": p.stderr[-4000:]}))
    """
)

# Each child prints one JSON line (its last stdout line) with its own inner timings.
FLOOR = textwrap.dedent(
    """
    import gzip, json, sys, time
    t0 = time.perf_counter()
    import orjson
    t1 = time.perf_counter()
    with open(sys.argv[1], "rb") as fh:
        data = gzip.decompress(fh.read())
    t2 = time.perf_counter()
    trace = orjson.loads(data)
    t3 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "gunzip_s": t2 - t1, "parse_s": t3 - t2,
                      "work_s": t3 - t1, "events": len(trace["traceEvents"])}))
    """
)
LOAD = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    import perfcast
    t1 = time.perf_counter()
    table = perfcast.load(sys.argv[1])
    t2 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "work_s": t2 - t1, "rows": len(table)}))
    """
)
HTA = textwrap.dedent(
    """
    import json, logging, sys, time
    logging.disable(logging.WARNING)
    t0 = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis
    t1 = time.perf_counter()
    analysis = TraceAnalysis(trace_dir=sys.argv[1])
    t2 = time.perf_counter()
    rows = sum(len(analysis.t.get_trace(r)) for r in analysis.t.get_ranks())
    print(json.dumps({"import_s": t1 - t0, "work_s": t2 - t1, "rows": rows}))
    """
)


def measure(cmd: list[str]) -> dict:
    """Run cmd under a fresh wrapper process; wall time, peak RSS and the child's JSON line."""
    out = subprocess.run(
        [sys.executable, "-c", WRAPPER, *cmd], capture_output=True, text=True, check=True
    )
    res = json.loads(out.stdout)
    if res["rc"] != 0:
        raise RuntimeError(f"{cmd[:3]} failed (rc {res['rc']}): {res['stderr'][-1500:]}")
    lines = res["stdout"].strip().splitlines()
    try:
        res["inner"] = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        res["inner"] = {}  # the CLI prints a multi-line JSON document
    return res


def build_hta_venv(log: Path) -> tuple[Path | None, str]:
    """Python of the HTA venv, building it on first use; (None, why) when it cannot be had."""
    python = HTA_VENV / "bin" / "python"
    probe = [str(python), "-c", "import hta.trace_analysis"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python, "existing venv"
    print(f"building {HTA_VENV} (log: {log}) ...", flush=True)
    try:
        venv.EnvBuilder(with_pip=True, clear=True).create(HTA_VENV)
    except Exception as exc:
        return None, f"cannot create a venv: {exc}"
    tried = []
    with open(log, "a") as fh:
        for packages in HTA_PACKAGES:
            pip = [str(python), "-m", "pip", "install", "--quiet", *packages]
            rc = subprocess.run(pip, stdout=fh, stderr=subprocess.STDOUT).returncode
            if rc == 0 and subprocess.run(probe, capture_output=True).returncode == 0:
                return python, f"installed {' '.join(packages)}"
            tried.append(f"pip install {' '.join(packages)} -> rc {rc}")
    return None, "; ".join(tried) + f" (see {log})"


def hta_rank_dir(workdir: Path, trace: Path) -> tuple[Path | None, str]:
    """(HTA's Python, its trace folder holding a copy of `trace`), building HTA's venv on first
    use; (None, why) when HTA cannot be had. HTA reads a folder of rank files."""
    HTA_VENV.parent.mkdir(parents=True, exist_ok=True)
    python, why = build_hta_venv(HTA_VENV.parent / "hta-venv-build.log")
    if python is None:
        return None, f"skipped: {why}"
    show = [str(python), "-m", "pip", "show", "HolisticTraceAnalysis"]
    version = subprocess.run(show, capture_output=True, text=True).stdout
    ver = next((ln for ln in version.splitlines() if ln.startswith("Version")), "")
    rank_dir = workdir / "hta_trace_dir"
    rank_dir.mkdir()
    shutil.copy(trace, rank_dir / trace.name)
    print(f"hta: {why} ({python}) {ver}")
    return python, str(rank_dir)


def cli_available() -> bool:
    spec = importlib.util.find_spec("perfcast.cli.main")
    if spec is None or spec.origin is None:
        return False
    return "summary" in Path(spec.origin).read_text()


def profile_load(trace: Path, top: int) -> None:
    import perfcast

    perfcast.load(trace)  # warm the imports and the page cache
    prof = cProfile.Profile()
    prof.enable()
    perfcast.load(trace)
    prof.disable()
    for order in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(order).print_stats(top)
        text = buf.getvalue()
        start = text.find("   ncalls")
        print(f"\n--- cProfile of perfcast.load, top {top} by {order} ---")
        print(text[start:].rstrip() if start >= 0 else text)


def replicate_trace(src: Path, k: int, out: Path) -> int:
    """FILE's events K times, shifted in time and ids (see the module docstring); events."""
    import orjson

    with open(src, "rb") as fh:
        raw = fh.read()
    doc = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    del raw
    events = doc["traceEvents"]
    stamps = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(stamps) - min(stamps) + 1000.0
    id_step = 10_000_000
    out_events = []
    for copy_no in range(k):
        for e in events:
            if copy_no and e.get("ph") == "M":
                continue  # process/thread names once
            e2 = dict(e)
            if isinstance(e2.get("ts"), (int, float)):
                e2["ts"] = e2["ts"] + copy_no * span
            args = e2.get("args")
            if isinstance(args, dict):
                args = dict(args)
                for key in ("correlation", "External id", "external id"):
                    if isinstance(args.get(key), int):
                        args[key] += copy_no * id_step
                e2["args"] = args
            if e2.get("ph") in ("s", "f", "t") and isinstance(e2.get("id"), int):
                e2["id"] += copy_no * id_step
            name = e2.get("name")
            if isinstance(name, str) and name.startswith("ProfilerStep#"):
                e2["name"] = f"ProfilerStep#{int(name.split('#')[1]) + copy_no * 1000}"
            out_events.append(e2)
    doc["traceEvents"] = out_events
    out.write_bytes(gzip.compress(orjson.dumps(doc), compresslevel=1))
    return len(out_events)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="interleaved repetitions (default 5)")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--no-hta", action="store_true", help="skip the HTA comparison")
    ap.add_argument("--profile", action="store_true", help="also cProfile perfcast.load")
    ap.add_argument("--top", type=int, default=25, help="rows of the profile to print")
    ap.add_argument(
        "--replicate", type=int, default=1, help="measure FILE's events repeated K times"
    )
    args = ap.parse_args(argv)

    trace: Path = args.trace.resolve()
    if not trace.is_file():
        print(f"no trace at {trace}", file=sys.stderr)
        return 2
    big_dir = None
    if args.replicate > 1:
        big_dir = Path(tempfile.mkdtemp(prefix="bench_ingest_big_"))
        big = big_dir / f"{trace.name.split('.')[0]}_x{args.replicate}.json.gz"
        n = replicate_trace(trace, args.replicate, big)
        print(f"replicated {trace.name} {args.replicate}x: {n:,} events")
        trace = big
    try:
        return _run(args, trace)
    finally:
        if big_dir is not None:
            shutil.rmtree(big_dir, ignore_errors=True)


def _run(args: argparse.Namespace, trace: Path) -> int:
    with open(trace, "rb") as fh:
        raw = fh.read()
    json_size = len(gzip.decompress(raw)) if raw[:2] == b"\x1f\x8b" else len(raw)
    del raw
    print(f"trace: {trace}")
    print(f"       {trace.stat().st_size / 1e6:.1f} MB on disk, {json_size / 1e6:.1f} MB of JSON")
    print(f"python: {sys.version.split()[0]} ({sys.executable}), {os.cpu_count()} CPUs")

    py = sys.executable
    contenders: dict[str, list[str]] = {
        "floor": [py, "-c", FLOOR, str(trace)],
        "load": [py, "-c", LOAD, str(trace)],
    }
    if cli_available():
        contenders["summary"] = [py, "-m", "perfcast.cli.main", "summary", str(trace), "--json"]
    else:
        print("note: perfcast.cli.main has no `summary` yet: timing perfcast.load only")

    workdir = Path(tempfile.mkdtemp(prefix="bench_ingest_"))
    try:
        if args.no_hta:
            print("hta: skipped (--no-hta)")
        else:
            hta_python, rank_dir = hta_rank_dir(workdir, trace)
            if hta_python is None:
                print(f"hta: {rank_dir}")
            else:
                contenders["hta"] = [str(hta_python), "-c", HTA, rank_dir]

        results: dict[str, list[dict]] = {name: [] for name in contenders}
        names = list(contenders)
        for rep in range(args.repeat):
            order = names[rep % len(names) :] + names[: rep % len(names)]  # rotate the order
            for name in order:
                results[name].append(measure(contenders[name]))
            print(f"  repetition {rep + 1}/{args.repeat} done", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    def med(name: str, key: str) -> float:
        vals = [r[key] if key in r else r["inner"].get(key) for r in results[name]]
        vals = [v for v in vals if v is not None]
        return statistics.median(vals) if vals else float("nan")

    def per_json(name: str) -> float:
        return med(name, "maxrss_mib") * 2**20 / json_size

    print(f"\nmedians of {args.repeat} interleaved runs (wall: whole process, incl. imports)")
    print(
        f"{'':8} {'wall s':>7} {'import s':>9} {'work s':>7} {'peak RSS MiB':>13} {'RSS/JSON':>9}"
    )

    def cell(value: float, width: int, digits: int = 2) -> str:
        return f"{'-':>{width}}" if value != value else f"{value:{width}.{digits}f}"  # nan: -

    for name in names:
        print(
            f"{name:8} {cell(med(name, 'wall_s'), 7)} {cell(med(name, 'import_s'), 9)} "
            f"{cell(med(name, 'work_s'), 7)} {cell(med(name, 'maxrss_mib'), 13, 0)} "
            f"{cell(per_json(name), 9)}"
        )
    print("(import/work: timed inside the child; the CLI reports neither)")
    floor = results["floor"][0]["inner"]
    print(
        f"\nfloor: gunzip {med('floor', 'gunzip_s'):.2f} s + orjson.loads "
        f"{med('floor', 'parse_s'):.2f} s for {floor['events']:,} events"
    )

    def ratio(label: str, num: float, den: float) -> None:
        print(f"  {label:48} {num / den:6.2f}x")

    print("\nratios")
    ratio(
        "perfcast.load / parse floor (in-process work)",
        med("load", "work_s"),
        med("floor", "work_s"),
    )
    ratio(
        "perfcast.load / parse floor (whole process)", med("load", "wall_s"), med("floor", "wall_s")
    )
    main_name = "summary" if "summary" in results else "load"
    if "summary" in results:
        ratio(
            "perfcast summary / parse floor (whole process)",
            med("summary", "wall_s"),
            med("floor", "wall_s"),
        )
    ratio(f"peak RSS of perfcast {main_name} / JSON size", per_json(main_name), 1.0)
    ratio("peak RSS of parse floor / JSON size", per_json("floor"), 1.0)
    if "hta" in results:
        ratio(
            "HTA load / perfcast.load (in-process work)",
            med("hta", "work_s"),
            med("load", "work_s"),
        )
        ratio(
            f"HTA / perfcast {main_name} (whole process)",
            med("hta", "wall_s"),
            med(main_name, "wall_s"),
        )
        ratio(
            f"HTA / perfcast {main_name} (peak RSS)",
            med("hta", "maxrss_mib"),
            med(main_name, "maxrss_mib"),
        )

    if args.profile:
        profile_load(trace, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
