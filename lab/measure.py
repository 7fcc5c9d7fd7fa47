"""Measurement primitives: phase timing, memory, model size, MACs, environment stamp, statistics.

Everything the lab reports goes through here so that every technique is measured the same way
(DESIGN.md section 5): a monotonic clock with optional device sync, raw samples kept, warm-up excluded
downstream, speedups as ratios of medians with a bootstrap CI, and every record stamped with the
hardware it ran on. Taught in ``notebooks/00_tour``.

Units are in the names: ``*_ms`` milliseconds, ``*_mb`` mebibytes (2**20 bytes), ``*_bytes`` bytes.
"""

from __future__ import annotations

import functools
import io
import resource
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

MIB = float(2**20)

# ---------------------------------------------------------------------------------------------- timing


class PhaseTimer:
    """Per-step phase timing with a handful of clock reads per step.

    Why a custom timer: the loop needs *where* each step's time goes (data wait vs compute vs comm), not
    just the total, and it must cost ~nothing so it can stay on for every run. ``mark(phase)`` charges
    the time since the previous mark (or ``start_step``) to ``phase``; marking a phase twice in a step
    accumulates. ``total`` is the wall time ``start_step .. end_step``, so time that nobody marked shows
    up as ``total - sum(phases)`` instead of silently vanishing.

    On CUDA pass ``sync=torch.cuda.synchronize``: kernels are asynchronous, and without a sync before
    each read the time of a phase lands in whichever later phase happens to block.
    """

    def __init__(
        self,
        phases: Sequence[str] = ("data_wait", "forward", "backward", "optimizer", "comm"),
        sync: Callable[[], Any] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if "total" in phases:
            raise ValueError("'total' is reserved for the step wall time; pick another phase name")
        self.phases: tuple[str, ...] = tuple(phases)
        self._sync = sync
        self._clock = clock
        self._samples: dict[str, list[float]] = {p: [] for p in (*self.phases, "total")}
        self._current: dict[str, float] = {}
        self._t0: float | None = None
        self._last = 0.0

    def _now(self) -> float:
        if self._sync is not None:
            self._sync()
        return self._clock()

    def start_step(self) -> None:
        """Begin a step; everything until ``end_step`` counts towards this step's total."""
        self._t0 = self._last = self._now()
        self._current = dict.fromkeys(self.phases, 0.0)

    def mark(self, phase: str) -> None:
        """Charge the time since the previous mark (or ``start_step``) to ``phase``."""
        if self._t0 is None:
            raise RuntimeError("PhaseTimer.mark() called outside start_step()/end_step()")
        if phase not in self._current:
            raise KeyError(f"unknown phase {phase!r}; known: {self.phases}")
        now = self._now()
        self._current[phase] += now - self._last
        self._last = now

    def end_step(self) -> None:
        """Close the step and append one row (unmarked phases get 0.0)."""
        if self._t0 is None:
            raise RuntimeError("PhaseTimer.end_step() called without start_step()")
        now = self._now()
        for p in self.phases:
            self._samples[p].append(self._current[p] * 1e3)
        self._samples["total"].append((now - self._t0) * 1e3)
        self._t0 = None

    @property
    def n_steps(self) -> int:
        return len(self._samples["total"])

    def samples_ms(self) -> dict[str, list[float]]:
        """Copy of the raw per-step samples in ms, one list per phase plus ``total``."""
        return {k: list(v) for k, v in self._samples.items()}


# ---------------------------------------------------------------------------------------------- memory


def _is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


@functools.lru_cache(maxsize=1)
def _process() -> Any:
    import psutil  # keep import cost off module import

    return psutil.Process()


def rss_mb() -> float:
    """Current resident set size of this process (one /proc read, ~10 us)."""
    return _process().memory_info().rss / MIB


def peak_memory_mb(device: str | torch.device = "cpu") -> float:
    """High-water mark since process start (CPU: ru_maxrss) or since the last
    ``torch.cuda.reset_peak_memory_stats`` (CUDA: bytes allocated by tensors, not the caching pool)."""
    if _is_cuda(device):
        return torch.cuda.max_memory_allocated(torch.device(device)) / MIB
    # ru_maxrss is in KiB on Linux, bytes on macOS.
    scale = 1.0 if sys.platform == "darwin" else 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / MIB


class MemorySampler:
    """Peak memory during a region (e.g. the training loop), from construction or the last ``start()``.

    CPU: the kernel only keeps a lifetime RSS high-water mark, which one earlier big run would pin, so
    we sample RSS ourselves (call ``sample()`` every ~10 steps; each call is one /proc read). The peak is
    therefore a lower bound between samples. CUDA: the allocator tracks the exact peak for us, so
    ``sample()`` is cheap and ``start()`` just resets the counter.
    """

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.kind = "cuda" if self.device.type == "cuda" else "rss"
        self.baseline_mb = 0.0
        self._peak_mb = 0.0
        self.start()

    def start(self) -> MemorySampler:
        """(Re)start the region: record the baseline and reset the peak to it."""
        if self.kind == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline_mb = torch.cuda.memory_allocated(self.device) / MIB
        else:
            self.baseline_mb = rss_mb()
        self._peak_mb = self.baseline_mb
        return self

    def sample(self) -> float:
        """Read current usage, update the peak and return the current value in MB."""
        if self.kind == "cuda":
            return torch.cuda.memory_allocated(self.device) / MIB
        now = rss_mb()
        if now > self._peak_mb:
            self._peak_mb = now
        return now

    def peak_mb(self) -> float:
        """Peak since ``start()`` in MB (absolute, baseline included; subtract ``baseline_mb`` for the
        region's own growth)."""
        if self.kind == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / MIB
        return self._peak_mb

    def __enter__(self) -> MemorySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.sample()


MemoryTracker = MemorySampler  # alias: the name lab.train uses


# ----------------------------------------------------------------------------------------- model size


def count_params(model: nn.Module) -> int:
    """Number of parameters (shared tensors once). Pruning masks are buffers, so a pruned layer counts
    its ``weight_orig`` once. Dynamically quantized layers keep weights in packed params, not
    ``nn.Parameter``; those are counted through their ``weight()`` accessor."""
    total = sum(p.numel() for p in model.parameters())
    for w in _packed_weights(model):
        total += w.numel()
    return total


def count_nonzero_params(model: nn.Module) -> int:
    """Non-zero *effective* weights. For torch.nn.utils.prune reparametrisations the effective weight is
    ``module.weight`` (= ``weight_orig * weight_mask``), which is what the forward pass uses."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            tensor = param.detach()
            if name.endswith("_orig"):  # recompute: module.weight is only refreshed by a forward
                base = name[: -len("_orig")]
                mask = getattr(module, base + "_mask", None)
                effective = tensor * mask if isinstance(mask, torch.Tensor) else getattr(module, base, None)
                if isinstance(effective, torch.Tensor):
                    tensor = effective.detach()
            total += int(torch.count_nonzero(tensor).item())
    for w in _packed_weights(model):
        total += int(torch.count_nonzero(w.dequantize() if w.is_quantized else w).item())
    return total


def _packed_weights(model: nn.Module) -> Iterable[torch.Tensor]:
    """Weights of quantized modules that hide them from ``parameters()`` (best effort)."""
    for module in model.modules():
        if next(module.parameters(recurse=False), None) is not None:
            continue
        for attr in ("weight", "bias"):
            getter = getattr(type(module), attr, None)
            if callable(getter) and not isinstance(getter, property):
                try:
                    t = getattr(module, attr)()
                except Exception:  # arbitrary modules; absent weight is fine
                    continue
                if isinstance(t, torch.Tensor):
                    yield t


def serialized_size_bytes(model: nn.Module) -> int:
    """Bytes of ``torch.save(model.state_dict())``: what a checkpoint actually costs on disk (a pruned
    layer still stores ``weight_orig`` and the mask until ``prune.remove``)."""
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getbuffer().nbytes


# ----------------------------------------------------------------------------------------------- MACs

_RNN_GATES = {nn.LSTM: 4, nn.GRU: 3, nn.RNN: 1}


def _rnn_macs(module: nn.RNNBase, inputs: tuple) -> int:
    """MACs of one RNN forward: per layer, direction, time step and sample,
    gates * (in * h + h_out * h) (+ h * proj for LSTM projections). Elementwise gate math is ignored,
    as for every other layer."""
    x = inputs[0]
    if isinstance(x, nn.utils.rnn.PackedSequence):
        sample_steps = int(x.data.shape[0])  # sum of lengths = real (sample, step) pairs
    elif x.dim() == 2:  # unbatched (seq, feature)
        sample_steps = int(x.shape[0])
    else:
        sample_steps = int(x.shape[0] * x.shape[1])
    gates = next(g for cls, g in _RNN_GATES.items() if isinstance(module, cls))
    h = module.hidden_size
    proj = getattr(module, "proj_size", 0) or 0
    h_out = proj or h
    dirs = 2 if module.bidirectional else 1
    per_step = 0
    for layer in range(module.num_layers):
        in_size = module.input_size if layer == 0 else h_out * dirs
        per_step += dirs * (gates * (in_size * h + h_out * h) + (h * proj if proj else 0))
    return per_step * sample_steps


def count_macs(model: nn.Module, example_inputs: tuple) -> int:
    """Multiply-accumulates of ONE forward of ``example_inputs`` (divide by the batch for per-sample).

    FlopCounterMode sees aten matmuls/convs but not fused RNN kernels (aten.lstm counts 0 on CPU and
    cudnn RNNs count 0 on GPU, while CPU GRU is decomposed and partly counted), so for every nn.RNN/
    LSTM/GRU the counter's own figure inside the module is replaced by the closed formula. Runs in eval
    mode under no_grad (no BN statistics updated, no graph kept) and restores each module's mode.
    """
    from torch.utils.flop_counter import FlopCounterMode

    modes = {m: m.training for m in model.modules()}
    counter = FlopCounterMode(display=False)
    correction = {"flops": 0}
    stack: list[int] = []

    def pre(module: nn.Module, inputs: tuple) -> None:
        stack.append(counter.get_total_flops())

    def post(module: nn.Module, inputs: tuple, output: Any) -> None:
        counted = counter.get_total_flops() - stack.pop()
        correction["flops"] += 2 * _rnn_macs(module, inputs) - counted  # type: ignore[arg-type]

    handles = []
    for m in model.modules():
        if isinstance(m, tuple(_RNN_GATES)):
            handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    try:
        model.eval()
        with torch.no_grad(), counter:
            model(*example_inputs)
    finally:
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.train(training)
    return int((counter.get_total_flops() + correction["flops"]) // 2)


# Re-exported so that callers need one import for everything measured.
from lab.envinfo import ISA_FLAGS_OF_INTEREST, environment_stamp  # noqa: E402
from lab.stats import bootstrap_ci, bootstrap_ratio_ci, median, relative_spread, spread  # noqa: E402

__all__ = [
    "ISA_FLAGS_OF_INTEREST", "MemorySampler", "MemoryTracker", "PhaseTimer", "bootstrap_ci", "bootstrap_ratio_ci",
    "count_macs", "count_nonzero_params", "count_params", "environment_stamp", "median", "peak_memory_mb",
    "relative_spread", "rss_mb", "serialized_size_bytes", "spread",
]
