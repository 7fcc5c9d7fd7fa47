"""Worker functions for :func:`lab.distributed.spawn`: the checks the tests, notebook 05 and the benchmark run.

Why one module: each launch costs seconds (every rank imports torch), so one launch runs several checks
and returns their numbers; spawned processes can only run importable functions, which these are.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import statistics
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel

from lab.distributed.ddp import CommRecorder, RankSlicedLoader, measure_allreduce_s
from lab.distributed.launch import init_from_env
from lab.measure import interleaved_ms


def _mlp(seed: int, width: int = 16) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, width), nn.Tanh(), nn.Linear(width, 1))


def equivalence_worker(steps: int = 3, per_rank_batch: int = 4, seed: int = 0) -> dict[str, Any]:
    """DDP with batch b per rank vs one local model with batch b x world size on the same global batches;
    gradients across ranks after each step; exactly-once data; uneven batch counts under Join."""
    info = init_from_env(timeout_s=30)
    world, rank = info.world_size, info.rank
    model = _mlp(seed)
    ref = copy.deepcopy(model)
    ddp = DistributedDataParallel(model)
    rec = CommRecorder(world)
    ddp.register_comm_hook(None, rec.hook)
    opt, ref_opt = torch.optim.SGD(ddp.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(seed)
    big = per_rank_batch * world
    x, y = torch.randn(steps * big, 8, generator=g), torch.randn(steps * big, 1, generator=g)
    grad_diff = 0.0
    for k in range(steps):
        gx, gy = x[k * big:(k + 1) * big], y[k * big:(k + 1) * big]
        nn.functional.mse_loss(ddp(gx.tensor_split(world)[rank]), gy.tensor_split(world)[rank]).backward()
        rec.end_step()
        flat = torch.cat([p.grad.flatten() for p in ddp.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        grad_diff = max(grad_diff, max(float((t - gathered[0]).abs().max()) for t in gathered))
        opt.step()
        opt.zero_grad()
        nn.functional.mse_loss(ref(gx), gy).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    param_diff = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), ref.parameters(), strict=True))

    n = 50  # not a multiple of the global batch: the tail that does not fill one is dropped (drop_last)
    order, big_b = torch.randperm(n, generator=torch.Generator().manual_seed(seed)), 3 * world
    global_batches = [(order[i:i + big_b],) for i in range(0, n - big_b + 1, big_b)]  # the same on every rank
    loader = RankSlicedLoader(global_batches, rank, world)
    mine = torch.cat([b[0] for b in loader])
    seen = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(seen, mine)
    seen_all = torch.cat(seen)

    uneven_steps = 2 + rank  # rank 1 has one more batch than rank 0
    with Join([ddp]):
        for _ in range(uneven_steps):
            nn.functional.mse_loss(ddp(x[:per_rank_batch]), y[:per_rank_batch]).backward()
            opt.step()
            opt.zero_grad()
    return {"rank": rank, "param_diff": param_diff, "grad_diff": grad_diff, "bytes_per_step": rec.bytes_per_step,
            "n_seen": len(seen_all), "n_unique": len(set(seen_all.tolist())),
            "n_expected": n // (3 * world) * 3 * world,
            "uneven_steps": uneven_steps}


def killed_rank_worker(timeout_s: float = 10.0) -> None:
    """Rank 1 dies with SIGKILL (as an OOM kill would); rank 0 waits in an all-reduce for it."""
    info = init_from_env(timeout_s=timeout_s)
    if info.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(4))
    time.sleep(timeout_s * 3)  # never reached in a healthy launcher: the job must end before this


def faulty_rank_worker(fault: str, timeout_s: float = 5.0) -> None:
    """Rank 1 fails as asked while rank 0 waits for it in an all-reduce bounded by ``timeout_s``:
    ``kill`` (SIGKILL, an OOM kill), ``stop`` (SIGSTOP: alive but hung), ``exit`` (``os._exit(3)``), ``raise``
    (a ``ValueError``, a refused input). The launcher must name rank 1 in every case, never rank 0."""
    info = init_from_env(timeout_s=60)  # a generous rendezvous: both ranks import torch on a small box
    group = dist.new_group(timeout=timedelta(seconds=timeout_s))  # the all-reduce below waits this long
    if info.rank == 1:
        if fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif fault == "exit":
            os._exit(3)
        elif fault == "raise":
            raise ValueError("rank 1 refuses its input")
    dist.all_reduce(torch.ones(4), group=group)
    time.sleep(timeout_s * 3)  # never reached in a healthy launcher: the job must end before this


def allreduce_probe_worker(sizes_bytes: list[int], repeats: int = 10) -> list[float]:
    """Median all-reduce seconds per message size (the scaling model's calibration points)."""
    init_from_env(timeout_s=60)
    return measure_allreduce_s(sizes_bytes, repeats)


# ------------------------------------------------------------------------------------ benchmark arms
#: Two models at the two ends: few parameters and much arithmetic (all-reduce is cheap next to compute),
#: and many parameters with little arithmetic (all-reduce dominates), per-rank batch sizes included.
ARMS: dict[str, dict[str, int]] = {
    "compute_bound": {"width": 256, "depth": 2, "batch": 4096},
    "comm_bound": {"width": 1024, "depth": 2, "batch": 8},
}


def arm_model(width: int, depth: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def step_times_ms(model: nn.Module, batch: int, width: int, steps: int, *, accum: int = 1, use_no_sync: bool = True,
                  recorder: CommRecorder | None = None) -> tuple[float, float]:
    """Median (step ms, comm ms) of SGD steps on random data, timed by :func:`lab.measure.interleaved_ms`
    (2 warm-up steps); ``accum`` micro-batches per step, all but the last under ``no_sync`` when
    ``use_no_sync`` (else every micro-batch all-reduces)."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, width), torch.randn(batch, 1)
    comms: list[float] = []

    def step() -> None:
        for m in range(accum):
            skip = use_no_sync and m < accum - 1 and isinstance(model, DistributedDataParallel)
            with model.no_sync() if skip else contextlib.nullcontext():
                (nn.functional.mse_loss(model(x), y) / accum).backward()
        opt.step()
        opt.zero_grad()
        comms.append(recorder.end_step() if recorder else 0.0)

    times = interleaved_ms({"step": step}, repeats=steps, warmup=2)["step"]
    return statistics.median(times), statistics.median(comms[2:])


def _ddp(model: nn.Module, world: int, bucket_cap_mb: float = 25.0) -> tuple[nn.Module, CommRecorder]:
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    rec = CommRecorder(world)
    ddp.register_comm_hook(None, rec.hook)
    return ddp, rec


def bench_worker(steps: int, sizes_bytes: list[int], check_sizes_bytes: list[int], repeats: int,
                 buckets_mb: list[float], accum: int) -> dict[str, Any]:
    """Everything the benchmark measures with 2 ranks, in one launch (rank 0's numbers are kept)."""
    info = init_from_env(timeout_s=120)
    world = info.world_size
    out: dict[str, Any] = {"calib": measure_allreduce_s(sizes_bytes, repeats),
                           "check": measure_allreduce_s(check_sizes_bytes, repeats), "arms": {}, "buckets": {}}
    for name, a in ARMS.items():
        model, rec = _ddp(arm_model(a["width"], a["depth"]), world)
        step_ms, comm_ms = step_times_ms(model, a["batch"], a["width"], steps, recorder=rec)
        out["arms"][name] = {"step_ms": step_ms, "comm_ms": comm_ms, "bytes_per_step": rec.bytes_per_step[-1]}
    a = ARMS["comm_bound"]
    for mb in buckets_mb:
        model, rec = _ddp(arm_model(a["width"], a["depth"]), world, bucket_cap_mb=mb)
        step_ms, comm_ms = step_times_ms(model, a["batch"], a["width"], steps, recorder=rec)
        out["buckets"][mb] = {"step_ms": step_ms, "comm_ms": comm_ms, "buckets": rec.buckets_per_step[-1]}
    for flag in (True, False):
        model, rec = _ddp(arm_model(a["width"], a["depth"]), world)
        out[f"accum_no_sync_{flag}"] = step_times_ms(model, a["batch"], a["width"], steps, accum=accum,
                                                    use_no_sync=flag, recorder=rec)[0]
    return out
