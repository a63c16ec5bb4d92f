"""Alpha-beta (Hockney) cost models of collective operations, in microseconds.

A message of b bytes over one hop costs ``alpha + b / B`` where alpha is the link latency and B
its bandwidth per direction. With p ranks and N bytes the models are

===============  ===================  ============================================
collective       algorithm            time
===============  ===================  ============================================
all-reduce       ring                 2(p-1) * (alpha + N/(p B))
all-reduce       tree                 2 ceil(log2 p) * alpha + N/B   (pipelined)
all-gather       ring                 (p-1) * (alpha + N/(p B))
all-gather       recursive_doubling   ceil(log2 p) * alpha + (p-1)/p * N/B
reduce-scatter   ring                 (p-1) * (alpha + N/(p B))
reduce-scatter   recursive_halving    ceil(log2 p) * alpha + (p-1)/p * N/B
broadcast        ring (pipelined)     (p-1) * alpha + N/B
broadcast        tree (binomial)      ceil(log2 p) * (alpha + N/B)
reduce           ring (pipelined)     (p-1) * alpha + N/B
all-to-all       pairwise             (p-1) * (alpha + N/(p B))
send/recv        -                    alpha + N/B
===============  ===================  ============================================

The ring, binomial-tree, recursive-doubling/halving and pairwise-exchange forms are those of
Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in MPICH",
IJHPCA 19(1), 2005 (reduction arithmetic, their gamma term, is ignored: on GPUs it is far
below the transfer time). The pipelined tree and ring-broadcast forms model NCCL, which splits
messages into chunks so that the per-hop latency is paid once per tree level or ring position
while the payload streams through. The tree all-reduce line is a lower bound: it assumes the
upward reduce and downward broadcast overlap on full-duplex links; NCCL's double binary tree
moves about 2N bytes per rank per direction, so in the bandwidth-bound regime NCCL's tree is
up to 2x slower than this formula and usually slower than the ring.

Size conventions follow nccl-tests: N is the full buffer of the collective, i.e. the all-reduce
buffer, the all-gather *output*, the reduce-scatter *input*, and the per-rank all-to-all send
buffer. Bandwidth is GB/s = 1e9 bytes/s, so 1 GB/s moves 1e3 bytes per microsecond.

These formulas run at the link's *peak*. The what-if models and `perfcast plan` price
collectives with `perfcast.hardware.network` instead, which adds what a real collective gets:
a bus bandwidth below the peak (80% of NVLink/PCIe, 90% of a network port, or what the trace's
own collectives reached) and a fixed cost per collective.

`bus_bandwidth_factor` is the algbw -> busbw correction from nccl-tests' doc/PERFORMANCE.md:
busbw = algbw * factor, which makes measured numbers comparable to the link peak.
"""

from __future__ import annotations

import math
import re

from perfcast.hardware.interconnects import LinkSpec

_BYTES_PER_US_PER_GBS = 1e3


def _check(nbytes: float, n_ranks: int) -> None:
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")


def _transfer_us(nbytes: float, link: LinkSpec) -> float:
    return nbytes / (link.bw_gbs_per_direction * _BYTES_PER_US_PER_GBS)


def _log2_steps(n_ranks: int) -> int:
    # A tree over p ranks has ceil(log2 p) levels; a fractional depth has no meaning.
    return math.ceil(math.log2(n_ranks))


def _trivial(nbytes: float, n_ranks: int) -> bool:
    _check(nbytes, n_ranks)
    return n_ranks == 1 or nbytes == 0


def allreduce_time_us(
    nbytes: float, n_ranks: int, link: LinkSpec, algorithm: str = "ring"
) -> float:
    """All-reduce of an `nbytes` buffer.

    ring: 2(p-1) steps (p-1 reduce-scatter + p-1 all-gather), each ``alpha + (N/p)/B``.
    tree: ``2 ceil(log2 p) * alpha + N/B``, a pipelined reduce up and broadcast down a
    tree whose two phases are assumed to overlap (an optimistic bound; see module docstring).
    """
    if _trivial(nbytes, n_ranks):
        return 0.0
    alpha = link.latency_us
    if algorithm == "ring":
        return 2 * (n_ranks - 1) * (alpha + _transfer_us(nbytes / n_ranks, link))
    if algorithm == "tree":
        return 2 * _log2_steps(n_ranks) * alpha + _transfer_us(nbytes, link)
    raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; use 'ring' or 'tree'")


