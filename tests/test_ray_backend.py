"""Many ranks: the same loading code path on a local Ray instance, a synthetic 256-rank
folder; and the plan search on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import perfcast
from perfcast import parallel
from tests.tracegen import TraceBuilder

N_RANKS = 256


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "ranks"
    folder.mkdir()
    for r in range(N_RANKS):
        b = TraceBuilder()
        b.step(1, 0, 200 + r % 7)
        b.op("aten::linear", 10, 20, **{"Input Dims": [[8, 64], [64, 64], [64]]})
        b.launch("sm80_xmma_gemm_f32f32", 12, 3, 40, 10 + r % 5)
        b.op("autograd::engine::evaluate_function: AddmmBackward0", 60, 20, tid=200)
        b.launch("sm80_xmma_gemm_f32f32_bwd", 62, 3, 90, 20, tid=200)
        b.write(folder / f"rank-{r}.json.gz")
    return folder


def test_local_pool_is_default() -> None:
    assert parallel.backend() == "local"


def test_ray_loads_256_ranks_like_the_local_path(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install '.[ray]'")
    folder = _folder(tmp_path)
    local = perfcast.load(str(folder))
    with parallel.ray_backend():
        assert parallel.backend() == "ray"
        remote = perfcast.load(str(folder))
    assert parallel.backend() == "local"
    assert remote.rank_ids() == local.rank_ids() == list(range(N_RANKS))
    assert len(remote) == len(local)
    assert np.array_equal(remote.dur, local.dur) and np.array_equal(remote.rank, local.rank)
    from perfcast.plan import plan_trace

    r = plan_trace(remote, 512, gpu="a100-80gb", top=3)
    assert r.best


def _count_in_child(paths: list[str], out) -> None:  # type: ignore[no-untyped-def]
    out.put(parallel.worker_count(paths))


def test_a_daemonic_process_loads_in_process(tmp_path: Path) -> None:
    """perfcast.load(folder) inside a multiprocessing.Pool worker (a daemonic process) tried
    to start a process pool: 'daemonic processes are not allowed to have children', an
    internal error (found by the fuzz campaign, whose workers are daemonic)."""
    import multiprocessing
    import os

    paths = []
    for i in range(4):
        p = tmp_path / f"rank{i}.json"
        with open(p, "wb") as f:
            f.truncate(16 << 20)  # sparse: sized like a large rank, no disk used
        paths.append(str(p))
    if (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1) >= 2:
        assert parallel.worker_count(paths) >= 2  # the normal case forks
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_count_in_child, args=(paths, out), daemon=True)
    child.start()
    child.join(60)
    assert out.get(timeout=10) == 1


def test_every_trace_command_loads_on_ray(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--ray was plan's alone; summary, analyze, tree and the rest take it too."""
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install '.[ray]'")
    import json

    from perfcast.cli.main import main

    folder = tmp_path / "ranks"
    folder.mkdir()
    for r in range(4):
        b = TraceBuilder()
        b.step(1, 0, 200)
        b.op("aten::linear", 10, 20)
        b.launch("sm80_xmma_gemm_f32f32", 12, 3, 40, 10 + r)
        b.write(folder / f"rank-{r}.json.gz")
    assert main(["summary", str(folder), "--ray", "--json", "-q"]) == 0
    assert len(json.loads(capsys.readouterr().out)["ranks"]) == 4
    with pytest.raises(SystemExit) as exc:  # show reads no trace
        main(["show", str(folder), "--ray"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --ray" in capsys.readouterr().err


def test_an_address_where_nothing_listens_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ray retried for minutes, printing its own connection warnings, before it gave up; no
    # Ray is needed to be told that nothing answers at the address.
    import socket
    import sys
    import types

    from perfcast.cli.main import main

    def init(**kwargs: object) -> None:
        raise AssertionError("ray.init must not be reached")

    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init, shutdown=lambda: None)
    monkeypatch.setitem(sys.modules, "ray", fake)
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = tmp_path / "ranks"
    folder.mkdir()
    b = TraceBuilder()
    b.step(1, 0, 200)
    b.launch("sm80_xmma_gemm_f32f32", 12, 3, 40, 10)
    b.write(folder / "rank-0.json.gz")
    assert main(["summary", str(folder), "--ray", f"127.0.0.1:{port}", "-q"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in err and "leave out --ray" in err
