"""Memory: process RSS, peak since start, a sampler for the peak of one region (the training loop), and the bytes
of one training step by role at the tensor level (parameters, gradients, optimizer state, activations saved for
backward).

Why by role as well as RSS: the process's resident set says whether a run fits, not where its bytes go, and each
memory lever shrinks one role (activation checkpointing the saved activations, low-bit optimizer state the
optimizer's moments). The role counts are exact byte counts of the tensors' storages, each byte counted once: a
view or a tied weight shares its storage's bytes, a view of a larger buffer counts only the span it can reach
(a batch sliced from the in-memory training split is the batch, not the split), and a tensor subclass that
flattens into inner tensors (torchao's 8-bit optimizer state) is counted by those.

Units are in the names: ``*_mb`` mebibytes (2**20 bytes), ``*_bytes`` bytes.
"""

from __future__ import annotations

import functools
import resource
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

import torch

MIB = float(2**20)


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


# ------------------------------------------------------------------------------------------ bytes by role


def _leaves(obj: Any) -> Iterator[torch.Tensor]:
    """The plain tensors inside ``obj``: a tensor, a tensor subclass's inner tensors (``__tensor_flatten__``), a
    ``DTensor``'s local shard (what this rank holds), or the tensors of a (nested) dict / list / tuple; anything
    else holds none."""
    if isinstance(obj, torch.Tensor):
        dtensor = sys.modules.get("torch.distributed.tensor")  # imported by whoever made one, else none exists
        if dtensor is not None and isinstance(obj, dtensor.DTensor):  # a sharded parameter (FSDP2): this rank's part
            yield from _leaves(obj.to_local())
            return
        flatten = getattr(type(obj), "__tensor_flatten__", None)
        if flatten is not None and type(obj) is not torch.Tensor and not isinstance(obj, torch.nn.Parameter):
            for name in flatten(obj)[0]:
                yield from _leaves(getattr(obj, name))
        else:
            yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _leaves(v)


def _span(t: torch.Tensor) -> tuple[int, int, int] | None:
    """``(storage, first byte, end byte)`` of the storage bytes ``t`` can reach; ``None`` for an empty tensor or
    one without a storage of its own (meta, sparse)."""
    if t.numel() == 0 or t.layout != torch.strided or t.device.type == "meta":
        return None
    try:
        key = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    item = t.element_size()
    start = t.storage_offset() * item
    return key, start, start + (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))) * item


class ByteCount:
    """Distinct bytes of a set of tensors: per storage, the union of the byte spans they reach. ``exclude``
    leaves out whole storages (a parameter saved for backward is counted as a parameter, not an activation)."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._spans: dict[int, list[tuple[int, int]]] = {}
        self._excluded = {s[0] for t in _leaves(list(exclude)) if (s := _span(t)) is not None}

    def exclude(self, *objs: Any) -> ByteCount:
        """Leave out the storages of ``objs`` from now on."""
        self._excluded.update(s[0] for t in _leaves(list(objs)) if (s := _span(t)) is not None)
        return self

    def add(self, *objs: Any) -> ByteCount:
        for t in _leaves(list(objs)):
            span = _span(t)
            if span is not None and span[0] not in self._excluded:
                self._spans.setdefault(span[0], []).append(span[1:])
        return self

    @property
    def bytes(self) -> int:
        total = 0
        for spans in self._spans.values():
            end = -1
            for a, b in sorted(spans):
                if b > end:
                    total += b - max(a, end)
                    end = b
        return total

    @property
    def tensors(self) -> int:
        """Distinct storages counted."""
        return len(self._spans)


def tensor_bytes(*objs: Any) -> int:
    """Distinct bytes of the tensors in ``objs`` (tensors, subclasses, dicts / lists of them)."""
    return ByteCount().add(*objs).bytes


def param_bytes(model: torch.nn.Module) -> int:
    """Bytes of ``model``'s parameters (a tied weight once)."""
    return tensor_bytes(list(model.parameters()))


