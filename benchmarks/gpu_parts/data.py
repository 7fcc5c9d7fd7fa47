"""Part 2, data: the lab's CUDA-stream prefetcher (pinned memory) against synchronous host->device copies and
against data already resident on the device (the upper bound), at ctr batch sizes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from lab.data.loaders import InMemoryLoader, ShuffledBatchSampler
from lab.data.prefetch import DevicePrefetcher
from lab.measure import median
from lab.workloads import get_workload

from .common import PartContext, interleaved_ms, median_figure, ratio_figure, skipped


class EndlessLoader:
    """A loader that walks epoch after epoch (new shuffle each), so a timing block never hits an epoch end."""

    def __init__(self, loader: InMemoryLoader) -> None:
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return sys.maxsize

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        epoch = 0
        while True:
            self.loader.set_epoch(epoch)
            yield from self.loader
            epoch += 1


def part_data(ctx: PartContext, figs: list[dict[str, Any]]) -> None:
    """Same model, same step; only how the batch reaches the device differs between the arms."""
    dev, sz = ctx.device, ctx.sz
    wl = get_workload("ctr")
    spec = wl.size(sz.ctr_size)
    data = wl.make_data(spec, 0)
    host = tuple(t.contiguous() for t in data.train)
    resident = tuple(t.to(dev) for t in host)
    torch.manual_seed(0)
    model = wl.make_model(spec).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=spec.lr)

    def step(batch: tuple[torch.Tensor, ...]) -> None:
        loss = wl.loss(model(*batch[:-1]), batch[-1])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for bs in sz.data_batches:
        data_batch_size(ctx, bs, host, resident, step, figs)
        ctx.checkpoint()


def data_batch_size(ctx: PartContext, bs: int, host: tuple[torch.Tensor, ...], resident: tuple[torch.Tensor, ...],
                    step: Callable[[tuple[torch.Tensor, ...]], None], figs: list[dict[str, Any]]) -> None:
    """The three arms at one batch size: synchronous copies, the CUDA-stream prefetcher, data on the GPU."""
    dev, sz, fam, n = ctx.device, ctx.sz, "data", len(host[0])
    label = f"data/ctr-b{bs}"
    if bs > n:
        figs.append(skipped(f"{label}: all arms", f"batch {bs} > {n} rows", fam))
        return
    sync_it = iter(EndlessLoader(InMemoryLoader(host, ShuffledBatchSampler(n, bs, seed=0))))
    pf_it = iter(DevicePrefetcher(EndlessLoader(InMemoryLoader(host, ShuffledBatchSampler(n, bs, seed=0))), dev))
    gen = torch.Generator(device=dev).manual_seed(0)
    state = {"perm": torch.randperm(n, device=dev, generator=gen), "i": 0}

    def resident_batch() -> tuple[torch.Tensor, ...]:
        if (state["i"] + 1) * bs > n:  # next epoch: a fresh permutation, drawn on the device
            state["perm"], state["i"] = torch.randperm(n, device=dev, generator=gen), 0
        idx = state["perm"][state["i"] * bs:(state["i"] + 1) * bs]
        state["i"] += 1
        return tuple(t[idx] for t in resident)

    arms = {
        "sync": lambda: step(tuple(t.to(dev) for t in next(sync_it))),
        "prefetch": lambda: step(next(pf_it)),
        "resident": lambda: step(resident_batch()),
    }
    errors: dict[str, str] = {}
    samples = interleaved_ms(arms, device=dev, repeats=sz.repeats, iters=sz.data_iters, warmup=sz.warmup,
                             deadline=ctx.deadline, min_repeats=sz.min_repeats, errors=errors)
    nbytes = sum(t[:bs].numel() * t.element_size() for t in host)
    for arm in arms:
        if arm not in samples:
            figs.append(skipped(f"{label}/{arm} step", errors.get(arm, "no samples"), fam, unit="ms"))
            continue
        ctx.log(f"  data {label:16s} {arm:8s} {median(samples[arm]):8.3f} ms/step")
        figs.append(median_figure(f"{label}/{arm} step", samples[arm], family=fam,
                                  note=f"{nbytes / 2**20:.2f} MiB per batch host->device"
                                  if arm != "resident" else "upper bound: no host->device copy"))
    if {"sync", "prefetch"} <= samples.keys():
        figs.append(ratio_figure(f"{label}/prefetch speedup vs sync copies", samples["sync"], samples["prefetch"],
                                 family=fam, goal_min=1.0, goal=">= 1.0x (never slower than synchronous copies)",
                                 note="DevicePrefetcher: pin_memory + side-stream copy; the host gather stays "
                                      "on the main thread in both arms"))
    if {"resident", "prefetch"} <= samples.keys():
        figs.append(ratio_figure(f"{label}/prefetch fraction of resident bound", samples["resident"],
                                 samples["prefetch"], family=fam, goal_min=0.9,
                                 goal=">= 0.9 of the data-on-GPU throughput"))
    if {"resident", "sync"} <= samples.keys():
        figs.append(ratio_figure(f"{label}/sync fraction of resident bound", samples["resident"], samples["sync"],
                                 family=fam))
