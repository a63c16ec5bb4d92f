"""perfcast.capture: traces from a real (tiny, CPU) PyTorch training loop."""

from __future__ import annotations

import gzip
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from perfcast.capture import capture, run_profile, step  # noqa: E402


def _load(path: Path) -> dict:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def _step_names(trace: dict) -> set[str]:
    return {
        e["name"]
        for e in trace["traceEvents"]
        if isinstance(e.get("name"), str) and e["name"].startswith("ProfilerStep#")
    }


def _train(n_steps: int, *, explicit: bool = False) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(n_steps):
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if explicit:
            step()


def test_optimizer_hook_marks_steps(tmp_path: Path) -> None:
    with capture(tmp_path, wait=1, warmup=1, active=2, unprofiled=0) as cap:
        _train(6)
    assert cap.steps == 6
    assert cap.automatic
    assert cap.trace_paths == [tmp_path / "rank0.json.gz"]
    trace = _load(cap.trace_paths[0])
    assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    assert _step_names(trace) == {"ProfilerStep#2", "ProfilerStep#3"}
    names = {e.get("name") for e in trace["traceEvents"]}
    assert any(isinstance(n, str) and n.startswith("aten::addmm") for n in names)
    # The global hook is gone once the capture ended: stepping an optimizer is harmless.
    _train(1)
    assert cap.steps == 6


def test_explicit_steps_disable_hook(tmp_path: Path) -> None:
    with capture(tmp_path, wait=0, warmup=1, active=2, unprofiled=0) as cap:
        _train(4, explicit=True)
    # One boundary per iteration: the hook only marked the first one, before step() took over.
    assert cap.steps == 4
    assert not cap.automatic
    trace = _load(cap.trace_paths[0])
    assert _step_names(trace) == {"ProfilerStep#1", "ProfilerStep#2"}
    # Each recorded step holds a whole iteration, optimizer included.
    optim = [e for e in trace["traceEvents"] if str(e.get("name")).startswith("Optimizer.step")]
    assert len(optim) == 2


def test_several_cycles_and_rank_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import perfcast

    monkeypatch.setenv("RANK", "3")
    with capture(tmp_path, wait=0, warmup=1, active=1, repeat=2, unprofiled=0) as cap:
        _train(5)
    # One folder per cycle, each holding every rank's trace of it: a folder loads as one run
    # (two files of one rank in one folder are refused as two claims on rank 3).
    assert [p.relative_to(tmp_path).as_posix() for p in cap.trace_paths] == [
        "step2/rank3.json.gz",
        "step4/rank3.json.gz",
    ]
    assert cap.finished
    for path in cap.trace_paths:
        assert _step_names(_load(path))
    assert perfcast.load(tmp_path / "step4").ranks[0].rank == 3
    with pytest.raises(perfcast.PerfcastError, match="one folder per profiled cycle") as info:
        perfcast.load(tmp_path)
    assert "step2, step4" in str(info.value.hint)


def test_step_without_capture_is_noop() -> None:
    step()


