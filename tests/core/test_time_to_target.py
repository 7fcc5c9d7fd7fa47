"""Issue 29 in a real run: evaluation every N steps apart from training, the curve, the time to target, and
nothing changed when it is off."""

from __future__ import annotations

import pytest

from lab import RunConfig, run

BASE = RunConfig(workload="ctr", size="tiny", threads=1, latency_repeats=0, max_steps=20)


@pytest.fixture(scope="module")
def plain_and_evaluated():
    return run(BASE), run(BASE.with_overrides(eval_every=6, target_metric=0.0))


def test_evaluating_during_training_changes_no_loss_and_no_metric(plain_and_evaluated):
    plain, evaluated = plain_and_evaluated
    assert evaluated.losses == plain.losses and evaluated.metrics == plain.metrics
    assert "eval_curve" not in plain.details and "time_to_target" not in plain.details
    assert plain.details["one_off_s"] == {"total": 0}
    assert "eval_every" not in plain.config and "target_metric" not in plain.config  # stored hashes unchanged


def test_the_curve_is_every_n_steps_and_ends_where_training_did(plain_and_evaluated):
    _, r = plain_and_evaluated
    curve = r.details["eval_curve"]
    assert [p["step"] for p in curve] == [6, 12, 18, 20]
    assert curve[-1]["metric"] == pytest.approx(r.metric)  # the last point is the delivered model
    trains = [p["train_s"] for p in curve]
    assert trains == sorted(trains) and trains[-1] <= r.train_time_s + 1e-9
    assert r.details["eval_s"] == pytest.approx(sum(p["eval_s"] for p in curve))
    ttt = r.details["time_to_target"]
    assert ttt["reached"] and ttt["step"] == 6 and ttt["s"] == pytest.approx(curve[0]["train_s"])


def test_a_target_alone_evaluates_once_per_epoch_and_an_unreachable_one_is_never_reached():
    r = run(BASE.with_overrides(max_steps=None, epochs=2, target_metric=0.999))
    spe = r.details["resolved"]["steps_per_epoch"]
    assert [p["step"] for p in r.details["eval_curve"]] == [spe, 2 * spe]
    assert r.details["time_to_target"]["reached"] is False and r.details["time_to_target"]["s"] is None


@pytest.mark.parametrize(("field", "value"), [("eval_every", 0), ("eval_every", 1.5), ("target_metric", -1.0),
                                              ("target_metric", float("nan"))])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}="):
        RunConfig(**{field: value})
