"""Fuzz campaign: thousands of mutated real traces through every perfcast stage.

    python benchmarks/fuzz_campaign.py [--count 10000] [--start 0] [--out .bench/fuzz]
                                       [--traces DIR ...] [--mode inprocess|subprocess]

Each input is a real trace (every file under --traces, default the project's shared traces
and the H100 ground-truth traces; sometimes a whole folder of ranks) mutated by
tests/fuzzing.py: wrong types in every field, duplicated and shuffled events, cyclic flows,
nested or replicated steps, huge numbers, deep nesting, markup in names, hostile shape
strings, byte flips in the JSON or the gzip stream, cuts, garbage. Big seeds are usually
cut to a window of events first (2k, 10k or 40k events; whole in 5% of draws) so that a
campaign of 10,000 inputs fits in a few hours of one core; --no-crop keeps them whole.

Every input runs through the stages summary, replay, whatif (one model, rotating), advise,
report, analyze, tree (one view, rotating), plan and diff (the input against the trace it
was made from, every other one with --apply), each with a 60 s limit (--timeout). Outcomes:

    ok         exit 0
    error      exit 2 and the last stderr line is one `perfcast: error: ...` line naming the input
    unnamed    the same line without the input's name (the user cannot tell which file)
    internal   perfcast's own one-line "internal error" (a bug, reported as such)
    traceback  an exception escaped, or a traceback was printed
    timeout    no answer within the limit
    crash      the process died (signal, out-of-memory kill) or gave an unexpected exit code
    modified   the stage changed the input file (never allowed)

`--mode inprocess` (default) runs `perfcast.cli.main.main(argv)` inside long-lived worker
processes (forked once, modules imported and numba code compiled once), with stdout/stderr
sent to files and an address-space limit (--memory-gb); the parent kills a worker that runs
past the limit and starts a new one, so hangs are caught honestly. `--mode subprocess`
runs `python -m perfcast ...` per stage: slower (start-up dominates), the same outcomes.

Results go to OUT/summary.json (counts per stage, outcome and mutator; every failure with
its signature) and OUT/repro/<signature>/ (the input, minimized by dropping events or bytes
while the same failure persists, and how to rerun it). Inputs that pass are deleted.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fuzzing import WHATIF_SPECS as WHATIF_MODELS  # noqa: E402
from tests.fuzzing import Seed, mutate  # noqa: E402

SHARED = REPO.parent / "shared"
DEFAULT_TRACES = [SHARED / "traces", SHARED / "gpu-truth" / "traces" / "h100"]
STAGES = ("summary", "replay", "whatif", "advise", "report", "analyze", "tree", "plan", "diff")
OUTCOMES = ("ok", "error", "unnamed", "internal", "traceback", "timeout", "crash", "modified")


# ---------------------------------------------------------------------------------------------
# Inputs


@dataclass
class Input:
    index: int
    path: Path  # a file, or a folder of rank files
    seed: str
    mutations: list[str]


def seed_files(roots: list[Path]) -> tuple[list[Path], list[Path]]:
    """(single trace files, folders of ranks) under the roots; execution traces excluded."""
    files: list[Path] = []
    folders: list[Path] = []
    for root in roots:
        if not root.is_dir():
            continue
        for p in sorted(root.rglob("*.json*")):
            if "/et/" in str(p) or not p.name.endswith((".json", ".json.gz")):
                continue
            if p.parent == root:
                files.append(p)
            elif p.parent not in folders:
                folders.append(p.parent)
    return files, folders


class SeedCache:
    def __init__(self) -> None:
        self.cache: dict[Path, Seed] = {}

    def get(self, path: Path) -> Seed:
        if path not in self.cache:
            self.cache[path] = Seed.read(path)  # events as JSON text: ~2x the file inflated
        return self.cache[path]


def make_input(
    i: int,
    base_seed: int,
    files: list[Path],
    folders: list[Path],
    seeds: SeedCache,
    workdir: Path,
    windows: bool,
) -> Input:
    rng = random.Random(f"{base_seed}:{i}")
    # Windows of 2k, 10k or 40k events, or the whole trace: 50 / 30 / 15 / 5 %.
    crop = rng.choice([2_000] * 10 + [10_000] * 6 + [40_000] * 3 + [None]) if windows else None
    if folders and rng.random() < 0.06:
        folder = rng.choice(folders)
        out = workdir / f"in{i}"
        out.mkdir(parents=True, exist_ok=True)
        ranks = sorted(folder.iterdir())
        victims = set(rng.sample(range(len(ranks)), rng.randint(1, len(ranks))))
        done = []
        for k, p in enumerate(ranks):
            if k in victims:
                data, gz, what = mutate(rng, seeds.get(p), max_events=crop)
                done += [f"{p.name}: {w}" for w in what]
                (out / (p.name.split(".")[0] + (".json.gz" if gz else ".json"))).write_bytes(data)
            else:
                shutil.copyfile(p, out / p.name)
        return Input(i, out, str(folder), done)
    src = rng.choice(files)
    data, gz, done = mutate(rng, seeds.get(src), max_events=crop)
    path = workdir / f"in{i}{'.json.gz' if gz else '.json'}"
    path.write_bytes(data)
    return Input(i, path, str(src), done)


def stage_argv(stage: str, inp: Input, scratch: Path) -> list[str]:
    p = str(inp.path)
    terminal = inp.index % 2 == 0  # half the runs draw the terminal view, half print JSON
    tail = [] if terminal else ["--json"]
    if stage == "summary":
        return ["summary", p, *tail]
    if stage == "replay":
        extra = ["--export-trace", str(scratch / "replay.json")] if inp.index % 3 == 0 else []
        return ["replay", p, *extra, *tail]
    if stage == "whatif":
        return ["whatif", p, "--apply", WHATIF_MODELS[inp.index % len(WHATIF_MODELS)], *tail]
    if stage == "advise":
        return ["advise", p, *tail]
    if stage == "report":
        return ["report", p, "-o", str(scratch / "report.html"), *tail]
    if stage == "analyze":
        tables = ["--csv", str(scratch / "tables")] if inp.index % 3 == 1 else []
        return ["analyze", p, *tables, *tail]
    if stage == "tree":
        views = [
            ["--bottom-up"],
            ["--speedscope", str(scratch / "tree.speedscope.json")],
            ["--folded", str(scratch / "tree.folded"), "--metric", "cpu"],
            ["--phase", "backward", "--step", "2"],
        ][inp.index % 4]
        return ["tree", p, *views, *tail]
    if stage == "plan":
        return ["plan", p, "--gpus", str((8, 16, 64)[inp.index % 3]), *tail]
    if stage == "diff":
        # The mutated trace against the trace it came from, sometimes predicting one from
        # the other.
        apply = ["--apply", WHATIF_MODELS[inp.index % len(WHATIF_MODELS)]] if inp.index % 2 else []
        return ["diff", inp.seed, p, *apply, *tail]
    raise ValueError(stage)


# ---------------------------------------------------------------------------------------------
# Running one stage


@dataclass
class Run:
    outcome: str
    rc: int | None
    seconds: float
    stderr_tail: str = ""
    signature: str = ""


_TRACEBACK = "Traceback (most recent call last)"


def classify(rc: int | None, stderr: str, escaped: str | None) -> tuple[str, str]:
    """(outcome, signature) from what the user would have seen."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    if escaped is not None or _TRACEBACK in stderr:
        return "traceback", escaped or _signature_from_text(stderr)
    if rc == 0:
        return "ok", ""
    last = lines[-1] if lines else ""
    if "internal error" in last:
        return "internal", re.sub(r"\d+", "N", last)[:160]
    if rc == 2 and last.startswith("perfcast") and ": error: " in last:
        return "error", ""
    return "crash", f"exit {rc}: {last[:120]}"


