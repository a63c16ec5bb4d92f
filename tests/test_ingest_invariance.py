"""Metamorphic tests of ingest: a trace rewritten in a way that does not change what happened
(another clock origin, a field of another type elsewhere, ...) reads the same."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import perfcast
from tests.tracegen import TraceBuilder

EPOCH_US = Decimal(1_700_000_000_000_000)  # a Unix-epoch clock in µs, as recent Kineto writes


def _shifted(doc: dict[str, Any], shift_us: Decimal) -> dict[str, Any]:
    """The trace on a clock `shift_us` later: each number a literal "@<decimal>" placeholder,
    so that the file holds the exact decimals (json.dumps would round them through a float)."""
    events = []
    for e in doc["traceEvents"]:
        e = dict(e)
        if "ts" in e:
            e["ts"] = f"@{Decimal(str(e['ts'])) + shift_us}"
        events.append(e)
    return {**doc, "traceEvents": events}


def _write(doc: dict[str, Any], path: Path) -> Path:
    """JSON with the "@<decimal>" placeholders written as bare numbers."""
    path.write_text(re.sub(r'"@(-?[0-9.]+)"', r"\1", json.dumps(doc)))
    return path


def _small_trace() -> TraceBuilder:
    """One step: an op launching two kernels, with nanosecond decimals in every time (at
    epoch µs, float64's nearest value to each is off by up to 125 ns, and not whole)."""
    b = TraceBuilder()
    b.step(1, 10.337, 100.5)
    b.op("aten::add", 20.401, 30.002)
    b.launch("k1", 21.703, 4.004, 40.305, 7.007)
    b.launch("k2", 30.609, 4.004, 50.711, 9.013)
    return b


def test_epoch_times_stay_exact_when_a_field_of_another_type_is_in_the_slice(
    tmp_path: Path,
) -> None:
    # ROCm writes "stream": "0x0" on runtime calls: the typed decoder refuses the slice and the
    # lenient one reads it. Its timestamps were rounded to float64 (up to 128 ns off at
    # epoch µs) while the same trace without that field read them to the nanosecond.
    b = _small_trace()
    plain = _write(_shifted(b.doc(), EPOCH_US), tmp_path / "plain.json")
    for e in b.events:
        if e.get("cat") == "cuda_runtime":
            e["args"]["stream"] = "0x0"
    odd = _write(_shifted(b.doc(), EPOCH_US), tmp_path / "odd.json")
    base = perfcast.load(_write(b.doc(), tmp_path / "base.json"))
    want = np.asarray(base.ts, dtype=np.int64) + int(EPOCH_US) * 1000
    for path in (plain, odd):
        table = perfcast.load(path)
        assert np.array_equal(np.asarray(table.ts, dtype=np.int64), want), path.name
        assert np.array_equal(table.dur, base.dur)


def test_copy_bandwidth_timeline_does_not_depend_on_the_clock_origin(tmp_path: Path) -> None:
    # The bins were float64 epoch nanoseconds (multiples of 256 ns): on a trace whose copies
    # span a few µs every bin collapsed onto a few values and the GB/s read 0.
    from perfcast.analysis.memory import memory

    b = TraceBuilder()
    b.step(1, 0, 100)
    for i in range(4):
        b.launch(
            "Memcpy HtoD (Pinned -> Device)", 10 + 10 * i, 2, 50 + i, 1, cat="gpu_memcpy",
            name="cudaMemcpyAsync", bytes=1_000_000,
        )  # fmt: skip
    near = memory(perfcast.load(_write(b.doc(), tmp_path / "near.json"))).bandwidth
    far = memory(perfcast.load(_write(_shifted(b.doc(), EPOCH_US), tmp_path / "far.json")))
    assert len(far.bandwidth) == len(near) > 1
    for a, c in zip(near, far.bandwidth, strict=True):
        assert c.t_ms == pytest.approx(a.t_ms, rel=1e-9, abs=1e-9)
        assert c.gbs == pytest.approx(a.gbs, rel=1e-9)
    assert sum(p.gbs for p in near) > 0


def test_downsampled_series_does_not_depend_on_the_clock_origin() -> None:
    # A step series (launch queue, memory) downsampled for a chart: on an epoch clock the
    # bin edges were float64 multiples of 256 ns, and other samples were kept.
    from perfcast.analysis.common import downsample_steps

    rng = np.random.default_rng(3)
    t = np.cumsum(rng.integers(1, 400, size=2_000)).astype(np.int64)
    y = rng.integers(0, 50, size=t.size)
    near_t, near_y = downsample_steps(t, y, 64)
    shift = int(EPOCH_US) * 1000 + 77
    far_t, far_y = downsample_steps(t + shift, y, 64)
    assert np.array_equal(far_t - shift, near_t)
    assert np.array_equal(far_y, near_y)


def _two_tied_ops() -> TraceBuilder:
    """Two ops, each launching one kernel of the same length once: a tie in every ranking."""
    b = TraceBuilder()
    b.step(1, 0, 200)
    b.op("aten::mul", 10, 20)
    b.launch("mul_kernel", 12, 4, 40, 5)
    b.op("aten::add", 50, 20)
    b.launch("add_kernel", 52, 4, 80, 5)
    return b


def test_rankings_with_ties_do_not_depend_on_the_order_of_the_events(tmp_path: Path) -> None:
    # Names were numbered in the order the file first held them, and rankings broke ties by
    # that number: the same trace with its events in another order listed other ops first.
    b = _two_tied_ops()
    forward = perfcast.load(_write(b.doc(), tmp_path / "forward.json"))
    b.events.reverse()
    backward = perfcast.load(_write(b.doc(), tmp_path / "backward.json"))
    assert forward.names == backward.names == sorted(forward.names)

    def seen(table: Any) -> tuple[list[str], list[str]]:
        r = perfcast.op_kernels(table)
        return [s.op for s in r.sequences], [o.op for o in r.by_op]

    assert seen(forward) == seen(backward) == (["aten::add", "aten::mul"],) * 2


def test_counter_values_do_not_depend_on_the_order_of_keys_in_args(tmp_path: Path) -> None:
    # CUPTI range-profiler events carry one arg per metric; the values table listed them in
    # the file's key order, which JSON gives no meaning.
    values = {"dram__bytes.sum": 64, "smsp__inst_executed.sum": 10, "sm__cycles.sum": 7}
    tables = []
    for name, args in (("a.json", values), ("b.json", dict(reversed(values.items())))):
        b = TraceBuilder()
        b.op("aten::mm", 0, 50)
        b.runtime("cudaLaunchKernel", 10, 5)
        ev = {"ph": "X", "cat": "cuda_profiler_range", "name": "gemm", "pid": 0, "tid": 0}
        b.events.append({**ev, "ts": 1_000, "dur": 500, "args": args})
        tables.append(perfcast.gpu_counters(perfcast.load(_write(b.doc(), tmp_path / name))))
    a, c = ([(v.metric, v.value) for v in t.values] for t in tables)
    assert a == c == sorted(a)


def test_epoch_times_stay_exact_when_every_float_rounds_to_a_whole_microsecond(
    tmp_path: Path,
) -> None:
    # At 1.7e15 µs a double's spacing is 0.25 µs: .001 to .125 read as .0. The precise decoder
    # was chosen only where a sampled time still showed a fraction, so a small trace whose
    # times all had such decimals lost them (up to 125 ns each).
    b = TraceBuilder()
    b.step(1, 10.125, 100.5)
    b.op("aten::add", 20.001, 30.002)
    b.launch("k1", 21.003, 4.004, 40.005, 7.007)
    base = perfcast.load(_write(b.doc(), tmp_path / "base.json"))
    table = perfcast.load(_write(_shifted(b.doc(), EPOCH_US), tmp_path / "far.json"))
    want = np.asarray(base.ts, dtype=np.int64) + int(EPOCH_US) * 1000
    assert np.array_equal(np.asarray(table.ts, dtype=np.int64), want)