def test_run_profile_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import torch

            steps = int(sys.argv[1])
            model = torch.nn.Linear(8, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(steps):
                loss = model(torch.randn(4, 8)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            """
        )
    )
    out = tmp_path / "traces"
    rc = run_profile(["-o", str(out), "--max-steps", "5", "--", "python", str(script), "1000"])
    assert rc == 0
    assert "traces" in capsys.readouterr().out
    trace = _load(out / "rank0.json.gz")
    assert _step_names(trace) == {"ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"}

    # --json: the trace paths, machine-readable; and the trace feeds the analysis.
    out2 = tmp_path / "traces2"
    argv = ["-o", str(out2), "--max-steps", "5", "--json", "--", "python", str(script), "1000"]
    assert run_profile(argv) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["traces"] == [str(out2 / "rank0.json.gz")]
    import perfcast

    assert [it.name for it in perfcast.summary(str(out2)).ranks[0].iterations] == [
        "ProfilerStep#2",
        "ProfilerStep#3",
        "ProfilerStep#4",
    ]
    # The step hook runs inside `Optimizer.step#...`: the stop leaves that range open in every
    # trace perfcast profile writes, which is no news to the user.
    assert not any("range(s) open" in w for w in perfcast.load(str(out2)).ranks[0].warnings)


def test_run_profile_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = run_profile(["-o", str(tmp_path), "--", "python", str(tmp_path / "missing.py")])
    assert rc == 2
    err = capsys.readouterr().err
    # One line in the form every command's errors take.
    assert err.startswith("perfcast: error: script not found") and err.count("\n") == 1

    idle = tmp_path / "idle.py"
    idle.write_text("x = 1\n")
    rc = run_profile(["-o", str(tmp_path / "t"), "--", "python", str(idle)])
    assert rc == 2
    assert "no training steps" in capsys.readouterr().err


def test_a_script_that_fails_early_keeps_its_exit_status(tmp_path: Path, capsys) -> None:
    """It was reported as perfcast's "too few steps" (exit 2), under the script's traceback."""
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT.replace("    opt.step()\n", "    opt.step()\n    sys.exit(3)\n"))
    rc = run_profile(["-o", str(tmp_path / "t"), "--", "python", str(script), "5", "x"])
    err = capsys.readouterr().err
    assert rc == 3
    assert "the script failed (exit status 3) after 1 step(s), before a trace was written" in err


def test_run_profile_refuses_a_folder_it_cannot_write_before_the_script_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The profiler's export fails silently: the script trained to its end for nothing, a
    traceback came from inside its optimizer step, and then "too few steps"."""
    script = tmp_path / "train.py"
    marker = tmp_path / "ran.txt"
    script.write_text(_SCRIPT)
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    rc = run_profile(["-o", str(a_file / "sub"), "--", "python", str(script), "3", str(marker)])
    assert rc == 2 and not marker.exists()
    err = capsys.readouterr().err
    assert err.startswith("perfcast: error: cannot write traces to") and err.count("\n") == 1


_STEPS_SCRIPT = """
import os, sys
import torch

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(int(sys.argv[1])):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    ACTION
"""
# A loop of N steps (argv[1]) that leaves a marker (argv[2]) when it runs to its end.
_SCRIPT = (
    _STEPS_SCRIPT.replace("ACTION", "pass")
    + 'import pathlib\npathlib.Path(sys.argv[2]).write_text("the script ran to its end")\n'
)


def test_run_profile_refuses_a_folder_with_traces(tmp_path: Path, capsys) -> None:
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    out = tmp_path / "traces"
    cmd = ["--", "python", str(script), "14", str(tmp_path / "done")]
    assert run_profile(["-o", str(out), *cmd]) == 0
    first = (out / "rank0.json.gz").read_bytes()
    capsys.readouterr()

    # A second capture into the same folder would mix two runs: refused, nothing touched.
    assert run_profile(["-o", str(out), *cmd]) == 2
    err = capsys.readouterr().err
    assert "already holds traces (rank0.json.gz)" in err and "--overwrite" in err
    assert (out / "rank0.json.gz").read_bytes() == first

    # --overwrite replaces what perfcast profile wrote ...
    assert run_profile(["-o", str(out), "--overwrite", *cmd]) == 0
    assert (out / "rank0.json.gz").read_bytes() != first
    # ... but never trace files of other origins.
    (out / "colleague.json").write_text("{}")
    assert run_profile(["-o", str(out), "--overwrite", *cmd]) == 2
    assert "did not write (colleague.json)" in capsys.readouterr().err
    assert (out / "colleague.json").read_text() == "{}"


def test_run_profile_replaces_its_cycle_folders_and_killed_runs_temporary_files(
    tmp_path: Path, capsys
) -> None:
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    out = tmp_path / "traces"
    cmd = ["--", "python", str(script), "30", str(tmp_path / "done")]
    assert run_profile(["-o", str(out), "--repeat", "2", "--unprofiled-steps", "0", *cmd]) == 0
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.gz")) == [
        "step10/rank0.json.gz",
        "step5/rank0.json.gz",
    ]
    assert "step5/rank0.json.gz, step10/rank0.json.gz" in capsys.readouterr().out
    assert run_profile(["-o", str(out), *cmd]) == 2
    assert "already holds traces (step5/rank0.json.gz, step10/" in capsys.readouterr().err
    # What a run killed while holding its export leaves: hidden, never read as a trace.
    (out / ".rank0.json.gz.4242.json").write_text("{}")
    assert run_profile(["-o", str(out), "--overwrite", *cmd]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["profiler.log", "rank0.json.gz"]


_SIGTERM_SCRIPT = """
import os, signal, sys
import torch
from perfcast.capture import capture

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with capture(sys.argv[1], wait=0, warmup=1, active=2, unprofiled=2, unprofiled_after=3) as cap:
    for i in range(40):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        if cap._held:  # the window after the trace is being timed: the job is told to stop
            os.kill(os.getpid(), signal.SIGTERM)
"""


def test_a_sigterm_while_the_steps_after_the_trace_are_timed_still_writes_it(
    tmp_path: Path,
) -> None:
    """By default SIGTERM ends Python without cleanup: the finished trace was lost and its
    hidden temporary file blocked the folder."""
    import subprocess
    import sys

    import perfcast

    script = tmp_path / "kill.py"
    script.write_text(_SIGTERM_SCRIPT)
    out = tmp_path / "t"
    done = subprocess.run([sys.executable, str(script), str(out)], timeout=300, check=False)
    assert done.returncode == -15  # still ended by the signal, as without perfcast
    assert sorted(p.name for p in out.iterdir() if p.name != "profiler.log") == ["rank0.json.gz"]
    assert len(perfcast.load(out).iterations) == 2


def test_a_script_that_ends_inside_the_window_has_its_open_last_step_left_out(
    tmp_path: Path,
) -> None:
    """The ProfilerStep the last boundary opened holds what ran after the loop: it was
    counted as a step (a 24 ms "step" among 1 ms ones, and a profiler-cost fit 5x off)."""
    import perfcast

    with capture(tmp_path, wait=0, warmup=1, active=3, unprofiled=0) as cap:
        _train(3)  # the window's 3rd step is open when the loop ends
        torch.randn(256, 256) @ torch.randn(256, 256)  # after the loop
    assert not cap.finished
    assert _load(cap.trace_paths[0])["perfcast_last_step_open"] is True
    trace = perfcast.load(cap.trace_paths[0])
    assert [it.name for it in trace.iterations] == ["ProfilerStep#1", "ProfilerStep#2"]
    note = "the last step, ProfilerStep#3 ("
    assert any(
        w.startswith(note) and "still open when the script" in w for w in trace.ranks[0].warnings
    )


def test_run_profile_stops_the_script_once_the_capture_is_written(tmp_path: Path, capsys) -> None:
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    done = tmp_path / "done"
    # Default schedule: 1 warm-up + 6 unprofiled steps, then wait 1 + warmup 1 + active 3,
    # then 3 steps absorbing the export + 3 unprofiled: 18 steps of the script's 50.
    assert (
        run_profile(["-o", str(tmp_path / "a"), "--", "python", str(script), "50", str(done)]) == 0
    )
    err = capsys.readouterr().err
    assert not done.exists()
    assert "stopped the script after step 18" in err
    argv = ["-o", str(tmp_path / "b"), "--run-to-end", "--", "python", str(script), "50", str(done)]
    assert run_profile(argv) == 0
    assert done.read_text() == "the script ran to its end"


def test_run_profile_keeps_profiler_output_off_the_terminal(tmp_path: Path, capfd) -> None:
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    cmd = ["--", "python", str(script), "14", str(tmp_path / "done")]
    assert run_profile(["-o", str(tmp_path / "quiet"), *cmd]) == 0
    quiet = capfd.readouterr().err
    log = (tmp_path / "quiet" / "profiler.log").read_text()
    assert run_profile(["-o", str(tmp_path / "loud"), "--show-profiler-output", *cmd]) == 0
    loud = capfd.readouterr().err
    assert not (tmp_path / "loud" / "profiler.log").exists()
    if "USDT" not in loud:
        pytest.skip("this torch build writes nothing of its own on stderr")
    # The same native lines: in the log by default, on the terminal when asked for.
    assert "USDT" not in quiet
    assert "profiler_start" in log and "profiler_start" in loud


def test_steps_are_timed_without_the_profiler_and_written_into_the_trace(tmp_path: Path) -> None:
    import perfcast

    with capture(tmp_path, wait=1, warmup=1, active=2, unprofiled=4) as cap:
        assert cap.schedule_steps == 5 + 4 + 5
        _train(16)  # 1 warm-up + 4 timed + 4 profiled + 3 absorbing the export + 2 timed
        # The trace waits for the window after it, then is written at once, mid-loop.
    assert len(cap.unprofiled_step_ms) == 3 and all(x > 0 for x in cap.unprofiled_step_ms)
    assert len(cap.unprofiled_after_step_ms) == 1 and cap.unprofiled_after_step_ms[0] > 0
    assert len(cap.trace_paths) == 1 and not list(tmp_path.glob(".*"))  # no leftovers
    raw = _load(cap.trace_paths[0])
    assert raw["perfcast_unprofiled_after_step_ms"] == cap.unprofiled_after_step_ms
    table = perfcast.load(cap.trace_paths[0])
    assert table.ranks[0].unprofiled_step_ms == pytest.approx(cap.unprofiled_step_ms)
    assert table.ranks[0].unprofiled_after_step_ms == pytest.approx(cap.unprofiled_after_step_ms)
    # The profiled steps are the ones between the timed ones: two of them, as scheduled.
    assert len(table.iterations) == 2
    # Predictions fit the profiler's cost to the steps on both sides.
    r = perfcast.predict(table, [])
    both = cap.unprofiled_step_ms + cap.unprofiled_after_step_ms
    assert r.measured_real_ms == pytest.approx(float(np.median(both)))
    assert r.correction.source in ("fit", "default", "calibration")


def test_a_loop_that_ends_before_the_window_after_the_trace_still_writes_it(
    tmp_path: Path,
) -> None:
    import perfcast

    late = r"ended 4 step\(s\) after the trace, before the 3 "
    with (
        pytest.warns(UserWarning, match=late),
        capture(tmp_path, wait=0, warmup=1, active=2, unprofiled=2, unprofiled_after=3) as cap,
    ):
        _train(3 + 3 + 4)  # the window after the trace needs 3 + 3 steps; only 4 run
    assert cap.untimed_after and "only the 2 timed before it" in cap.untimed_after
    assert cap.finished and len(cap.trace_paths) == 1 and not cap.unprofiled_after_step_ms
    assert "perfcast_unprofiled_after_step_ms" not in _load(cap.trace_paths[0])
    assert len(perfcast.load(cap.trace_paths[0]).iterations) == 2
    assert not list(tmp_path.glob(".*"))
    # With several cycles nothing is timed after them (the next cycle follows at once).
    with capture(tmp_path / "r", wait=0, warmup=1, active=1, repeat=2, unprofiled=2) as cap:
        assert cap.unprofiled_after == 0 and cap.schedule_steps == 3 + 4
        _train(7)
    assert len(cap.trace_paths) == 2


_DDP_SCRIPT = """
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
for _ in range(40):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
dist.destroy_process_group()
"""


def test_run_profile_through_torchrun_writes_one_trace_per_rank(tmp_path: Path) -> None:
    """`perfcast profile -- torchrun ...` profiles every worker the launcher starts (a DDP
    job on gloo here), and the folder is the multi-rank input the analyses take."""
    import subprocess
    import sys

    script = tmp_path / "train_ddp.py"
    script.write_text(_DDP_SCRIPT)
    out = tmp_path / "traces"
    launcher = ["torchrun", "--standalone", "--nproc-per-node=2", str(script)]
    cmd = [sys.executable, "-m", "perfcast", "profile", "-o", str(out), "--json", "--", *launcher]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)  # the parent's report alone: the workers' lines go to stderr
    assert [Path(p).name for p in doc["traces"]] == ["rank0.json.gz", "rank1.json.gz"]
    assert doc["launcher_exit_status"] == 0
    import perfcast

    summary = perfcast.summary(str(out))
    assert [r.rank for r in summary.ranks] == [0, 1]
    assert all(len(r.iterations) == 3 for r in summary.ranks)
    names = {e.get("name") for e in _load(out / "rank1.json.gz")["traceEvents"]}
    assert any("all_reduce" in str(n) or "allreduce" in str(n) for n in names)
    # gloo's collectives (ranges on its worker threads) are read, matched across the ranks,
    # and the replay with them as dependencies still reproduces every step.
    rows = perfcast.collectives(str(out)).by_op
    assert {r.rank for r in rows} == {0, 1}
    assert all(r.op == "allreduce" and r.size_bytes > 0 and r.group_size == 2 for r in rows)
    replayed = perfcast.replay(str(out))
    assert replayed.max_abs_error_pct < 0.5
    assert any("matched across 2 ranks" in a for a in replayed.assumptions)


@pytest.mark.parametrize(
    ("cmd", "kept", "worker"),
    [
        (  # the launcher's options kept as given, the script and its arguments after "--"
            ["torchrun", "--nproc-per-node", "2", "--max-restarts=1", "train.py", "--lr", "3"],
            ["--nproc-per-node", "2", "--max-restarts=1"],
            ["train.py", "--lr", "3"],
        ),
        (  # a "--" right after the script is the script's, and torchrun's parser drops it
            ["torchrun", "--nproc-per-node", "2", "train.py", "--", "--lr", "3"],
            ["--nproc-per-node", "2"],
            ["train.py", "--", "--lr", "3"],
        ),
        (  # interpreter flags before -m
            ["python", "-u", "-m", "torch.distributed.run", "--standalone", "t.py"],
            ["--standalone"],
            ["t.py"],
        ),
        (  # a module script runs as `python -m`
            ["python3", "-m", "torch.distributed.run", "--standalone", "-m", "pkg.train", "-x"],
            ["--standalone"],
            ["python", "-m", "pkg.train", "-x"],
        ),
    ],
)
def test_launcher_commands_run_perfcast_profile_as_every_worker(
    cmd: list[str], kept: list[str], worker: list[str]
) -> None:
    import sys

    from perfcast.capture.launch import launcher_args, worker_command
    from perfcast.capture.profiler import _parse_target

    def launcher_of(cmd: list[str]) -> list[str] | None:
        return launcher_args(cmd, *_parse_target(cmd))

    launcher = launcher_of(cmd)
    assert launcher is not None
    assert worker_command(launcher, ["-q"]) == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *kept,
        *["-m", "perfcast", "profile", "-q", "--"],
        *worker,
    ]
    assert launcher_of(["python", "train.py"]) is None
    assert launcher_of(["train.py", "torchrun"]) is None
    assert launcher_of(["python", "-m", "pkg.train"]) is None


