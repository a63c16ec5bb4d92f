"""ddp: the step as DistributedDataParallel on N GPUs would run it, from a one-GPU trace.

What is modelled. DDP all-reduces the gradients in buckets while backward is
still running (PyTorch DDP design note, "Distributed Data Parallel",
pytorch.org/docs/stable/notes/ddp.html):

- gradient sizes come from the trace: each backward `AccumulateGrad` op is one
  parameter's gradient becoming ready; its size is the first tensor of the
  "Input Dims" (record_shapes=True) of that op or of an op inside it, times
  `grad_bytes` (4: fp32 gradients, which AMP training keeps too). Without
  shapes, `params_mb` is split evenly over the AccumulateGrad ops (or in
  proportion to the shapes when they are known and params_mb is given);
- buckets are filled in the order gradients become ready, as DDP does after
  its first iteration (Reducer::rebuild_buckets): the first bucket holds at
  least `first_bucket_mb` (1 MiB, torch.distributed._DEFAULT_FIRST_BUCKET_BYTES),
  the others at least `bucket_mb` (25 MiB, DDP's bucket_cap_mb default); a
  bucket closes with the gradient that reaches its cap
  (compute_bucket_assignment_by_size in torch/csrc/distributed/c10d/reducer.cpp).
  MB here means MiB, as in DDP;
- each bucket's all-reduce is a new GPU task (modelled duration) on a new
  communication stream. It starts after the host reached the bucket's last
  AccumulateGrad (plus the trace's measured launch latency) and after the GPU
  work launched before that point (the reducer's stream wait on the gradient's
  ready event), and after the previous bucket's all-reduce (one NCCL stream);
- duration: the cluster model `perfcast plan` uses (`perfcast.hardware.network`):
  a fixed 10 µs per collective, alpha per ring step, and the bucket at the bus
  bandwidth a collective reaches (nccl-tests convention: ring 2(p-1)/p N / busbw;
  Thakur, Rabenseifner & Gropp 2005), 80% of the peak of `link` (NVIDIA's
  published nccl-tests busbw), or the bus bandwidth the trace's own large
  all-reduces reached when it has them. `link` is by default the device's
  intra-node link (`interconnects.default_intra_node_link`: NVLink on SXM
  A100/H100, PCIe on PCIe parts; PCIe 4.0 when the device is unknown); beyond
  `gpus_per_node` GPUs the ring crosses nodes and the NICs bound it;
- the end of backward: DDP's finalize makes the compute stream wait for every
  bucket (WorkNCCL::synchronizeStream blocks the current stream on the NCCL
  stream; the host only blocks with TORCH_NCCL_BLOCKING_WAIT=1, option
  `blocking_wait`). So the first GPU task launched after backward on each
  stream that ran backward kernels starts after the last all-reduce; with
  blocking_wait the last backward host node also ends after it.

Assumptions: weak scaling (every GPU keeps the trace's per-GPU batch, so all
compute keeps its measured duration); every GPU runs the same step in lock
step (no straggler); NCCL kernels do not slow the compute they overlap with
(in reality they occupy a few SMs and memory bandwidth, so overlapped compute
runs somewhat slower: this model is optimistic there); DDP's own host overhead
(hooks, bucket copies, gradient division by N) is not added. A trace that
already runs data parallel has its measured all-reduce kernels replaced by
modelled ones for `gpus` GPUs (measured broadcasts, e.g. DDP's buffer sync,
stay as measured); other collectives (all-gather, reduce-scatter, send/recv:
sharded or model-parallel training) are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from perfcast.analysis.comms import allreduced_per_step
from perfcast.analysis.notes import no_gpu_work
from perfcast.arrays import split_by
from perfcast.errors import NotApplicableError, OptionValueError
from perfcast.events import EventTable, Kind
from perfcast.graph.launches import DEFAULT_LAUNCH_LATENCY_NS, DEFAULT_STREAM_GAP_NS
from perfcast.graph.model import NONE, EdgeType, GpuKind, Graph, NodeKind, Source
from perfcast.graph.phases import Phase, collective_kernel_mask
from perfcast.hardware.classify import KernelClass
from perfcast.hardware.collectives import collective_from_kernel_name
from perfcast.ingest.input_dims import is_shape, parse_input_dims
from perfcast.whatif import primitives as P
from perfcast.whatif.kernels import refuse_graph_replays
from perfcast.whatif.models._parallel_common import (
    CommModel,
    check_link,
    check_node_options,
    comm_model,
)

SUMMARY = (
    "data parallel on N GPUs: bucketed gradient all-reduce overlapping backward "
    "(gpus=N, link=NAME, gpus_per_node=8, nics_per_node=, bucket_mb=25, params_mb=, "
    "algorithm=ring|tree)"
)

MIB = 1 << 20
# torch.distributed._DEFAULT_FIRST_BUCKET_BYTES (1 MiB) and DDP's bucket_cap_mb default (25).
DEFAULT_FIRST_BUCKET_MB = 1.0
DEFAULT_BUCKET_MB = 25.0
# Collectives a DDP trace contains: all-reduces (replaced) and broadcasts (kept).
_REPLACED = "allreduce"
_KEPT = ("broadcast",)
_FORMULA = {
    "ring": "base + 2(p-1) alpha + 2(p-1)/p N/busbw",
    "tree": "base + 2 ceil(log2 p) alpha + 2(p-1)/p N/busbw",
}
_HOST_KINDS = (NodeKind.CPU, NodeKind.LAUNCH, NodeKind.SYNC, NodeKind.RUNTIME)


@dataclass
class Options:
    gpus: int = 8
    link: str | None = None  # default: the device's intra-node link
    gpus_per_node: int = 8  # beyond it, rings cross nodes over the network
    nics_per_node: int | None = None  # inter-node NICs per node (default: one per GPU)
    bucket_mb: float = DEFAULT_BUCKET_MB
    first_bucket_mb: float = DEFAULT_FIRST_BUCKET_MB
    params_mb: float | None = None  # total gradient size, when the trace has no shapes
    algorithm: str = "ring"
    grad_bytes: int = 4  # bytes per gradient element (fp32)
    blocking_wait: bool = False  # TORCH_NCCL_BLOCKING_WAIT=1: the host waits too


@dataclass
class _Point:
    """One gradient becoming ready: the host node where its AccumulateGrad ends."""

    rank: int
    iteration: int
    end_order: float  # host time (rank-relative ns) the AccumulateGrad op ends
    node: int  # last host node of the op
    numel: float  # elements; nan when unknown


def apply(graph: Graph, options: Options) -> Graph:
    refuse_graph_replays(graph, "ddp")
    c = graph.cols
    if P.select(graph, kind="gpu").size == 0:
        raise NotApplicableError(
            f"ddp: {no_gpu_work(graph.table)}; data parallel over GPUs cannot be modelled from it"
        )
    table = graph.table
    if table is None:
        raise NotApplicableError("ddp: the graph carries no event table to read gradients from")
    replaced_ms = drop_measured_allreduces(graph)
    points = _gradient_points(graph)
    if not points:
        raise NotApplicableError(
            "ddp: no AccumulateGrad ops in the trace's steps (no backward pass, e.g. "
            "inference): there are no gradients to all-reduce"
        )
    sizes, size_note = _gradient_bytes(points, options, table)
    lat = int(graph.nominal.get("launch_latency_ns", DEFAULT_LAUNCH_LATENCY_NS))
    gap = int(graph.nominal.get("stream_gap_ns", DEFAULT_STREAM_GAP_NS))

    by_group: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(points):
        by_group.setdefault((p.rank, p.iteration), []).append(i)
    ranks = sorted({p.rank for p in points})
    cache: dict[str | None, CommModel] = {}
    comms = {
        r: comm_model(
            graph, r, options.link, "ddp", options.gpus_per_node, cache, options.nics_per_node
        )
        for r in ranks
    }
    total_ns = 0
    n_buckets = 0
    total_bytes = 0.0
    for rank in ranks:
        comm = comms[rank]
        compute_lanes = [i for i, ln in enumerate(graph.lanes) if ln.is_gpu and ln.rank == rank]
        comm_lane = _add_comm_lane(graph, rank, compute_lanes)
        launched = _launch_index(graph, compute_lanes)
        groups = sorted(k for k in by_group if k[0] == rank)
        # All buckets of this rank, in stream order, then their dependencies.
        b_last: list[int] = []  # host node of each bucket's last gradient
        b_order: list[float] = []
        b_bytes: list[float] = []
        b_iter: list[int] = []
        group_of_bucket: list[tuple[int, int]] = []
        for key in groups:
            idx = sorted(by_group[key], key=lambda i: points[i].end_order)
            for members in _buckets([sizes[i] for i in idx], options):
                last = points[idx[members[-1]]]
                b_last.append(last.node)
                b_order.append(last.end_order)
                b_bytes.append(sum(sizes[idx[m]] for m in members))
                b_iter.append(key[1])
                group_of_bucket.append(key)
        if not b_last:
            continue
        dur = np.array(
            [
                round(comm.time_us("allreduce", b, options.gpus, options.algorithm) * 1000)
                for b in b_bytes
            ],
            dtype=np.int64,
        )
        k = len(b_last)
        # Stream order = gradient-ready order; tiny offsets keep equal keys apart.
        order = np.array(b_order) + np.arange(k) * 1e-3
        new = P.insert(
            graph,
            lane=comm_lane,
            dur=dur,
            kind=NodeKind.GPU,
            name=f"ncclKernel_AllReduce (modelled, {options.gpus} GPUs, {comm.cluster.intra.name})",
            count=k,
            source=Source.MODELLED,
            order=order,
            launch_order=np.array(b_order),
            op=c["op"][b_last],
            op_name=c["op_name"][b_last],
            scope=c["scope"][b_last],
            phase=int(Phase.COMMUNICATION),
            iteration=np.array(b_iter),
            gpu_kind=int(GpuKind.KERNEL),
            klass=int(KernelClass.COMMUNICATION),
            nbytes=np.array(b_bytes, dtype=np.int64),
            stream_w=gap,
            launch=NONE,
        )
        c = graph.cols
        # The host reached the bucket's last gradient: the reducer launches the all-reduce.
        graph.add_edges(np.array(b_last), new, lat, EdgeType.DATA)
        # ... and the NCCL stream waits for the GPU work launched before that point.
        for nodes, keys in launched.values():
            j = np.searchsorted(keys, np.array(b_order), side="right") - 1
            ok = j >= 0
            if ok.any():
                graph.add_edges(nodes[j[ok]], new[ok], gap, EdgeType.CROSS_STREAM)
        # Finalize: work launched after backward waits for the last all-reduce.
        for key in groups:
            mine = [i for i, g in enumerate(group_of_bucket) if g == key]
            if not mine:
                continue
            last_ar = int(new[mine[-1]])
            ready = max(b_order[i] for i in mine)
            _wait_after_backward(graph, key, last_ar, ready, launched, gap, options.blocking_wait)
        total_ns += int(dur.sum())
        n_buckets += k
        total_bytes += float(sum(b_bytes))

    n_steps = max(len(by_group), 1)
    comm = comms[ranks[0]]
    graph.assumptions.append(
        f"ddp on {options.gpus} GPUs: {n_buckets / n_steps:.1f} buckets "
        f"{P.per_step_of(len({r for r, _ in by_group}), n_steps)} "
        f"({total_bytes / n_steps / MIB:.1f} MiB of gradients, {size_note}; buckets "
        f"{options.first_bucket_mb:g} then {options.bucket_mb:g} MiB in gradient-ready order"
        f"{_bucket_source(options)}), "
        f"{options.algorithm} all-reduce {_FORMULA[options.algorithm]} over "
        f"{comm.describe(options.gpus)}: {total_ns / n_steps / 1e6:.2f} ms of all-reduce per "
        "step, modelled; "
        "same per-GPU batch (weak scaling); the collective library (NCCL, RCCL) assumed not "
        "to slow the compute it overlaps (its kernels take SMs / CUs)"
    )
    if replaced_ms:
        graph.assumptions.append(
            f"the trace already ran data parallel: its measured all-reduce kernels "
            f"({replaced_ms / n_steps:.2f} ms per step) were replaced by the modelled ones"
        )
    return graph


def _bucket_source(options: Options) -> str:
    """Where the bucket sizes come from: PyTorch's defaults, or the user's options."""
    if (options.first_bucket_mb, options.bucket_mb) == (DEFAULT_FIRST_BUCKET_MB, DEFAULT_BUCKET_MB):
        return (
            ", PyTorch DDP's defaults (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, "
            "bucket_cap_mb)"
        )
    return ", as given"


def check_options(options: Options) -> None:
    """Values the model cannot take (the registry calls this when it builds the options)."""
    if options.gpus < 2:
        raise OptionValueError("ddp: gpus must be at least 2")
    if options.bucket_mb <= 0 or options.first_bucket_mb <= 0:
        raise OptionValueError("ddp: bucket_mb and first_bucket_mb must be positive")
    if options.params_mb is not None and options.params_mb <= 0:
        raise OptionValueError("ddp: params_mb must be positive")
    if options.grad_bytes not in (1, 2, 4, 8):
        raise OptionValueError("ddp: grad_bytes must be 1, 2, 4 or 8 (bytes per gradient element)")
    if options.algorithm not in ("ring", "tree"):
        raise OptionValueError("ddp: algorithm must be ring or tree")
    check_node_options("ddp", options.gpus_per_node, options.nics_per_node)
    check_link("ddp", options.link)


def drop_measured_allreduces(graph: Graph, model: str = "ddp") -> float:
    """Remove the trace's own all-reduce kernels; refuse other collectives. Returns ms.
    `model` names the what-if asking, in its refusals."""
    c = graph.cols
    table = graph.table
    gpu = P.select(graph, kind="gpu")
    ev = c["event"][gpu]
    is_coll = np.zeros(gpu.size, dtype=bool)
    has = ev >= 0
    is_coll[has] = collective_kernel_mask(table)[ev[has]]
    # Only the steps' own: collectives queued before the trace began (no launch, no
    # arguments) do not say what they run, and are not the step's traffic.
    comm = gpu[is_coll & (c["iteration"][gpu] >= 0)]
    if comm.size == 0:
        return 0.0
    kinds: dict[int, str | None] = {}
    with_arg = 0  # kernels that carry a 'Collective name' arg
    for node in comm.tolist():
        ev = int(c["event"][node])
        coll = None
        if ev >= 0 and table.coll_name[ev] >= 0:
            with_arg += 1
            coll = collective_from_kernel_name(table.names[int(table.coll_name[ev])])
        if coll is None:
            coll = collective_from_kernel_name(graph.name_of(node))
        kinds[node] = coll
    unknown = [n for n, k in kinds.items() if k is None]
    if unknown:
        raise NotApplicableError(
            f"{model}: the trace already runs collectives, and {len(unknown):,} of its "
            f"{len(kinds):,} collective kernels (e.g. '{shorten(graph.name_of(unknown[0]))}') "
            "say neither by name nor by a 'Collective name' arg which collective they run: "
            "cannot tell data-parallel all-reduces from other traffic",
            hint=f"profile the model on one GPU without DDP, as {model} adds its own "
            "collectives; "
            "or pass a trace whose collective kernels all carry a 'Collective name' arg, which "
            f"recent PyTorch profilers write on NCCL/RCCL kernels: {with_arg:,} of these do",
        )
    other = sorted({str(k) for k in kinds.values() if k != _REPLACED and k not in _KEPT})
    if other:
        raise NotApplicableError(
            f"{model}: the trace already runs collectives other than all-reduce "
            f"({', '.join(other)}: sharded or model-parallel training?); {model} starts "
            "from a single-GPU or plain data-parallel (all-reduce only) trace"
        )
    drop = np.array([n for n, k in kinds.items() if k == _REPLACED], dtype=np.int64)
    if drop.size == 0:
        return 0.0
    ms = float(c["dur"][drop].sum()) / 1e6
    P.remove(graph, drop)
    # Their cross-stream waits go with them: the modelled all-reduces bring their own.
    graph.drop_edges(np.isin(graph.edge_src, drop) | np.isin(graph.edge_dst, drop))
    return ms


def shorten(name: str, width: int = 60) -> str:
    """`name` cut to at most `width` characters at a word or underscore boundary, with '…'
    (a kernel name in a message: 'ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)')."""
    if len(name) <= width:
        return name
    head = name[: width - 1]
    cut = max(head.rfind(ch) for ch in " _(<,:")
    if cut < width // 2:  # no boundary in the second half: cut the long token
        cut = width - 1
    return head[:cut].rstrip(" _(<,:") + "…"


def _gradient_points(graph: Graph) -> list[_Point]:
    """Outermost AccumulateGrad ops inside steps, with their host node and size."""
    table = graph.table
    c = graph.cols
    is_ag = np.array(["AccumulateGrad" in n for n in table.names], dtype=bool)
    op_kind = np.isin(table.kind, [int(Kind.CPU_OP), int(Kind.USER_ANNOTATION)])
    rows = np.flatnonzero(op_kind & is_ag[table.name] & (table.iteration >= 0))
    if rows.size == 0:
        return []
    par = table.parent[rows]
    nested = (par >= 0) & is_ag[table.name[np.maximum(par, 0)]]
    rows = rows[~nested]
    children = _children_index(table.parent)
    alive = graph.alive
    host = np.isin(c["kind"], [int(k) for k in _HOST_KINDS]) & alive
    lane_of = {(ln.rank, ln.pid, ln.tid): i for i, ln in enumerate(graph.lanes) if not ln.is_gpu}
    lane_nodes: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    points = []
    for r in rows.tolist():
        rank = int(table.rank[r])
        lane = lane_of.get((rank, int(table.pid[r]), int(table.tid[r])))
        origin = graph.rank_origin_ns.get(rank)
        if lane is None or origin is None:
            continue
        if lane not in lane_nodes:
            nodes = np.flatnonzero(host & (c["lane"] == lane))
            nodes = nodes[np.argsort(c["order"][nodes], kind="stable")]
            lane_nodes[lane] = (nodes, c["order"][nodes])
        nodes, keys = lane_nodes[lane]
        end = float(table.ts[r] + table.dur[r] - origin)
        j = int(np.searchsorted(keys, end, side="left")) - 1
        if j < 0:
            continue
        points.append(
            _Point(rank, int(table.iteration[r]), end, int(nodes[j]), _numel_of(table, r, children))
        )
    return points


def _children_index(parent: np.ndarray):
    order = np.argsort(parent, kind="stable")
    sorted_parent = parent[order]

    def children(row: int) -> np.ndarray:
        lo = int(np.searchsorted(sorted_parent, row, side="left"))
        hi = int(np.searchsorted(sorted_parent, row, side="right"))
        return order[lo:hi]

    return children


def _numel_of(table, row: int, children, depth: int = 3) -> float:
    """Elements of the parameter an AccumulateGrad op accumulates, from recorded shapes.

    The op's own Input Dims first, then its children's (breadth first, by start time).
    An empty dims list ("[[]]") is returned as -1: a scalar, or shapes not recorded.
    """
    frontier = [row]
    found_empty = False
    for _ in range(depth + 1):
        nxt = []
        for r in frontier:
            s = int(table.shapes[r])
            if s >= 0:
                n = _first_numel(table.names[s])
                if n is not None and n >= 0:
                    return float(n)
                found_empty = found_empty or n == -1
            kids = children(r)
            nxt.extend(kids[np.argsort(table.ts[kids], kind="stable")].tolist())
        frontier = nxt
        if not frontier:
            break
    return -1.0 if found_empty else math.nan


def _first_numel(text: str) -> int | None:
    """Elements of the first tensor in an "Input Dims" string; -1 for an empty shape."""
    dims = parse_input_dims(text)
    if not dims or not isinstance(dims[0], list):
        return None
    first = dims[0]
    if not first:
        return -1
    if not is_shape(first):
        return None
    return math.prod(first)


def _gradient_bytes(
    points: list[_Point], options: Options, table: EventTable
) -> tuple[list[float], str]:
    numel = np.array([p.numel for p in points], dtype=np.float64)
    has_real = bool((numel > 0).any())
    # Empty shapes are scalars when other parameters have shapes, else unknown.
    numel = np.where(numel == -1, 1.0 if has_real else np.nan, numel)
    known = ~np.isnan(numel)
    if options.params_mb is not None:
        total = {p.rank: options.params_mb * MIB for p in points}
        sizes, how = _split(points, numel, known, total)
        return sizes, f"params_mb={options.params_mb:g} {how}"
    if not known.all():
        # A DDP trace's own all-reduces carry the gradients' size (the bucket's elements).
        measured = {r: nbytes for r, (nbytes, _) in allreduced_per_step(table).items()}
        missing = int((~known).sum())
        if not all(measured.get(p.rank) for p in points):
            raise NotApplicableError(
                f"ddp: {missing} of {len(points)} AccumulateGrad ops carry no parameter shape",
                hint="record the trace with record_shapes=True, or pass "
                "params_mb=<MiB of gradients>",
            )
        sizes, how = _split(points, numel, known, measured)
        mib = sum(measured.values()) / len(measured) / MIB
        return sizes, (
            f"{missing} of {len(points)} AccumulateGrad ops carry no shape: the gradients "
            f"are the {mib:.1f} MiB per step the trace's own all-reduces moved, {how}"
        )
    return (numel * options.grad_bytes).tolist(), (
        f"shapes from the trace x {options.grad_bytes} bytes"
    )


def _split(
    points: list[_Point], numel: np.ndarray, known: np.ndarray, total: dict[int, float]
) -> tuple[list[float], str]:
    """Each (rank, step)'s `total[rank]` bytes over its gradients: by shape when every one
    is known, else evenly."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(points):
        groups.setdefault((p.rank, p.iteration), []).append(i)
    sizes = [0.0] * len(points)
    by_shape = bool(known.all())
    for (rank, _), idx in groups.items():
        w = numel[idx] if by_shape and numel[idx].sum() > 0 else np.ones(len(idx))
        for i, share in zip(idx, (w / w.sum()).tolist()):
            sizes[i] = total[rank] * share
    return sizes, "split by shape" if by_shape else "split evenly over AccumulateGrad ops"


