"""Low-bit Adam state (memory.optimizer_state="int8"), verified by its effect: the optimizer's state tensors are
torchao's 8-bit subclass with uint8 codes, >= 3.5x fewer bytes than Adam's fp32 state on the same model, and the
loss still falls; its first-step compile is a one-off cost in the run record. torchao compiles the update on the
first step, one graph per parameter shape (``dynamic=False``), so this module trains one run of a model with
two shapes (mlp's data, bias-free 256 -> 256 -> 256 -> 10: about half mlp m's five graphs' compile time) and
checks everything on it; the refusals need no run."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from lab import RunConfig, run
from lab.context import prepare
from lab.measure.memory import optimizer_state_bytes
from lab.train import check
from lab.workloads import get_workload
from lab.workloads.base import _REGISTRY, register_workload

#: mlp at rung m: 256 -> 512 -> 512 -> 10, weights well above torchao's 4,096-element floor for quantized state.
BASE = RunConfig(workload="mlp", size="tiny", model_scale="m", max_steps=10, warmup_steps=2, threads=2,
                 latency_repeats=0)
#: The trained run's workload: mlp's rows through a bias-free 256 -> 256 -> 256 -> 10 whose two hidden weights
#: (65,536 elements each, well above torchao's 4,096-element floor) share one shape and get 8-bit state; the
#: head (2,560) keeps fp32 state. Two parameter shapes, so two compiled updates (mlp m has five).
UNIFORM = "mlp_low_bit_uniform"


def _uniform_model(spec) -> nn.Module:
    return nn.Sequential(nn.Linear(256, 256, bias=False), nn.ReLU(), nn.Linear(256, 256, bias=False), nn.ReLU(),
                         nn.Linear(256, 10, bias=False))


@pytest.fixture(scope="module")
def int8_run():
    """One run with 8-bit Adam state; the fit's optimizer is kept by wrapping the factory the family set. The
    workload is registered for this module only (other tests list the registry)."""
    from lab.technique import FitPlan, Technique, TechniqueChain, default_chain

    kept: list[torch.optim.Optimizer] = []

    class KeepOptimizer(Technique):
        """Keeps the optimizer every fit builds through the factory the family set, without changing it."""

        name = "keep_optimizer"

        def fit_options(self, ctx, model, plan: FitPlan) -> None:
            make = plan.optimizer
            assert make is not None, "the memory family set no optimizer factory"

            def keep(params, lr):
                kept.append(make(params, lr))
                return kept[-1]

            plan.optimizer = keep

    chain = TechniqueChain([*default_chain(), KeepOptimizer()])
    register_workload(dataclasses.replace(get_workload("mlp"), name=UNIFORM, make_model=_uniform_model, scales={}))
    cfg = BASE.with_overrides(workload=UNIFORM, model_scale=None)
    try:
        result = run(cfg.with_overrides(**{"memory.optimizer_state": "int8"}), techniques=chain)
        yield result, kept, cfg
    finally:
        _REGISTRY.unregister(UNIFORM)


def test_8bit_state_is_the_low_bit_subclass_and_at_least_3_5x_smaller(int8_run):
    from torchao.optim.subclass_8bit import OptimState8bit

    result, optimizers, cfg = int8_run
    assert result.status == "ok" and len(optimizers) == 1 and type(optimizers[0]).__name__ == "AdamW8bit"
    opt = optimizers[0]
    assert all(g["weight_decay"] == 0.0 for g in opt.param_groups)  # Adam's update, as the fp32 arm's
    big = [s for p, s in opt.state.items() if p.numel() >= 4096]
    assert big and all(isinstance(s[k], OptimState8bit) and s[k].codes.dtype == torch.uint8
                       for s in big for k in ("exp_avg", "exp_avg_sq"))
    # Adam's fp32 state on the same model, counted the same way
    with prepare(cfg) as ctx:
        model = ctx.new_model()
        adam = torch.optim.Adam(model.parameters(), lr=1e-3)
        sum(p.sum() for p in model.parameters()).backward()
        adam.step()
    fp32 = optimizer_state_bytes(adam)
    low = result.details["memory"]["optimizer_state_bytes"]
    assert low == optimizer_state_bytes(opt)  # the record counts this optimizer's state
    assert fp32 >= 3.5 * low, (fp32, low)
    assert result.details["memory"]["params_bytes"] * 2 <= fp32 <= result.details["memory"]["params_bytes"] * 2.01


def test_8bit_state_still_trains_and_its_compile_is_a_one_off_cost(int8_run):
    result, _, _ = int8_run
    assert result.losses[-1] < result.losses[0] - 0.01  # the loss falls (10 classes: ~2.30 at the start)
    mem = result.details["memory"]
    assert mem["optimizer"] == "AdamW8bit" and mem["optimizer_state"] == "int8"
    assert mem["optimizer_compile_s"] > 0 and result.details["one_off_s"]["optimizer_compile"] == \
        mem["optimizer_compile_s"]
    assert result.details["steps"]["train"]["optimizer"] == "AdamW8bit"


@pytest.mark.parametrize(("overrides", "needle"), [
    ({"optimizer": "sgd"}, "use --optimizer adam"),
    ({"compute.fused_optimizer": True}, "choose one"),
    ({"checkpoint_every": 5}, "weights-only"),
])
def test_low_bit_state_is_refused_where_it_cannot_run(overrides, needle):
    cfg = BASE.with_overrides(**{"memory.optimizer_state": "int4", **overrides})
    with pytest.raises(ValueError, match=needle) as err:
        check(cfg)
    assert str(err.value).startswith("memory.optimizer_state='int4' is invalid") and "\n" not in str(err.value)


def test_a_compiled_runs_first_step_counts_the_optimizers_compile_once():
    from lab.result.timeline import end_to_end_s, one_off_costs

    details = {"compute": {"compile_s": 20.0}, "memory": {"optimizer_compile_s": 15.0}}
    assert one_off_costs(details) == {"compile": 5.0, "optimizer_compile": 15.0, "total": 20.0}
    assert end_to_end_s(100.0, details) == 100.0  # both are inside the loop's time already
