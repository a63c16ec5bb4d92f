"""What README.md names exists as it says: command lines parse with today's CLI, every
`--option` it shows belongs to a command, every `perfcast.X` it shows resolves, every file it
names is in the repository, and the lists and counts it gives match the code's."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfcast.analysis.battery import ANALYSES
from perfcast.capture.profiler import _build_parser as profile_parser
from perfcast.cli.main import build_parser
from perfcast.whatif.registry import MODEL_MODULES, PLAN_ORDER

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
EXAMPLE = "perfcast/examples/ddp_a100_rank0.json.gz"

# Placeholders the README writes in command lines, and a value each parses with.
_PLACEHOLDERS = {
    "PATH": EXAMPLE,
    "TRACE": EXAMPLE,
    "A": EXAMPLE,
    "B": EXAMPLE,
    "RESULT.json": "result.json",
    "NAME[:k=v,...]": "amp",
    "NAME,...": "kernels,idle",
    "NAME...": "amp",
    "N": "8",
    "DIR": "out",
    "NAME": "gpt-22b",
}


def _spans() -> list[str]:
    """The inline code spans, outside the fenced blocks."""
    prose = re.sub(r"```.*?```", "", README, flags=re.S)
    return re.findall(r"`([^`]+)`", prose)


def _bash_lines() -> list[str]:
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        lines += [line for line in block.splitlines() if line.strip()]
    return lines


def _perfcast_argvs() -> Iterator[tuple[str, list[str]]]:
    """(as written, argv after `perfcast`) for each perfcast command line the README shows:
    in its shell blocks, and inline ones (`perfcast plan PATH --gpus N`) with their
    placeholders filled in and optional parts ([--device h100]) taken."""
    for line in _bash_lines():
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            if words and words[0].endswith("perfcast"):
                yield line, words[1:]
    for span in _spans():
        text = " ".join(span.split())  # a span may wrap over two lines
        if not text.startswith("perfcast ") or "..." in text.replace("NAME", ""):
            continue
        words = [
            _PLACEHOLDERS.get(w, w) for w in shlex.split(text.replace("[", " ").replace("]", " "))
        ]
        yield span, [_PLACEHOLDERS.get(w, w) for w in words[1:]]


# What a command requires besides its trace, for prose that names the bare command.
_REQUIRED = {"plan": ["--gpus", "8"]}


def _parse(argv: list[str]) -> None:
    if argv and argv[0] == "profile":  # main() hands profile its arguments unparsed
        rest = argv[1:]
        options = rest[: rest.index("--")] if "--" in rest else rest
        profile_parser().parse_args(options)
    else:
        build_parser().parse_args(argv)


def test_every_command_line_parses(capsys):
    seen = 0
    for written, argv in _perfcast_argvs():
        try:
            _parse(argv)
        except SystemExit:
            # Prose names a command with some of its options, its trace left out
            # (`perfcast whatif --tree`): with the trace added it parses.
            error = capsys.readouterr().err.strip()
            try:
                _parse([*argv[:1], EXAMPLE, *argv[1:], *_REQUIRED.get(argv[0], [])])
            except SystemExit:
                pytest.fail(f"README's `{written}` does not parse: {error}")
        seen += 1
    assert seen >= 30, seen  # the shell blocks and the inline commands were found


def _perfcast_options() -> set[str]:
    options: set[str] = set()

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            options.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)

    walk(build_parser())
    walk(profile_parser())
    return options


# Options of other programs the README shows (torchrun's, the user's own script's).
_FOREIGN = {"--nproc-per-node", "--your-args"}
# Benchmark options the prose names apart from their command line.
_BENCHMARK = {"--hta-aten", "--no-hta", "--update-readme", "--record"}


def test_every_option_shown_exists():
    """A `--flag` in the README is an option of a perfcast command, or of the benchmark
    script it is shown with (its source declares it)."""
    options = _perfcast_options()
    benchmarks = "".join(p.read_text() for p in (ROOT / "benchmarks").rglob("*.py"))
    texts = _spans() + _bash_lines()
    missing = set()
    for text in texts:
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text):
            if flag in options or flag in _FOREIGN:
                continue
            shown_with_benchmark = "bench" in text or flag in _BENCHMARK
            if not shown_with_benchmark or f'"{flag}"' not in benchmarks:
                missing.add(flag)
    assert not missing, f"options the README shows that no command has: {sorted(missing)}"


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def test_every_api_name_exists():
    names = set(re.findall(r"\bperfcast(?:\.[A-Za-z_]\w*)+", README))
    assert len(names) >= 20
    for name in sorted(names):
        try:
            _resolve(name)
        except (ImportError, AttributeError) as exc:
            pytest.fail(f"README names {name}, which does not exist ({exc})")
    errors = re.search(r"`perfcast\.PerfcastError`.*?report it\.", README, flags=re.S)
    assert errors is not None
    for cls in re.findall(r"`([A-Z]\w+Error)`", errors.group(0)):
        assert hasattr(importlib.import_module("perfcast"), cls), cls


def test_every_file_named_exists():
    paths = set(re.findall(r"(?<![\w/.~])((?:perfcast|benchmarks|tests|\.ci)/[\w./-]*\w)", README))
    assert len(paths) >= 30
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"files the README names that are not in the repository: {missing}"


def test_counts_and_lists_match_the_code():
    # "runs eleven analyses on every rank", and the table lists each once.
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    words += ["eleven", "twelve", "thirteen"]
    said = re.search(r"`perfcast analyze PATH` runs (\w+) analyses", README)
    assert said is not None and words.index(said.group(1)) + 1 == len(ANALYSES)
    section = README.split("## Trace analyses", 1)[1].split("\nChecked against", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \|", section, flags=re.M)
    assert rows == list(ANALYSES)
    # The what-if table lists every model, once.
    section = README.split("## Optimizations it can model", 1)[1].split("\nThe four", 1)[0]
    rows = re.findall(r"^\| `([\w-]+)` \|", section, flags=re.M)
    assert sorted(rows) == sorted(MODEL_MODULES)
    # The order code changes compose in, as the commands table gives it.
    said = re.search(r"apply in one order whatever the command line's, ([^()]*?), as the", README)
    assert said is not None
    spoken = {
        "batch size": "batch-size",
        "fused optimizer": "fused-optimizer",
        "amp": "amp",
        "activation checkpointing": "activation-checkpointing",
        "sync removal": "remove-host-sync",
        "fusion": "fuse-elementwise",
        "torch.compile": "torch-compile",
        "CUDA graphs": "cuda-graphs",
    }
    order = [spoken[w.strip().removeprefix("then ")] for w in said.group(1).split(",")]
    assert order == [n for n in PLAN_ORDER if n != "dataloader-overlap"]


def _commands_with(option: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name
        for name, parser in sub.choices.items()
        if any(option in a.option_strings for a in parser._actions)
    }


def _named_commands(sentence: str) -> set[str]:
    return set(re.findall(r"`(\w+)`", sentence))


def test_option_lists_name_every_command():
    """The README's lists of the commands that take an option are whole: a command that
    gained `--keep-profiler-cost` (plan) is in it."""
    prose = " ".join(README.split())
    said = re.search(r"((?:`\w+`,? )+(?:and `\w+` ))take `--keep-profiler-cost`", prose)
    assert said is not None
    assert _named_commands(said.group(1)) == _commands_with("--keep-profiler-cost")
    said = re.search(r"`--top N` on ((?:`\w+`,? )+and `\w+`)", prose)
    assert said is not None
    assert _named_commands(said.group(1)) == _commands_with("--top")
    said = re.search(r"`analyze`/`diff` take `--csv DIR` and `--parquet DIR`", prose)
    assert said is not None
    assert _commands_with("--csv") == _commands_with("--parquet") == {"analyze", "diff"}


def test_rows_caps_every_table_in_the_terminal(capsys):
    """`analyze --rows N` caps what each table shows in the terminal, ranked tables too, not
    only the time series (as the README said)."""
    from perfcast.cli.main import main

    said = re.search(r"`analyze --rows N` caps ([^;(]*)", " ".join(README.split()))
    assert said is not None and "in the terminal" in said.group(1), said
    assert "time series" not in said.group(1)
    assert main(["analyze", str(ROOT / EXAMPLE), "--only", "kernels", "--rows", "2", "-q"]) == 0
    out = capsys.readouterr().out
    assert "more rows (--json" in out  # the top kernels table, 10 rows, shows 2


# The packages in the order the README's "How it works" says they import down.
_LAYERS = {"ingest": 0, "graph": 1, "real": 2, "sim": 3, "analysis": 4, "whatif": 5}
_LAYERS |= {"plan": 5, "memory_model": 5, "advisor": 6, "report": 7, "cli": 8, "api": 8}
# Each import against that order, and the words the README names it with.
_AGAINST = {
    ("plan", "advisor"): "the advisor's error bands",
    ("analysis", "memory_model"): "the memory model's trace facts",
    ("analysis", "whatif"): "the what-if runner's",
    ("real", "sim"): "with `sim`",
}


def _imports_against_the_layers() -> Iterator[tuple[str, str, int, bool]]:
    """(package, package it imports, line, inside a function) for every runtime import of a
    package further down the README's line (TYPE_CHECKING imports are no imports)."""
    import ast

    for path in sorted((ROOT / "perfcast").rglob("*.py")):
        package = path.relative_to(ROOT / "perfcast").parts[0].removesuffix(".py")
        if package not in _LAYERS:
            continue
        tree = ast.parse(path.read_text())
        skip = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)
        }
        in_function = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(node)
        }
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                parts = [*name.split("."), ""]
                target = parts[1] if parts[0] == "perfcast" else ""
                if target in _LAYERS and _LAYERS[target] > _LAYERS[package]:
                    yield package, target, node.lineno, id(node) in in_function


