"""Does the cost per rank stay flat as ranks grow? `summary`, `analyze` and `advise` on a
rank folder of N ranks against the same command on a folder of few ranks, side by side.

    python benchmarks/bench_ranks.py [--ranks 1024] [--base 8] [--repeat 3] [--source DIR]

The folders are made from a real multi-rank set (default: the 8-rank DLRM V100 traces in
../shared/traces), each copy renumbered as its own rank, written once to a temporary folder.
Every command runs as a whole process (imports, load, analysis, JSON on stdout) under
bench_ingest.py's wrapper (wall time and peak RSS of a fresh child); the small and the large
folder alternate in each round, and medians are reported with the ratio that matters:
seconds per rank on N ranks over seconds per rank on the base folder (1.0 = linear). A
whole-folder mask per rank or per lane makes it grow with N.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import REPO, measure

DEFAULT_SOURCE = REPO.parent / "shared" / "traces" / "dlrm_v100_8rank"
COMMANDS = ("summary", "analyze", "advise")


def rank_folder(source: Path, ranks: int, out: Path) -> int:
    """`ranks` traces cycled from `source`, rank i numbered i of `ranks`; events per rank."""
    docs = []
    for path in sorted(source.glob("*.json*")):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:
            docs.append(json.load(fh))
    if not docs:
        raise SystemExit(f"{source}: no traces")
    out.mkdir(parents=True, exist_ok=True)
    for i in range(ranks):
        doc = docs[i % len(docs)]
        info = doc.setdefault("distributedInfo", {})
        info["rank"], info["world_size"] = i, ranks
        with gzip.open(out / f"rank{i}.json.gz", "wt", compresslevel=1) as fh:
            json.dump(doc, fh)
    return len(docs[0]["traceEvents"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--base", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--commands", default=",".join(COMMANDS))
    args = ap.parse_args()
    commands = [c for c in args.commands.split(",") if c]
    with tempfile.TemporaryDirectory(prefix="perfcast-ranks-") as tmp:
        small, large = Path(tmp) / f"r{args.base}", Path(tmp) / f"r{args.ranks}"
        per_rank = rank_folder(args.source, args.base, small)
        rank_folder(args.source, args.ranks, large)
        runs: dict[tuple[str, int], list[dict]] = {}
        for round_ in range(args.repeat):
            for cmd in commands:
                for n, folder in ((args.base, small), (args.ranks, large)):
                    res = measure([sys.executable, "-m", "perfcast", cmd, str(folder), "--json"])
                    runs.setdefault((cmd, n), []).append(res)
                    print(
                        f"round {round_ + 1} {cmd:8s} {n:5d} ranks: {res['wall_s']:7.2f} s "
                        f"{res['maxrss_mib']:7.0f} MiB",
                        flush=True,
                    )
    print(
        f"\n{args.source.name}: ~{per_rank:,} events per rank; medians of {args.repeat} "
        "interleaved rounds, whole processes"
    )
    print(f"{'command':8s} {'ranks':>6s} {'wall s':>8s} {'MiB':>7s} {'s/rank':>8s}  per-rank ratio")
    report = {}
    for cmd in commands:
        base = statistics.median(r["wall_s"] for r in runs[(cmd, args.base)]) / args.base
        for n in (args.base, args.ranks):
            wall = statistics.median(r["wall_s"] for r in runs[(cmd, n)])
            rss = statistics.median(r["maxrss_mib"] for r in runs[(cmd, n)])
            ratio = wall / n / base
            print(f"{cmd:8s} {n:6d} {wall:8.2f} {rss:7.0f} {wall / n:8.4f}  {ratio:.2f}x")
            report[f"{cmd}/{n}"] = {"wall_s": wall, "maxrss_mib": rss, "per_rank_ratio": ratio}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
