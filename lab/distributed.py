"""Data-parallel training (DDP): launch, rank-aware batches, measured communication, failures that end.

Why this module: the seed's claim ("4 GPUs cut training time to 1/3-1/4, but communication makes small
runs scale poorly") can only be checked by running real DistributedDataParallel and timing its
all-reduces. The same code path runs three ways:

- ``torchrun --nproc-per-node 2 -m lab run ...`` (or SLURM's ``srun``; see docs/distributed.md),
- :func:`spawn` / :func:`spawn_run` from a notebook, test or dashboard (``torch.multiprocessing`` with a
  free port, gloo on CPU), and ``lab.run(cfg)`` with ``cfg.ddp.world_size > 1`` which calls it,
- a single process, where nothing here is used and the loop is the plain one.

Every process group is created with ``timeout=cfg.ddp.timeout_s``: a rank that dies makes the launcher
fail naming the rank, a rank that hangs is cut off by the timeout, never a silent hang.
notebooks/05_distributed.ipynb teaches it; lab/scaling_model.py projects the measurements to N workers.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lab.config import DDPConfig


@dataclass(frozen=True)
class LaunchInfo:
    """Who this process is: read from torchrun's, SLURM's or :func:`spawn`'s environment variables."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    launcher: str = "single"  # single | torchrun | slurm | spawn

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def detect_launch(env: dict[str, str] | None = None) -> LaunchInfo:
    """torchrun (and :func:`spawn`) set RANK/WORLD_SIZE/LOCAL_RANK; under ``srun`` SLURM sets SLURM_PROCID/
    SLURM_NTASKS/SLURM_LOCALID and the sbatch script exports MASTER_ADDR/MASTER_PORT."""
    env = dict(os.environ) if env is None else env
    if "WORLD_SIZE" in env and "RANK" in env:
        launcher = env.get("LAB_LAUNCHER") or ("torchrun" if "TORCHELASTIC_RUN_ID" in env else "env")
        return LaunchInfo(int(env["RANK"]), int(env.get("LOCAL_RANK", env["RANK"])), int(env["WORLD_SIZE"]),
                          launcher)
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and int(env["SLURM_NTASKS"]) > 1:
        return LaunchInfo(int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", 0)), int(env["SLURM_NTASKS"]),
                          "slurm")
    return LaunchInfo()


def resolve_backend(backend: str, device: torch.device) -> str:
    """``auto`` is NCCL on CUDA and gloo on CPU; NCCL without CUDA is an error, not a fallback."""
    if backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise ValueError(f"ddp.backend='nccl' is invalid on device {device.type!r}: NCCL needs CUDA; use gloo or auto")
    if backend not in DDPConfig.BACKENDS:
        raise ValueError(f"ddp.backend={backend!r} is invalid: allowed: {', '.join(DDPConfig.BACKENDS)}")
    return backend


def init_process_group(info: LaunchInfo, backend: str, timeout_s: float) -> bool:
    """Join the process group (env:// rendezvous) unless already in one; returns whether we created it.

    The timeout is what turns a dead or hung peer into an exception instead of a job that never ends."""
    if dist.is_initialized():
        return False
    if info.launcher == "slurm":  # srun does not set the torch variables; map SLURM's
        os.environ.setdefault("RANK", str(info.rank))
        os.environ.setdefault("WORLD_SIZE", str(info.world_size))
        os.environ.setdefault("LOCAL_RANK", str(info.local_rank))
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ValueError(f"cannot reach the rendezvous: {', '.join(missing)} not set (torchrun sets them; "
                         "under SLURM export them in the sbatch script, see docs/distributed.md)")
    try:
        dist.init_process_group(backend, rank=info.rank, world_size=info.world_size,
                                timeout=timedelta(seconds=timeout_s))
    except Exception as exc:  # DistStoreError / RuntimeError: say where we tried to go
        raise RuntimeError(f"rank {info.rank}: rendezvous at {os.environ['MASTER_ADDR']}:"
                           f"{os.environ['MASTER_PORT']} failed within {timeout_s:g} s: {exc}") from exc
    return True


