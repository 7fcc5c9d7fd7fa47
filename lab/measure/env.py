"""Environment stamp: what a timing was measured on (docs/architecture.md section 5, rule 6).

A speedup without its hardware is a rumour: bf16 and int8 speed depend on ISA flags, thread counts on a
shared 2-core box swing timings by several times, and a result must be traceable to the code (git SHA).
Re-exported by :mod:`lab.measure`.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lab.measure.cpu import cpu_capabilities, hardware_flags

# ---------------------------------------------------------------------------------- environment stamp

ISA_FLAGS_OF_INTEREST = (
    "avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile", "fma", "f16c",
)


def _slug(text: str) -> str:
    text = re.sub(r"\((r|tm)\)|\bcpu\b|@.*$", " ", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")[:60] or "unknown"


def _run(cmd: list[str], cwd: Path | None = None, timeout_s: float = 3.0) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def _cpu_info() -> tuple[str, tuple[str, ...]]:
    """The CPU model and the hardware ISA flags of interest (the flags themselves: :func:`hardware_flags`)."""
    model: str | None = None
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            model = value.strip()
            break
    model = model or platform.processor() or "unknown"
    flags = hardware_flags()
    return model, tuple(f for f in ISA_FLAGS_OF_INTEREST if f in flags)


@functools.lru_cache(maxsize=1)
def cpu_signature() -> str | None:
    """``"<vendor> family F model M stepping S"`` from ``/proc/cpuinfo``, or ``None`` where it is not there.

    Why beside the hardware id: a VM may show one model name ("AMD EPYC") for CPUs of one ISA class that are
    different cores (Zen 4 is family 25, Zen 5 family 26, and both have AVX-512 bf16). The id groups figures by
    what kernels can run; the signature says which silicon a figure came from."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if "cpu family" not in fields:
        return None
    return (f"{fields.get('vendor_id', 'unknown')} family {fields['cpu family']} model {fields.get('model', '?')}"
            f" stepping {fields.get('stepping', '?')}")


#: Paths whose changes do not make a checkout "dirty": benchmark results and the notebooks' executed copies written
#: into it are outputs, not code. Without this every benchmark after the first in a `make bench` stamped itself
#: dirty, and so did every notebook after the first in a `make notebooks-docs` (the copies written before it).
OUTPUT_PATHS = ("benchmarks/results", "docs/notebooks")


def git_state(root: Path) -> tuple[str, bool | None]:
    """SHA and dirty flag (tracked files changed outside ``OUTPUT_PATHS``) of the git checkout at ``root``;
    ``("unknown", None)`` when ``root`` is not a checkout or git is missing."""
    if shutil.which("git") is None:
        return "unknown", None
    sha = _run(["git", "rev-parse", "HEAD"], cwd=root)
    if not sha:
        return "unknown", None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                   *(f":(exclude){p}" for p in OUTPUT_PATHS)], cwd=root)
    return sha, (bool(status) if status is not None else None)


@functools.lru_cache(maxsize=1)
def _git_state() -> tuple[str, bool | None]:
    """:func:`git_state` of the checkout holding this package, as of the first call."""
    return git_state(Path(__file__).resolve().parents[2])


@functools.lru_cache(maxsize=1)
def _static_stamp() -> dict[str, Any]:
    cpu_model, isa = _cpu_info()
    sha, dirty = _git_state()
    smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], timeout_s=5.0) \
        if shutil.which("nvidia-smi") else None
    return {
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "numpy_version": np.__version__,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model,
        "cpu_signature": cpu_signature(),
        "isa_flags": list(isa),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # What the kernels may use (flags less ONEDNN_MAX_CPU_ISA's cap): a figure measured under an emulated
        # ISA must never pass for the hardware's own.
        "native": {k: v for k, v in cpu_capabilities().to_dict().items()
                   if k in ("native_bf16", "native_fp16", "int8_vnni", "amx", "emulated", "caps")},
        "logical_cores": os.cpu_count() or 1,
        "mkl_available": bool(torch.backends.mkl.is_available()),
        "mkldnn_available": bool(torch.backends.mkldnn.is_available()),
        "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda,
        "gpu_driver": smi.splitlines()[0] if smi else None,
        "git_sha": sha,
        "git_dirty": dirty,
    }


