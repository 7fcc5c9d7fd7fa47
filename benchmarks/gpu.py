"""The GPU parts of every technique benchmark, in one run that fits a single H200 session (under 7 minutes).

    bash benchmarks/gpu.sh [OUT_DIR]          # writes OUT_DIR/gpu.json (default benchmarks/results/<hardware-id>/)
    python benchmarks/gpu.py [--quick] [--json PATH] [--parts precision,data,...]

Why one script: a GPU is lent for minutes, not hours, so everything that needs CUDA runs from one command, each
part under its own time budget, and the JSON is rewritten after every part (and after every sub-case), so a
run cut short still leaves what it measured. Every part measures its arms interleaved (A B C, A B C, ...)
over >= 3 repeats, synchronises the device around each timed block (``torch.cuda.synchronize``), drops the
warm-up, and reports ratios of medians with a bootstrap 95 % CI (``lab.measure.bootstrap_ratio_ci``).
A part that fails records an entry with the error and the run goes on; an arm that cannot run here (an API
missing from this torch / torchao) is a figure with value NaN and the note "skipped: <why>".

Why each part runs in a child process of its own (this file again, with the hidden ``--one-part NAME --part-json
PATH``): a native crash in a kernel (SIGABRT or SIGSEGV from oneDNN, cuDNN or a torchao extension, which no
``except`` can catch; oneDNN's AVX2 1x1 backward-weights kernel did exactly that, see ``precision_vision``) must
cost that part, not the run and its JSON. The child writes its figures to its part file at every checkpoint; the
parent, the only writer of ``gpu.json``, copies them in as they come and streams the child's output. A child that
dies is the part's entry with status "error", the signal ("killed by SIGABRT") and ``output_tail``, the last
~2000 characters of its output (``faulthandler`` is on, so that holds the Python stack of the crash). The parent
also holds the budget, since a native call cannot be interrupted from inside its process: a child still running
``GRACE_S`` plus half its budget past its budget is killed and recorded with status "timeout". Each child costs a
few seconds of start-up (import torch, CUDA context). ``--in-process`` runs the parts in this process instead (a
debugger, a profiler, a test that swaps a part).

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
5. ``memory`` (``benchmarks/memory.py``): each memory lever's training-step peak from the CUDA allocator
   (``max_memory_allocated``) and its step time against torch's Adam: every block checkpointed, torchao
   ``AdamW8bit`` (its first-step compile a figure of its own), torchao ``CPUOffloadOptimizer``; the transformer
   ladder's top rung (and the vision ladder's in the full setting).
6. ``quantization`` (``benchmarks/quantization.py``): torchao int8 / int4 weight-only at batch 1 against bf16,
   eager and compiled (last: compile time).

Without CUDA the script still runs (seconds), says so, and writes ``gpu.json`` with one skipped entry per
part ("skipped: no CUDA device ..."); exit code 0. ``--device cpu`` instead runs every part's code path at
tiny sizes on the CPU (a self-test used by ``tests/bench/test_gpu_bench.py``; its timings mean nothing).

The H200 box has torch, torchao, numpy, pandas and pyarrow only, so this module and what it imports from
``lab`` import nothing else (the test proves it with an import blocker).

Layout: this file only drives the parts (flags, the part loop, the child processes, the report); each part is
``gpu_part(ctx, figs)`` in its family's benchmark file, beside that family's CPU benchmark (whose ``main`` runs only
when the file is run as a script); the sizes, budgets, part context and ``gpu.json`` writer are in
``benchmarks/_gpu.py``; every timing goes through ``lab.measure`` (``interleaved_ms``, ``block_ms``).
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import data_loading
import distributed
import memory
import precision
import pruning
import quantization
import torch
from _common import skipped
from _gpu import FULL, QUICK, TINY, GpuPart, PartContext, Report, Settings, free_memory, no_cuda_reason

from lab.measure import environment_stamp, error_text

PART_ORDER = ("precision", "data", "pruning", "distributed", "memory", "quantization")  # quantization last: compiles
FAMILIES = PART_ORDER

PARTS: dict[str, GpuPart] = {
    "precision": precision.gpu_part, "data": data_loading.gpu_part, "pruning": pruning.gpu_part,
    "distributed": distributed.gpu_part, "memory": memory.gpu_part, "quantization": quantization.gpu_part,
}
"""Part name (the figures' family) -> the ``gpu_part`` of that family's benchmark file."""

GRACE_S = 30.0
"""A child part is killed once it runs this much (plus half its budget) past its budget: parts check their deadline
only between rounds, so some overrun is normal; a child that far past it is stuck (a hung kernel, an arm that takes
minutes per step)."""

CRASH_HOOK = "LAB_GPU_BENCH_CRASH_PART"
"""Test hook (``tests/bench/test_gpu_bench.py``): a child whose part is named in this variable calls ``os.abort()``
as it starts, standing in for a native crash. Nothing else reads it."""

TAIL_CHARS = 2000


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


def run_part_isolated(name: str, args: argparse.Namespace, budget: float, report: Report, log: Callable[[str], None],
                      clock_origin: float) -> None:
    """Run one part in a child process (see the module docstring); the same report entry as ``run_part``, or,
    when the child dies or overruns, an "error" / "timeout" entry with the cause and the child's last output."""
    start = len(report.figures)
    t0 = time.perf_counter()  # the part's wall time for the report's bookkeeping, one event: not a measurement
    deadline = time.monotonic() + budget
    kill_at = deadline + GRACE_S + budget / 2
    with tempfile.TemporaryDirectory(prefix=f"gpu-{name}-") as tmp:
        part_json, out_path = Path(tmp) / "part.json", Path(tmp) / "output.log"
        cmd = [sys.executable, "-X", "faulthandler", str(Path(__file__).resolve()), "--device", args.device,
               "--one-part", name, "--part-json", str(part_json), "--part-deadline", repr(deadline),
               "--clock-origin", repr(clock_origin), *(["--quick"] if args.quick else [])]
        timed_out, seen = False, None
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        with open(out_path, "wb") as out, open(out_path, "rb") as reader:
            # Own session: a kill reaches the child's own children too (DataLoader workers, process groups).
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
            try:
                while True:
                    try:
                        rc: int | None = proc.wait(timeout=0.5)
                    except subprocess.TimeoutExpired:
                        rc = None
                    sys.stdout.write(decoder.decode(reader.read()))  # the child's log, as it comes
                    sys.stdout.flush()
                    seen = _copy_checkpoint(part_json, seen, report, start)
                    if rc is not None:
                        break
                    if time.monotonic() > kill_at:
                        timed_out = True
                        _kill(proc)
                        rc = proc.wait()
                        break
            finally:
                if proc.poll() is None:  # interrupted (Ctrl-C): no orphan left holding the device
                    _kill(proc)
                    proc.wait()
            sys.stdout.write(decoder.decode(reader.read(), final=True))
        tail = out_path.read_bytes()[-4 * TAIL_CHARS:].decode("utf-8", errors="replace")[-TAIL_CHARS:]
        doc = _read_json(part_json)
    figs = doc["figures"] if doc else []
    entry = doc["parts"].get(name) if doc and rc == 0 and not timed_out else None
    if entry is None:
        secs = time.perf_counter() - t0
        if timed_out:
            status, error = "timeout", f"timed out: killed {secs:.1f} s after its start (budget {budget:.3g} s)"
        elif rc is not None and rc < 0:
            try:
                sig = signal.Signals(-rc).name
            except ValueError:
                sig = f"signal {-rc}"
            status, error = "error", f"killed by {sig} (a native crash: see output_tail)"
        else:
            status, error = "error", f"child exited with code {rc} without a result (see output_tail)"
        figs.append(skipped(f"{name}: part failed", f"error: {error}", name))
        entry = {"status": status, "seconds": round(secs, 2), "error": error, "figures": len(figs), "output_tail": tail}
        log(f"part {name}: {status} in {secs:.1f} s ({len(figs)} figures): {error}")
    report.figures[start:] = figs
    report.parts[name] = entry
    report.write()


def _copy_checkpoint(part_json: Path, seen: int | None, report: Report, start: int) -> int | None:
    """Copy the child's latest checkpoint (its figures so far) into ``gpu.json`` when its part file changed."""
    try:
        mtime = part_json.stat().st_mtime_ns
    except OSError:
        return seen
    doc = _read_json(part_json) if mtime != seen else None
    if doc is not None:
        report.figures[start:] = doc["figures"]
        report.write()
    return mtime


def _read_json(path: Path) -> dict[str, Any] | None:
    try:  # written atomically (``Report.write``): either the previous or the new checkpoint, never half of one
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def run_child(args: argparse.Namespace, device: torch.device, sz: Settings, log: Callable[[str], None]) -> int:
    """The child side of ``run_part_isolated``: one part, written to ``--part-json`` (an envelope of its own, with
    its figures at every checkpoint and its ``parts`` entry at the end), then exit."""
    name = args.one_part
    report = Report(path=Path(args.part_json), quick=args.quick, env={}, setting=sz.name)
    ctx = PartContext(device=device, sz=sz, deadline=args.part_deadline, log=log, checkpoint=report.write)
    if os.environ.get(CRASH_HOOK) == name:
        log(f"part {name}: {CRASH_HOOK}={name}: aborting (test hook)")
        os.abort()
    if device.type == "cpu":
        torch.set_num_threads(1)  # the self-test runs on shared 2-core boxes: stay on one core
    run_part(name, ctx, report)
    return 0


def default_json_path() -> Path:
    """``benchmarks/results/<hardware-id>/gpu.json``; the GPU's id when one is present."""
    return Path(__file__).resolve().parent / "results" / environment_stamp("auto")["hardware_id"] / "gpu.json"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The common benchmark flags (``--quick``, ``--json``, as ``_common.parse_args``) plus part selection."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short setting (about two minutes on a GPU)")
    p.add_argument("--json", metavar="PATH", help="write the figures here (default: benchmarks/results/<hw>/gpu.json)")
    p.add_argument("--parts", default=",".join(PART_ORDER), help=f"comma-separated subset of {','.join(PART_ORDER)}")
    p.add_argument("--device", choices=("auto", "cpu"), default="auto",
                   help="cpu: run every part's code path at tiny sizes on the CPU (a self-test; timings meaningless)")
    p.add_argument("--budget-s", type=float, default=None, help="total time for the parts (default per setting)")
    p.add_argument("--in-process", action="store_true",
                   help="run the parts in this process, not each in a child process (a debugger, a profiler)")
    for hidden in ("--one-part", "--part-json"):  # the child side of the isolation (run_part_isolated)
        p.add_argument(hidden, help=argparse.SUPPRESS)
    for hidden in ("--part-deadline", "--clock-origin"):  # time.monotonic() values of the parent (one clock per box)
        p.add_argument(hidden, type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one_part is not None and (args.one_part not in PARTS or not args.part_json or args.part_deadline is None):
        p.error("--one-part NAME needs a known part, --part-json and --part-deadline (it is gpu.py's own child mode)")
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
    t_start = time.monotonic() if args.clock_origin is None else args.clock_origin  # a child logs on the parent's clock

    def log(msg: str) -> None:
        print(f"[gpu {time.monotonic() - t_start:6.1f}s] {msg}", flush=True)

    reason = no_cuda_reason()
    if args.device == "cpu":
        device, sz = torch.device("cpu"), TINY
    elif reason is None:
        device, sz = torch.device("cuda", torch.cuda.current_device()), (QUICK if args.quick else FULL)
    else:
        device, sz = None, None
    if args.one_part is not None:
        if device is None or sz is None:
            raise SystemExit(f"--one-part {args.one_part}: {reason}")
        return run_child(args, device, sz, log)
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
        run_parts(args, device, sz, total, report, log, t_start)
    finally:
        torch.set_num_threads(threads)
    print_table(report.figures)
    log(f"wrote {path} ({len(report.figures)} figures)")
    return 0


def run_parts(args: argparse.Namespace, device: torch.device, sz: Settings, total: float, report: Report,
              log: Callable[[str], None], clock_origin: float) -> None:
    """Each part in turn (in a child process unless ``--in-process``) under min(its budget, what is left of
    ``total``); past ``total`` a part is a skip."""
    part_t0 = time.monotonic()
    for name in args.parts:
        used = time.monotonic() - part_t0
        if used > total:
            report.figures.append(skipped(f"{name}: all arms", f"time budget ({total:.0f} s) used up before this "
                                                                f"part", name, unit=""))
            report.parts[name] = {"status": "skipped", "seconds": 0.0, "error": "time budget", "figures": 1}
            report.write()
            log(f"part {name}: skipped (time budget used up)")
            continue
        budget = min(sz.budgets_s[name], total - used)
        if not args.in_process:
            run_part_isolated(name, args, budget, report, log, clock_origin)
            continue
        ctx = PartContext(device=device, sz=sz, deadline=time.monotonic() + budget, log=log, checkpoint=report.write)
        run_part(name, ctx, report)


if __name__ == "__main__":
    sys.exit(main())
