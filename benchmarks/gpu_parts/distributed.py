"""Part 5, distributed: DDP at world size 1 (an in-process group on 127.0.0.1) against the plain model, and with
the lab's recording comm hook: the per-step overhead of the wrapper and of the hook.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.nn.functional as F
from _common import figure
from torch import nn

from lab.distributed import CommRecorder, free_port
from lab.measure import bootstrap_ratio_ci, median
from lab.workloads import get_workload

from .common import PartContext, free_memory, interleaved_ms, median_figure, skipped
from .settings import Settings


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


def part_distributed(ctx: PartContext, figs: list[dict[str, Any]]) -> None:
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
    samples = interleaved_ms(arms, device=dev, repeats=sz.repeats, iters=sz.ddp_iters, warmup=sz.warmup,
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
