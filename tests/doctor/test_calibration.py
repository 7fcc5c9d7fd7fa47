"""lab.doctor.calibration: split-conformal bands over held-out residuals, the A/A floor, no zero-width interval,
and the reason says where the band came from. Synthetic residuals only (no timing)."""

from __future__ import annotations

import json
import math
import random

import pytest

from lab.doctor import Calibration, Prediction, case_key, conformal_quantile, load_calibration, rates


def _case(name: str, rows: list[tuple[str, float, float]], aa: float = 1.0) -> dict:
    return {"workload": name, "size": "tiny", "model_scale": None,
            "rows": [{"technique": t, "axis": "train_step", "predicted": p, "measured": m, "aa_measured": aa,
                      "predicted_lo": p, "predicted_hi": p} for t, p, m in rows]}


def test_conformal_quantile_is_the_right_order_statistic_and_infinite_when_too_few():
    xs = [0.1 * i for i in range(1, 20)]  # 19 values: rank ceil(20 * 0.9) = 18
    assert conformal_quantile(xs, 0.9) == pytest.approx(1.8)
    assert conformal_quantile(xs[:5], 0.9) == math.inf  # rank 6 of 5: cannot promise 90 %
    with pytest.raises(ValueError, match="coverage"):
        conformal_quantile(xs, 1.0)


def test_a_zero_width_prediction_gets_its_techniques_band_and_keeps_its_model_interval():
    cases = [_case(f"m{i}", [("fused_optim", 1.0, 1.0 + 0.02 * i)]) for i in range(12)]
    cal = Calibration.from_cases(cases, "synthetic")
    p = Prediction("fused_optim", "train_step", 1.11, 1.11, 1.11, "optimizer 10 % of the step")
    out = cal.apply(p)
    q = conformal_quantile([math.log(1 + 0.02 * i) for i in range(12)], 0.9)
    assert out.lo == pytest.approx(1.11 * math.exp(-q)) and out.hi == pytest.approx(1.11 * math.exp(q))
    assert (out.model_lo, out.model_hi) == (1.11, 1.11) and out.speedup == 1.11
    assert "fused_optim's residuals over 12 verified cases (synthetic)" in out.reason


def test_a_wide_model_interval_is_never_narrowed():
    cal = Calibration.from_cases([_case(f"m{i}", [("bf16", 1.0, 1.01)]) for i in range(12)])
    p = Prediction("bf16", "train_step", 1.0, 0.5, 2.0, "wide")
    out = cal.apply(p)
    assert (out.lo, out.hi) == (0.5, 2.0) and "already holding its error" in out.reason


def test_the_interval_is_never_narrower_than_the_aa_noise():
    cases = [_case(f"m{i}", [("fused_optim", 1.0, 1.0)], aa=1.2) for i in range(12)]  # perfect model, noisy A/A
    out = Calibration.from_cases(cases).apply(Prediction("fused_optim", "train_step", 1.5, 1.5, 1.5, "r"))
    assert out.hi / out.speedup == pytest.approx(1.2) and out.speedup / out.lo == pytest.approx(1.2)
    assert "A/A noise" in out.reason


def test_too_few_residuals_pool_every_technique_and_none_is_the_prior():
    cases = [_case(f"m{i}", [("bf16", 1.0, 1.3), ("compile", 1.0, 1.0)]) for i in range(6)] + \
            [_case("m9", [("compile", 1.0, 1.0)])]
    q, how = Calibration.from_cases(cases).band("compile")  # 7 compile residuals: too few alone
    assert "pooled" in how and q == pytest.approx(math.log(1.3))
    q, how = Calibration().band("compile")
    assert how.startswith("prior") and q > 0


def test_leaving_a_case_out_removes_its_residuals_and_its_aa():
    cases = [_case(f"m{i}", [("bf16", 1.0, 1.05)]) for i in range(10)] + [_case("outlier", [("bf16", 1.0, 3.0)], 1.5)]
    cal = Calibration.from_cases(cases)
    assert cal.band("bf16")[0] == pytest.approx(math.log(3.0))
    held = cal.without(case_key(cases[-1]))
    assert held.band("bf16")[0] == pytest.approx(math.log(1.05)) and held.noise_floor() == 0.0


