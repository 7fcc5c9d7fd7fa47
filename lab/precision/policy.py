"""The precision policy of one fit: autocast around forward + loss, scaled backward outside it, a skip-aware
optimizer step, fp32 islands and the diagnostics (loss scale, skipped steps, per-layer dtypes).

Why a policy object: the loop (:func:`lab.loop.fit`) must stay one loop. A :class:`PrecisionPolicy` owns the
three places precision touches a step and is a no-op for fp32, so the fp32 baseline runs exactly the plain
step. Why fp32 islands: some modules have no low-precision kernel (oneDNN's LSTM in fp16 on many CPUs raises
"could not create a primitive descriptor"), and some are numerically sensitive (the final classifier,
embedding sums). Such modules run inside a nested ``autocast(enabled=False)`` on fp32 inputs; the per-layer
dtype report (forward hooks on the first training step) shows what really ran.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from lab.measure import module_device

TORCH_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class BackwardInAutocastWarning(UserWarning):
    """``backward()`` ran inside an autocast region (the seed-004 bug): backward must follow the forward's
    dtypes, not a new autocast context; PyTorch documents it as unsupported."""


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 matmuls and convolutions (Ampere+) on or off for a region, restored afterwards: a benchmark arm
    must not leave the process's numerics changed for the arms after it."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


# ------------------------------------------------------------------------------------ fp32 islands

def _to_fp32(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.is_floating_point() and obj.dtype != torch.float32 else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to_fp32(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_fp32(v) for k, v in obj.items()}
    return obj


def _first_tensor(obj: Any) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, (tuple, list)):
        for o in obj:
            t = _first_tensor(o)
            if t is not None:
                return t
    return None


def low_precision_kernel_error(module: nn.Module, dtype: str, device_type: str) -> str | None:
    """Probe an RNN module once under autocast, as in training; the error text if it has no low-precision
    kernel here. Only RNNs are probed: they are the modules seen failing (oneDNN LSTM in fp16 on CPU)."""
    if not isinstance(module, nn.RNNBase):
        return None
    x = torch.zeros(1, 1, module.input_size, device=module_device(module))
    try:  # with grad enabled: oneDNN's fp16 LSTM fails only for training (forward works under no_grad)
        with torch.enable_grad(), torch.autocast(device_type, dtype=TORCH_DTYPES[dtype]):
            module(x)
    except RuntimeError as exc:
        return str(exc).splitlines()[0][:160]
    return None


def match_fp32_modules(model: nn.Module, names: tuple[str, ...]) -> dict[str, str]:
    """``{module name: reason}`` for the modules named in ``names`` (a module name from
    ``named_modules()`` or a class name such as ``LSTM``). An entry matching nothing is an error: a typo
    would otherwise silently keep nothing in fp32."""
    out: dict[str, str] = {}
    modules = dict(model.named_modules())
    for entry in names:
        hits = [n for n, m in modules.items() if n == entry or type(m).__name__ == entry]
        if not hits:
            avail = sorted({n for n in modules if n} | {type(m).__name__ for m in modules.values()})
            raise ValueError(f"precision.fp32_modules entry {entry!r} matches no module; "
                             f"allowed: module names or types such as {', '.join(avail[:20])}")
        for n in hits:
            out[n] = f"fp32_modules: {entry}"
    return out


# ------------------------------------------------------------------------------------ the policy

@dataclass
class PrecisionPolicy:
    """What one ``fit`` does about precision. ``dtype="fp32"`` with no fp32 modules is a pure no-op.

    Diagnostics filled while training: ``loss_scale_history`` (fp16 with a GradScaler), ``skipped_steps``
    (optimizer steps the scaler skipped for inf/nan gradients), ``grad_norms`` (global L2 norm of the
    unscaled gradients per step) and ``layer_dtypes`` (what autocast ran in each leaf module at step 0).
    """

    dtype: str = "fp32"
    device_type: str = "cpu"
    fp32_modules: tuple[str, ...] = ()
    use_scaler: bool | None = None  # None: fp16 gets a GradScaler, bf16/fp32 do not
    init_scale: float = 2.0 ** 16
    loss_scale_history: list[float] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)
    grad_norms: list[float | torch.Tensor] = field(default_factory=list)
    layer_dtypes: list[dict[str, Any]] = field(default_factory=list)
    forced_fp32: dict[str, str] = field(default_factory=dict)
    #: hook every leaf on a fit's first forward to report its dtypes (the ``auto`` probe turns it off after its
    #: warm-up fit: its timed fits are a step or two each, so the hooks would land in every timed step)
    record_dtypes: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in TORCH_DTYPES:
            raise ValueError(f"precision.dtype={self.dtype!r} is invalid: allowed: fp32, bf16, fp16 "
                             "(resolve 'auto' with lab.precision.policy_for first)")
        if self.use_scaler is None:
            self.use_scaler = self.dtype == "fp16"
        self.scaler = torch.amp.GradScaler(self.device_type, init_scale=self.init_scale) \
            if self.use_scaler else None
        self._step = 0

    @property
    def active(self) -> bool:
        return self.dtype != "fp32" or bool(self.fp32_modules)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The region for forward + loss; a null context for fp32."""
        if self.dtype == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=TORCH_DTYPES[self.dtype])

    @contextlib.contextmanager
    def applied(self, model: nn.Module) -> Iterator[nn.Module]:
        """Install fp32 islands and the backward-in-autocast watch for the duration of a fit; the model is
        left exactly as it was afterwards (no wrappers survive into evaluation, pickling or quantization)."""
        if not self.active:
            yield model
            return
        self.forced_fp32 = match_fp32_modules(model, self.fp32_modules)
        if self.dtype != "fp32":
            for name, mod in model.named_modules():
                err = low_precision_kernel_error(mod, self.dtype, self.device_type)
                if err and name not in self.forced_fp32:
                    self.forced_fp32[name] = f"no {self.dtype} kernel here: {err}"
        modules = dict(model.named_modules())
        for name in self.forced_fp32:
            mod = modules[name]
            mod.forward = _fp32_island(mod.forward, self.device_type)  # instance attribute, removed below
        watch = watch_backward_in_autocast(model, self.device_type)
        report = _record_layer_dtypes(model, self) if self.record_dtypes else (lambda: None)
        try:
            yield model
        finally:
            watch.remove()
            report()
            for name in self.forced_fp32:
                modules[name].__dict__.pop("forward", None)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward outside autocast, scaled when a GradScaler is in use."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Optimizer step (skipped by the scaler on inf/nan gradients) plus the per-step diagnostics."""
        if not self.active:
            optimizer.step()
            return
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        self.grad_norms.append(_grad_norm(optimizer))
        if self.scaler is None:
            optimizer.step()
        else:
            before = self.scaler.get_scale()
            self.scaler.step(optimizer)
            self.scaler.update()
            self.loss_scale_history.append(before)
            if self.scaler.get_scale() < before:  # the scaler backs off exactly when it skipped the step
                self.skipped_steps.append(self._step)
        self._step += 1

    def untouched_by_autocast(self) -> dict[str, str]:
        """``{module: type}`` of the weight layers (Linear, Conv, RNN, attention) that autocast left in fp32
        although nobody asked for it (no fp32 island): autocast has no low-precision rule for them here, so
        their share of the work gains nothing (e.g. ``nn.GRU`` under CPU bf16 autocast)."""
        if self.dtype == "fp32":
            return {}
        return {r["module"]: r["type"] for r in self.layer_dtypes
                if r["type"] in _MAC_LAYER_TYPES and r["output_dtype"] == "float32" and not r["fp32_reason"]}

    def diagnostics(self) -> dict[str, Any]:
        """JSON-safe summary for ``result.details``."""
        return {"dtype": self.dtype, "grad_scaler": bool(self.scaler), "forced_fp32": dict(self.forced_fp32),
                "loss_scale_history": list(self.loss_scale_history), "skipped_steps": list(self.skipped_steps),
                "grad_norms": [float(g) for g in self.grad_norms], "layer_dtypes": list(self.layer_dtypes),
                "untouched_by_autocast": self.untouched_by_autocast()}


