"""The doctor never prescribes a loss (issue 45 item 4), on planted predictions and verified rows: ranked by the
interval's lower end over the run's length (one-off costs charged), nothing prescribed that noise explains, the
pick scored as what the user would run (the baseline when nothing was prescribed), and no zero-width measured
interval printed. No run, no timing."""

from __future__ import annotations

import math

import pytest

from lab.doctor import Prediction, Rates, compare, format_verification, regret, scorecard, top1_hit
from lab.doctor.risk import (
    COMPILE_S_PRIOR,
    LOWER_END,
    NOTHING_PAYS,
    SURE_ENOUGH,
    RunLength,
    decide,
    one_off_s,
    prescribe,
    prescription,
    represcribe_rows,
)
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
    fused = next(p for p in ranked if p.technique == "fused_optim")
    assert fused.run_lo == pytest.approx(1.05 / 1.08)
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


# --- the rule: P(faster) >= 0.8 and a gain beyond the A/A noise, ranked by the expected time saved ----------------
AA = math.log(1.075)  # the A/A noise floor of amd-epyc-avx512bf16-2c's committed calibration


def test_a_sure_enough_gain_is_prescribed_where_the_lower_end_rule_prescribed_nothing():
    """The quiet pasted set: bf16 1.13x [0.90, 1.41] on the word LM measured 1.19x; the 90 % interval's lower end
    (a one-sided 95 %) is below 1, so the first rule prescribed nothing; P(faster) is 0.81 and the gain (13 %)
    is beyond the A/A noise (7.5 %): prescribed."""
    preds = [_p("bf16", 1.127, 0.90, 1.41), _p("prefetch", 1.0, 0.73, 1.28), _p("amp_auto", 1.0, 0.86, 1.16)]
    old = prescribe(preds, LONG, overrides=OVERRIDES, noise=AA, rule=LOWER_END)
    assert prescription(old) is None
    new = prescribe(preds, LONG, overrides=OVERRIDES, noise=AA, rule=SURE_ENOUGH)
    assert prescription(new).technique == "bf16" and new[0].p_faster == pytest.approx(0.81, abs=0.01)
    assert [p.prescribed for p in new] == [True, False, False]  # 1.00x is never "faster" (P 0.5)
    assert "P(faster than the baseline) 81 %" in new[0].reason


def test_a_high_variance_pick_is_not_prescribed_nor_ranked_above_a_sure_one():
    """1.30x [0.60, 2.80] has the best centre but a 29 % chance of losing: not prescribed, and a surer 1.13x
    with the same or better expected saving ranks first; a gain inside the A/A noise is never prescribed however
    narrow its interval."""
    wild, sure = _p("compile", 1.30, 0.60, 2.80), _p("bf16", 1.127, 0.90, 1.41)
    d = decide(1.30, 0.60, 2.80, AA)
    assert 0.6 < d.p_faster < 0.8 and not d.prescribed
    ranked = prescribe([wild, sure], LONG, overrides={}, noise=AA)
    assert [p.technique for p in ranked] == ["bf16", "compile"] and not ranked[1].prescribed
    assert not decide(1.05, 1.049, 1.051, AA).prescribed  # P ~ 1, but 5 % < the 7.5 % A/A noise
    assert decide(1.05, 1.049, 1.051, 0.0).prescribed


def test_the_lower_end_rule_is_exactly_the_interval_clearing_one():
    for lo in (0.98, 0.999, 1.001, 1.05):
        assert decide(1.1, lo, 1.2, 0.0, LOWER_END).prescribed == (lo > 1.0)


def test_compile_one_off_cost_still_ranks_it_out_on_a_short_run():
    """A 64-step run at 5 ms cannot repay compile's ~20 s: under the new rule too it is never prescribed and its
    expected saving (negative: the run takes longer) ranks it under a sure per-step gain and under a 1.00x."""
    short = RunLength(steps=64, step_ms=5.0)
    ranked = prescribe([_p("compile", 1.5, 1.3, 1.7), _p("bf16", 1.127, 0.90, 1.41), _p("prefetch", 1.0, 0.9, 1.1)],
                       short, overrides=OVERRIDES, noise=AA)
    assert [p.technique for p in ranked] == ["bf16", "prefetch", "compile"]
    assert not ranked[2].prescribed and ranked[2].p_faster < 1e-6 and ranked[2].expected_saving < -1