def _signature_from_text(text: str) -> str:
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', text)
    exc = [
        ln.split(":")[0].rsplit(".", 1)[-1]
        for ln in text.splitlines()
        if re.match(r"^\w[\w.]*(Error|Exception|Exit)\b", ln)
    ]
    where = ""
    for f, _line, fn in reversed(frames):
        if "/perfcast/" in f:
            where = f"{f.split('/perfcast/')[-1]}:{fn}"
            break
    return f"{exc[-1] if exc else 'exception'} at {where}"


def _worker_signature(exc: BaseException) -> str:
    where = ""
    for fs in reversed(traceback.extract_tb(exc.__traceback__)):
        if "/perfcast/" in fs.filename:
            where = f"{fs.filename.split('/perfcast/')[-1]}:{fs.name}"
            break
    return f"{type(exc).__name__} at {where}"


def _limit_memory(gb: float) -> None:
    if gb > 0:
        limit = int(gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _worker_main(conn: Any, memory_gb: float, scratch: str) -> None:
    """A long-lived worker: runs perfcast's CLI in-process for each argv it is sent."""
    os.nice(5)
    _limit_memory(memory_gb)
    from perfcast.cli.main import main

    out_path = Path(scratch) / f"w{os.getpid()}.out"
    err_path = Path(scratch) / f"w{os.getpid()}.err"
    while True:
        try:
            argv = conn.recv()
        except EOFError:
            return
        escaped = None
        rc: int | None = None
        with open(out_path, "w+b") as out, open(err_path, "w+b") as err:
            saved = os.dup(1), os.dup(2)
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            text_err = io.TextIOWrapper(os.fdopen(os.dup(2), "wb"), write_through=True)
            text_out = io.TextIOWrapper(os.fdopen(os.dup(1), "wb"), write_through=True)
            start = time.perf_counter()
            try:
                with contextlib.redirect_stdout(text_out), contextlib.redirect_stderr(text_err):
                    try:
                        rc = main(argv)
                    except SystemExit as exc:  # argparse
                        rc = exc.code if isinstance(exc.code, int) else 1
                    except BaseException as exc:
                        escaped = _worker_signature(exc)
                        traceback.print_exc()
            finally:
                seconds = time.perf_counter() - start
                with contextlib.suppress(Exception):
                    text_out.flush()
                    text_err.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
            err.seek(0)
            raw = err.read()
            # The last line whole (it decides the outcome), and the tail before it.
            cut = raw.rfind(b"\n", 0, max(len(raw) - 1, 0)) + 1
            stderr = (raw[max(cut - 4000, 0) : cut] + raw[cut:][:20000]).decode("utf-8", "replace")
        if "internal error" in stderr and escaped is None:
            # Rerun with --debug to name the place (the user sees the one line only).
            buf = io.StringIO()
            sig = None
            with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(io.StringIO()):
                try:
                    main(["--debug", *argv])
                except BaseException as exc:
                    sig = _worker_signature(exc)
            conn.send((rc, stderr, escaped, seconds, sig or _signature_from_text(buf.getvalue())))
            continue
        conn.send((rc, stderr, escaped, seconds, None))


class Worker:
    def __init__(self, memory_gb: float, scratch: Path) -> None:
        ctx = get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_worker_main, args=(child, memory_gb, str(scratch)), daemon=True
        )
        self.proc.start()
        child.close()

    def run(self, argv: list[str], timeout: float) -> tuple[str, Any]:
        self.conn.send(argv)
        if not self.conn.poll(timeout):
            return "timeout", None
        try:
            return "done", self.conn.recv()
        except (EOFError, ConnectionResetError):
            return "died", None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(5)


