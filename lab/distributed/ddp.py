"""DistributedDataParallel in the one loop: rank-sliced batches, a comm hook that times the all-reduces,
the runtime the loop's ``ddp`` argument is, and a ring all-reduce by hand (the one notebook 05 teaches).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lab.config import DDPConfig
from lab.distributed.launch import LaunchInfo, detect_launch, init_process_group, resolve_backend


# ------------------------------------------------------------------------------- rank-aware batches
class RankSlicedLoader:
    """Every rank walks the same global batch order (same seed) and keeps its own contiguous slice.

    Why slices of one global batch: every sample is used exactly once per epoch across ranks, all ranks
    have the same number of steps (no uneven tail to hang on), and 2 ranks x batch b compute exactly the
    gradient of 1 process x batch 2b (the equivalence test). The effective batch is b x world_size."""

    def __init__(self, loader, rank: int, world_size: int) -> None:
        self.loader, self.rank, self.world_size = loader, rank, world_size

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        for batch in self.loader:
            yield tuple(t.tensor_split(self.world_size)[self.rank] for t in batch)


# ------------------------------------------------------------------------------ measured communication
@dataclass
class CommRecorder:
    """A DDP comm hook that does DDP's default all-reduce (mean) and records when each bucket's all-reduce
    was issued and completed, and how many bytes it carried.

    What the number means: gloo runs the all-reduce on its own thread while autograd continues, so the
    in-flight time overlaps backward. :meth:`end_step` returns the union of in-flight intervals in ms."""

    world_size: int
    intervals: list[tuple[float, float]] = field(default_factory=list)
    bytes_this_step: int = 0
    buckets_this_step: int = 0
    bytes_per_step: list[int] = field(default_factory=list)
    buckets_per_step: list[int] = field(default_factory=list)

    # No annotations on purpose: DDP compares them with the real classes, and this module's postponed
    # (string) annotations would fail that check. Signature: (state, dist.GradBucket) -> Future[Tensor].
    def hook(self, state, bucket):  # noqa: ANN001, ANN201
        buf = bucket.buffer()
        self.bytes_this_step += buf.numel() * buf.element_size()
        self.buckets_this_step += 1
        t0 = time.perf_counter()
        buf.div_(self.world_size)
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def done(f: torch.futures.Future) -> torch.Tensor:
            self.intervals.append((t0, time.perf_counter()))
            return f.value()[0]

        return fut.then(done)

    def end_step(self) -> float:
        """Close a step: record bytes/buckets and return the all-reduce in-flight wall time in ms."""
        total, end = 0.0, float("-inf")
        for a, b in sorted(self.intervals):
            if b > end:
                total += b - max(a, end)
                end = b
        self.bytes_per_step.append(self.bytes_this_step)
        self.buckets_per_step.append(self.buckets_this_step)
        self.intervals, self.bytes_this_step, self.buckets_this_step = [], 0, 0
        return total * 1e3


@dataclass
class DDPRuntime:
    """What :func:`lab.loop.fit` needs to train data-parallel: no_sync for accumulation, the recorder."""

    info: LaunchInfo
    backend: str
    grad_accum_steps: int = 1
    recorder: CommRecorder | None = None
    #: buffers :func:`wrap` replaced by contiguous copies (:func:`contiguous_buffers`)
    buffers_made_contiguous: list[str] = field(default_factory=list)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Skip the all-reduce on accumulation micro-steps (gradients add up locally; one sync per step)."""
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()


WHY_CONTIGUOUS_BUFFERS = (
    "DDP broadcasts every buffer from rank 0 before each forward and writes it back through a flat view laid out as "
    "the buffer's shape; a buffer whose strides differ from that layout (a transposed view such as "
    "pe.unsqueeze(0).transpose(0, 1), even where is_contiguous() says True) fails there ('some elements of the input "
    "tensor and the written-to tensor refer to a single memory location'), so each was replaced by a contiguous copy "
    "with the same values (.contiguous() would return it unchanged)")


def _row_major(t: torch.Tensor) -> bool:
    """Strides exactly those of a fresh tensor of ``t``'s shape (size-1 dimensions included, unlike
    ``is_contiguous()``)."""
    expected = 1
    for size, stride in zip(reversed(t.shape), reversed(t.stride()), strict=True):
        if stride != expected:
            return False
        expected *= size
    return True


def contiguous_buffers(model: nn.Module) -> list[str]:
    """Replace, in place, every buffer of ``model`` not laid out row-major by a row-major copy (the same values;
    a buffer registered in several modules gets one copy), so DDP's buffer broadcast can write into it
    (:data:`WHY_CONTIGUOUS_BUFFERS`); returns the buffers replaced (each once, by its first name)."""
    copies: dict[int, torch.Tensor] = {}
    names = []
    for prefix, module in model.named_modules():
        for key, buf in list(module._buffers.items()):
            if buf is None or buf.numel() <= 1 or (id(buf) not in copies and _row_major(buf)):
                continue
            if id(buf) not in copies:
                copies[id(buf)] = buf.clone(memory_format=torch.contiguous_format)
                names.append(f"{prefix}.{key}" if prefix else key)
            module._buffers[key] = copies[id(buf)]
    return names


