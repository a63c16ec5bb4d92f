"""What a trace says about a training step's memory: parameters, optimizer, saved activations.

Read once per rank from the EventTable (`record_shapes=True` traces); the memory model
(`perfcast.memory_model.model`) and the plan search (`perfcast.plan`) both start from it.

- Parameters: one per outermost `AccumulateGrad` op of the last complete step, its size the
  first tensor of the op's "Input Dims" (the gradient has the parameter's shape).
- Optimizer: named by the ops of the step (`_fused_adam_`, `_foreach_addcdiv_`, per-parameter
  `addcdiv_` / `lerp_`, SGD's `_fused_sgd_` / momentum `add_`).
- Saved activations: the tensors autograd keeps for backward, estimated from the forward ops'
  input shapes with one rule per op family (`_SAVES`): a convolution or linear layer keeps its
  input, a norm its input, a non-in-place activation function its input, pooling its input,
  softmax its output (same size), dropout a one-byte mask, an attention kernel q, k, v and its
  output. In-place activations (`relu_`) and residual adds keep nothing new: their result is
  the input the next layer keeps. A tensor that two layers read (a block input feeding the
  main branch and a downsample convolution; q, k and v projections of one input) is counted
  once: a saved input is dropped when an earlier non-elementwise op saved a tensor of the
  same shape and no op in between read a tensor of that shape.
- Activation dtype: the forward GEMM/convolution kernels' (bf16/fp16 kernels: 2 bytes, else 4);
  the trace keeps no per-tensor dtype in the table.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

import numpy as np

from perfcast.events import NONE, EventTable, Kind
from perfcast.graph.build import known_device_name
from perfcast.graph.phases import Phase, event_phases
from perfcast.ingest.input_dims import is_shape, numel, row_input_dims

_AG = "AccumulateGrad"
_WEIGHT_OPS = re.compile(
    r"^aten::(conv\w*|_convolution|cudnn_convolution\w*|linear|addmm|mm|matmul|bmm|baddbmm|"
    r"einsum|embedding)$"
)
# op family -> (regex on the outermost aten op name, what it saves)
#   "in": first input; "in2": first two inputs; "mask": 1 byte per input element;
#   "attn": q, k, v and the output (4 x first input); "in+idx": input and int64 indices
_SAVES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), s)
    for p, s in (
        (r"^aten::(conv\d?d|convolution|_convolution|conv_transpose\d?d)$", "in"),
        (r"^aten::(linear|addmm|mm)$", "in"),
        (r"^aten::(matmul|bmm|baddbmm|einsum)$", "in2"),
        (
            r"^aten::(batch_norm|layer_norm|group_norm|instance_norm|rms_norm|"
            r"native_layer_norm|_fused_rms_norm)$",
            "in",
        ),
        (
            r"^aten::(relu|gelu|silu|sigmoid|tanh|elu|leaky_relu|hardswish|hardsigmoid|"
            r"softplus|mish|glu)$",
            "in",
        ),
        (r"^aten::(max_pool\d?d|adaptive_max_pool\d?d)$", "in+idx"),
        (r"^aten::(avg_pool\d?d|adaptive_avg_pool\d?d)$", "in"),
        # cross_entropy keeps its log_softmax result, the size of its input.
        (r"^aten::(softmax|log_softmax|_softmax|_log_softmax|cross_entropy_loss)$", "in"),
        (r"^aten::(dropout|feature_dropout|native_dropout)$", "mask"),
        (
            r"^aten::(scaled_dot_product_attention|_scaled_dot_product\w*|_flash_attention\w*)$",
            "attn",
        ),
    )
)
# Ops whose output has the input's shape: a tensor of that shape they read is not the
# tensor they hand on, so a later op saving that shape saves a new tensor.
_ELEMENTWISE = re.compile(
    r"^aten::(relu|gelu|silu|sigmoid|tanh|elu|leaky_relu|hardswish|hardsigmoid|softplus|mish|"
    r"batch_norm|layer_norm|group_norm|instance_norm|rms_norm|native_layer_norm|dropout|"
    r"softmax|log_softmax|_softmax|_log_softmax|add|sub|mul|div|neg|exp|pow|_to_copy|to|clone|"
    r"contiguous)$"
)
# Ops autograd saves the *result* of (ReLU, sigmoid, tanh, softmax, ...): the next layer
# usually keeps the same tensor as its input, so the result is counted here and that next
# save of the same shape is the same tensor.
_RESULT_SAVERS = re.compile(
    r"^aten::(relu|sigmoid|tanh|elu|hardtanh|relu6|softmax|log_softmax|_softmax|_log_softmax)$"
)
# Autocast's op lists (torch.amp docs, "CUDA Ops that can autocast to float16" and "... to
# float32"): the first cast their inputs to 16 bits (and save those copies), the second to
# fp32. Embedding lookups are on neither list; they are in the second here because they read
# fp32 tables and hand on fp32. Any other op runs in the dtype of what it reads.
_AUTOCAST_16 = re.compile(
    r"^aten::(conv\d?d|convolution|_convolution|conv_transpose\d?d|linear|addmm|mm|matmul|bmm|"
    r"baddbmm|addbmm|einsum|prelu|scaled_dot_product_attention|_scaled_dot_product\w*|"
    r"_flash_attention\w*)$"
)
_AUTOCAST_32 = re.compile(
    r"^aten::(layer_norm|native_layer_norm|group_norm|rms_norm|softmax|log_softmax|_softmax|"
    r"_log_softmax|cross_entropy(_loss)?|nll_loss\w*|mse_loss|l1_loss|smooth_l1_loss|"
    r"binary_cross_entropy_with_logits|sum|cumsum|prod|exp|log|pow|rsqrt|norm|"
    r"embedding|embedding_bag|_embedding_bag)$"
)
_EMBEDDING = re.compile(r"^aten::(embedding|embedding_bag|_embedding_bag)$")
_FUSED_ADAM = re.compile(r"_fused_adamw?_?$|_fused_adam")
_FOREACH_ADAM = re.compile(r"^aten::_foreach_(addcdiv|lerp|sqrt)")
_LOOP_ADAM = re.compile(r"^aten::(addcdiv_|lerp_)$")
_SGD = re.compile(r"_fused_sgd|sgd")


@dataclass
class SavedTensor:
    """One tensor autograd keeps from the forward pass, in forward order."""

    op: str
    numel: int
    nbytes: int
    linear: bool  # saved by a linear layer (what tensor parallelism splits)
    # Its bytes under bf16/fp16 autocast (an fp32 trace's forward replayed in autocast), by
    # autocast's op lists and the dtype of what the op reads.
    autocast_nbytes: int = 0
    op_index: int = 0  # the op that saved it, in `TraceFacts.forward_ops`


@dataclass
class ForwardOps:
    """The step's outermost forward ops in order, as much as activation checkpointing needs
    to find repeated blocks and what each block would keep (its input)."""

    tokens: list[int] = field(default_factory=list)  # equal for ops of one name and shape
    input_bytes: list[int] = field(default_factory=list)  # the op's first input
    input_bytes_autocast: list[int] = field(default_factory=list)
    # The first input is a tensor an earlier op saved already (not counted twice).
    input_saved: list[bool] = field(default_factory=list)


@dataclass
class TraceFacts:
    """Memory-relevant facts of one rank's last complete step."""

    rank: int
    step: str | None
    param_numels: list[int] = field(default_factory=list)
    linear_param_numel: int = 0  # parameters of linear layers (2-D weights of linear/addmm)
    embedding_param_numel: int = 0  # weights of embedding tables
    optimizer: str = "adam"  # adam | sgd | none
    optimizer_impl: str = "for-loop"  # for-loop | foreach | fused
    saved: list[SavedTensor] = field(default_factory=list)
    forward_ops: ForwardOps = field(default_factory=ForwardOps)
    # The optimizer's zero_grad runs after forward has started (the loop is forward,
    # zero_grad, backward, step): the previous step's gradients are alive during forward.
    grads_live_in_forward: bool = False
    act_bytes_per_elem: int = 4
    compute_dtype: str = "fp32"
    matmul_threads: int = 1  # CPU threads that ran GEMMs (each gets a cuBLAS workspace)
    batch: int | None = None  # leading dim of the first forward layer's input
    device_name: str | None = None
    device_bytes: int | None = None  # totalGlobalMem of the trace's device
    measured_peak_bytes: int | None = None  # from [memory] events, when the trace has them
    has_gpu: bool = False
    has_backward: bool = True  # False: an inference step (no gradients, no optimizer)
    notes: list[str] = field(default_factory=list)

    @property
    def params(self) -> int:
        return int(sum(self.param_numels))

    @property
    def activation_bytes(self) -> int:
        return int(sum(s.nbytes for s in self.saved))


