"""The ddp, activation-checkpointing and dataloader-overlap what-ifs on hand-made traces.

Every expected step time is worked out by hand from the trace below; times in µs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import perfcast
from perfcast import calibration
from perfcast.calibration import Calibration, CheckpointCosts, DataLoaderCosts
from perfcast.errors import NotApplicableError, PerfcastError
from perfcast.graph.build import build_graph
from perfcast.graph.model import NodeKind, Source
from perfcast.hardware import lookup_link
from perfcast.sim.timeline import simulate
from perfcast.whatif.registry import parse_spec
from perfcast.whatif.runner import run_whatif

PID, TID, GPU_PID, STREAM = 100, 100, 0, 7
A100 = {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "numSms": 108}
AG = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
DL = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
SHAPE = [[1024, 1024], [1024, 1024]]  # one 1024x1024 fp32 parameter: 4 MiB of gradient
MIB = 1 << 20


def _x(cat: str, name: str, pid: int, tid: int, ts: float, dur: float, args: dict) -> dict:
    """A complete ("X") event."""
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}  # fmt: skip


class Trace:
    """A Kineto trace in today's format, built event by event."""

    def __init__(self, device: dict | None = A100) -> None:
        self.events: list[dict[str, Any]] = []
        self.corr = 0
        self.device = device

    def op(self, name: str, ts: float, dur: float, cat: str = "cpu_op", **args: Any) -> None:
        self.events.append(_x(cat, name, PID, TID, ts, dur, args))

    def launch(
        self, ts: float, dur: float, kernel: str, k_ts: float, k_dur: float, stream: int = STREAM
    ) -> None:
        """cudaLaunchKernel on the host and its kernel, matched by correlation id."""
        self.corr += 1
        self.events.append(
            _x("cuda_runtime", "cudaLaunchKernel", PID, TID, ts, dur, {"correlation": self.corr})
        )
        args = {"correlation": self.corr, "stream": stream, "device": 0}
        self.events.append(_x("kernel", kernel, GPU_PID, stream, k_ts, k_dur, args))

    def write(self, path: Path) -> Path:
        doc: dict[str, Any] = {"schemaVersion": 1, "traceEvents": self.events}
        if self.device:
            doc["deviceProperties"] = [self.device]
        path.write_text(json.dumps(doc))
        return path


def training_step(shapes: bool = True, extra_kernel: str | None = None) -> Trace:
    """One GPU-bound training step: the host is far ahead, the GPU runs back to back.

    GPU (stream 7): linear 10-210, relu 210-260 | backward: addmm' 260-460, grad add 460-470,
    mm' 470-670, grad add 670-680 | Adam 680-730. Measured step: 730 µs.
    """
    t = Trace()
    t.op("ProfilerStep#1", 0, 100, cat="user_annotation")
    t.op("aten::linear", 5, 7)
    t.launch(6, 3, "ampere_sgemm_128x64_tn", 10, 200)
    t.op("aten::relu", 13, 5)
    t.launch(14, 2, "vectorized_elementwise_kernel<relu>", 210, 50)
    dims = {"Input Dims": SHAPE} if shapes else {}
    for k, (b0, kern) in enumerate(((20, 260), (40, 470))):
        name = "AddmmBackward0" if k == 0 else "MmBackward0"
        t.op(f"autograd::engine::evaluate_function: {name}", b0, 10)
        t.launch(b0 + 1, 3, f"ampere_sgemm_128x64_nn_{name}", kern, 200)
        a0 = b0 + 11
        t.op(AG, a0, 8)
        t.op("torch::autograd::AccumulateGrad", a0 + 1, 6)
        t.op("aten::add_", a0 + 2, 4, **dims)
        t.launch(a0 + 3, 2, "vectorized_elementwise_kernel<add>", kern + 200, 10)
    t.op("Optimizer.step#Adam.step", 70, 20, cat="user_annotation")
    t.launch(75, 3, "multi_tensor_apply_kernel<adam>", 680, 50)
    if extra_kernel:  # a collective the trace itself ran (300 µs on stream 20), after backward
        t.op("c10d::allreduce_", 65, 4)
        t.launch(66, 2, extra_kernel, 690, 300, stream=20)
    return t


