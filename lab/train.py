"""``run(cfg) -> RunResult``: the run flow, top to bottom. Every technique in the lab is measured through it.

Check every technique before any work -> pick the run's launcher (:meth:`lab.technique.TechniqueChain.launcher`)
-> ``launch`` (the ranks elsewhere, or) :func:`lab.context.prepare` the data, threads and result record ->
``join`` the group of processes -> preflight -> the model -> each technique's ``before_training`` -> evaluate the
untrained model -> ``wrap`` -> ``ctx.fit`` (the loop, with the loader, precision and compile the techniques
contribute) -> ``unwrap`` -> ``--profile`` -> ``leave`` -> rank 0: ``after_training`` (prune + fine-tune, then
quantize: int8 of a pruned model, never pruning of an int8 one) -> evaluate and judge -> measure the final model.
``launch``, ``join``, ``wrap``, ``unwrap`` and ``leave`` are the launcher's (:class:`lab.technique.Launcher`),
the other stages :class:`lab.technique.Technique`'s; the techniques come as one ordered
:class:`lab.technique.TechniqueChain`, which also picks the launcher, and nothing here names a family.

Run it: ``python -m lab run --workload ctr --size small`` (notebooks/00_tour.ipynb walks through it).
"""

from __future__ import annotations

import torch
from torch import nn

from lab import measure
from lab.config import RunConfig, load_workload
from lab.context import TrainContext, prepare, resolve_device
from lab.loop import ProgressFn, to_device
from lab.profiling import capture_training_profile, profile_run
from lab.result import RunResult, health
from lab.result.failure import FAILURE, Failure, describe, frames_text, tagged
from lab.technique import Launcher, TechniqueChain, default_chain
from lab.workloads.contract import check_contract


def check(cfg: RunConfig, techniques: TechniqueChain | None = None) -> None:
    """What the config asks of this machine (CUDA present, a backend, a workload with fast kernels), before any
    data is made or any rank spawned. Config values are checked by :class:`lab.config.RunConfig` itself; a
    workload spec is loaded here (:func:`lab.config.load_workload`), so a bad one fails first."""
    cfg = load_workload(cfg)
    resolve_device(cfg.device)
    (default_chain() if techniques is None else techniques).check(cfg)


def run(cfg: RunConfig, *, progress: ProgressFn | None = None, on_error: str = "raise",
        techniques: TechniqueChain | None = None) -> RunResult:
    """Train ``cfg``'s workload once and measure it.

    ``progress`` receives a small dict per step (``phase``, ``step``, ``total_steps``, ``epoch``, ``loss``)
    and once per evaluation. ``on_error="record"`` turns a failure during the run into a RunResult whose
    ``status`` is ``failed`` (or ``refused``, where the lab declined mid-run) and whose ``error`` is one line
    naming the technique, the stage, the line of the model's code that raised, what was tried and what to do
    (:func:`failure_of`; ``details["failure"]`` holds its parts): what an ablation stores as an error row.
    ``"raise"`` re-raises the exception itself, that line added as a note (and as its ``lab_failure``).
    Configuration problems always raise before any work starts (a ``ValueError``, one line). ``techniques``
    defaults to every registered family (:func:`lab.technique.default_chain`); spawned ranks run the default chain.
    """
    if on_error not in ("raise", "record"):
        raise ValueError(f"on_error={on_error!r} is invalid: allowed: raise, record")
    chain = default_chain() if techniques is None else techniques
    cfg = load_workload(cfg)  # a spec imported here, where the run is prepared, not when the config was built
    check(cfg, chain)
    launcher = chain.launcher(cfg)  # single process, unless a family's launcher applies (data-parallel)
    meter = measure.ContentionMeter().start()  # was the machine busy while this run was timed?
    launched = launcher.launch(cfg, run)  # ranks nobody started (no torchrun): one process each, each back here
    if launched is not None:
        measure.attach(launched, meter.stop())  # the launching process sees every rank as its own
        return launched
    with prepare(cfg, progress=progress, techniques=chain) as ctx:
        launcher.join(ctx)
        preflight(ctx)  # what needs the data or the model: refused before training, never an error row
        try:
            train_and_measure(ctx, launcher)
        except Exception as exc:
            failure = failure_of(ctx, exc)
            if on_error == "raise":
                if getattr(exc, FAILURE, None) is None:
                    exc.add_note(failure.line())
                    setattr(exc, FAILURE, failure)
                raise
            ctx.result.status, ctx.result.error = failure.status, failure.line()
            ctx.result.details["failure"] = {**failure.to_dict(), "frames": frames_text(exc)}
    measure.attach(ctx.result, meter.stop(), sibling_ranks=measure.sibling_ranks())
    return ctx.result