def last_complete_step(table: EventTable, rank: int) -> int | None:
    """Index of the rank's last step (the one least disturbed by warm-up), None if none."""
    idx = [i for i, it in enumerate(table.iterations) if it.rank == rank]
    return idx[-1] if idx else None


def trace_facts(table: EventTable, rank: int | None = None) -> TraceFacts:
    """The memory-relevant facts of one rank (the first rank when none is given): read once
    per table and rank (every what-if's memory estimate asks), a copy each time."""
    key = ("trace_facts", rank)
    cols = (table.kind, table.name, table.ts, table.dur, table.iteration, table.shapes)
    return copy.deepcopy(table.memo(key, cols, lambda: _trace_facts(table, rank)))


def _trace_facts(table: EventTable, rank: int | None) -> TraceFacts:
    if not table.ranks:
        return TraceFacts(rank=0, step=None, notes=["the trace holds no ranks"])
    rank = table.ranks[0].rank if rank is None else rank
    if rank not in table.rank_ids():
        from perfcast.errors import OptionError

        raise OptionError(
            f"no rank {rank!r} in {table.source()}", hint=f"ranks: {table.rank_ids()}"
        )
    info = table.rank_info(rank)
    step = last_complete_step(table, rank)
    facts = TraceFacts(rank=rank, step=table.iterations[step].name if step is not None else None)
    facts.device_name = known_device_name(info)  # the name the graph gives the device
    props = info.device_properties or {}
    mem = props.get("totalGlobalMem")
    facts.device_bytes = int(mem) if isinstance(mem, (int, float)) and mem > 0 else None
    on_rank = table.rank == rank
    facts.has_gpu = bool((on_rank & table.is_gpu()).any())
    if step is None:
        facts.notes.append("no ProfilerStep in the trace: memory is read from the whole trace")
        in_step = on_rank
    else:
        in_step = on_rank & (table.iteration == step)
    phases = event_phases(table)
    ops = np.flatnonzero(in_step & (table.kind == Kind.CPU_OP))
    ops = ops[np.argsort(table.ts[ops], kind="stable")]
    _params(table, ops, facts)
    _optimizer(table, ops, facts)
    facts.has_backward = bool(np.isin(phases[ops], [Phase.BACKWARD, Phase.OPTIMIZER]).any())
    if not facts.has_backward and not facts.param_numels:
        facts.optimizer = "none"  # an inference step keeps no optimizer state
    _dtype(table, in_step, phases, facts)
    _saved(table, ops, phases, facts)
    if not facts.has_backward and facts.saved:
        # No backward reads them: an inference step frees each activation when the next
        # op has read it (SGLang's Qwen3-8B prefill was counted 26.5 GiB of "saved" ones).
        facts.notes.append(
            f"no backward pass (inference): the forward's {len(facts.saved):,} activations "
            f"({facts.activation_bytes / 2**30:.2f} GiB) are not kept for one; the peak holds "
            "only what an op reads and writes at a time"
        )
        facts.saved = []
    annotations = np.flatnonzero(in_step & (table.kind == Kind.USER_ANNOTATION))
    _zero_grad(table, ops, annotations, phases, facts)
    _threads(table, in_step, facts)
    facts.measured_peak_bytes = _measured_peak(table, rank)
    if not facts.param_numels:
        facts.notes.append(
            "no AccumulateGrad ops with shapes in the step (inference, or record_shapes off): "
            "no parameters, gradients or optimizer state could be counted"
        )
    return facts


