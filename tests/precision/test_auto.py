"""``auto`` precision (issue 30): the paired decision rule on planted timings, the probe's budget as a share of
the run, and that the probe times the run's own model and batch (no timing assertion anywhere)."""

from __future__ import annotations

import pytest
import torch

from lab import precision
from lab.config import PrecisionConfig, RunConfig
from lab.measure import bootstrap_ratio_ci
from lab.precision import MIN_ROUNDS, Capability, ProbePlan, compare_arms, decide_auto, probe_plan
from lab.train import run

NATIVE = {d: Capability(d, "cpu", True, "test") for d in ("bf16", "fp16")}
DRIFT = [10.0, 21.0, 9.5, 18.0, 30.0, 12.0]  # a shared box: the load moves 3x between rounds


def test_a_real_gain_under_drift_is_taken_where_unpaired_medians_saw_noise():
    """The map's top rungs: bf16 1.3x in every round, but the rounds themselves moved 3x. The medians compared
    with independent resampling reach below 1 (the old rule kept fp32); the ratio within a round does not."""
    bf16 = [t / 1.3 for t in DRIFT]
    assert bootstrap_ratio_ci(DRIFT, bf16)[1] < 1.02  # what the old rule read
    choice, why = decide_auto({"fp32": DRIFT, "bf16": bf16}, NATIVE)
    assert choice == "bf16" and why.startswith("auto chose bf16: x1.30") and "> 1.02" in why


def test_the_fastest_paying_candidate_wins_and_slower_or_noisy_ones_do_not():
    times = {"fp32": DRIFT, "bf16": [t / 1.4 for t in DRIFT], "fp16": [t / 1.2 for t in DRIFT]}
    assert decide_auto(times, NATIVE)[0] == "bf16"
    times["fp16"] = [t / 1.6 for t in DRIFT]
    assert decide_auto(times, NATIVE)[0] == "fp16"
    # 1 % faster in every round: real, but below the bar; a candidate that wins and loses by turns: undecided
    noisy = [t / r for t, r in zip(DRIFT, [1.5, 0.8, 1.4, 0.9, 1.3, 0.85], strict=True)]
    rows = compare_arms({"fp32": DRIFT, "bf16": [t / 1.01 for t in DRIFT], "fp16": noisy}, NATIVE)
    assert rows["bf16"]["verdict"] == "does not pay" and rows["fp16"]["verdict"] == "undecided"
    choice, why = decide_auto({"fp32": DRIFT, "bf16": [t / 1.01 for t in DRIFT], "fp16": noisy}, NATIVE)
    assert choice == "fp32" and "bf16 x1.01" in why and "undecided" in why


def test_fewer_rounds_than_the_minimum_never_pick_a_low_precision():
    short = DRIFT[:MIN_ROUNDS - 1]
    assert compare_arms({"fp32": short, "bf16": [t / 2 for t in short]}, NATIVE)["bf16"]["verdict"] == "undecided"
    assert decide_auto({"fp32": short, "bf16": [t / 2 for t in short]}, NATIVE)[0] == "fp32"


def test_unequal_lengths_fall_back_to_the_unpaired_ratio():
    rows = compare_arms({"fp32": [10.0] * 6, "bf16": [5.0] * 5}, NATIVE)
    assert rows["bf16"]["paired"] is False and rows["bf16"]["speedup"] == pytest.approx(2.0)


def test_the_probe_budget_is_a_share_of_the_run():
    plan, why = probe_plan(292, 3, share=0.03)  # ctr small with fp32, bf16, fp16: 8 probe steps < 21
    assert plan is None and "cannot repay" in why and ">= 700 steps" in why
    plan, _ = probe_plan(1536, 2, share=0.03)  # 46 steps: 1 warm-up + 8 rounds x (1 untimed + 1 timed), per arm
    assert plan == ProbePlan(rounds=8, steps=1, budget_steps=46, run_steps=1536)
    assert plan.probe_steps(2) <= plan.budget_steps
    big, _ = probe_plan(10**6, 2, share=0.03)
    assert big.rounds == 8 and big.steps == 16  # capped: more would only cost
    assert probe_plan(700, 3, share=0.03)[0] == ProbePlan(rounds=3, steps=1, budget_steps=21, run_steps=700)


def _record_batches(model, seen):
    model.register_forward_pre_hook(lambda mod, inputs: seen.append(inputs[0].shape[0]))
    return model


def test_the_probe_times_the_runs_own_model_and_batch(toy_workload):
    from lab.context import prepare

    cfg = RunConfig(workload="toy", size="tiny", threads=1, precision=PrecisionConfig(dtype="auto"))
    with prepare(cfg) as ctx:
        seen: list[int] = []
        model = _record_batches(ctx.new_model(), seen)
        before = [p.detach().clone() for p in model.parameters()]
        times = precision.measure_arms(ctx, model, ctx.resolved.lr, ["fp32", "bf16"], rounds=3, steps=2,
                                       stop_early=False)
        assert {a: len(v) for a, v in times.items()} == {"fp32": 3, "bf16": 3}
        assert seen == [ctx.resolved.batch_size] * (2 * (1 + 3 * (1 + 2)))  # warm-up + 3 rounds x (1 + 2), per arm
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # a copy trained


def test_a_run_records_the_rule_the_plan_and_the_measurements(toy_workload, monkeypatch):
    monkeypatch.setattr(precision.gate, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    monkeypatch.setattr(precision.auto, "probe_plan", lambda n, arms: (ProbePlan(3, 1, 8, n), "planted"))
    r = run(RunConfig(workload="toy", size="tiny", max_steps=4, warmup_steps=1, threads=1, latency_repeats=0,
                      precision=PrecisionConfig(dtype="auto")))
    rec = r.details["precision"]["auto"]
    assert rec["rule"] == precision.RULE and rec["candidates"] == ["fp32", "bf16"] and rec["run_steps"] == 4
    assert rec["plan"]["rounds"] == 3 and rec["rounds"] == len(rec["step_time_ms"]["fp32"]) == 3
    assert set(rec["compare"]["bf16"]) >= {"speedup", "ci_lo", "ci_hi", "paired", "verdict"}
    assert rec["choice"] == r.details["precision"]["resolved"] and rec["why"].startswith(f"auto chose {rec['choice']}")
    assert rec["probe_s"] > 0 and rec["probe_share_of_run"] > 0


def test_a_run_too_short_to_repay_a_probe_keeps_fp32_without_one(toy_workload, monkeypatch):
    monkeypatch.setattr(precision.gate, "cpu_flags", lambda: frozenset({"amx_bf16"}))

    def no_probe(*args, **kwargs):
        raise AssertionError("a 10-step run must not be probed")

    monkeypatch.setattr(precision.auto, "measure_arms", no_probe)
    r = run(RunConfig(workload="toy", size="tiny", max_steps=10, warmup_steps=1, threads=1, latency_repeats=0,
                      precision=PrecisionConfig(dtype="auto")))
    rec = r.details["precision"]
    assert rec["resolved"] == "fp32" and rec["auto"]["plan"] is None
    assert rec["auto"]["why"].startswith("auto chose fp32 without a probe") and "cannot repay" in rec["auto"]["why"]