def _stored(t: str, s: float, lo: float, hi: float, m: float, **kw) -> dict:
    return {"technique": t, "axis": "train_step", "predicted": s, "predicted_lo": lo, "predicted_hi": hi,
            "measured": m, "measured_lo": m * 0.98, "measured_hi": m * 1.02, "aa_measured": 1.01,
            "baseline_step_ms": 10.0, **kw}


def test_stored_rows_are_represcribed_offline_and_scored():
    """``benchmarks/doctor.py --rules`` re-decides stored rows: flags and order from the stored predictions, compile
    charged its prior compile over 40 steps when the row predates the run figures, the stored run figures used
    when present; scored as the user runs it."""
    rows = [_stored("compile", 1.4, 1.2, 1.6, 0.75, prescribed=True),  # as stored by the point-estimate rule
            _stored("fused_optim", 1.09, 0.68, 1.75, 1.18),
            _stored("bf16", 1.127, 0.90, 1.41, 1.19, run_speedup=1.127, run_lo=0.90, one_off_s=0.0)]
    assert regret(rows) > 0.3
    old = represcribe_rows(rows, rule=LOWER_END, noise=AA)
    assert not any(r["prescribed"] for r in old) and regret(old) == pytest.approx(1 - 1 / 1.19)
    new = represcribe_rows(rows, rule=SURE_ENOUGH, noise=AA)
    assert [r["technique"] for r in new] == ["bf16", "fused_optim", "compile"] and new[0]["prescribed"]
    assert not new[1]["prescribed"]  # fused Adam x/ 1.6: P(faster) 0.62
    assert new[2]["run_speedup"] < 0.1  # 40 steps of 10 ms against a 20 s compile
    card = scorecard([{"rows": new}])
    assert card["top1_hits"] == 1 and card["slower"] == 0 and card["nothing_prescribed"] == 0


def test_a_baseline_profiled_on_a_busy_machine_prescribes_nothing_and_says_why(tmp_path):
    """The bands are quiet verifications' errors: a profile that carried other processes' time is outside them, so
    the diagnosis ranks, shows, stores and reads back its picks, but prescribes none and says the machine was busy."""
    from lab.config import RunConfig
    from lab.doctor.diagnosis import BUSY_REFUSAL, Diagnosis, format_diagnosis
    from lab.doctor.stored import diagnosis_by_id, save_diagnosis
    from lab.measure.profile import Breakdown
    from lab.result import RunResult
    from lab.store import ResultStore

    base = RunResult(run_id="0" * 32, config={}, env={"torch_threads": 1}, metric_name="accuracy")
    preds = [Prediction("bf16", "train_step", 1.3, 1.2, 1.4, "planted"),
             Prediction("fused_optim", "train_step", 1.1, 1.05, 1.15, "planted")]
    quiet = Diagnosis(cfg=RunConfig(workload="mlp", size="tiny"), baseline=base, train=Breakdown(step_ms=10.0,
                      ms={"matmul": 10.0}), infer=None, rates=Rates(), rate_source="planted", predictions=preds)
    assert quiet.for_run(10**6).top().technique == "bf16"
    sentence = "measured while this machine was busy (other processes used 1.2 of 2 cores; load 3.1)"
    busy = quiet.__class__(**{**quiet.__dict__, "busy": sentence}).for_run(10**6)
    assert busy.top() is None and all(not p.prescribed for p in busy.predictions)
    assert [p.technique for p in busy.predictions] == ["bf16", "fused_optim"]  # still ranked, shown
    assert all(BUSY_REFUSAL in p.reason for p in busy.predictions)
    text = format_diagnosis(busy)
    assert f"nothing prescribed: {BUSY_REFUSAL} ({sentence})" in text and NOTHING_PAYS not in text
    with ResultStore(str(tmp_path / "s.sqlite")) as store:
        back = diagnosis_by_id(store, save_diagnosis(store, busy))
    assert back.busy == sentence and back.top() is None
