"""Small but real PyTorch training workloads for the accuracy benchmark.

Each workload has a model, a ``Dataset`` that does genuine per-sample CPU work in Python
(decoding, tokenising, hashing, parsing, augmenting) behind a ``DataLoader``, and an Adam
optimizer.  ``TrainConfig`` switches the optimizations on; ``OPTIMIZATIONS`` maps each
optimization name to the config change that applies it for real.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import random
import warnings
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset

from perfcast.calibration import pin_worker

# Datasets report this many samples; items repeat modulo the stored pool, with per-index
# augmentation, so a run never exhausts an epoch.
VIRTUAL_LENGTH = 1 << 20


@dataclass(frozen=True)
class TrainConfig:
    """What to train and how; the defaults are the unoptimized baseline."""

    device: str = "cpu"
    preset: str = "quick"  # "quick" | "full" | "cuda" (model and batch sizes)
    seed: int = 0
    batch_factor: int = 1
    num_workers: int = 0
    adam: str = "single"  # "single" (foreach=False) | "foreach" | "fused"
    item_sync: bool = True  # loss.item() every step, as logging loops do
    checkpointing: bool = False
    amp: bool = False
    cuda_graphs: bool = False
    compile: bool = False
    channels_last: bool = False
    # CPUs for DataLoader worker processes (empty: wherever the scheduler puts them)
    worker_cpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class Optimization:
    """A change that can be applied to a workload for real."""

    name: str
    apply: Callable[[TrainConfig], TrainConfig]
    needs_cuda: bool = False
    workloads: tuple[str, ...] | None = None  # None: every workload

    def applies_to(self, workload: str, device: str) -> bool:
        if self.needs_cuda and device != "cuda":
            return False
        return self.workloads is None or workload in self.workloads


def _opt(
    name: str, needs_cuda: bool = False, workloads: tuple[str, ...] | None = None, **changes: Any
) -> Optimization:
    return Optimization(name, lambda cfg: replace(cfg, **changes), needs_cuda, workloads)


OPTIMIZATIONS: dict[str, Optimization] = {
    o.name: o
    for o in (
        _opt("dataloader-workers", num_workers=2),
        _opt("foreach-adam", adam="foreach"),
        _opt("remove-item-sync", item_sync=False),
        _opt("activation-checkpointing", checkpointing=True),
        _opt("batch-size-x2", batch_factor=2),
        _opt("amp", needs_cuda=True, amp=True),
        _opt("cuda-graphs", needs_cuda=True, cuda_graphs=True),
        _opt("fused-adam", needs_cuda=True, adam="fused"),
        _opt("torch-compile", needs_cuda=True, compile=True),
        # Only convolutions care about memory format.
        _opt("channels-last", needs_cuda=True, workloads=("cnn",), channels_last=True),
    )
}


def _maybe_checkpoint(block: nn.Module, x: torch.Tensor, enabled: bool) -> torch.Tensor:
    if enabled and torch.is_grad_enabled():
        # Non-reentrant: works with inputs that do not require grad and keeps RNG state
        # (dropout) identical between the forward and the recomputation.
        return checkpoint(block, x, use_reentrant=False)
    return block(x)


# ---------------------------------------------------------------------------------------------
# CNN: a small ResNet on CIFAR-like 3x32x32 images.


class ImageDataset(Dataset[tuple[torch.Tensor, int]]):
    """Stores zlib-compressed 40x40 uint8 images; per sample it decodes, applies a random
    affine warp (bilinear), crops, flips, jitters colour and cuts out a patch."""

    MEAN = np.array([0.5, 0.5, 0.5], dtype=np.float32).reshape(3, 1, 1)
    STD = np.array([0.25, 0.25, 0.25], dtype=np.float32).reshape(3, 1, 1)
    # Output pixel grid of the 32x32 crop, centred, for the inverse affine mapping.
    _GY, _GX = (g.astype(np.float32) - 15.5 for g in np.mgrid[0:32, 0:32])

    def __init__(self, num_stored: int, num_classes: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        yy, xx = np.mgrid[0:40, 0:40].astype(np.float32) / 40.0
        self.blobs: list[bytes] = []
        self.labels: list[int] = []
        for i in range(num_stored):
            label = i % num_classes
            phase = rng.uniform(0, 2 * math.pi, size=(3, 1, 1))
            pattern = np.sin(2 * math.pi * (1 + label) * xx + phase) * np.cos(
                2 * math.pi * (1 + label % 3) * yy
            )
            img = 127 + 60 * pattern + rng.normal(0, 20, size=(3, 40, 40))
            self.blobs.append(zlib.compress(np.clip(img, 0, 255).astype(np.uint8).tobytes(), 6))
            self.labels.append(label)

    def __len__(self) -> int:
        return VIRTUAL_LENGTH

    def _affine_crop(self, img: np.ndarray, rng: random.Random) -> np.ndarray:
        """Rotate (+-15 deg), scale (0.9-1.1) and shift a 32x32 window, bilinear sampling."""
        angle, scale = math.radians(rng.uniform(-15, 15)), rng.uniform(0.9, 1.1)
        cos, sin = math.cos(angle) / scale, math.sin(angle) / scale
        cy, cx = 19.5 + rng.uniform(-4, 4), 19.5 + rng.uniform(-4, 4)
        sy = np.clip(cy + cos * self._GY + sin * self._GX, 0, 38.999)
        sx = np.clip(cx - sin * self._GY + cos * self._GX, 0, 38.999)
        y0, x0 = sy.astype(np.intp), sx.astype(np.intp)
        wy, wx = (sy - y0).astype(np.float32), (sx - x0).astype(np.float32)
        top = img[:, y0, x0] * (1 - wx) + img[:, y0, x0 + 1] * wx
        bottom = img[:, y0 + 1, x0] * (1 - wx) + img[:, y0 + 1, x0 + 1] * wx
        return top * (1 - wy) + bottom * wy

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        k = idx % len(self.blobs)
        img = np.frombuffer(zlib.decompress(self.blobs[k]), dtype=np.uint8).reshape(3, 40, 40)
        rng = random.Random(idx)
        crop = self._affine_crop(img.astype(np.float32) * (1.0 / 255.0), rng)
        if rng.random() < 0.5:
            crop = crop[:, :, ::-1]
        crop = crop * rng.uniform(0.8, 1.2) + rng.uniform(-0.1, 0.1)  # brightness/contrast
        crop = (crop - self.MEAN) / self.STD
        cy, cx = rng.randrange(32), rng.randrange(32)  # cutout
        crop[:, max(0, cy - 4) : cy + 4, max(0, cx - 4) : cx + 4] = 0.0
        return torch.from_numpy(np.ascontiguousarray(crop)), self.labels[k]


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self, width: int, blocks: int, num_classes: int, checkpointing: bool) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        stages, cin = [], width
        for i, mult in enumerate((1, 2, 4)):
            cout = width * mult
            layers = [BasicBlock(cin, cout, 1 if i == 0 else 2)]
            layers += [BasicBlock(cout, cout, 1) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*layers))
            cin = cout
        self.stages = nn.ModuleList(stages)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.stem(images)
        for stage in self.stages:
            # Recomputing BatchNorm updates its running stats twice; harmless for timing.
            x = _maybe_checkpoint(stage, x, self.checkpointing)
        logits = self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return F.cross_entropy(logits.float(), labels)


# ---------------------------------------------------------------------------------------------
# Transformer LM: a pre-LN decoder on text tokenised in Python.


class TextDataset(Dataset[tuple[torch.Tensor]]):
    """Generates Zipf-distributed synthetic text and tokenises it with a greedy subword
    tokenizer written in Python (the per-sample cost of a real text pipeline)."""

    def __init__(self, seq_len: int, num_syllables: int, num_words: int, seed: int) -> None:
        rng = random.Random(seed)
        consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
        syllables = sorted(
            {c + v for c in consonants for v in vowels}
            | {c + v + d for c in consonants for v in vowels for d in consonants}
        )
        rng.shuffle(syllables)
        pieces = ["<pad>", " ", ".", *consonants, *vowels, *syllables[:num_syllables]]
        self.piece_to_id = {p: i for i, p in enumerate(pieces)}
        self.vocab_size = len(pieces)
        self.max_piece = max(len(p) for p in pieces[1:])
        chosen = syllables[:num_syllables]
        self.words = ["".join(rng.choices(chosen, k=rng.randint(1, 3))) for _ in range(num_words)]
        weights = [1.0 / (rank + 1) ** 1.1 for rank in range(num_words)]
        self.cum_weights = list(itertools.accumulate(weights))
        self.seq_len = seq_len

    def encode(self, text: str) -> list[int]:
        vocab, out, i, n = self.piece_to_id, [], 0, len(text)
        while i < n:
            for size in range(min(self.max_piece, n - i), 0, -1):
                tid = vocab.get(text[i : i + size])
                if tid is not None:
                    out.append(tid)
                    i += size
                    break
            else:
                i += 1  # character outside the vocabulary
        return out

    def __len__(self) -> int:
        return VIRTUAL_LENGTH

    def __getitem__(self, idx: int) -> tuple[torch.Tensor]:
        rng = random.Random(idx)
        ids: list[int] = []
        while len(ids) < self.seq_len + 1:
            words = rng.choices(self.words, cum_weights=self.cum_weights, k=rng.randint(5, 14))
            ids.extend(self.encode(" ".join(words) + ". "))
        return (torch.tensor(ids[: self.seq_len + 1], dtype=torch.long),)


class DecoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class TinyLM(nn.Module):
    def __init__(
        self, vocab: int, dim: int, heads: int, layers: int, seq_len: int, checkpointing: bool
    ) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.tok = nn.Embedding(vocab, dim)
        nn.init.normal_(self.tok.weight, std=0.02)  # GPT-style: the tied head stays calibrated
        self.pos = nn.Parameter(torch.randn(seq_len, dim) * 0.02)
        self.blocks = nn.ModuleList(DecoderBlock(dim, heads, 0.1) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        inp, target = tokens[:, :-1], tokens[:, 1:]
        x = self.tok(inp) + self.pos[: inp.shape[1]]
        for block in self.blocks:
            x = _maybe_checkpoint(block, x, self.checkpointing)
        logits = self.ln_f(x) @ self.tok.weight.t()  # tied output embedding
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1))


# ---------------------------------------------------------------------------------------------
# DLRM-like recommender: hashed categorical features into EmbeddingBag tables.


class ClickDataset(Dataset[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    """Criteo-style rows: log-transformed counts plus multi-hot categorical values hashed
    (crc32 of the raw string, as feature-hashing pipelines do) into each table."""

    def __init__(self, num_dense: int, table_rows: Sequence[int], pooling: Sequence[int]) -> None:
        self.num_dense = num_dense
        self.tables = list(zip(table_rows, pooling, strict=True))

    def __len__(self) -> int:
        return VIRTUAL_LENGTH

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rng = random.Random(idx)
        dense = [math.log1p(rng.expovariate(0.05)) for _ in range(self.num_dense)]
        sparse = []
        for t, (rows, hot) in enumerate(self.tables):
            for _ in range(hot):
                raw = int(rng.paretovariate(1.2) * 7)  # heavy-tailed category popularity
                sparse.append(zlib.crc32(f"t{t}:{raw:x}".encode()) % rows)
        click = rng.random() < 1.0 / (1.0 + math.exp(2.0 - 0.3 * dense[0]))
        return (
            torch.tensor(dense, dtype=torch.float32),
            torch.tensor(sparse, dtype=torch.long),
            torch.tensor(float(click)),
        )


def _mlp(sizes: Sequence[int], final_act: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if final_act or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    li: torch.Tensor  # lower-triangle indices of the pairwise feature interactions (buffers)
    lj: torch.Tensor

    def __init__(
        self,
        num_dense: int,
        table_rows: Sequence[int],
        pooling: Sequence[int],
        dim: int,
        bottom: Sequence[int],
        top: Sequence[int],
        checkpointing: bool,
    ) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.pooling = list(pooling)
        self.bottom = _mlp([num_dense, *bottom, dim], final_act=True)
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for rows in table_rows)
        n = len(table_rows) + 1
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)
        self.top = _mlp([dim + n * (n - 1) // 2, *top, 1], final_act=False)

    def forward(
        self, dense: torch.Tensor, sparse: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        x = _maybe_checkpoint(self.bottom, dense, self.checkpointing)
        # Fixed pooling factors give fixed-shape (B, hot) bags: no offsets, graph-capturable.
        bags = torch.split(sparse, self.pooling, dim=1)
        feats = torch.stack([x, *(t(b) for t, b in zip(self.tables, bags, strict=True))], dim=1)
        inter = torch.bmm(feats, feats.transpose(1, 2))[:, self.li, self.lj]
        z = torch.cat([x, inter], dim=1)
        logits = _maybe_checkpoint(self.top, z, self.checkpointing).squeeze(1)
        return F.binary_cross_entropy_with_logits(logits.float(), labels)


# ---------------------------------------------------------------------------------------------
# MLP on tabular rows parsed from CSV text.


class TabularDataset(Dataset[tuple[torch.Tensor, int]]):
    """Rows kept as CSV text; each sample is parsed, log-scaled, standardised, one-hot
    encoded and jittered on the fly."""

    def __init__(
        self,
        num_numeric: int,
        num_categorical: int,
        categories: int,
        num_classes: int,
        num_rows: int,
        seed: int,
    ) -> None:
        rng = np.random.default_rng(seed)
        numeric = rng.lognormal(0.0, 1.0, size=(num_rows, num_numeric))
        cats = rng.integers(0, categories, size=(num_rows, num_categorical))
        self.lines = [
            ",".join([*(f"{v:.5g}" for v in numeric[r]), *(f"c{c}" for c in cats[r])])
            for r in range(num_rows)
        ]
        self.num_numeric, self.num_categorical = num_numeric, num_categorical
        self.categories = categories
        logs = np.log1p(numeric).astype(np.float32)
        self.mean, self.std = logs.mean(axis=0), logs.std(axis=0) + 1e-6
        self.num_features = num_numeric + num_categorical * categories
        proj = rng.normal(size=(self.num_features, num_classes)).astype(np.float32)
        self.labels = [int(np.argmax(self._parse(line) @ proj)) for line in self.lines]

    def _parse(self, line: str) -> np.ndarray:
        parts = line.split(",")
        num = np.log1p(np.array(parts[: self.num_numeric], dtype=np.float32))
        onehot = np.zeros(self.num_categorical * self.categories, dtype=np.float32)
        for j, tok in enumerate(parts[self.num_numeric :]):
            onehot[j * self.categories + int(tok[1:])] = 1.0
        return np.concatenate([(num - self.mean) / self.std, onehot])

    def __len__(self) -> int:
        return VIRTUAL_LENGTH

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        k = idx % len(self.lines)
        feats = self._parse(self.lines[k])
        rng = random.Random(idx)
        feats[: self.num_numeric] *= rng.uniform(0.95, 1.05)  # scale jitter
        feats[rng.randrange(self.num_numeric)] = 0.0  # feature dropout
        return torch.from_numpy(feats), self.labels[k]


class MLP(nn.Module):
    def __init__(
        self, features: int, hidden: int, layers: int, num_classes: int, checkpointing: bool
    ) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.inp = nn.Linear(features, hidden)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.GELU())
            for _ in range(layers)
        )
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.inp(x))
        for block in self.blocks:
            h = h + _maybe_checkpoint(block, h, self.checkpointing)
        return F.cross_entropy(self.out(h).float(), labels)


# ---------------------------------------------------------------------------------------------
# Registry and sizes.

# Per preset: "quick" finishes a CPU row in seconds on 2 cores, "full" is a longer CPU run,
# "cuda" is sized so a GPU step is not dominated by launch overhead.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "cnn": {
        "quick": {"batch": 32, "width": 8, "blocks": 1, "stored": 512},
        "full": {"batch": 64, "width": 16, "blocks": 2, "stored": 2048},
        "cuda": {"batch": 256, "width": 64, "blocks": 2, "stored": 4096},
    },
    "transformer": {
        "quick": {"batch": 8, "seq": 64, "dim": 96, "heads": 4, "layers": 2, "syll": 400},
        "full": {"batch": 16, "seq": 128, "dim": 128, "heads": 4, "layers": 4, "syll": 1000},
        "cuda": {"batch": 32, "seq": 256, "dim": 512, "heads": 8, "layers": 4, "syll": 2000},
    },
    "dlrm": {
        "quick": {
            "batch": 128,
            "tables": 8,
            "rows": 4000,
            "dim": 16,
            "bottom": [64],
            "top": [64, 32],
        },
        "full": {
            "batch": 256,
            "tables": 12,
            "rows": 40000,
            "dim": 32,
            "bottom": [128, 64],
            "top": [256, 128],
        },
        "cuda": {
            "batch": 2048,
            "tables": 26,
            "rows": 200000,
            "dim": 64,
            "bottom": [512, 256],
            "top": [512, 256],
        },
    },
    "mlp": {
        "quick": {"batch": 128, "hidden": 256, "layers": 3, "rows": 2048},
        "full": {"batch": 256, "hidden": 512, "layers": 4, "rows": 4096},
        "cuda": {"batch": 1024, "hidden": 2048, "layers": 4, "rows": 8192},
    },
}

WORKLOADS: tuple[str, ...] = tuple(PRESETS)


def checkpoint_regions(workload: str, preset: str) -> int:
    """checkpoint() calls per training step with activation checkpointing on: one per CNN
    stage, per transformer or MLP block, and the DLRM's bottom and top MLPs."""
    p = PRESETS[workload][preset]
    return {"cnn": 3, "transformer": p.get("layers", 0), "dlrm": 2, "mlp": p.get("layers", 0)}[
        workload
    ]


