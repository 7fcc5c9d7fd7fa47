"""The workload contract, checked on a few rows before any training: one message that names the workload,
the split, the tensor and what was expected, instead of a torch traceback minutes into a run.

The contract: ``Datasets`` splits are ``(input_1, ..., input_k, target)`` with at least one row;
``model(*inputs)`` runs on a batch; ``loss(outputs, target)`` is a finite scalar; class labels (integer
targets against ``[batch, classes]`` outputs) lie in ``0 .. classes - 1``; ``evaluate(outputs, target)``
returns a dict holding ``metric_name``.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import Datasets, Workload

#: Rows the checks run on: enough for a metric, few enough to cost nothing.
CHECK_ROWS = 64


class FirstOutput(nn.Module):
    """A model whose ``forward`` returns a tuple (nanoGPT's ``(logits, loss)``, an RNN's ``(output, hidden)``)
    seen as the lab needs it: its first element alone. The lab times, quantizes and measures one tensor of
    outputs; this thin adapter keeps the user's model unchanged inside it (``.model``), as
    :class:`lab.workloads.hf.HFAdapter` does for ``ModelOutput.logits``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(*inputs)[0]


def _describe(t: torch.Tensor) -> str:
    shape = "x".join(str(d) for d in t.shape) or "scalar"
    text = f"[{shape}] {str(t.dtype).replace('torch.', '')}"
    if t.numel() and not t.is_floating_point() and not t.is_complex():
        text += f" in [{int(t.min())}, {int(t.max())}]"
    return text


def _fail(wl: Workload, what: str, exc: BaseException | None = None) -> None:
    reason = f": {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}" if exc else ""
    raise ValueError(f"workload {wl.name!r}: {what}{reason}")


@torch.no_grad()
def _check_finite(wl: Workload, split: str, tensors: tuple[torch.Tensor, ...]) -> None:
    """Every floating tensor of a split is finite: a NaN in the train split ends training at its first step,
    but one in the test split only poisons the metric (a NaN-free mean can still come out), so both are
    checked, whole, before any work (``isfinite`` over the in-memory split costs milliseconds)."""
    for i, t in enumerate(tensors):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
            continue
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            rows = torch.nonzero(bad.reshape(len(t), -1).any(1)).flatten()[:3].tolist()
            what = "target" if i == len(tensors) - 1 else f"input {i + 1}"
            _fail(wl, f"the {split} split's {what} holds {int(bad.sum())} non-finite value(s) (NaN / inf), "
                      f"first in row(s) {', '.join(map(str, rows))}")


def check_contract(wl: Workload, data: Datasets, model: nn.Module, device: torch.device) -> None:
    """Raise one ``ValueError`` for the first broken part of the contract (the model is left as it was)."""
    for split in ("train", "test"):
        if len(getattr(data, split)[0]) == 0:
            _fail(wl, f"the {split} split is empty (make_data returned 0 rows)")
    for split in ("train", "test"):
        _check_finite(wl, split, getattr(data, split))
    was_training = model.training
    model.eval()
    try:
        outs = {}
        for split in ("train", "test"):
            tensors = getattr(data, split)
            inputs = tuple(t[:CHECK_ROWS].to(device) for t in tensors[:-1])
            try:
                outs[split] = model(*inputs)
            except Exception as exc:
                _fail(wl, f"the model cannot take a batch of the {split} split (inputs "
                      + ", ".join(_describe(t) for t in inputs) + ")", exc)
            if not isinstance(outs[split], torch.Tensor):
                out = outs[split]
                hint = (" (a Hugging Face model: wrap it with lab.workloads.hf.workload, which takes .logits)"
                        if hasattr(out, "logits") else "")
                if isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor):
                    items = ", ".join(_describe(o) if isinstance(o, torch.Tensor) else type(o).__name__
                                      for o in out[:4])
                    hint = (f" ({items}): return the logits alone, or wrap the model as "
                            "make_model=lambda spec: lab.workloads.FirstOutput(MyModel()) (its first element; the "
                            "loss and evaluate then take that tensor)")
                _fail(wl, f"the model returned {type(outs[split]).__name__}, expected one tensor of outputs{hint}")
        out, target = outs["train"], data.train[-1][:CHECK_ROWS].to(device)
        full_target = torch.cat([data.train[-1], data.test[-1]])
        if (out.dim() == 2 and out.shape[1] > 1 and not full_target.is_floating_point()
                and full_target.numel() and (int(full_target.min()) < 0 or int(full_target.max()) >= out.shape[1])):
            _fail(wl, f"labels lie in [{int(full_target.min())}, {int(full_target.max())}] but the model outputs "
                  f"{out.shape[1]} classes (expected labels 0..{out.shape[1] - 1})")
        try:
            loss = wl.loss(out, target)
        except Exception as exc:
            _fail(wl, f"loss(outputs {_describe(out)}, target {_describe(target)}) fails on a train batch", exc)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            _fail(wl, f"loss must return a scalar tensor, got {type(loss).__name__}"
                  + (f" of shape {list(loss.shape)}" if isinstance(loss, torch.Tensor) else ""))
        try:
            metrics = wl.evaluate(outs["test"].float().cpu(), data.test[-1][:CHECK_ROWS])
        except Exception as exc:
            _fail(wl, f"evaluate(outputs {_describe(outs['test'])}, target {_describe(data.test[-1][:CHECK_ROWS])}) "
                  "fails on test rows", exc)
        if not isinstance(metrics, dict) or wl.metric_name not in metrics:
            keys = sorted(metrics) if isinstance(metrics, dict) else type(metrics).__name__
            _fail(wl, f"evaluate() returned {keys} without its metric_name {wl.metric_name!r}")
    finally:
        model.train(was_training)
