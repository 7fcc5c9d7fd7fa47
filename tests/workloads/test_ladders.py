"""Model-size ladders (issue 15): every built-in grows over >= 100x parameters to >= 5 M on the same data,
the default (no ``model_scale``) model is exactly today's, every rung trains a step and infers, and the
Transformer workload's task is learnable."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import lab  # noqa: F401 - registers the technique families
from lab import RunConfig
from lab.context import prepare, resolve
from lab.measure import count_params
from lab.workloads import SCALE_NAMES, SizeSpec, Workload, base, get_workload, register_workload

LADDERS = ["ctr", "sequence", "vision", "transformer", "mlp"]


def _few_rows(wl: Workload, rows: int = 4) -> tuple[torch.Tensor, ...]:
    spec = dataclasses.replace(wl.size("tiny"), n_train=64, n_test=16)
    return tuple(t[:rows] for t in wl.make_data(spec, 0).train)


@pytest.mark.parametrize("name", LADDERS)
def test_ladder_grows_monotonically_over_100x_to_5m(name: str) -> None:
    wl = get_workload(name)
    assert wl.rungs() == list(SCALE_NAMES)
    params = [count_params(wl.make_model(wl.spec_at("small", r))) for r in wl.rungs()]
    assert all(a < b for a, b in zip(params, params[1:], strict=False)), params
    assert params[-1] / params[0] >= 100, params
    assert params[-1] >= 5_000_000, params


@pytest.mark.parametrize("name", LADDERS)
def test_a_rung_changes_the_model_only(name: str) -> None:
    wl = get_workload(name)
    spec, rung = wl.size("small"), wl.spec_at("small", "xl")
    assert dataclasses.replace(rung, model=spec.model) == spec  # data, batch, epochs, lr untouched
    assert rung.model != spec.model


@pytest.mark.parametrize("name", LADDERS)
def test_default_scale_is_the_unchanged_model(name: str) -> None:
    wl = get_workload(name)
    assert resolve(RunConfig(workload=name, size="small")).spec is wl.size("small")
    torch.manual_seed(0)
    before = wl.make_model(wl.size("small"))
    with prepare(RunConfig(workload=name, size="tiny", threads=1)) as ctx:
        assert ctx.resolved.spec is wl.size("tiny")
    torch.manual_seed(0)
    again = wl.make_model(resolve(RunConfig(workload=name, size="small")).spec)
    assert repr(before) == repr(again)
    for (k, a), (k2, b) in zip(before.state_dict().items(), again.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b)


@pytest.mark.parametrize("name", LADDERS)
def test_every_rung_trains_one_step_and_infers(name: str) -> None:
    wl = get_workload(name)
    *inputs, target = _few_rows(wl, rows=2 if name == "vision" else 4)
    for rung in wl.rungs():
        torch.manual_seed(0)
        model = wl.make_model(wl.spec_at("small", rung))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss = wl.loss(model(*inputs), target)
        loss.backward()
        opt.step()
        assert torch.isfinite(loss)
        model.eval()
        with torch.no_grad():
            out = model(*inputs)
        assert out.shape[0] == target.shape[0] and torch.isfinite(out).all(), rung


def test_transformer_task_is_learnable() -> None:
    cfg = RunConfig(workload="transformer", size="tiny", threads=1)
    with prepare(cfg) as ctx:
        model = ctx.new_model()
        stats = ctx.fit(model, epochs=ctx.resolved.epochs, lr=ctx.resolved.lr)
        acc = ctx.evaluate(model)["accuracy"]
    first, last = sum(stats.losses[:10]) / 10, sum(stats.losses[-10:]) / 10
    assert last < 0.6 * first, (first, last)
    assert acc > 0.25 + 0.2, acc  # chance is 0.25


def test_transformer_streams_are_deterministic_and_balanced() -> None:
    from lab.workloads.transformer import TOKEN_A, TOKEN_B, make_token_streams

    x, y = make_token_streams(400, seed=3)
    x2, y2 = make_token_streams(400, seed=3)
    assert (x == x2).all() and (y == y2).all()
    assert sorted(set(y.tolist())) == [0, 1, 2, 3] and (y == 0).sum() == 100
    events = (x == TOKEN_A) | (x == TOKEN_B)
    assert (events.sum(1) == 2).all()  # exactly two events per stream, the rest noise and one distractor


def test_model_scale_on_a_workload_without_a_ladder_is_one_clear_error() -> None:
    spec = SizeSpec(n_train=8, n_test=4, batch_size=4, epochs=1, lr=1e-3)
    wl = Workload(name="no-ladder-i15", description="toy", sizes=spec,
                  make_data=lambda s, seed: None, make_model=lambda s: torch.nn.Linear(3, 2),
                  loss=torch.nn.functional.cross_entropy, evaluate=lambda o, t: {"accuracy": 0.0},
                  metric_name="accuracy")
    register_workload(wl)
    try:
        with pytest.raises(ValueError, match=r"model_scale='s' is invalid: workload 'no-ladder-i15' has no "
                                             r"model-size ladder") as err:
            RunConfig(workload="no-ladder-i15", model_scale="s")
        assert "\n" not in str(err.value)
        RunConfig(workload="no-ladder-i15")  # without a rung it is fine
    finally:
        base._REGISTRY.pop("no-ladder-i15", None)


def test_unknown_rung_in_a_ladder_is_refused_at_definition() -> None:
    spec = SizeSpec(n_train=8, n_test=4, batch_size=4, epochs=1, lr=1e-3)
    with pytest.raises(ValueError, match="unknown model-scale rung"):
        Workload(name="bad-rung", description="toy", sizes=spec, make_data=lambda s, seed: None,
                 make_model=lambda s: torch.nn.Linear(3, 2), loss=torch.nn.functional.cross_entropy,
                 evaluate=lambda o, t: {}, metric_name="accuracy", scales={"xxl": base.Rung({})})