class Runner:
    """Runs stages with a time limit, in-process workers or one subprocess per stage."""

    def __init__(self, mode: str, timeout: float, memory_gb: float, scratch: Path) -> None:
        self.mode = mode
        self.timeout = timeout
        self.memory_gb = memory_gb
        self.scratch = scratch
        self.worker: Worker | None = None

    def run(self, argv: list[str]) -> Run:
        if self.mode == "subprocess":
            return self._subprocess(argv)
        if self.worker is None or not self.worker.proc.is_alive():
            self.worker = Worker(self.memory_gb, self.scratch)
            # Warm up: imports and numba compilation are not part of any input's time.
            self.worker.run(["--version"], 600)
        start = time.perf_counter()
        status, payload = self.worker.run(argv, self.timeout)
        if status == "timeout":
            self.worker.kill()
            self.worker = None
            return Run("timeout", None, time.perf_counter() - start)
        if status == "died":
            code = self.worker.proc.exitcode
            self.worker.kill()
            self.worker = None
            return Run("crash", None, time.perf_counter() - start, signature=f"died ({code})")
        rc, stderr, escaped, seconds, debug_sig = payload
        outcome, sig = classify(rc, stderr, escaped)
        if outcome == "internal" and debug_sig:
            sig = debug_sig  # where it happened, from the --debug rerun
        return Run(outcome, rc, seconds, stderr[-1500:], sig)

    def _subprocess(self, argv: list[str]) -> Run:
        start = time.perf_counter()
        try:
            p = subprocess.run(
                [sys.executable, "-m", "perfcast", *argv],
                capture_output=True,
                timeout=self.timeout,
                preexec_fn=lambda: _limit_memory(self.memory_gb),
            )
        except subprocess.TimeoutExpired:
            return Run("timeout", None, time.perf_counter() - start)
        seconds = time.perf_counter() - start
        stderr = p.stderr.decode("utf-8", "replace")
        if p.returncode < 0:
            return Run("crash", p.returncode, seconds, stderr[-1500:], f"signal {-p.returncode}")
        outcome, sig = classify(p.returncode, stderr, None)
        return Run(outcome, p.returncode, seconds, stderr[-1500:], sig)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.kill()


