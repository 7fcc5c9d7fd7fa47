"""The doctor's prescription in hours (issue 29 item 3): the baseline's full run from its own record (via
lab.ablation.project), each training pick's at its predicted speedup and interval; per 1000 steps without
epochs or rows. And the verification rows it is checked against keep a failed arm's reason. A synthetic record,
predictions and table: no run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lab import RunResult
from lab.doctor import Prediction, Rates
from lab.doctor.hours import format_hours, prescription_hours


def _diagnosis() -> SimpleNamespace:
    steps = [50.0, 30.0] + [10.0] * 8  # 2 warm-up steps, then 8 of 10 ms; 10 ms of loop time per step
    run = RunResult(run_id="0" * 32, config={}, env={}, metric_name="auc", metric=0.8, steps=10, warmup_steps=2,
                    batch_size=100, train_time_s=sum(steps) / 1e3 + 0.1, step_times_ms={"total": steps},
                    details={"resolved": {"steps_per_epoch": 10, "n_train": 1000, "n_test": 500, "epochs": 1},
                             "one_off_s": {"precision_probe": 0.5, "total": 0.5}})
    preds = [Prediction("compile", "train_step", 2.0, 1.0, 4.0, "r", []),
             Prediction("fused_optim", "train_step", 1.25, 1.0, 1.25, "r", []),
             Prediction("int8_dynamic", "inference", 3.0, 2.0, 4.0, "r", [])]
    return SimpleNamespace(baseline=run, cfg=SimpleNamespace(epochs=None), predictions=preds, rates=Rates())


def test_full_run_hours_follow_the_predicted_speedup_and_its_interval():
    h = prescription_hours(_diagnosis(), epochs=5, rows=2000)
    assert h["steps"] == 100
    base = h["baseline"]["total_s"]  # 100 x 20 ms + 0.06 s warm-up excess + 0.5 s probe
    assert base == pytest.approx(2.0 + 0.06 + 0.5)
    compile_, fused = h["picks"]
    assert [p["technique"] for p in h["picks"]] == ["compile", "fused_optim"]  # training picks only
    assert compile_["total_s"] == pytest.approx(1.0 + 0.56)
    assert (compile_["lo_s"], compile_["hi_s"]) == pytest.approx((0.5 + 0.56, 2.0 + 0.56))
    assert "not included" in compile_["note"] and fused["note"] == ""
    text = format_hours(h)
    assert "5 epochs x 2000 rows" in text and "compile" in text and "90 % interval" in text


def test_without_epochs_or_rows_the_unit_is_1000_steps():
    h = prescription_hours(_diagnosis())
    assert h["unit"] == "per 1000 steps" and h["steps"] == 1000
    assert h["baseline"]["total_s"] == pytest.approx(1000 * 0.020)
    assert h["picks"][0]["total_s"] == pytest.approx(1000 * 0.010)
    assert "step alone" in format_hours(h)


def test_a_failed_arm_keeps_its_reason_and_one_repeat_is_judged_by_its_point():
    pd = pytest.importorskip("pandas")
    from lab.doctor import compare, format_verification

    preds = [Prediction("int8_dynamic", "inference", 1.0, 0.5, 2.0, ""),
             Prediction("prefetch", "train_step", 1.1, 1.0, 1.2, "")]
    table = pd.DataFrame([
        {"arm": "baseline", "status": "ok"},
        {"arm": "int8_dynamic", "status": "error", "error": "RuntimeError: Expect weight to be contiguous"},
        {"arm": "prefetch", "step_speedup": 1.15, "status": "ok"}])  # one repeat: no interval
    rows = compare(preds, table)
    assert rows[0]["arm_error"].startswith("RuntimeError") and rows[0]["measured"] is None
    assert rows[1]["arm_error"] is None and rows[1]["inside"] and rows[1]["covered"]
    assert "error: RuntimeError" in format_verification(rows)
