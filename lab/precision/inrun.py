"""``auto`` precision decided inside the run: its first steps *are* the probe.

Why: the copy probe (:func:`lab.precision.auto.measure_arms`) trains a copy of the model, so every probe step is
paid on top of the run; it may therefore spend only 3 % of the run, which no run under ~470 steps affords, and
``auto`` kept fp32 on every run the benchmarks make (60-300 steps) while bf16 trained ctr and sequence 1.3x faster
on an AMD EPYC with native bf16. Here the probe steps are the run's own training steps on its own model,
batches, optimizer and loader: fp32 and each native candidate take turns, in rounds (order reversed every other
round), each step timed from the first forward to the end of the optimizer step (the data wait is left out:
precision does not change it); the rule is :func:`lab.precision.auto.decide_auto`'s, on the same paired rounds.
What the probe costs is only the *difference* a slower candidate makes on its few steps, and it is capped: once
the extra time on candidate steps reaches :data:`INRUN_COST_SHARE` of the run's estimated fp32 time, the probe
stops and keeps fp32. So ``auto`` is never more than that (plus a step) slower than fp32, and takes the gain from
about 16 steps on.

What it changes in the run: its first steps run in the candidates' dtypes (autocast on forward + loss only, fp32
master weights), a few dozen steps at most, recorded in ``details["precision"]["auto"]`` with their times.
Not used (the copy probe is) under DDP, where every rank must take the same choice, for a checkpointed or resumed
run, and for a fit other than the main training. Taught in ``notebooks/02_mixed_precision.ipynb``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from lab.context import TrainContext
from lab.measure import ContentionMeter
from lab.precision.auto import (
    AUTO_CI,
    AUTO_MIN_GAIN,
    MAX_ROUNDS,
    MAX_STEPS_PER_ROUND,
    MIN_ROUNDS,
    compare_arms,
    decide_auto,
)
from lab.precision.gate import Capability
from lab.precision.policy import PrecisionPolicy, _record_layer_dtypes
from lab.precision.unprobed import save_probe

#: The probe stops (and keeps fp32) once the candidates' steps cost this share of the run's estimated fp32 time
#: more than fp32 steps would have.
INRUN_COST_SHARE = 0.03

#: What a candidate's first steps in its dtype cost beyond fp32's, in fp32 steps (its kernels and autocast's
#: weight casts are built on first use): the probe cannot decide before that is paid, and its cost cap
#: (:data:`INRUN_COST_SHARE`) only affords it on a run of ``n / INRUN_COST_SHARE`` steps or more. On pasted_mnist
#: (60 steps, ~3 ms a step, amd-epyc-avx512bf16-2c, measured while other processes held 1.7 of the 2 cores) bf16's
#: warm-up and first step cost 8 ms beyond fp32's, ~2.5 steps, and the cap stopped the probe there; one reading
#: on a busy machine, so the constant is a round figure, not a fit.
FIRST_STEPS_COST = 3.0

RULE_INRUN = (f"fastest native candidate whose paired speedup vs fp32 (median over >= {MIN_ROUNDS} interleaved "
              f"rounds of fp32 round ms / candidate round ms, {AUTO_CI:.0%} bootstrap CI) has its CI lower bound > "
              f"{1 + AUTO_MIN_GAIN:.2f}; else fp32. Probe: the run's own first steps, arms taking turns (1 untimed "
              f"warm-up step each, then up to {MAX_ROUNDS} rounds), a step timed from its forward to its optimizer "
              f"step; stopped once candidate steps cost {INRUN_COST_SHARE:.0%} of the run's fp32 time")


@dataclass(frozen=True)
class InRunPlan:
    """Up to ``rounds`` rounds of ``steps`` consecutive steps per arm, after one warm-up step per arm, within a run
    of ``run_steps`` steps (the probe takes at most half of it)."""

    rounds: int
    steps: int
    run_steps: int

    def probe_steps(self, n_arms: int) -> int:
        return n_arms * (1 + self.rounds * self.steps)


def inrun_plan(run_steps: int, n_arms: int) -> tuple[InRunPlan | None, str]:
    """``(plan, why)`` for a run of ``run_steps`` steps and ``n_arms`` arms (fp32 included); ``None`` when the run
    cannot hold :data:`MIN_ROUNDS` rounds of one step per arm and as many steps after them. Pure."""
    least = n_arms * (1 + MIN_ROUNDS)
    if run_steps < 2 * least:
        return None, (f"the run's {run_steps} steps are fewer than {2 * least} (a warm-up step and {MIN_ROUNDS} "
                      f"rounds for each of {n_arms} arms, and as many steps after them)")
    steps = max(1, min(MAX_STEPS_PER_ROUND, run_steps // (n_arms * MAX_ROUNDS * 8)))
    rounds = min(MAX_ROUNDS, (run_steps // 2 - n_arms) // (n_arms * steps))
    plan = InRunPlan(rounds=rounds, steps=steps, run_steps=run_steps)
    return plan, (f"the run's own first steps: up to {rounds} rounds x {steps} step(s) per arm (<= "
                  f"{plan.probe_steps(n_arms)} of its {run_steps} steps, each one trains)")


def probe_pays(run_steps: int, n_arms: int) -> tuple[bool, str]:
    """``(pays, why)``: can a probe on the run's own first steps repay itself in a run of ``run_steps`` steps?
    Its candidates' first steps cost :data:`FIRST_STEPS_COST` fp32 steps each beyond fp32 before any round is
    timed, and the probe stops once its extra cost reaches :data:`INRUN_COST_SHARE` of the run: below
    ``(n_arms - 1) * FIRST_STEPS_COST / INRUN_COST_SHARE`` steps it is stopped before it can decide, so it only
    costs (a 60-step conv run: auto 0.80x vs bf16 1.09x per step). Pure."""
    need = max(math.ceil((n_arms - 1) * FIRST_STEPS_COST / INRUN_COST_SHARE), 2 * n_arms * (1 + MIN_ROUNDS))
    if run_steps >= need:
        return True, f"the run's {run_steps} steps can repay an in-run probe (>= {need})"
    return False, (f"the run's {run_steps} steps cannot repay an in-run probe of {n_arms - 1} candidate(s): "
                   f"their first steps alone cost ~{FIRST_STEPS_COST:g} steps each, past {INRUN_COST_SHARE:.0%} of "
                   f"the run before a round is timed (a run of >= {need} steps is probed)")


def schedule(arms: list[str], plan: InRunPlan) -> list[tuple[str, int]]:
    """``(arm, round)`` of every probe step in order: one warm-up step per arm (round -1), then the rounds, the
    arms' order reversed every other round, ``plan.steps`` consecutive steps of an arm per round."""
    slots = [(a, -1) for a in arms]
    for r in range(plan.rounds):
        for a in (arms if r % 2 == 0 else arms[::-1]):
            slots += [(a, r)] * plan.steps
    return slots


