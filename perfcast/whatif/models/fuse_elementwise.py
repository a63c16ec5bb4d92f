"""fuse-elementwise: what torch.compile's pointwise fusion does to eager elementwise chains.

A chain is a maximal run of elementwise kernels, optionally ending with one
reduction (Inductor fuses a reduction with the pointwise ops that feed it),
that are adjacent on one stream (nothing else between them), of the same
rank, step and phase, with no other stream waiting for any but the first
(TorchInductor, PyTorch 2 paper, Ansel et al., ASPLOS '24: pointwise and
reduction fusion). Chains of at least `min_chain` kernels become one kernel.

Duration of the fused kernel (Source.MODELLED): elementwise kernels are
memory-bound, so their variable time follows the tensor passes over DRAM.
Each kernel keeps a fixed part f = min(t, fixed), fixed = the 5th percentile
of kernel durations in the trace (measured; the smallest kernels are almost
all fixed cost); the fused kernel pays it once:

    t = fixed + sum(t_i - f_i) * fused_passes / unfused_passes

Assumed: every tensor has the same size, and an op with unknown shapes is
binary. Unfused, an op with a tensor inputs reads a and writes 1 (a binary op:
3 passes; a reduction: a reads, negligible write). Fused, the chain reads
each external input once (the first op's a, then a - 1 per later op, the
previous result staying in registers) and writes only its last result: for k
binary ops, (k + 2) / (3k). The number of tensor inputs comes from the
launching op's recorded shapes (non-empty Input Dims), else 2.

Launches of the removed kernels go too (as in `primitives.fuse`); the ops' CPU
dispatch stays (removing Python and dispatcher time is what CUDA graphs or
whole-graph compilation add on top, see the cuda-graphs model).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.arrays import split_by
from perfcast.errors import NotApplicableError, OptionValueError
from perfcast.graph.model import GpuKind, Graph, NodeKind, Source
from perfcast.graph.phases import Phase
from perfcast.hardware import KernelClass
from perfcast.whatif import primitives as P
from perfcast.whatif.kernels import kernel_fixed_cost_ns, op_input_dims, refuse_graph_replays

SUMMARY = (
    "fuse chains of adjacent elementwise kernels, host untouched: the GPU half of "
    "torch-compile (min_chain=2, phases=forward+backward)"
)

_DEFAULT_INPUTS = 2  # a binary op


@dataclass
class Options:
    min_chain: int = 2
    # What torch.compile(model) compiles: the model's forward and backward. A for-loop
    # optimizer's kernels each update another parameter; fusing them is fused-optimizer's.
    phases: str = "forward+backward"


def _tensor_inputs(graph: Graph, node: int) -> int:
    dims = op_input_dims(graph, node)
    if not dims:
        return _DEFAULT_INPUTS
    n = sum(1 for d in dims if isinstance(d, list) and d and all(isinstance(x, int) for x in d))
    return max(n, 1)


def passes(graph: Graph, chain: list[int]) -> tuple[int, int]:
    """(unfused, fused) tensor passes over memory of a chain (see module docstring)."""
    c = graph.cols
    unfused = fused = 0
    for i, n in enumerate(chain):
        a = _tensor_inputs(graph, n)
        is_red = int(c["klass"][n]) == KernelClass.REDUCTION
        unfused += a + (0 if is_red else 1)
        fused += a if i == 0 else max(a - 1, 0)
    if int(c["klass"][chain[-1]]) != KernelClass.REDUCTION:
        fused += 1
    return unfused, fused


def find_chains(graph: Graph, min_chain: int, phases: list[int] | None = None) -> list[list[int]]:
    """Chains of adjacent elementwise kernels (see module docstring), in `phases` only when
    given."""
    c = graph.cols
    alive = graph.alive
    gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & alive)
    if phases is not None:
        gpu = gpu[np.isin(c["phase"][gpu], phases)]
    waiting = set(graph.edge_dst[np.isin(graph.edge_dst, gpu)].tolist())
    chains: list[list[int]] = []
    for _, pos in split_by(c["lane"][gpu], c["order"][gpu]):
        nodes = gpu[pos].tolist()
        run: list[int] = []

        def close(run: list[int]) -> None:
            if len(run) >= min_chain:
                chains.append(list(run))

        for n in nodes:
            k = int(c["klass"][n])
            is_kernel = int(c["gpu_kind"][n]) == GpuKind.KERNEL
            ok_kind = is_kernel and k in (KernelClass.ELEMENTWISE, KernelClass.REDUCTION)
            joins = (
                ok_kind
                and run
                and int(c["klass"][run[-1]]) == KernelClass.ELEMENTWISE
                and c["phase"][n] == c["phase"][run[0]]
                and c["iteration"][n] == c["iteration"][run[0]]
                and n not in waiting
            )
            if joins:
                run.append(n)
                if k == KernelClass.REDUCTION:  # a reduction ends its chain
                    close(run)
                    run = []
                continue
            close(run)
            run = [n] if ok_kind and k == KernelClass.ELEMENTWISE else []
        close(run)
    return chains


def _phase_ids(options: Options) -> list[int]:
    names = P.split_list(options.phases)
    by_name = {p.name.lower(): int(p) for p in Phase if p != Phase.NONE}
    unknown = [n for n in names if n not in by_name]
    if not names or unknown:
        raise OptionValueError(
            f"fuse-elementwise: phases={options.phases} names no phase it knows",
            hint="e.g. phases=forward+backward (or +optimizer)",
        )
    return [by_name[n] for n in names]


def check_options(options: Options) -> None:
    """Values the model cannot take (the registry calls this when it builds the options)."""
    if options.min_chain < 2:
        raise OptionValueError("fuse-elementwise: min_chain must be at least 2")
    _phase_ids(options)


def apply(graph: Graph, options: Options) -> Graph:
    refuse_graph_replays(graph, "fuse-elementwise")
    phase_ids = _phase_ids(options)
    chains = find_chains(graph, options.min_chain, phase_ids)
    if not chains:
        raise NotApplicableError(
            f"fuse-elementwise: no chain of {options.min_chain}+ adjacent elementwise kernels "
            f"on one stream in {options.phases}"
        )
    fixed = kernel_fixed_cost_ns(graph)
    before = after = 0
    n_kernels = 0
    c = graph.cols
    rest: list[int] = []
    for chain in chains:
        d = c["dur"][chain].astype(np.float64)
        f = np.minimum(d, fixed)
        unfused, fused = passes(graph, chain)
        new = round(float(f.max()) + float((d - f).sum()) * fused / unfused)
        before += int(d.sum())
        after += new
        n_kernels += len(chain)
        last_red = int(c["klass"][chain[-1]]) == KernelClass.REDUCTION
        name = f"fused {len(chain)} elementwise kernels" + (" + reduction" if last_red else "")
        # primitives.fuse, with the removals batched: one pass over the graph, not one per chain.
        first = chain[0]  # chains are in stream order
        P.set_duration(graph, np.array([first]), new, Source.MODELLED)
        c["name"][first] = graph.intern(name)
        c["klass"][first] = c["klass"][chain[-1]]
        rest.extend(chain[1:])
    per, per_what = P.rank_steps(graph, np.array([ch[0] for ch in chains], dtype=np.int64))
    P.remove_gpu_work(graph, np.array(rest, dtype=np.int64))
    graph.assumptions.append(
        f"fuse-elementwise ({options.phases}), {per_what}: "
        f"{P.per_count(len(chains), per)} chains of "
        f"{P.per_count(n_kernels, per)} elementwise kernels fused ({before / per / 1e6:.2f} -> "
        f"{after / per / 1e6:.2f} ms of GPU time); memory passes counted from "
        f"op shapes (binary ops where unknown); fixed {fixed / 1000:.1f} µs paid once per chain; "
        "host dispatch unchanged"
    )
    return graph
