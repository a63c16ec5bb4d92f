"""A model described by its shape rather than by a trace: a decoder-only transformer.

The published tables the plan search is checked against (Megatron-LM, Korthikanti et al.,
torchtitan) describe models this way: layers, hidden size, heads, sequence, vocabulary,
batch. `perfcast.plan.analytic` turns a description into the same per-layer costs a trace
gives (`perfcast.plan.trace_workload`), so one cost model and one search serve both.
"""

from __future__ import annotations

import json
import numbers
import os
from dataclasses import MISSING, asdict, dataclass, fields

import numpy as np

from perfcast.errors import PerfcastError

# Any size in a description (layers, widths, sequence, vocabulary): 1e30 layers printed
# nonsense and a 23-digit int overflowed numpy.
MAX_SIZE = 1_000_000_000


@dataclass(frozen=True)
class ModelDesc:
    """A GPT/Llama-style decoder. Sizes in elements; `ffn` defaults to 4 x hidden."""

    name: str
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn: int = 0
    kv_heads: int = 0  # grouped-query attention; 0: as many as `heads`
    gated_mlp: bool = False  # SwiGLU: gate and up projections, then down
    dropout: bool = True  # Megatron GPT: attention and hidden dropout (masks kept)
    flash_attention: bool = False  # attention scores never materialized (SDPA / FA2)
    causal_skip: bool = False  # the attention kernel skips the masked half (flash, causal)
    tied_embeddings: bool = True
    norm: str = "layernorm"  # layernorm | rmsnorm
    position_embeddings: bool = True  # learned (GPT); False for rotary (Llama)
    # How the memory-bound work of a layer runs (perfcast.plan.analytic counts both):
    # "fused": one kernel per norm, activation and rotary embedding (Megatron-LM's fused
    # layernorm, bias-GeLU, scale-mask-softmax; a fused SwiGLU / RoPE kernel), one fused QKV
    # and one fused first-MLP GEMM.
    # "eager": the ATen kernel chains an eager PyTorch model launches, as torchtitan's Llama
    # (Dec 2024, torchtitan/models/llama/model.py, torchtitan/models/norms.py) does: RMSNorm
    # as upcast, pow, mean, add, rsqrt, mul, downcast, mul; SwiGLU as silu then mul; RoPE as
    # upcast, complex mul, downcast on q and on k; K and V heads copied by repeat_kv for
    # grouped-query attention; separate wq / wk / wv and w1 / w3 GEMMs.
    kernels: str = "fused"

    def __post_init__(self) -> None:
        # Types first: JSON gives floats, NaN, booleans and strings as readily as ints.
        for f in fields(self):
            value = getattr(self, f.name)
            want = str(f.type)
            if want == "int":
                ok = isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
                if ok:  # numpy's integers too, kept as Python ints
                    value = int(value)
                    object.__setattr__(self, f.name, value)
                if ok and not 0 <= value <= MAX_SIZE:
                    raise PerfcastError(
                        f"model description {self.name!r}: {f.name}={value} is out of range "
                        f"(0 to {MAX_SIZE:,})"
                    )
            elif want == "bool":
                ok = isinstance(value, (bool, np.bool_))
                if ok:
                    object.__setattr__(self, f.name, bool(value))
            else:
                ok = isinstance(value, str)
            if not ok:
                raise PerfcastError(
                    f"model description {self.name!r}: {f.name} must be "
                    + {"int": "a whole number", "bool": "true or false"}.get(want, "a string")
                    + f", not {value!r}"
                )
        for name in ("layers", "hidden", "heads", "seq", "vocab"):
            if getattr(self, name) <= 0:
                raise PerfcastError(f"model description {self.name!r}: {name} must be positive")
        if self.hidden % self.heads:
            raise PerfcastError(f"model description {self.name!r}: hidden % heads != 0")
        # Both were taken silently: an unknown norm counted as RMSNorm's parameters and as
        # LayerNorm's kernels; 3 KV heads for 4 query heads (or 8 for 4) is no model.
        if self.norm not in ("layernorm", "rmsnorm"):
            raise PerfcastError(
                f"model description {self.name!r}: norm must be 'layernorm' or 'rmsnorm', "
                f"not {self.norm!r}"
            )
        if self.kv_heads and self.heads % self.kv_heads:
            raise PerfcastError(
                f"model description {self.name!r}: kv_heads={self.kv_heads} must divide "
                f"heads={self.heads} (each KV head serves a whole group of query heads)"
            )
        if self.kernels not in ("fused", "eager"):
            raise PerfcastError(
                f"model description {self.name!r}: kernels must be 'fused' or 'eager', "
                f"not {self.kernels!r}"
            )

    @property
    def ffn_dim(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads x head size."""
        kv = self.kv_heads or self.heads
        return kv * (self.hidden // self.heads)

    def layer_params(self) -> int:
        h, f = self.hidden, self.ffn_dim
        attn = h * (h + 2 * self.kv_dim) + h * h
        mlp = (3 if self.gated_mlp else 2) * h * f
        biases = 0 if self.gated_mlp else (h + 2 * self.kv_dim + h + f + h)
        norms = 2 * h * (2 if self.norm == "layernorm" else 1)
        return attn + mlp + biases + norms

    def embedding_params(self) -> int:
        n = self.vocab * self.hidden
        pos = self.seq * self.hidden if self.position_embeddings else 0
        return (n if self.tied_embeddings else 2 * n) + pos

    def params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params() + 2 * self.hidden

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def megatron_gpt(name: str, layers: int, hidden: int, heads: int) -> ModelDesc:
    """The GPT models of Narayanan et al. 2021 and Korthikanti et al. 2022: sequence 2048,
    vocabulary 51,200, 4h MLP with GeLU, dropout, tied embeddings, no FlashAttention."""
    return ModelDesc(name, layers, hidden, heads, seq=2048, vocab=51200)


def llama3_8b(seq: int = 8192, kernels: str = "eager") -> ModelDesc:
    """Llama 3.1 8B (Meta's model card): 32 layers, 4096 hidden, 32 heads / 8 KV heads,
    SwiGLU 14336, vocabulary 128,256, untied embeddings, RMSNorm. Eager by default, as
    torchtitan runs it without torch.compile (its default norm_type is "rmsnorm", the
    unfused module: train_configs/llama3_8b.toml at the Dec 2024 benchmark's commit)."""
    return ModelDesc(
        "llama3-8b",
        layers=32,
        hidden=4096,
        heads=32,
        seq=seq,
        vocab=128256,
        ffn=14336,
        kv_heads=8,
        gated_mlp=True,
        dropout=False,
        flash_attention=True,
        causal_skip=True,
        tied_embeddings=False,
        norm="rmsnorm",
        position_embeddings=False,
        kernels=kernels,
    )


PRESETS: dict[str, ModelDesc] = {
    "gpt-1.7b": megatron_gpt("gpt-1.7b", 24, 2304, 24),
    "gpt-22b": megatron_gpt("gpt-22b", 48, 6144, 64),
    "gpt-175b": megatron_gpt("gpt-175b", 96, 12288, 96),
    "gpt-530b": megatron_gpt("gpt-530b", 105, 20480, 128),
    "gpt-1t": megatron_gpt("gpt-1t", 128, 25600, 160),
    "llama3-8b": llama3_8b(),
}


def load_desc(text: str) -> ModelDesc:
    """A preset name, a JSON file, or inline JSON (`{"layers": 24, ...}`)."""
    if text in PRESETS:
        return PRESETS[text]
    raw: object
    if os.path.exists(text) and not os.path.isfile(text):
        from perfcast.paths import not_a_file

        raise PerfcastError(
            f"{not_a_file(text) or 'is not a file'}: a model description is a JSON file",
            path=text,
        )
    if os.path.isfile(text):
        with open(text, "rb") as fh:
            head = fh.read(2)
        if head == b"\x1f\x8b":
            raise PerfcastError(
                "is a gzipped file (a trace?), not a model description",
                path=text,
                hint=f"plan a trace with `perfcast plan {text} --gpus N`",
            )
        try:
            with open(text) as fh:
                raw = json.load(fh)
        except (OSError, ValueError) as exc:
            raise PerfcastError(f"cannot read model description: {exc}", path=text) from None
    else:
        try:
            raw = json.loads(text)
        except ValueError as exc:
            if text.lstrip().startswith(("{", "[")):  # meant as inline JSON
                raise PerfcastError(
                    f"the model description is not valid JSON ({exc})",
                    hint='e.g. {"layers": 24, "hidden": 2048, "heads": 16, "seq": 2048, '
                    '"vocab": 51200}',
                ) from None
            raise PerfcastError(
                f"unknown model {text!r}",
                hint="a preset (" + ", ".join(PRESETS) + "), a JSON file or inline JSON",
            ) from None
    if not isinstance(raw, dict):
        raise PerfcastError("a model description is a JSON object")
    known = {f.name for f in fields(ModelDesc)}
    bad = sorted(set(raw) - known)
    if bad:
        raise PerfcastError(
            f"model description has unknown keys {bad}", hint="keys: " + ", ".join(sorted(known))
        )
    raw.setdefault("name", "model")
    missing = [f.name for f in fields(ModelDesc) if f.default is MISSING and f.name not in raw]
    if missing:
        raise PerfcastError(
            f"model description lacks {', '.join(missing)}",
            hint='e.g. {"layers": 24, "hidden": 2048, "heads": 16, "seq": 2048, "vocab": 51200}',
        )
    try:
        return ModelDesc(**raw)
    except TypeError as exc:
        raise PerfcastError(f"model description: {exc}") from None