def dataloader_steps(t_dl: float = 8000, t_rest: float = 2000, steps: int = 2) -> Trace:
    """A CPU-only trace whose steps load data on the main thread (T_dl), then compute."""
    t = Trace(device=None)
    for s in range(steps):
        t0 = s * (t_dl + t_rest)
        t.op(f"ProfilerStep#{s + 1}", t0, t_dl + t_rest, cat="user_annotation")
        t.op(DL, t0, t_dl, cat="user_annotation")
        t.op("aten::stack", t0 + 10, t_dl - 20)
        t.op("aten::mm", t0 + t_dl, t_rest)
    return t


def predict(path: Path, *specs: str):
    table = perfcast.load(path)
    result, _, predicted = run_whatif(table, [parse_spec(s) for s in specs], correct=False)
    return result, predicted


def ar_us(mib: float, gpus: int = 8, link: str = "nvlink3") -> float:
    """Ring all-reduce inside one node as the cluster model prices it: 10 µs per collective,
    alpha per ring step, 2(p-1)/p N at 80% of the link's peak (nccl-tests bus bandwidth)."""
    spec = lookup_link(link)
    assert spec is not None
    steps = 2 * (gpus - 1)
    busbw = 0.80 * spec.bw_gbs_per_direction * 1e3  # bytes per µs
    return 10.0 + steps * spec.latency_us + steps / gpus * mib * MIB / busbw


@pytest.fixture
def step_trace(tmp_path: Path) -> Path:
    return training_step().write(tmp_path / "step.json")


def test_the_hand_trace_replays_as_measured(step_trace: Path) -> None:
    graph = build_graph(perfcast.load(step_trace))
    # All GPU tasks but the first start right after their stream predecessor.
    assert graph.nominal["stream_gap_ns"] == 0
    tl = simulate(graph)
    assert [s for *_, s in tl.iteration_ns()] == [730_000]


# ---------------------------------------------------------------------------------------------
# ddp


def test_ddp_buckets_from_shapes_overlap_backward(step_trace: Path) -> None:
    # Two 4 MiB gradients. The first fills the 1 MiB first bucket; the second is the last
    # bucket. Bucket 1 reduces during mm' (470-502.9, hidden); bucket 2 starts when the last
    # grad add ends (680) and Adam waits for it: 680 + T + 50.
    # Ring on 8 GPUs over NVLink 3 (300 GB/s peak, 240 reached, 0.6 µs): 10 µs, 2*7 steps of
    # 0.6 µs, and 2*7/8 of 4 MiB at 240 GB/s.
    assert ar_us(4) == pytest.approx(10 + 14 * 0.6 + 1.75 * 4 * MIB / 240e3)  # 48.98 µs
    result, predicted = predict(step_trace, "ddp:gpus=8")
    expected = 680 + ar_us(4) + 50
    assert result.baseline_ms == pytest.approx(0.730)
    assert result.predicted_ms * 1000 == pytest.approx(expected, abs=0.002)
    g = predicted.graph
    ar = [i for i in range(len(g)) if g.name_of(i).startswith("ncclKernel_AllReduce (modelled")]
    assert len(ar) == 2
    assert all(g.cols["source"][i] == Source.MODELLED for i in ar)
    assert predicted.start[ar[0]] == 470_000  # after the first grad add, not before
    text = result.applied[0].assumptions[0]
    assert "nvlink3" in text and "240 GB/s" in text and "10 µs per collective" in text


def test_ddp_beyond_one_node_is_bound_by_the_network(step_trace: Path) -> None:
    inside, _ = predict(step_trace, "ddp:gpus=8")
    across, _ = predict(step_trace, "ddp:gpus=16")
    # 16 A100s are two nodes of 8: the ring leaves each node on 8 HDR NICs (8 x 25 GB/s x 0.9
    # = 180 GB/s), below NVLink's 240, and the inter-node hop latency is higher.
    assert across.predicted_ms > inside.predicted_ms
    assert any("span nodes of 8" in a for a in across.applied[0].assumptions)
    wide, _ = predict(step_trace, "ddp:gpus=16,gpus_per_node=16")
    assert wide.predicted_ms < across.predicted_ms
    # Four NICs for eight GPUs: half the bandwidth per GPU between nodes, said so.
    fewer, _ = predict(step_trace, "ddp:gpus=16,nics_per_node=4")
    assert fewer.predicted_ms > across.predicted_ms
    assert any("4 x ib-hdr" in a or "12.5 GB/s per GPU" in a for a in fewer.applied[0].assumptions)
    for spec in ("ddp:gpus=16,nics_per_node=0", "zero:gpus=16,nics_per_node=0,params_mb=100"):
        with pytest.raises(NotApplicableError, match="nics_per_node"):
            predict(step_trace, spec)


