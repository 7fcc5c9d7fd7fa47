"""Memory by role, counted in the run's own step: parameters, gradients, optimizer state and the activations the
step saves for backward, at the tensor level (:mod:`lab.measure.memory`).

Why inside the run's step and not a probe on a copy: a copy would hold a second model (and, read from the
process's lifetime peak, inflate what ``--memory-budget`` measures), and a probe is another step than the run's.
:class:`CountingStep` is a step policy (:class:`lab.loop.StepPolicy`) that wraps the fit's own (precision's, or
the plain step) and, in the first step only, counts the bytes saved for backward while forward + loss run (the
policy's ``autocast``, the one region around them), the gradients just before the optimizer step and the
optimizer's state just after it; every other step goes straight to the wrapped policy. With gradient
accumulation the count is one micro-batch's (what is alive at once). A compiled forward's saved tensors are not
counted: the hooks would change what Dynamo compiles in that step (``saved_activations_bytes`` is ``None``, and
``activations_note`` says why).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from lab.loop import PLAIN, StepPolicy
from lab.measure.memory import SavedTensorBytes, grad_bytes, optimizer_state_bytes, param_bytes


class CountingStep:
    """The wrapped policy, counting memory by role in the first step (:attr:`record`, ``None`` until then).
    Anything else asked of it (``dtype``, ``scaler``) is the wrapped policy's."""

    def __init__(self, inner: StepPolicy | None, model: nn.Module, *, activations: bool = True) -> None:
        self.inner = PLAIN if inner is None else inner
        self.model = model
        self.activations = activations
        self.record: dict[str, Any] | None = None
        self._saved: SavedTensorBytes | None = None
        self._forwards = 0

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy in progress): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.inner, name)

    def applied(self, model: nn.Module) -> contextlib.AbstractContextManager:
        return self.inner.applied(model)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        with self.inner.autocast():
            self._forwards += 1
            if self.record is not None or self._forwards > 1 or not self.activations:
                yield
                return
            sharded = any(type(p).__name__ == "DTensor" for p in self.model.parameters())
            self._saved = SavedTensorBytes(exclude=list(self.model.parameters()), live=self.model if sharded else None)
            with self._saved:
                yield

    def backward(self, loss: torch.Tensor) -> None:
        self.inner.backward(loss)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.record is not None:
            self.inner.step(optimizer)
            return
        grads = grad_bytes(self.model)
        self.inner.step(optimizer)
        saved = self._saved.bytes if self._saved is not None else None
        self.record = {
            "params_bytes": param_bytes(self.model), "grads_bytes": grads,
            "optimizer_state_bytes": optimizer_state_bytes(optimizer), "saved_activations_bytes": saved,
            "optimizer": type(optimizer).__name__,
        }
        if saved is None:
            self.record["activations_note"] = "not counted: compiled forward (the hooks would change its graph)"
        self._saved = None


__all__ = ["CountingStep"]