def _params(table: EventTable, ops: np.ndarray, facts: TraceFacts) -> None:
    names = table.names
    is_ag = np.array([_AG in n for n in names], dtype=bool)
    rows = ops[is_ag[table.name[ops]]]
    if rows.size == 0:
        return
    par = table.parent[rows]
    rows = rows[~((par >= 0) & is_ag[table.name[np.maximum(par, 0)]])]
    for r in rows.tolist():
        d = row_input_dims(table, r)
        if d is None:
            # The shapes sit on the op inside (torch::autograd::AccumulateGrad).
            kids = np.flatnonzero(table.parent == r)
            d = row_input_dims(table, int(kids[0])) if kids.size else None
        n = numel(d[0]) if d else 0
        if n > 0:
            facts.param_numels.append(n)


# State per parameter by torch.optim class, in the memory model's kinds (OPT_STATE_BYTES):
# Adam-like classes keep two fp32 moments; SGD (momentum), Adagrad (state_sum) and RMSprop
# (square_avg) one tensor; Adadelta two.
_STATE_KIND = {
    "Adam": "adam", "AdamW": "adam", "Adamax": "adam", "NAdam": "adam", "RAdam": "adam",
    "SGD": "sgd", "Adagrad": "adagrad", "RMSprop": "rmsprop", "Adadelta": "adadelta",
}  # fmt: skip


