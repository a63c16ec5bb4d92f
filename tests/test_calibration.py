"""perfcast.calibration: the file format, where it is looked up, the measurements and the CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from perfcast import calibration
from perfcast.calibration import Calibration, CheckpointCosts, DataLoaderCosts
from perfcast.cli.main import main
from perfcast.errors import PerfcastError


def sample() -> Calibration:
    return Calibration(
        machine={"hostname": "box", "cores": 8},
        created="2026-11-22T10:00:00Z",
        dataloader=DataLoaderCosts(
            [1.0, 16.0], [0.2, 0.6], [0.05, 0.05], 0.3, 0.01, 2, "file_descriptor", {}
        ),
        checkpoint=CheckpointCosts(0.1, 0.01, False, {"2": 0.12}),
    )


def test_fit_line_recovers_a_line_and_never_goes_negative() -> None:
    assert calibration._fit_line({1: 1.5, 2: 2.0, 4: 3.0}) == pytest.approx((1.0, 0.5))
    intercept, slope = calibration._fit_line({1: 2.0, 2: 1.0, 4: 0.5})  # falling: noise
    assert slope == 0.0 and intercept > 0
    assert calibration._fit_line({3: 0.7}) == (0.7, 0.0)


def test_costs_per_batch_and_region() -> None:
    cal = sample()
    assert cal.dataloader is not None and cal.checkpoint is not None
    assert cal.dataloader.receive_ms(3, gap_ms=1.0) == pytest.approx(0.35)
    assert cal.dataloader.receive_ms(0, gap_ms=0.5) == pytest.approx(0.25)  # >= 1 tensor
    assert cal.dataloader.receive_ms(1, gap_ms=4.0) == pytest.approx(0.45)  # log-midpoint
    assert cal.dataloader.receive_ms(1, gap_ms=100.0) == pytest.approx(0.65)  # held
    assert cal.dataloader.worker_ms(2) == pytest.approx(0.32)
    assert cal.checkpoint.extra_ms(regions=3, ops=10) == pytest.approx(0.4)


def test_save_load_round_trip(tmp_path: Path) -> None:
    path = calibration.save(sample(), tmp_path / "sub" / "cal.json")
    loaded = calibration.load(path)
    assert loaded.dataloader == sample().dataloader
    assert loaded.checkpoint == sample().checkpoint
    assert "calibrated on box (2026-11-22" in loaded.source()
    assert json.loads(path.read_text())["format"] == calibration.FORMAT


def test_bad_files_give_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    for text in ("{", '{"format": 1}', "[]", '{"format": 2, "machine": {}}'):
        bad.write_text(text)
        with pytest.raises(PerfcastError, match="not a perfcast calibration file") as err:
            calibration.load(bad)
        assert "\n" not in str(err.value) and str(bad) in str(err.value)


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        (("profiler", "op_ns"), "fast", "profiler.op_ns is 'fast'"),
        (("profiler", "op_ns"), float("nan"), "profiler.op_ns is nan"),
        (("profiler", "op_ns"), -5000, "profiler.op_ns is -5000"),
        (("profiler", "op_ns"), 1e9, "profiler.op_ns is 1000000000.0"),
        (("profiler", "work_share"), 5.0, "profiler.work_share is 5.0"),
        (("dataloader", "batch_ms"), [1.0], "differ in length"),
        (("dataloader", "gaps_ms"), "abc", "gaps_ms is not a list"),
    ],
)
def test_values_out_of_range_are_refused_in_one_line(
    tmp_path: Path, path: tuple[str, str], value: object, says: str
) -> None:
    """A hand-edited or damaged value was an internal error in the model that read it, or
    (a negative cost) a step slower without the profiler than with it."""
    good = calibration.save(sample(), tmp_path / "good.json")
    raw = json.loads(good.read_text())
    if raw.get(path[0]) is None:  # the sample leaves this part out: add a measured one
        raw[path[0]] = {
            "op_ns": 500.0,
            "input_ns": 50.0,
            "op_no_shapes_ns": 400.0,
            "python_ns": 100.0,
            "memory_ns": 100.0,
            "runtime_ns": None,
        }
    raw[path[0]][path[1]] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(PerfcastError, match="not a perfcast calibration file") as err:
        calibration.load(bad)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_active_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("PERFCAST_CALIBRATION", raising=False)
    assert calibration.active() is None  # no default file yet: models use their defaults
    calibration.save(sample(), calibration.default_path())
    active = calibration.active()
    assert active is not None and active.machine["hostname"] == "box"
    monkeypatch.setenv("PERFCAST_CALIBRATION", "off")
    assert calibration.active() is None
    monkeypatch.setenv("PERFCAST_CALIBRATION", str(tmp_path / "absent.json"))
    with pytest.raises(PerfcastError, match="calibration file not found"):
        calibration.active()


def test_active_rereads_a_changed_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = calibration.save(sample(), tmp_path / "cal.json")
    monkeypatch.setenv("PERFCAST_CALIBRATION", str(path))
    assert calibration.active() is not None
    changed = Calibration({"hostname": "other"}, "2026-11-23T00:00:00Z", None, None)
    calibration.save(changed, path)
    import os

    os.utime(path, (1e9, 1e9))  # a different mtime, whatever the clock's resolution
    active = calibration.active()
    assert active is not None and active.machine["hostname"] == "other"


def test_cli_rejects_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--worker-cpus", "a-b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--worker-cpus" in err
    assert main(["calibrate", "--workers", "0"]) == 2
    assert main(["calibrate", "--worker-cpus", "100000"]) == 2
    assert "has no CPU 100000" in capsys.readouterr().err
    # An empty list or a reversed range pinned to nothing, silently.
    for text in ("", "1-0"):
        assert main(["calibrate", "--worker-cpus", text]) == 2
        assert "expected CPU numbers and ranges" in capsys.readouterr().err


def test_cli_calibrate_checks_its_output_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder as -o was found only after a minute of measuring, as an internal error, with
    a stray .tmp file left beside it."""

    def never(*args: object, **kw: object) -> None:
        raise AssertionError("measured before the output was checked")

    monkeypatch.setattr(calibration, "measure", never)
    assert main(["calibrate", "-o", str(tmp_path)]) == 2
    assert "the output is a folder" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# The measurements themselves (need torch; a few seconds).


