"""Pruning: exact sparsity, identity at 0 %, physical removal agrees with the masked reference, pruned
models train / save / load, the cubic schedule, and clear errors. No timing assertions (benchmarks/pruning.py)."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn
from torch.nn.utils import prune as tprune

from lab import RunConfig, run
from lab.config import PruneConfig
from lab.pruning import (
    GradualPruner,
    cubic_sparsity,
    layer_report,
    layer_sparsity,
    make_permanent,
    prunable_weights,
    prune,
    sensitivity_scan,
    set_sparsity,
    sparse_size_bytes,
)
from lab.pruning.channels import channel_prunable_layers, prune_channels
from lab.pruning.report import WHY_MASKS, speed_why
from lab.workloads import get_workload

FAST = {"size": "tiny", "threads": 1, "latency_repeats": 2}


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 3))


def tiny(workload: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    wl = get_workload(workload)
    torch.manual_seed(0)
    model = wl.make_model(wl.sizes["tiny"])
    data = wl.make_data(wl.sizes["tiny"], 0)
    return model, tuple(t[:16] for t in data.test[:-1])


def test_l1_mask_matches_a_hand_written_magnitude_mask():
    w = torch.randn(6, 10, generator=torch.Generator().manual_seed(1))
    k = int(round(0.6 * w.numel()))
    hand = torch.ones_like(w).flatten()
    hand[w.abs().flatten().argsort()[:k]] = 0
    layer = nn.Linear(10, 6)
    layer.weight.data.copy_(w)
    prune(layer, PruneConfig(method="l1_unstructured", amount=0.6, layers=()))
    assert torch.equal(layer.weight_mask.flatten(), hand)


@pytest.mark.parametrize("amount", [0.3, 0.5, 0.9])
def test_per_layer_sparsity_is_exact(amount):
    model = prune(mlp(), PruneConfig(method="l1_unstructured", amount=amount))
    for name, s in layer_sparsity(model).items():
        n = model.get_submodule(name.rsplit(".", 1)[0]).weight.numel()
        assert s == pytest.approx(round(amount * n) / n), name


def test_global_sparsity_is_exact_and_uneven_across_layers():
    model = mlp()
    model[2].weight.data *= 10  # a layer with larger weights keeps more of them under a global threshold
    prune(model, PruneConfig(method="global_unstructured", amount=0.4))
    rep = layer_report(model, (torch.randn(4, 8),))
    total = sum(r["params"] for r in rep.values())
    assert sum(r["params"] - r["nonzero"] for r in rep.values()) == round(0.4 * total)
    assert rep["2.weight"]["sparsity"] < 0.2 < 0.5 < rep["0.weight"]["sparsity"]


def test_zero_pruning_is_the_identity():
    x = torch.randn(5, 8)
    model = mlp()
    ref = model(x)
    set_sparsity(model, PruneConfig(method="l1_unstructured", amount=0.5), 0.0)
    prune_channels(model, 0.0, example_inputs=(x,))
    assert torch.equal(model(x), ref)
    assert prune(model, PruneConfig()) is model


def test_structured_removal_equals_the_masked_model_where_channels_were_zero():
    """Reference agreement: zero 4 hidden neurons by hand (the masked model); physical removal must drop
    exactly those (their group norm is 0) and give the same outputs with a narrower layer."""
    model, x = mlp(), torch.randn(7, 8)
    drop = torch.tensor([1, 5, 9, 13])
    with torch.no_grad():
        model[0].weight[drop] = 0
        model[0].bias[drop] = 0
        model[2].weight[:, drop] = 0
    ref = model(x)
    channels = prune_channels(model, 0.25, example_inputs=(x,), layers=("0",))
    assert channels == {"0": [16, 12]} and model[2].in_features == 12
    torch.testing.assert_close(model(x), ref)


def test_structured_resnet_block_agrees_with_masked_reference():
    model, x = tiny("vision")
    model.eval()
    block = model.stages[0][0]
    c = block.conv1.out_channels
    drop = torch.arange(0, c, 4)  # 25 % of the block's inner channels
    with torch.no_grad():
        block.conv1.weight[drop] = 0
        block.bn1.weight[drop] = 0
        block.bn1.bias[drop] = 0
        block.conv2.weight[:, drop] = 0
    ref = model(*x)
    prune_channels(model, 0.25, example_inputs=x, layers=("stages.0.0.conv1",))
    assert block.conv1.out_channels == c - len(drop) and block.bn1.num_features == c - len(drop)
    torch.testing.assert_close(model(*x), ref, atol=1e-5, rtol=1e-5)


def test_structured_whole_resnet_and_dlrm_mlps_shrink_and_still_run():
    for workload in ("vision", "ctr"):
        model, x = tiny(workload)
        out_shape = model(*x).shape
        scopes = get_workload(workload).prune_scopes  # the DLRM says how it splits; pruning knows no class
        prune(model, PruneConfig(method="structured_channels", amount=0.5), example_inputs=x, scopes=scopes)
        assert model(*x).shape == out_shape
    ctr_scopes = get_workload("ctr").prune_scopes
    assert set(channel_prunable_layers(tiny("ctr")[0], scopes=ctr_scopes)) == {"bottom.0", "top.0"}  # not [-1]


def test_masks_keep_zeros_at_zero_through_adam_unlike_the_seed_grad_trick():
    model, x, y = mlp(), torch.randn(64, 8), torch.randint(0, 3, (64,))
    prune(model, PruneConfig(method="l1_unstructured", amount=0.8))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(5):
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    assert all(s == pytest.approx(0.8, abs=0.02) for s in layer_sparsity(model).values())
    # The seed's way: zero weights and grads by hand once; Adam's momentum revives them on the next steps.
    hand = mlp()
    opt = torch.optim.Adam(hand.parameters(), lr=0.05)
    for step in range(5):
        nn.functional.cross_entropy(hand(x), y).backward()
        if step == 2:
            for p in hand.parameters():
                m = (p.abs() > p.abs().flatten().kthvalue(int(0.8 * p.numel())).values).float()
                p.data *= m
                p.grad *= m
        opt.step()
        opt.zero_grad()
    assert min((p == 0).float().mean().item() for p in hand.parameters() if p.dim() == 2) < 0.5


def test_pruned_models_train_save_and_load_weights_only():
    for cfg in (PruneConfig(method="l1_unstructured", amount=0.6),
                PruneConfig(method="structured_channels", amount=0.5)):
        model, x = mlp(), torch.randn(32, 8)
        prune(model, cfg, example_inputs=(x,))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        make_permanent(model)
        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        buf.seek(0)
        state = torch.load(buf, weights_only=True)
        assert not any(k.endswith(("_orig", "_mask")) for k in state)
        clone = copy.deepcopy(model)
        for p in clone.parameters():
            p.data.zero_()
        clone.load_state_dict(state)
        torch.testing.assert_close(clone(x), model(x))


def test_lstm_masks_become_permanent_and_agree():
    model, x = tiny("sequence")
    prune(model, PruneConfig(method="l1_unstructured", amount=0.5))
    masked = model(*x)
    make_permanent(model)
    torch.testing.assert_close(model(*x), masked)
    assert layer_sparsity(model)["lstm.weight_hh_l0"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no structurally prunable layer"):
        channel_prunable_layers(model)


def test_cubic_schedule_values():
    assert cubic_sparsity(0, 0.8, 0, 100) == 0.0
    assert cubic_sparsity(50, 0.8, 0, 100) == pytest.approx(0.8 * (1 - 0.5 ** 3))
    assert cubic_sparsity(100, 0.8, 0, 100) == pytest.approx(0.8)
    assert cubic_sparsity(500, 0.8, 0, 100) == pytest.approx(0.8)
    assert cubic_sparsity(10, 0.8, 20, 100) == 0.0
    model = mlp()
    pcfg = PruneConfig(method="l1_unstructured", amount=0.8, schedule="gradual", end_fraction=0.5,
                       frequency_steps=5)
    hook = GradualPruner(pcfg, 100, prunable_weights(model))
    for step in range(100):
        hook(step, model)
    steps = [s for s, _ in hook.history]
    assert steps[:3] == [0, 5, 10] and steps[-1] == 49
    values = [v for _, v in hook.history]
    assert values == sorted(values) and values[-1] == pytest.approx(0.8)


def test_run_oneshot_with_finetune_records_the_figures(toy_workload):
    res = run(RunConfig(workload="toy", prune=PruneConfig(method="l1_unstructured", amount=0.5,
                                                          finetune_epochs=1), **FAST))
    d = res.details["pruning"]
    assert d["finetune"]["steps"] == 16 and d["finetune"]["time_s"] > 0
    assert d["sparsity_prunable"] == pytest.approx(0.5, abs=0.01)
    assert d["macs_ratio"] == pytest.approx(2.0, rel=0.05) and d["params"] == d["params_dense"]
    assert res.nonzero_params < 0.6 * res.param_count and "inference" in d
    assert {"metric_dense", "metric_pruned", "metric_finetuned"} <= set(d)


def test_run_gradual_lands_on_target_and_structured_shrinks(toy_workload):
    res = run(RunConfig(workload="toy", prune=PruneConfig(method="global_unstructured", amount=0.8,
                                                          schedule="gradual", frequency_steps=4), **FAST))
    d = res.details["pruning"]
    assert d["sparsity_prunable"] == pytest.approx(0.8, abs=0.01) and len(d["schedule_history"]) > 2
    res = run(RunConfig(workload="toy", prune=PruneConfig(method="structured_channels", amount=0.5), **FAST))
    d = res.details["pruning"]
    assert d["params"] < d["params_dense"] and d["macs_ratio"] > 1.5 and d["layers"]["0.weight"]["shape"][0] == 8


def test_gradual_schedule_with_gradient_accumulation_ramps_over_the_optimizer_steps(toy_workload):
    """Issue 26: the schedule was sized in micro-batches (epochs x batches), so with ``grad_accum_steps=2`` its
    ramp ended after the run and ``after_training`` jumped to the target. Sized in optimizer steps, the last
    scheduled update lands inside the run, at the target."""
    from lab.config import DDPConfig

    pcfg = PruneConfig(method="global_unstructured", amount=0.8, schedule="gradual", end_fraction=1.0,
                       frequency_steps=1)
    res = run(RunConfig(workload="toy", prune=pcfg, ddp=DDPConfig(grad_accum_steps=2), **FAST))
    history = res.details["pruning"]["schedule_history"]
    steps = [s for s, _ in history]
    assert res.steps > 2 and max(steps) == res.steps - 1  # the ramp's end is the run's last optimizer step
    assert history[-1][1] == pytest.approx(0.8, abs=0.01) and history[-2][1] < 0.8


def test_plots_build_from_pruned_results(toy_workload):
    from lab.plots import pruning as pp

    res = run(RunConfig(workload="toy", prune=PruneConfig(method="global_unstructured", amount=0.6,
                                                          schedule="gradual"), **FAST))
    assert len(pp.layer_sparsity_bars(res).data[0].x) == 2
    assert len(pp.macs_vs_measured([res], ["g"]).data) == 2
    assert len(pp.schedule_curve(res.details["pruning"]["schedule_history"], res.steps, 0.6).data) == 2
    rows = [{"series": "a", "sparsity": 0.5, "metric": 0.9}, {"series": "b", "sparsity": 0.5, "metric": 0.8}]
    assert len(pp.metric_vs_sparsity(rows, baseline=0.95).data) == 2
    assert len(pp.sensitivity_lines([{"layer": "0.weight", "amount": 0.5, "metric": 0.9}]).data) == 1


def test_sparse_format_pays_only_at_high_sparsity():
    sizes = {}
    for amount in (0.3, 0.9):
        model = nn.Linear(256, 256)
        dense = sparse_size_bytes(model)
        make_permanent(prune(model, PruneConfig(method="l1_unstructured", amount=amount)))
        sizes[amount] = sparse_size_bytes(model)
    assert sizes[0.3] == dense and sizes[0.9] < 0.25 * dense


def test_sensitivity_scan_zero_amount_is_the_baseline():
    model, x = mlp(), torch.randn(16, 8)
    ref = model(x)

    def score(m: nn.Module) -> float:
        with torch.no_grad():
            return -float((m(x) - ref).abs().mean())

    rows = sensitivity_scan(model, score, (0.0, 0.9))
    assert len(rows) == 6 and all(r["metric"] == 0.0 for r in rows if r["amount"] == 0.0)
    assert all(r["metric"] < 0 for r in rows if r["amount"] == 0.9)
    assert not any(isinstance(h, tprune.BasePruningMethod) for m in model.modules()
                   for h in m._forward_pre_hooks.values())  # the scan worked on copies


def test_why_tag_when_masks_do_not_speed_up():
    assert speed_why("l1_unstructured", 2.0, 1.0).startswith(WHY_MASKS)
    assert speed_why("structured_channels", 2.0, 1.6) is None
    assert speed_why("l1_unstructured", 1.0, 0.9) is None


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"method": "l1_unstructured", "amount": -0.1}, "prune.amount=-0.1"),
    ({"method": "structured_channels", "amount": 1.0}, "prune.amount=1.0"),
    ({"method": "l1_unstructured", "amount": 0.5, "norm": 3}, "prune.norm=3"),
    ({"method": "structured_channels", "amount": 0.5, "schedule": "gradual"}, "prune.schedule='gradual'"),
    ({"method": "l1_unstructured", "amount": 0.5, "start_fraction": 0.8, "end_fraction": 0.5}, "end_fraction"),
    ({"method": "l1_unstructured", "amount": 0.5, "layers": "fc"}, "prune.layers"),
])
def test_bad_config_values(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        PruneConfig(**kwargs)


def test_unknown_and_unsupported_layers_are_clear_errors():
    model, x = tiny("vision")
    with pytest.raises(ValueError, match="'nope' matches no module"):
        prunable_weights(model, ("nope",))
    with pytest.raises(ValueError, match="BatchNorm2d.*not prunable"):
        prunable_weights(model, ("stem.1",))
    with pytest.raises(ValueError, match="not structurally prunable"):
        channel_prunable_layers(model, ("fc",))
    with pytest.raises(ValueError, match="example_inputs"):
        prune(model, PruneConfig(method="structured_channels", amount=0.5))
    with pytest.raises(ValueError, match="not structurally prunable"):
        channel_prunable_layers(tiny("ctr")[0], ("embedding",), scopes=get_workload("ctr").prune_scopes)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pruning_on_cuda_matches_cpu():
    model, x = tiny("vision")
    model.eval()
    gpu = copy.deepcopy(model).cuda()
    cfg = PruneConfig(method="structured_channels", amount=0.3)
    prune(model, cfg, example_inputs=x)
    prune(gpu, cfg, example_inputs=tuple(t.cuda() for t in x))
    torch.testing.assert_close(gpu(*(t.cuda() for t in x)).cpu(), model(*x), atol=1e-4, rtol=1e-4)
    masked = prune(copy.deepcopy(model).cuda(), PruneConfig(method="l1_unstructured", amount=0.5))
    assert all(abs(s - 0.5) < 0.01 for s in layer_sparsity(masked).values())


def test_prune_config_round_trips_with_layers():
    cfg = RunConfig(prune=PruneConfig(method="l1_unstructured", amount=0.5, layers=("fc", "Conv2d"), norm=2,
                                      schedule="gradual", start_fraction=0.1, end_fraction=0.6, frequency_steps=3))
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


def test_batchnorm_recalibration_matches_the_pruned_activations():
    """Issue 27: Torch-Pruning keeps each kept channel's running statistics, measured on the dense model whose
    convolutions read the channels now removed. After recalibration on one batch, eval-mode BatchNorm must
    normalise exactly as train mode does on that batch (stale statistics do not)."""
    from lab.pruning.channels import recalibrate_batchnorm

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))
    x = torch.randn(32, 3, 10, 10)
    model.train()
    with torch.no_grad():
        for _ in range(20):
            model(x)  # running statistics of the dense model
    prune_channels(model.eval(), 0.5, example_inputs=(x,))
    assert model[1].num_features == 4
    trunk = model[:5]

    def gap() -> float:
        with torch.no_grad():
            eval_out = trunk.eval()(x)
            batch_out = trunk.train()(x)
        model.eval()
        return float((eval_out - batch_out).abs().max())

    saved = [copy.deepcopy(m.state_dict()) for m in (model[1], model[4])]
    stale = gap()
    for m, s in zip((model[1], model[4]), saved, strict=True):
        m.load_state_dict(s)  # gap() ran train mode: put the stale statistics back
    assert recalibrate_batchnorm(model, (x, torch.zeros(32)), 32, torch.device("cpu")) == 2
    assert model[1].momentum == 0.1 and not model.training
    with torch.no_grad():
        eval_out, batch_out = trunk.eval()(x), trunk.train()(x)
    assert stale > 0.1
    torch.testing.assert_close(eval_out, batch_out, rtol=5e-3, atol=1e-3)  # running_var is unbiased, batch var not


def test_accuracy_why_names_a_fine_tune_outside_the_budget():
    from lab.pruning.report import accuracy_why

    ft = {"steps": 16, "lr": 2e-4}
    info = {"finetune": ft, "metric_dense": 0.996, "metric_finetuned": 0.742}
    why = accuracy_why(info, higher_is_better=True)
    assert why and "25.4 pt below dense" in why and "16 steps at lr 0.0002" in why and "lr-factor" in why
    assert info["accuracy_loss_pt"] == pytest.approx(25.4) and info["accuracy_budget_pt"] == 1.0
    assert accuracy_why({"finetune": ft, "metric_dense": 0.996, "metric_finetuned": 0.99}, True) is None
    assert accuracy_why({"metric_dense": 0.996, "metric_finetuned": 0.5}, True) is None  # nothing fine-tuned