def allgather_time_us(
    nbytes: float, n_ranks: int, link: LinkSpec, algorithm: str = "ring"
) -> float:
    """All-gather producing an `nbytes` output on every rank (each rank contributes N/p).

    ring: ``(p-1) * (alpha + (N/p)/B)``.
    recursive_doubling: ``ceil(log2 p) * alpha + (p-1)/p * N/B``.
    """
    if _trivial(nbytes, n_ranks):
        return 0.0
    return _scatter_gather(nbytes, n_ranks, link, algorithm, "recursive_doubling")


def reduce_scatter_time_us(
    nbytes: float, n_ranks: int, link: LinkSpec, algorithm: str = "ring"
) -> float:
    """Reduce-scatter of an `nbytes` input per rank (each rank keeps N/p reduced bytes).

    ring: ``(p-1) * (alpha + (N/p)/B)``.
    recursive_halving: ``ceil(log2 p) * alpha + (p-1)/p * N/B``.
    """
    if _trivial(nbytes, n_ranks):
        return 0.0
    return _scatter_gather(nbytes, n_ranks, link, algorithm, "recursive_halving")


def _scatter_gather(
    nbytes: float, n_ranks: int, link: LinkSpec, algorithm: str, recursive_name: str
) -> float:
    alpha = link.latency_us
    if algorithm == "ring":
        return (n_ranks - 1) * (alpha + _transfer_us(nbytes / n_ranks, link))
    if algorithm == recursive_name:
        moved = (n_ranks - 1) / n_ranks * nbytes
        return _log2_steps(n_ranks) * alpha + _transfer_us(moved, link)
    raise ValueError(f"unknown algorithm {algorithm!r}; use 'ring' or {recursive_name!r}")


def broadcast_time_us(
    nbytes: float, n_ranks: int, link: LinkSpec, algorithm: str = "ring"
) -> float:
    """Broadcast of `nbytes` from one root.

    ring: pipelined chain as NCCL does it, ``(p-1) * alpha + N/B``.
    tree: binomial tree without pipelining (MPICH short messages),
    ``ceil(log2 p) * (alpha + N/B)``.
    """
    if _trivial(nbytes, n_ranks):
        return 0.0
    alpha = link.latency_us
    if algorithm == "ring":
        return (n_ranks - 1) * alpha + _transfer_us(nbytes, link)
    if algorithm == "tree":
        return _log2_steps(n_ranks) * (alpha + _transfer_us(nbytes, link))
    raise ValueError(f"unknown broadcast algorithm {algorithm!r}; use 'ring' or 'tree'")


def reduce_time_us(nbytes: float, n_ranks: int, link: LinkSpec) -> float:
    """Reduce of `nbytes` to one root, pipelined ring (mirror of broadcast):
    ``(p-1) * alpha + N/B``."""
    if _trivial(nbytes, n_ranks):
        return 0.0
    return (n_ranks - 1) * link.latency_us + _transfer_us(nbytes, link)


def alltoall_time_us(nbytes: float, n_ranks: int, link: LinkSpec) -> float:
    """All-to-all where each rank sends an `nbytes` buffer split evenly over the p ranks.

    Pairwise exchange: p-1 steps, each ``alpha + (N/p)/B`` (the N/p block addressed to
    oneself never leaves the GPU), i.e. ``(p-1) * (alpha + N/(p B))``.
    """
    if _trivial(nbytes, n_ranks):
        return 0.0
    return (n_ranks - 1) * (link.latency_us + _transfer_us(nbytes / n_ranks, link))


