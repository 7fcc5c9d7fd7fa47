"""lab.doctor.scores on synthetic predicted / measured pairs: Spearman, regret, coverage, per-technique errors."""

from __future__ import annotations

import pytest

from lab.doctor import covered_at_aa, format_scorecard, regret, scorecard, spearman, step_error


def _row(t: str, p: float, m: float | None, lo: float | None = None, hi: float | None = None, axis: str = "train_step",
         **extra: float) -> dict:
    return {"technique": t, "axis": axis, "predicted": p, "predicted_lo": lo if lo is not None else p * 0.9,
            "predicted_hi": hi if hi is not None else p * 1.1, "measured": m, "measured_hi": m,
            "error": (p / m - 1) if m else None, **extra}


def test_spearman_reads_ranks_with_ties_and_refuses_too_few():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 1, 2]) == pytest.approx(0.8660254)  # scipy.stats.spearmanr's value
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None
    with pytest.raises(ValueError):
        spearman([1, 2, 3], [1, 2])


def test_regret_is_what_the_top_pick_leaves_of_the_best_measured():
    rows = [_row("a", 2.0, 1.5), _row("b", 1.5, 2.0), _row("c", 1.0, 1.0), _row("i", 3.0, 5.0, axis="inference")]
    assert regret(rows) == pytest.approx(0.25)  # inference rows never compete for the training pick
    assert regret([_row("a", 2.0, 2.0), _row("b", 1.0, 1.0)]) == 0.0
    assert regret([_row("a", 2.0, None)]) is None


def test_step_error_prefers_measured_ms_and_falls_back_to_the_speedups():
    assert step_error(_row("a", 2.0, 1.6, predicted_step_ms=5.0, measured_step_ms=4.0)) == pytest.approx(0.25)
    assert step_error(_row("a", 2.0, 1.6)) == pytest.approx(1.6 / 2.0 - 1)
    assert step_error(_row("a", 2.0, 1.6, axis="inference")) is None


def test_scorecard_counts_coverage_zero_width_top1_and_per_technique_errors():
    case1 = {"rows": [_row("a", 2.0, 1.0, lo=1.9, hi=2.1), _row("b", 1.5, 1.9, lo=1.5, hi=1.5)]}  # miss, zero width
    case2 = {"rows": [_row("a", 2.0, 2.0), _row("b", 1.0, 1.0), _row("c", 0.5, 0.5)]}
    card = scorecard([case1, case2])
    assert card["cases"] == 2 and card["pairs"] == 5
    assert card["coverage"] == pytest.approx(3 / 5) and card["zero_width"] == 1
    assert card["top1_hits"] == 1 and card["top1_n"] == 2
    assert card["regret_mean"] == pytest.approx((1 - 1.0 / 1.9) / 2)
    assert card["regret_worst"] == pytest.approx(1 - 1 / 1.9)
    assert card["spearman_mean"] == pytest.approx(1.0)  # case1 has 2 rows: no rank correlation
    a = card["per_technique"]["a"]
    assert a["n"] == 2 and a["speedup_error"]["max"] == pytest.approx(1.0) and a["speedup_error"]["median"] == 0.5
    assert a["step_error"]["max"] == pytest.approx(0.5)
    assert card["aa_noise"]["max"] is None  # no A/A arm in these rows
    case2["rows"][0]["aa_measured"] = 1.3
    card = scorecard([case1, case2])
    assert card["aa_noise"]["max"] == pytest.approx(0.3)
    text = format_scorecard(card, "synthetic")
    assert "worst 30 %: no figure here is finer" in text
    # case1's b (1.5 [1.5, 1.5], measured 1.9) is missed either way; with an A/A of 1.3 it is inside
    assert covered_at_aa({**case1["rows"][1], "aa_measured": 1.3}) and not covered_at_aa(case1["rows"][1])
    assert card["coverage_at_aa"] == pytest.approx(3 / 5)
    assert "top-1 1 of 2" in text and "zero-width intervals 1" in text and "\n  a " in text