@pytest.mark.parametrize(
    ("launcher", "message"),
    [
        (["torchrun", "--nproc-per-node"], "torchrun: argument --nproc-per-node"),
        (["torchrun", "--no-python", "train.sh"], "needs a Python script or module"),
        (["python", "-m", "torch.distributed.launch", "t.py"], "use torchrun"),
        (["torchrun", "--run-path", "t.py"], "drop it"),
    ],
)
def test_launchers_perfcast_cannot_profile_through_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], launcher: list[str], message: str
) -> None:
    assert run_profile(["-o", str(tmp_path / "t"), "--", *launcher]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t").exists()


_FAST = ["--unprofiled-steps", "0", "--wait", "0", "--warmup", "1"]


def _steps_script(tmp_path: Path, action: str) -> Path:
    script = tmp_path / "train.py"
    script.write_text(_STEPS_SCRIPT.replace("ACTION", action))
    return script


def test_a_forked_child_that_runs_on_neither_reports_nor_writes_the_parents_trace(
    tmp_path: Path,
) -> None:
    """The child inherited the capture: it stepped the profiler, overwrote the parent's trace
    with its own, reported it, and hung at exit in Kineto's destructors."""
    import subprocess
    import sys

    import perfcast

    script = _steps_script(tmp_path, "if step == 1 and os.fork() == 0: sys.exit(0)")
    out = tmp_path / "t"
    cmd = [sys.executable, "-m", "perfcast", "profile", "-o", str(out), *_FAST]
    done = subprocess.run(
        [*cmd, "--active", "3", "--", "python", str(script), "40"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("wrote 1 trace(s)") == 1, done.stdout
    assert "error" not in done.stderr
    assert [it.name for it in perfcast.load(out).iterations] == [
        "ProfilerStep#1",
        "ProfilerStep#2",
        "ProfilerStep#3",
    ]


def test_a_script_that_ends_before_an_active_step_writes_no_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stopped in the warm-up, the trace held only the open step after the loop, and the run
    said it wrote it."""
    script = _steps_script(tmp_path, "pass")
    out = tmp_path / "t"
    rc = run_profile(["-o", str(out), *_FAST, "--active", "2", "--", "python", str(script), "1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "no trace written: only 1 step(s) ran, the schedule needs 2+" in err
    assert not out.exists()  # the folder this run made is gone again


def test_ctrl_c_says_what_was_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import perfcast

    script = _steps_script(tmp_path, "if step == 3: raise KeyboardInterrupt")
    out = tmp_path / "t"
    rc = run_profile(["-o", str(out), *_FAST, "--active", "5", "--", "python", str(script), "9"])
    err = capsys.readouterr().err
    assert rc == 130
    assert "interrupted after 4 step(s); wrote 1 trace(s)" in err and "partial" in err, err
    assert len(perfcast.load(out).iterations) == 3  # steps 1-3 after the warm-up one


def test_the_scripts_traceback_is_its_own(tmp_path: Path, capsys) -> None:
    script = _steps_script(tmp_path, "if step == 2: raise ValueError('boom')")
    rc = run_profile(["-o", str(tmp_path / "t"), *_FAST, "--", "python", str(script), "9"])
    err = capsys.readouterr().err
    assert rc == 1
    assert f'File "{script}"' in err and "ValueError: boom" in err
    assert "runpy" not in err and "capture/profiler.py" not in err, err


def test_the_scripts_own_capture_stands_aside_under_perfcast_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import perfcast

    script = tmp_path / "own.py"
    script.write_text(
        _STEPS_SCRIPT.replace(
            "for step", "with perfcast.capture.capture(sys.argv[2]) as cap:\n for step"
        )
        .replace("\n    ", "\n     ")
        .replace("ACTION", "cap.step()")
        .replace("import torch", "import torch\nimport perfcast")
    )
    out = tmp_path / "t"
    own = tmp_path / "own"
    rc = run_profile(
        ["-o", str(out), *_FAST, "--active", "2", "--", "python", str(script), "20", str(own)]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "stands aside" in err
    assert len(perfcast.load(out).iterations) == 2
    assert not own.exists()


def test_capture_refuses_to_run_beside_another_profiler_and_warns_when_it_writes_nothing(
    tmp_path: Path,
) -> None:
    with (
        torch.profiler.profile(),
        pytest.raises(RuntimeError, match="already running"),
        capture(tmp_path / "a"),
    ):
        pass
    with (
        pytest.warns(UserWarning, match="no trace written"),
        capture(tmp_path / "b", wait=1, warmup=1, active=2, unprofiled=0),
    ):
        _train(1)


def test_run_profile_option_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        run_profile(["--bogus", "--", "python", "x.py"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unrecognized arguments: --bogus" in err


def test_overwrite_leaves_a_users_own_trace_named_like_ours(tmp_path: Path, capsys) -> None:
    """--overwrite took any rank0.json.gz for its own and deleted the user's trace."""
    import gzip
    import shutil

    out = tmp_path / "t"
    out.mkdir()
    theirs = out / "rank0.json.gz"
    shutil.copy(
        Path(__file__).resolve().parents[1] / "perfcast/examples/ddp_a100_rank0.json.gz", theirs
    )
    before = theirs.read_bytes()
    script = _steps_script(tmp_path, "pass")
    rc = run_profile(["-o", str(out), "--overwrite", *_FAST, "--", "python", str(script), "9"])
    assert rc == 2 and "did not write (rank0.json.gz)" in capsys.readouterr().err
    assert theirs.read_bytes() == before
    assert b'"perfcast_' not in gzip.decompress(before)[:65536]


def test_a_cycle_stopped_before_its_active_steps_is_not_called_a_partial_trace(
    tmp_path: Path, capsys
) -> None:
    script = _steps_script(tmp_path, "pass")
    rc = run_profile(
        ["-o", str(tmp_path / "t"), "--unprofiled-steps", "0", "--wait", "1", "--warmup", "1",
         "--active", "2", "--repeat", "2", "--", "python", str(script), "6"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 0
    assert "1 of 2 cycle(s) written" in err and "partial" not in err, err


def test_run_profile_says_when_the_script_ended_before_the_steps_after_the_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The defaults need 18 steps: 12 write the trace, the 6 after it time the unprofiled
    window; a 14-step script got its trace and no word that the window was never timed."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch

            model = torch.nn.Linear(8, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(14):
                loss = model(torch.randn(4, 8)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            """
        )
    )
    out = tmp_path / "traces"
    assert run_profile(["-o", str(out), "--", "python", str(script)]) == 0
    err = capsys.readouterr().err
    assert "warning: the script ended 2 step(s) after the trace, before the 3 unprofiled" in err
    assert "it carries only the 6 timed before it" in err
    assert (out / "rank0.json.gz").exists()
