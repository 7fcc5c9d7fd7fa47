"""Data parallelism on the cores we have: all-reduce cost, when DDP wins, buckets, accumulation, the model.

    python benchmarks/distributed.py [--quick] [--json PATH]

One 2-rank launch (gloo, 1 thread per rank) measures: the all-reduce latency/bandwidth curve, a step of a
compute-bound and a comm-bound model, a bucket-size sweep and no_sync accumulation. This process then
measures the same models with 1 rank x 2 threads (same cores, same global batch) and 1 rank x 1 thread,
and DDP with world size 1 against the plain loop. Goals (issue 7):
- compute-bound arm: 2 ranks x 1 thread reach >= 0.85 of 1 rank x 2 threads' throughput;
- the alpha-beta model, fitted on one set of message sizes, predicts others within +-20 %;
- DDP at world size 1 costs <= 3 % over the plain loop.
On a shared 2-core machine every figure moves with the neighbours' load: read them as orders of magnitude.

GPU part (``gpu_part``, run by ``benchmarks/gpu.py``, not by this script): DDP at world size 1 (NCCL, in-process
``init_process_group``, 127.0.0.1 and a free port) against the same model without DDP, and with the lab's
recording comm hook (:class:`lab.distributed.CommRecorder`): the per-step overhead of the wrapper and of the hook.
Anchor: PyTorch DDP's small per-step overhead (Li et al., VLDB 2020). Goal: <= 3 % per step.
"""

from __future__ import annotations

import contextlib
import copy
import os
import statistics
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _common import emit, figure, median_figure, parse_args, skipped
from _gpu import PartContext, Settings, free_memory
from torch import nn

from lab.distributed import CommRecorder, free_port, spawn
from lab.distributed import scaling as sm
from lab.distributed.checks import ARMS, _ddp, arm_model, bench_worker, step_times_ms
from lab.measure import bootstrap_ratio_ci, interleaved_ms, median
from lab.workloads import get_workload


def single_process(steps: int, rounds: int = 3) -> dict[str, dict[str, float]]:
    """1 rank x 2 threads at the global batch and 1 rank x 1 thread at the per-rank batch; best of
    ``rounds`` interleaved medians (two threads stall whenever a neighbour takes one of the 2 cores)."""
    out = {}
    for name, a in ARMS.items():
        row: dict[str, float] = {}
        for _ in range(rounds):
            for threads, batch in ((2, 2 * a["batch"]), (1, a["batch"])):
                torch.set_num_threads(threads)
                ms = step_times_ms(arm_model(a["width"], a["depth"]), batch, a["width"], steps)[0]
                row[f"step_ms_{threads}t"] = min(ms, row.get(f"step_ms_{threads}t", float("inf")))
        out[name] = row
    torch.set_num_threads(1)
    return out


