"""Data loading on emulated network storage: how close do the loaders get to the in-memory limit?

    python benchmarks/data_loading.py [--quick] [--json PATH]

Arms on the ``ctr`` workload, each a ``lab.run`` with 1 compute thread, interleaved over repeats so drift hits
all alike: in-memory (the limit), naive (main thread, one read per batch from the ``network_fs`` preset),
DataLoader with defaults (0 workers: the same as naive), DataLoader tuned by hand, and the auto-tuner's pick
(workers × depth searched under a memory cap). Goals: the naive loader waits >= 30 % of the step (else the
storage is not slow enough to test anything); the pick waits <= 2 % and reaches >= 0.95 × in-memory
throughput; the in-memory loader's per-batch overhead is <= 3 × direct slicing.
"""

from __future__ import annotations

import dataclasses
import time

import torch
from _common import emit, figure, parse_args

from lab import RunConfig, run
from lab.config import DataConfig
from lab.data import InMemoryLoader, ShuffledBatchSampler
from lab.data.autotune import autotune, data_config_for
from lab.data.prefetch import batch_nbytes
from lab.data.stalls import data_wait_fraction, ideal_replay
from lab.measure import bootstrap_ratio_ci, median
from lab.train import resolve

STORAGE = "network_fs"


def slicing_overhead(n_rows: int = 16_384, batch_size: int = 512, repeats: int = 15) -> float:
    """In-memory loader time / direct slicing time over the same batches (median of repeats)."""
    g = torch.Generator().manual_seed(0)
    tensors = (torch.randn(n_rows, 13, generator=g), torch.randint(0, 100, (n_rows, 26), generator=g),
               torch.rand(n_rows, generator=g))
    sampler = ShuffledBatchSampler(n_rows, batch_size)
    idxs = list(sampler)
    ratios = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _b in InMemoryLoader(tensors, sampler):
            pass
        t1 = time.perf_counter()
        for idx in idxs:
            tuple(t[idx] for t in tensors)
        t2 = time.perf_counter()
        ratios.append((t1 - t0) / (t2 - t1))
    return median(ratios)


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


if __name__ == "__main__":
    main()
