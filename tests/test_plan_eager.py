"""Eager against fused memory-bound work in the analytic plan model: the counted kernel chains
(by hand and against the ATen ops torch dispatches), eager never faster than fused, and the
Megatron presets untouched by the choice."""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfcast.errors import PerfcastError
from perfcast.hardware.network import make_cluster
from perfcast.plan.analytic import E_MEM, K_OVER_S, AnalyticWorkload, chains
from perfcast.plan.desc import PRESETS, ModelDesc, llama3_8b, load_desc, megatron_gpt
from perfcast.plan.plans import Plans

ROOT = Path(__file__).parents[1]


def _tiny(**kw: Any) -> ModelDesc:
    base: dict[str, Any] = dict(
        name="tiny",
        layers=2,
        hidden=256,
        heads=2,
        seq=128,
        vocab=1024,
        dropout=False,
        norm="rmsnorm",
    )
    return ModelDesc(**{**base, **kw})


def _plans() -> Plans:
    rows = list(itertools.product((1, 2), (1, 2), (0, 1), (0, 1, 2)))
    return Plans(
        dp=np.ones(len(rows), dtype=np.int64),
        tp=np.array([r[0] for r in rows]),
        pp=np.ones(len(rows), dtype=np.int64),
        mb=np.array([r[1] for r in rows]),
        m=np.ones(len(rows), dtype=np.int64),
        v=np.ones(len(rows), dtype=np.int64),
        zero=np.zeros(len(rows), dtype=np.int64),
        ckpt=np.array([r[3] for r in rows]),
        sp=np.array([r[2] for r in rows]),
        amp=np.ones(len(rows), dtype=np.int64),
    )


def test_eager_chains_by_hand() -> None:
    """bf16 activations (e = 2), fp32 upcasts inside RMSNorm and RoPE."""
    eager, fused = chains("eager", 2), chains("fused", 2)
    # RMSNorm forward: cast up (2+4), pow (4+4), mean (4), x*rsqrt (4+4), cast down (4+2),
    # * weight (2+2); 8 kernels with the tokens-sized add eps and rsqrt.
    assert eager["norm"].fwd_bytes == 6 + 8 + 4 + 8 + 6 + 4 == 36
    assert eager["norm"].fwd_kernels == 8
    # Backward: *weight (4 + 6 + 2), cast (6), x*rsqrt (8 + 12 + 4), mean (4), pow (8+8+12),
    # sum of x's two gradients (12), cast (6); 16 kernels (3 of them tokens-sized for rsqrt).
    assert eager["norm"].bwd_bytes == 12 + 6 + 24 + 4 + 28 + 12 + 6 == 92
    assert eager["norm"].bwd_kernels == 16
    assert (eager["swiglu"].fwd_bytes, eager["swiglu"].bwd_bytes) == (10, 18)
    assert (eager["rope"].fwd_bytes, eager["rope"].bwd_bytes) == (20, 20)
    assert fused["norm"] == type(fused["norm"])(4, 1, 8, 2)
    for name in eager:
        assert eager[name].fwd_bytes >= fused[name].fwd_bytes
        assert eager[name].bwd_bytes >= fused[name].bwd_bytes
        assert eager[name].fwd_kernels >= fused[name].fwd_kernels


def test_eager_rmsnorm_bytes_in_the_layer() -> None:
    """A layer that differs between eager and fused only by its two RMSNorms (no GQA, no
    SwiGLU, learned positions): the forward differs by 2 x (36 - 4) bytes per token x hidden
    element and 2 x 7 kernels plus the two extra projection GEMMs (wq / wk / wv separate);
    backward by 2 x (92 - 8) bytes plus the two sums of the attention input's gradients
    (6 bytes each)."""
    cl = make_cluster("h100")
    kw = dict(position_embeddings=True, gated_mlp=False)
    we = AnalyticWorkload(_tiny(kernels="eager", **kw), cl)
    wf = AnalyticWorkload(_tiny(kernels="fused", **kw), cl)
    mb = 3
    p = Plans.single(mb=mb)
    le, lf = we._layer(p), wf._layer(p)
    n_th = mb * 128 * 256
    bw = we.bw * E_MEM
    assert float((le["mem"] - lf["mem"])[0]) * bw == pytest.approx(2 * 32 * n_th)
    assert float((le["over"] - lf["over"])[0]) / K_OVER_S == pytest.approx(2 * 7 + 2)
    assert float((le["mem_b"] - lf["mem_b"])[0]) * bw == pytest.approx((2 * 84 + 2 * 6) * n_th)
    n_b = 2 * 14 + 2 * 2 + 2
    assert float((le["over_b"] - lf["over_b"])[0]) / K_OVER_S == pytest.approx(n_b)


