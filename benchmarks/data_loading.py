"""Data loading on emulated network storage: how close do the loaders get to the in-memory limit?

    python benchmarks/data_loading.py [--quick] [--json PATH]

Arms on the ``ctr`` workload, each a ``lab.run`` with 1 compute thread, interleaved over repeats so drift hits
all alike: in-memory (the limit), naive (main thread, one read per batch from the ``network_fs`` preset),
DataLoader with defaults (0 workers: the same as naive), DataLoader tuned by hand, and the auto-tuner's pick
(workers × depth searched under a memory cap). Goals: the naive loader waits >= 30 % of the step (else the
storage is not slow enough to test anything); the pick waits <= 2 % and reaches >= 0.95 × in-memory
throughput; the in-memory loader's per-batch overhead is <= 3 × direct slicing.

GPU part (``gpu_part``, run by ``benchmarks/gpu.py``, not by this script): the lab's CUDA-stream prefetcher
(:class:`lab.data.prefetch.DevicePrefetcher`, pinned memory) against synchronous host->device copies and against
data already resident on the GPU (the upper bound), at ctr batch sizes. Goal: prefetch never slower than
synchronous copies, >= 90 % of the resident bound.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from _common import emit, figure, median_figure, parse_args, ratio_figure, skipped
from _gpu import PartContext

from lab import RunConfig, run
from lab.config import DataConfig
from lab.context import resolve
from lab.data import InMemoryLoader, ShuffledBatchSampler
from lab.data.prefetch import DevicePrefetcher, batch_nbytes
from lab.data.studies.autotune import autotune, data_config_for
from lab.data.studies.stalls import data_wait_fraction, ideal_replay
from lab.measure import bootstrap_ratio_ci, interleaved_ms, median
from lab.workloads import get_workload

STORAGE = "network_fs"


def slicing_overhead(n_rows: int = 16_384, batch_size: int = 512, repeats: int = 15) -> float:
    """In-memory loader time / direct slicing time over the same batches (median of repeats)."""
    g = torch.Generator().manual_seed(0)
    tensors = (torch.randn(n_rows, 13, generator=g), torch.randint(0, 100, (n_rows, 26), generator=g),
               torch.rand(n_rows, generator=g))
    sampler = ShuffledBatchSampler(n_rows, batch_size)
    idxs = list(sampler)

    def loader() -> None:
        for _b in InMemoryLoader(tensors, sampler):
            pass

    def slicing() -> None:
        for idx in idxs:
            tuple(t[idx] for t in tensors)

    ms = interleaved_ms({"loader": loader, "slicing": slicing}, repeats=repeats, warmup=1)
    return median([a / b for a, b in zip(ms["loader"], ms["slicing"], strict=True)])  # paired: same round


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    size, steps, repeats, tune_steps = ("tiny", 40, 3, 25) if args.quick else ("small", 80, 3, 40)
    base = RunConfig(workload="ctr", size=size, threads=1, max_steps=steps, latency_repeats=0, warmup_steps=3,
                     epochs=1)
    one_row = (torch.zeros(13), torch.zeros(26, dtype=torch.int64), torch.zeros(1))
    batch_bytes = batch_nbytes(one_row) * resolve(base).batch_size

    def measure(c) -> float:
        cfg = dataclasses.replace(base, max_steps=tune_steps, data=data_config_for(c, STORAGE))
        return run(cfg).throughput_samples_per_s or 0.0

    tuned = autotune(measure, batch_bytes, memory_cap_mb=400.0, workers=(0, 1, 2), depths=(1, 2, 4),
                     worker_overhead_mb=150.0, repeats=2)
    arms = {
        "in-memory": DataConfig(),
        "naive": DataConfig(loader="naive", storage=STORAGE),
        "DataLoader defaults": DataConfig(loader="dataloader", storage=STORAGE),
        "DataLoader tuned (2 workers, prefetch 4)": DataConfig(loader="dataloader", storage=STORAGE, num_workers=2,
                                                               prefetch_factor=4, persistent_workers=True),
        "auto-tuned pick": data_config_for(tuned["pick"], STORAGE),
    }
    thr: dict[str, list[float]] = {k: [] for k in arms}
    wait: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(repeats):
        for name, data in arms.items():
            res = run(dataclasses.replace(base, data=data))
            thr[name].append(res.throughput_samples_per_s)
            wait[name].append(data_wait_fraction(res.step_times_ms))
    figures = []
    for name in arms:
        ratio, lo, hi = bootstrap_ratio_ci(thr[name], thr["in-memory"])
        figures.append(figure(f"{name}: throughput", median(thr[name]), unit="samples/s"))
        figures.append(figure(f"{name}: / in-memory", ratio, unit="x", ci=(lo, hi),
                              goal=">= 0.95" if name == "auto-tuned pick" else None,
                              met=ratio >= 0.95 if name == "auto-tuned pick" else None))
        is_naive, is_pick = name == "naive", name == "auto-tuned pick"
        figures.append(figure(f"{name}: data wait", 100 * median(wait[name]), unit="%",
                              goal=">= 30 %" if is_naive else "<= 2 %" if is_pick else None,
                              met=(median(wait[name]) >= 0.30) if is_naive else
                              (median(wait[name]) <= 0.02) if is_pick else None))
    ideal = ideal_replay(dataclasses.replace(base, data=arms["naive"]), steps)
    figures.append(figure("ideal-loader replay: median step", ideal["ideal_step_ms"], unit="ms",
                          note="same batches cached in memory, re-timed: the compute-only bound"))
    over = slicing_overhead()
    figures.append(figure("in-memory loader / direct slicing", over, unit="x", goal="<= 3", met=over <= 3))
    emit("data_loading", args, figures, pick=str(tuned["pick"]), reason=tuned["reason"],
         samples={"throughput": thr, "data_wait_fraction": wait}, storage=STORAGE)


# ------------------------------------------------------------------------------------------------ GPU part

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


def gpu_part(ctx: PartContext, figs: list[dict[str, Any]]) -> None:
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
        gpu_batch_size(ctx, bs, host, resident, step, figs)
        ctx.checkpoint()


def gpu_batch_size(ctx: PartContext, bs: int, host: tuple[torch.Tensor, ...], resident: tuple[torch.Tensor, ...],
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
    samples = interleaved_ms(arms, repeats=sz.repeats, iters=sz.data_iters, warmup=sz.warmup, sync=dev,
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


if __name__ == "__main__":
    main()
