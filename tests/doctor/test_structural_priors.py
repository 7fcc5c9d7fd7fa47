"""compile without a measurement on this model or workload is a structural prior that says so (recurrent, tiny
step, attention), and the fused optimizer realises only part of its isolated saving. Synthetic breakdowns and
rates: no compile, no timing."""

from __future__ import annotations

import math

import pytest
import torch.nn as nn

from lab.doctor import (
    FUSED_REALISED,
    Calibration,
    Rate,
    Rates,
    Residual,
    attention_modules,
    predict_technique,
)
from lab.measure.profile import OP_CLASSES, Breakdown
from lab.registry import OPTIONS

BORROWED = Rate(1.05, 0.9, 1.2, "crossover map (5 workload(s), 0.1 MMACs/sample)")
OWN = Rate(1.3, 1.2, 1.4, "crossover map (same workload, 0.1 MMACs/sample)")


def _bd(step_ms: float = 10.0, **shares: float) -> Breakdown:
    ms = {c: shares.get(c, 0.0) * step_ms for c in OP_CLASSES}
    ms["overhead"] += step_ms - sum(ms.values())
    return Breakdown(step_ms=step_ms, ms=ms, tiny_ms={}, op_counts={"elementwise": 300.0})


def _predict(name: str, b: Breakdown, r: Rates):
    t = OPTIONS[name]
    return predict_technique(name, t.overrides, t.axes, b, None, r)


def test_attention_model_with_a_borrowed_map_rate_gets_a_wide_prior_holding_both_machines():
    # BERT-like: 27 % matmul, many small ops; Intel measured 1.09-1.36x, an AMD EPYC 0.67x
    b = _bd(8.5, matmul=0.27, elementwise=0.19, norm=0.05, optimizer=0.19)
    p = _predict("compile", b, Rates(attention=2, crossover={("compile", "train_step"): BORROWED}))
    assert "prior, not measured" in p.reason and "attention" in p.reason
    assert p.lo <= 0.67 and p.hi >= 1.41 and p.speedup > 1.2


def test_small_attention_blocks_are_not_predicted_to_gain():
    """issue 45: a minimal GPT's compile was predicted 1.23x from the attention prior and measured 0.75x; the
    gallery transformer's 9.5 ms step measured 0.93x on an AMD EPYC. Under 12 ms an attention model's compile is
    predicted below 1 under 0.5 M MACs per sample (by MACs: a busy machine stretches the step, not the MACs), its
    interval still reaching the 1.14x it measured once; the HF-sized ones keep the attention prior."""
    b = _bd(5.0, matmul=0.3, elementwise=0.3)
    small = _predict("compile", b, Rates(attention=2, macs_per_sample=3e5))
    assert small.speedup < 1.0 and small.lo <= 0.75 and small.hi >= 1.14 and "MACs per sample" in small.reason
    assert _predict("compile", _bd(50.0, matmul=0.3, elementwise=0.3), Rates(attention=2, macs_per_sample=3e5)
                    ).speedup < 1.0  # the same model on a busy machine: its step 10x longer, the same rule
    assert _predict("compile", b, Rates(attention=2, macs_per_sample=1.2e6)).speedup > 1.2


def test_the_workloads_own_map_rate_still_wins_over_the_structure():
    b = _bd(8.5, matmul=0.27, elementwise=0.19)
    p = _predict("compile", b, Rates(attention=2, crossover={("compile", "train_step"): OWN}))
    assert "the crossover map" in p.reason and "prior, not measured" not in p.reason


def test_recurrent_and_tiny_steps_are_not_predicted_to_gain():
    rnn = _predict("compile", _bd(6.0, recurrent=0.4, elementwise=0.3), Rates(attention=1))
    assert rnn.speedup == pytest.approx(1.0) and "aten::lstm" in rnn.reason and rnn.hi < 1.25
    tiny = _predict("compile", _bd(0.9, elementwise=0.4), Rates())
    assert tiny.speedup < 1.0 and "fixed price" in tiny.reason


def test_without_structure_or_measurement_a_borrowed_rate_is_called_a_prior():
    r = Rates(crossover={("compile", "train_step"): BORROWED})
    p = _predict("compile", _bd(10.0, matmul=0.5, elementwise=0.2), r)
    assert "prior, not measured: another workload's map rate" in p.reason


def test_attention_modules_counts_blocks_not_their_parts():
    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.MultiheadAttention(8, 2)

    model = nn.Sequential(SelfAttention(), nn.Linear(8, 8), nn.TransformerEncoderLayer(8, 2, 16))
    assert attention_modules(model) == 2 and attention_modules(nn.Linear(3, 3)) == 0


def test_fused_optimizer_realises_part_of_its_isolated_saving_and_is_never_zero_width():
    b = _bd(10.0, optimizer=0.4, matmul=0.3)
    p = _predict("fused_optim", b, Rates(fused_optimizer=Rate(3.0, 3.0, 3.0, "measured here: test")))
    full = 1 / (1 - 0.4 * (1 - 1 / 3.0))
    assert p.speedup == pytest.approx(1 / (1 - 0.4 * FUSED_REALISED.value * (1 - 1 / 3.0)), rel=1e-6)
    assert p.speedup < full and p.hi - p.lo > 0.05 and "realised" in p.reason
    # calibrated with a residual set it stays at least as wide
    cal = Calibration([Residual("fused_optim", "train_step", f"c{i}", math.log(1.02)) for i in range(10)])
    q = cal.apply(p)
    assert q.lo <= p.lo and q.hi >= p.hi