def test_ddp_one_big_bucket_waits_for_the_last_gradient(step_trace: Path) -> None:
    result, _ = predict(step_trace, "ddp:gpus=8,first_bucket_mb=25")
    assert result.predicted_ms * 1000 == pytest.approx(680 + ar_us(8) + 50, abs=0.002)


def test_ddp_link_and_gpu_count(step_trace: Path) -> None:
    result, _ = predict(step_trace, "ddp:gpus=2,link=pcie4")
    assert result.predicted_ms * 1000 == pytest.approx(680 + ar_us(4, 2, "pcie4") + 50, abs=0.002)
    with pytest.raises(NotApplicableError, match="unknown link"):
        predict(step_trace, "ddp:link=carrier_pigeon")
    with pytest.raises(NotApplicableError, match="at least 2"):
        predict(step_trace, "ddp:gpus=1")


def test_ddp_without_shapes_needs_params_mb(tmp_path: Path) -> None:
    path = training_step(shapes=False).write(tmp_path / "noshapes.json")
    with pytest.raises(NotApplicableError, match="record_shapes=True"):
        predict(path, "ddp")
    # 8 MiB split evenly over the two AccumulateGrad ops: the same as the shapes say.
    result, _ = predict(path, "ddp:params_mb=8")
    assert result.predicted_ms * 1000 == pytest.approx(680 + ar_us(4) + 50, abs=0.002)


def test_ddp_blocking_wait_holds_the_host(step_trace: Path) -> None:
    # With TORCH_NCCL_BLOCKING_WAIT the host idles until the last all-reduce ends (at
    # 680 + T); only then run the optimizer's 5 µs of Python before its launch, the 3 µs
    # launch, the 5 µs default launch latency (too few launch-bound kernels to measure it),
    # and Adam's 50 µs.
    result, _ = predict(step_trace, "ddp:blocking_wait=true")
    assert result.predicted_ms * 1000 == pytest.approx(680 + ar_us(4) + 5 + 3 + 5 + 50, abs=0.002)


def test_ddp_replaces_the_traces_own_allreduce(tmp_path: Path) -> None:
    path = training_step(extra_kernel="ncclKernel_AllReduce_RING_LL_Sum_float").write(
        tmp_path / "ddp.json"
    )
    result, _ = predict(path, "ddp")
    # The measured 300 µs all-reduce (690-990) is gone; the modelled ones take its place.
    assert result.baseline_ms == pytest.approx(0.990)
    assert result.predicted_ms * 1000 == pytest.approx(680 + ar_us(4) + 50, abs=0.002)
    assert any("already ran data parallel" in a for a in result.applied[0].assumptions)


def test_ddp_refuses_other_collectives(tmp_path: Path) -> None:
    path = training_step(extra_kernel="ncclKernel_AllGather_RING_LL_Sum_int8_t").write(
        tmp_path / "fsdp.json"
    )
    with pytest.raises(NotApplicableError, match="allgather"):
        predict(path, "ddp")


def test_ddp_refuses_collectives_that_do_not_say_which(tmp_path: Path) -> None:
    # RCCL's generic kernel names no collective, and this one carries no 'Collective name'.
    name = "ncclDevKernel_Generic_with_a_very_long_template_argument_list(ncclDevKernelArgs<4096>)"
    path = training_step(extra_kernel=name).write(tmp_path / "generic.json")
    with pytest.raises(NotApplicableError) as info:
        predict(path, "ddp")
    text = str(info.value)
    assert "1 of its 1 collective kernels" in text
    # Cut at an underscore, not mid-token, with an ellipsis.
    assert "(e.g. 'ncclDevKernel_Generic_with_a_very_long_template_argument…')" in text
    assert "'Collective name' arg" in text and "all-reduces from other traffic" in text
    hint = info.value.hint or ""
    assert "profile the model on one GPU without DDP" in hint and "0 of these do" in hint


