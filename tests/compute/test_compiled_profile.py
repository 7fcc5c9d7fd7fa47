"""``--profile`` of a compiled run profiles the compiled step (lab.compute.PROFILE_KERNEL_OPTIONS).

Before, it profiled an eager copy and scaled that breakdown to the compiled step's time: on ctr small the eager
breakdown said matmul 56 % while Inductor's generated index_add scatter took 5.9 of the 14 ms. These tests check
that the profile phase compiles, that the kernels Inductor generates under these options are named in the
profiler's events, and that the breakdown puts a generated gradient scatter in the embedding class.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from lab.compute import PROFILE_KERNEL_OPTIONS, TECHNIQUE
from lab.config import RunConfig
from lab.measure.profile import breakdown, events_from_profiler
from lab.technique import PROFILE_PHASE, FitPlan


class Lookup(nn.Module):
    """A gather whose gradient is a scatter (``index_select`` -> ``index_add``), then a little elementwise work."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(64, 8))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.weight.index_select(0, idx)).sum()


def _plan(phase: str, compile_on: bool, model: nn.Module) -> FitPlan:
    cfg = RunConfig(workload="ctr").with_overrides(**{"compute.compile": compile_on})
    ctx = types.SimpleNamespace(cfg=cfg, result=types.SimpleNamespace(why=[], details={}),
                                device=torch.device("cpu"))
    plan = FitPlan(phase=phase, lr=1e-3, probe=True, loader=None)
    TECHNIQUE.fit_options(ctx, model, plan)
    return plan


def test_the_profile_phase_of_a_compiled_run_is_compiled_and_an_eager_run_stays_eager():
    model = Lookup()
    plan = _plan(PROFILE_PHASE, True, model)
    assert plan.forward is not None and plan.forward is not model and not plan.finished  # no compile record
    assert _plan(PROFILE_PHASE, False, model).forward is None
    assert _plan("finetune", True, model).forward is None  # fine-tunes still run eagerly


def test_profiled_compiled_kernels_are_named_and_their_scatter_is_embedding_work():
    torch._dynamo.reset()
    model = Lookup()
    compiled = torch.compile(model, options=dict(PROFILE_KERNEL_OPTIONS))
    idx = torch.randint(0, 64, (4096,))
    for _ in range(2):  # compile, then a warm call
        compiled(idx).backward()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            compiled(idx).backward()
    events = events_from_profiler(prof.events())
    kernels = [e.name for e in events if "cpp_fused" in e.name]
    assert any("index_add" in k for k in kernels), kernels  # the gradient's scatter is a named kernel
    b = breakdown(events, n_steps=3, step_ms=1.0)
    top = {op: cls for op, cls, _ in b.top_ops}
    scatter = [op for op in top if "cpp_fused" in op and "index_add" in op]
    assert scatter and all(top[op] == "embedding" for op in scatter)
    assert b.ms["embedding"] > 0
    torch._dynamo.reset()


def test_the_scatter_why_names_generated_gradient_scatters_only_above_its_share():
    from lab.compute import SCATTER_WHY_SHARE, compiled_scatter_why

    scatter = "graph_0_cpp_fused__unsafe_view_add_clone_index_add_new_zeros_slice_2"
    top = [(scatter, "embedding", 3.0), ("bmm", "matmul", 2.0), ("graph_0_cpp_fused_relu_1", "elementwise", 1.0)]
    why = compiled_scatter_why(top, 10.0)
    assert why is not None and "3.00 ms" in why and "30%" in why
    assert compiled_scatter_why(top, 3.0 / SCATTER_WHY_SHARE + 1.0) is None  # just below the share
    # eager's own index_add (ATen, not generated) and other generated kernels are not what it names
    assert compiled_scatter_why([("index_add_", "embedding", 9.0), ("graph_0_cpp_fused_relu_1", "elementwise", 9.0)],
                                10.0) is None
    assert compiled_scatter_why(top, None) is None
