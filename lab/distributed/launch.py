"""Launching ranks: torchrun / SLURM / spawn detection, the process group with a timeout, and spawned jobs
that end (a dead or hung rank is named, never a silent hang).

The same run code path runs three ways: ``torchrun --nproc-per-node 2 -m lab run ...`` (or SLURM's ``srun``;
see docs/distributed.md); :func:`spawn` / :func:`spawn_run` from a notebook, test or dashboard
(``torch.multiprocessing`` with a free port, gloo on CPU), which ``lab.run(cfg)`` with
``cfg.ddp.world_size > 1`` calls; and a single process, where nothing here is used.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lab.config import DDPConfig, RunConfig
from lab.result import RunResult


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


def _run_worker(run_fn: Callable[..., Any], cfg_dict: dict[str, Any],
                setup: Callable[[], None] | None) -> dict[str, Any] | None:
    if setup is not None:
        setup()
    result = run_fn(RunConfig.from_dict(cfg_dict), on_error="raise")
    return result.to_dict() if detect_launch().rank == 0 else None


def spawn_run(cfg: RunConfig, run_fn: Callable[..., Any], *, setup: Callable[[], None] | None = None,
              timeout_s: float | None = None) -> RunResult:
    """``run_fn(cfg)`` (that is :func:`lab.run`, which passes itself) on ``cfg.ddp.world_size`` spawned CPU
    ranks; returns rank 0's RunResult.

    ``setup`` (importable, no arguments) runs first in every rank, e.g. to register a user workload
    that a fresh process would not know."""
    n = cfg.ddp.world_size
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // n)
    values = spawn(_run_worker, n, (run_fn, cfg.to_dict(), setup), timeout_s=timeout_s or cfg.ddp.timeout_s + 120,
                   threads_per_rank=threads)
    return RunResult.from_dict(values[0])


def finish() -> None:
    """Leave the process group after a barrier, so no rank tears down a peer's pending collective."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()

__all__ = [
    "detect_launch", "finish", "free_port", "init_from_env", "init_process_group", "LaunchInfo", "resolve_backend",
    "spawn", "spawn_run",
]