class InRunProbe:
    """A step policy (:class:`lab.loop.StepPolicy`) that runs the probe's schedule, then the chosen dtype.

    ``policies``: one :class:`PrecisionPolicy` per arm, fp32 first; ``on_decided(choice, record)`` is called once,
    when the rule has its answer, the cost cap or the round cap is reached, or the fit ends first."""

    def __init__(self, policies: dict[str, PrecisionPolicy], caps: dict[str, Capability], plan: InRunPlan, *,
                 device: torch.device, on_decided: Callable[[str, dict[str, Any]], None]) -> None:
        if next(iter(policies)) != "fp32" or len(policies) < 2:
            raise ValueError("InRunProbe needs fp32 first and at least one candidate")
        self.policies, self.caps, self.plan, self.device = policies, caps, plan, device
        self.arms = list(policies)
        self.slots = schedule(self.arms, plan)
        self.on_decided = on_decided
        self.choice: str | None = None
        self.times: dict[str, list[float]] = {a: [] for a in self.arms}
        self.warmup_ms: dict[str, float] = {}
        self.extra_ms = 0.0
        self.steps_done = 0
        self.stopped = ""
        self._buf: list[float] = []
        self._t0: float | None = None
        self._model: nn.Module | None = None
        self._report: Callable[[], None] = lambda: None
        self._meter = ContentionMeter().start()  # a busy machine's timings decide nothing

    # ---------------------------------------------------------------- what the loop calls
    @property
    def current(self) -> PrecisionPolicy:
        return self.policies[self.choice if self.choice is not None else self.slots[self.steps_done][0]]

    @property
    def dtype(self) -> str:
        return self.choice or "auto"

    @property
    def device_type(self) -> str:
        return self.device.type

    @property
    def scaler(self) -> Any:
        return self.current.scaler

    @contextlib.contextmanager
    def applied(self, model: nn.Module) -> Iterator[nn.Module]:
        """Every arm's fp32 islands and backward watch for the fit; the per-layer dtype report is taken on the
        chosen dtype's first step (a probe step of another dtype would report that dtype)."""
        self._model = model
        for pol in self.policies.values():
            pol.record_dtypes = False
        with contextlib.ExitStack() as stack:
            for pol in self.policies.values():
                stack.enter_context(pol.applied(model))
            try:
                yield model
            finally:
                if self.choice is None:
                    self._decide("the fit ended before the probe did")
                self._report()

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.choice is None and self._t0 is None:  # the step's first forward (micro-batches share one step)
            self._t0 = self._now()
        return self.current.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        self.current.backward(loss)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.current.step(optimizer)
        if self.choice is not None:
            return
        ms = (self._now() - (self._t0 if self._t0 is not None else self._now())) * 1e3
        self._t0 = None
        self._record(ms)

    # ---------------------------------------------------------------- reporting
    def untouched_by_autocast(self) -> dict[str, str]:
        return self.current.untouched_by_autocast() if self.choice is not None else {}

    def diagnostics(self) -> dict[str, Any]:
        return {**self.current.diagnostics(), "probe_steps": self.steps_done, "probed_in_run": True}

    # ---------------------------------------------------------------- the probe
    def _now(self) -> float:
        if self.device.type == "cuda":  # a few probe steps only: the rest of the run keeps its overlap
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _record(self, ms: float) -> None:
        arm, rnd = self.slots[self.steps_done]
        self.steps_done += 1
        fp32 = self.times["fp32"]
        ref = float(np.median(fp32)) if fp32 else self.warmup_ms.get("fp32")
        if rnd < 0:
            self.warmup_ms[arm] = ms
        else:
            self._buf.append(ms)
        if arm != "fp32" and ref is not None:
            self.extra_ms += ms - ref
        nxt = self.slots[self.steps_done] if self.steps_done < len(self.slots) else None
        if rnd >= 0 and nxt != (arm, rnd):  # this arm's steps in this round are in
            self.times[arm].append(float(np.median(self._buf)))
            self._buf = []
        budget = INRUN_COST_SHARE * self.plan.run_steps * ref if ref else None
        if budget is not None and self.extra_ms > budget:
            run_s = budget / INRUN_COST_SHARE / 1e3
            self._decide(f"stopped at step {self.steps_done}: candidate steps had cost {self.extra_ms:.0f} ms more "
                         f"than fp32 ({INRUN_COST_SHARE:.0%} of the run's estimated {run_s:.1f} s)")
            return
        if nxt is None:
            self._decide(f"the {self.plan.rounds} rounds were spent")
            return
        if rnd >= 0 and nxt[1] != rnd and rnd + 1 >= MIN_ROUNDS:  # a round is complete
            open_ = [n for n, v in compare_arms(self.times, self.caps).items() if v["verdict"] == "undecided"]
            if not open_:
                self._decide(f"decided after {rnd + 1} rounds")

    def _decide(self, stopped: str) -> None:
        n = min(len(v) for v in self.times.values())
        times = {a: v[:n] for a, v in self.times.items()}  # whole rounds only: the pairs stay pairs
        if n:
            choice, why = decide_auto(times, self.caps)
            compare = compare_arms(times, self.caps)
        else:
            choice, why, compare = "fp32", "auto chose fp32: the probe ended before a round was timed", {}
        seen = self._meter.stop()
        if seen is not None and seen.busy and choice != "fp32":  # noise must not pick a precision
            why = (f"auto chose fp32: the probe ran while this machine was busy (other processes used "
                   f"{seen.others_cores:.1f} of {seen.cores} cores), so its timings cannot tell {choice} from "
                   f"noise; it would have chosen {choice} ({why})")
            choice = "fp32"
        self.choice, self.stopped = choice, stopped
        why = f"{why}; probed on the run's own first {self.steps_done} steps ({stopped})"
        record = {"rule": RULE_INRUN, "in_run": True, "candidates": list(self.arms), "plan": {
            "rounds": self.plan.rounds, "steps": self.plan.steps, "run_steps": self.plan.run_steps},
            "rounds": n, "compare": compare, "step_time_ms": times, "warmup_ms": dict(self.warmup_ms),
            "probe_steps": self.steps_done, "extra_ms": self.extra_ms, "stopped": stopped, "choice": choice,
            "why": why, "probe_s": 0.0, "contention": seen.to_dict() if seen is not None else None}
        chosen = self.policies[choice]
        if self._model is not None and chosen.active:  # the dtype report, on the chosen dtype's next forward
            chosen.record_dtypes = True
            self._report = _record_layer_dtypes(self._model, chosen)
        self.on_decided(choice, record)


