"""A fault-injecting model (issue 45, item 1): a tiny classifier that raises at one chosen stage of a run, so a
test can drive it through every technique family and check that the run ends in one line and a record, never
a traceback. Brought in by spec (``tests/faulty_models.py:NAME``) like any user's file; ``NAME`` is the upper-case
fault. The faults, and the technique that meets each:

- ``forward``: the training forward raises (any run, at the fit);
- ``backward``: the backward of a custom ``autograd.Function`` raises (the fit; a DDP rank);
- ``autocast``: the forward raises under autocast (mixed precision);
- ``compile``: the forward raises while traced by Dynamo (``torch.compile``; PT2E's ``torch.export``);
- ``recompute``: a block raises when it runs twice for one forward (activation checkpointing's recompute);
- ``prune``: the forward checks that ``head.weight`` is still a ``Parameter`` (pruning's masks make it a tensor);
- ``int8``: the forward reads ``head.weight.dtype`` (an int8 ``Linear``'s ``weight`` is a method);
- ``deepcopy``: ``copy.deepcopy`` of the model raises (quantization copies the float model);
- ``state_dict``: ``state_dict()`` raises (the lab measures the stored size through it);
- ``evaluate``: the eval-mode forward raises once the model has trained (the final evaluation);
- ``none``: no fault. Its block (Linear -> ReLU -> residual add) is one torchao's x86 Inductor pass asserted on
  under dynamic PT2E int8 at batch > 1 (``qlinear_post_op_fusion``, torchao of this project's lock).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lab.workloads import Datasets, SizeSpec, Workload

FAULTS = ("none", "forward", "backward", "autocast", "compile", "recompute", "prune", "int8", "deepcopy", "state_dict",
          "evaluate")


class InjectedFault(RuntimeError):
    """What every fault raises (the int8 one excepted: that one is torch's own ``AttributeError``)."""


class _FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001 - autograd.Function protocol
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        raise InjectedFault("fault injected in backward")


class Block(nn.Module):
    def __init__(self, fault: str) -> None:
        super().__init__()
        self.fault, self.calls = fault, 0
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.fault == "recompute" and self.calls > 1:
            raise InjectedFault("fault injected in a recomputed block")
        return x + F.relu(self.fc(x))


class Faulty(nn.Module):
    def __init__(self, fault: str) -> None:
        super().__init__()
        self.fault, self.trained = fault, False
        self.stem = nn.Linear(8, 16)
        self.blocks = nn.ModuleList([Block(fault)])
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fault = self.fault
        if fault == "forward" and self.training:
            raise InjectedFault("fault injected in the training forward")
        if fault == "autocast" and torch.is_autocast_enabled(x.device.type):
            raise InjectedFault("fault injected under autocast")
        if fault == "compile" and torch.compiler.is_compiling():
            raise InjectedFault("fault injected while traced")
        if fault == "prune" and not isinstance(self.head.weight, nn.Parameter):
            raise InjectedFault("head.weight is no longer a Parameter")
        if fault == "int8":
            x = x.to(self.head.weight.dtype)
        if fault == "evaluate" and not self.training and self.trained:
            raise InjectedFault("fault injected in the final evaluation")
        self.trained = self.trained or self.training
        h = F.relu(self.stem(x))
        for block in self.blocks:
            block.calls = 0
            h = block(h)
        if fault == "backward" and self.training:
            h = _FailingBackward.apply(h)
        return self.head(h)

    def __deepcopy__(self, memo: dict) -> Faulty:
        if self.fault == "deepcopy":
            raise InjectedFault("fault injected in deepcopy")
        copy_ = Faulty.__new__(Faulty)
        memo[id(self)] = copy_
        import copy

        copy_.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return copy_

    def state_dict(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - nn.Module's signature
        if self.fault == "state_dict":
            raise InjectedFault("fault injected in state_dict")
        return super().state_dict(*args, **kwargs)


def _data(spec: SizeSpec, seed: int) -> Datasets:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(spec.n_train + spec.n_test, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    n = spec.n_train
    return Datasets(train=(x[:n], y[:n]), test=(x[n:], y[n:]), info={"source": "a linear rule"})


def workload(fault: str) -> Workload:
    spec = SizeSpec(n_train=64, n_test=32, batch_size=32, epochs=1, lr=1e-2)
    return Workload(name=f"faulty_{fault}", description=f"raises at: {fault}", sizes=spec, make_data=_data,
                    make_model=lambda spec: Faulty(fault), loss=F.cross_entropy, metric_name="accuracy",
                    chance=0.5, evaluate=lambda out, y: {"accuracy": (out.argmax(1) == y).float().mean().item()},
                    blocks=lambda model: list(model.blocks))


def __getattr__(name: str) -> Workload:  # tests/faulty_models.py:FORWARD, :BACKWARD, ...
    if name.lower() in FAULTS:
        return workload(name.lower())
    raise AttributeError(name)


def BAD_DATA() -> Workload:  # noqa: N802 - a spec NAME, as the others
    """``make_data`` itself raises: refused before any work, naming its line."""
    def make_data(spec: SizeSpec, seed: int) -> Datasets:
        raise InjectedFault("fault injected in make_data")

    return Workload(name="faulty_bad_data", description="make_data raises", sizes=SizeSpec(
        n_train=64, n_test=32, batch_size=32, epochs=1, lr=1e-2), make_data=make_data,
        make_model=lambda spec: Faulty("none"), loss=F.cross_entropy, metric_name="accuracy",
        evaluate=lambda out, y: {"accuracy": 0.0})
