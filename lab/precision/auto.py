"""``auto`` precision: the fastest native dtype measured on the run's own step, by a rule written in the record.

Two probes share the rule below. A single-process run's main training decides on its own first steps
(:mod:`lab.precision.inrun`: every probe step trains, so any run of >= 16 steps is probed). The *copy probe*
documented here decides before training where that cannot be used (DDP ranks must agree, a checkpointed or resumed
run, other fits), and its cost is paid on top of the run.

What it times: copies of the run's own model, trained through the run's own ``ctx.fit`` (its loader and batch,
optimizer, fused setting, fp32 islands) with only the precision policy swapped, after one untimed warm-up step
per arm; the first step of every fit is untimed too (the fresh optimizer allocates its state there). The arms
are interleaved in rounds (fp32, bf16, fp16, then the reverse order, ...), so the drift of a shared machine hits
every arm alike, and a round's sample of an arm is the median of its steps in that round
(step time without the data wait, which precision does not change).

The rule (:data:`RULE`, :func:`decide_auto`): per candidate, the speedup is the median over rounds of the
*paired* ratio fp32 round time / candidate round time, with a 95 % bootstrap CI over the rounds; ``auto`` takes
the candidate with the highest speedup among the native ones whose CI lower bound is above ``1 + AUTO_MIN_GAIN``
(1.02), measured on at least :data:`MIN_ROUNDS` rounds, else fp32. Why paired: the old rule compared the two
arms' medians with independent resampling, so a box whose load moved 2x between rounds made a 1.3-1.5x bf16
gain read "CI reaches below 1" at the top rung of every ladder and ``auto`` kept fp32; a ratio taken within a
round cancels that drift.

The probe's cost counts (``never more than 5 % slower than fp32``): it may spend at most
:data:`AUTO_PROBE_SHARE` of the run's own steps (:func:`probe_plan`); a run too short to afford
:data:`MIN_ROUNDS` rounds is not probed: it takes a stored probe of the same model, or keeps fp32
(:mod:`lab.precision.unprobed`), saying which. So the worst case is fp32 plus that share
(fp32 chosen) or 1/1.02 of fp32 plus that share (a candidate chosen). Taught in ``notebooks/02_mixed_precision.ipynb``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from lab.context import TrainContext
from lab.measure import ContentionMeter, bootstrap_ci, bootstrap_ratio_ci
from lab.precision.gate import Capability, capability, model_gate
from lab.precision.policy import PrecisionPolicy
from lab.precision.unprobed import decide_unprobed, save_probe

#: A candidate is taken only when the lower bound of its speedup CI is above ``1 + AUTO_MIN_GAIN``.
AUTO_MIN_GAIN = 0.02
#: The probe may spend at most this share of the run's own steps (warm-up steps included).
AUTO_PROBE_SHARE = 0.03
#: Rounds below which no candidate is taken (a CI over fewer rounds says nothing), and at most this many rounds.
MIN_ROUNDS, MAX_ROUNDS = 3, 8
#: Timed steps of one arm in one round, at most (a round's sample is their median).
MAX_STEPS_PER_ROUND = 16
AUTO_CI = 0.95

RULE = (f"fastest native candidate whose paired speedup vs fp32 (median over >= {MIN_ROUNDS} interleaved rounds of "
        f"fp32 round ms / candidate round ms, {AUTO_CI:.0%} bootstrap CI) has its CI lower bound > "
        f"{1 + AUTO_MIN_GAIN:.2f}; else fp32. Probe: copies of the run's model on the run's loader through ctx.fit, "
        f"1 warm-up step per arm and each fit's first step untimed, at most {AUTO_PROBE_SHARE:.0%} of the run's steps")


@dataclass(frozen=True)
class ProbePlan:
    """How much the probe may measure: ``rounds`` (at most; it stops once every candidate is decided) of ``steps``
    timed steps per arm, each fit's first step untimed (a fresh optimizer allocates its state there: +150 ms of a
    450 ms mlp-xl step here), after one warm-up step per arm, within ``budget_steps`` of the run's ``run_steps``."""

    rounds: int
    steps: int
    budget_steps: int
    run_steps: int

    def probe_steps(self, n_arms: int) -> int:
        return n_arms * (1 + self.rounds * (1 + self.steps))


