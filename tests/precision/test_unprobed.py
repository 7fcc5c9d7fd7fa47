"""``auto`` never loses on a short run (issue 47 item 4): a run too short to repay its in-run probe does not probe;
it takes a stored probe of the same model, or the machine card's refusal, or keeps fp32, and says which. The rule
on planted numbers; the wiring on two short toy runs (no timing assertion)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lab import RunConfig, run
from lab.config import PrecisionConfig
from lab.precision import unprobed
from lab.precision.inrun import probe_pays
from lab.precision.unprobed import decide_unprobed, load_probe, probe_key, save_probe


def test_a_probe_is_only_planned_where_the_run_can_repay_its_candidates_first_steps():
    assert not probe_pays(60, 2)[0] and "cannot repay" in probe_pays(60, 2)[1]  # issue 47's 62-step run
    assert probe_pays(100, 2)[0] and not probe_pays(199, 3)[0] and probe_pays(200, 3)[0]


def _ctx(workload: str = "mlp") -> SimpleNamespace:
    return SimpleNamespace(cfg=RunConfig(workload=workload, size="tiny", threads=1), resolved=SimpleNamespace(
        batch_size=32), device=torch.device("cpu"), result=SimpleNamespace(hardware_id="planted-hw"))


STORED = {"choice": "bf16", "rounds": 4, "plan": {"run_steps": 300}, "in_run": True,
          "compare": {"bf16": {"speedup": 1.4, "ci_lo": 1.2, "ci_hi": 1.6, "verdict": "pays", "paired": True}}}


def test_a_stored_probe_of_the_same_model_decides_and_another_models_does_not(monkeypatch):
    monkeypatch.setattr(unprobed, "load_card", lambda hw: None)
    ctx = _ctx()
    assert save_probe(ctx, STORED) is not None and load_probe(ctx)["choice"] == "bf16"
    choice, why, by = decide_unprobed(ctx, ["fp32", "bf16"], "60 steps")
    assert (choice, by) == ("bf16", "stored probe") and "x1.40 [1.20, 1.60]" in why and "300-step" in why
    assert decide_unprobed(ctx, ["fp32"], "60 steps")[0] == "fp32"  # its choice is not a candidate here
    other = _ctx("ctr")
    assert probe_key(other) != probe_key(ctx)
    choice, why, by = decide_unprobed(other, ["fp32", "bf16"], "60 steps")
    assert (choice, by) == ("fp32", "kept fp32") and "no stored probe" in why


def test_the_machine_card_refuses_a_dtype_whose_gemm_peak_is_not_above_fp32s(monkeypatch):
    monkeypatch.setattr(unprobed, "load_card", lambda hw: object())
    monkeypatch.setattr(unprobed, "ratio_limit", lambda card, dtype: 0.8)
    choice, why, by = decide_unprobed(_ctx(), ["fp32", "bf16"], "60 steps")
    assert (choice, by) == ("fp32", "machine card") and "bf16 0.8x" in why
    monkeypatch.setattr(unprobed, "ratio_limit", lambda card, dtype: 3.0)  # a gain allowed: still not taken blind
    choice, why, by = decide_unprobed(_ctx(), ["fp32", "bf16"], "60 steps")
    assert (choice, by) == ("fp32", "kept fp32") and "at most bf16 3.0x" in why


@pytest.mark.parametrize("stored", [False, True])
def test_a_short_run_is_not_probed_and_says_what_decided(toy_workload, monkeypatch, stored):
    from lab import precision

    monkeypatch.setattr(precision.gate, "cpu_flags", lambda: frozenset({"amx_bf16"}))  # bf16 "native" anywhere
    monkeypatch.setattr(unprobed, "load_card", lambda hw: None)
    cfg = RunConfig(workload="toy", size="tiny", max_steps=60, warmup_steps=1, threads=1, latency_repeats=0,
                    precision=PrecisionConfig(dtype="auto"))
    if stored:  # what a longer run of the same model on this machine would have stored
        from lab.context import prepare

        with prepare(cfg) as ctx:
            save_probe(ctx, STORED)
    r = run(cfg)
    rec = r.details["precision"]["auto"]
    assert not rec.get("in_run") and not rec.get("step_time_ms")  # no probe step was taken
    assert rec["decided_by"] == ("stored probe" if stored else "kept fp32")
    assert r.details["precision"]["resolved"] == ("bf16" if stored else "fp32")
    assert "without a probe" in rec["why"] and "cannot repay an in-run probe" in rec["why"]