def test_shorten_cuts_kernel_names_at_a_boundary() -> None:
    from perfcast.whatif.models.ddp import shorten

    assert (
        shorten("ncclKernel_AllReduce_RING_LL_Sum_float")
        == "ncclKernel_AllReduce_RING_LL_Sum_float"
    )
    long = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem, unsigned long long, ncclDevComm*)"
    assert shorten(long) == "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem…"
    assert shorten("x" * 100) == "x" * 59 + "…"  # one long token: cut where it must be
    assert all(len(shorten(n)) <= 60 for n in (long, "x" * 100, "a_" * 50))


def test_ddp_refuses_cpu_only_and_inference(tmp_path: Path) -> None:
    with pytest.raises(NotApplicableError, match="CPU-only"):
        predict(dataloader_steps().write(tmp_path / "cpu.json"), "ddp")
    t = Trace()
    t.op("ProfilerStep#1", 0, 100, cat="user_annotation")
    t.op("aten::linear", 5, 7)
    t.launch(6, 3, "ampere_sgemm_128x64_tn", 10, 200)
    with pytest.raises(NotApplicableError, match="no backward"):
        predict(t.write(tmp_path / "inference.json"), "ddp")


# ---------------------------------------------------------------------------------------------
# activation-checkpointing


def test_checkpointing_everything_recomputes_the_forward(step_trace: Path) -> None:
    # linear (200) and relu (50) run again before addmm': 730 + 250.
    result, predicted = predict(step_trace, "activation-checkpointing")
    assert result.predicted_ms * 1000 == pytest.approx(980, abs=0.002)
    g = predicted.graph
    c = g.cols
    copies = [i for i in range(len(g)) if c["event"][i] < 0 and c["kind"][i] == NodeKind.GPU]
    assert sorted(int(c["dur"][i]) for i in copies) == [50_000, 200_000]
    assert all(c["source"][i] == Source.SCALED for i in copies)
    # Each copy is launched by a copied launch on the host, before the first backward launch.
    launches = [int(c["launch"][i]) for i in copies]
    assert all(c["kind"][x] == NodeKind.LAUNCH and c["event"][x] < 0 for x in launches)
    assert "the memory it saves is the memory model" in result.applied[0].assumptions[0]


def test_checkpointing_one_module(step_trace: Path) -> None:
    result, _ = predict(step_trace, "activation-checkpointing:module=relu")
    assert result.predicted_ms * 1000 == pytest.approx(780, abs=0.002)
    with pytest.raises(NotApplicableError) as info:
        predict(step_trace, "activation-checkpointing:module=nonexistent_layer")
    # What module= was searched in, and how to find names it could match.
    text = str(info.value)
    assert "module 'nonexistent_layer' matches none of the steps' forward work" in text
    assert "its 2 op names and 0 module/record_function scopes" in text
    hint = info.value.hint or ""
    assert "regular expression" in hint and "perfcast analyze --only scopes" in hint
    assert "with_stack=True" in hint


def test_checkpointing_without_forward_work_says_how_phases_are_found(tmp_path: Path) -> None:
    t = Trace()
    t.op("ProfilerStep#1", 0, 200, cat="user_annotation")
    t.op("autograd::engine::evaluate_function: MmBackward0", 10, 100)
    t.launch(15, 5, "ampere_sgemm_128x64_nn", 20, 50)
    with pytest.raises(NotApplicableError) as info:
        predict(t.write(tmp_path / "backward_only.json"), "activation-checkpointing")
    text = str(info.value)
    assert "the steps have a backward pass but no forward work to recompute" in text
    assert "the steps' CPU work is all in the backward phase" in text
    assert "ProfilerStep#N range" in text and "autograd backward" in text
    assert info.value.hint and "forward included" in info.value.hint


def test_checkpointing_cpu_only_copies_host_work(tmp_path: Path) -> None:
    t = Trace(device=None)
    t.op("ProfilerStep#1", 0, 1000, cat="user_annotation")
    t.op("aten::linear", 0, 300)
    t.op("autograd::engine::evaluate_function: AddmmBackward0", 300, 700)
    result, _ = predict(t.write(tmp_path / "cpu_train.json"), "activation-checkpointing")
    assert result.predicted_ms == pytest.approx(1.3)


def test_checkpointing_refuses_inference(tmp_path: Path) -> None:
    path = dataloader_steps().write(tmp_path / "cpu.json")
    with pytest.raises(NotApplicableError, match="no backward"):
        predict(path, "activation-checkpointing")


# ---------------------------------------------------------------------------------------------
# dataloader-overlap


