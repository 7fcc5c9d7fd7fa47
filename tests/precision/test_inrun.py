"""``auto`` decided on the run's own first steps (lab.precision.inrun): the plan, the schedule, the rule on planted
step times (a fake clock), the cost cap that keeps ``auto`` within a few % of fp32, and a real run whose first steps
really alternate dtypes before the rest trains in the chosen one."""

from __future__ import annotations

import json

import pytest
import torch

from lab import RunConfig, run
from lab.config import PrecisionConfig
from lab.precision import PrecisionPolicy, inrun
from lab.precision.gate import Capability
from lab.precision.inrun import InRunPlan, InRunProbe, inrun_plan, schedule

NATIVE = {"bf16": Capability("bf16", "cpu", True, "planted")}


class _QuietMeter:
    """A machine nobody else uses: these tests plant the step times, so the real machine's load must not decide
    (a busy machine keeps fp32: its own test below plants that)."""

    def start(self):
        return self

    def stop(self):
        return None


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    monkeypatch.setattr(inrun, "ContentionMeter", _QuietMeter)


def test_the_plan_fits_a_short_run_and_takes_at_most_half_of_it():
    plan, why = inrun_plan(292, 2)  # ctr small: the copy probe needed >= 467 steps
    assert plan == InRunPlan(rounds=8, steps=2, run_steps=292) and "each one trains" in why
    assert plan.probe_steps(2) <= 292 // 2
    assert inrun_plan(16, 2)[0] == InRunPlan(rounds=3, steps=1, run_steps=16)
    none, why = inrun_plan(15, 2)
    assert none is None and "fewer than 16" in why
    assert inrun_plan(10**6, 3)[0] == InRunPlan(rounds=8, steps=16, run_steps=10**6)


def test_the_schedule_warms_every_arm_then_alternates_the_order():
    assert schedule(["fp32", "bf16"], InRunPlan(3, 1, 100)) == [
        ("fp32", -1), ("bf16", -1), ("fp32", 0), ("bf16", 0), ("bf16", 1), ("fp32", 1), ("fp32", 2), ("bf16", 2)]
    assert schedule(["fp32", "bf16"], InRunPlan(1, 2, 100))[2:] == [("fp32", 0)] * 2 + [("bf16", 0)] * 2


def _drive(probe: InRunProbe, step_ms: dict[str, float], n_steps: int, monkeypatch) -> list[str]:
    """Run ``n_steps`` steps through the probe as lab.loop.fit does, each arm's step taking its planted ms on a fake
    clock; returns the dtype each step ran in."""
    clock = [0.0]
    monkeypatch.setattr(probe, "_now", lambda: clock[0])
    weight = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([weight], lr=0.0)
    ran = []
    with probe.applied(torch.nn.Linear(2, 2)):
        for _ in range(n_steps):
            ran.append(probe.current.dtype)
            with probe.autocast():
                loss = (weight * 2).sum()
            probe.backward(loss)
            clock[0] += step_ms[ran[-1]] / 1e3
            probe.step(opt)
    return ran


def _rounded(times: dict[str, list[float]]) -> dict[str, list[float]]:
    return {k: [round(x, 6) for x in v] for k, v in times.items()}


def _probe(plan: InRunPlan, decided: list) -> InRunProbe:
    policies = {a: PrecisionPolicy(dtype=a) for a in ("fp32", "bf16")}
    return InRunProbe(policies, NATIVE, plan, device=torch.device("cpu"),
                      on_decided=lambda choice, rec: decided.append((choice, rec)))


def test_a_faster_candidate_is_taken_after_three_rounds_and_trains_the_rest(monkeypatch):
    decided: list = []
    probe = _probe(InRunPlan(8, 1, 200), decided)
    ran = _drive(probe, {"fp32": 10.0, "bf16": 5.0}, 20, monkeypatch)
    assert ran[:8] == ["fp32", "bf16", "fp32", "bf16", "bf16", "fp32", "fp32", "bf16"]
    assert ran[8:] == ["bf16"] * 12 and probe.dtype == "bf16" and len(decided) == 1
    choice, rec = decided[0]
    assert choice == "bf16" and rec["in_run"] and rec["probe_steps"] == 8 and rec["rounds"] == 3
    assert rec["compare"]["bf16"]["verdict"] == "pays" and rec["compare"]["bf16"]["speedup"] == pytest.approx(2.0)
    assert _rounded(rec["step_time_ms"]) == {"fp32": [10.0] * 3, "bf16": [5.0] * 3}
    assert rec["extra_ms"] < 0 and rec["probe_s"] == 0.0  # it saved time; nothing was paid outside the run
    assert "decided after 3 rounds" in rec["why"]


def test_a_slower_candidate_is_stopped_by_the_cost_cap_and_fp32_kept(monkeypatch):
    """bf16 3x slower than fp32: its warm-up and first timed step cost 40 ms more than fp32's, past 3 % of a
    100-step run at 10 ms a step (30 ms): the probe stops there, before its rounds, and fp32 trains the rest."""
    decided: list = []
    probe = _probe(InRunPlan(8, 1, 100), decided)
    ran = _drive(probe, {"fp32": 10.0, "bf16": 30.0}, 12, monkeypatch)
    assert ran[:4] == ["fp32", "bf16", "fp32", "bf16"] and ran[4:] == ["fp32"] * 8
    choice, rec = decided[0]
    assert choice == "fp32" and rec["stopped"].startswith("stopped at step 4")
    assert rec["extra_ms"] == pytest.approx(40.0)
    assert rec["extra_ms"] <= inrun.INRUN_COST_SHARE * 100 * 10.0 + 30.0  # the cap, overshot by one step at most


