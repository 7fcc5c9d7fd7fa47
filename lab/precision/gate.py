"""The capability gate and ``auto``: does this dtype have native kernels here, and is it faster, measured?

Why a gate: low precision only pays where the hardware has native kernels. On a CPU without bf16
instructions bf16 autocast is emulated and can be several times *slower* than fp32; fp16 on most CPUs has
no native matmul at all. :func:`capability` reads the real ISA flags (``/proc/cpuinfo``) or the CUDA compute
capability, and a run on emulated precision carries a "why" tag. Flags are not kernels: :func:`model_gate`
refuses what the flags allow but a model's layers make hopeless (fp16 convolutions on a CPU), before any work.
``auto`` measures a few interleaved steps through the run's own ``ctx.fit`` and never picks a precision that is
not faster than fp32 (:func:`decide_auto`).
Taught in ``notebooks/02_mixed_precision.ipynb``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from lab.context import TrainContext
from lab.measure import NATIVE, bootstrap_ratio_ci, cpu_capabilities, effective_cpu_flags
from lab.precision.policy import TORCH_DTYPES, PrecisionPolicy, match_fp32_modules

#: ``auto`` picks a low precision only when it is at least this much faster than fp32 (median step time).
AUTO_MIN_GAIN = 0.05


@dataclass(frozen=True)
class Capability:
    """Whether ``dtype`` has native kernels on ``device``, and the evidence for the verdict."""

    dtype: str
    device: str
    native: bool
    reason: str

    def why_tag(self) -> str | None:
        """The tag a run on this precision carries when it is emulated (``None`` when native or fp32)."""
        if self.native or self.dtype == "fp32":
            return None
        where = "this CPU" if self.device == "cpu" else "this GPU"
        return f"no native {self.dtype} on {where}"


def cpu_flags() -> frozenset[str]:
    """The ISA flags the kernels may use here: ``/proc/cpuinfo`` less what ``ONEDNN_MAX_CPU_ISA`` hides
    (:func:`lab.measure.effective_cpu_flags`), so an AMX box capped at AVX2 is gated as an AVX2 one."""
    return effective_cpu_flags()


_CPU_NATIVE = {d: NATIVE[d] for d in ("bf16", "fp16")}  # any of these flags: native kernels for the dtype


def capability(dtype: str, device: str | torch.device = "cpu", *, flags: frozenset[str] | None = None,
               cuda_cc: tuple[int, int] | None = None) -> Capability:
    """Native-or-emulated verdict for ``dtype`` on ``device``. ``flags`` / ``cuda_cc`` override what is
    read from the machine (tests inject them; the real gate reads /proc/cpuinfo and the CUDA device)."""
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"precision.dtype={dtype!r} is invalid: allowed: {', '.join(TORCH_DTYPES)}")
    dev = torch.device(device)
    if dtype == "fp32":
        return Capability(dtype, dev.type, True, "fp32 is always native")
    if dev.type == "cuda":
        cc = cuda_cc if cuda_cc is not None else torch.cuda.get_device_capability(dev)
        need = (8, 0) if dtype == "bf16" else (7, 0)  # bf16 tensor cores from Ampere; fp16 from Volta
        ok = tuple(cc) >= need
        return Capability(dtype, "cuda", ok, f"compute capability {cc[0]}.{cc[1]} "
                                             f"{'>=' if ok else '<'} {need[0]}.{need[1]}")
    have = cpu_flags() if flags is None else flags
    found = [f for f in _CPU_NATIVE[dtype] if f in have]
    isa = torch.backends.cpu.get_cpu_capability()
    if found:
        return Capability(dtype, "cpu", True, f"CPU flags {', '.join(found)} (torch kernels: {isa}); flags are "
                                              "necessary, not sufficient: auto measures")
    # the machine's own flags: the sentence also names a cap that hides instructions the hardware has
    missing = cpu_capabilities().missing(dtype) if flags is None else \
        f"none of {', '.join(_CPU_NATIVE[dtype])} in the CPU flags (torch kernels: {isa})"
    return Capability(dtype, "cpu", False, f"{missing}; {dtype} is emulated")


# ------------------------------------------------------------------------------------ model gate

class NotApplicable(ValueError):
    """A technique that cannot pay on this model on this machine: refused before any training, and shown by an
    ablation as "does not apply here" with its reason (:func:`not_applicable_reason`), not as a failed arm."""


def model_gate(model: nn.Module, dtype: str, device_type: str, fp32_modules: tuple[str, ...] = ()) -> str | None:
    """Why ``dtype`` must not train ``model`` on ``device_type`` (``None``: it may). The CPU flags say nothing
    about this: fp16 convolution *backward* has no fast kernel on CPU (a reference path; measured here with
    AVX-512-FP16 present: ~40x slower per step for a 2-conv net, 63 s vs 0.24 s at vision ``--model-scale l``),
    so fp16 on a model with Conv layers is refused unless every one of them is kept in fp32
    (``precision.fp32_modules``), where it runs as fp32."""
    if dtype != "fp16" or device_type != "cpu":
        return None
    kept = match_fp32_modules(model, fp32_modules) if fp32_modules else {}
    modules = dict(model.named_modules())

    def inside_kept(name: str) -> bool:
        return any(name == k or name.startswith(f"{k}.") or not k for k in kept)

    convs = [n for n, m in modules.items() if isinstance(m, nn.modules.conv._ConvNd) and not inside_kept(n)]
    if not convs:
        return None
    types = sorted({type(modules[n]).__name__ for n in convs})
    shown = ", ".join(convs[:3]) + (f" and {len(convs) - 3} more" if len(convs) > 3 else "")
    return (f"fp16 on CPU with {len(convs)} {'/'.join(types)} layer(s) ({shown}): fp16 convolution backward has no "
            f"fast CPU kernel (a reference path, tens of times slower than fp32); use bf16, or keep them in fp32 "
            f"with --precision-fp32-modules {','.join(types)}")


def not_applicable_reason(error: str | None) -> str | None:
    """The reason of an ablation error row that is a :class:`NotApplicable` refusal (its error text is
    ``"NotApplicable: <reason>"``), else ``None``: the arm does not apply here, it did not fail."""
    prefix = f"{NotApplicable.__name__}: "
    return error[len(prefix):] if isinstance(error, str) and error.startswith(prefix) else None


# ------------------------------------------------------------------------------------ auto decision

def decide_auto(step_times_ms: dict[str, list[float]], caps: dict[str, Capability], *,
                min_gain: float = AUTO_MIN_GAIN) -> tuple[str, str]:
    """Pick among measured arms: the fastest native low precision whose fp32/x speedup is at least
    ``1 + min_gain`` *and* whose bootstrap CI lies above 1, else fp32. Returns (choice, why).
    Pure (measurements are passed in) so that both outcomes can be tested on any machine."""
    if "fp32" not in step_times_ms:
        raise ValueError("decide_auto needs fp32 step times as the baseline")
    base = step_times_ms["fp32"]
    best, best_speedup, notes = "fp32", 1.0, []
    for name, times in step_times_ms.items():
        if name == "fp32":
            continue
        cap = caps.get(name)
        if cap is not None and not cap.native:
            notes.append(f"{name} skipped ({cap.why_tag()})")
            continue
        speedup, lo, _ = bootstrap_ratio_ci(base, times, n_boot=500)
        notes.append(f"{name} x{speedup:.2f} [{lo:.2f}, ...]")
        if speedup >= 1.0 + min_gain and lo > 1.0 and speedup > best_speedup:
            best, best_speedup = name, speedup
    if best == "fp32":
        why = f"auto chose fp32: no low precision was >= {min_gain:.0%} faster ({'; '.join(notes)})"
    else:
        why = f"auto chose {best}: x{best_speedup:.2f} faster than fp32 ({'; '.join(notes)})"
    return best, why


def measure_arms(ctx: TrainContext, model: nn.Module, lr: float, arms: list[str], *, steps: int = 6,
                 rounds: int = 4, discard: int = 1) -> dict[str, list[float]]:
    """Per-step training time (ms, all phases) of each arm on copies of ``model``, arms interleaved over
    ``rounds`` so that drift on a shared machine hits every arm alike. Each arm trains through ``ctx.fit``
    (the run's own loader, optimizer and fused setting) with only the precision policy swapped. RNG state
    is restored afterwards, so measuring does not change the run that follows."""
    dev = ctx.device
    times: dict[str, list[float]] = {a: [] for a in arms}
    n_batches = max(1, len(ctx.make_loader()))
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        for _ in range(rounds):
            for arm in arms:
                pol = PrecisionPolicy(dtype=arm, device_type=dev.type, fp32_modules=ctx.cfg.precision.fp32_modules)
                st = ctx.fit(copy.deepcopy(model), epochs=math.ceil((steps + 1) / n_batches), lr=lr, max_steps=steps,
                             policy=pol, phase=f"auto:{arm}", probe=True)
                totals = np.sum([v for v in st.step_times_ms.values() if len(v) == st.steps], axis=0)
                times[arm].extend(float(t) for t in totals[discard:])
    return times


def policy_for(ctx: TrainContext, model: nn.Module, lr: float) -> PrecisionPolicy:
    """The policy of ``ctx``'s run; resolves ``auto`` (by measuring) and records the gate's verdict and
    "why" tags in the result the first time it is called (``ctx.state["precision.dtype"]`` remembers it)."""
    cfg, dev = ctx.cfg.precision, ctx.device
    if "precision.dtype" not in ctx.state:
        rec = ctx.result.details.setdefault("precision", {})
        rec["requested"] = cfg.dtype
        choice = cfg.dtype
        if cfg.dtype == "auto":
            caps = {d: capability(d, dev) for d in ("bf16", "fp16")}
            gated = {d: g for d in caps if (g := model_gate(model, d, dev.type, cfg.fp32_modules))}
            arms = ["fp32"] + [d for d, c in caps.items() if c.native and d not in gated]
            t0 = time.perf_counter()
            times = measure_arms(ctx, model, lr, arms) if len(arms) > 1 else {"fp32": [1.0]}
            choice, why = decide_auto(times, caps)
            why += "".join(f"; {d} not tried: {g}" for d, g in gated.items())
            # The probe is training-time cost too: the ablation adds probe_s to its end-to-end figure.
            rec["auto"] = {"why": why, "step_time_ms": times, "candidates": arms, "gated": gated,
                           "probe_s": time.perf_counter() - t0}
            ctx.result.why.append(why)
        cap = capability(choice, dev)
        rec.update(resolved=choice, capability=dataclasses.asdict(cap))
        if cap.why_tag():
            ctx.result.why.append(cap.why_tag())
        ctx.state["precision.dtype"] = choice
    return PrecisionPolicy(dtype=ctx.state["precision.dtype"], device_type=dev.type, fp32_modules=cfg.fp32_modules)

__all__ = [
    "AUTO_MIN_GAIN", "capability", "Capability", "cpu_flags", "decide_auto", "measure_arms", "model_gate",
    "NotApplicable", "not_applicable_reason", "policy_for",
]