def _optimizer(table: EventTable, ops: np.ndarray, facts: TraceFacts) -> None:
    from perfcast.analysis.optimizers import optimizer_class

    uniq = {table.names[i] for i in np.unique(table.name[ops]).tolist()}
    named = _STATE_KIND.get(optimizer_class(table) or "")
    if named and named != "adam":
        # The trace names its class (Optimizer.step#SGD.step): its state, whatever ops run it.
        fused = any("fused" in n.lower() for n in uniq)
        foreach = any(n.startswith("aten::_foreach") for n in uniq)
        impl = "fused" if fused else "foreach" if foreach else "for-loop"
        facts.optimizer, facts.optimizer_impl = named, impl
    elif any(_FUSED_ADAM.search(n) for n in uniq):
        facts.optimizer, facts.optimizer_impl = "adam", "fused"
    elif any(_FOREACH_ADAM.search(n) for n in uniq):
        facts.optimizer, facts.optimizer_impl = "adam", "foreach"
    elif any(_LOOP_ADAM.search(n) for n in uniq):
        facts.optimizer, facts.optimizer_impl = "adam", "for-loop"
    elif any(_SGD.search(n.lower()) for n in uniq):
        facts.optimizer, facts.optimizer_impl = "sgd", "for-loop"
    elif facts.param_numels:
        facts.notes.append("optimizer not recognized from op names: Adam assumed")


def _dtype(table: EventTable, in_step: np.ndarray, phases: np.ndarray, facts: TraceFacts) -> None:
    from perfcast.hardware.classify import KernelClass, classify_names, dtype_from_kernel_name

    k = np.flatnonzero(in_step & (table.kind == Kind.KERNEL) & (phases == Phase.FORWARD))
    if k.size == 0:
        return
    uniq, counts = np.unique(table.name[k], return_counts=True)
    names = [table.names[i] for i in uniq.tolist()]
    classes = classify_names(names)
    half = total = 0
    kinds: dict[str, int] = {}
    for name, cls, n in zip(names, classes, counts.tolist()):
        if cls not in (KernelClass.MATMUL, KernelClass.CONV, KernelClass.ATTENTION):
            continue
        total += n
        dt = dtype_from_kernel_name(name)
        if dt in ("bf16", "fp16"):
            half += n
            kinds[dt] = kinds.get(dt, 0) + n
    if total and half * 2 >= total:
        facts.act_bytes_per_elem = 2
        facts.compute_dtype = max(kinds, key=lambda d: kinds[d])


