"""``run(cfg) -> RunResult``: orchestration only. Every technique in the lab is measured through it.

The order of a run (docs/architecture.md section 3): :func:`check` every family before any work ->
:func:`lab.context.prepare` (data, threads, the result record) -> join the process group when data-parallel ->
build the model ->
each technique's ``before_training`` (fast kernels, pruning masks or schedule, DDP wrap) -> ``ctx.fit``
(the loop, with the loader, precision and compile the doors contribute) -> ``after_training`` (unwrap
DDP; prune + fine-tune, then quantize: int8 of a pruned model, never pruning of an int8 one) -> evaluate
-> measure the final model. The technique packages are installed here, in the order their contributions
to a fit apply; :mod:`lab.context` reaches them only through :func:`lab.context.install_doors`.

Run it: ``python -m lab run --workload ctr --size small`` (notebooks/00_tour.ipynb walks through it).
"""

from __future__ import annotations

import copy
import math
import traceback
from pathlib import Path

import torch
from torch import nn

from lab import compute, data, distributed, precision, pruning, quant
from lab.config import RunConfig
from lab.context import TrainContext, before_training, install_doors, prepare, resolve_device
from lab.loop import FitStats, ProgressFn, to_device
from lab.measure import (
    count_macs_by_dtype,
    count_nonzero_params,
    count_params,
    inference_latency_ms,
    serialized_size_bytes,
    weights_used_per_sample_guard,
)
from lab.measure import profile as op_profile
from lab.result import RunResult
from lab.store import default_store_path
from lab.workloads.contract import check_contract

#: Technique packages in the order their doors apply: data builds the loader that distributed slices;
#: compute swaps in fast kernels before pruning sees the model; pruning before quantization; DDP wraps last.
DOORS = (data, compute, precision, pruning, quant, distributed)
install_doors(DOORS)
assert DOORS[-1] is distributed  # its before_training (the DDP wrap) must come last, after evaluating

def check(cfg: RunConfig) -> None:
    """Every family's checks that need the machine or the workload (CUDA present, a backend, a workload
    with fast kernels), before any data is made or any rank spawned. Config values are checked by
    :class:`lab.config.RunConfig` itself."""
    resolve_device(cfg.device)
    for door in DOORS:
        door.check(cfg)


def run(cfg: RunConfig, *, progress: ProgressFn | None = None, on_error: str = "raise") -> RunResult:
    """Train ``cfg``'s workload once and measure it.

    ``progress`` receives a small dict per step (``phase``, ``step``, ``total_steps``, ``epoch``, ``loss``)
    and once per evaluation. ``on_error="record"`` turns a failure during the run into a RunResult with
    ``status="error"`` (what an ablation stores as an error row); ``"raise"`` re-raises. Configuration
    problems always raise before any work starts.
    """
    if on_error not in ("raise", "record"):
        raise ValueError(f"on_error={on_error!r} is invalid: allowed: raise, record")
    check(cfg)
    if cfg.ddp.world_size > 1 and not distributed.detect_launch().distributed:
        return distributed.spawn_run(cfg, run)  # one process per rank, each comes back here under the launcher
    with prepare(cfg, progress=progress) as ctx:
        preflight(ctx)  # what needs the data or the model: refused before training, never an error row
        try:
            _train_and_measure(ctx)
        except Exception as exc:
            if on_error == "raise":
                raise
            ctx.result.status = "error"
            ctx.result.error = f"{type(exc).__name__}: {exc}"
            ctx.result.details["traceback"] = traceback.format_exc(limit=8)
    return ctx.result


def preflight(ctx: TrainContext) -> None:
    """Checks that need the data or a model, before any training: the workload contract on a few rows,
    the batch against the train split, the warm-up against the steps, and each technique's model-dependent
    names (its optional ``preflight(ctx, model)`` verb). A fresh model is built for it (and thrown away: the run
    builds its own from the same seed)."""
    cfg, r = ctx.cfg, ctx.resolved
    model = ctx.new_model()
    check_contract(r.workload, ctx.data, model, ctx.device)
    n_train = len(ctx.data.train[0])
    if cfg.data.drop_last and r.batch_size > n_train:
        raise ValueError(f"batch_size={r.batch_size} is invalid: larger than the train split ({n_train} rows) "
                         "with data.drop_last; lower --batch-size")
    accum = cfg.ddp.grad_accum_steps
    total = ctx.total_steps()
    if total < 1:
        raise ValueError(f"the run would take no step ({r.epochs} epoch(s) of {len(ctx.make_loader())} batches, "
                         f"grad_accum_steps={accum}); lower --batch-size or --ddp-grad-accum-steps")
    if cfg.warmup_steps >= total:
        raise ValueError(f"warmup_steps={cfg.warmup_steps} is invalid: the run takes {total} step(s), so no step "
                         "would be measured; lower --warmup-steps or train longer")
    for door in DOORS:
        door_preflight = getattr(door, "preflight", None)
        if door_preflight is not None:
            door_preflight(ctx, model)