#: ``ctx.state`` key of the stage :func:`train_and_measure` is in (what a failure outside a technique's own stage
#: is attributed to).
STAGE = "run_stage"


def failure_of(ctx: TrainContext, exc: BaseException) -> Failure:
    """``exc`` as a :class:`lab.result.failure.Failure`: the technique and stage it was tagged with by the chain
    (:func:`lab.technique.stage`), else the run's own stage (the fit, an evaluation, a measurement) charged to
    the families the config switches on (those that replace the model, after training), or ``baseline``."""
    cfg, wl = ctx.cfg, ctx.workload
    at = tagged(exc)
    stage = ctx.state.get(STAGE, "training")
    if at is not None:
        names, stage = [at[0]], at[1]
    else:
        on = ctx.techniques.enabled(cfg)
        replacing = [t.name for t in ctx.techniques if t.name in on and t.replaces_model(cfg)]
        names = replacing if replacing and stage in ("evaluate", "measure") else on
    technique = "+".join(names) or "baseline"
    try:
        model = ctx.new_model()  # for its classes: which files are the user's (a failure never resumes the run)
    except Exception:  # noqa: BLE001 - the model that cannot be built is named by the exception itself
        model = None
    return describe(exc, model=model, functions=(wl.make_model, wl.loss, wl.evaluate, wl.make_data),
                    technique=technique, stage=stage, tried=ctx.techniques.tried(cfg, names))


def preflight(ctx: TrainContext) -> None:
    """Checks that need the data or a model, before any training: the workload contract on a few rows, the batch
    against the train split, the warm-up against the steps, and each technique's ``preflight`` on a fresh model
    (thrown away: the run builds its own from the same seed)."""
    cfg, r = ctx.cfg, ctx.resolved
    model = ctx.new_model()
    check_contract(r.workload, ctx.data, model, ctx.device)
    n_train = len(ctx.data.train[0])
    if cfg.data.drop_last and r.batch_size > n_train:
        raise ValueError(f"batch_size={r.batch_size} is invalid: larger than the train split ({n_train} rows) "
                         "with data.drop_last; lower --batch-size")
    total = ctx.total_steps()
    if total < 1:
        raise ValueError(f"the run would take no step ({r.epochs} epoch(s) of {ctx.steps_per_epoch()} batches, "
                         f"grad_accum_steps={cfg.ddp.grad_accum_steps}); lower --batch-size or "
                         "--grad-accum-steps")
    if cfg.warmup_steps >= total:
        raise ValueError(f"warmup_steps={cfg.warmup_steps} is invalid: the run takes {total} step(s), so no step "
                         "would be measured; lower --warmup-steps or train longer")
    ctx.techniques.preflight(ctx, model)