def sendrecv_time_us(nbytes: float, link: LinkSpec) -> float:
    """Point-to-point transfer (pipeline parallelism): ``alpha + N/B``."""
    _check(nbytes, 2)
    return 0.0 if nbytes == 0 else link.latency_us + _transfer_us(nbytes, link)


def _normalize_collective(collective: str) -> str:
    key = re.sub(r"[^a-z]", "", collective.lower())
    key = _COLLECTIVE_ALIASES.get(key, key)
    if key not in _CANONICAL:
        raise ValueError(f"unknown collective {collective!r}; expected one of {_CANONICAL}")
    return key


_CANONICAL = (
    "allreduce",
    "allgather",
    "reducescatter",
    "broadcast",
    "reduce",
    "alltoall",
    "sendrecv",
)
_COLLECTIVE_ALIASES = {
    "alltoallv": "alltoall",
    "alltoallbase": "alltoall",
    "allgatherbase": "allgather",
    "allgatherintotensor": "allgather",
    "reducescattertensor": "reducescatter",
    "reducescatterbase": "reducescatter",
    "send": "sendrecv",
    "recv": "sendrecv",
    "bcast": "broadcast",
}


def bus_bandwidth_factor(collective: str, n: int) -> float:
    """busbw / algbw for a collective over `n` ranks (nccl-tests doc/PERFORMANCE.md).

    allreduce 2(n-1)/n; allgather, reducescatter and alltoall (n-1)/n; broadcast, reduce and
    sendrecv 1. Accepts spellings such as "all_reduce", "AllGather", "reduce-scatter".
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    key = _normalize_collective(collective)
    if key == "allreduce":
        return 2 * (n - 1) / n
    if key in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def bus_bandwidth_gbs(collective: str, nbytes: float, time_us: float, n: int) -> float:
    """Bus bandwidth in GB/s of a measured collective: (nbytes / time) * factor."""
    if time_us <= 0:
        raise ValueError("time_us must be positive")
    algbw = nbytes / time_us / _BYTES_PER_US_PER_GBS
    return algbw * bus_bandwidth_factor(collective, n)


def collective_time_us(
    collective: str,
    nbytes: float,
    n_ranks: int,
    link: LinkSpec,
    algorithm: str | None = None,
) -> float:
    """Dispatch by collective name (any spelling `bus_bandwidth_factor` accepts)."""
    key = _normalize_collective(collective)
    if key == "allreduce":
        return allreduce_time_us(nbytes, n_ranks, link, algorithm or "ring")
    if key == "allgather":
        return allgather_time_us(nbytes, n_ranks, link, algorithm or "ring")
    if key == "reducescatter":
        return reduce_scatter_time_us(nbytes, n_ranks, link, algorithm or "ring")
    if key == "broadcast":
        return broadcast_time_us(nbytes, n_ranks, link, algorithm or "ring")
    if key == "reduce":
        return reduce_time_us(nbytes, n_ranks, link)
    if key == "alltoall":
        return alltoall_time_us(nbytes, n_ranks, link)
    return 0.0 if n_ranks == 1 else sendrecv_time_us(nbytes, link)


# Order matters: "reducescatter" and "allreduce" both contain "reduce".
_KERNEL_COLLECTIVES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), name)
    for pattern, name in (
        (r"alltoall", "alltoall"),
        (r"allreduce", "allreduce"),
        (r"allgather", "allgather"),
        (r"reducescatter", "reducescatter"),
        (r"broadcast|bcast", "broadcast"),
        (r"sendrecv|send|recv", "sendrecv"),
        (r"reduce", "reduce"),
    )
)


def collective_from_kernel_name(name: str) -> str | None:
    """Which collective an NCCL/RCCL kernel or a c10d op runs, e.g.
    "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL" -> "reducescatter",
    "nccl:_all_gather_base" -> "allgather". None when the name does not say
    (e.g. RCCL's "ncclDevKernel_Generic")."""
    key = re.sub(r"[^a-z]", "", name.lower())
    for pattern, collective in _KERNEL_COLLECTIVES:
        if pattern.search(key):
            return collective
    return None
