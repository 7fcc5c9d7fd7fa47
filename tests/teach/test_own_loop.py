"""The "your own loop" exercise (notebook 02): the checker runs the learner's plain-PyTorch bf16 loop on the start
of the lab's bf16 run and passes the recipe's loop, and fails each loop that differs from it in one way that a
learner writes: no autocast, backward inside autocast, fp16 instead of bf16, zero_grad forgotten."""

from __future__ import annotations

import pytest
import torch

from lab.teach import checks as C
from lab.teach import solutions as S


def _loop(dtype=torch.bfloat16, backward_inside=False, zero_grad=True):
    def train(model, optimizer, loader, loss_fn):
        losses = []
        for x, y in loader:
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                loss = loss_fn(model(x), y)
                if backward_inside:
                    loss.backward()
            if not backward_inside:
                loss.backward()
            optimizer.step()
            if zero_grad:
                optimizer.zero_grad()
            losses.append(loss.item())
        return losses
    return train


def test_the_recipe_loop_passes_with_the_lab_runs_losses_and_dtypes():
    losses = C.amp_loop(S.train_bf16, steps=6)
    arm = C.ArmStart("bf16", 6)
    assert losses == pytest.approx(arm.lab_losses(), rel=1e-6) and len(losses) == 6
    assert set(arm.lab_dtypes().values()) == {"bfloat16"}  # the lab's run really ran bf16: the reference is real


@pytest.mark.parametrize(("wrong", "hint"), [
    (_loop(dtype=None), "torch.autocast"),                 # plain fp32: every Linear in float32
    (_loop(dtype=torch.float16), "torch.autocast"),        # the other low precision
    (_loop(backward_inside=True), "inside torch.autocast"),  # the interview answer's placement
    (_loop(zero_grad=False), "zero_grad"),                 # gradients pile up: the losses drift from step 1
])
def test_a_wrong_loop_fails_with_its_hint(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        C.amp_loop(wrong, steps=6)