def grad_bytes(model: torch.nn.Module) -> int:
    """Bytes of the gradients ``model``'s parameters hold now (``None`` gradients hold none)."""
    return tensor_bytes([p.grad for p in model.parameters() if p.grad is not None])


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of ``optimizer``'s per-parameter state (Adam's moments and step counts; torchao's 8-bit and 4-bit
    state by its codes, scales and quantization map, a map shared by every state tensor counted once)."""
    return tensor_bytes(list(optimizer.state.values()))


class SavedTensorBytes:
    """Within ``with``: the distinct bytes of the tensors autograd saves for backward
    (``torch.autograd.graph.saved_tensors_hooks``), storages in ``exclude`` (the parameters) left out, and those
    of ``live``'s parameters as they are registered at each save (FSDP2 registers a block's all-gathered full
    parameters only while it runs: a view of one saved for backward is a parameter's bytes, not an activation's),
    plus what :meth:`note` adds. Why :meth:`note`: a non-reentrant activation checkpoint saves nothing through the hooks
    while its block runs (its own hook keeps no tensor) but keeps the block's inputs for the recompute; it notes
    them here, so a checkpointed step's count is what it really keeps. The model's input batch is counted when
    its first layer saves it (what the step holds for backward)."""

    _active: ClassVar[list[SavedTensorBytes]] = []

    def __init__(self, exclude: Iterable[torch.Tensor] = (), *, live: torch.nn.Module | None = None) -> None:
        self.count = ByteCount(exclude)
        self.live = live
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if self.live is not None:  # the parameters registered now: FSDP2's full copies while their block runs
            self.count.exclude(list(self.live.parameters()))
        if not isinstance(t, torch.nn.Parameter):  # a parameter (or a full copy of one) is counted as a parameter
            self.count.add(t)
        return t

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    @classmethod
    def active(cls) -> SavedTensorBytes | None:
        """The innermost count in progress (``None``: none)."""
        return cls._active[-1] if cls._active else None

    def note(self, *objs: Any) -> None:
        """Count tensors kept for backward outside autograd's saved tensors (a checkpoint's inputs)."""
        self.count.add(*objs)

    @property
    def bytes(self) -> int:
        return self.count.bytes

    def __enter__(self) -> SavedTensorBytes:
        self._hooks.__enter__()
        self._active.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._active.remove(self)
        self._hooks.__exit__(*exc)


class AllocationHighWater:
    """Within ``with``: the highest tensor bytes allocated beyond those allocated at its start (:attr:`bytes`,
    set on exit): the region's own high-water mark (activations, gradients, the optimizer's temporaries, an op's
    workspace, all at once at their worst moment).

    Why: the four roles are what a step keeps; what must fit is the moment the most is alive, which adds the
    transients no role holds (a matmul's output before it is saved, the optimizer's scratch, a checkpointed
    block's recompute) and leaves out what is freed before the rest exists. CUDA: the allocator's own peak
    (``max_memory_allocated``; it resets the peak statistics). CPU: the allocator's events the profiler records
    with ``profile_memory=True`` (every tensor allocation and free, signed bytes), summed in time order; the
    process RSS would add ~0.3 GB of runtime no step changes. A context manager (not only a function) so that a
    region that is not one call (a step policy's first forward to its optimizer step) can be measured."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.bytes: int | None = None
        self._start = 0
        self._prof: Any = None

    def __enter__(self) -> AllocationHighWater:
        if _is_cuda(self.device):
            torch.cuda.synchronize(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        from torch.profiler import ProfilerActivity, profile  # keep the profiler's import off module import

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if _is_cuda(self.device):
            torch.cuda.synchronize(self.device)
            self.bytes = max(torch.cuda.max_memory_allocated(self.device) - self._start, 0)
            return
        prof, self._prof = self._prof, None
        prof.__exit__(*exc)
        events = [e for e in prof.profiler.kineto_results.events()
                  if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
        now = high = 0
        for e in sorted(events, key=lambda e: e.start_ns()):
            now += e.nbytes()
            high = max(high, now)
        self.bytes = high


def allocation_high_water(fn: Callable[[], Any], device: str | torch.device = "cpu") -> tuple[Any, int]:
    """Run ``fn()``; return its result and its :class:`AllocationHighWater` (the highest tensor bytes allocated
    during it beyond those allocated at its start)."""
    with AllocationHighWater(device) as hw:
        out = fn()
    return out, int(hw.bytes or 0)


class StepPeak:
    """Within ``with`` (one training step): the step's real peak in tensor bytes, :attr:`bytes` on exit: the
    parameters and optimizer state alive at its start (:attr:`at_rest`) plus its :class:`AllocationHighWater`
    (:attr:`high`). The one definition of "a step's peak" that ``benchmarks/memory.py --largest`` and a run's
    ``details["memory"]["step_peak_bytes"]`` (:class:`lab.memory.roles.CountingStep`, what ``--memory-budget``
    holds on CPU) share.

    Why not the sum of the four roles: they never all coexist at their sizes (a plain step frees saved activations
    as the gradients appear: the roles over-count it at large sizes), and a checkpointed step recomputes a block's
    activations in backward, which no role holds (the roles under-count it: 8-28 MiB at the transformer's rungs
    m..xl at batch 32, docs/memory.md). Measure it on a step after the first: the first creates the optimizer state."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 device: str | torch.device = "cpu") -> None:
        self.model, self.optimizer = model, optimizer
        self._hw = AllocationHighWater(device)
        self.at_rest = 0
        self.high: int | None = None
        self.bytes: int | None = None

    def __enter__(self) -> StepPeak:
        self.at_rest = param_bytes(self.model) + optimizer_state_bytes(self.optimizer)
        self._hw.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hw.__exit__(*exc)
        self.high = int(self._hw.bytes or 0)
        self.bytes = self.at_rest + self.high


__all__ = [
    "AllocationHighWater", "ByteCount", "MemorySampler", "MIB", "SavedTensorBytes", "StepPeak",
    "allocation_high_water",
    "grad_bytes", "optimizer_state_bytes", "param_bytes",
    "peak_memory_mb", "rss_mb", "tensor_bytes",
]
