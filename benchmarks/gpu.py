"""The GPU parts of every technique benchmark, in one run that fits a single H200 session (about 5 minutes).

    bash benchmarks/gpu.sh [OUT_DIR]          # writes OUT_DIR/gpu.json (default benchmarks/results/<hardware-id>/)
    python benchmarks/gpu.py [--quick] [--json PATH] [--parts precision,data,...]

Why one script: a GPU is lent for minutes, not hours, so everything that needs CUDA runs in one process, each
part under its own time budget, and the JSON is rewritten after every part (and after every sub-case), so a
run cut short still leaves what it measured. Every part measures its arms interleaved (A B C, A B C, ...)
over >= 3 repeats, synchronises the device around each timed block (``torch.cuda.synchronize``), drops the
warm-up, and reports ratios of medians with a bootstrap 95 % CI (``lab.measure.bootstrap_ratio_ci``).
A part that fails records an entry with the error and the run goes on; an arm that cannot run here (an API
missing from this torch / torchao) is a figure with value NaN and the note "skipped: <why>".

Parts, in the order they run (each part's goals and the published numbers it is read against are in its
family file's docstring):

1. ``precision`` (``benchmarks/precision.py``): CUDA autocast bf16 / fp16 and TF32 against strict fp32 through
   the lab's PrecisionPolicy, on ResNet-50 training steps and on the ctr workload (with the AUC delta).
2. ``data`` (``benchmarks/data_loading.py``): the lab's CUDA-stream prefetcher against synchronous host->device
   copies and against data already resident on the GPU.
3. ``pruning`` (``benchmarks/pruning.py``): 2:4 semi-structured sparse Linear against the dense layer holding
   the same weights.
4. ``distributed`` (``benchmarks/distributed.py``): DDP at world size 1 (NCCL) against the plain model, and with
   the lab's recording comm hook.
5. ``quantization`` (``benchmarks/quantization.py``): torchao int8 / int4 weight-only at batch 1 against bf16,
   eager and compiled (last: compile time).

Without CUDA the script still runs (seconds), says so, and writes ``gpu.json`` with one skipped entry per
part ("skipped: no CUDA device ..."); exit code 0. ``--device cpu`` instead runs every part's code path at
tiny sizes on the CPU (a self-test used by ``tests/test_gpu_bench.py``; its timings mean nothing).

The H200 box has torch, torchao, numpy, pandas and pyarrow only, so this module and what it imports from
``lab`` import nothing else (the test proves it with an import blocker).

Layout: this file only drives the parts (flags, the part loop, the report); each part is ``gpu_part(ctx, figs)``
in its family's benchmark file, beside that family's CPU benchmark (whose ``main`` runs only when the file is run
as a script); the sizes, budgets, part context and ``gpu.json`` writer are in ``benchmarks/_gpu.py``; every
timing goes through ``lab.measure`` (``interleaved_ms``, ``block_ms``).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import data_loading
import distributed
import precision
import pruning
import quantization
import torch
from _common import skipped
from _gpu import FULL, QUICK, TINY, GpuPart, PartContext, Report, Settings, free_memory, no_cuda_reason

from lab.measure import environment_stamp, error_text

PART_ORDER = ("precision", "data", "pruning", "distributed", "quantization")  # quantization last: compile time
FAMILIES = PART_ORDER

PARTS: dict[str, GpuPart] = {
    "precision": precision.gpu_part, "data": data_loading.gpu_part, "pruning": pruning.gpu_part,
    "distributed": distributed.gpu_part, "quantization": quantization.gpu_part,
}
"""Part name (the figures' family) -> the ``gpu_part`` of that family's benchmark file."""


def run_part(name: str, ctx: PartContext, report: Report) -> None:
    """Run one part under try/except; its figures (even those made before a failure) go into the report."""
    figs: list[dict[str, Any]] = []
    start = len(report.figures)  # this part's figures are spliced in at report.figures[start:] at checkpoints

    def checkpoint() -> None:
        report.figures[start:] = figs
        report.write()

    ctx.checkpoint = checkpoint
    t0 = time.perf_counter()  # the part's wall time for the report's bookkeeping, one event: not a measurement
    ctx.log(f"part {name}: start (budget {ctx.left_s():.0f} s)")
    status, error = "ok", None
    try:
        PARTS[name](ctx, figs)
    except Exception as exc:  # noqa: BLE001 - a failing part is an entry, never the end of the run
        traceback.print_exc()
        status, error = "error", error_text(exc)
        figs.append(skipped(f"{name}: part failed", f"error: {error}", name))
    secs = time.perf_counter() - t0
    report.parts[name] = {"status": status, "seconds": round(secs, 2), "error": error, "figures": len(figs)}
    checkpoint()
    ctx.log(f"part {name}: {status} in {secs:.1f} s ({len(figs)} figures){': ' + error if error else ''}")
    free_memory()


def default_json_path() -> Path:
    """``benchmarks/results/<hardware-id>/gpu.json``; the GPU's id when one is present."""
    return Path(__file__).resolve().parent / "results" / environment_stamp("auto")["hardware_id"] / "gpu.json"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The common benchmark flags (``--quick``, ``--json``, as ``_common.parse_args``) plus part selection."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short setting (about a minute on a GPU)")
    p.add_argument("--json", metavar="PATH", help="write the figures here (default: benchmarks/results/<hw>/gpu.json)")
    p.add_argument("--parts", default=",".join(PART_ORDER), help=f"comma-separated subset of {','.join(PART_ORDER)}")
    p.add_argument("--device", choices=("auto", "cpu"), default="auto",
                   help="cpu: run every part's code path at tiny sizes on the CPU (a self-test; timings meaningless)")
    p.add_argument("--budget-s", type=float, default=None, help="total time for the parts (default per setting)")
    args = p.parse_args(argv)
    parts = [s.strip() for s in args.parts.split(",") if s.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        p.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PART_ORDER)}")
    args.parts = [name for name in PART_ORDER if name in parts]
    return args