def test_held_out_coverage_reaches_the_nominal_level_on_exchangeable_residuals():
    """Leave-one-case-out bands over log-normal model errors hold the truth in >= 85 % of 200 cases."""
    rnd = random.Random(0)
    cases = [_case(f"m{i}", [("bf16", 1.0, math.exp(rnd.gauss(0, 0.2)))]) for i in range(200)]
    cal = Calibration.from_cases(cases)
    inside = 0
    for c in cases:
        out = cal.without(case_key(c)).apply(Prediction("bf16", "train_step", 1.0, 1.0, 1.0, ""))
        inside += out.lo <= c["rows"][0]["measured"] <= out.hi
    assert inside / len(cases) >= 0.85


def test_load_calibration_says_when_it_borrows_another_machines_run(tmp_path):
    (tmp_path / "other-2c").mkdir()
    (tmp_path / "other-2c" / "doctor.json").write_text(json.dumps({"cases": [_case("m", [("bf16", 1.0, 1.1)])]}))
    cal = load_calibration("mine-4c", tmp_path)
    assert "another machine's" in cal.source and "other-2c" in cal.source and len(cal.residuals) == 1
    assert load_calibration("other-2c", tmp_path).source == "other-2c/doctor.json"
    assert load_calibration("x", tmp_path / "empty").residuals == []


def test_quiet_held_out_cases_beside_the_doctor_json_calibrate_too_and_noisy_ones_do_not(tmp_path):
    hw = tmp_path / "box-2c"
    (hw / "heldout").mkdir(parents=True)
    (hw / "doctor.json").write_text(json.dumps({"cases": [_case("m", [("bf16", 1.0, 1.1)])]}))
    (hw / "heldout" / "run.json").write_text(json.dumps({"cases": [
        _case("gallery_a", [("bf16", 1.0, 1.5)], aa=1.02),   # quiet: kept
        _case("gallery_c", [("bf16", 1.0, 1.4)], aa=1.05),   # a 5 % A/A cannot tell a 3 % gain: left out
        _case("gallery_b", [("bf16", 1.0, 3.0)], aa=1.6)]}))  # the machine's load, not the doctor: left out
    cal = load_calibration("box-2c", tmp_path)
    assert {r.case for r in cal.residuals} == {"m:tiny:", "gallery_a:tiny:"}
    assert "1 quiet held-out cases" in cal.source
    assert {r.case for r in load_calibration("box-2c", tmp_path, exclude="gallery_a:tiny:").residuals} == {"m:tiny:"}


def test_the_doctors_own_run_calibrates_only_with_its_quiet_cases_and_the_floor_is_theirs(tmp_path):
    """A busy day's case in the machine's doctor.json is the load's error, not the model's: its residuals and its
    A/A leave the bands and the floor, and the source says how many cases were kept."""
    hw = tmp_path / "box-2c"
    hw.mkdir()
    quiet_cases = [_case(f"q{i}", [("fused_optim", 1.04, 1.04 * (1 + 0.002 * i))], aa=1.0 + 0.001 * i)
                   for i in range(12)]
    busy = _case("busy", [("fused_optim", 1.04, 0.80)], aa=1.12)
    (hw / "doctor.json").write_text(json.dumps({"cases": [*quiet_cases, busy]}))
    cal = load_calibration("box-2c", tmp_path)
    assert "busy:tiny:" not in {r.case for r in cal.residuals} and "busy:tiny:" not in cal.aa
    assert "(12 of its 13 cases quiet)" in cal.source
    assert cal.band("fused_optim")[0] < math.log(1.03) and cal.noise_floor() < math.log(1.02)
    everything = Calibration.from_cases([*quiet_cases, busy])  # what the busy case would have done to them
    assert everything.noise_floor() == pytest.approx(math.log(1.12))
    p = Prediction("fused_optim", "train_step", 1.04, 1.04, 1.04, "")
    assert cal.apply(p).lo > 1.0 > everything.apply(p).lo  # a 4 % gain told apart only by the quiet bands


def test_without_a_map_the_doctor_names_the_price_of_building_one(tmp_path):
    (tmp_path / "box-2c").mkdir()
    (tmp_path / "box-2c" / "crossover.json").write_text(json.dumps({"quick": True, "wall_s": 150.0}))
    text = rates.crossover_advice(tmp_path)
    assert "lab crossover --quick" in text and "2.5 min on box-2c" in text
    assert "about 2-3 min" in rates.crossover_advice(tmp_path / "none")
