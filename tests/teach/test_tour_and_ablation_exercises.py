"""The exercises of notebooks 00 (the median step) and 06 (a 2-way interaction): each checker passes the reference
and fails the answers a learner gets wrong (the warm-up left in, one middle value of an even count; a difference of
speedups, a ratio to one single)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lab.ablation import interaction_effects
from lab.result import RunResult
from lab.teach import checks as C
from lab.teach import solutions as S


def _result() -> RunResult:
    r = RunResult(run_id="x", config={}, env={})
    r.step_times_ms = {"total": [30.0, 20.0, 5.0, 1.0, 2.0, 3.0, 4.0]}
    r.warmup_steps = 2
    return r


def test_median_step_passes_the_reference_against_run_result():
    assert C.median_step(S.median_step, _result()) == _result().median_step_ms == 3.0


@pytest.mark.parametrize("wrong", [lambda t, w: float(np.median(t)),                      # warm-up left in
                                   lambda t, w: sorted(t[w:])[len(t[w:]) // 2]])          # upper middle value
def test_median_step_fails_a_wrong_median(wrong):
    with pytest.raises(AssertionError):
        C.median_step(wrong, _result())


def _table() -> pd.DataFrame:
    return pd.DataFrame({"techniques": ["", "workers2", "bf16", "workers2+bf16"], "status": "ok",
                         "train_speedup": [1.0, 1.3, 0.9, 1.25], "acc_loss_pt": 0.0})


def test_interaction_passes_the_reference_on_a_table_and_made_up_squares():
    got = C.interaction(S.interaction, _table(), ["workers2", "bf16"])
    effects = interaction_effects(_table())
    assert got == pytest.approx(float(effects[effects.term == "2-way"].effect.iloc[0])) == pytest.approx(1.25 / 1.17)


@pytest.mark.parametrize("wrong", [lambda j, a, b: j - a - b + 1, lambda j, a, b: j / a, lambda j, a, b: j])
def test_interaction_fails_a_wrong_formula(wrong):
    with pytest.raises(AssertionError, match="interaction_effects"):
        C.interaction(wrong, _table(), ["workers2", "bf16"])
