"""Is a finished run a result? The divergence and "did not learn" rules, read from its loss curve and metric.

Why apart from the loop: a run that exploded (loss 40x its start) or ended at chance is not a speedup to
report, whatever its step time; :mod:`lab.train` asks :func:`judge` once, after training, and an ablation
stores such a run as ``diverged`` (never as an accuracy loss) or with a "did not learn" tag.
"""

from __future__ import annotations

from lab.result import RunResult

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


def judge(result: RunResult, *, chance: float | None, higher_is_better: bool, lr: float, capped: bool,
          baseline: bool) -> None:
    """Mark ``result`` ``diverged`` (status, error and a why tag) or add its "did not learn" tag, in place."""
    diverged = divergence_why(result, chance, higher_is_better, lr, capped=capped)
    if diverged:
        result.status, result.error = "diverged", diverged
        result.why.append(diverged)
        return
    why = learning_why(result.metric, result.metric_before, chance, higher_is_better, result.metric_name,
                       baseline=baseline)
    if why:
        result.why.append(why)


__all__ = ["LEARNED_MARGIN", "LOSS_END_FACTOR", "LOSS_RISE_FACTOR", "divergence_why", "judge", "learning_why"]