@functools.lru_cache(maxsize=8)
def _device_stamp(device: str) -> dict[str, Any]:
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        name = torch.cuda.get_device_name(idx)
        major, minor = torch.cuda.get_device_capability(idx)
        count = torch.cuda.device_count()
        return {"device": str(dev), "device_name": name, "gpu_compute_capability": f"{major}.{minor}",
                "gpu_count": count, "hardware_id": _slug(name) + (f"-x{count}" if count > 1 else "")}
    cpu_model, _ = _cpu_info()
    return {"device": str(dev), "device_name": cpu_model, "gpu_compute_capability": None,
            "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
            "hardware_id": f"{_slug(cpu_model)}{_isa_tag()}-{os.cpu_count() or 1}c{_emulation_suffix()}"}


def isa_class(flags: set[str] | frozenset[str] | tuple[str, ...]) -> str:
    """The x86 ISA class that decides which low-precision kernels are native: ``amx`` (AMX tiles: bf16 and
    int8 matrix units), ``avx512bf16`` (AVX-512 with bf16 dot products and VNNI, no AMX: e.g. AMD Zen 4),
    ``avx512`` (AVX-512 without bf16), ``avx2``, or ``""`` (none of these: another architecture)."""
    f = set(flags)
    if f & {"amx_tile", "amx_bf16", "amx_int8"}:
        return "amx"
    if "avx512_bf16" in f:
        return "avx512bf16"
    if "avx512f" in f:
        return "avx512"
    return "avx2" if "avx2" in f else ""


def _isa_tag() -> str:
    """``-<isa_class>`` in the CPU hardware id. Why: a VM often shows only a generic model name ("AMD EPYC"),
    and that name covered both a Zen 3 (AVX2 only: bf16 emulated at 0.02-0.45x) and a Zen 4 (native AVX-512
    bf16) under one id, so the doctor read the Zen 3 map as the Zen 4's own. The class keeps them apart."""
    cls = isa_class(hardware_flags())
    return f"-{cls}" if cls else ""


def _emulation_suffix() -> str:
    """``-as-avx2`` when ``ONEDNN_MAX_CPU_ISA`` / ``ATEN_CPU_CAPABILITY`` hide instructions: figures measured under
    an emulated ISA get a hardware id of their own, so they never land in (or pass for) the host's folder."""
    caps = cpu_capabilities().caps
    if not caps:
        return ""
    return "-as-" + "-".join(_slug(c.split("=", 1)[1]) for c in caps[:1])


#: The cached machine card's summary for a CPU hardware id, never measuring (:func:`lab.measure.machine.card_summary`,
#: set when that module is imported, which ``lab.measure`` always does: it imports this module, so no import back).
card_summary_of: Callable[[str], dict[str, Any] | None] | None = None


def environment_stamp(device: str | torch.device = "cpu") -> dict[str, Any]:
    """Everything needed to interpret a timing later: versions, CPU model and ISA flags (bf16/int8 speed
    depends on them), cores vs threads (shared 2-core boxes), GPU and driver, git SHA. JSON-serialisable.

    Static facts are cached (subprocess calls cost ms); thread counts are read fresh because runs change
    them. ``hardware_id`` is a short slug usable as a folder name (GPU name, or CPU model + cores)."""
    if str(device) == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    stamp = dict(_static_stamp())
    stamp["isa_flags"] = list(stamp["isa_flags"])
    stamp.update(_device_stamp(str(device)))
    try:  # fresh: taskset / cgroups can change it between runs
        stamp["usable_cores"] = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        stamp["usable_cores"] = os.cpu_count() or 1
    stamp["torch_threads"] = torch.get_num_threads()
    stamp["torch_interop_threads"] = torch.get_num_interop_threads()
    # This CPU's measured peaks (python -m lab machine), when cached: read, never measured; None without a card.
    stamp["machine_card"] = card_summary_of(_device_stamp("cpu")["hardware_id"]) if card_summary_of else None
    return stamp


def other_machine_note(figure_hardware_id: str | None, what: str = "these figures",
                       build: str = "python -m lab crossover --quick (about 2-3 minutes)") -> str | None:
    """``None`` when figures stamped ``figure_hardware_id`` were measured on this machine's class; else the
    sentence a page or report shows first: whose figures they are and how to build this machine's own.
    Never let another machine's map pass for this one's (bf16 is 1.5x on an AMX Xeon and 0.1x on Zen 3)."""
    mine = environment_stamp()["hardware_id"]
    if figure_hardware_id == mine:
        return None
    return (f"{what} were measured on {figure_hardware_id or 'an unknown machine'}, not on this machine ({mine}): "
            f"read them as that machine's. Build this machine's with `{build}`.")


__all__ = [
    "environment_stamp", "git_state", "ISA_FLAGS_OF_INTEREST", "other_machine_note",
]