def _outermost_aten(table: EventTable, ops: np.ndarray) -> np.ndarray:
    names = table.names
    is_aten = np.array([n.startswith("aten::") for n in names], dtype=bool)
    mine = ops[is_aten[table.name[ops]]]
    par = table.parent[mine]
    nested = (
        (par >= 0)
        & is_aten[table.name[np.maximum(par, 0)]]
        & (table.kind[np.maximum(par, 0)] == Kind.CPU_OP)
    )
    return mine[~nested]


def _saved(table: EventTable, ops: np.ndarray, phases: np.ndarray, facts: TraceFacts) -> None:
    fwd = ops[phases[ops] == Phase.FORWARD]
    top = _outermost_aten(table, fwd)
    width = facts.act_bytes_per_elem
    # Walk forward ops in order; `seen` maps an input shape to the index in `facts.saved`
    # of the op that saved it, while that tensor is still the current one of its shape.
    seen: dict[tuple[int, ...], bool] = {}
    rows = top.tolist()
    firsts: list[tuple[int, ...] | None] = []
    dims_of: list[list | None] = []
    for r in rows:
        d = row_input_dims(table, r)
        dims_of.append(d)
        # Only a plain shape keys the walk: hostile or nested dims (a list of lists) are no
        # tensor to follow.
        firsts.append(tuple(d[0]) if d and is_shape(d[0]) and d[0] else None)
    reads_16 = False  # under autocast, whether the tensor the chain hands on is 16-bit
    fo = facts.forward_ops
    for i, r in enumerate(rows):
        name_id = int(table.name[r])
        name = table.names[name_id]
        d, key = dims_of[i], firsts[i]
        rule = next((s for pat, s in _SAVES if pat.search(name)), None)
        casts_16, casts_32 = bool(_AUTOCAST_16.search(name)), bool(_AUTOCAST_32.search(name))
        amp_width = 2 if casts_16 or (reads_16 and not casts_32) else 4
        reads_16_before = reads_16
        if casts_16 or casts_32:
            reads_16 = casts_16
        n_in = numel(list(key)) if key is not None else 0
        fo.tokens.append(hash((name_id, key)))
        fo.input_bytes.append(n_in * width)
        # What the op reads is in the dtype the chain hands it (autocast's casts are inside
        # the op that casts).
        fo.input_bytes_autocast.append(n_in * (2 if reads_16_before else 4))
        fo.input_saved.append(
            key is not None and rule is not None and rule != "mask" and seen.get(key) is False
        )
        if key is None:
            continue
        if rule is None:
            # Any other op reading this shape: a later save of it is a different tensor.
            seen[key] = True
            continue
        if facts.batch is None and len(key) >= 2:
            facts.batch = int(key[0])
        # The first input was saved already by a shape-changing op and not read since: the
        # same tensor, not counted again (what else the op keeps still is).
        dup = rule != "mask" and seen.get(key) is False
        n = numel(list(key))
        first = 0 if dup else n * width
        first_amp = 0 if dup else n * amp_width
        extra = extra_amp = 0
        if rule == "in2" and d is not None and len(d) > 1:
            extra, extra_amp = numel(d[1]) * width, numel(d[1]) * amp_width
        elif rule == "mask":
            first = first_amp = n  # one byte per element
        elif rule == "attn":
            extra, extra_amp = 3 * n * width, 3 * n * amp_width
        elif rule == "in+idx":
            # Max pooling also keeps int64 indices of its output (2x2, stride 2 assumed: a
            # quarter of the input's elements).
            extra = extra_amp = n // 4 * 8
        if first + extra > 0:
            linear = bool(re.search(r"::(linear|addmm|mm)$", name))
            facts.saved.append(
                SavedTensor(
                    name,
                    n,
                    first + extra,
                    linear,
                    autocast_nbytes=first_amp + extra_amp,
                    op_index=i,
                )
            )
        # The op's output is taken to be what the next op reads (a chain). An op whose
        # output has its input's shape hands on a new tensor of that shape: a later save of
        # the shape is not this one.
        if rule == "mask" or _RESULT_SAVERS.search(name):
            # A mask is not the input; a saved result is the current tensor of this shape.
            seen[key] = rule == "mask"
            continue
        elementwise = bool(_ELEMENTWISE.search(name))
        nxt = None if elementwise else next((f for f in firsts[i + 1 :] if f is not None), None)
        seen[key] = elementwise or nxt == key
        if nxt is not None:
            seen[nxt] = True  # a shape-changing op's output: what the next op reads
    if facts.param_numels:
        # Linear-layer parameters: the 2-D weights and their biases (what TP splits); and
        # embedding tables, which autocast leaves fp32 (no 16-bit copy of the weight).
        lin = emb = 0
        for r, d in zip(rows, dims_of, strict=True):
            name = table.names[int(table.name[r])]
            if re.search(r"^aten::(linear|addmm)$", name):
                if d and len(d) > 1:
                    w = d[1] if name.endswith("linear") else (d[2] if len(d) > 2 else [])
                    b = d[2] if name.endswith("linear") and len(d) > 2 else (d[0] if d else [])
                    lin += numel(w) + (numel(b) if isinstance(b, list) and len(b) == 1 else 0)
            elif _EMBEDDING.search(name) and d and is_shape(d[0]):
                emb += numel(d[0])
        facts.linear_param_numel = min(lin, facts.params)
        facts.embedding_param_numel = min(emb, facts.params)


