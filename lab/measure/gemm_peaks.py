"""The GEMM peaks of the machine card (:mod:`lab.measure.machine`): one n x n GEMM per dtype, its size fitted to a
time budget, timed interleaved at 1 thread and all usable cores. Kept apart so the card's module stays short.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lab.measure.stats import bootstrap_ratio_ci, median
from lab.measure.timing import block_ms, interleaved_ms

GEMM_DTYPES = ("fp32", "bf16", "fp16", "int8")
_FLOAT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
Progress = Callable[[str], Any]


def _int8_kernels(n: int) -> list[tuple[Callable[[], torch.Tensor], str]]:
    """Every int8 x int8 GEMM this build runs at n x n: ``torch._int_mm`` (int32 out) and the quantized linear of
    ``torch.ao`` (u8 x s8, int32 accumulation, quint8 out) on the current quantized engine (fbgemm / x86 /
    onednn; engine "none": not offered)."""
    out: list[tuple[Callable[[], torch.Tensor], str]] = []
    try:  # probed at 32 x 32: at n a reference-path _int_mm would cost seconds just to be offered
        small = torch.ones(32, 32, dtype=torch.int8)
        if torch._int_mm(small, small).dtype == torch.int32:
            a, b = (torch.randint(-64, 64, (n, n), dtype=torch.int8) for _ in range(2))
            out.append(((lambda: torch._int_mm(a, b)), "torch._int_mm (int8 x int8 -> int32)"))
    except (RuntimeError, AttributeError, NotImplementedError):
        pass
    engine = torch.backends.quantized.engine
    try:
        x = torch.quantize_per_tensor(torch.randn(n, n), 0.05, 64, torch.quint8)
        w = torch.quantize_per_tensor(torch.randn(n, n), 0.05, 0, torch.qint8)
        packed = torch.ops.quantized.linear_prepack(w, None)
        out.append(((lambda: torch.ops.quantized.linear(x, packed, 0.1, 64)),
                    f"torch.ops.quantized.linear ({engine}: u8 x s8 -> int32 accumulation -> quint8)"))
    except (RuntimeError, NotImplementedError):
        pass
    return out


#: The size at which the int8 kernels race (:func:`int8_gemm`): small enough that a reference-path kernel
#: (``_int_mm`` without VNNI: ~50x slower than fp32 on an AVX2 EPYC) costs ~20 ms.
INT8_RACE_N = 256
_int8_winner: list[str] = []  # the race's winner, once per process


def int8_gemm(n: int) -> tuple[Callable[[], torch.Tensor], str]:
    """``(fn, name)``: an n x n int8 x int8 GEMM on the **fastest** int8 kernel this machine has (raced once per
    process at :data:`INT8_RACE_N`). Why a race: the lab's int8 techniques run the quantized linear (fbgemm /
    oneDNN), and ``torch._int_mm`` is fast only with VNNI / AMX; on an AVX2-only EPYC it took 219 ms at 512 vs
    2.5 ms for the quantized linear (4.4 ms fp32), so a card timing ``_int_mm`` alone read int8 at 0.04x fp32
    and told users "int8 cannot pay" where dynamic int8 runs 1.5-2x. Both are int8 kernels: never an fp32 GEMM
    on int8 values. A ``ValueError`` when neither runs."""
    kernels = _int8_kernels(n)
    if not kernels:
        raise ValueError("no int8 GEMM kernel runs here (no torch._int_mm, quantized engine "
                         f"{torch.backends.quantized.engine!r})")
    if len(kernels) > 1:
        if not _int8_winner:
            times = {}
            for fn, name in _int8_kernels(INT8_RACE_N):
                fn()
                times[name] = min(block_ms(fn) for _ in range(3))
            _int8_winner.append(min(times, key=times.__getitem__))
        kernels = [k for k in kernels if k[1] == _int8_winner[0]] or kernels
    return kernels[0]


def gemm(dtype: str, n: int) -> tuple[Callable[[], torch.Tensor], str]:
    """``(fn, kernel name)``: one n x n GEMM in ``dtype`` (one of :data:`GEMM_DTYPES`)."""
    if dtype == "int8":
        return int8_gemm(n)
    a, b = (torch.randn(n, n).to(_FLOAT[dtype]) for _ in range(2))
    return (lambda: torch.mm(a, b)), f"torch.mm ({dtype})"


def _fit_size(dtype: str, max_n: int, budget_ms: float, min_n: int = 128) -> int:
    """The largest n in max_n, max_n/2, ... whose call, extrapolated (n^3) from a 256 probe, fits ``budget_ms``:
    an emulated bf16 GEMM is ~60x an fp32 one, and the card must finish in seconds anyway."""
    n0 = min(256, max_n)
    fn, _ = gemm(dtype, n0)
    fn()
    t = block_ms(fn)
    n = max_n
    while n > min_n and t * (n / n0) ** 3 > budget_ms:
        n //= 2
    return n


def _repeat(fn: Callable[[], Any], k: int) -> Callable[[], None]:
    def run() -> None:  # k calls in one timed block, no output kept
        for _ in range(k):
            fn()
    return run


def measure_gemm(threads: list[int], quick: bool, say: Progress, deadline: float,
                  notes: list[str]) -> tuple[dict, dict, dict, str]:
    max_n, budget, block, repeats = (512, 30.0, 30.0, 3) if quick else (1024, 100.0, 100.0, 5)
    torch.set_num_threads(1)
    say("GEMM: fitting each dtype's size to the time budget")
    sizes, kernels, calls = {}, {}, {}
    for dt in GEMM_DTYPES:
        try:
            sizes[dt] = _fit_size(dt, max_n, budget)
            calls[dt], kernels[dt] = gemm(dt, sizes[dt])
        except Exception as exc:  # a dtype this build / CPU cannot multiply: noted, not fatal
            notes.append(f"{dt} GEMM not timed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    gflops: dict[str, dict[str, float | None]] = {dt: {"1": None, "all": None} for dt in GEMM_DTYPES}
    per_sample: dict[str, list[float]] = {}
    for t in threads:
        torch.set_num_threads(t)
        key = "1" if t == 1 else "all"
        say(f"GEMM at {t} thread(s): " + ", ".join(f"{dt} n={sizes[dt]}" for dt in calls))
        arms, ks = {}, {}
        for dt, fn in calls.items():
            fn()
            ks[dt] = max(1, min(1000, round(block / max(block_ms(fn), 1e-3))))
            arms[dt] = _repeat(fn, ks[dt])
        errors: dict[str, str] = {}
        samples = interleaved_ms(arms, repeats=repeats, warmup=1, deadline=deadline, errors=errors)
        notes.extend(f"{dt} GEMM at {t} thread(s) failed: {e}" for dt, e in errors.items())
        for dt, ms in samples.items():
            rates = [2 * sizes[dt] ** 3 / (m / ks[dt] / 1e3) / 1e9 for m in ms]
            gflops[dt][key] = median(rates)
            if t == 1:
                per_sample[dt] = rates
    if threads == [1]:  # one usable core: "all" is the 1-thread figure
        for v in gflops.values():
            v["all"] = v["1"]
    vs = {dt: list(bootstrap_ratio_ci(per_sample[dt], per_sample["fp32"]))
          for dt in GEMM_DTYPES if dt != "fp32" and dt in per_sample and "fp32" in per_sample}
    return gflops, vs, {"gemm_n": sizes}, kernels.get("int8", "not timed")


__all__ = ["GEMM_DTYPES", "INT8_RACE_N", "gemm", "int8_gemm", "measure_gemm"]
