"""The portable recipe's "your turn" checkers: the learner's own plain-PyTorch training loop held against a lab run
of the same arm (notebook 02; the names are re-exported by :mod:`lab.teach.checks`, which the notebooks import).

Why apart: a checker here runs a real lab run and a learner's loop from the very same start (model, optimizer,
batches), a different kind of check from the small pure functions in :mod:`lab.teach.checks`.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def _ok(msg: str) -> None:
    print("correct:", msg)


# The portable recipe's exercises: the learner writes the plain-PyTorch loop a `python -m lab recipe` file holds,
# and the checker runs it on the very model, batches and optimizer a lab run of the same arm starts from, then holds
# what it did (losses, the dtypes autocast ran each layer in, where backward ran) against what the lab recorded.
#: The workload the loop exercises train: the lab's dense reference MLP at its tiny size (a step is ~1 ms).
LOOP_WORKLOAD, LOOP_SIZE = "mlp", "tiny"


class ArmStart:
    """The lab's run of one precision arm (``run``) and a fresh start identical to its own: the model built from
    the same seed, the optimizer the lab makes, the training batches in the run's order (``data.shuffle=False``),
    the workload's loss. A plain loop over ``loader`` from here takes the lab run's steps, so its losses can be
    compared number for number."""

    def __init__(self, dtype: str = "bf16", steps: int = 8) -> None:
        from torch.utils.data import DataLoader, TensorDataset

        from lab import PrecisionConfig, RunConfig
        from lab.context import prepare
        from lab.loop import make_optimizer

        cfg = RunConfig(workload=LOOP_WORKLOAD, size=LOOP_SIZE, epochs=1, max_steps=steps, latency_repeats=0,
                        threads=1, device="cpu", warmup_steps=1, precision=PrecisionConfig(dtype=dtype)
                        ).with_overrides(**{"data.shuffle": False})
        self.dtype, self.steps, self.run = dtype, steps, _arm_run(cfg)
        key = (LOOP_WORKLOAD, LOOP_SIZE, cfg.seed)
        if key not in _STARTS:  # the data and the first model, once per process (the same for every arm)
            with prepare(cfg) as ctx:
                _STARTS[key] = (ctx.new_model(), ctx.data.train, ctx.resolved, ctx.workload.loss)
        model, tensors, r, self.loss_fn = _STARTS[key]
        self.model = copy.deepcopy(model)
        self.optimizer = make_optimizer(cfg.optimizer, self.model.parameters(), r.lr)
        self.loader = DataLoader(TensorDataset(*(t[:steps * r.batch_size] for t in tensors)),
                                 batch_size=r.batch_size, shuffle=False, drop_last=True)

    def lab_dtypes(self) -> dict[str, str]:
        """The output dtype of each Linear in the lab run's first training step (fp32: no policy, all float32)."""
        phase = ((self.run.details.get("precision") or {}).get("phases") or {}).get("train")
        if not phase:
            return {n: "float32" for n, m in self.model.named_modules() if isinstance(m, nn.Linear)}
        return {row["module"]: row["output_dtype"] for row in phase["layer_dtypes"] if row["type"] == "Linear"}

    def lab_losses(self) -> list[float]:
        return [float(v) for v in self.run.losses]


_ARM_RUNS: dict[str, Any] = {}
_STARTS: dict[tuple, tuple] = {}


def _arm_run(cfg: Any) -> Any:
    """The lab's run of ``cfg``, once per process (a notebook's demo and its exercise share it)."""
    from lab import run

    key = repr(cfg.to_dict())
    if key not in _ARM_RUNS:
        res = run(cfg)
        assert res.status == "ok", res.error
        _ARM_RUNS[key] = res
    return _ARM_RUNS[key]


def watch_linears(model: nn.Module) -> tuple[dict[str, str], Callable[[], None]]:
    """``(seen, remove)``: ``seen`` fills with each Linear's output dtype on its first forward (``"bfloat16"``...)."""
    seen: dict[str, str] = {}

    def hook(name: str) -> Callable:
        def record(mod: nn.Module, args: tuple, out: torch.Tensor) -> None:  # None: the output stays as it is
            seen.setdefault(name, str(out.dtype).split(".")[-1])
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    return seen, lambda: [h.remove() for h in handles]


def amp_loop(fn: Callable, dtype: str = "bf16", steps: int = 8) -> list[float]:
    """The learner's ``fn(model, optimizer, loader, loss_fn) -> losses`` (one float per step), run on the start of
    the lab's ``dtype`` run (:class:`ArmStart`): the same losses as the lab's steps, each Linear in the dtype the
    lab's autocast ran it in, and backward outside autocast (:func:`lab.precision.watch_backward_in_autocast`)."""
    from lab.precision import BackwardInAutocastWarning, watch_backward_in_autocast

    arm = ArmStart(dtype, steps)
    seen, remove = watch_linears(arm.model)
    watch = watch_backward_in_autocast(arm.model, "cpu")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses = fn(arm.model, arm.optimizer, arm.loader, arm.loss_fn)
    finally:
        watch.remove()
        remove()
    assert not any(issubclass(w.category, BackwardInAutocastWarning) for w in caught), \
        "loss.backward() ran inside torch.autocast: close the `with` block after the loss, then call backward"
    losses = [float(v) for v in losses]
    want_dtypes, want_losses = arm.lab_dtypes(), arm.lab_losses()
    assert seen == want_dtypes, (f"your loop ran the Linear layers as {seen}, the lab's {dtype} run as {want_dtypes}: "
                                 f"wrap forward + loss in torch.autocast('cpu', dtype=torch."
                                 f"{'bfloat16' if dtype == 'bf16' else 'float16'})")
    assert len(losses) == len(want_losses), f"{len(losses)} losses for {len(want_losses)} steps: one per batch"
    bad = next((i for i, (a, b) in enumerate(zip(losses, want_losses, strict=True))
                if abs(a - b) > 1e-6 * max(1.0, abs(b))), None)
    assert bad is None, (f"step {bad}: loss {losses[bad]:.6f} vs the lab's {want_losses[bad]:.6f} (the first "
                         f"{bad} agree): one optimizer.step() and one zero_grad() per batch, the loss of the batch "
                         "before the step" if bad else "")
    _ok(f"{len(losses)} steps with the lab's losses (first {losses[0]:.4f}, last {losses[-1]:.4f}), every Linear "
        f"in {sorted(set(seen.values()))}, backward outside autocast")
    return losses


def train_bf16(fn: Callable, steps: int = 8) -> list[float]:
    """Notebook 02's exercise: the learner's bf16 loop against the lab's bf16 run (:func:`amp_loop`)."""
    return amp_loop(fn, "bf16", steps)
