"""Guards around native bugs in the kernels torch ships, applied where the lab would reach them.

**oneDNN 3.12 (torch 2.13), AVX2-class CPUs: strided 1x1 convolution backward in channels_last.** On a CPU whose
oneDNN runs AVX2 kernels (no AVX-512: an AMD EPYC Zen 3, or any CPU under ``ONEDNN_MAX_CPU_ISA=AVX2``), a stride-2
1x1 convolution's backward in channels_last with fewer input channels than the kernel's block writes outside its
buffer at one thread (uxlfoundation/oneDNN#6035; the last primitive before the abort is ``jit_1x1:avx2``
backward-weights): ``Conv2d(4, 8, 1, stride=2)`` on a (16, 4, 14, 14) channels_last input aborts within 20 backward
passes ("corrupted size vs. prev_size", glibc), and a heap overwrite need not abort at all. Eager NCHW never reaches
that kernel. Inductor's layout optimisation converts a convolutional graph to channels_last, so ``torch.compile`` of
a ResNet's training step does: the full crossover map aborted at the vision ladder's ``xs`` rung (1 thread, batch
16), where the shortcut is exactly that convolution. :func:`compile_guard` turns Inductor's layout optimisation off
for this process on such CPUs, before the lab compiles: its convolutions stay NCHW and take other kernels (the same
rung then compiled and timed: 1.03-1.06x train step). What it costs: channels_last convolutions can be faster where
they work; on these CPUs a crash is the alternative.
"""

from __future__ import annotations

import platform

from lab.measure.cpu import effective_cpu_flags
from lab.measure.env import isa_class

#: Said where the guard applies (a run's record, the map's notes).
AVX2_CONV_WHY = ("Inductor's channels_last layout optimisation is off on this AVX2-class CPU: oneDNN 3.12's "
                 "strided 1x1 convolution backward corrupts memory in channels_last (oneDNN#6035; "
                 "lab.measure.kernel_guards)")


def needs_avx2_conv_guard(flags: frozenset[str] | set[str], machine: str | None = None) -> bool:
    """True on an x86 CPU whose kernels see AVX2 but not AVX-512 (``flags``: the effective flags, caps applied).
    Pure: tests pass flags for either side."""
    arch = (machine or platform.machine()).lower()
    return arch in ("x86_64", "amd64") and isa_class(flags) == "avx2"


def compile_guard(device: object = "cpu") -> str | None:
    """Call before ``torch.compile`` of a model on ``device``: on a CPU where :func:`needs_avx2_conv_guard`
    holds, set Inductor's ``layout_optimization`` off (process-wide) and return :data:`AVX2_CONV_WHY`; elsewhere,
    and for a CUDA model (its convolutions are cuDNN's, and channels-last pays there), change nothing and return
    ``None``."""
    if str(device).split(":")[0] != "cpu" or not needs_avx2_conv_guard(effective_cpu_flags()):
        return None
    import torch._inductor.config as inductor_config  # here: Inductor's config costs a second of `import lab`

    inductor_config.layout_optimization = False
    return AVX2_CONV_WHY


__all__ = ["AVX2_CONV_WHY", "compile_guard", "needs_avx2_conv_guard"]