#: Layer types whose output dtype says whether autocast ran their multiply-accumulates in low precision.
_MAC_LAYER_TYPES = frozenset({"Linear", "Conv1d", "Conv2d", "Conv3d", "LSTM", "GRU", "RNN", "MultiheadAttention",
                              "Bilinear", "ConvTranspose1d", "ConvTranspose2d"})

FP32 = PrecisionPolicy()  # the shared no-op policy of a plain fp32 run (it keeps no per-run state)


def _fp32_island(forward: Callable[..., Any], device_type: str) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run_in_fp32(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, enabled=False):
            return forward(*_to_fp32(args), **_to_fp32(kwargs))
    return run_in_fp32


def _grad_norm(optimizer: torch.optim.Optimizer) -> float | torch.Tensor:
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    return norm.detach() if norm.is_cuda else float(norm)  # CUDA: read in diagnostics(), not a sync per step


def _record_layer_dtypes(model: nn.Module, policy: PrecisionPolicy) -> Callable[[], None]:
    """Forward hooks on every leaf module for the first forward only; returns the remover."""
    handles: list[Any] = []
    seen: set[str] = set()

    def make(name: str) -> Callable[..., None]:
        def hook(mod: nn.Module, inputs: tuple, output: Any) -> None:
            if name in seen:
                return
            seen.add(name)
            t_in, t_out = _first_tensor(inputs), _first_tensor(output)
            policy.layer_dtypes.append({
                "module": name, "type": type(mod).__name__,
                "input_dtype": str(t_in.dtype).replace("torch.", "") if t_in is not None else None,
                "output_dtype": str(t_out.dtype).replace("torch.", "") if t_out is not None else None,
                "fp32_reason": policy.forced_fp32.get(name, "")})
        return hook

    for name, mod in model.named_modules():  # attention: its out_proj child never runs, so hook the attention
        if name and (not list(mod.children()) or name in policy.forced_fp32 or isinstance(mod, nn.MultiheadAttention)):
            handles.append(mod.register_forward_hook(make(name)))
    def remove(*_: Any) -> None:  # as a forward hook it must return None (a value would replace the output)
        for h in handles:
            h.remove()

    first = model.register_forward_hook(remove)
    return lambda: (first.remove(), remove())