def print_table(figures: list[dict[str, Any]]) -> None:
    for f in figures:
        ci = f" [{f['ci95'][0]:.4g}, {f['ci95'][1]:.4g}]" if f["ci95"] else ""
        goal = f"  goal {f['goal']}: {'met' if f['met'] else 'NOT met'}" if f["goal"] and f["met"] is not None else ""
        note = f"  ({f['note']})" if f["note"].startswith("skipped") else ""
        print(f"{f['name']:<60} {f['value']:>10.4g} {f['unit']}{ci}{goal}{note}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.monotonic()

    def log(msg: str) -> None:
        print(f"[gpu {time.monotonic() - t_start:6.1f}s] {msg}", flush=True)

    reason = no_cuda_reason()
    if args.device == "cpu":
        device, sz = torch.device("cpu"), TINY
    elif reason is None:
        device, sz = torch.device("cuda", torch.cuda.current_device()), (QUICK if args.quick else FULL)
    else:
        device, sz = None, None
    path = Path(args.json) if args.json else default_json_path()
    report = Report(path=path, quick=args.quick, env=environment_stamp(device or "cpu"),
                    setting=sz.name if sz else "skipped")
    if device is None:
        log(f"{reason}: the GPU parts are skipped")
        for name in args.parts:
            report.figures.append(skipped(f"{name}: all arms", reason, name, unit=""))
            report.parts[name] = {"status": "skipped", "seconds": 0.0, "error": reason, "figures": 1}
        report.write()
        print_table(report.figures)
        log(f"wrote {path} (every part skipped on this machine: no CUDA)")
        return 0
    log(f"device {report.env.get('device_name')} ({device}); setting {sz.name}; parts {', '.join(args.parts)}")
    if device.type == "cpu":
        log("cpu self-test: tiny sizes, timings meaningless")
    total = args.budget_s if args.budget_s is not None else sz.total_budget_s
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)  # the self-test runs on shared 2-core boxes: stay on one core
    try:
        run_parts(args.parts, device, sz, total, report, log)
    finally:
        torch.set_num_threads(threads)
    print_table(report.figures)
    log(f"wrote {path} ({len(report.figures)} figures)")
    return 0


def run_parts(parts: Sequence[str], device: torch.device, sz: Settings, total: float, report: Report,
              log: Callable[[str], None]) -> None:
    """Each part in turn under min(its budget, what is left of ``total``); past ``total`` a part is a skip."""
    part_t0 = time.monotonic()
    for name in parts:
        used = time.monotonic() - part_t0
        if used > total:
            report.figures.append(skipped(f"{name}: all arms", f"time budget ({total:.0f} s) used up before this "
                                                                f"part", name, unit=""))
            report.parts[name] = {"status": "skipped", "seconds": 0.0, "error": "time budget", "figures": 1}
            report.write()
            log(f"part {name}: skipped (time budget used up)")
            continue
        budget = min(sz.budgets_s[name], total - used)
        ctx = PartContext(device=device, sz=sz, deadline=time.monotonic() + budget, log=log, checkpoint=report.write)
        run_part(name, ctx, report)


if __name__ == "__main__":
    sys.exit(main())
