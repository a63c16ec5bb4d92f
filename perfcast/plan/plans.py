"""A set of parallelization plans as arrays (one entry per plan), so that a cost model
evaluates thousands of them in one vectorized pass."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

CKPT_NAMES = ("none", "selective", "full")
ZERO_NAMES = ("ddp", "zero-1", "zero-2", "zero-3/fsdp")


@dataclass
class Plans:
    """dp x tp x pp GPUs; `mb` samples per micro-batch, `m` micro-batches per step and
    data-parallel rank, `v` virtual stages per GPU (interleaved 1F1B when > 1), `zero`
    stage 0-3, `ckpt` 0 none / 1 selective / 2 full, `sp` sequence parallel, `amp`
    16-bit compute (trace workloads recorded in fp32)."""

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    mb: np.ndarray
    m: np.ndarray
    v: np.ndarray
    zero: np.ndarray
    ckpt: np.ndarray
    sp: np.ndarray
    amp: np.ndarray

    def __post_init__(self) -> None:
        for f in fields(self):
            setattr(self, f.name, np.asarray(getattr(self, f.name), dtype=np.int64).reshape(-1))
        n = {getattr(self, f.name).size for f in fields(self)}
        if len(n) != 1:
            raise ValueError("plan arrays differ in length")

    def __len__(self) -> int:
        return int(self.dp.size)

    @property
    def gpus(self) -> np.ndarray:
        return self.dp * self.tp * self.pp

    @property
    def batch(self) -> np.ndarray:
        """Global batch (samples per step)."""
        return self.dp * self.mb * self.m

    def take(self, idx: np.ndarray) -> Plans:
        return Plans(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    def row(self, i: int) -> dict[str, int]:
        return {f.name: int(getattr(self, f.name)[i]) for f in fields(self)}

    @staticmethod
    def single(**kw: int) -> Plans:
        base = dict(dp=1, tp=1, pp=1, mb=1, m=1, v=1, zero=0, ckpt=0, sp=0, amp=0)
        base.update(kw)
        return Plans(**{k: np.array([v], dtype=np.int64) for k, v in base.items()})


def describe(row: dict[str, int]) -> str:
    """ "dp8 tp2 pp4/v2 mb1x16 zero-1 sel-ckpt SP": v = interleaved virtual stages, mb = the
    micro-batch size x micro-batches per step and data-parallel rank."""
    pp = f"pp{row['pp']}" + (f"/v{row['v']}" if row["v"] > 1 else "")
    parts = [f"dp{row['dp']} tp{row['tp']} {pp} mb{row['mb']}x{row['m']}"]
    if row["dp"] > 1 or row["zero"]:  # one data-parallel rank: no DDP or sharding to name
        parts.append(ZERO_NAMES[row["zero"]])
    if row["ckpt"]:
        parts.append(("sel" if row["ckpt"] == 1 else "full") + "-ckpt")
    if row["sp"]:
        parts.append("SP")
    if row["amp"]:
        parts.append("AMP")
    return " ".join(parts)
