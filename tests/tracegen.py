"""Build small Kineto traces by hand for tests: times in microseconds, current format."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

DEVICE = {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "numSms": 108, "computeMajor": 8}


class TraceBuilder:
    def __init__(self, pid: int = 100, tid: int = 100, device: dict | None = DEVICE) -> None:
        self.pid = pid
        self.tid = tid
        self.events: list[dict[str, Any]] = []
        self.corr = 1000
        self.device = device

    def op(
        self,
        name: str,
        ts: float,
        dur: float,
        tid: int | None = None,
        cat: str = "cpu_op",
        **args: Any,
    ) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": self.pid,
                "tid": tid or self.tid,
                "ts": ts,
                "dur": dur,
                "args": args,
            }
        )

    def step(self, n: int, ts: float, dur: float) -> None:
        self.op(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")

    def runtime(self, name: str, ts: float, dur: float, tid: int | None = None) -> int:
        self.corr += 1
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": name,
                "pid": self.pid,
                "tid": tid or self.tid,
                "ts": ts,
                "dur": dur,
                "args": {"correlation": self.corr},
            }
        )
        return self.corr

    def launch(
        self,
        kernel: str,
        ts: float,
        dur: float,
        k_ts: float,
        k_dur: float,
        stream: int = 7,
        tid: int | None = None,
        cat: str = "kernel",
        name: str = "cudaLaunchKernel",
        **kargs: Any,
    ) -> int:
        corr = self.runtime(name, ts, dur, tid)
        args = {"correlation": corr, "stream": stream, "device": 0, **kargs}
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": kernel,
                "pid": 0,
                "tid": stream,
                "ts": k_ts,
                "dur": k_dur,
                "args": args,
            }
        )
        self.events.append(
            {
                "ph": "s",
                "id": corr,
                "pid": self.pid,
                "tid": tid or self.tid,
                "ts": ts,
                "cat": "ac2g",
                "name": "ac2g",
            }
        )
        self.events.append(
            {
                "ph": "f",
                "id": corr,
                "pid": 0,
                "tid": stream,
                "ts": k_ts,
                "cat": "ac2g",
                "name": "ac2g",
                "bp": "e",
            }
        )
        return corr

    def doc(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schemaVersion": 1, "traceEvents": self.events}
        if self.device:
            d["deviceProperties"] = [self.device]
        return d

    def write(self, path: Path) -> Path:
        data = json.dumps(self.doc()).encode()
        if str(path).endswith(".gz"):
            path.write_bytes(gzip.compress(data))
        else:
            path.write_bytes(data)
        return path


def linear_steps(steps: int = 2, *, shapes: bool = False, optimizer: bool = False) -> TraceBuilder:
    """The smallest training-like trace: each 900 µs step one `aten::linear` (with its
    input shapes if `shapes`) launching one GEMM on stream 7, and an SGD step if asked."""
    b = TraceBuilder()
    dims = {"Input Dims": [[8, 64], [32, 64], [32]]} if shapes else {}
    for step in range(steps):
        t0 = step * 1000
        b.step(step + 1, t0, 900)
        b.op("aten::linear", t0 + 10, 300, **dims)
        b.launch("volta_sgemm_128x64_nn", t0 + 20, 5, t0 + 30, 200, stream=7)
        if optimizer:
            b.op("Optimizer.step#SGD.step", t0 + 820, 60)
    return b