@pytest.mark.parametrize(
    ("workers", "expected_ms"),
    [
        (1, 8.0),  # one worker: a batch every 8 ms, 2 of them overlapped by compute
        (2, 4.0),  # two workers: a batch every 4 ms; the main thread waits 2 ms
        (4, 2.05),  # four: a batch every 2 ms, ready in time: only the receive overhead
    ],
)
def test_dataloader_workers(tmp_path: Path, workers: int, expected_ms: float) -> None:
    path = dataloader_steps(t_dl=8000, t_rest=2000).write(tmp_path / "dl.json")
    result, _ = predict(path, f"dataloader-overlap:workers={workers}")
    assert result.baseline_ms == pytest.approx(10.0)
    assert result.predicted_ms == pytest.approx(expected_ms, abs=1e-5)
    assert "cores unknown" in result.applied[0].assumptions[0]


def test_dataloader_cpu_contention(tmp_path: Path) -> None:
    # 2 workers + main thread on 2 cores. At slowdown f the step is 4f (workers limit) and
    # a worker is busy u = 8 / (2 * 4f) = 1/f, so f = (1 + 2/f) / 2: f = (1 + sqrt(17)) / 4.
    path = dataloader_steps().write(tmp_path / "dl.json")
    result, _ = predict(path, "dataloader-overlap:workers=2,cores=2")
    f = (1 + math.sqrt(17)) / 4
    assert result.predicted_ms == pytest.approx(4 * f, rel=1e-3)
    # Enough cores: no contention.
    result, _ = predict(path, "dataloader-overlap:workers=2,cores=16")
    assert result.predicted_ms == pytest.approx(4.0, abs=1e-5)


def test_dataloader_refusals(tmp_path: Path, step_trace: Path) -> None:
    with pytest.raises(NotApplicableError, match="no data loading"):
        predict(step_trace, "dataloader-overlap")
    t = dataloader_steps()
    for e in t.events:
        e["name"] = e["name"].replace("_SingleProcess", "_MultiProcessing")
    with pytest.raises(NotApplicableError, match="already uses worker processes"):
        predict(t.write(tmp_path / "multi.json"), "dataloader-overlap")


def write_calibration(
    path: Path,
    *,
    batch_ms: float = 0.0,
    tensor_ms: float = 0.0,
    worker_batch_ms: float = 0.0,
    worker_tensor_ms: float = 0.0,
    region_ms: float = 0.0,
    op_ms: float = 0.0,
) -> Path:
    """A `perfcast calibrate` file with chosen numbers."""
    cal = Calibration(
        machine={"hostname": "testhost"},
        created="2026-01-01T00:00:00Z",
        dataloader=DataLoaderCosts(
            [1.0],
            [batch_ms],
            [tensor_ms],
            worker_batch_ms,
            worker_tensor_ms,
            2,
            "file_descriptor",
            {},
        ),
        checkpoint=CheckpointCosts(region_ms, op_ms, False, {}),
    )
    return calibration.save(cal, path)


def collated_steps(fields: int, t_dl: float = 8000, t_rest: float = 2000) -> Trace:
    """dataloader_steps whose fetch ends in default_collate: per-sample torch.tensor calls
    (aten::lift_fresh, not batch outputs), then one stack per tensor field and a
    torch.tensor of the labels."""
    t = Trace(device=None)
    for s in range(2):
        t0 = s * (t_dl + t_rest)
        t.op(f"ProfilerStep#{s + 1}", t0, t_dl + t_rest, cat="user_annotation")
        t.op(DL, t0, t_dl, cat="user_annotation")
        for i in range(4):
            t.op("aten::lift_fresh", t0 + 10 + i * 10, 5)
        for f in range(fields):
            t.op("aten::stack", t0 + 100 + f * 100, 50)
            t.op("aten::cat", t0 + 101 + f * 100, 40)  # inside the stack: not counted
        t.op("aten::lift_fresh", t0 + 100 + fields * 100, 5)
        t.op("aten::mm", t0 + t_dl, t_rest)
    return t