def build(workload: str, cfg: TrainConfig) -> tuple[nn.Module, Dataset[Any], int]:
    """Model (on CPU), dataset and batch size for ``workload`` under ``cfg``."""
    p = PRESETS[workload][cfg.preset]
    torch.manual_seed(cfg.seed)  # identical weights for the baseline and each variant
    dataset: Dataset[Any]
    if workload == "cnn":
        dataset = ImageDataset(p["stored"], 10, cfg.seed)
        model: nn.Module = SmallResNet(p["width"], p["blocks"], 10, cfg.checkpointing)
    elif workload == "transformer":
        text = TextDataset(p["seq"], p["syll"], 4 * p["syll"], cfg.seed)
        vocab = -(-text.vocab_size // 64) * 64  # pad the vocabulary to a multiple of 64
        model = TinyLM(vocab, p["dim"], p["heads"], p["layers"], p["seq"], cfg.checkpointing)
        dataset = text
    elif workload == "dlrm":
        rows = [max(100, p["rows"] // (1 + t % 4)) for t in range(p["tables"])]
        pooling = [1 + t % 4 for t in range(p["tables"])]
        dataset = ClickDataset(13, rows, pooling)
        model = DLRM(13, rows, pooling, p["dim"], p["bottom"], p["top"], cfg.checkpointing)
    elif workload == "mlp":
        tab = TabularDataset(48, 4, 16, 8, p["rows"], cfg.seed)
        model = MLP(tab.num_features, p["hidden"], p["layers"], 8, cfg.checkpointing)
        dataset = tab
    else:
        raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    return model, dataset, p["batch"] * cfg.batch_factor


class Trainer:
    """One training setup; ``step()`` runs a full iteration, data loading included."""

    def __init__(self, workload: str, cfg: TrainConfig) -> None:
        self.workload, self.cfg = workload, cfg
        self.device = torch.device(cfg.device)
        model, dataset, self.batch_size = build(workload, cfg)
        model = model.to(self.device)
        if cfg.channels_last:
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.model = model
        adam_kwargs: dict[str, Any] = {"lr": 1e-3}
        if cfg.adam == "single":
            adam_kwargs["foreach"] = False
        elif cfg.adam == "foreach":
            adam_kwargs["foreach"] = True
        elif cfg.adam == "fused":
            adam_kwargs["fused"] = True
        else:
            raise ValueError(f"unknown adam implementation {cfg.adam!r}")
        if cfg.cuda_graphs:
            adam_kwargs["capturable"] = True  # step count lives on the GPU inside the graph
        self.optimizer = torch.optim.Adam(model.parameters(), **adam_kwargs)
        self.forward: Callable[..., torch.Tensor] = model
        if cfg.compile:
            self.forward = torch.compile(model)
        generator = torch.Generator().manual_seed(cfg.seed)
        pin = cfg.worker_cpus and cfg.num_workers > 0 and hasattr(os, "sched_setaffinity")
        self.loader = DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=True,
            generator=generator,
            num_workers=cfg.num_workers,
            persistent_workers=cfg.num_workers > 0,
            pin_memory=self.device.type == "cuda",
            drop_last=True,
            worker_init_fn=functools.partial(pin_worker, cfg.worker_cpus) if pin else None,
        )
        with warnings.catch_warnings():
            # With the main process pinned, torch counts only its CPUs and warns about
            # "excessive" workers that in fact run on the CPUs set aside for them.
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            self._batches: Iterator[Any] | None = iter(self.loader)
        self._graph: Any = None
        self._static_batch: list[torch.Tensor] = []
        self._static_loss: torch.Tensor | None = None
        self.last_loss: float | None = None

    def _next_batch(self) -> list[torch.Tensor]:
        assert self._batches is not None, "trainer is closed"
        try:
            batch = next(self._batches)
        except StopIteration:
            self._batches = iter(self.loader)
            batch = next(self._batches)
        out = [t.to(self.device, non_blocking=True) for t in batch]
        if self.cfg.channels_last:
            out[0] = out[0].contiguous(memory_format=torch.channels_last)
        return out

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.cfg.amp:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _loss(self, batch: Sequence[torch.Tensor]) -> torch.Tensor:
        with self._autocast():
            return self.forward(*batch)

    def _capture_graph(self, batch: list[torch.Tensor]) -> None:
        # Whole-iteration capture (forward, backward, optimizer) as in the CUDA graphs docs:
        # warm up on a side stream, then record into a graph fed through static inputs.
        self._static_batch = [t.clone() for t in batch]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.optimizer.zero_grad(set_to_none=True)
                self._loss(self._static_batch).backward()
                self.optimizer.step()
        torch.cuda.current_stream().wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(self._graph):
            self._static_loss = self._loss(self._static_batch)
            self._static_loss.backward()
            self.optimizer.step()

    def step(self) -> None:
        batch = self._next_batch()
        if self.cfg.cuda_graphs:
            if self._graph is None:
                self._capture_graph(batch)
            for static, fresh in zip(self._static_batch, batch, strict=True):
                static.copy_(fresh, non_blocking=True)
            self._graph.replay()
            loss = self._static_loss
            assert loss is not None
        else:
            loss = self._loss(batch)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        if self.cfg.item_sync:
            # The host waits for the device here: the sync the optimization removes.
            self.last_loss = loss.item()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        # Dropping the iterator shuts persistent DataLoader workers down.
        self._batches = None
        self._graph = None
