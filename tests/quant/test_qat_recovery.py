"""The QAT recovery arithmetic (lab.quant.qat_recovery) and the Student-t interval over seeds it rests on."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.measure import mean_t_ci, t975
from lab.quant import MIN_RECOVERABLE_GAP_PTS, qat_recovery


def test_mean_t_ci_matches_the_textbook_interval():
    values = [0.81, 0.77, 0.69]
    mean, lo, hi = mean_t_ci(values)
    half = 4.303 * statistics.stdev(values) / math.sqrt(3)  # t(0.975, 2 dof)
    assert mean == pytest.approx(statistics.mean(values))
    assert (lo, hi) == (pytest.approx(mean - half), pytest.approx(mean + half))
    one = mean_t_ci([0.5])
    assert one[0] == 0.5 and math.isnan(one[1]) and math.isnan(one[2])
    assert all(math.isnan(x) for x in mean_t_ci([]))
    assert t975(40) == 1.96 and t975(11) == t975(10)  # between tabled values: the smaller dof, the wider
    with pytest.raises(ValueError, match="at least 2"):
        t975(0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=2, max_size=12))
def test_mean_t_ci_contains_its_mean_and_is_wider_than_the_normal_one(values):
    mean, lo, hi = mean_t_ci(values)
    assert lo <= mean + 1e-9 and mean <= hi + 1e-9
    normal_half = 1.96 * float(np.std(values, ddof=1)) / math.sqrt(len(values))
    assert hi - mean >= normal_half * (1 - 1e-9)


def test_a_real_gap_gets_a_share_and_a_full_recovery_reads_100_percent():
    fp32, ptq = [0.80, 0.78, 0.82], [0.76, 0.75, 0.77]  # 4, 3, 5 pts lost
    full = qat_recovery(fp32, ptq, fp32)
    assert full["real_gap"] and full["gap"] == pytest.approx(4.0) and full["share"] == pytest.approx(100.0)
    assert full["pooled"] == pytest.approx(100.0) and full["n_with_gap"] == 3
    none = qat_recovery(fp32, ptq, ptq)
    assert none["share"] == pytest.approx(0.0)
    half = qat_recovery(fp32, ptq, [(f + p) / 2 for f, p in zip(fp32, ptq, strict=True)])
    assert half["share"] == pytest.approx(50.0) and half["share_ci"][0] <= 50.0 <= half["share_ci"][1]


def test_no_share_of_a_gap_that_is_noise_or_below_the_labs_tolerance():
    noisy = qat_recovery([0.80, 0.78, 0.82], [0.81, 0.76, 0.82], [0.85, 0.80, 0.86])  # gap CI straddles 0
    assert not noisy["real_gap"] and math.isnan(noisy["share"])
    # ctr's AUC: deterministic on its test set, so a 0.02-pt gap has a CI above 0 and still is no loss
    tiny = qat_recovery([0.6606, 0.6997, 0.7003], [0.6604, 0.6995, 0.7001], [0.6657, 0.7024, 0.7032])
    assert tiny["gap_ci"][0] > 0 and tiny["gap"] < MIN_RECOVERABLE_GAP_PTS
    assert not tiny["real_gap"] and math.isnan(tiny["share"])
    with pytest.raises(ValueError, match="one fp32, PTQ and QAT metric per seed"):
        qat_recovery([0.8], [0.7, 0.7], [0.8])


@settings(max_examples=60, deadline=None)
@given(base=st.lists(st.floats(0.3, 0.95), min_size=2, max_size=6), lost=st.floats(0.01, 0.2),
       back=st.floats(0.0, 1.0))
def test_a_uniform_gap_recovered_by_a_fixed_fraction_reads_that_fraction(base, lost, back):
    ptq = [b - lost for b in base]
    qat = [p + back * lost for p in ptq]
    rec = qat_recovery(base, ptq, qat)
    assert rec["real_gap"]  # every seed lost the same >= 1 pt: a zero-width CI above 0
    assert rec["share"] == pytest.approx(100 * back, abs=1e-6) and rec["pooled"] == pytest.approx(100 * back, abs=1e-6)