def world_size_1_overhead(steps: int, repeats: int) -> float:
    """Ratio of median step times, DDP(world 1) / plain, arms interleaved (compute-bound model, 1 thread)."""
    a = ARMS["compute_bound"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        plain, wrapped = arm_model(a["width"], a["depth"]), _ddp(arm_model(a["width"], a["depth"]), 1)[0]
        ratios = []
        for _ in range(repeats):
            t_plain = step_times_ms(plain, a["batch"] // 4, a["width"], steps)[0]
            t_ddp = step_times_ms(wrapped, a["batch"] // 4, a["width"], steps)[0]
            ratios.append(t_ddp / t_plain)
        return statistics.median(ratios)
    finally:
        dist.destroy_process_group()


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    steps, repeats = (8, 15) if args.quick else (20, 40)
    sizes = [1_000, 10_000, 100_000, 1_000_000, 4_000_000 if args.quick else 16_000_000]
    check_sizes = [30_000, 300_000, 2_000_000]
    buckets_mb = [0.25, 1.0, 25.0]
    accum = 4
    torch.set_num_threads(1)
    t0 = time.perf_counter()  # the launch's wall time (imports, rendezvous, the whole worker), one event, a figure
    m = spawn(bench_worker, 2, (steps, sizes, check_sizes, repeats, buckets_mb, accum), timeout_s=540,
              threads_per_rank=1)[0]
    launch_s = time.perf_counter() - t0
    single = single_process(steps)
    overhead = world_size_1_overhead(steps, 5 if args.quick else 15)

    link = sm.calibrate(sizes, m["calib"], 2)
    pred = [sm.ring_allreduce_s(s, 2, link.alpha_s, link.beta_s_per_byte) for s in check_sizes]
    errors = [p / t - 1 for p, t in zip(pred, m["check"], strict=True)]
    worst = max(errors, key=abs)

    figs = [
        figure("allreduce alpha (loopback, 2 ranks)", link.alpha_s * 1e6, unit="us"),
        figure("allreduce bandwidth (loopback, 2 ranks)", link.bandwidth_bytes_per_s / 1e9, unit="GB/s"),
        figure("model error on unseen message sizes (worst)", worst * 100, unit="%", goal="within +-20 %",
               met=abs(worst) <= 0.20, note=f"sizes {check_sizes} bytes, errors {[round(e * 100, 1) for e in errors]}"),
    ]
    projections = {}
    for name in ARMS:
        ddp_ms, one_thread_ms = m["arms"][name]["step_ms"], single[name]["step_ms_1t"]
        rel = single[name]["step_ms_2t"] / ddp_ms  # same global batch per step, so time ratio = throughput ratio
        goal = ("compute_bound", ">= 0.85") if name == "compute_bound" else (None, None)
        figs.append(figure(f"{name}: 2 ranks x 1 thread vs 1 rank x 2 threads", rel, unit="x throughput",
                           goal=goal[1], met=(rel >= 0.85) if goal[0] else None,
                           note=f"DDP step {ddp_ms:.2f} ms (comm in flight {m['arms'][name]['comm_ms']:.2f} ms, "
                                f"{m['arms'][name]['bytes_per_step']} B), "
                                f"1x2 threads {single[name]['step_ms_2t']:.2f} ms"))
        grad_bytes = m["arms"][name]["bytes_per_step"]
        predicted = one_thread_ms + sm.comm_s_per_step(grad_bytes, 2, link, 25e6) * 1e3
        figs.append(figure(f"{name}: model vs measured 2-rank step", predicted / ddp_ms, unit="x",
                           note=f"predicted {predicted:.2f} ms = 1-thread compute {one_thread_ms:.2f} ms + "
                                "all-reduce (no overlap)"))
        projections[name] = {lk.name: sm.project(one_thread_ms / 1e3, grad_bytes, [2, 4, 8, 64, 1024], lk)
                             for lk in (link, *sm.LINK_PRESETS.values())}
    for mb, row in m["buckets"].items():
        figs.append(figure(f"comm_bound bucket_cap_mb={mb}", row["step_ms"], unit="ms/step",
                           note=f"{row['buckets']} buckets, comm in flight {row['comm_ms']:.2f} ms"))
    saving = 1 - m["accum_no_sync_True"] / m["accum_no_sync_False"]
    figs.append(figure(f"accumulation x{accum}: no_sync saving", saving * 100, unit="% of step",
                       note=f"{m['accum_no_sync_True']:.2f} ms with no_sync vs {m['accum_no_sync_False']:.2f} ms"))
    figs.append(figure("DDP world size 1 vs plain loop", (overhead - 1) * 100, unit="% overhead",
                       goal="<= 3 %", met=overhead <= 1.03))
    figs.append(figure("2-rank launch incl. imports", launch_s, unit="s"))
    emit("distributed", args, figs, measured=m, single_process=single, calibrated_link=link.__dict__,
         projections=projections)


# ------------------------------------------------------------------------------------------------ GPU part

@contextlib.contextmanager
def single_rank_group(backend: str, timeout_s: float = 60.0) -> Iterator[None]:
    """A world-size-1 process group in this process (env:// rendezvous on 127.0.0.1 and a free port),
    destroyed afterwards, with the environment restored."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("a process group already exists in this process")
    keys = ("MASTER_ADDR", "MASTER_PORT")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(free_port())
    try:
        dist.init_process_group(backend, init_method="env://", rank=0, world_size=1,
                                timeout=timedelta(seconds=timeout_s))
        try:
            yield
        finally:
            dist.destroy_process_group()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _ddp_case(name: str, sz: Settings, dev: torch.device) -> tuple[str, nn.Module, tuple, torch.Tensor, Callable]:
    """(label, model, inputs, target, loss) of one DDP case: a fixed batch, so only the wrapper differs."""
    if name == "vision":
        c = sz.ddp_vision
        x = torch.randn(c.batch, c.channels, c.image, c.image, device=dev)
        return c.label, c.make().to(dev), (x,), torch.randint(0, c.classes, (c.batch,), device=dev), F.cross_entropy
    wl = get_workload("ctr")
    spec = wl.size(sz.ctr_size)
    data = wl.make_data(spec, 0)
    batch = tuple(t[:spec.batch_size].to(dev) for t in data.train)
    return f"ctr-{sz.ctr_size}-b{spec.batch_size}", wl.make_model(spec).to(dev), batch[:-1], batch[-1], wl.loss


def gpu_part(ctx: PartContext, figs: list[dict[str, Any]]) -> None:
    """Plain model vs DDP (world size 1) vs DDP + the lab's recording comm hook, on a fixed batch."""
    dev = ctx.device
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    with single_rank_group(backend):
        for case in ctx.sz.ddp_cases:
            ddp_case(ctx, case, backend, figs)
            ctx.checkpoint()
            free_memory()


def ddp_case(ctx: PartContext, case: str, backend: str, figs: list[dict[str, Any]]) -> None:
    """One case's three arms, interleaved: plain, DDP, DDP + the lab's comm hook; overheads vs plain in %."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev, sz, fam = ctx.device, ctx.sz, "distributed"
    if ctx.left_s() < 0:
        figs.append(skipped(f"ddp-ws1-{backend}/{case}: all arms", "time budget used up", fam, unit="%"))
        return
    torch.manual_seed(0)
    name, base, inputs, target, loss_fn = _ddp_case(case, sz, dev)
    label = f"ddp-ws1-{backend}/{name}"
    ids = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else None
    recorder = CommRecorder(world_size=1)
    plain = copy.deepcopy(base)
    wrapped = DDP(copy.deepcopy(base), device_ids=ids)
    hooked = DDP(copy.deepcopy(base), device_ids=ids)
    hooked.register_comm_hook(None, recorder.hook)

    def make(m: nn.Module, after: Callable[[], Any] | None = None) -> Callable[[], None]:
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)

        def step() -> None:
            loss = loss_fn(m(*inputs), target)
            loss.backward()
            if after is not None:
                after()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    arms = {"plain": make(plain), "ddp": make(wrapped), "ddp+lab-hook": make(hooked, recorder.end_step)}
    errors: dict[str, str] = {}
    samples = interleaved_ms(arms, repeats=sz.repeats, iters=sz.ddp_iters, warmup=sz.warmup, sync=dev,
                             deadline=ctx.deadline, min_repeats=sz.min_repeats, errors=errors)
    for arm, s in samples.items():
        ctx.log(f"  distributed {label:40s} {arm:13s} {median(s):8.3f} ms/step")
    if "plain" in samples:
        figs.append(median_figure(f"{label} plain step", samples["plain"], family=fam))
    for arm, goal in (("ddp", "<= 3 % per step"), ("ddp+lab-hook", None)):
        fig_name = f"{label} {arm} overhead per step"
        if arm in samples and "plain" in samples:
            est, lo, hi = bootstrap_ratio_ci(samples[arm], samples["plain"])
            figs.append(figure(fig_name, (est - 1) * 100, unit="%", ci=((lo - 1) * 100, (hi - 1) * 100),
                               goal=goal, met=((est - 1) * 100 <= 3.0) if goal else None, family=fam,
                               note=f"DDP's default all-reduce ({backend}, 1 rank)" if arm == "ddp" else
                               "lab.distributed.CommRecorder comm hook (timestamps every bucket)"))
        else:
            figs.append(skipped(fig_name, errors.get(arm) or errors.get("plain", "no samples"), fam, unit="%"))


if __name__ == "__main__":
    main()
