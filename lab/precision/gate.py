"""The capability gate: does this dtype have native kernels here (``auto`` then measures whether it is faster)?

Why a gate: low precision only pays where the hardware has native kernels. On a CPU without bf16
instructions bf16 autocast is emulated and can be several times *slower* than fp32; fp16 on most CPUs has
no native matmul at all. :func:`capability` reads the real ISA flags (``/proc/cpuinfo``) or the CUDA compute
capability, and a run on emulated precision carries a "why" tag. Flags are not kernels: :func:`model_gate`
refuses what the flags allow but a model's layers make hopeless (fp16 convolutions on a CPU), before any work.
``auto`` (:mod:`lab.precision.auto`) measures the candidates this gate lets through on the run's own step.
Taught in ``notebooks/02_mixed_precision.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lab.measure import NATIVE, cpu_capabilities, effective_cpu_flags
from lab.precision.policy import TORCH_DTYPES, match_fp32_modules


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


__all__ = ["capability", "Capability", "cpu_flags", "model_gate", "NotApplicable", "not_applicable_reason"]
