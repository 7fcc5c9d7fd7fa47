"""Gradient accumulation as a memory lever (``memory.micro_batches``, options ``accum2`` / ``accum4``): each batch
runs as k micro-batches inside :func:`lab.loop.train_step`. Against the un-accumulated step on a model without
batch-dependent layers: the same gradients (within float rounding) and the same loss; and the effect: the
activations saved for backward (counted by role) fall with the micro-batch."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lab import RunConfig, run
from lab.loop import split_rows, train_step
from lab.memory.roles import CountingStep
from lab.registry import OPTIONS

CPU = torch.device("cpu")


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 48), nn.Tanh(), nn.Linear(48, 48), nn.GELU(), nn.Linear(48, 5))


class _Grads(torch.optim.Optimizer):
    """An optimizer whose step copies the gradients it sees (what the step hands the optimizer)."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        super().__init__(params, {})
        self.seen: list[torch.Tensor] = []

    def step(self, closure=None) -> None:  # noqa: ANN001 - torch's signature
        self.seen = [p.grad.detach().clone() for g in self.param_groups for p in g["params"]]


def _step_grads(model: nn.Module, batch: tuple[torch.Tensor, ...], k: int) -> tuple[list[torch.Tensor], float]:
    opt = _Grads(list(model.parameters()))
    loss = train_step(model, opt, nn.functional.cross_entropy, iter([batch]), CPU, micro_batches=k)
    return opt.seen, float(loss.detach())


@settings(max_examples=12, deadline=None)
@given(rows=st.integers(min_value=4, max_value=37), k=st.sampled_from([2, 3, 4]))
def test_micro_batches_give_the_whole_batchs_gradients_and_loss(rows, k):
    torch.manual_seed(rows)
    batch = (torch.randn(rows, 12, dtype=torch.float64), torch.randint(0, 5, (rows,)))
    plain = _mlp().double()
    accum = copy.deepcopy(plain)
    want, want_loss = _step_grads(plain, batch, 1)
    got, got_loss = _step_grads(accum, batch, k)  # uneven micro-batches when k does not divide rows
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    assert got_loss == pytest.approx(want_loss, rel=1e-10)


def test_a_wrong_weighting_would_be_caught():
    """The reference the test above holds the step to can fail: the plain mean of micro-batch losses (no row
    weighting) differs from the whole batch's gradient when the micro-batches are uneven."""
    torch.manual_seed(1)
    batch = (torch.randn(7, 12, dtype=torch.float64), torch.randint(0, 5, (7,)))
    plain = _mlp().double()
    want, _ = _step_grads(copy.deepcopy(plain), batch, 1)
    plain.zero_grad()
    for part in split_rows(batch, 2):  # 4 + 3 rows, each loss weighted 1/2
        (nn.functional.cross_entropy(plain(part[0]), part[1]) / 2).backward()
    wrong = [p.grad for p in plain.parameters()]
    assert not all(torch.allclose(w, g) for w, g in zip(wrong, want, strict=True))


def test_split_rows_keeps_every_row_once_as_views_and_never_an_empty_micro_batch():
    x, y = torch.arange(10).view(5, 2), torch.arange(5)
    parts = split_rows((x, y), 4)
    assert [len(p[1]) for p in parts] == [2, 1, 1, 1]
    assert torch.equal(torch.cat([p[0] for p in parts]), x) and parts[0][0].data_ptr() == x.data_ptr()
    assert len(split_rows((x[:2], y[:2]), 4)) == 2


def test_saved_activations_fall_with_the_micro_batch():
    saved = {}
    batch = (torch.randn(64, 12), torch.randint(0, 5, (64,)))
    for k in (1, 2, 4):
        model = _mlp()
        counting = CountingStep(None, model)
        train_step(model, torch.optim.Adam(model.parameters()), nn.functional.cross_entropy,
                   itertools.repeat(batch), CPU, policy=counting, micro_batches=k)
        saved[k] = counting.record["saved_activations_bytes"]
        assert counting.record["grads_bytes"] == counting.record["params_bytes"]  # the whole model's, once
    assert saved[1] / saved[2] == pytest.approx(2, rel=0.02) and saved[1] / saved[4] == pytest.approx(4, rel=0.02)


def test_the_options_keep_the_batch_and_a_run_records_the_micro_batch_activations():
    assert OPTIONS["accum2"].overrides == {"memory.micro_batches": 2}
    assert OPTIONS["accum4"].overrides == {"memory.micro_batches": 4}
    base = RunConfig(workload="mlp", size="tiny", max_steps=2, warmup_steps=0, latency_repeats=0, seed=3)
    plain, acc = run(base), run(base.with_overrides(**OPTIONS["accum4"].overrides))
    assert acc.batch_size == plain.batch_size and acc.steps == plain.steps  # the same batch, the same steps
    assert acc.details["steps"]["train"]["micro_batches"] == 4
    assert acc.details["memory"]["micro_batches"] == 4
    ratio = plain.details["memory"]["saved_activations_bytes"] / acc.details["memory"]["saved_activations_bytes"]
    assert ratio == pytest.approx(4, rel=0.1)
    assert acc.losses[0] == pytest.approx(plain.losses[0], rel=1e-5)  # the same first step (the same init)


def test_more_micro_batches_than_rows_is_refused_before_training():
    cfg = RunConfig(workload="mlp", size="tiny", batch_size=2, max_steps=1, warmup_steps=0, latency_repeats=0)
    with pytest.raises(ValueError, match=r"memory.micro_batches=4 is invalid with batch_size=2"):
        run(cfg.with_overrides(**{"memory.micro_batches": 4}))
