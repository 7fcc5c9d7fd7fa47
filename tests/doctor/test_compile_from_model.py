"""compile predicted from the model's own compiled forward + backward (``diagnose(measure=("compile",))``):
it wins over the chain and the map, says its compile time, and an unknown measurement is refused before any
work. Synthetic rates only (no compile here)."""

from __future__ import annotations

import pytest

from lab import RunConfig
from lab.doctor import CompileCost, Rate, Rates, diagnose, predict_technique
from lab.measure.profile import OP_CLASSES, Breakdown
from lab.registry import OPTIONS


def _bd(step_ms: float = 10.0, **shares: float) -> Breakdown:
    ms = {c: shares.get(c, 0.0) * step_ms for c in OP_CLASSES}
    ms["overhead"] += step_ms - sum(ms.values())
    return Breakdown(step_ms=step_ms, ms=ms, tiny_ms={}, op_counts={"elementwise": 300.0})


CHAIN = CompileCost(0.02, 0.015, 0.025, 0.5, 0.4, 0.6, compile_s_fixed=2.0, compile_s_per_op=0.01,
                    source="measured here: chain")


def _compile(rates: Rates):
    t = OPTIONS["compile"]
    return predict_technique("compile", t.overrides, t.axes, _bd(matmul=0.3, elementwise=0.3, optimizer=0.2), None,
                             rates)


def test_the_models_own_compile_rate_wins_over_the_chain_and_the_map():
    slower = Rate(0.7, 0.6, 0.8, "measured here: this model's forward + backward, eager vs torch.compile")
    mapped = Rate(1.7, 1.5, 1.9, "crossover map (5 workload(s))")
    p = _compile(Rates(compile=CHAIN, model_compile=slower, model_compile_s=12.0,
                       crossover={("compile", "train_step"): mapped}))
    # forward + backward is 80 % of the step (the optimizer stays eager): 1 / (0.2 + 0.8 / 0.7)
    assert p.speedup == pytest.approx(1 / (0.2 + 0.8 / 0.7))
    assert p.lo < p.speedup < p.hi < 1
    assert "12 s compile never pays back" in p.reason and "eager vs torch.compile" in p.reason


def test_a_faster_compiled_model_states_its_break_even_steps():
    p = _compile(Rates(model_compile=Rate(2.0, 1.8, 2.2, "measured here: model"), model_compile_s=10.0))
    assert p.speedup == pytest.approx(1 / (0.2 + 0.4))
    saved_ms = 10.0 * (1 - 1 / p.speedup)
    assert f"after ~{10.0 * 1e3 / saved_ms:,.0f} steps" in p.reason


def test_without_it_the_chain_still_predicts():
    p = _compile(Rates(compile=CHAIN))
    assert "chain" in p.reason and "eager vs torch.compile" not in p.reason


def test_an_unknown_measurement_is_refused_before_any_work():
    with pytest.raises(ValueError, match="measure=.*allowed: compile"):
        diagnose(RunConfig(workload="mlp", size="tiny"), measure=("everything",))
