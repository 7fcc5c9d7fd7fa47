"""Launching ranks: torchrun / SLURM / spawn detection, the process group with a timeout, and spawned jobs
that end (a dead or hung rank is named, never a silent hang).

The same run code path runs three ways: ``torchrun --nproc-per-node 2 -m lab run ...`` (or SLURM's ``srun``;
see docs/distributed.md); :func:`spawn` / :func:`spawn_run` from a notebook, test or dashboard
(``torch.multiprocessing`` with a free port, gloo on CPU), which ``lab.run(cfg)`` with
``cfg.ddp.world_size > 1`` calls; and a single process, where nothing here is used.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import multiprocessing.connection as mp_connection
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lab.config import DDPConfig, RunConfig
from lab.distributed.supervise import (
    HEARTBEAT_S,
    STALE_S,
    RankFailure,
    RankHung,
    RankState,
    RankValueError,
    check_spawn_world_size,
    diagnose,
    die_with_parent,
    find_hung,
    heartbeat,
    is_dist_error,
    max_local_ranks,
    start_watchdog,
    tell,
)
from lab.result import RunResult
from lab.result.failure import FAILURE


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
                 threads_per_rank: int, parent: int) -> None:
    die_with_parent(parent)
    out = Path(out_dir)
    alive = out / f"rank{rank}.alive"
    alive.write_text(f"{os.getpid()}\n")
    threading.Thread(target=heartbeat, args=(alive, parent), name="lab-heartbeat", daemon=True).start()
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "LAB_LAUNCHER": "spawn"})
    torch.set_num_threads(threads_per_rank)  # ranks x threads must not exceed the cores
    try:
        value = fn(*args)
        torch.save(value, out / f"rank{rank}.tmp")
        os.replace(out / f"rank{rank}.tmp", out / f"rank{rank}.pt")  # a result file is complete or absent
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher, which names this rank
        failure = getattr(exc, FAILURE, None)  # lab.train.run's one line: technique, stage, the model's line
        record = {"type": type(exc).__name__, "message": failure.line() if failure else str(exc).strip(),
                  "dist": is_dist_error(exc),
                  "value_error": isinstance(exc, ValueError), "traceback": traceback.format_exc(limit=20)}
        with contextlib.suppress(OSError):
            (out / f"rank{rank}.err").write_text(json.dumps(record))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # no traceback on the user's terminal, no hang in a teardown waiting for dead peers
    if dist.is_initialized():
        dist.destroy_process_group()
    # The result is on disk: leave without the interpreter's teardown. A C++ thread still joinable when its
    # static owner is destroyed at exit calls std::terminate ("terminate called without an active exception",
    # SIGABRT): seen once in a full suite run, on a 2-rank run whose work was done, and it failed the job.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (), *, timeout_s: float | None = 120.0,
          threads_per_rank: int = 1, hang_timeout_s: float = 60.0) -> list[Any]:
    """Run ``fn(*args)`` in ``world_size`` fresh processes (spawn start method) and return each rank's value.

    ``fn`` must be importable (a module-level function) and calls :func:`init_from_env` itself. Faults end the
    job with one :class:`RankFailure` line naming the rank, and every other rank is stopped: a rank killed by a
    signal or exiting with a code ("rank 1 died: killed by SIGKILL (exit code -9)"); a rank whose heartbeat is
    older than ``hang_timeout_s`` or whose process is stopped (:class:`RankHung`, also a ``TimeoutError``);
    a rank that raised (a ``ValueError`` stays one: :class:`RankValueError`). ``timeout_s`` bounds the whole
    job (None: no bound). Ranks never see Ctrl-C (the launcher stops them), die with the launcher, and the
    spawn folder is removed on every exit, the launcher's own death by SIGKILL included (a watchdog process).
    More ranks than :func:`check_spawn_world_size` allows are refused before any starts."""
    check_spawn_world_size(world_size)
    out_dir = tempfile.mkdtemp(prefix="lab-spawn-")
    watchdog = start_watchdog(out_dir)
    cleanup = functools.partial(shutil.rmtree, out_dir, ignore_errors=True)
    atexit.register(cleanup)
    ctx = mp.get_context("spawn")
    states: list[RankState] = []
    try:
        port, parent = free_port(), os.getpid()
        # Ranks start with SIGINT ignored (inherited through exec): a Ctrl-C reaches the launcher alone, which
        # stops them, so no rank prints a KeyboardInterrupt traceback of its own.
        main = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            for rank in range(world_size):
                p = ctx.Process(target=_spawn_entry, name=f"lab-rank{rank}", daemon=False,
                                args=(rank, fn, world_size, port, tuple(args), out_dir, threads_per_rank, parent))
                p.start()
                states.append(RankState(rank, p, Path(out_dir), time.monotonic()))
                tell(watchdog, str(p.pid))
        finally:
            if main:
                signal.signal(signal.SIGINT, old)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if any(s.exitcode not in (None, 0) for s in states):
                raise diagnose(states, hang_timeout_s)
            if all(s.exitcode == 0 for s in states):
                break
            hung = find_hung(states, hang_timeout_s)
            if hung is not None:
                raise hung
            if deadline is not None and time.monotonic() > deadline:
                stale = find_hung(states, min(hang_timeout_s, STALE_S), stopped_is_hung=True, others=False)
                raise RankHung(f"distributed job did not finish within {timeout_s:g} s"
                               + (f": {stale}" if stale else "") + "; the launcher ended every rank",
                               rank=stale.rank if stale else None, kind="timeout")
            mp_connection.wait([s.process.sentinel for s in states if s.exitcode is None], timeout=HEARTBEAT_S)
        values = []
        for s in states:
            path = Path(out_dir) / f"rank{s.rank}.pt"
            if not path.exists():
                raise RankFailure(f"rank {s.rank} exited (exit code 0) without returning a result", rank=s.rank,
                                  kind="no_result", exit_code=0)
            values.append(torch.load(path, weights_only=False))
        return values
    finally:
        for s in states:
            if s.process.exitcode is None:
                s.process.kill()  # SIGKILL also ends a stopped process
        for s in states:
            s.process.join(5)
        cleanup()
        atexit.unregister(cleanup)
        tell(watchdog, "done")
        if watchdog is not None:
            with contextlib.suppress(OSError, ValueError):
                watchdog.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                watchdog.wait(5)


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
    that a fresh process would not know. A rank that dies, hangs (no heartbeat for ``cfg.ddp.timeout_s``,
    the bound every collective has too) or raises ends the job with a :class:`RankFailure` naming it;
    ``timeout_s`` bounds the whole job (default: none, a long run is not a hang)."""
    n = cfg.ddp.world_size
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // n)
    values = spawn(_run_worker, n, (run_fn, cfg.to_dict(), setup), timeout_s=timeout_s,
                   threads_per_rank=threads, hang_timeout_s=cfg.ddp.timeout_s)
    return RunResult.from_dict(values[0])


def finish() -> None:
    """Leave the process group after a barrier, so no rank tears down a peer's pending collective."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()

__all__ = [
    "check_spawn_world_size", "detect_launch", "finish", "free_port", "init_from_env", "init_process_group",
    "LaunchInfo", "max_local_ranks", "RankFailure", "RankHung", "RankValueError", "resolve_backend", "spawn",
    "spawn_run",
]