def _buckets(sizes: list[float], options: Options) -> list[list[int]]:
    """DDP's bucket assignment over gradients in ready order: indices per bucket."""
    limits = [options.first_bucket_mb * MIB, options.bucket_mb * MIB]
    out: list[list[int]] = []
    cur: list[int] = []
    acc = 0.0
    for i, s in enumerate(sizes):
        cur.append(i)
        acc += s
        if acc >= limits[min(len(out), 1)]:
            out.append(cur)
            cur, acc = [], 0.0
    if cur:
        out.append(cur)
    return out


def _add_comm_lane(graph: Graph, rank: int, compute_lanes: list[int]) -> int:
    lanes = [graph.lanes[i] for i in compute_lanes]
    dev = lanes[0].pid if lanes else 0
    stream = max((ln.tid for ln in lanes), default=0) + 1
    return P.add_lane(
        graph, rank, True, dev, stream, f"GPU {dev} stream {stream} (modelled NCCL all-reduce)"
    )


def _launch_index(graph: Graph, lanes: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per compute lane: live GPU nodes sorted by when they were launched, and those keys."""
    c = graph.cols
    gpu = np.flatnonzero((c["kind"] == NodeKind.GPU) & graph.alive)
    out = {}
    gpu = gpu[np.isin(c["lane"][gpu], lanes)]
    for lane, pos in split_by(c["lane"][gpu], c["launch_order"][gpu]):
        nodes = gpu[pos]
        out[lane] = (nodes, c["launch_order"][nodes])
    return out


def _wait_after_backward(
    graph: Graph,
    key: tuple[int, int],
    last_ar: int,
    ready: float,
    launched: dict[int, tuple[np.ndarray, np.ndarray]],
    gap: int,
    blocking_wait: bool,
) -> None:
    """Compute streams that ran backward wait for the last all-reduce (DDP finalize): the
    work launched after backward's end and after the last gradient was ready (`ready`, its
    order), never work the all-reduce itself waits for (a damaged trace can put a gradient
    after what it takes for backward's end)."""
    rank, it = key
    c = graph.cols
    bwd_host = P.select(graph, kind="host", phase="backward", rank=rank, iteration=it)
    bwd_host = bwd_host[c["kind"][bwd_host] != NodeKind.WAIT]
    if bwd_host.size == 0:
        return
    end_node = int(bwd_host[np.argmax(c["order"][bwd_host])])
    t_end = float(c["order"][end_node])
    t_gpu = max(t_end, ready)
    bwd_gpu = P.select(graph, kind="gpu", phase="backward", rank=rank, iteration=it)
    lanes = set(c["lane"][bwd_gpu].tolist()) & set(launched) or set(launched)
    # Never a task the all-reduces wait for (launched up to the last bucket's gradient), nor
    # one that runs before such a task on the stream: either closes a cycle. The launch and
    # stream orders agree in a consistent trace; a task without a launch link keeps its own
    # GPU start as launch order, and they do not (r50_fused, the 2021 ResNet-50 traces).
    waited = float(c["launch_order"][last_ar])
    for lane in sorted(lanes):
        nodes, keys = launched[lane]
        j = int(np.searchsorted(keys, t_gpu, side="right"))
        k = int(np.searchsorted(keys, waited, side="right"))
        j = max(j, k)
        if k > 0 and j < nodes.size:
            later = np.flatnonzero(c["order"][nodes[j:]] > c["order"][nodes[:k]].max())
            j = j + int(later[0]) if later.size else nodes.size
        if j < nodes.size:
            graph.add_edges(np.array([last_ar]), np.array([int(nodes[j])]), gap, EdgeType.DATA)
    if blocking_wait:
        # finalize runs after the last gradient: the host node after backward's end waits.
        lane = int(c["lane"][end_node])
        after = P.select(graph, kind="host", lane=lane)
        after = after[c["order"][after] > t_end]
        if after.size:
            nxt = int(after[np.argmin(c["order"][after])])
            graph.add_edges(np.array([last_ar]), np.array([nxt]), 0, EdgeType.DATA, at_end=True)