def test_rotary_work_exists_for_rotary_models() -> None:
    """Rotary models pay the rotation of q and k (fused: one read and write of each; eager:
    its chain), models with learned positions do not."""
    cl = make_cluster("h100")
    p = Plans.single(mb=1)
    n_qk = 128 * (256 + 256)  # tokens x (q width + k width), no GQA
    for kernels in ("fused", "eager"):
        rot = AnalyticWorkload(_tiny(kernels=kernels, position_embeddings=False), cl)
        pos = AnalyticWorkload(_tiny(kernels=kernels, position_embeddings=True), cl)
        gap = float((rot._layer(p)["mem"] - pos._layer(p)["mem"])[0]) * rot.bw * E_MEM
        assert gap == pytest.approx(chains(kernels, 2)["rope"].fwd_bytes * n_qk)
        assert gap > 0


@pytest.mark.parametrize(
    "desc",
    [
        _tiny(),
        _tiny(gated_mlp=True, ffn=512, kv_heads=1, position_embeddings=False),
        _tiny(gated_mlp=True, ffn=512, flash_attention=True, causal_skip=True),
        _tiny(norm="layernorm", dropout=True),
        replace(llama3_8b(2048), layers=2),
        replace(megatron_gpt("g", 2, 1024, 8), seq=512),
    ],
)
def test_eager_never_faster_than_fused(desc: ModelDesc) -> None:
    cl = make_cluster("h100")
    p = _plans()
    w_e = AnalyticWorkload(replace(desc, kernels="eager"), cl)
    w_f = AnalyticWorkload(replace(desc, kernels="fused"), cl)
    se, sf = w_e.stage_times(p), w_f.stage_times(p)
    assert np.all(se.fwd >= sf.fwd)
    assert np.all(se.bwd >= sf.bwd)
    assert np.all(se.recompute >= sf.recompute)


def test_presets_kernels() -> None:
    for name, d in PRESETS.items():
        assert d.kernels == ("eager" if name == "llama3-8b" else "fused")
    bad = '{"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 100, "kernels": "jit"}'
    with pytest.raises(PerfcastError):
        load_desc(bad)


# Seconds per micro-batch (forward, backward, recompute) of Megatron presets, from the model
# before the eager / fused split (commit a7a60ae); fused kernels must leave them where they
# were. Keys: (preset, tp, pp, mb, ckpt, sp).
_MEGATRON_BEFORE = {
    ("gpt-22b", 8, 1, 4, 2, 0): (0.340789999002, 0.609349290804, 0.337447950846),
    ("gpt-22b", 8, 1, 4, 1, 1): (0.314916520796, 0.593237687993, 0.0497174401385),
    ("gpt-175b", 8, 8, 1, 2, 0): (0.0677882003822, 0.126326762364, 0.0662373125501),
    ("gpt-175b", 8, 8, 1, 1, 1): (0.0646740156065, 0.124603212013, 0.00470457085422),
    ("gpt-1.7b", 1, 1, 2, 0, 0): (0.101262331222, 0.202524662444, 0.0),
    ("gpt-530b", 8, 35, 1, 1, 1): (0.0389800271641, 0.0760398463283, 0.00158271056516),
}


@pytest.mark.parametrize("key", sorted(_MEGATRON_BEFORE))
def test_megatron_presets_unchanged(key: tuple[Any, ...]) -> None:
    name, tp, pp, mb, ckpt, sp = key
    cl = make_cluster("a100-80gb", intra="nvlink3", inter="ib-hdr")
    w = AnalyticWorkload(PRESETS[name], cl)
    st = w.stage_times(Plans.single(tp=tp, pp=pp, mb=mb, m=8, ckpt=ckpt, sp=sp))
    got = (float(st.fwd[0]), float(st.bwd[0]), float(st.recompute[0]))
    assert got == pytest.approx(_MEGATRON_BEFORE[key], rel=1e-9)


