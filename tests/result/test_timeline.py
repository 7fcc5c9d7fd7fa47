"""Issue 29: one-off costs read from where each family measures them, end to end, and the time to target."""

from __future__ import annotations

import pytest

from lab.result import RunResult, format_result
from lab.result.timeline import end_to_end_s, finalize, one_off_costs, time_to_target

DETAILS = {
    "compute": {"compile_s": 2.0},
    "precision": {"auto": {"probe_s": 0.5}},
    "pruning": {"finetune": {"time_s": 3.0}},
    "quant": {"flow": "pt2e", "quantize_s": 1.5, "qat": {"time_s": 1.0}, "compile_s": {"int8": {"1": 0.2, "256": 0.3}}},
    "checkpoint_s": 0.25,
    "ddp_spawn_s": 4.0,
    "eval_s": 0.75,
}
CURVE = [{"step": 10, "train_s": 1.0, "metric": 0.60, "eval_s": 0.1},
         {"step": 20, "train_s": 2.0, "metric": 0.70, "eval_s": 0.1},
         {"step": 30, "train_s": 3.0, "metric": 0.75, "eval_s": 0.1}]


def test_one_off_costs_take_each_part_from_its_family_and_qat_out_of_pt2e_quantize():
    got = one_off_costs(DETAILS)
    assert got == pytest.approx({"compile": 2.0, "precision_probe": 0.5, "prune_finetune": 3.0, "qat_finetune": 1.0,
                                 "quantize": 0.5, "int8_compile": 0.5, "checkpoint_writes": 0.25, "ddp_spawn": 4.0,
                                 "total": 11.75})
    assert one_off_costs({}) == {"total": 0}  # a plain run paid nothing once
    legacy = one_off_costs({"quant": {"flow": "legacy", "quantize_s": 1.5, "qat": {"time_s": 1.0}}})
    assert legacy["quantize"] == 1.5  # only PT2E's timer runs around the fine-tune


def test_end_to_end_adds_evaluations_and_the_one_offs_outside_the_loop_but_not_compile_twice():
    # 10 s loop (compile inside) + 0.75 s evaluations + 11.75 - 2.0 s outside the loop
    assert end_to_end_s(10.0, DETAILS) == pytest.approx(10.0 + 0.75 + 9.75)


@pytest.mark.parametrize(("target", "hib", "reached", "s", "step"), [
    (0.70, True, True, 2.0 + 0.5 + 4.0, 20),  # first evaluation at or past the target, + probe and spawn
    (0.80, True, False, None, None),  # never reached
    (0.65, False, True, 1.0 + 4.5, 10),  # lower is better: the first point at or under it
])
def test_time_to_target_is_the_first_evaluation_reaching_it(target, hib, reached, s, step):
    got = time_to_target(target=target, higher_is_better=hib, curve=CURVE, final_metric=0.75, train_time_s=3.0,
                         details=DETAILS, config={})
    assert (got["reached"], got["step"]) == (reached, step)
    assert got["s"] == (pytest.approx(s) if s is not None else None)


def test_a_model_made_after_training_reaches_the_target_only_at_its_end_to_end_time():
    cfg = {"prune": {"method": "l1_unstructured"}}
    kw = dict(higher_is_better=True, curve=CURVE, train_time_s=10.0, details=DETAILS, config=cfg)
    assert time_to_target(target=0.70, final_metric=0.71, **kw)["s"] == pytest.approx(end_to_end_s(10.0, DETAILS))
    assert not time_to_target(target=0.70, final_metric=0.69, **kw)["reached"]  # the curve was the dense model's


def test_finalize_writes_the_record_and_lab_run_shows_it():
    r = RunResult(run_id="a" * 32, config={"target_metric": 0.9}, env={}, metric_name="auc", metric=0.75,
                  train_time_s=3.0, details={"eval_curve": CURVE, "eval_s": 0.3, "compute": {"compile_s": 0.4}})
    finalize(r)
    assert r.details["one_off_s"] == {"compile": 0.4, "total": 0.4}
    assert r.details["time_to_target"]["reached"] is False
    text = format_result(r)
    assert "one-off costs: compile 0.4 s (in train)" in text and "never reached" in text
    assert "evaluations 0.3 s (3)" in text
