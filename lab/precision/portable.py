"""Mixed precision as plain PyTorch (``python -m lab recipe``, :mod:`lab.portable`): the policy of
:mod:`lab.precision.policy` written out. Autocast wraps forward + loss only; backward and the optimizer step run
outside it (the seed-004 bug wraps ``loss.backward()`` too); fp16 scales the loss with a ``GradScaler``, which skips
a step whose gradients overflowed; bf16 needs no scaling (fp32's exponent range).

``auto`` is a decision, not code: the lab measures the run's own first steps and keeps a native low precision only
when its speedup interval clears 1.02 (:mod:`lab.precision.auto`). Its recipe is the code of what a stored run of
it chose; without one, of what the lab keeps without a measurement: fp32 (the header names the native candidate).
"""

from __future__ import annotations

from lab.config import RunConfig
from lab.context import resolve_device
from lab.precision.gate import capability
from lab.result import RunResult
from lab.technique import NotPortable, Portable, not_written_out

TORCH_NAMES = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}


def auto_choice(cfg: RunConfig, run: RunResult | None) -> tuple[str, str]:
    """``(dtype, why)``: the dtype ``precision.dtype='auto'`` stands for in a recipe: what ``run`` (a stored run of
    ``cfg``) resolved it to, else fp32, the lab's choice without a measurement."""
    if run is not None:
        rec = (run.details or {}).get("precision") or {}
        if rec.get("resolved") not in ("fp32", "bf16", "fp16"):
            raise NotPortable(f"precision.dtype='auto': run {run.run_id[:8]} records no resolved dtype "
                              f"(status {run.status}); give a finished run of it")
        why = ((rec.get("auto") or {}).get("why") or "measured on the run's own first steps")
        return rec["resolved"], f"amp_auto: run {run.run_id[:8]} chose {rec['resolved']} ({why})"
    device = resolve_device(cfg.device)
    native = [d for d in ("bf16", "fp16") if capability(d, device).native]
    if not native:
        return "fp32", (f"amp_auto: fp32, as the lab keeps on this machine: no native bf16 or fp16 on {device.type} "
                        "(auto tries native dtypes only)")
    return "fp32", (f"amp_auto: fp32, what the lab keeps without a measurement; {' and '.join(native)} native here "
                    f"and auto's candidate{'s' if len(native) > 1 else ''}: its probe keeps one only when it times "
                    "it >= 1.02x faster on your steps (pass --run RUN_ID of an amp_auto run for its choice, or ask "
                    f"for {native[0]})")


def portable(cfg: RunConfig, run: RunResult | None = None) -> Portable | None:
    """Autocast to ``cfg.precision.dtype`` around forward + loss; fp16 adds a GradScaler."""
    pc = cfg.precision
    if not pc.enabled:
        return None
    if pc.fp32_modules:
        raise not_written_out(f"precision.fp32_modules={list(pc.fp32_modules)!r}",
                              "fp32 islands (a nested autocast(enabled=False) per module)")
    dtype, why = (pc.dtype, "") if pc.dtype != "auto" else auto_choice(cfg, run)
    notes = (why,) if why else ()
    if dtype == "fp32":
        return Portable(comment="fp32: no autocast (what amp_auto stands for here)", notes=notes)
    autocast = f"torch.autocast(device.type, dtype={TORCH_NAMES[dtype]})"
    if dtype == "bf16":
        return Portable(comment="autocast to bfloat16 around forward + loss only; backward and the step outside it "
                                "(no loss scaling: bf16 has fp32's exponent range)", autocast=autocast, notes=notes)
    return Portable(comment="autocast to float16 around forward + loss only; a GradScaler scales the loss and skips "
                            "a step whose gradients overflowed",
                    fit_setup=("scaler = torch.amp.GradScaler(device.type)  # one per fit: its scale adapts",),
                    autocast=autocast, backward="scaler.scale(loss).backward()",
                    step=("scaler.step(optimizer)  # unscales the gradients; skips the step on inf / nan",
                          "scaler.update()"), notes=notes)


__all__ = ["TORCH_NAMES", "auto_choice", "portable"]
