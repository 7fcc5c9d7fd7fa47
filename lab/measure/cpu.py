"""What this CPU can do natively, as the kernels that will run see it (docs/architecture.md section 5, rule 12).

Why not just ``/proc/cpuinfo``: the flags say what the silicon has, but two environment variables cap what
PyTorch's kernels use. ``ATEN_CPU_CAPABILITY`` (``default`` | ``avx2`` | ``avx512``) picks ATen's vectorised
kernels, and ``ONEDNN_MAX_CPU_ISA`` (``AVX2``, ``AVX512_CORE_VNNI``, ``AVX512_CORE_AMX`` ...) caps oneDNN, which
runs the matmuls, convolutions and int8 GEMMs that decide whether bf16 / int8 pay. Measured on an AMX Xeon
(torch 2.13.0, 1 thread, 512x512 matmul): bf16 0.27 ms natively, 124 ms with ``ONEDNN_MAX_CPU_ISA=AVX2``;
PT2E int8 output error 0.012 natively, 0.121 capped (u8 x s8 through 16-bit saturating instructions without
VNNI). So the lab's gates read the *effective* flags: the cpuinfo flags masked by those caps. That also lets
an AMX box run the suite as an AVX2 user sees it (``LAB_EMULATE_ISA=avx2`` in ``make test-avx2``, which sets
both variables), and the capability markers in ``tests/conftest.py`` follow it.

What the emulation cannot show: fbgemm (the legacy int8 path) picks its kernels from CPUID and ignores both
caps; Inductor's generated C++ may still be compiled for the host ISA; memory bandwidth, caches, clocks and
core counts stay the host's. Re-exported by :mod:`lab.measure`.
"""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

#: oneDNN's ISA levels (``ONEDNN_MAX_CPU_ISA``), lowest first, with the x86 flags each level adds. A cap
#: allows the flags of its level and of every level below it. Aliases map the old names to the new ones.
ONEDNN_ISA_LEVELS: tuple[tuple[str, frozenset[str]], ...] = (
    ("SSE41", frozenset({"sse4_1", "sse4_2"})),
    ("AVX", frozenset({"avx"})),
    ("AVX2", frozenset({"avx2", "fma", "f16c"})),
    ("AVX2_VNNI", frozenset({"avx_vnni"})),
    ("AVX2_VNNI_2", frozenset({"avx_vnni_int8", "avx_ne_convert"})),
    ("AVX512_CORE", frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"})),
    ("AVX512_CORE_VNNI", frozenset({"avx512_vnni"})),
    ("AVX512_CORE_BF16", frozenset({"avx512_bf16"})),
    ("AVX10_1_512", frozenset({"avx512_fp16"})),
    ("AVX10_1_512_AMX", frozenset({"amx_bf16", "amx_int8", "amx_tile"})),
    ("AVX10_1_512_AMX_FP16", frozenset({"amx_fp16"})),
)
_ONEDNN_ALIASES = {"AVX512_CORE_FP16": "AVX10_1_512", "AVX512_CORE_AMX": "AVX10_1_512_AMX",
                   "AVX512_CORE_AMX_FP16": "AVX10_1_512_AMX_FP16", "ALL": "DEFAULT"}
#: Every flag some level governs: a flag outside this set (sse2, aes, ...) is never masked.
_GOVERNED = frozenset().union(*(flags for _, flags in ONEDNN_ISA_LEVELS))
#: ATen's capability names -> the oneDNN level that allows the same flags.
_ATEN_TO_LEVEL = {"default": "SSE41", "avx2": "AVX2", "avx512": "AVX512_CORE"}

#: What native kernels for a dtype need (any one of these flags). bf16 on AVX512_CORE without BF16
#: instructions runs through conversions at a fraction of fp32 (measured: 0.02-0.45x training on Zen 3).
NATIVE: dict[str, tuple[str, ...]] = {
    "bf16": ("avx512_bf16", "amx_bf16", "bf16"),  # x86 AVX-512 BF16 / AMX, ARM bf16
    "fp16": ("avx512_fp16", "amx_fp16", "fphp", "asimdhp"),
    "int8_vnni": ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm"),  # int8 dot products, no saturation
    "amx": ("amx_tile",),
}

#: ``LAB_EMULATE_ISA`` values -> the two variables they set (read by torch at import: set before it).
EMULATIONS: dict[str, dict[str, str]] = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "avx512_vnni": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"},
}