@pytest.mark.parametrize("fields", [1, 3])
def test_dataloader_receive_cost_from_calibration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fields: int
) -> None:
    # 4 workers deliver a batch every 2 ms (< T_rest): the step is T_rest + receive, and a
    # batch of `fields` stacked tensors plus the labels is fields + 1 tensors.
    cal = write_calibration(tmp_path / "cal.json", batch_ms=0.5, tensor_ms=0.25)
    monkeypatch.setenv("PERFCAST_CALIBRATION", str(cal))
    path = collated_steps(fields).write(tmp_path / "dl.json")
    result, _ = predict(path, "dataloader-overlap:workers=4")
    assert result.predicted_ms == pytest.approx(2.0 + 0.5 + 0.25 * (fields + 1), abs=1e-5)
    text = result.applied[0].assumptions[0]
    assert f"batch of {fields + 1} tensor(s)" in text and "calibrated on testhost" in text
    # An explicit overhead_ms wins over the calibration.
    result, _ = predict(path, "dataloader-overlap:workers=4,overhead_ms=0.1")
    assert result.predicted_ms == pytest.approx(2.1, abs=1e-5)


def test_dataloader_receive_depends_on_how_long_workers_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Receive 0.2 ms after 1 ms idle, 1.0 ms after 4 ms (0 ms per tensor). The main thread is
    # away T_rest = 2 ms per batch: half-way in log(gap), 0.6 ms.
    cal = Calibration(
        machine={"hostname": "testhost"},
        created="2026-01-01T00:00:00Z",
        dataloader=DataLoaderCosts([1.0, 4.0], [0.2, 1.0], [0.0, 0.0], 0, 0, 2, "fd", {}),
        checkpoint=None,
    )
    monkeypatch.setenv("PERFCAST_CALIBRATION", str(calibration.save(cal, tmp_path / "c.json")))
    path = collated_steps(1).write(tmp_path / "dl.json")
    result, _ = predict(path, "dataloader-overlap:workers=4")
    assert result.predicted_ms == pytest.approx(2.6, abs=1e-5)
    assert "after the main thread's 2.0 ms away" in result.applied[0].assumptions[0]


def test_dataloader_worker_side_hand_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The workers pay 1 + 0.5 * 2 ms per batch on top of the 8 ms of loading: two workers
    # deliver every (8 + 2) / 2 = 5 ms; the main thread needs 2 ms + its 0.1 ms receive.
    cal = write_calibration(
        tmp_path / "cal.json", batch_ms=0.1, worker_batch_ms=1.0, worker_tensor_ms=0.5
    )
    monkeypatch.setenv("PERFCAST_CALIBRATION", str(cal))
    path = collated_steps(1).write(tmp_path / "dl.json")
    result, _ = predict(path, "dataloader-overlap:workers=2")
    assert result.predicted_ms == pytest.approx(5.0, abs=1e-5)


def test_dataloader_uncalibrated_says_so(tmp_path: Path) -> None:
    path = collated_steps(1).write(tmp_path / "dl.json")
    result, _ = predict(path, "dataloader-overlap:workers=4")
    assert result.predicted_ms == pytest.approx(2.05, abs=1e-5)
    assert "perfcast calibrate" in result.applied[0].assumptions[0]


def test_dataloader_custom_collate_counts_one_tensor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No aten::stack: a custom collate_fn. Its torch.tensor calls cannot be told from
    # per-sample ones, so the batch counts as one tensor.
    cal = write_calibration(tmp_path / "cal.json", batch_ms=0.5, tensor_ms=0.25)
    monkeypatch.setenv("PERFCAST_CALIBRATION", str(cal))
    t = collated_steps(2)
    for e in t.events:
        e["name"] = e["name"].replace("aten::stack", "aten::copy_")
    result, _ = predict(t.write(tmp_path / "dl.json"), "dataloader-overlap:workers=4")
    assert result.predicted_ms == pytest.approx(2.75, abs=1e-5)
    assert "batch of 1 tensor(s)" in result.applied[0].assumptions[0]


@pytest.mark.parametrize(("worker_cores", "expected_ms"), [(1, 8.0), (2, 4.0), (4, 2.05)])
def test_dataloader_workers_on_their_own_cores(
    tmp_path: Path, worker_cores: int, expected_ms: float
) -> None:
    # 4 workers confined to K cores prepare K batches at a time (T_dl / K per batch) and do
    # not slow the main thread, even though `cores` would say they contend.
    path = dataloader_steps().write(tmp_path / "dl.json")
    result, _ = predict(path, f"dataloader-overlap:workers=4,cores=2,worker_cores={worker_cores}")
    assert result.predicted_ms == pytest.approx(expected_ms, abs=1e-5)
    assert "of their own" in result.applied[0].assumptions[0]


