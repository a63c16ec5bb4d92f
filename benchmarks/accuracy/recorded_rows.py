"""One schema for every recorded accuracy row: a measured (baseline, change, variant) pair.

A recorded row is what a run on real hardware leaves behind so that perfcast's prediction can
be scored later on any machine: the baseline's trace (committed, byte-identical to what the
profiler wrote), the unprofiled step times of baseline and variant with their timing windows,
and the facts of the set-up. Predictions are deterministic functions of the trace, so scoring
needs no GPU.

Rows live in ``benchmarks/accuracy/recorded/rows/*.jsonl`` (one file per source: a GPU
session, a published trace pair, a CPU run); traces under ``recorded/traces/``. Each source
is described in ``recorded/README.md``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import msgspec

RECORDED_DIR = Path(__file__).resolve().parent / "recorded"
ROWS_DIR = RECORDED_DIR / "rows"


class RecordedRow(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One measured pair. Times are per step, in milliseconds."""

    id: str  # unique, e.g. "h100/r50_base->r50_fused"
    source: str  # the rows file it came from (see recorded/README.md)
    device: str  # where the baseline ran, e.g. "NVIDIA H100 80GB HBM3" or a CPU model
    processor: Literal["gpu", "cpu"]  # what the training step ran on
    workload: str  # the model family, e.g. "resnet50", "mlp16"
    baseline: str  # configuration name of the baseline
    variant: str  # configuration name of the variant
    change: str  # what was changed, in words
    spec: str | None  # how perfcast is asked to predict it; None: perfcast has no model
    baseline_trace: str  # path relative to recorded/
    # What the measured speedup compares: steps timed without the profiler ("unprofiled"),
    # or, where the source published only traces, the traced steps ("traced").
    measured: Literal["unprofiled", "traced"]
    baseline_ms: float  # the baseline step as measured (see `measured`)
    variant_ms: float
    baseline_windows_ms: list[float] = []  # the timing windows behind baseline_ms
    variant_windows_ms: list[float] = []
    baseline_traced_ms: float | None = None  # median profiler step of the baseline trace
    variant_traced_ms: float | None = None
    variant_device: str | None = None  # when the change is the device itself
    batch: int | None = None
    variant_batch: int | None = None
    baseline_peak_mem_gib: float | None = None  # torch.cuda.max_memory_allocated()
    variant_peak_mem_gib: float | None = None
    # The variant's peak over its construction and first two steps (a CUDA graph's capture
    # pool, cuDNN autotuning): live rows from `live-h100-2026-11-26` on.
    variant_first_peak_mem_gib: float | None = None
    # `perfcast calibrate` output of the machine that ran the pair (relative to recorded/);
    # predictions of this row use it, as a user who calibrated would.
    calibration: str | None = None
    notes: str = ""

    @property
    def speedup(self) -> float:
        """Measured speedup per step (for a batch change, per sample it is x the factor)."""
        return self.baseline_ms / self.variant_ms

    @property
    def window_spread(self) -> float | None:
        """Largest (max - min) / median over the two sides' timing windows."""
        spreads = [
            (max(w) - min(w)) / statistics.median(w)
            for w in (self.baseline_windows_ms, self.variant_windows_ms)
            if len(w) >= 2
        ]
        return max(spreads) if spreads else None

    @property
    def traced_over_real(self) -> float | None:
        """How much longer the baseline ran under the profiler than without it."""
        if self.baseline_traced_ms is None or self.measured != "unprofiled":
            return None
        return self.baseline_traced_ms / self.baseline_ms


def load_rows(paths: Iterable[Path] | None = None, root: Path = RECORDED_DIR) -> list[RecordedRow]:
    """Every recorded row under `root` (or in `paths`), in file order; ids must be unique and
    the files they name present."""
    files = sorted((root / "rows").glob("*.jsonl")) if paths is None else list(paths)
    decoder = msgspec.json.Decoder(RecordedRow)
    rows: list[RecordedRow] = []
    seen: set[str] = set()
    for path in files:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = decoder.decode(line)
            except msgspec.ValidationError as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
            if row.id in seen:
                raise ValueError(f"{path}:{lineno}: duplicate row id {row.id!r}")
            for needed in (row.baseline_trace, row.calibration):
                if needed is not None and not (root / needed).is_file():
                    raise ValueError(f"{path}:{lineno}: {needed} is missing")
            seen.add(row.id)
            rows.append(row)
    return rows


def write_rows(path: Path, rows: Iterable[RecordedRow]) -> None:
    """Write rows as JSON lines (the format `load_rows` reads)."""
    encoder = msgspec.json.Encoder()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(encoder.encode(r) + b"\n" for r in rows))