def test_measurements_are_sane() -> None:
    pytest.importorskip("torch")
    dl = calibration.measure_dataloader(workers=1, tensors=(1, 2), gaps_ms=(1, 4), repeat=3)
    assert len(dl.batch_ms) == len(dl.tensor_ms) == 2 and dl.gaps_ms == [1.0, 4.0]
    assert min(dl.batch_ms + dl.tensor_ms) >= 0 and dl.worker_batch_ms >= 0
    receive = {key for key in dl.samples if "gap" in key}
    assert receive == {"k=1,gap=1", "k=1,gap=4", "k=2,gap=1", "k=2,gap=4"}
    if Path("/proc/self/task").is_dir():  # the workers' CPU time comes from schedstat
        assert set(dl.samples) - receive == {"k=1,worker", "k=2,worker"}
    assert all(v >= 0 for v in dl.samples.values())
    ck = calibration.measure_checkpoint(repeat=3, rounds=2)
    assert ck.region_ms >= 0 and ck.op_ms >= 0 and set(ck.samples) == {"2", "8", "16"}


def test_cli_calibrate_writes_the_file_models_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--quick", "--workers", "1", "-o", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dataloader"]["workers"] == 1 and "region_ms" in doc["checkpoint"]
    monkeypatch.setenv("PERFCAST_CALIBRATION", str(out))
    active = calibration.active()
    assert active is not None and active.path == str(out)


