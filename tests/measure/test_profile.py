"""The op-class breakdown (lab.measure.profile): known ops land in their class, nested ops are counted once,
the classes sum to the step time, and ``--profile`` on a run stores a Chrome trace and the breakdown
without touching the run's timed steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lab.config import RunConfig
from lab.measure.profile import (
    DATA_WAIT_RANGE,
    OP_CLASSES,
    Breakdown,
    OpEvent,
    breakdown,
    classify_op,
    normalise_op,
)
from lab.train import run
from lab.workloads import SizeSpec, Workload, register_workload


@pytest.mark.parametrize(("name", "cls"), [
    ("aten::addmm", "matmul"), ("aten::mm", "matmul"), ("aten::bmm", "matmul"), ("aten::linear", "matmul"),
    ("aten::convolution", "matmul"), ("aten::mkldnn_convolution", "matmul"),
    ("autograd::engine::evaluate_function: AddmmBackward0", "matmul"), ("ConvolutionBackward0", "matmul"),
    ("aten::embedding_bag", "embedding"), ("aten::_embedding_bag_dense_backward", "embedding"),
    ("aten::index_select", "embedding"), ("EmbeddingBagBackward0", "embedding"), ("aten::embedding", "embedding"),
    ("aten::lstm", "recurrent"), ("aten::gru", "recurrent"), ("aten::mkldnn_rnn_layer", "recurrent"),
    ("aten::native_layer_norm", "norm"), ("aten::native_batch_norm", "norm"), ("NativeBatchNormBackward0", "norm"),
    ("aten::relu", "elementwise"), ("aten::add", "elementwise"), ("aten::gelu", "elementwise"),
    ("aten::copy_", "elementwise"), ("aten::threshold_backward", "elementwise"),
    ("aten::sum", "reduction"), ("aten::mean", "reduction"), ("aten::nll_loss_forward", "reduction"),
    ("aten::_log_softmax", "reduction"),
    ("aten::_foreach_add_", "optimizer"), ("aten::_fused_adam_", "optimizer"),
    ("Optimizer.step#Adam.step", "optimizer"),
    ("aten::view", "overhead"), ("aten::t", "overhead"), ("aten::empty", "overhead"),
    ("c10d::allreduce_", "comm"),
    # torch.compile: its wrappers are overhead, Inductor's kernels go by the ops they fused
    ("Torch-Compiled Region: 0/0", "overhead"), ("TorchDynamo Cache Lookup", "overhead"),
    ("CompiledFunction", "overhead"), ("autograd::engine::evaluate_function: CompiledFunctionBackward", "overhead"),
    ("## Call CompiledFxGraph f4bbqyqc76sttquznhduepapuuyj", "overhead"),
    ("graph_0_cpp_fused__unsafe_view_add_clone_index_add_new_zeros_slice_2", "embedding"),
    ("graph_0_cpp_fused_relu_threshold_backward_1", "elementwise"),
])
def test_known_ops_are_classified(name, cls):
    assert classify_op(name) == cls


def test_backward_nodes_carry_the_forward_name():
    assert normalise_op("autograd::engine::evaluate_function: AddmmBackward0") == "addmm"
    assert normalise_op("aten::addmm") == "addmm"


def test_nested_ops_count_once_and_ranges_own_their_ops():
    ev = [
        OpEvent("aten::linear", 10.0, 110.0, (), True),  # self 10 us, its addmm child 100 us
        OpEvent("aten::addmm", 100.0, 100.0, ("aten::linear",)),
        OpEvent("aten::index", 40.0, 40.0, (DATA_WAIT_RANGE,), True),  # an op inside next(loader)
        OpEvent(DATA_WAIT_RANGE, 60.0, 100.0, ()),
        OpEvent("aten::mul_", 30.0, 30.0, ("Optimizer.step#Adam.step",), True),
        OpEvent("aten::sort", 50.0, 50.0, ("EmbeddingBagBackward0",), True),  # inside an embedding backward
    ]
    b = breakdown(ev, n_steps=1, step_ms=1.0)
    assert b.ms["matmul"] == pytest.approx(0.110)
    assert b.ms["data_wait"] == pytest.approx(0.100)
    assert b.ms["optimizer"] == pytest.approx(0.030)
    assert b.ms["embedding"] == pytest.approx(0.050)
    assert b.ms["reduction"] == 0.0
    assert sum(b.ms.values()) == pytest.approx(1.0)
    assert b.ms["overhead"] == pytest.approx(1.0 - 0.29)


def test_loop_data_wait_replaces_the_profilers_and_tiny_ops_are_counted():
    ev = [OpEvent("aten::add", 3.0, 3.0, (), True) for _ in range(10)] + [OpEvent("aten::mm", 500.0, 500.0, (), True)]
    b = breakdown(ev, n_steps=2, step_ms=1.0, data_wait_ms=0.4)
    assert b.ms["data_wait"] == pytest.approx(0.4)
    assert b.tiny_ms["elementwise"] == pytest.approx(0.015)
    assert b.ops_per_step == pytest.approx(5.5)
    assert sum(b.ms.values()) == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(selfs=st.lists(st.floats(0.0, 5000.0), min_size=1, max_size=30),
       names=st.lists(st.sampled_from(["aten::mm", "aten::add", "aten::sum", "aten::lstm", DATA_WAIT_RANGE,
                                       "aten::view", "aten::embedding_bag"]), min_size=30, max_size=30),
       step_ms=st.floats(0.01, 100.0), wait=st.one_of(st.none(), st.floats(0.0, 5.0)),
       profiled=st.one_of(st.none(), st.floats(0.01, 200.0)), n=st.integers(1, 5))
def test_classes_sum_to_the_step(selfs, names, step_ms, wait, profiled, n):
    ev = [OpEvent(nm, s, s, (), True) for s, nm in zip(selfs, names, strict=False)]
    wait = None if wait is None else min(wait, step_ms)
    b = breakdown(ev, n_steps=n, step_ms=step_ms, data_wait_ms=wait, profiled_step_ms=profiled)
    assert set(b.ms) == set(OP_CLASSES)
    assert all(v >= 0 for v in b.ms.values())
    if wait is not None or b.ms["data_wait"] <= step_ms:
        assert sum(b.ms.values()) == pytest.approx(step_ms, rel=1e-6, abs=1e-9)
    assert Breakdown.from_dict(json.loads(json.dumps(b.to_dict()))).ms == pytest.approx(b.ms)


def _wide(spec: SizeSpec) -> nn.Module:
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 2))


def _wide_data(spec: SizeSpec, seed: int):
    from lab.workloads import Datasets

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(spec.n_train + spec.n_test, 256, generator=g)
    y = (x[:, 0] > 0).long()
    return Datasets(train=(x[:spec.n_train], y[:spec.n_train]), test=(x[spec.n_train:], y[spec.n_train:]))


WIDE = Workload(name="wide_linear", description="one wide Linear: the step is matmul",
                sizes=SizeSpec(n_train=1024, n_test=128, batch_size=256, epochs=3, lr=1e-3),
                make_data=_wide_data, make_model=_wide, loss=nn.functional.cross_entropy,
                evaluate=lambda out, y: {"accuracy": (out.argmax(1) == y).float().mean().item()},
                metric_name="accuracy")


def test_profile_on_a_run_stores_trace_and_breakdown_and_leaves_timing_alone(private_store):
    register_workload(WIDE, overwrite=True)
    cfg = RunConfig(workload="wide_linear", size="tiny", threads=1, latency_repeats=3)
    r = run(cfg.with_overrides(profile=True))
    plain = run(cfg)
    assert r.status == "ok" and r.steps == plain.steps  # the profiled steps are extra, not timed ones
    assert len(r.step_times_ms["total"]) == len(plain.step_times_ms["total"])
    prof = r.details["profile"]
    train = Breakdown.from_dict(prof["train"])
    assert sum(train.ms.values()) == pytest.approx(train.step_ms, rel=1e-6)
    assert train.step_ms == pytest.approx(r.median_step_ms)
    ops = {c: v for c, v in train.ms.items() if c != "overhead"}
    assert max(ops, key=ops.get) == "matmul"  # the planted wide Linear dominates the ops
    assert train.ms["optimizer"] > 0
    trace = Path(prof["trace"])
    assert trace.parent.parent == private_store.parent  # beside the results store
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "aten::addmm" for e in events)
    inf = Breakdown.from_dict(prof["inference"])
    assert inf.ms["matmul"] > 0 and inf.ms["optimizer"] == 0