# ------------------------------------------------------------------------------------ backward watch

def watch_backward_in_autocast(model: nn.Module, device_type: str = "cpu") -> RemovableHandle:
    """Warn with :class:`BackwardInAutocastWarning` when the backward of ``model``'s output runs while
    autocast is enabled. A tensor hook on the output sees the autocast state of the thread running the
    backward (the caller's thread on CPU), so ``with autocast(): loss.backward()`` is caught."""

    def check(grad: torch.Tensor) -> None:
        if torch.is_autocast_enabled(device_type):
            warnings.warn("backward() called inside an autocast region: run only forward + loss under "
                          "autocast, then backward and the optimizer step outside it",
                          BackwardInAutocastWarning, stacklevel=2)

    def on_forward(mod: nn.Module, inputs: tuple, output: Any) -> None:
        t = _first_tensor(output)
        if t is not None and t.requires_grad:
            t.register_hook(check)

    return model.register_forward_hook(on_forward)


# ------------------------------------------------------------------------------------ accuracy verdict

def accuracy_verdict(baseline: list[float], variant: list[float], *, higher_is_better: bool = True,
                     claim_rel: float = 0.01) -> dict[str, Any]:
    """Compare a metric over seeds: the mean delta (variant - baseline, signed so that negative is worse),
    the seed spread (std of the baseline, or of the variant when larger), whether the delta is "within
    noise" (|delta| <= spread), and whether the seed's claim "< 1 % accuracy loss" holds (loss < claim_rel
    relative to the baseline mean)."""
    if not baseline or not variant:
        raise ValueError("accuracy_verdict needs at least one baseline and one variant value")
    b, v = np.asarray(baseline, float), np.asarray(variant, float)
    sign = 1.0 if higher_is_better else -1.0
    delta = sign * float(v.mean() - b.mean())
    spread = max(float(b.std(ddof=1)) if len(b) > 1 else 0.0, float(v.std(ddof=1)) if len(v) > 1 else 0.0)
    rel_loss = float(-delta / abs(b.mean())) if b.mean() else math.inf
    within = abs(delta) <= spread
    label = "within noise" if within else ("better" if delta > 0 else "worse")
    return {"delta": delta, "seed_spread": spread, "relative_loss": rel_loss, "label": label,
            "within_noise": within, "claim_lt_1pct_holds": bool(rel_loss < claim_rel),
            "n_baseline": len(b), "n_variant": len(v)}

__all__ = [
    "accuracy_verdict", "BackwardInAutocastWarning", "FP32", "low_precision_kernel_error", "match_fp32_modules",
    "PrecisionPolicy", "tf32", "TORCH_DTYPES", "watch_backward_in_autocast",
]