def test_calibration_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = dataloader_steps().write(tmp_path / "dl.json")
    monkeypatch.setenv("PERFCAST_CALIBRATION", str(tmp_path / "missing.json"))
    with pytest.raises(PerfcastError, match="calibration file not found"):
        predict(path, "dataloader-overlap:workers=2")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": 99}')
    monkeypatch.setenv("PERFCAST_CALIBRATION", str(bad))
    with pytest.raises(PerfcastError, match="not a perfcast calibration file"):
        predict(path, "dataloader-overlap:workers=2")


def test_checkpoint_bookkeeping_from_calibration(
    step_trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two recomputed ops (linear, relu) in 3 regions: 3 * 10 + 2 * 5 = 40 µs of host work
    # before the first backward launch. The host is far ahead of the GPU in this trace, so
    # the step (GPU-bound, 980 µs) does not change; the bookkeeping node is there.
    cal = write_calibration(step_trace.parent / "cal.json", region_ms=0.010, op_ms=0.005)
    monkeypatch.setenv("PERFCAST_CALIBRATION", str(cal))
    result, predicted = predict(step_trace, "activation-checkpointing:regions=3")
    assert result.predicted_ms * 1000 == pytest.approx(980, abs=0.002)
    c = predicted.graph.cols
    names = predicted.graph.names
    book = [
        i for i in range(len(predicted.graph)) if names[c["name"][i]] == "checkpoint bookkeeping"
    ]
    assert len(book) == 1 and int(c["dur"][book[0]]) == 40_000
    assert c["source"][book[0]] == Source.MODELLED
    assert "3 region(s)" in result.applied[0].assumptions[1]


def test_checkpoint_bookkeeping_on_a_cpu_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CPU-only: the step grows by the recompute (300) and the bookkeeping (2 * 20 + 1 * 10).
    t = Trace(device=None)
    t.op("ProfilerStep#1", 0, 1000, cat="user_annotation")
    t.op("aten::linear", 0, 300)
    t.op("aten::addmm", 10, 280)  # inside linear: the one recomputed op is linear
    t.op("autograd::engine::evaluate_function: AddmmBackward0", 300, 700)
    path = t.write(tmp_path / "cpu_train.json")
    result, _ = predict(path, "activation-checkpointing:regions=2")
    assert result.predicted_ms == pytest.approx(1.3)
    assert "not counted: no calibration" in result.applied[0].assumptions[1]
    cal = write_calibration(tmp_path / "cal.json", region_ms=0.020, op_ms=0.010)
    monkeypatch.setenv("PERFCAST_CALIBRATION", str(cal))
    result, _ = predict(path, "activation-checkpointing:regions=2")
    assert result.predicted_ms == pytest.approx(1.35)
    with pytest.raises(NotApplicableError, match="regions"):
        predict(path, "activation-checkpointing:regions=0")


# ---------------------------------------------------------------------------------------------
# composition


def test_ddp_and_checkpointing_compose_in_either_order(step_trace: Path) -> None:
    # Recompute delays backward by 250 µs; the last bucket still follows the last grad add.
    expected = 680 + 250 + ar_us(4) + 50
    for specs in (("activation-checkpointing", "ddp"), ("ddp", "activation-checkpointing")):
        result, predicted = predict(step_trace, *specs)
        assert result.predicted_ms * 1000 == pytest.approx(expected, abs=0.002)
        assert [a.name for a in result.applied] == list(specs)
        assert not predicted.graph.check_invariants()


def test_dataloader_composes_with_other_models(tmp_path: Path) -> None:
    # Compute 2x faster first: T_rest = 1 ms, two workers deliver every 4 ms -> 4 ms steps.
    path = dataloader_steps().write(tmp_path / "dl.json")
    result, _ = predict(path, "faster-op:pattern=aten::mm,factor=2", "dataloader-overlap:workers=2")
    assert result.predicted_ms == pytest.approx(4.0, abs=1e-5)
    result, _ = predict(path, "faster-op:pattern=aten::mm,factor=2", "dataloader-overlap:workers=8")
    assert result.predicted_ms == pytest.approx(1.05, abs=1e-5)


# ---------------------------------------------------------------------------------------------
# real traces


@pytest.mark.slow
def test_real_ddp_trace(shared_traces: Path) -> None:
    table = perfcast.load(shared_traces / "hta_ddp_v100_rank1_memory.json.gz")
    with pytest.raises(NotApplicableError, match="params_mb"):
        run_whatif(table, [parse_spec("ddp")], correct=False)
    for spec in ("ddp:params_mb=100", "ddp:params_mb=100,gpus=64,link=pcie3"):
        result, _, _ = run_whatif(table, [parse_spec(spec)], correct=False)
        assert math.isfinite(result.speedup) and result.speedup > 0
        assert any("replaced" in a for a in result.applied[0].assumptions)


def test_ddp_and_zero_size_gradients_by_a_ddp_traces_own_allreduces() -> None:
    """The shipped DDP example has no shapes: ddp and zero refused it (pass params_mb) while
    `plan` read 97.5 MiB of gradients per step off its all-reduces. All three agree now."""
    example = Path(__file__).parents[1] / "perfcast/examples/ddp_a100_rank0.json.gz"
    table = perfcast.load(example)
    ddp, _, _ = run_whatif(table, [parse_spec("ddp:gpus=8")], correct=False)
    said = " ".join(ddp.applied[0].assumptions)
    assert "97.5 MiB per step the trace's own all-reduces moved" in said
    zero, _, _ = run_whatif(table, [parse_spec("zero:gpus=8")], correct=False)
    said = " ".join(zero.applied[0].assumptions)
    assert "25.6 M parameters" in said and "all-reduces moved per step" in said
    # params_mb still decides when given.
    given, _, _ = run_whatif(table, [parse_spec("ddp:gpus=8,params_mb=10")], correct=False)
    assert "params_mb=10" in " ".join(given.applied[0].assumptions)
    assert given.predicted_ms <= ddp.predicted_ms


@pytest.mark.slow
def test_real_bert_inference_trace(shared_traces: Path) -> None:
    # One inference step: none of the three models applies, and each says why.
    table = perfcast.load(shared_traces / "tracelens_h100_bert_small.json.gz")
    for spec, why in (
        ("ddp", "no backward"),
        ("activation-checkpointing", "no backward"),
        ("dataloader-overlap", "no data loading"),
    ):
        with pytest.raises(NotApplicableError, match=why):
            run_whatif(table, [parse_spec(spec)], correct=False)


@pytest.mark.slow
def test_real_single_gpu_training_trace(shared_traces: Path) -> None:
    table = perfcast.load(shared_traces / "hta_v100_ns_resolution.json.gz")
    for specs in (
        ["ddp:params_mb=100"],
        ["activation-checkpointing"],
        ["activation-checkpointing", "ddp:params_mb=100"],
    ):
        result, _, _ = run_whatif(table, [parse_spec(s) for s in specs], correct=False)
        assert math.isfinite(result.speedup) and result.speedup > 0
    # Recomputing the forward cannot make the step faster.
    assert result.speedup < 1


@pytest.mark.slow
def test_real_ddp_on_a_trace_with_kernels_without_launch_links(shared_traces: Path) -> None:
    # 2021 format: many kernels keep no launch link, so their launch order is their own start;
    # ddp made the first "after backward" kernel one that ran before a gradient: a cycle.
    table = perfcast.load(shared_traces / "resnet50_v100_nw4_2021.json.gz")
    result, _, _ = run_whatif(table, [parse_spec("ddp:gpus=4")])
    assert math.isfinite(result.speedup) and 0.9 < result.speedup <= 1.0


def test_ddp_reducer_work_is_backward() -> None:
    """DDP's reducer copies the reduced buckets back into the gradients from autograd hooks
    (161 copy kernels per step in the example trace): backward work, not the forward the
    unnamed default would make it, so ZeRO units and pipeline stages cut from forward do
    not take them."""
    from perfcast.graph.phases import Phase, event_phases, phase_of_name

    assert phase_of_name("torch.distributed.ddp.reducer::copy_bucket_to_grad") == Phase.BACKWARD
    import numpy as np

    table = perfcast.load(Path(__file__).parents[1] / "perfcast/examples/ddp_a100_rank0.json.gz")
    phase = event_phases(table)
    reducer = [i for i, n in enumerate(table.names) if n.startswith("torch.distributed.ddp")]
    rows = np.flatnonzero(np.isin(table.name, reducer))
    assert rows.size and (phase[rows] == Phase.BACKWARD).all()