def free_port() -> int:
    """A TCP port nobody listens on now (there is a small race until the store binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------- spawn
def _spawn_entry(rank: int, fn: Callable[..., Any], world_size: int, port: int, args: tuple, out_dir: str,
                 threads_per_rank: int) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "LAB_LAUNCHER": "spawn"})
    torch.set_num_threads(threads_per_rank)  # ranks x threads must not exceed the cores
    try:
        value = fn(*args)
        torch.save(value, Path(out_dir) / f"rank{rank}.pt")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (), *, timeout_s: float = 120.0,
          threads_per_rank: int = 1) -> list[Any]:
    """Run ``fn(*args)`` in ``world_size`` fresh processes (spawn start method) and return each rank's value.

    ``fn`` must be importable (a module-level function) and calls :func:`init_from_env` itself. If any rank
    raises or is killed, the others are terminated and the error names the rank; ``timeout_s`` bounds the
    whole job, so a hang ends too."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size} is invalid: must be >= 1")
    with tempfile.TemporaryDirectory(prefix="lab-spawn-") as out_dir:
        ctx = mp.start_processes(_spawn_entry, args=(fn, world_size, free_port(), tuple(args), out_dir,
                                                     threads_per_rank),
                                 nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=0.5):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"distributed job did not finish within {timeout_s:g} s; all ranks stopped")
        except mp.ProcessRaisedException as exc:
            raise RuntimeError(f"rank {exc.error_index} raised: {str(exc).strip().splitlines()[-1]}") from exc
        except mp.ProcessExitedException as exc:
            raise RuntimeError(f"rank {exc.error_index} died (exit code {exc.exit_code}); "
                               "the other ranks were stopped") from exc
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join(5)
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


def init_from_env(timeout_s: float = 60.0, backend: str = "gloo") -> LaunchInfo:
    """For worker functions run by :func:`spawn` or torchrun: join the group described by the environment."""
    info = detect_launch()
    if info.distributed:
        init_process_group(info, backend, timeout_s)
    return info


def _run_worker(cfg_dict: dict[str, Any], setup: Callable[[], None] | None) -> dict[str, Any] | None:
    from lab.config import RunConfig
    from lab.train import run

    if setup is not None:
        setup()
    result = run(RunConfig.from_dict(cfg_dict), on_error="raise")
    return result.to_dict() if detect_launch().rank == 0 else None


def spawn_run(cfg, *, setup: Callable[[], None] | None = None, timeout_s: float | None = None):
    """``lab.run(cfg)`` on ``cfg.ddp.world_size`` spawned CPU ranks; returns rank 0's RunResult.

    ``setup`` (importable, no arguments) runs first in every rank, e.g. to register a user workload
    that a fresh process would not know."""
    from lab.result import RunResult

    n = cfg.ddp.world_size
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // n)
    values = spawn(_run_worker, n, (cfg.to_dict(), setup), timeout_s=timeout_s or cfg.ddp.timeout_s + 120,
                   threads_per_rank=threads)
    return RunResult.from_dict(values[0])


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
    """What :func:`lab.train.fit` needs to train data-parallel: no_sync for accumulation, the recorder."""

    info: LaunchInfo
    backend: str
    grad_accum_steps: int = 1
    recorder: CommRecorder | None = None

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Skip the all-reduce on accumulation micro-steps (gradients add up locally; one sync per step)."""
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()


def wrap(model: nn.Module, runtime: DDPRuntime, cfg: DDPConfig, device: torch.device) -> nn.Module:
    """Wrap in DistributedDataParallel with the config's bucket size and a recording comm hook."""
    if not runtime.info.distributed:
        return model
    ids = [device.index if device.index is not None else runtime.info.local_rank] if device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=cfg.bucket_cap_mb)
    runtime.recorder = CommRecorder(runtime.info.world_size)
    ddp.register_comm_hook(None, runtime.recorder.hook)
    return ddp


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


def setup_for_run(cfg, device: torch.device) -> tuple[DDPRuntime | None, bool]:
    """Called by ``lab.train.run`` in every rank: (runtime or None when single-process, whether we created
    the process group and must destroy it)."""
    info = detect_launch()
    if cfg.ddp.world_size > 1 and info.world_size != cfg.ddp.world_size:
        raise ValueError(f"ddp.world_size={cfg.ddp.world_size} is invalid here: the launcher started "
                         f"{info.world_size} process(es)")
    if not info.distributed and cfg.ddp.grad_accum_steps == 1:
        return None, False
    backend = resolve_backend(cfg.ddp.backend, device)
    created = init_process_group(info, backend, cfg.ddp.timeout_s) if info.distributed else False
    return DDPRuntime(info, backend, cfg.ddp.grad_accum_steps), created


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


def describe(runtime: DDPRuntime, cfg, batch_size: int, lr: float) -> dict[str, Any]:
    """What ran, for ``result.details["ddp"]``: ranks, backend, threads, effective batch and bytes per step.

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
    }


def finish() -> None:
    """Leave the process group after a barrier, so no rank tears down a peer's pending collective."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
