"""amp on a real trace: the ResNet-50 H100 baseline of the recorded accuracy set (fp32 convs).

Autocast casts each fp32 weight before its forward conv/matmul, and autograd casts the
16-bit weight gradient back to fp32 in a ToCopyBackward0 node right after the layer's own
backward node: both have host and GPU cost, read from the trace.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from perfcast import load
from perfcast.graph import build_graph
from perfcast.graph.model import NodeKind
from perfcast.graph.phases import Phase
from perfcast.sim.timeline import simulate
from perfcast.whatif.models import amp
from perfcast.whatif.registry import build_options, get_model

R50 = Path(__file__).parents[1] / "benchmarks/accuracy/recorded/traces/h100/r50_base.json.gz"


def test_gradient_casts_follow_their_layers_in_backward() -> None:
    graph = build_graph(load(R50))
    costs = amp._host_costs(graph)
    assert costs.cast_ns > 0 and costs.node_ns > 0
    # The fp32 trace has no casts: forward's one-kernel elementwise ops (autograd records a
    # node for each, as for a weight's cast) stand in.
    assert "one-kernel elementwise ops in forward" in costs.cast_from
    g = get_model("amp").apply(graph.copy(), build_options("amp", {}))
    c = g.cols
    alive = g.alive

    def named(text: str) -> np.ndarray:
        ids = [i for i, n in enumerate(g.names) if text in n]
        return np.flatnonzero(np.isin(c["name"], ids) & alive)

    fwd_kernels = named("autocast cast fp32 -> bf16")
    bwd_kernels = named("-> fp32 gradient")
    bwd_cpu = named("ToCopyBackward0 (autocast, modelled)")
    # ResNet-50: 53 convolutions and one linear layer, three steps in the trace.
    assert fwd_kernels.size == bwd_kernels.size == bwd_cpu.size == 3 * 54
    assert (c["phase"][bwd_kernels] == Phase.BACKWARD).all()
    assert (c["kind"][bwd_cpu] == NodeKind.CPU).all()
    assert (c["dur"][bwd_cpu] == costs.node_ns + costs.cast_ns).all()
    # Each gradient cast kernel is launched by a launch of its own, on the CPU thread.
    launches = c["launch"][bwd_kernels]
    assert (launches >= 0).all() and (c["kind"][launches] == NodeKind.LAUNCH).all()
    # Within each step, the backward casts carry the forward ones' sizes, layers in reverse.
    for it in np.unique(c["iteration"][fwd_kernels]).tolist():
        f = fwd_kernels[c["iteration"][fwd_kernels] == it]
        b = bwd_kernels[c["iteration"][bwd_kernels] == it]
        f = f[np.argsort(c["order"][f], kind="stable")]
        b = b[np.argsort(c["launch_order"][b], kind="stable")]
        assert c["nbytes"][b].tolist() == c["nbytes"][f][::-1].tolist()
        assert c["dur"][b].tolist() == c["dur"][f][::-1].tolist()
        assert len(set(c["nbytes"][f].tolist())) > 5  # distinct layers: the order matters
    # On its stream, nothing launched before a cast runs after it.
    for k in bwd_kernels.tolist():
        on = np.flatnonzero((c["lane"] == c["lane"][k]) & alive)
        later = c["order"][on] > c["order"][k]
        assert not (later & (c["launch_order"][on] < c["launch_order"][k])).any()
    assert g.check_invariants() == []
    simulate(g)  # replays (no cycle)
    assert any(
        "per step (mean of 3 steps)" in a and "54 gradient casts back to fp32" in a
        for a in g.assumptions
    )


def test_a_trace_with_casts_lends_them_its_cost() -> None:
    """The bf16 trace of the same model has autocast's casts inside its convolutions (and
    their gradients' casts in backward): their own median is used."""
    graph = build_graph(load(R50.with_name("r50_amp_bf16.json.gz")))
    costs = amp._host_costs(graph)
    assert costs.cast_from == "the trace's 339 casts that launched a kernel"
    proxy = amp._host_costs(build_graph(load(R50)))
    # What the fp32 trace's stand-ins say, with the three nested records a cast makes beyond
    # a one-kernel elementwise op, is what the bf16 trace's own casts cost (24.3 vs 25.5 µs;
    # the stand-ins alone said 14.1).
    assert "plus 3 nested ops" in proxy.cast_from
    assert abs(proxy.cast_ns - costs.cast_ns) < 0.15 * costs.cast_ns
    # And with the profiler's cost out of both (12.0 vs 13.6 µs; the stand-ins alone: 8.7).
    from perfcast.analysis.real_step import real_world

    real = amp._host_costs(real_world(graph).graph)
    real_proxy = amp._host_costs(real_world(build_graph(load(R50))).graph)
    assert abs(real_proxy.cast_ns - real.cast_ns) < 0.15 * real.cast_ns


def test_refused_on_a_trace_already_under_autocast() -> None:
    """cuDNN's kernel names do not say bf16, but the convolutions' input types do (and,
    without record_shapes' types, the casts inside every conv)."""
    import pytest

    from perfcast.errors import NotApplicableError

    graph = build_graph(load(R50.with_name("r50_amp_bf16.json.gz")))
    with pytest.raises(NotApplicableError, match=r"already runs .* in 16 bits \(.*bf16"):
        get_model("amp").apply(graph, build_options("amp", {}))


def test_refused_under_autocast_without_input_types() -> None:
    """A trace without the ops' "Input type" still shows autocast: the casts inside every
    forward conv, whose cuDNN kernel names look fp32."""
    import numpy as np
    import pytest

    from perfcast.errors import NotApplicableError

    table = load(R50.with_name("r50_amp_bf16.json.gz"))
    table.in_types = np.full_like(table.in_types, -1)
    graph = build_graph(table)
    with pytest.raises(NotApplicableError, match="already runs under autocast: 51 of the 51"):
        get_model("amp").apply(graph, build_options("amp", {}))


def test_amp_casts_gradients_back_on_2021_traces(shared_traces) -> None:
    """PyTorch 1.9 names an autograd node by itself ("CudnnConvolutionBackward"), where amp
    looked only for "evaluate_function: ...": 0 gradient casts were added, in silence."""
    import perfcast

    table = perfcast.load(shared_traces / "resnet50_v100_nw0_2021.json.gz")
    r = perfcast.predict(table, "amp:dtype=fp16")
    said = " ".join(a for row in r.applied for a in row.assumptions)
    assert "54 weight casts in forward and 54 gradient casts back to fp32" in said