def test_calibrate_says_whether_the_models_read_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-o FILE` elsewhere than the file the models read must not claim they use it."""
    from rich.console import Console

    from perfcast.report import terminal

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("PERFCAST_CALIBRATION", raising=False)
    cal = Calibration(machine={}, created="2026-11-27T10:00:00Z", dataloader=None, checkpoint=None)

    def said(path: Path) -> str:
        console = Console(record=True, width=200)
        terminal.calibration(replace(cal, path=str(path)), console)
        return console.export_text()

    assert "now uses these numbers" in said(calibration.default_path())
    elsewhere = said(tmp_path / "other.json")
    assert "now uses" not in elsewhere and "PERFCAST_CALIBRATION=" in elsewhere
    monkeypatch.setenv("PERFCAST_CALIBRATION", str(tmp_path / "other.json"))
    assert "now uses these numbers" in said(tmp_path / "other.json")


# ---------------------------------------------------------------------------------------------
# Which machine: a calibration is applied only to traces from its machine (where known).


class _Rank:
    def __init__(self, machine: dict | None) -> None:
        self.machine = machine


class _Table:
    def __init__(self, *machines: dict | None) -> None:
        self.ranks = [_Rank(m) for m in machines]


def test_for_trace_checks_the_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("PERFCAST_CALIBRATION", raising=False)
    cal = Calibration(
        machine={"hostname": "box", "cpu_model": "EPYC 7B13", "cores": 8},
        created="2026-11-22T10:00:00Z",
        dataloader=None,
        checkpoint=None,
    )
    calibration.save(cal, calibration.default_path())
    box = calibration.machine_id("box")
    assert box != calibration.machine_id("other") and len(box) == 12

    # Nothing in the trace says where it comes from: used, and the sentence says so.
    used, note = calibration.for_trace(_Table(None))
    assert used is not None and "could not be checked" in note
    # The same host, by the header's host_name.
    same = {"host_id": box, "from": "the trace's 'host_name' field"}
    used, note = calibration.for_trace(_Table(same))
    assert used is not None and "the trace comes from the same host" in note
    # Another host: not used, and the reason names both.
    other = {"host_id": calibration.machine_id("other"), "from": "the trace's 'host_name' field"}
    used, note = calibration.for_trace(_Table(same, other))
    assert used is None
    assert f"measured on host {box} (EPYC 7B13)" in note and "not used" in note
    # ... another host with the same CPU (perfcast profile records it): a twin, used.
    twin = dict(other, cpu_model="EPYC 7B13", cores=8)
    used, note = calibration.for_trace(_Table(twin))
    assert used is not None and "same CPU (EPYC 7B13, 8 cores)" in note
    # ... and a file the user names explicitly is used anyway, saying so.
    monkeypatch.setenv("PERFCAST_CALIBRATION", str(calibration.default_path()))
    used, note = calibration.for_trace(_Table(other))
    assert used is not None and "used because PERFCAST_CALIBRATION names it" in note


def test_the_loader_reads_which_machine_a_trace_comes_from(tmp_path: Path, write_trace) -> None:
    import perfcast

    ev = {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1, "dur": 2}
    kineto = write_trace({"traceEvents": [ev], "host_name": "gpu-node-7"}, "a.json")
    ours = write_trace(
        {"traceEvents": [ev], "perfcast_machine": {"host_id": "abc", "cores": 4}}, "b.json"
    )
    named = write_trace({"traceEvents": [ev]}, "gpu-node-7_1234.1700000000000000000.pt.trace.json")
    silent = write_trace({"traceEvents": [ev]}, "c.json")
    node7 = calibration.machine_id("gpu-node-7")
    assert perfcast.load(kineto).ranks[0].machine == {
        "host_id": node7,
        "from": "the trace's 'host_name' field",
    }
    assert perfcast.load(ours).ranks[0].machine == {
        "host_id": "abc",
        "cores": 4,
        "from": "the perfcast_machine metadata perfcast profile wrote",
    }
    assert perfcast.load(named).ranks[0].machine["host_id"] == node7
    assert perfcast.load(silent).ranks[0].machine is None


def test_checkpoint_samples_that_fall_with_the_region_size_are_flagged() -> None:
    def costs(samples: dict[str, float]) -> calibration.CheckpointCosts:
        return calibration.CheckpointCosts(0.3, 0.1, False, samples)

    assert costs({"2": 26.08, "8": 1.24, "16": 1.86}).noisy()  # a busy first round
    assert not costs({"2": 0.53, "8": 1.22, "16": 1.97}).noisy()
    assert not costs({"2": 0.53, "8": 0.50, "16": 1.97}).noisy()  # within a tenth
    assert not costs({"2": 0.001, "8": 0.0, "16": 0.5}).noisy()  # timer noise
    assert costs({"2": -0.3, "8": -0.2, "16": -0.1}).noisy()  # no cost is below zero