def inrun_policy(ctx: TrainContext, arms: list[str], caps: dict[str, Capability], gated: dict[str, str],
                 not_tried: str, resolved: Callable[[TrainContext, str], None]) -> tuple[InRunProbe | None, str]:
    """``(probe, why)``: the step policy that probes ``arms`` on the run's own first steps and records its decision
    in ``details["precision"]["auto"]`` (then ``resolved(ctx, choice)``; a decision on whole rounds on a quiet
    machine is stored for later short runs of the model: :func:`lab.precision.unprobed.save_probe`); ``(None, why)``
    when the run is too short to repay it (:func:`probe_pays`, :func:`inrun_plan`)."""
    pays, short = probe_pays(ctx.total_steps(), len(arms))
    if not pays:
        return None, short
    plan, why = inrun_plan(ctx.total_steps(), len(arms))
    if plan is None:
        return None, why
    cfg = ctx.cfg.precision
    policies = {a: PrecisionPolicy(dtype=a, device_type=ctx.device.type, fp32_modules=cfg.fp32_modules) for a in arms}

    def on_decided(choice: str, record: dict[str, Any]) -> None:
        record.update(gated=gated, min_gain=AUTO_MIN_GAIN, cost_share_max=INRUN_COST_SHARE, plan_why=why,
                      why=record["why"] + not_tried)
        record["decided_by"] = "in-run probe"
        ctx.result.details.setdefault("precision", {})["auto"] = record
        ctx.result.why.append(record["why"])
        if record["rounds"] >= MIN_ROUNDS and not (record.get("contention") or {}).get("busy"):
            save_probe(ctx, record)  # for the next run of this model too short to be probed
        resolved(ctx, choice)

    return InRunProbe(policies, {a: caps[a] for a in arms if a != "fp32"}, plan, device=ctx.device,
                      on_decided=on_decided), why


__all__ = ["FIRST_STEPS_COST", "INRUN_COST_SHARE", "InRunPlan", "InRunProbe", "RULE_INRUN", "inrun_plan",
           "inrun_policy", "probe_pays", "schedule"]
