"""``--profile``: the op-class breakdown of a run's training step and of its final model's inference.

Why after the timed training, on a copy: the profiler slows every op it records, so the run's own timings
never include it; it captures a few steady-state steps of a copy of the trained model, the same step the run
took (its loader, optimizer, precision, accumulation and, data-parallel, a DDP wrap of the copy), then a few
inference calls at the eval batch. :mod:`lab.measure.profile` classifies the events; this module drives the
capture through a run's :class:`~lab.context.TrainContext`. Taught in ``notebooks/08_doctor.ipynb``.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import torch
from torch import nn

from lab import distributed
from lab.compute import compiled_scatter_why
from lab.context import TrainContext
from lab.loop import FitStats, to_device
from lab.measure import profile as op_profile
from lab.store import default_store_path
from lab.technique import PROFILE_PHASE

#: ``--profile``: steps the profiler skips, then records, after (never inside) the timed training.
PROFILE_WARMUP_STEPS, PROFILE_ACTIVE_STEPS = 2, 5


def _copy_or_none(model: nn.Module) -> nn.Module | None:
    try:
        return copy.deepcopy(model)
    except Exception:  # a model that cannot be copied is not profiled; the run itself goes on
        return None


def trace_path_for(run_id: str) -> Path:
    """Where ``--profile`` writes a run's Chrome trace: beside the results store, ``traces/<run_id>.json``."""
    return default_store_path().parent / "traces" / f"{run_id}.json"


def capture_training_profile(ctx: TrainContext, model: nn.Module) -> tuple[op_profile.StepCapture, FitStats] | None:
    """``--profile``, in every rank: a few steady-state training steps of a copy of the trained model under
    ``torch.profiler``, after the timed steps (the run's timings never include the profiler), the same step the
    run took: its loader, optimizer, precision, accumulation and, data-parallel, a DDP wrap of the copy
    (:func:`lab.distributed.profiled`: all ranks run the steps, as their all-reduces need; each rank
    profiles, so none waits on a peer slowed by its profiler). A compiled run's copy is compiled too, its generated
    kernels named in the trace (:mod:`lab.compute`), so the breakdown is of the compiled step, not of an eager
    one scaled to its time. Rank 0 keeps the capture and writes the Chrome trace; other ranks return ``None``."""
    train_model = _copy_or_none(model)
    if train_model is None:
        return None
    main = ctx.is_main_rank
    cap = op_profile.StepCapture(warmup=PROFILE_WARMUP_STEPS, active=PROFILE_ACTIVE_STEPS,
                                 trace_path=trace_path_for(ctx.result.run_id) if main else None,
                                 cuda=ctx.device.type == "cuda")
    loader = op_profile.AnnotatedLoader(ctx.make_loader())
    n = PROFILE_WARMUP_STEPS + PROFILE_ACTIVE_STEPS
    accum = ctx.cfg.ddp.grad_accum_steps
    with distributed.profiled(ctx, train_model) as profiled_model, cap.running():
        stats = ctx.fit(profiled_model, epochs=math.ceil((n + 1) * accum / max(1, len(loader))), lr=ctx.resolved.lr,
                        max_steps=n, step_hooks=[cap.hook], phase=PROFILE_PHASE, loader=loader, probe=True)
    return (cap, stats) if main else None


def profile_run(ctx: TrainContext, captured: tuple[op_profile.StepCapture, FitStats] | None,
                final_model: nn.Module) -> None:
    """``--profile`` on rank 0: the op-class breakdown of the captured training steps
    (:func:`capture_training_profile`), scaled to the run's median step, and of a few inference calls of the
    final model at the eval batch, in ``details["profile"]``; the trace path (:func:`trace_path_for`)."""
    result, rec = ctx.result, ctx.result.details.setdefault("profile", {})
    if captured is None:
        rec["note"] = "not profiled: a model that cannot be copied"
        return
    cap, stats = captured
    path = cap.trace_path
    prof_steps = stats.step_times_ms["total"][PROFILE_WARMUP_STEPS:]
    timed = result.measured_ms()
    step_ms = float(sorted(timed)[len(timed) // 2]) if timed else sum(prof_steps) / max(1, len(prof_steps))
    waits = result.measured_ms("data_wait")
    wait_ms = float(sorted(waits)[len(waits) // 2]) if waits else None
    train = op_profile.breakdown(cap.events, n_steps=max(1, len(prof_steps)), step_ms=step_ms, data_wait_ms=wait_ms,
                                 profiled_step_ms=sum(prof_steps) / max(1, len(prof_steps)))
    rec.update(train=train.to_dict(), trace=str(path) if path is not None and path.exists() else None,
               steps={"warmup": PROFILE_WARMUP_STEPS, "active": len(prof_steps)},
               world_size=ctx.cfg.ddp.world_size, rank=0, compiled=bool(ctx.cfg.compute.compile))
    why = compiled_scatter_why(train.top_ops, train.profiled_step_ms) if ctx.cfg.compute.compile else None
    if why:
        result.why.append(why)
    test = ctx.data.test
    k = min(ctx.cfg.eval_batch_size, len(test[0]))
    batch = to_device(tuple(t[:k] for t in test[:-1]), ctx.device)
    key = f"batch_{k}"
    was = final_model.training
    final_model.eval()
    try:
        with torch.no_grad():
            events, wall_ms = op_profile.profile_calls(lambda: final_model(*batch), calls=5)
    finally:
        final_model.train(was)
    lat = result.latency_median_ms(key)
    rec["inference"] = op_profile.breakdown(events, n_steps=5, step_ms=lat or wall_ms,
                                            profiled_step_ms=wall_ms).to_dict() | {"batch": k}


__all__ = ["PROFILE_ACTIVE_STEPS", "PROFILE_WARMUP_STEPS", "capture_training_profile", "profile_run",
           "trace_path_for"]