@functools.lru_cache(maxsize=1)
def hardware_flags() -> frozenset[str]:
    """All ISA flags the kernel reports for this CPU (``flags`` on x86, ``Features`` on ARM)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def _level_index(name: str) -> int | None:
    """Index in :data:`ONEDNN_ISA_LEVELS` of a oneDNN ISA name; ``None`` for DEFAULT / unknown (no cap)."""
    name = _ONEDNN_ALIASES.get(name.upper(), name.upper())
    for i, (level, _) in enumerate(ONEDNN_ISA_LEVELS):
        if level == name:
            return i
    return None


def allowed_flags(cap: str | None) -> frozenset[str] | None:
    """The governed flags a oneDNN ISA cap lets kernels use (``None``: no cap)."""
    i = _level_index(cap) if cap else None
    if i is None:
        return None
    return frozenset().union(*(flags for _, flags in ONEDNN_ISA_LEVELS[: i + 1]))


def mask_flags(flags: frozenset[str], env: dict[str, str] | None = None) -> tuple[frozenset[str], list[str]]:
    """``(effective flags, caps applied)``: ``flags`` less what ``ONEDNN_MAX_CPU_ISA`` in ``env`` (default
    ``os.environ``) forbids. Only oneDNN's cap masks: measured here, ``ATEN_CPU_CAPABILITY=avx2`` alone leaves
    bf16 matmul at 0.27 ms and PT2E int8's error at 0.012 (oneDNN runs both); it is listed in the caps when it
    lowers ATen's kernels. Pure, so both sides of every cap are testable on any machine."""
    env = os.environ if env is None else env
    caps: list[str] = []
    onednn_var = next((v for v in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA") if env.get(v)), None)
    effective = set(flags)
    if onednn_var:
        allowed = allowed_flags(env[onednn_var])
        cut = {f for f in effective if f in _GOVERNED and allowed is not None and f not in allowed}
        if cut:
            effective -= cut
            caps.append(f"{onednn_var}={env[onednn_var]}")
    aten = (env.get("ATEN_CPU_CAPABILITY") or "").lower()
    aten_allowed = allowed_flags(_ATEN_TO_LEVEL.get(aten, ""))
    if aten_allowed is not None and any(f in _GOVERNED and f not in aten_allowed for f in flags):
        caps.append(f"ATEN_CPU_CAPABILITY={env['ATEN_CPU_CAPABILITY']}")
    return frozenset(effective), caps


@dataclass(frozen=True)
class CpuCapabilities:
    """The CPU's native dtypes and int8 instructions as the kernels see them (caps applied)."""

    hardware_flags: tuple[str, ...]  # every flag /proc/cpuinfo reports
    effective_flags: tuple[str, ...]  # the same less what the ISA caps forbid
    caps: tuple[str, ...]  # the environment caps that removed a flag ("ONEDNN_MAX_CPU_ISA=AVX2")
    aten_capability: str  # ATen's kernel choice (torch.backends.cpu.get_cpu_capability())
    native_bf16: bool
    native_fp16: bool
    int8_vnni: bool
    amx: bool

    @property
    def emulated(self) -> bool:
        """True when an environment cap hides instructions the hardware has."""
        return bool(self.caps)

    def missing(self, what: str) -> str:
        """A sentence naming the instructions ``what`` (a :data:`NATIVE` key) needs and does not find here."""
        hidden = [f for f in NATIVE[what] if f in self.hardware_flags]
        where = f"; hidden by {', '.join(self.caps)}" if hidden else ""
        return f"none of {', '.join(NATIVE[what])} in the CPU flags (torch kernels: {self.aten_capability}{where})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable, for the environment stamp and the machine card."""
        out = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        out["emulated"] = self.emulated
        return out


def capabilities_of(flags: frozenset[str], env: dict[str, str] | None = None,
                    aten_capability: str | None = None) -> CpuCapabilities:
    """:class:`CpuCapabilities` of ``flags`` under the caps in ``env`` (pure: tests pass both)."""
    effective, caps = mask_flags(flags, env)

    def has(what: str) -> bool:
        return any(f in effective for f in NATIVE[what])

    return CpuCapabilities(
        hardware_flags=tuple(sorted(flags)), effective_flags=tuple(sorted(effective)), caps=tuple(caps),
        aten_capability=aten_capability or torch.backends.cpu.get_cpu_capability(),
        native_bf16=has("bf16"), native_fp16=has("fp16"), int8_vnni=has("int8_vnni"), amx=has("amx"))


@functools.lru_cache(maxsize=1)
def cpu_capabilities() -> CpuCapabilities:
    """This machine's :class:`CpuCapabilities` (cached: the caps are read by torch once, at import)."""
    return capabilities_of(hardware_flags())


def effective_cpu_flags() -> frozenset[str]:
    """The flags of :func:`cpu_capabilities` as a set (what the precision gate and int8 choose from)."""
    return frozenset(cpu_capabilities().effective_flags)


def emulation_env(name: str) -> dict[str, str]:
    """The environment variables that make this machine's kernels behave as on a ``name`` CPU
    (:data:`EMULATIONS`); a ``ValueError`` naming the choices for an unknown name."""
    try:
        return dict(EMULATIONS[name.lower()])
    except KeyError:
        raise ValueError(f"LAB_EMULATE_ISA={name!r} is invalid: allowed: {', '.join(EMULATIONS)}") from None


def separate_inductor_cache(env: dict[str, str] | None = None) -> str | None:
    """Give a process with capped kernels its own Inductor cache (``TORCHINDUCTOR_CACHE_DIR``), unless one is set:
    Inductor's default cache is one folder per user, shared by every process, and code compiled under
    ``ATEN_CPU_CAPABILITY`` / ``ONEDNN_MAX_CPU_ISA`` must neither be reused by nor race with the host's own
    compiles (two native crashes inside compiled code were seen here while capped and native suites ran side
    by side on one cache). Called at import, before anything compiles; returns the folder it set."""
    env = os.environ if env is None else env
    tags = [env[v].lower() for v in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY") if env.get(v)]
    if not tags or env.get("TORCHINDUCTOR_CACHE_DIR"):
        return None
    folder = os.path.join(tempfile.gettempdir(), f"torchinductor_lab_as_{'_'.join(dict.fromkeys(tags))}")
    env["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder


separate_inductor_cache()

__all__ = [
    "allowed_flags", "capabilities_of", "cpu_capabilities", "CpuCapabilities", "effective_cpu_flags", "EMULATIONS",
    "emulation_env", "hardware_flags", "mask_flags", "NATIVE", "ONEDNN_ISA_LEVELS", "separate_inductor_cache",
]