def train_and_measure(ctx: TrainContext, launcher: Launcher) -> None:
    """The run after its checks: train, evaluate, judge and measure, recording into ``ctx.result``; ``launcher``
    (the one that joined) wraps the model for the fit and leaves the group of processes after it."""
    cfg, r, result, chain = ctx.cfg, ctx.resolved, ctx.result, ctx.techniques
    say = ctx.progress or (lambda event: None)
    result.details.update({
        "resolved": {"epochs": r.epochs, "batch_size": r.batch_size, "lr": r.lr, "device": str(ctx.device),
                     "steps_per_epoch": ctx.steps_per_epoch(), "n_train": len(ctx.data.train[0]),
                     "n_test": len(ctx.data.test[0])},
        "data_info": ctx.data.info,
        "threads": {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads(),
                    "loader_workers": cfg.data.num_workers}})
    ctx.state[STAGE] = "before_training"
    model, hooks = chain.before_training(ctx, ctx.new_model())
    if ctx.is_main_rank:
        ctx.state[STAGE] = "evaluate (untrained)"
        before = ctx.evaluate(model)
        result.metric_before = before[r.workload.metric_name]
        say({"phase": "eval_before", "metrics": before})
    ctx.state[STAGE] = "training"
    model = launcher.wrap(ctx, model)
    stats = ctx.fit(model, epochs=r.epochs, lr=r.lr, max_steps=cfg.max_steps, step_hooks=hooks)
    model = launcher.unwrap(ctx, model)
    captured = capture_training_profile(ctx, model) if cfg.profile else None  # every rank, before leaving
    launcher.leave(ctx)
    if not ctx.is_main_rank:
        return
    result.train_time_s, result.steps, result.losses = stats.time_s, stats.steps, stats.losses
    result.step_times_ms = stats.step_times_ms
    result.peak_memory_mb, result.memory_kind = stats.peak_memory_mb, stats.memory_kind
    ctx.state[STAGE] = "after_training"
    model = chain.after_training(ctx, model)
    ctx.state[STAGE] = "evaluate"
    after = ctx.evaluate(model)
    result.metrics, result.metric = after, after[r.workload.metric_name]
    if result.metric != result.metric:
        raise FloatingPointError(f"{result.metric_name} is NaN after training: check evaluate() and the test split")
    if not chain.replaces_model(cfg):  # the model evaluated is the one training produced
        health.judge(result, chance=r.workload.chance, higher_is_better=r.workload.higher_is_better, lr=r.lr,
                     capped=stats.steps < ctx.total_steps(max_steps=False), baseline=not cfg.enabled_families())
    say({"phase": "eval", "metrics": after})
    ctx.state[STAGE] = "measure"
    measure_model(ctx, model)
    result.details["utilisation"] = measure.run_utilisation(result)  # how far from this machine's GEMM peak
    if cfg.profile:
        profile_run(ctx, captured, model)
    ctx.state[STAGE] = "report"
    result.details["techniques"] = chain.report(result)
    say({"phase": "done"})


def measure_model(ctx: TrainContext, model: nn.Module) -> None:
    """Static facts about the trained model plus its inference latency at batch 1 and batch N."""
    cfg, result, device, test = ctx.cfg, ctx.result, ctx.device, ctx.data.test
    one = tuple(t[:1] for t in test[:-1])
    result.param_count, result.nonzero_params = measure.count_params(model), measure.count_nonzero_params(model)
    result.model_bytes = measure.serialized_size_bytes(model)
    by_dtype = measure.count_macs_by_dtype(model, to_device(one, device))
    result.macs_per_sample, result.int8_macs_per_sample = by_dtype["fp32"] + by_dtype["int8"], by_dtype["int8"]
    undercounted = measure.weights_used_per_sample_guard(model, result.macs_per_sample)
    if undercounted:  # a count that cannot be right is said, not silently reported
        result.why.append(undercounted)
    if cfg.latency_repeats:
        n = min(cfg.eval_batch_size, len(test[0]))
        many = tuple(t[:n] for t in test[:-1])
        result.latency_ms = {
            "batch_1": measure.inference_latency_ms({"m": model}, to_device(one, device),
                                                    repeats=cfg.latency_repeats, warmup=3)["m"],
            f"batch_{n}": measure.inference_latency_ms({"m": model}, to_device(many, device),
                                                       repeats=max(3, cfg.latency_repeats // 4), warmup=3)["m"]}
