"""The crossover logic on synthetic timings whose answers are known exactly: line fits, crossovers (measured
and predicted), leave-one-out, regime tags, the analysis of a whole map and its JSON schema."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.crossover import (
    CROSSOVER_KEYS,
    FIT_KEYS,
    ROW_KEYS,
    Line,
    analyse,
    check_schema,
    crossover_macs,
    figures,
    fit_line,
    load_map,
    loo_error,
    place,
    regime,
    write_map,
)
from lab.crossover.fit import first_paying_rung, params_at, rung_of_macs, within_one_rung

MACS = [1e5, 1e6, 1e7, 1e8, 1e9]  # per sample: 0.1 .. 1000 MMACs
PARAMS = [1e3, 1e4, 1e5, 1e6, 1e7]
BASE = Line(2.0, 0.05)  # 2 ms fixed, 0.05 ms per MMAC
TECH = Line(6.0, 0.025)  # 4 ms more fixed cost, half the arithmetic: crossover at 4 / 0.025 = 160 MMACs


@settings(max_examples=40, deadline=None)
@given(a=st.floats(0.0, 50.0), b=st.floats(1e-4, 5.0))
def test_fit_line_recovers_exact_lines(a: float, b: float) -> None:
    line = Line(a, b)
    got = fit_line(MACS, [float(line(m)) for m in MACS])
    assert got.overhead_ms == pytest.approx(a, rel=1e-6, abs=1e-6)
    assert got.ms_per_mmac == pytest.approx(b, rel=1e-6)


def test_fit_line_keeps_coefficients_non_negative() -> None:
    falling = fit_line(MACS, [10.0, 9.0, 8.0, 7.0, 6.0])  # noise that would give a negative cost
    assert falling.ms_per_mmac == 0.0 and falling.overhead_ms > 0
    through_origin = fit_line([1e6, 2e6, 4e6], [1.0, 2.1, 4.4])  # would give a negative overhead
    assert through_origin.overhead_ms == 0.0 and through_origin.ms_per_mmac == pytest.approx(1.07, rel=0.05)
    with pytest.raises(ValueError, match=">= 2"):
        fit_line([1e6], [1.0])
    with pytest.raises(ValueError, match="positive"):
        fit_line([1e6, 2e6], [1.0, 0.0])


def test_crossover_of_two_lines() -> None:
    assert crossover_macs(BASE, TECH) == pytest.approx(160e6)
    assert crossover_macs(BASE, Line(1.0, 0.01)) == 0.0  # cheaper everywhere: pays at any size
    assert crossover_macs(BASE, Line(3.0, 0.06)) is None  # dearer everywhere: never
    assert crossover_macs(BASE, BASE) is None  # the same line never *pays*
    assert crossover_macs(BASE, Line(1.0, 0.07)) is None  # cheaper when small, dearer when large


def test_measured_crossover_needs_ci_above_one_and_no_later_loss() -> None:
    assert first_paying_rung([0.5, 0.9, 1.1, 1.3], [0.7, 1.2, 1.4, 1.6]) == 2
    assert first_paying_rung([1.1, 0.5, 1.2, 1.3], [1.3, 0.8, 1.4, 1.6]) == 2  # rung 0's win is undone by rung 1
    assert first_paying_rung([0.5, 0.6], [0.9, 0.95]) is None
    assert first_paying_rung([None, 1.2, 1.3], [None, 1.5, 1.6]) == 1


def test_rung_index_agreement_and_interpolated_params() -> None:
    assert rung_of_macs(MACS, 160e6) == 4 and rung_of_macs(MACS, 0.0) == 0 and rung_of_macs(MACS, 5e9) == 5
    assert rung_of_macs(MACS, None) is None
    assert within_one_rung(3, 4, 5) and not within_one_rung(1, 4, 5)
    assert within_one_rung(None, 5, 5) and within_one_rung(4, None, 5) and not within_one_rung(None, 2, 5)
    assert params_at(MACS, PARAMS, 1e7) == pytest.approx(1e5)
    assert params_at(MACS, PARAMS, math.sqrt(1e7 * 1e8)) == pytest.approx(math.sqrt(1e5 * 1e6))
    assert params_at(MACS, PARAMS, 1e10) == pytest.approx(1e8)  # extrapolated along the last segment
    assert params_at(MACS, PARAMS, 0.0) == 0.0 and params_at(MACS, PARAMS, None) is None


def test_loo_error_is_zero_on_exact_lines_and_positive_on_a_kink() -> None:
    base = [float(BASE(m)) for m in MACS]
    tech = [float(TECH(m)) for m in MACS]
    assert loo_error(MACS, base, tech) == pytest.approx(0.0, abs=1e-9)
    kinked = tech[:-1] + [tech[-1] * 1.5]
    assert loo_error(MACS, base, kinked) > 0.05
    assert loo_error(MACS[:2], base[:2], tech[:2]) is None


def test_regime_tags_and_their_evidence() -> None:
    line = Line(2.0, 0.05)
    tag, why = regime(line, base_ms=2.5, macs_per_sample=1e4, batch_size=32, weight_params=1000, axis="train_step")
    assert tag == "dispatch-bound" and "80%" in why
    tag, _ = regime(line, base_ms=100.0, macs_per_sample=1e6, batch_size=32, weight_params=1_000_000,
                    axis="inference")  # 32 M MACs over 4 MB of weights: 8 MACs per byte, at the ridge
    assert tag == "compute-bound"
    tag, why = regime(line, base_ms=100.0, macs_per_sample=1e6, batch_size=1, weight_params=1_000_000,
                      axis="inference")  # batch 1: each weight byte used 0.25 times
    assert tag == "memory-bound" and "MACs per byte" in why


def _synthetic_rows() -> tuple[list[dict], list[dict]]:
    facts, rows = [], []
    for i, rung in enumerate(["xs", "s", "m", "l", "xl"]):
        facts.append({"workload": "toy", "rung": rung, "params": int(PARAMS[i]), "macs_per_sample": MACS[i],
                      "batch_size": 64, "weight_params": {"train_step": int(PARAMS[i]), "inference": int(PARAMS[i])}})
        b, t = float(BASE(MACS[i])), float(TECH(MACS[i]))
        s = b / t
        common = {"workload": "toy", "rung": rung, "params": int(PARAMS[i]), "macs_per_sample": MACS[i],
                  "axis": "train_step"}
        rows.append({**common, "technique": "bf16", "speedup": s, "ci_lo": s * 0.97, "ci_hi": s * 1.03,
                     "base_ms": b, "tech_ms": t, "why": ""})
        rows.append({**common, "technique": "int8_static_legacy", "speedup": None, "ci_lo": None, "ci_hi": None,
                     "base_ms": None, "tech_ms": None, "why": "skipped: cannot change the train step"})
    return facts, rows


def test_analyse_finds_the_known_crossover_and_writes_the_schema(tmp_path) -> None:
    facts, rows = _synthetic_rows()
    out = analyse(rows, facts)
    (cross,) = out["crossovers"]
    # speedups: 0.34, 0.36, 0.48, 0.96, 1.8 -> measured from xl; the map's prediction asks for a 5 % gain:
    # 2 + 0.05x >= 1.05 (6 + 0.025x) from x = 181 MMACs -> between l and xl
    assert cross["measured_macs"] == 1e9 and cross["measured_params"] == 1e7
    assert cross["predicted_macs"] == pytest.approx((6.3 - 2.0) / (0.05 - 0.02625) * 1e6)
    assert 1e6 < cross["predicted_params"] < 1e7 and cross["within_one_rung"]
    (fit,) = out["fits"]
    assert fit["base_overhead_ms"] == pytest.approx(2.0) and fit["tech_ms_per_mmac"] == pytest.approx(0.025)
    assert fit["loo_error"] == pytest.approx(0.0, abs=1e-9)
    tags = {r["rung"]: r["regime"] for r in out["rows"] if r["technique"] == "bf16"}
    assert tags["xs"] == "dispatch-bound" and tags["xl"] == "compute-bound"
    assert all(set(r) == set(ROW_KEYS) for r in out["rows"])
    skipped = [r for r in out["rows"] if r["technique"] == "int8_static_legacy"]
    assert all(r["speedup"] is None and r["why"].endswith("skipped: cannot change the train step") for r in skipped)
    path = write_map({**out, "env": {"hardware_id": "test"}}, tmp_path / "crossover.json")
    raw = json.loads(path.read_text())  # plain JSON: no NaN, readable without lab
    assert set(raw["crossovers"][0]) >= set(CROSSOVER_KEYS) and set(raw["fits"][0]) >= set(FIT_KEYS)
    assert raw["figures"][0]["family"] == "crossover" and raw["figures"][0]["value"] == 1.0
    assert load_map(path)["rows"] == raw["rows"]
    broken = dict(raw)
    broken["fits"] = [{k: v for k, v in raw["fits"][0].items() if k != "loo_error"}]
    with pytest.raises(ValueError, match="fits\\[0\\] lacks loo_error"):
        check_schema(broken)


def test_your_model_is_placed_against_its_family() -> None:
    facts, rows = _synthetic_rows()
    the_map = analyse(rows, facts)
    small, big = place(the_map, 5_000, 1e5, "toy"), place(the_map, 5e7, 5e9, "toy")
    (p_small,), (p_big,) = small["predictions"], big["predictions"]
    assert not p_small["pays"] and p_small["predicted_speedup"] == pytest.approx(BASE(1e5) / TECH(1e5))
    assert p_big["pays"] and p_big["predicted_speedup"] > 1.8
    assert small["nearest_rung"] == "xs" and big["nearest_rung"] == "xl"
    with pytest.raises(ValueError, match="no fits for family 'vision'"):
        place(the_map, 1, 1.0, "vision")
    assert figures({**the_map, "env": {}})[0]["met"] is True


def test_crossover_with_a_required_gain_moves_up_by_the_known_amount() -> None:
    # 2 + 0.05x >= 1.05 (6 + 0.025x)  <=>  x >= (6.3 - 2) / (0.05 - 0.02625) = 181.05... MMACs
    assert crossover_macs(BASE, TECH, 0.05) == pytest.approx((6.3 - 2.0) / (0.05 - 0.02625) * 1e6)
    assert crossover_macs(BASE, Line(1.0, 0.01), 0.05) == 0.0
    assert crossover_macs(BASE, Line(1.0, 0.049), 0.05) is None  # 2 % cheaper per MAC never makes 5 %


def test_predicted_vs_measured_puts_an_ablation_beside_the_map() -> None:
    from lab.crossover import predicted_vs_measured
    from lab.crossover.fit import predicted_speedup
    from lab.measure import count_macs
    from lab.workloads import get_workload

    facts, rows = _synthetic_rows()
    for f, r in zip(facts, [r for r in rows if r["technique"] == "bf16"], strict=True):
        f["workload"] = r["workload"] = "sequence"
    for r in rows:
        r["workload"] = "sequence"
    the_map = analyse(rows, facts)
    table = [{"arm": "bf16", "step_speedup": 0.5, "step_speedup_lo": 0.4, "step_speedup_hi": 0.6},
             {"arm": "int8_dynamic", "infer_speedup": 1.2, "infer_speedup_lo": 1.1, "infer_speedup_hi": 1.3}]
    (got,) = predicted_vs_measured(the_map, table, "sequence", size="tiny")  # int8 is not in this map
    wl = get_workload("sequence")
    macs = count_macs(wl.make_model(wl.size("tiny")), (torch.zeros(8, 10, 100),)) / 8
    assert got["arm"] == "bf16" and got["axis"] == "train_step" and got["measured"] == 0.5
    assert got["predicted"] == pytest.approx(predicted_speedup(BASE, TECH, macs), rel=1e-3)
    assert got["agrees"] == (0.4 <= got["predicted"] <= 0.6)