def test_published_megatron_rows_unchanged() -> None:
    """The README's Megatron-LM and Korthikanti predictions: the per-layer costs did not move."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_published import DATA, korthikanti, megatron

    data = json.loads(DATA.read_text())
    meg = [round(r["predicted"]) for r in megatron(data["megatron_weak_scaling"])]
    assert meg == [155, 157, 163, 155, 151, 166, 167, 177, 188, 179]
    ko = [round(r["predicted"], 2) for r in korthikanti(data["korthikanti_iteration_times"])]
    assert ko == [1.34, 1.01, 17.52, 13.12, 46.59, 35.40, 93.00, 70.64]


def _count_aten(fn: Any, inputs: tuple[Any, ...], main: int) -> tuple[int, float, int, float]:
    """(kernels, bytes) forward and backward of `fn` as the ATen ops below autograd: every
    op but views counts as a kernel; its bytes are its tensors' distinct elements (broadcast
    dimensions once), tensors of fewer than main / 8 elements left out as the count does."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    views = {
        "view", "_unsafe_view", "t", "transpose", "unsqueeze", "expand", "view_as_complex",
        "view_as_real", "slice", "alias", "detach", "_reshape_alias", "select", "permute",
        "squeeze", "as_strided", "_conj", "conj", "lift_fresh",
    }  # fmt: skip

    def nbytes(x: Any) -> float:
        n = 1
        for size, stride in zip(x.shape, x.stride(), strict=True):
            n *= size if stride else 1
        real = 2 if x.is_complex() else 1
        return 0.0 if n * real < main / 8 else float(n * x.element_size())

    class Log(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.kernels, self.bytes = 0, 0.0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ not in views:
                ts = [
                    x for x in tree_flatten((args, kwargs, out))[0] if isinstance(x, torch.Tensor)
                ]
                self.kernels += 1
                self.bytes += sum(nbytes(x) for x in ts)
            return out

    with Log() as fwd:
        out = fn(*inputs)
    grad = torch.randn(out.shape, dtype=out.dtype)
    with Log() as bwd:
        out.backward(grad)
    return fwd.kernels, fwd.bytes / main, bwd.kernels, bwd.bytes / main


def test_eager_chains_match_torch_dispatch() -> None:
    """The counted chains against the ATen ops eager torch launches for the same formulas
    (RMSNorm in fp32 with a bf16 weight, SwiGLU, complex-multiply RoPE), on CPU."""
    torch = pytest.importorskip("torch")
    silu = torch.nn.functional.silu
    eager = chains("eager", 2)
    b, s, heads, hd = 2, 32, 8, 32
    h = heads * hd
    bf16 = torch.bfloat16
    weight = torch.ones(h, dtype=bf16, requires_grad=True)

    def rmsnorm(x: Any) -> Any:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5)
        return y.type_as(x) * weight

    x = torch.randn(b, s, h, dtype=bf16, requires_grad=True)
    got = _count_aten(rmsnorm, (x,), b * s * h)
    n = eager["norm"]
    assert got == (n.fwd_kernels, n.fwd_bytes, n.bwd_kernels, n.bwd_bytes)

    u = torch.randn(b, s, h, dtype=bf16, requires_grad=True)
    v = torch.randn(b, s, h, dtype=bf16, requires_grad=True)
    got = _count_aten(lambda u, v: silu(u) * v, (u, v), b * s * h)
    n = eager["swiglu"]
    assert got == (n.fwd_kernels, n.fwd_bytes, n.bwd_kernels, n.bwd_bytes)

    table = torch.polar(torch.ones(s, hd // 2), torch.rand(s, hd // 2))

    def rope(q: Any) -> Any:
        qc = torch.view_as_complex(q.float().reshape(b, s, heads, hd // 2, 2))
        return torch.view_as_real(qc * table.view(1, s, 1, hd // 2)).flatten(3).type_as(q)

    q = torch.randn(b, s, heads, hd, dtype=bf16, requires_grad=True)
    got = _count_aten(rope, (q,), b * s * h)
    n = eager["rope"]
    assert got == (n.fwd_kernels, n.fwd_bytes, n.bwd_kernels, n.bwd_bytes)