def _train_and_measure(ctx: TrainContext) -> None:
    cfg, r, result, progress = ctx.cfg, ctx.resolved, ctx.result, ctx.progress
    wl, device, split = r.workload, r.device, ctx.data
    ctx.ddp, created_group = distributed.setup_for_run(cfg, device)
    model = ctx.new_model()
    steps_per_epoch = len(ctx.make_loader())
    result.details.update({
        "resolved": {"epochs": r.epochs, "batch_size": r.batch_size, "lr": r.lr, "device": str(device),
                     "steps_per_epoch": steps_per_epoch, "n_train": len(split.train[0]),
                     "n_test": len(split.test[0])},
        "data_info": split.info,
        "threads": {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads(),
                    "loader_workers": cfg.data.num_workers},
    })

    model, hooks = before_training(ctx, model)  # every door but distributed, whose wrap comes after evaluating
    if ctx.is_main_rank:
        before = ctx.evaluate(model)
        result.metric_before = before[wl.metric_name]
        if progress:
            progress({"phase": "eval_before", "metrics": before})
    model, more = distributed.before_training(ctx, model)
    hooks.extend(more)
    stats = ctx.fit(model, epochs=r.epochs, lr=r.lr, max_steps=cfg.max_steps, step_hooks=hooks)
    model = distributed.after_training(ctx, model)  # unwrap DDP, describe, leave the group we created
    # --profile: every rank (DDP ranks all-reduce together), before int8 / pruning and leaving the group
    captured = capture_training_profile(ctx, model) if cfg.profile else None
    if created_group:
        distributed.finish()
    if not ctx.is_main_rank:
        return
    result.train_time_s = stats.time_s
    result.steps = stats.steps
    result.losses = stats.losses
    result.step_times_ms = stats.step_times_ms
    result.peak_memory_mb, result.memory_kind = stats.peak_memory_mb, stats.memory_kind
    for door in DOORS:
        if door is not distributed:
            model = door.after_training(ctx, model)

    after = ctx.evaluate(model)
    result.metrics = after
    result.metric = after[wl.metric_name]
    if result.metric != result.metric:
        raise FloatingPointError(f"{wl.metric_name} is NaN after training: check evaluate() and the test split")
    if not (cfg.prune.enabled or cfg.quant.enabled):  # the model evaluated is the one training produced
        capped = stats.steps < r.epochs * (steps_per_epoch // cfg.ddp.grad_accum_steps)
        diverged = divergence_why(result, wl.chance, wl.higher_is_better, r.lr, capped=capped)
        if diverged:
            result.status, result.error = "diverged", diverged
            result.why.append(diverged)
        else:
            why = learning_why(result.metric, result.metric_before, wl.chance, wl.higher_is_better, wl.metric_name,
                               baseline=not cfg.enabled_families())
            if why:
                result.why.append(why)
    if progress:
        progress({"phase": "eval", "metrics": after})

    _measure_model(ctx, model)
    if cfg.profile:
        profile_run(ctx, captured, model)
    if progress:
        progress({"phase": "done"})


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
    profiles, so none waits on a peer slowed by its profiler). ``torch.compile`` is left out: it applies to the
    main phase only. Rank 0 keeps the capture and writes the Chrome trace; other ranks return ``None``."""
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
                        max_steps=n, step_hooks=[cap.hook], phase="profile", loader=loader, probe=True)
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
               world_size=ctx.cfg.ddp.world_size, rank=0)
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


#: "Clearly better": the trained metric must beat the reference (untrained model, or chance) by 2 % of it.
LEARNED_MARGIN = 0.02
#: A loss that ends this many times above where it started has diverged.
LOSS_RISE_FACTOR = 10.0
#: A full schedule whose loss ends this far above the untrained model's (its first step's) has diverged, even
#: when it had already exploded within the first quarter (ctr at --lr 10: step 0 0.69, first quarter 40, last 11,
#: AUC 0.57 above untrained 0.48: stored "ok" before this rule). The margin absorbs a flat run's batch noise.
LOSS_END_FACTOR = 1.25


def divergence_why(result: RunResult, chance: float | None, higher_is_better: bool, lr: float, *,
                   capped: bool = False) -> str | None:
    """Why a finished run is not a result: its loss rose by :data:`LOSS_RISE_FACTOR` (median of the last
    quarter of steps against the first), or, for a run that trained its full schedule (not ``capped`` by
    ``max_steps``: a speed probe of a few steps is not expected to learn), its loss ended
    :data:`LOSS_END_FACTOR` above the untrained model's (the first step's) or its metric ended at or below the
    untrained model's (or chance). ``None`` when it trained."""
    losses = result.losses
    if len(losses) >= 8:
        q = max(2, len(losses) // 4)
        first, last = sorted(losses[:q])[q // 2], sorted(losses[-q:])[q // 2]
        if first > 0 and last > LOSS_RISE_FACTOR * first:
            return f"diverged: the loss rose from {first:.4g} to {last:.4g} (lr={lr:g}): lower the lr"
        untrained = losses[0]
        if not capped and untrained > 0 and last > LOSS_END_FACTOR * untrained:
            return (f"diverged: the loss ended at {last:.4g}, above the untrained model's {untrained:.4g} "
                    f"(peak {max(losses):.4g}; lr={lr:g}): lower the lr")
    refs = [x for x in (result.metric_before, chance) if x is not None and x == x]
    if refs and result.metric is not None and not capped:
        ref = max(refs) if higher_is_better else min(refs)
        if (result.metric <= ref) if higher_is_better else (result.metric >= ref):
            return (f"diverged: {result.metric_name} {result.metric:.4g} is no better than untrained / chance "
                    f"({ref:.4g}) after training (lr={lr:g}): lower the lr, or train longer")
    return None


def learning_why(metric: float, before: float | None, chance: float | None, higher_is_better: bool, name: str,
                 *, baseline: bool) -> str | None:
    """The "did not learn" tag when the trained ``metric`` is not clearly better than the untrained model
    and than chance (where the workload states it): accuracy deltas measured on such a run mean nothing."""
    refs = [r for r in (before, chance) if r is not None and r == r]
    if not refs or metric != metric:
        return None
    ref = max(refs) if higher_is_better else min(refs)
    margin = LEARNED_MARGIN * max(abs(ref), 1e-12)
    learned = metric > ref + margin if higher_is_better else metric < ref - margin
    if learned:
        return None
    parts = ([f"untrained {before:.4g}"] if before is not None else []) + (
        [f"chance {chance:.4g}"] if chance is not None else [])
    who = "baseline" if baseline else "run"
    return (f"{who} did not learn: {name} {metric:.4g} vs " + ", ".join(parts)
            + " (train longer, raise the lr or pick a larger size before reading accuracy deltas)")


def _measure_model(ctx: TrainContext, model: nn.Module) -> None:
    """Static facts about the trained model plus its inference latency at batch 1 and batch N."""
    cfg, result, device, test = ctx.cfg, ctx.result, ctx.device, ctx.data.test
    one = tuple(t[:1] for t in test[:-1])
    result.param_count = count_params(model)
    result.nonzero_params = count_nonzero_params(model)
    result.model_bytes = serialized_size_bytes(model)
    by_dtype = count_macs_by_dtype(model, to_device(one, device))
    result.macs_per_sample = by_dtype["fp32"] + by_dtype["int8"]
    result.int8_macs_per_sample = by_dtype["int8"]
    undercounted = weights_used_per_sample_guard(model, result.macs_per_sample)
    if undercounted:  # a count that cannot be right is said, not silently reported
        result.why.append(undercounted)
    if cfg.latency_repeats:
        n = min(cfg.eval_batch_size, len(test[0]))
        many = tuple(t[:n] for t in test[:-1])
        result.latency_ms = {
            "batch_1": inference_latency_ms({"m": model}, to_device(one, device), repeats=cfg.latency_repeats,
                                            warmup=3)["m"],
            f"batch_{n}": inference_latency_ms({"m": model}, to_device(many, device),
                                               repeats=max(3, cfg.latency_repeats // 4), warmup=3)["m"],
        }
