"""The ``compute`` family: fast kernels, fused optimizer and torch.compile change how, not what, is computed."""

from __future__ import annotations

import copy

import pytest
import torch

from lab import RunConfig, run
from lab.loop import make_optimizer
from lab.recipes import SPEED_EXTRAS, SPEED_STACK, speed_stack
from lab.train import check
from lab.workloads import get_workload
from lab.workloads.ctr import DLRM, use_gather_kernels


def _ctr_model_and_batch(n=64):
    wl = get_workload("ctr")
    spec = wl.sizes["tiny"]
    torch.manual_seed(0)
    model = wl.make_model(spec)
    with torch.no_grad():  # non-zero wide weights, so the wide path is exercised too
        model.wide.weight.normal_(std=0.1)
    data = wl.make_data(spec, 0)
    dense, cat, label = (t[:n] for t in data.train)
    return wl, model, dense, cat, label


def test_gather_kernels_match_embeddingbag_forward_and_gradients():
    wl, ref, dense, cat, label = _ctr_model_and_batch()
    fast = use_gather_kernels(copy.deepcopy(ref))
    assert fast.gather_kernels and not ref.gather_kernels
    out_ref, out_fast = ref(dense, cat), fast(dense, cat)
    torch.testing.assert_close(out_fast, out_ref, rtol=1e-5, atol=1e-6)
    wl.loss(out_ref, label).backward()
    wl.loss(out_fast, label).backward()
    for (name, p_ref), (_, p_fast) in zip(ref.named_parameters(), fast.named_parameters(), strict=True):
        torch.testing.assert_close(p_fast.grad, p_ref.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_gather_kernels_step_aside_for_a_quantized_embedding():
    from torch.ao.quantization import default_dynamic_qconfig, float_qparams_weight_only_qconfig, quantize_dynamic

    _, model, dense, cat, _ = _ctr_model_and_batch()
    use_gather_kernels(model)
    linear_only = quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear: default_dynamic_qconfig})
    assert linear_only._fast_path()  # the float lookups are still there
    q = quantize_dynamic(copy.deepcopy(model), {torch.nn.EmbeddingBag: float_qparams_weight_only_qconfig,
                                                torch.nn.Linear: default_dynamic_qconfig})
    assert not q._fast_path()  # int8 tables have no .weight to gather from: call the module instead
    torch.testing.assert_close(q(dense, cat), model(dense, cat), rtol=0.0, atol=0.1)


def test_fast_kernels_need_the_ctr_model():
    with pytest.raises(TypeError, match="ctr DLRM"):
        use_gather_kernels(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="no faster implementation.*ctr"):
        check(RunConfig(workload="sequence").with_overrides(**{"compute.fast_kernels": True}))


def test_compile_with_ddp_is_refused_before_any_work():
    cfg = RunConfig(workload="ctr").with_overrides(**{"compute.compile": True, "ddp.world_size": 2})
    with pytest.raises(ValueError, match="compute.compile=True is invalid with ddp"):
        check(cfg)


def test_fused_adam_takes_the_same_steps_as_the_default():
    torch.manual_seed(0)
    a = torch.nn.Linear(8, 4)
    b = copy.deepcopy(a)
    opt_a, opt_b = make_optimizer("adam", a.parameters(), 1e-2), make_optimizer("adam", b.parameters(), 1e-2,
                                                                                fused=True)
    assert opt_b.defaults.get("fused") is True and not opt_a.defaults.get("fused")
    x = torch.randn(16, 8)
    for _ in range(5):
        for m, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pb, pa, rtol=1e-5, atol=1e-6)


def test_compute_options_train_to_the_reference_result():
    """One tiny ctr run per option: same loss curve as plain fp32 up to float rounding, and the record says
    which options ran. (compile is covered by the speed_stack benchmark; it takes ~20 s to compile here.)"""
    base = RunConfig(workload="ctr", size="tiny", max_steps=12, latency_repeats=0, threads=1)
    ref = run(base)
    for override in ({"compute.fast_kernels": True}, {"compute.fused_optimizer": True}):
        res = run(base.with_overrides(**override))
        assert res.config["compute"][next(iter(override)).split(".")[1]] is True
        assert res.losses == pytest.approx(ref.losses, rel=1e-3, abs=1e-4)
        assert res.metric == pytest.approx(ref.metric, abs=2e-3)


@pytest.mark.slow
def test_compile_trains_like_eager():
    base = RunConfig(workload="ctr", size="tiny", max_steps=6, latency_repeats=0, threads=1)
    ref = run(base)
    res = run(base.with_overrides(**{"compute.compile": True}))
    assert res.losses == pytest.approx(ref.losses, rel=1e-3, abs=1e-4)
    assert isinstance(get_workload("ctr").make_model(get_workload("ctr").sizes["tiny"]), DLRM)


def test_speed_stack_recipe_arms():
    ab = speed_stack(RunConfig(workload="ctr", size="tiny"))
    base = ab.arms["baseline"]
    assert base.data.loader == "naive" and base.data.storage == "network_fs" and not base.compute.enabled
    stack = "+".join(SPEED_STACK)
    assert list(ab.arms) == ["baseline", *["+".join(SPEED_STACK[:k]) for k in range(1, len(SPEED_STACK) + 1)],
                             *[f"{stack}+{e}" for e in SPEED_EXTRAS], "aa"]  # aa: the A/A arm, the noise floor
    full = ab.arms[stack]
    assert full.data.loader == "thread" and full.data.storage == "network_fs"  # same storage, better loader
    assert full.compute.fused_optimizer and full.compute.fast_kernels and not full.compute.compile
    assert ab.arms[f"{stack}+compile"].compute.compile
    assert ab.arms[f"{stack}+compile"].profile and not full.profile  # only the compile arm says why, profiled
    seq = speed_stack(RunConfig(workload="sequence", size="tiny"))
    assert all("fast_kernels" not in arm for arm in seq.arms)  # left out where the workload has none
    with pytest.raises(ValueError, match="storage='none' is invalid"):
        speed_stack(RunConfig(workload="ctr"), storage="none")


@pytest.mark.parametrize("p, tagged", [(0.1, True), (0.0, False)])
def test_a_compiled_run_with_active_dropout_says_its_accuracy_delta_needs_seeds(p, tagged):
    """Inductor draws its own dropout masks: a compiled run of a model with active dropout trains on another
    random stream than eager at the same seed (HF BERT, issue 27), and its record says so; with p = 0 it is
    silent (compiled and eager then agree step for step: test_compile_trains_like_eager)."""
    import types

    from lab.compute import RNG_STREAM_WHY, TECHNIQUE, dropout_modules
    from lab.technique import FitPlan

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(p), torch.nn.Linear(8, 2))
    assert dropout_modules(model) == (1 if p else 0)
    result = types.SimpleNamespace(why=[], details={})
    cfg = RunConfig(workload="ctr").with_overrides(**{"compute.compile": True})
    ctx = types.SimpleNamespace(cfg=cfg, result=result, device=torch.device("cpu"))
    plan = FitPlan(phase="train", lr=1e-3, probe=False, loader=None)
    TECHNIQUE.fit_options(ctx, model, plan)
    assert plan.forward is not None and plan.finished  # compiled lazily: nothing has been traced yet
    plan.finished[0](types.SimpleNamespace(step_times_ms={"total": [30.0, 1.0, 1.0]}))
    assert "compute" in result.details
    assert (RNG_STREAM_WHY.format(n=1) in result.why) is tagged