def wrap(model: nn.Module, runtime: DDPRuntime, cfg: DDPConfig, device: torch.device) -> nn.Module:
    """Wrap in DistributedDataParallel with the config's bucket size and a recording comm hook; buffers DDP could
    not broadcast into are made contiguous first (``runtime.buffers_made_contiguous``)."""
    if not runtime.info.distributed:
        return model
    runtime.buffers_made_contiguous += [n for n in contiguous_buffers(model)
                                        if n not in runtime.buffers_made_contiguous]
    ids = [device.index if device.index is not None else runtime.info.local_rank] if device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=cfg.bucket_cap_mb)
    runtime.recorder = CommRecorder(runtime.info.world_size)
    ddp.register_comm_hook(None, runtime.recorder.hook)
    return ddp


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


def setup_for_run(cfg, device: torch.device) -> tuple[DDPRuntime | None, bool]:
    """Called by the data-parallel launcher's ``join`` in every rank: (runtime or None when single-process,
    whether we created the process group and must destroy it)."""
    info = detect_launch()
    if cfg.ddp.world_size > 1 and info.world_size != cfg.ddp.world_size:
        raise ValueError(f"ddp.world_size={cfg.ddp.world_size} is invalid here: the launcher started "
                         f"{info.world_size} process(es)")
    if not info.distributed and cfg.ddp.grad_accum_steps == 1:
        return None, False
    backend = resolve_backend(cfg.ddp.backend, device)
    created = init_process_group(info, backend, cfg.ddp.timeout_s) if info.distributed else False
    return DDPRuntime(info, backend, cfg.ddp.grad_accum_steps), created


def describe(runtime: DDPRuntime, cfg, batch_size: int, lr: float) -> dict[str, Any]:
    """What ran, for ``result.details["distributed"]``: ranks, backend, threads, effective batch and bytes per step.

    The scaling rule is stated, not applied: the effective batch is per-rank batch x world size x accum
    steps; the common linear rule would scale the lr by the same factor (with warm-up), which changes the
    optimisation and is left to the user (``--lr``)."""
    info, rec = runtime.info, runtime.recorder
    effective = batch_size * info.world_size * runtime.grad_accum_steps
    return {
        "rank": info.rank, "world_size": info.world_size, "launcher": info.launcher, "backend": runtime.backend,
        "threads_per_rank": torch.get_num_threads(), "grad_accum_steps": runtime.grad_accum_steps,
        "bucket_cap_mb": cfg.ddp.bucket_cap_mb, "per_rank_batch": batch_size, "effective_batch": effective,
        "lr": lr, "lr_linear_rule": lr * effective / batch_size,
        "bytes_per_step": rec.bytes_per_step[-1] if rec and rec.bytes_per_step else 0,
        "buckets_per_step": rec.buckets_per_step[-1] if rec and rec.buckets_per_step else 0,
        "comm_meaning": "wall ms the bucket all-reduces were in flight (issue to completion, union); overlaps "
                        "backward, so the backward phase excludes it",
        "buffers_made_contiguous": list(runtime.buffers_made_contiguous),
    }


def ring_allreduce(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Ring all-reduce simulated in one process: p-1 reduce-scatter hops, then p-1 all-gather hops; each
    worker sends only 1/p of the data per hop, which is why the bandwidth term barely grows with p."""
    p = len(tensors)
    chunks = [list(t.clone().flatten().tensor_split(p)) for t in tensors]
    for s in range(p - 1):  # reduce-scatter: worker i sends chunk (i - s) to worker i+1
        sent = [chunks[i][(i - s) % p].clone() for i in range(p)]
        for i in range(p):
            chunks[(i + 1) % p][(i - s) % p] += sent[i]
    for s in range(p - 1):  # all-gather: the fully reduced chunk (i + 1 - s) travels round the ring
        sent = [chunks[i][(i + 1 - s) % p].clone() for i in range(p)]
        for i in range(p):
            chunks[(i + 1) % p][(i + 1 - s) % p] = sent[i]
    return [torch.cat(c).view_as(t) for c, t in zip(chunks, tensors, strict=True)]


def measure_allreduce_s(sizes_bytes: Sequence[int], repeats: int = 10) -> list[float]:
    """Best-of-``repeats`` wall time of a blocking fp32 all-reduce per message size, in the current group.

    Why the minimum: on a shared machine a descheduled peer adds milliseconds at random; the fastest
    repeat is the link's cost, which is what the alpha-beta model describes."""
    bufs = [torch.ones(max(1, size // 4)) for size in sizes_bytes]
    for buf in bufs:  # warm-up: first calls allocate gloo's buffers
        dist.all_reduce(buf)
    dist.barrier()
    best = [float("inf")] * len(bufs)
    for _ in range(repeats):  # round-robin over sizes, so a burst of load does not land on one size only
        for i, buf in enumerate(bufs):
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            best[i] = min(best[i], time.perf_counter() - t0)
    return best

__all__ = [
    "CommRecorder", "contiguous_buffers", "DDPRuntime", "describe", "measure_allreduce_s", "RankSlicedLoader",
    "ring_allreduce", "setup_for_run", "unwrap", "WHY_CONTIGUOUS_BUFFERS", "wrap",
]