def probe_plan(run_steps: int, n_arms: int, *, share: float | None = None) -> tuple[ProbePlan | None, str]:
    """``(plan, why)``: the rounds and steps per round that ``share`` (default :data:`AUTO_PROBE_SHARE`) of the
    run's ``run_steps`` affords for ``n_arms`` arms; ``None`` when not even :data:`MIN_ROUNDS` rounds of one step
    fit, since a probe the gain cannot repay would break "never more than 5 % slower". Rounds first (they
    are what the paired CI is over), then steps per round. Pure: tested on planted numbers."""
    share = AUTO_PROBE_SHARE if share is None else share
    budget = int(math.floor(share * max(0, run_steps)))
    per_arm = budget // max(1, n_arms) - 1  # steps per arm after its warm-up step; a round costs 1 + timed
    if per_arm < 2 * MIN_ROUNDS:
        least = n_arms * (1 + 2 * MIN_ROUNDS)
        return None, (f"the run's {run_steps} steps allow {budget} probe steps at {share:.0%}, fewer than the "
                      f"{least} of {MIN_ROUNDS} rounds of {n_arms} arms (a run of >= {math.ceil(least / share)} "
                      f"steps is probed): a probe this run cannot repay")
    rounds = min(MAX_ROUNDS, per_arm // 2)
    steps = min(MAX_STEPS_PER_ROUND, per_arm // rounds - 1)
    plan = ProbePlan(rounds=rounds, steps=steps, budget_steps=budget, run_steps=run_steps)
    return plan, (f"up to {rounds} rounds x {steps} step(s) per arm (<= {plan.probe_steps(n_arms)} of the run's "
                  f"{run_steps} steps)")


def speedup_ci(base_ms: list[float], arm_ms: list[float], *, ci: float = AUTO_CI) -> dict[str, Any]:
    """Speedup of an arm over fp32 with its CI: paired by round (lists of equal length are round i of each arm,
    measured back to back, as :func:`measure_arms` and :func:`lab.measure.interleaved_ms` give them): the median
    of the per-round ratios, bootstrapped over rounds; lists of unequal length: the ratio of medians with
    independent resampling (:func:`lab.measure.bootstrap_ratio_ci`)."""
    paired = len(base_ms) == len(arm_ms)
    if paired:
        ratios = np.asarray(base_ms, dtype=float) / np.asarray(arm_ms, dtype=float)
        est, lo, hi = bootstrap_ci(ratios, np.median, ci=ci)
    else:
        est, lo, hi = bootstrap_ratio_ci(base_ms, arm_ms, ci=ci)
    return {"speedup": est, "ci_lo": lo, "ci_hi": hi, "paired": paired, "rounds": min(len(base_ms), len(arm_ms))}


def compare_arms(step_times_ms: dict[str, list[float]], caps: dict[str, Capability], *,
                 min_gain: float | None = None) -> dict[str, dict[str, Any]]:
    """Per candidate (every arm but fp32): its :func:`speedup_ci` and ``verdict``: ``pays`` (CI lower bound above
    ``1 + min_gain`` on >= :data:`MIN_ROUNDS` rounds), ``does not pay`` (CI upper bound at or below it),
    ``undecided`` (the CI straddles it, or too few rounds) or ``skipped`` (emulated here, with its tag)."""
    if "fp32" not in step_times_ms:
        raise ValueError("decide_auto needs fp32 step times as the baseline")
    bar = 1.0 + (AUTO_MIN_GAIN if min_gain is None else min_gain)
    base = step_times_ms["fp32"]
    out: dict[str, dict[str, Any]] = {}
    for name, times in step_times_ms.items():
        if name == "fp32":
            continue
        cap = caps.get(name)
        if cap is not None and not cap.native:
            out[name] = {"verdict": "skipped", "why": cap.why_tag()}
            continue
        row = speedup_ci(base, times)
        if row["ci_hi"] <= bar:
            verdict = "does not pay"
        elif row["ci_lo"] > bar and row["rounds"] >= MIN_ROUNDS:
            verdict = "pays"
        else:
            verdict = "undecided"
        out[name] = {**row, "verdict": verdict}
    return out


def decide_auto(step_times_ms: dict[str, list[float]], caps: dict[str, Capability], *,
                min_gain: float | None = None) -> tuple[str, str]:
    """``(choice, why)`` by :data:`RULE`: among native candidates whose speedup CI lower bound is above
    ``1 + min_gain`` (default :data:`AUTO_MIN_GAIN`), the one with the highest speedup, else fp32. Pure
    (measurements are passed in) so that every outcome can be tested on planted timings on any machine."""
    rows = compare_arms(step_times_ms, caps, min_gain=min_gain)
    bar = 1.0 + (AUTO_MIN_GAIN if min_gain is None else min_gain)
    notes = [f"{n} skipped ({r['why']})" if r["verdict"] == "skipped" else
             f"{n} x{r['speedup']:.2f} [{r['ci_lo']:.2f}, {r['ci_hi']:.2f}] {r['verdict']}"
             + ("" if r["paired"] else " (unpaired)") for n, r in rows.items()]
    paying = {n: r for n, r in rows.items() if r["verdict"] == "pays"}
    rounds = len(step_times_ms["fp32"])
    if not paying:
        return "fp32", (f"auto chose fp32: no native low precision's speedup CI lower bound was above {bar:.2f} "
                        f"over {rounds} rounds ({'; '.join(notes) or 'no candidate'})")
    best = max(paying, key=lambda n: paying[n]["speedup"])
    return best, (f"auto chose {best}: x{paying[best]['speedup']:.2f} faster than fp32, CI lower bound "
                  f"{paying[best]['ci_lo']:.2f} > {bar:.2f} over {rounds} rounds ({'; '.join(notes)})")


def _compute_ms(stats: Any) -> list[float]:
    """Per-step ms of one fit without the data wait (precision does not change it; a loader's first batch
    would otherwise dominate a short fit)."""
    total = stats.step_times_ms["total"]
    wait = stats.step_times_ms.get("data_wait") or [0.0] * len(total)
    return [t - w for t, w in zip(total, wait, strict=False)]


def measure_arms(ctx: TrainContext, model: nn.Module, lr: float, arms: list[str], *, rounds: int = MIN_ROUNDS,
                 steps: int = 2, caps: dict[str, Capability] | None = None,
                 stop_early: bool = True) -> dict[str, list[float]]:
    """Per-round step ms (the median of ``steps`` steps, after the fit's untimed first step) of each arm on one
    copy of ``model`` (the run's own, as built), arms interleaved over up to ``rounds`` rounds, the order reversed
    every other round. Every step
    goes through ``ctx.fit`` on the run's loader (built once: the same batches for every arm) with only the
    policy swapped (one per arm, kept across rounds: fp16's loss scale settles once). One untimed warm-up step
    per arm first. With ``stop_early`` the rounds stop once :data:`MIN_ROUNDS` are in and every candidate is
    decided (``pays`` / ``does not pay``). RNG state is restored, so measuring does not change the run."""
    dev = ctx.device
    loader = ctx.make_loader()
    n_batches = max(1, len(loader))
    probe_model = copy.deepcopy(model)  # every arm trains the same copy: step time does not depend on the weights
    pols = {a: PrecisionPolicy(dtype=a, device_type=dev.type, fp32_modules=ctx.cfg.precision.fp32_modules)
            for a in arms}

    def steps_ms(arm: str, n: int) -> list[float]:
        st = ctx.fit(probe_model, epochs=math.ceil((n + 1) / n_batches), lr=lr, max_steps=n + 1, policy=pols[arm],
                     phase=f"auto:{arm}", probe=True, loader=loader)
        return _compute_ms(st)[1:]  # the fit's first step allocates the fresh optimizer's state: not timed

    times: dict[str, list[float]] = {a: [] for a in arms}
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        for arm in arms:
            steps_ms(arm, 0)  # warm-up: first-call allocation, kernels' primitives, autocast's caches
            pols[arm].record_dtypes = False  # the dtype report is in; its hooks must not be timed
        for r in range(rounds):
            for arm in (arms if r % 2 == 0 else arms[::-1]):
                times[arm].append(float(np.median(steps_ms(arm, steps))))
            if stop_early and r + 1 >= MIN_ROUNDS and "fp32" in times and all(
                    v["verdict"] in ("pays", "does not pay", "skipped")
                    for v in compare_arms(times, caps or {}).values()):
                break
    return times


def auto_candidates(ctx: TrainContext,
                    model: nn.Module) -> tuple[list[str], dict[str, Capability], dict[str, str], str]:
    """``(arms, caps, gated, not_tried)``: fp32 plus each low precision that is native here and that the model
    gate lets train this model; the capabilities; the gate's refusals; the "not tried" clause for the why."""
    cfg, dev = ctx.cfg.precision, ctx.device
    caps = {d: capability(d, dev) for d in ("bf16", "fp16")}
    gated = {d: g for d in caps if (g := model_gate(model, d, dev.type, cfg.fp32_modules))}
    arms = ["fp32"] + [d for d, c in caps.items() if c.native and d not in gated]
    not_tried = "".join(f"; {d} not tried: {g}" for d, g in gated.items()) + "".join(
        f"; {d} not tried: {c.why_tag()} ({c.reason})" for d, c in caps.items() if not c.native)
    return arms, caps, gated, not_tried


def resolve_auto(ctx: TrainContext, model: nn.Module, lr: float, *, short: str | None = None
                 ) -> tuple[str, dict[str, Any]]:
    """``auto`` decided before training: the copy probe where the run affords it (:func:`probe_plan`), else without a
    probe (:func:`lab.precision.unprobed.decide_unprobed`; ``short``: why the run was not probed in the run either,
    said instead of the copy probe's own reason)."""
    arms, caps, gated, not_tried = auto_candidates(ctx, model)
    t0 = time.perf_counter()
    run_steps = ctx.total_steps()
    rec: dict[str, Any] = {"rule": RULE, "candidates": arms, "gated": gated, "run_steps": run_steps,
                           "min_gain": AUTO_MIN_GAIN, "probe_share_max": AUTO_PROBE_SHARE}
    plan, plan_why = probe_plan(run_steps, len(arms)) if len(arms) > 1 else (None, "no native low precision here")
    rec["plan"] = dataclasses.asdict(plan) if plan else None
    if plan is None:  # a stored probe of this model, the machine card, or fp32 (lab.precision.unprobed)
        choice, why, rec["decided_by"] = (decide_unprobed(ctx, arms, short or plan_why) if len(arms) > 1 else
                                          ("fp32", f"auto chose fp32 without a probe: {plan_why}", "kept fp32"))
        times: dict[str, list[float]] = {}
    else:
        meter = ContentionMeter().start()
        times = measure_arms(ctx, model, lr, arms, rounds=plan.rounds, steps=plan.steps, caps=caps)
        seen = meter.stop()
        choice, why = decide_auto(times, caps)
        rec["compare"] = compare_arms(times, caps)
        rec["rounds"] = len(times["fp32"])
        rec["decided_by"] = "copy probe"
        if rec["rounds"] >= MIN_ROUNDS and not (seen is not None and seen.busy):  # a quiet decision only
            save_probe(ctx, {**rec, "choice": choice})
    probe_s = time.perf_counter() - t0
    # The probe is training-time cost too: the ablation adds probe_s to its end-to-end figure.
    rec.update(why=why + not_tried, choice=choice, step_time_ms=times, probe_s=probe_s)
    if times.get("fp32"):
        run_s = run_steps * float(np.median(times["fp32"])) / 1e3
        rec["probe_share_of_run"] = probe_s / run_s if run_s > 0 else None
    return choice, rec


__all__ = [
    "AUTO_MIN_GAIN", "auto_candidates", "AUTO_PROBE_SHARE", "compare_arms", "decide_auto", "MAX_ROUNDS",
    "measure_arms", "MIN_ROUNDS", "resolve_auto",
    "probe_plan", "ProbePlan", "RULE", "speedup_ci",
]