def digest(path: Path) -> str:
    h = hashlib.sha256()
    paths = sorted(path.iterdir()) if path.is_dir() else [path]
    for p in paths:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def run_input(runner: Runner, inp: Input, stages: tuple[str, ...], scratch: Path) -> dict:
    """Every stage on one input; the input must come out unchanged."""
    before = digest(inp.path)
    results: dict[str, Run] = {}
    for stage in stages:
        run = runner.run(stage_argv(stage, inp, scratch))
        if run.outcome in ("ok", "error") and digest(inp.path) != before:
            run = Run("modified", run.rc, run.seconds, run.stderr_tail, f"{stage} changed input")
        elif run.outcome == "error" and not any(
            name in run.stderr_tail.splitlines()[-1]
            for name in (inp.path.name, *([Path(inp.seed).name] if stage == "diff" else []))
        ):
            # The user must be told which file the message is about (diff: A or B).
            msg = _normalize_message(run.stderr_tail)
            run = Run("unnamed", run.rc, run.seconds, run.stderr_tail, f"{stage}: {msg[:120]}")
        results[stage] = run
    return {k: asdict(v) for k, v in results.items()}


# ---------------------------------------------------------------------------------------------
# Minimizing a failure


def _normalize_message(stderr: str) -> str:
    """The error line with paths, numbers and quoted details blanked, to count kinds."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    # A path, absolute or relative (`--out .bench/fuzz` gives ".bench/fuzz/inputs/..."):
    # everything from the first character of the word that holds a "/".
    last = re.sub(r"(?<!\S)[^\s/]*/\S+?(?=: | \(|$)", "PATH", last)
    last = re.sub(r"\([^()]*\)", "(...)", last)
    return re.sub(r"\d[\d,.]*", "N", last)[:200]


def _slug(sig: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", sig).strip("-")[:80] or "unknown"


def _decode(path: Path) -> Any:
    import gzip

    raw = path.read_bytes()
    try:
        return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except Exception:
        return None


def minimize(
    runner: Runner, inp: Input, stage: str, target: Run, workdir: Path, budget_s: float
) -> tuple[Path, int]:
    """The smallest input (greedy chunk removal) whose stage still fails the same way."""
    deadline = time.monotonic() + budget_s
    trial = workdir / ("min.json.gz" if str(inp.path).endswith(".gz") else "min.json")
    tries = 0

    def same(data: bytes) -> bool:
        nonlocal tries
        tries += 1
        trial.write_bytes(data)
        probe = Input(inp.index, trial, inp.seed, inp.mutations)
        run = runner.run(stage_argv(stage, probe, workdir))
        return run.outcome == target.outcome and run.signature == target.signature

    if inp.path.is_dir():
        return inp.path, 0
    data = inp.path.read_bytes()
    obj = _decode(inp.path)
    gz = data[:2] == b"\x1f\x8b"

    def encode(o: Any) -> bytes:
        import gzip

        raw = json.dumps(o).encode()
        return gzip.compress(raw, mtime=0) if gz else raw

    events = obj.get("traceEvents") if isinstance(obj, dict) else obj
    if isinstance(events, list) and time.monotonic() < deadline:
        # ddmin-style: drop chunks of events, halving the chunk size when nothing goes.
        chunk = max(len(events) // 2, 1)
        while chunk >= 1 and time.monotonic() < deadline:
            i = 0
            progressed = False
            while i < len(events) and time.monotonic() < deadline:
                cand = events[:i] + events[i + chunk :]
                doc = {**obj, "traceEvents": cand} if isinstance(obj, dict) else cand
                if cand and same(encode(doc)):
                    events = cand
                    obj = doc
                    progressed = True
                else:
                    i += chunk
            if not progressed:
                chunk //= 2
        data = encode(obj)
    elif time.monotonic() < deadline:
        # Bytes: cut the tail while the failure stays (corrupt or cut files).
        lo, hi = 1, len(data)
        while lo < hi and time.monotonic() < deadline:
            mid = (lo + hi) // 2
            if same(data[:mid]):
                hi = mid
            else:
                lo = mid + 1
        if same(data[:hi]):
            data = data[:hi]
    trial.write_bytes(data)
    return trial, tries


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--count", type=int, default=10_000, help="mutated inputs to run")
    ap.add_argument(
        "--start",
        type=int,
        default=0,
        help="first input index: resume a run, or shard one over cores (same --seed, "
        "--start 0 and --start N with --count N, each with its own --out)",
    )
    ap.add_argument("--seed", type=int, default=15, help="base random seed")
    ap.add_argument("--traces", type=Path, nargs="*", default=DEFAULT_TRACES)
    ap.add_argument("--out", type=Path, default=REPO / ".bench" / "fuzz")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per stage")
    ap.add_argument("--memory-gb", type=float, default=4.0, help="address-space limit per run")
    ap.add_argument("--mode", choices=["inprocess", "subprocess"], default="inprocess")
    ap.add_argument(
        "--no-crop", action="store_true", help="always the whole seed (default: windows)"
    )
    ap.add_argument("--minimize-s", type=float, default=120.0, help="budget per failure kind")
    ap.add_argument("--keep-going-stages", action="store_true",
                    help="run every stage even after the load failed cleanly")  # fmt: skip
    args = ap.parse_args(argv)

    stages = tuple(s for s in args.stages.split(",") if s)
    files, folders = seed_files(args.traces)
    if not files:
        print(f"no traces under {[str(t) for t in args.traces]}", file=sys.stderr)
        return 2
    out = args.out
    workdir = out / "inputs"
    scratch = out / "scratch"
    repro = out / "repro"
    for d in (workdir, scratch, repro):
        d.mkdir(parents=True, exist_ok=True)
    runner = Runner(args.mode, args.timeout, args.memory_gb, scratch)
    seeds = SeedCache()
    counts: dict[str, Counter] = defaultdict(Counter)
    by_mutator: dict[str, Counter] = defaultdict(Counter)
    failures: list[dict[str, Any]] = []
    signatures: Counter = Counter()
    messages: Counter = Counter()  # clean errors, normalized: what users are told
    seconds: dict[str, list[float]] = defaultdict(list)
    minimized: dict[str, str] = {}
    started = time.time()
    summary_path = out / "summary.json"

    def write_summary(done: int) -> None:
        doc = {
            "inputs": done,
            "stage_runs": sum(sum(c.values()) for c in counts.values()),
            "outcomes": dict(sum(counts.values(), Counter())),
            "by_stage": {k: dict(v) for k, v in counts.items()},
            "by_mutator": {k: dict(v) for k, v in sorted(by_mutator.items())},
            "signatures": dict(signatures.most_common()),
            "error_messages": dict(messages.most_common(200)),
            "stage_seconds": {
                k: {"mean": round(sum(v) / len(v), 3), "max": round(max(v), 2), "runs": len(v)}
                for k, v in seconds.items()
                if v
            },
            "failures": failures[-2000:],
            "minimized": minimized,
            "seconds": round(time.time() - started, 1),
            "args": {k: str(v) for k, v in vars(args).items()},
            "seeds": [str(f) for f in files] + [str(f) for f in folders],
        }
        summary_path.write_text(json.dumps(doc, indent=1))

    try:
        for i in range(args.start, args.start + args.count):
            inp = make_input(i, args.seed, files, folders, seeds, workdir, not args.no_crop)
            results: dict[str, dict] = {}
            for stage in stages:
                res = run_input(runner, inp, (stage,), scratch)[stage]
                results[stage] = res
                counts[stage][res["outcome"]] += 1
                seconds[stage].append(res["seconds"])
                if res["outcome"] == "error":
                    messages[_normalize_message(res["stderr_tail"])] += 1
                load_failed = stage == "summary" and res["outcome"] == "error"
                if load_failed and not args.keep_going_stages:
                    break  # the trace cannot be read: every stage would say the same
            bad = {s: r for s, r in results.items() if r["outcome"] not in ("ok", "error")}
            for m in inp.mutations:
                kind = m.split(":")[0] if not m.startswith(("rank", "worker")) else "folder"
                for r in results.values():
                    by_mutator[kind][r["outcome"]] += 1
            if bad:
                for stage, r in bad.items():
                    sig = f"{r['outcome']}: {r['signature']}"
                    signatures[sig] += 1
                    entry = {
                        "index": i,
                        "stage": stage,
                        "seed": inp.seed,
                        "mutations": inp.mutations,
                        **r,
                    }
                    failures.append(entry)
                    if sig not in minimized:
                        dest = repro / _slug(sig)
                        dest.mkdir(parents=True, exist_ok=True)
                        run = Run(r["outcome"], r["rc"], r["seconds"], "", r["signature"])
                        budget = 0 if r["outcome"] == "timeout" else args.minimize_s
                        small, tries = minimize(runner, inp, stage, run, scratch, budget)
                        target = dest / (small.name if small.is_file() else "ranks")
                        if small.is_dir():
                            shutil.copytree(small, target, dirs_exist_ok=True)
                        else:
                            shutil.copyfile(small, target)
                        (dest / "info.json").write_text(json.dumps(
                            {**entry, "argv": stage_argv(stage, Input(i, target, "", []), scratch),
                             "minimize_tries": tries}, indent=1))  # fmt: skip
                        minimized[sig] = str(dest)
                        print(f"[{i}] new failure: {sig} ({stage}) -> {dest}", flush=True)
            if inp.path.is_dir():
                shutil.rmtree(inp.path, ignore_errors=True)
            else:
                inp.path.unlink(missing_ok=True)
            done = i - args.start + 1
            if done % 50 == 0 or done == args.count:
                total = dict(sum(counts.values(), Counter()))
                rate = done / max(time.time() - started, 1e-9)
                print(f"{done}/{args.count} inputs, {rate:.2f}/s: {total}", flush=True)
                write_summary(done)
    finally:
        runner.close()
    write_summary(args.count)
    total = sum(counts.values(), Counter())
    print(json.dumps({"outcomes": dict(total), "signatures": dict(signatures)}, indent=1))
    return 0 if all(total[o] == 0 for o in OUTCOMES[2:]) else 1


if __name__ == "__main__":
    sys.exit(main())
