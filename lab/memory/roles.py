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

Asked for (:func:`counting_step_peak`, what ``--memory-budget``'s tries do on CPU), it also measures the second
step's real peak (:class:`lab.measure.memory.StepPeak`: parameters + optimizer state at rest + the step's
allocation high water, from its first forward to its optimizer step) into ``step_peak_bytes``: what must fit,
where the roles are what the step keeps. Only when asked: the profiler's memory events slow that step several
times over. The second step because the first creates the optimizer state (and compiles a low-bit update).
An ablation asks for it where it is free of every figure it reports (:func:`step_peak_where_free`: the second step
is one of the run's warm-up steps, which no step-time statistic reads), so its memory line reads what must fit.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from lab.loop import PLAIN, StepPolicy
from lab.measure.memory import SavedTensorBytes, StepPeak, grad_bytes, optimizer_state_bytes, param_bytes

#: Set while :func:`counting_step_peak` is active. An environment variable and not a module flag: a run with
#: data-parallel ranks (an FSDP2 try) trains in spawned processes, which inherit the environment.
STEP_PEAK_ENV = "LAB_COUNT_STEP_PEAK"


@contextlib.contextmanager
def counting_step_peak() -> Iterator[None]:
    """Within ``with``: every run's :class:`CountingStep` also measures its second step's real peak
    (``details["memory"]["step_peak_bytes"]``, module docstring)."""
    before = os.environ.get(STEP_PEAK_ENV)
    os.environ[STEP_PEAK_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(STEP_PEAK_ENV, None)
        else:
            os.environ[STEP_PEAK_ENV] = before


def step_peak_is_free(cfg: Any) -> bool:
    """Whether measuring ``cfg``'s second step (the profiler slows it several times over) leaves every step-time
    figure alone: it is a warm-up step (``warmup_steps >= 2``), which no statistic reads."""
    return int(getattr(cfg, "warmup_steps", 0) or 0) >= 2


def step_peak_where_free(cfg: Any, wanted: bool = True) -> contextlib.AbstractContextManager:
    """:func:`counting_step_peak` for a run of ``cfg`` when ``wanted`` and :func:`step_peak_is_free`, else nothing
    (the run records the roles alone, and a reader falls back to them, saying so)."""
    return counting_step_peak() if wanted and step_peak_is_free(cfg) else contextlib.nullcontext()


class CountingStep:
    """The wrapped policy, counting memory by role in the first step (:attr:`record`, ``None`` until then).
    Anything else asked of it (``dtype``, ``scaler``) is the wrapped policy's."""

    def __init__(self, inner: StepPolicy | None, model: nn.Module, *, activations: bool = True,
                 step_peak: bool | None = None) -> None:
        self.inner = PLAIN if inner is None else inner
        self.step_peak = os.environ.get(STEP_PEAK_ENV) == "1" if step_peak is None else step_peak
        self._optimizer: torch.optim.Optimizer | None = None
        self._peak: StepPeak | None = None
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
            if self.record is not None and self.step_peak and self._optimizer is not None and self._peak is None:
                device = next(self.model.parameters()).device  # the second step's first forward: its peak starts
                self._peak = StepPeak(self.model, self._optimizer, device).__enter__()
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
            peak = self._peak
            try:
                self.inner.step(optimizer)
            finally:
                if peak is not None and self._optimizer is not None:  # the measured step's end
                    peak.__exit__(None, None, None)
                    self.record["step_peak_bytes"] = peak.bytes
                    self.record["step_peak_at_rest_bytes"] = peak.at_rest  # the rest is the step's high water
                    self.record["step_peak_note"] = ("step 2: parameters + optimizer state at rest + the step's "
                                                     "allocation high water (lab.measure.memory.StepPeak)")
                    self._optimizer = None  # measured once
            return
        grads = grad_bytes(self.model)
        self.inner.step(optimizer)
        saved = self._saved.bytes if self._saved is not None else None
        self.record = {
            "params_bytes": param_bytes(self.model), "grads_bytes": grads,
            "optimizer_state_bytes": optimizer_state_bytes(optimizer), "saved_activations_bytes": saved,
            "optimizer": type(optimizer).__name__,
        }
        self._optimizer = optimizer if self.step_peak else None
        if saved is None:
            self.record["activations_note"] = "not counted: compiled forward (the hooks would change its graph)"
        self._saved = None


__all__ = ["STEP_PEAK_ENV", "CountingStep", "counting_step_peak", "step_peak_is_free", "step_peak_where_free"]
