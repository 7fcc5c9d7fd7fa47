"""The paired interval of a speedup from one interleaved loop (lab.measure.paired_ratio_ci, rounds_ratio_ci):
what moved a whole round cancels, which independent resampling cannot see."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.measure import bootstrap_ratio_ci, paired_ratio_ci, rounds_ratio_ci

drifts = st.lists(st.floats(0.2, 5.0), min_size=3, max_size=12)


@settings(max_examples=40, deadline=None)
@given(drifts, st.floats(0.3, 4.0))
def test_a_constant_per_round_ratio_has_a_zero_width_interval_whatever_the_drift(drift, r):
    base = [10.0 * d for d in drift]
    arm = [b / r for b in base]
    est, lo, hi = paired_ratio_ci(base, arm)
    assert est == pytest.approx(r) and lo == pytest.approx(r) and hi == pytest.approx(r)


def test_the_full_maps_case_drift_widens_only_the_independent_interval():
    """fp32 steps that moved 2x from round to round, bf16 about 2x faster in each round."""
    base = [60.0, 120.0, 64.0, 118.0, 61.0]
    arm = [31.0, 58.0, 33.0, 60.0, 30.0]
    est, lo, hi = paired_ratio_ci(base, arm)
    e2, lo2, hi2 = bootstrap_ratio_ci(base, arm)
    assert est == e2  # the same estimate: the ratio of medians
    assert 1.8 < lo <= est <= hi < 2.2
    assert lo2 < 1.2 and hi2 > 3.5  # the unpaired interval reached below 1.2 and above 3.5


def test_rounds_pair_on_the_rounds_both_arms_have_and_fall_back_below_three():
    base = [10.0, 20.0, 10.0, 20.0, 10.0, 20.0]
    arm = [5.0, 10.0, 5.0]  # an arm with fewer rounds: its rounds are the base's first ones
    assert rounds_ratio_ci(base, arm) == paired_ratio_ci(base[:3], arm)
    assert rounds_ratio_ci(base, arm[:2]) == bootstrap_ratio_ci(base, arm[:2])
    with pytest.raises(ValueError, match="one of each per round"):
        paired_ratio_ci(base, arm)
