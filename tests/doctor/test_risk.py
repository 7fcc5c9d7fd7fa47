"""The doctor never prescribes a loss (issue 45 item 4), on planted predictions and verified rows: ranked by the
interval's lower end over the run's length (one-off costs charged), nothing prescribed that noise explains, the
pick scored as what the user would run (the baseline when nothing was prescribed), and no zero-width measured
interval printed. No run, no timing."""

from __future__ import annotations

import math

import pytest

from lab.doctor import Prediction, Rates, compare, format_verification, regret, scorecard, top1_hit
from lab.doctor.risk import COMPILE_S_PRIOR, NOTHING_PAYS, RunLength, one_off_s, prescribe, prescription
from lab.registry import OPTIONS

OVERRIDES = {n: o.overrides for n, o in OPTIONS.items()}
LONG = RunLength(steps=10**7, step_ms=5.0, what="a long run")


def _p(name: str, s: float, lo: float, hi: float) -> Prediction:
    return Prediction(name, "train_step", s, lo, hi, "planted", [])


def test_a_point_estimate_whose_interval_reaches_a_loss_is_not_ranked_first():
    """issue 45: compile 1.23x [0.69, 1.97] was ranked first and measured 0.75x; bf16 1.21x, whose interval
    stayed above 1, measured 1.19x."""
    ranked = prescribe([_p("compile", 1.23, 0.69, 1.97), _p("bf16", 1.21, 1.05, 1.40)], LONG, overrides=OVERRIDES)
    assert [p.technique for p in ranked] == ["bf16", "compile"]
    assert ranked[0].prescribed and not ranked[1].prescribed
    assert prescription(ranked).technique == "bf16"


def test_nothing_is_prescribed_when_no_interval_clears_one_beyond_the_aa_noise():
    # fused_optim's own interval [1.04, 1.06] clears 1, but the verifications' A/A noise is x/ 1.08
    ranked = prescribe([_p("fused_optim", 1.05, 1.04, 1.06), _p("prefetch", 1.1, 0.9, 1.3)], LONG,
                       overrides=OVERRIDES, noise=math.log(1.08))
    assert prescription(ranked) is None and not any(p.prescribed for p in ranked)
    assert ranked[0].run_lo == pytest.approx(1.05 / 1.08)
    assert "nothing here pays beyond noise" in NOTHING_PAYS
    alone = prescribe([_p("fused_optim", 1.05, 1.04, 1.06)], LONG, overrides=OVERRIDES)  # no noise: it clears
    assert prescription(alone).technique == "fused_optim"


def test_a_short_run_cannot_repay_a_compile_a_long_one_can():
    pred = _p("compile", 1.5, 1.3, 1.7)
    short = prescribe([pred], RunLength(steps=64, step_ms=5.0), overrides=OVERRIDES)[0]
    c, lo, hi, what = one_off_s("compile", OVERRIDES["compile"], RunLength(64, 5.0))
    assert (c, lo, hi) == COMPILE_S_PRIOR and "prior" in what
    assert short.one_off_s == c and short.run_speedup == pytest.approx(0.32 / (0.32 / 1.5 + c))
    assert short.run_speedup < 0.05 and short.run_hi < 0.1 and not short.prescribed and "64 steps" in short.reason
    long = prescribe([pred], LONG, overrides=OVERRIDES)[0]
    assert long.prescribed and long.run_speedup == pytest.approx(1.5, rel=1e-3)
    measured = Rates(model_compile_s=3.0, model_compile=object())  # --measure compile timed it: 3 s
    assert one_off_s("compile", OVERRIDES["compile"], LONG, measured)[0] == 3.0


def test_auto_pays_its_probe_only_on_a_run_long_enough_to_be_probed():
    short = one_off_s("amp_auto", OVERRIDES["amp_auto"], RunLength(60, 5.0))
    assert short[:3] == (0.0, 0.0, 0.0) and short[3].startswith("no probe")
    long = one_off_s("amp_auto", OVERRIDES["amp_auto"], RunLength(1000, 5.0))
    assert 0 < long[0] <= long[2] <= 0.03 * 5.0 + 0.005 + 1e-9  # at most 3 % of the run and a step
    assert one_off_s("bf16", OVERRIDES["bf16"], LONG) == (0.0, 0.0, 0.0, "")


def _row(name: str, measured: float | None, *, prescribed: bool | None = True, lo: float | None = None,
         hi: float | None = None, aa: float = 1.0) -> dict:
    return {"technique": name, "axis": "train_step", "predicted": 1.2, "predicted_lo": 0.9, "predicted_hi": 1.5,
            "measured": measured, "measured_lo": lo, "measured_hi": hi, "error": None, "aa_measured": aa,
            "prescribed": prescribed}


def test_a_baseline_pick_is_scored_as_the_baseline_and_a_losing_pick_as_slower():
    nothing = [_row("compile", 0.75, prescribed=False), _row("bf16", 1.02, prescribed=False, lo=0.95, hi=1.1)]
    assert top1_hit(nothing) and regret(nothing) == pytest.approx(1 - 1 / 1.02)  # within noise: a hit
    missed = [_row("compile", 0.75, prescribed=False), _row("bf16", 1.3, prescribed=False, lo=1.2, hi=1.4)]
    assert not top1_hit(missed) and regret(missed) == pytest.approx(1 - 1 / 1.3)
    lost = [_row("compile", 0.75), _row("bf16", 0.9)]  # a prescribed pick that lost, beside another loser
    assert regret(lost) == pytest.approx(0.25)  # against the baseline, always an option
    card = scorecard([{"rows": nothing}, {"rows": lost}])
    assert card["nothing_prescribed"] == 1 and card["slower"] == 1 and card["slower_beyond_noise"] == 1
    old = [{k: v for k, v in r.items() if k != "prescribed"} for r in lost]  # rows stored before prescriptions
    assert scorecard([{"rows": old}])["slower"] == 1


def test_a_zero_width_measured_interval_is_a_point_and_printed_as_one():
    pd = pytest.importorskip("pandas")
    table = pd.DataFrame([{"arm": "baseline", "status": "ok"},
                          {"arm": "compile", "step_speedup": 0.75, "step_speedup_lo": 0.75, "step_speedup_hi": 0.75,
                           "status": "ok"}])
    rows = compare([_p("compile", 1.23, 0.69, 1.97)], table)
    assert rows[0]["measured_lo"] is None and rows[0]["measured_point"]
    text = format_verification(rows)
    assert "[0.75, 0.75]" not in text and "a point: too few repeats" in text