def test_imports_against_the_layers_are_the_ones_the_readme_names():
    how = " ".join(README.split("## How it works", 1)[1].split("\n- ", 1)[0].split())
    for package, target, line, lazy in _imports_against_the_layers():
        where = f"perfcast/{package} imports perfcast.{target} (line {line})"
        assert lazy, f"{where} at module level: the README says they import down"
        words = _AGAINST.get((package, target))
        assert words is not None and words in how, f"{where}: the README does not name it"


def _handler_trace(path: Path) -> Path:
    """A small trace of one process, no rank in it, under the name torch.profiler's
    tensorboard_trace_handler gives it."""
    from tests.tracegen import linear_steps

    return linear_steps().write(path)


def test_two_cycles_of_one_process_are_not_two_ranks(tmp_path: Path):
    """The README's folder is one file per rank. torch.profiler's own recipe
    (tensorboard_trace_handler with a repeating schedule) writes one file per cycle into one
    folder, `host_pid.<ms>.pt.trace.json`: a single-process job's two cycles were read as
    ranks 0 and 1, every figure a mean over two 'ranks'. Now refused, naming both files."""
    import perfcast
    from perfcast.errors import TraceFormatError

    _handler_trace(tmp_path / "box_4242.1732900000123.pt.trace.json")
    _handler_trace(tmp_path / "box_4242.1732900009876.pt.trace.json.gz")
    with pytest.raises(TraceFormatError, match="second trace of the process that wrote box_4242"):
        perfcast.load(tmp_path)
    # Two processes (ranks of a job whose traces do not say their rank) stay two ranks.
    (tmp_path / "box_4242.1732900009876.pt.trace.json.gz").rename(
        tmp_path / "box_4243.1732900009876.pt.trace.json.gz"
    )
    assert sorted(r.rank for r in perfcast.load(tmp_path).ranks) == [0, 1]


def test_every_link_within_the_readme_has_its_heading():
    """`[...](#anchor)` links reach a heading, slugged as GitHub slugs them."""
    slugs = set()
    for heading in re.findall(r"^#+ (.+)$", README, flags=re.M):
        text = re.sub(r"[`*]", "", heading).strip().lower()
        slugs.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    links = re.findall(r"\]\(#([^)]+)\)", README)
    assert links
    assert not [a for a in links if a not in slugs], sorted(slugs)


def test_capture_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The README's `perfcast.capture` block, with a loader and a step of a tiny model: it
    writes its trace where the block says."""
    torch = pytest.importorskip("torch")
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    (block,) = [b for b in blocks if "perfcast.capture.capture(" in b]
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_step(batch: int) -> None:
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    monkeypatch.chdir(tmp_path)
    # 18 steps: the default schedule's trace with all its active steps and the unprofiled
    # steps after it (README; with 12 the trace is written and a warning says they were not).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec(block, {"loader": range(18), "train_step": train_step})
    import perfcast

    trace = perfcast.summary(tmp_path / "traces" / "rank0.json.gz", correct=False)
    assert len(trace.ranks[0].iterations) == 3