def _zero_grad(
    table: EventTable,
    ops: np.ndarray,
    annotations: np.ndarray,
    phases: np.ndarray,
    facts: TraceFacts,
) -> None:
    """Whether the step's `Optimizer.zero_grad` (torch.optim's record_function range) runs
    between forward and backward: then the last step's gradients live through forward."""
    if ops.size == 0:
        return
    fwd = ops[phases[ops] == Phase.FORWARD]
    if fwd.size == 0:
        return
    bwd = ops[phases[ops] == Phase.BACKWARD]
    names = table.names
    zg = [
        r
        for r in np.concatenate([ops, annotations]).tolist()
        if names[int(table.name[r])].startswith("Optimizer.zero_grad")
    ]
    if not zg:
        return
    first_zg = min(int(table.ts[r]) for r in zg)
    # Between forward and backward: zero_grad after the optimizer step frees them before
    # the next forward.
    if int(table.ts[fwd].min()) < first_zg < (int(table.ts[bwd].min()) if bwd.size else 0):
        facts.grads_live_in_forward = True
        facts.notes.append(
            "zero_grad runs between forward and backward: the previous step's gradients are "
            "alive through forward"
        )


def _threads(table: EventTable, in_step: np.ndarray, facts: TraceFacts) -> None:
    """CPU threads that launched GEMMs: PyTorch keeps a cuBLAS workspace per handle, and
    the autograd engine's device thread has its own handle."""
    from perfcast.hardware.classify import KernelClass, classify_names

    k = np.flatnonzero(in_step & (table.kind == Kind.KERNEL) & (table.launch >= 0))
    if k.size == 0:
        return
    classes = np.asarray(classify_names(table.names), dtype=np.int16)
    mm = k[classes[table.name[k]] == KernelClass.MATMUL]
    if mm.size == 0:
        facts.matmul_threads = 0
        return
    launch = table.launch[mm]
    facts.matmul_threads = int(np.unique(table.tid[launch]).size)


def _measured_peak(table: EventTable, rank: int) -> int | None:
    rows = table.rows(Kind.MEMORY, rank=rank)
    rows = rows[(table.mem_total[rows] >= 0) & (table.nbytes[rows] != NONE)]
    if rows.size == 0:
        return None
    from perfcast.analysis.memory import allocators

    order = np.argsort(table.ts[rows], kind="stable")
    rows = rows[order]
    total = table.mem_total[rows]
    code, _, is_gpu = allocators(table.mem_device[rows], total, table.nbytes[rows])
    # The GPUs' allocators where the trace names devices; else the one with the largest
    # peak, the GPU's in any GPU training trace.
    peaks = {c: int(total[code == c].max()) for c in np.unique(code).tolist()}
    gpu = [p for c, p in peaks.items() if is_gpu[c]]
    return max(gpu or peaks.values()) if peaks else None