def test_a_fit_that_ends_mid_probe_still_decides(monkeypatch):
    decided: list = []
    probe = _probe(InRunPlan(8, 1, 200), decided)
    _drive(probe, {"fp32": 10.0, "bf16": 5.0}, 5, monkeypatch)  # warm-ups, round 0, half of round 1
    choice, rec = decided[0]
    assert choice == "fp32" and rec["rounds"] == 1 and "fit ended" in rec["stopped"]
    assert _rounded(rec["step_time_ms"]) == {"fp32": [10.0], "bf16": [5.0]}  # whole rounds only


def test_a_run_probes_on_its_own_first_steps_then_trains_in_the_choice(toy_workload, monkeypatch):
    from lab import precision

    monkeypatch.setattr(precision.gate, "cpu_flags", lambda: frozenset({"amx_bf16"}))  # bf16 "native" anywhere

    def no_copy_probe(*args, **kwargs):
        raise AssertionError("a single-process run is probed in the run, not on a copy")

    monkeypatch.setattr(precision.auto, "measure_arms", no_copy_probe)
    seen: list[str] = []
    real_prepare = __import__("lab.context", fromlist=["prepare"]).TrainContext.new_model

    def new_model(self, *a, **k):
        model = real_prepare(self, *a, **k)
        model.register_forward_pre_hook(lambda m, i: seen.append(
            "bf16" if torch.is_autocast_enabled("cpu") else "fp32") if m.training else None)
        return model

    monkeypatch.setattr("lab.context.TrainContext.new_model", new_model)
    r = run(RunConfig(workload="toy", size="tiny", epochs=7, max_steps=120, warmup_steps=1, threads=1,
                      latency_repeats=0, precision=PrecisionConfig(dtype="auto")))
    rec = r.details["precision"]["auto"]
    assert rec["in_run"] and rec["rule"] == inrun.RULE_INRUN and r.details["precision"]["resolved"] == rec["choice"]
    n = rec["probe_steps"]
    assert seen[:2] == ["fp32", "bf16"] and {"fp32", "bf16"} <= set(seen[:n])  # the probe really switched dtypes
    assert len(seen) > n and seen[n:] == [rec["choice"]] * (len(seen) - n)  # the rest trained in the choice
    assert rec["why"].startswith(f"auto chose {rec['choice']}") and "run's own first" in rec["why"]
    assert r.details["precision"]["phases"]["train"]["probed_in_run"] is True
    if rec["rounds"] >= 3:  # a decision on whole rounds is kept for the next short run of this model (issue 47)
        from lab.precision.unprobed import probes_path

        stored = json.loads(probes_path(r.hardware_id).read_text())
        assert [v["choice"] for v in stored.values()] == [rec["choice"]] and rec["decided_by"] == "in-run probe"
    if rec["choice"] == "bf16":  # the dtype report is the chosen dtype's, not a probe step's
        assert any(d["output_dtype"] == "bfloat16" for d in r.details["precision"]["phases"]["train"]["layer_dtypes"])


@pytest.mark.parametrize("busy", [True, False])
def test_a_probe_on_a_busy_machine_keeps_fp32_and_says_what_it_would_have_chosen(toy_workload, monkeypatch, busy):
    """auto measured 0.72x and 0.87x under load and 1.50x / 1.18x idle on the same models: a probe whose timings
    were taken while other processes held the cores decides nothing."""
    from lab import precision
    from lab.measure.contention import Contention

    monkeypatch.setattr(precision.gate, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    monkeypatch.setattr(inrun, "decide_auto", lambda times, caps: ("bf16", "auto chose bf16: planted 1.5x"))
    seen = Contention(others_cores=1.4 if busy else 0.0, steal_share=0.0, load1=4.0, cores=2, wall_s=1.0)

    class Meter:
        def start(self):
            return self

        def stop(self):
            return seen

    monkeypatch.setattr(inrun, "ContentionMeter", Meter)
    monkeypatch.setattr(inrun, "INRUN_COST_SHARE", 1.0)  # the cost cap is not under test: a slow step on a loaded
    # machine must not end the probe before its first round
    r = run(RunConfig(workload="toy", size="tiny", epochs=7, max_steps=120, warmup_steps=1, threads=1,
                      latency_repeats=0, precision=PrecisionConfig(dtype="auto")))
    rec = r.details["precision"]["auto"]
    assert rec["contention"]["busy"] is busy and r.details["precision"]["resolved"] == rec["choice"]
    if busy:
        assert rec["choice"] == "fp32" and "busy" in rec["why"] and "would have chosen bf16" in rec["why"]
    else:
        assert rec["choice"] == "bf16" and rec["why"].startswith("auto chose bf16: planted")
