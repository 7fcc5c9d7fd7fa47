"""Training from files: real reads and decoding, loaders against the in-memory limit, workers against threads.

    python benchmarks/data_threads.py [--quick] [--json PATH]

Part 1, file-backed ``vision`` (PNG in WebDataset tar shards on the emulated ``network_fs``, decoded with
Pillow and augmented per sample; 1 compute thread), each arm a ``lab.run``, interleaved over repeats: the
in-memory limit, the naive loader, the thread prefetcher, DataLoader with 1 and 2 workers. Goals: the naive
loader waits >= 30 % of the step; the best file loader waits <= 2 % at >= 0.95 x the in-memory throughput
(bootstrap 95 % CI of the ratio of medians).

Part 2, workers vs compute threads (:func:`lab.data.studies.threads.workers_vs_threads`) on file-backed
``vision`` and ``ctr``: throughput per (threads, workers) pair with the CI of its ratio to the best pair, the
CPU seconds of the workers and of the training process, the best pair, and the lab's rule
(:func:`lab.data.studies.threads.recommend`) with how close its pick comes to the best.

On a shared 2-core box other load swings multi-threaded timings by several times: read the CIs.
"""

from __future__ import annotations

import dataclasses

from _common import emit, figure, parse_args

from lab import RunConfig, run
from lab.config import DataConfig
from lab.data.studies.threads import workers_vs_threads
from lab.measure import bootstrap_ratio_ci, median

STORAGE = "network_fs"


def loader_arms(base: RunConfig, repeats: int) -> tuple[list[dict], dict]:
    files = dict(source="files", storage=STORAGE)
    arms = {
        "in-memory": DataConfig(),
        "naive (files)": DataConfig(loader="naive", **files),
        "thread prefetch depth 4 (files)": DataConfig(loader="thread", prefetch_depth=4, **files),
        "DataLoader 1 worker (files)": DataConfig(loader="dataloader", num_workers=1, prefetch_factor=4, **files),
        "DataLoader 2 workers (files)": DataConfig(loader="dataloader", num_workers=2, prefetch_factor=2, **files),
    }
    thr: dict[str, list[float]] = {k: [] for k in arms}
    wait: dict[str, list[float]] = {k: [] for k in arms}
    decode: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(repeats):  # interleaved: drift on a shared box hits every arm alike
        for name, data in arms.items():
            res = run(dataclasses.replace(base, data=data))
            thr[name].append(res.throughput_samples_per_s or 0.0)
            wait[name].append(res.data_wait_fraction or 0.0)
            decode[name].append(res.details.get("data", {}).get("decode_ms_per_batch", 0.0))
    file_arms = [k for k in arms if k != "in-memory"]
    best = max(file_arms[1:], key=lambda k: median(thr[k]))
    figs = []
    for name in arms:
        ratio, lo, hi = bootstrap_ratio_ci(thr[name], thr["in-memory"])
        is_naive, is_best = name == "naive (files)", name == best
        figs.append(figure(f"vision files/{name}: throughput", median(thr[name]), unit="samples/s", family="data"))
        figs.append(figure(f"vision files/{name}: / in-memory", ratio, unit="x", ci=(lo, hi), family="data",
                           goal=">= 0.95 (best file loader)" if is_best else None,
                           met=ratio >= 0.95 if is_best else None))
        figs.append(figure(f"vision files/{name}: data wait", 100 * median(wait[name]), unit="%", family="data",
                           goal=">= 30 %" if is_naive else "<= 2 % (best file loader)" if is_best else None,
                           met=(median(wait[name]) >= 0.30) if is_naive else
                           (median(wait[name]) <= 0.02) if is_best else None,
                           note=f"decode {median(decode[name]):.3g} ms/batch" if name != "in-memory" else ""))
    return figs, {"throughput": thr, "data_wait_fraction": wait, "best_file_loader": best}


def grid_figures(study: dict) -> list[dict]:
    w = f"{study['workload']}/{study['size']}"
    figs = []
    for r in study["rows"]:
        figs.append(figure(f"{w} files: {r['threads']} thread(s) + {r['workers']} worker(s)", r["throughput"],
                           unit="samples/s", ci=None, family="data",
                           note=f"{r['vs_best']:.2f}x of best [{r['vs_best_ci95'][0]:.2f}, "
                                f"{r['vs_best_ci95'][1]:.2f}]; "
                                f"wait {100 * r['data_wait_fraction']:.0f}%; worker CPU {r['worker_cpu_s']:.2f} s, "
                                f"training process CPU {r['training_process_cpu_s']:.2f} s"))
    b = study["best"]
    figs.append(figure(f"{w} files: best pair throughput", b["throughput"], unit="samples/s", family="data",
                       note=f"{b['threads']} thread(s) + {b['workers']} worker(s)"))
    if study["rule_vs_best"] is not None:
        figs.append(figure(f"{w} files: the rule's pick / best pair", study["rule_vs_best"], unit="x", family="data",
                           note=study["rule"]["text"]))
    return figs


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    steps, repeats, ctr_size = (30, 3, "tiny") if args.quick else (80, 5, "small")
    vision = RunConfig(workload="vision", size="small", threads=1, max_steps=steps, latency_repeats=0,
                       warmup_steps=3, epochs=1, device="cpu")
    figs, samples = loader_arms(vision, repeats)
    pairs = [(1, 0), (1, 1), (2, 0), (2, 1)] if args.quick else [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1)]
    studies = []
    for base in (vision, dataclasses.replace(vision, workload="ctr", size=ctr_size)):
        study = workers_vs_threads(base, pairs, storage=STORAGE, repeats=repeats, run=run)
        studies.append(study)
        figs.extend(grid_figures(study))
    emit("data_threads", args, figs, samples=samples, grids=studies, storage=STORAGE,
         note="measured on a shared 2-core machine under other engineers' load")


if __name__ == "__main__":
    main()
