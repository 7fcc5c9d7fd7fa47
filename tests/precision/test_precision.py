"""Mixed precision: agreement with the fp32 path, fp32 islands, GradScaler skips, the capability gate, auto's
decision (with injected measurements, so both outcomes are tested on any machine) and the seed-004 bug."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch
from torch import nn

from lab import precision
from lab.config import PrecisionConfig, RunConfig
from lab.data import make_loader
from lab.loop import fit
from lab.measure import NATIVE as NATIVE_FLAGS
from lab.precision import (
    BackwardInAutocastWarning,
    Capability,
    PrecisionPolicy,
    accuracy_verdict,
    capability,
    decide_auto,
    watch_backward_in_autocast,
)
from lab.train import run

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _toy_run(dtype: str, steps: int = 16, **prec) -> object:
    cfg = RunConfig(workload="toy", size="tiny", max_steps=steps, warmup_steps=min(3, steps - 1), threads=1,
                    latency_repeats=0, precision=PrecisionConfig(dtype=dtype, **prec))
    return run(cfg)


# ----------------------------------------------------------------------------- agreement with fp32

@pytest.mark.parametrize("dtype,rel_tol", [("bf16", 0.03), ("fp16", 0.005)])
def test_low_precision_loss_curve_tracks_fp32(toy_workload, dtype, rel_tol):
    # bf16 keeps 8 mantissa bits (~0.4 % per op), fp16 keeps 11: stated tolerances over 16 steps.
    base = _toy_run("fp32")
    low = _toy_run(dtype)
    assert len(low.losses) == len(base.losses) == 16
    for a, b in zip(base.losses, low.losses, strict=True):
        assert abs(a - b) <= rel_tol * abs(a), (dtype, a, b)
    assert low.losses != base.losses  # autocast really ran: bit-identical curves would mean a no-op
    assert low.details["precision"]["resolved"] == dtype


def test_fp32_policy_is_bit_identical_to_the_plain_loop(toy_workload):
    def once(policy):
        torch.manual_seed(0)
        model = toy_workload.make_model(toy_workload.sizes["tiny"])
        data = toy_workload.make_data(toy_workload.sizes["tiny"], 0)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        loader = make_loader(data.train, RunConfig().data, 32, seed=0)
        return fit(model, opt, loader, toy_workload, torch.device("cpu"), epochs=1, policy=policy).losses

    assert once(None) == once(PrecisionPolicy("fp32"))


# ----------------------------------------------------------------------------- fp32 islands

def test_fp32_modules_really_run_in_fp32(toy_workload):
    # The toy model is Sequential(Linear "0", ReLU "1", Linear "2"); keep the classifier "2" in fp32.
    model = toy_workload.make_model(toy_workload.sizes["tiny"])
    seen: dict[str, torch.dtype] = {}
    def spy(name):
        def hook(module, inputs, output):
            seen[name] = output.dtype
        return hook

    for name in ("0", "2"):
        model.get_submodule(name).register_forward_hook(spy(name))
    policy = PrecisionPolicy("bf16", fp32_modules=("2",))
    with policy.applied(model):
        with policy.autocast():
            loss = model(torch.randn(4, 8)).float().sum()
        loss.backward()
    assert seen == {"0": torch.bfloat16, "2": torch.float32}
    report = {row["module"]: row for row in policy.layer_dtypes}
    assert report["2"]["output_dtype"] == "float32" and report["2"]["fp32_reason"] == "fp32_modules: 2"
    assert report["0"]["output_dtype"] == "bfloat16"
    assert "forward" not in model.get_submodule("2").__dict__  # no wrapper survives the fit


def test_fp32_modules_by_type_and_typo_is_an_error(toy_workload):
    model = toy_workload.make_model(toy_workload.sizes["tiny"])
    assert set(precision.match_fp32_modules(model, ("Linear",))) == {"0", "2"}
    with pytest.raises(ValueError, match="'classifer' matches no module"):
        precision.match_fp32_modules(model, ("classifer",))


class _NoLowPrecisionRNN(nn.GRU):
    """A GRU that fails under autocast like oneDNN's fp16 LSTM does on CPUs without such a kernel."""

    def forward(self, x, hx=None):
        if torch.is_autocast_enabled("cpu"):
            raise RuntimeError("could not create a primitive descriptor for the GRU forward propagation primitive")
        return super().forward(x, hx)


def test_rnn_without_low_precision_kernel_runs_in_fp32_and_is_reported():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = _NoLowPrecisionRNN(6, 5, batch_first=True)
            self.head = nn.Linear(5, 2)

        def forward(self, x):
            return self.head(self.rnn(x)[0][:, -1])

    model = Net()
    policy = PrecisionPolicy("bf16")
    with policy.applied(model), policy.autocast():
        out = model(torch.randn(3, 4, 6))
    assert out.dtype == torch.bfloat16  # the head still ran in bf16
    assert "primitive descriptor" in policy.forced_fp32["rnn"]
    row = next(r for r in policy.layer_dtypes if r["module"] == "rnn")
    assert row["output_dtype"] == "float32" and row["fp32_reason"].startswith("no bf16 kernel")


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_sequence_lstm_does_not_crash_under_cpu_autocast(dtype):
    # Whether this CPU has a low-precision LSTM or not, the run must finish; if the LSTM was moved to fp32,
    # the report must say so and show fp32 outputs.
    r = run(RunConfig(workload="sequence", size="tiny", max_steps=3, warmup_steps=1, threads=1, latency_repeats=0,
                      device="cpu",
                      precision=PrecisionConfig(dtype=dtype)))
    train = r.details["precision"]["phases"]["train"]
    lstm = next(row for row in train["layer_dtypes"] if row["module"] == "lstm")
    if "lstm" in train["forced_fp32"]:
        assert lstm["output_dtype"] == "float32"
    else:
        assert lstm["output_dtype"] == {"bf16": "bfloat16", "fp16": "float16"}[dtype]


# ----------------------------------------------------------------------------- scaler, NaN, seed-004 bug

def test_grad_scaler_skips_a_step_with_injected_inf_gradient():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    policy = PrecisionPolicy("fp16", init_scale=1024.0)
    inject = {"step": 2}
    model.weight.register_hook(lambda g: torch.full_like(g, math.inf) if policy._step == inject["step"] else g)
    weights = []
    with policy.applied(model):
        for _ in range(4):
            with policy.autocast():
                loss = model(torch.randn(8, 4)).float().pow(2).mean()
            policy.backward(loss)
            before = model.weight.detach().clone()
            policy.step(opt)
            opt.zero_grad(set_to_none=True)
            weights.append(torch.equal(before, model.weight))
    assert policy.skipped_steps == [2]
    assert weights == [False, False, True, False]  # the skipped step left the weights untouched
    assert policy.loss_scale_history == [1024.0, 1024.0, 1024.0, 512.0]  # backed off after the skip
    assert math.isinf(policy.grad_norms[2]) and all(math.isfinite(g) for i, g in enumerate(policy.grad_norms)
                                                    if i != 2)


def test_run_records_scaler_history_in_details(toy_workload):
    r = _toy_run("fp16", steps=5)
    train = r.details["precision"]["phases"]["train"]
    assert train["grad_scaler"] and len(train["loss_scale_history"]) == 5 and len(train["grad_norms"]) == 5
    assert train["skipped_steps"] == []


def test_nan_loss_under_autocast_raises_naming_the_step(toy_workload):
    calls = {"n": 0}

    def loss(out, y):
        calls["n"] += 1
        value = nn.functional.cross_entropy(out.float(), y)
        return value * math.nan if calls["n"] == 4 else value

    wl = dataclasses.replace(toy_workload, loss=loss)
    model = wl.make_model(wl.sizes["tiny"])
    data = wl.make_data(wl.sizes["tiny"], 0)
    loader = make_loader(data.train, RunConfig().data, 32, seed=0)
    with pytest.raises(FloatingPointError, match="at step 3"):
        fit(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, wl, torch.device("cpu"), epochs=1,
            policy=PrecisionPolicy("bf16"))


def test_backward_inside_autocast_is_detected_seed_004():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    watch = watch_backward_in_autocast(model, "cpu")
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the correct pattern must not warn
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().sum()
        loss.backward()
    # The seed's loop: forward outside autocast, then backward inside an autocast block.
    loss = model(x).sum()
    with pytest.warns(BackwardInAutocastWarning, match="inside an autocast region"), \
            torch.autocast("cpu", dtype=torch.bfloat16):
        loss.backward()
    watch.remove()


# ----------------------------------------------------------------------------- gate and auto

def test_the_gate_reads_what_the_kernels_may_use_here(cpu_caps):
    """The machine's own side: the gate agrees with the effective flags (under ``make test-avx2`` an AMX box is
    gated as AVX2, and the reason says which cap hides the instructions the hardware has)."""
    for dtype in ("bf16", "fp16"):
        cap = capability(dtype, "cpu")
        assert cap.native == getattr(cpu_caps, f"native_{dtype}")
        if not cap.native:
            assert cap.why_tag() == f"no native {dtype} on this CPU" and "emulated" in cap.reason
            assert ("hidden by" in cap.reason) == any(f in cpu_caps.hardware_flags for f in NATIVE_FLAGS[dtype])


def test_capability_reads_flags_and_tags_emulation():
    no = capability("bf16", "cpu", flags=frozenset({"avx2", "fma"}))
    assert not no.native and no.why_tag() == "no native bf16 on this CPU"
    yes = capability("bf16", "cpu", flags=frozenset({"avx2", "amx_bf16"}))
    assert yes.native and yes.why_tag() is None and "amx_bf16" in yes.reason
    assert not capability("fp16", "cpu", flags=frozenset({"avx512_bf16"})).native
    assert capability("bf16", "cuda", cuda_cc=(8, 0)).native
    assert capability("bf16", "cuda", cuda_cc=(7, 5)).why_tag() == "no native bf16 on this GPU"
    assert capability("fp16", "cuda", cuda_cc=(7, 0)).native
    with pytest.raises(ValueError, match="precision.dtype='int4'"):
        capability("int4")


def test_emulated_precision_runs_but_carries_a_why_tag(toy_workload, monkeypatch):
    monkeypatch.setattr(precision.gate, "cpu_flags", lambda: frozenset({"avx2"}))
    r = _toy_run("bf16", steps=2)
    assert r.status == "ok" and "no native bf16 on this CPU" in r.why
    assert r.details["precision"]["capability"]["native"] is False


NATIVE = {d: Capability(d, "cpu", True, "test") for d in ("bf16", "fp16")}


def test_auto_keeps_fp32_when_low_precision_is_slower():
    fp32 = [10.0, 10.2, 9.9, 10.1, 10.0, 10.1]
    choice, why = decide_auto({"fp32": fp32, "bf16": [t * 1.5 for t in fp32], "fp16": [t * 1.04 for t in fp32]},
                              NATIVE)
    assert choice == "fp32" and why.startswith("auto chose fp32")


def test_auto_picks_the_fastest_clearly_faster_precision():
    fp32 = [10.0, 10.2, 9.9, 10.1, 10.0, 10.1]
    times = {"fp32": fp32, "bf16": [t / 1.8 for t in fp32], "fp16": [t / 1.3 for t in fp32]}
    assert decide_auto(times, NATIVE)[0] == "bf16"
    emulated = {**NATIVE, "bf16": Capability("bf16", "cpu", False, "test")}
    choice, why = decide_auto(times, emulated)
    assert choice == "fp16" and "bf16 skipped (no native bf16 on this CPU)" in why
    assert decide_auto({"fp32": fp32, "bf16": [t / 1.015 for t in fp32]}, NATIVE)[0] == "fp32"  # CI bound < 1.02


@pytest.mark.parametrize("factor,expected", [(2.0, "bf16"), (0.5, "fp32")])
def test_auto_in_a_run_uses_the_measurements_and_records_why(toy_workload, monkeypatch, factor, expected):
    fp32 = [5.0, 5.1, 4.9, 5.0, 5.05, 4.95]
    monkeypatch.setattr(precision.gate, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    monkeypatch.setattr(precision.auto, "probe_plan", lambda n, arms: (precision.ProbePlan(6, 1, 20, n), "planted"))
    monkeypatch.setattr(precision.auto, "measure_arms",
                        lambda ctx, model, lr, arms, **kw: {"fp32": fp32, "bf16": [t / factor for t in fp32]})
    r = _toy_run("auto", steps=3)
    rec = r.details["precision"]
    assert rec["requested"] == "auto" and rec["resolved"] == expected and rec["auto"]["candidates"] == ["fp32", "bf16"]
    assert any(w.startswith(f"auto chose {expected}") for w in r.why)


def test_measure_arms_times_every_arm_and_leaves_the_rng_alone(toy_workload):
    from lab.context import Resolved, TrainContext, resolve
    from lab.result import RunResult

    cfg = RunConfig(workload="toy", size="tiny", threads=1)
    r: Resolved = resolve(cfg)
    ctx = TrainContext(cfg=cfg, resolved=r, data=r.workload.make_data(r.spec, 0),
                       result=RunResult(run_id="x", config={}, env={}))
    model = r.workload.make_model(r.spec)
    state = torch.get_rng_state()
    times = precision.measure_arms(ctx, model, 0.01, ["fp32", "bf16"], rounds=2, steps=3, stop_early=False)
    assert torch.equal(state, torch.get_rng_state())
    assert {k: len(v) for k, v in times.items()} == {"fp32": 2, "bf16": 2}  # one sample per round


# ----------------------------------------------------------------------------- accuracy verdict, config

def test_accuracy_verdict_within_noise_and_worse():
    v = accuracy_verdict([0.90, 0.92, 0.91], [0.905, 0.915, 0.90])
    assert v["label"] == "within noise" and v["claim_lt_1pct_holds"]
    w = accuracy_verdict([0.90, 0.901, 0.899], [0.85, 0.851, 0.849])
    assert w["label"] == "worse" and not w["claim_lt_1pct_holds"] and w["delta"] == pytest.approx(-0.05)
    lower = accuracy_verdict([0.50, 0.50], [0.40, 0.40], higher_is_better=False)  # e.g. logloss
    assert lower["label"] == "better" and lower["delta"] == pytest.approx(0.10)


def test_precision_config_rejects_bad_values_and_round_trips():
    with pytest.raises(ValueError, match="precision.dtype='fp8'"):
        PrecisionConfig(dtype="fp8")
    with pytest.raises(ValueError, match="precision.fp32_modules"):
        PrecisionConfig(fp32_modules=("",))
    cfg = RunConfig(precision=PrecisionConfig(dtype="auto", fp32_modules=("head", "LSTM")))
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


def test_typo_in_fp32_modules_fails_the_run_naming_the_entry(toy_workload):
    with pytest.raises(ValueError, match="'classifer' matches no module"):
        _toy_run("bf16", steps=2, fp32_modules=("classifer",))


# ----------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_cuda_autocast_tracks_fp32_and_uses_a_scaler_only_for_fp16(toy_workload, dtype):
    def go(d):
        return run(RunConfig(workload="toy", size="tiny", max_steps=8, device="cuda", latency_repeats=0,
                             precision=PrecisionConfig(dtype=d)))

    base, low = go("fp32"), go(dtype)
    for a, b in zip(base.losses, low.losses, strict=True):
        assert abs(a - b) <= 0.03 * abs(a)
    assert low.details["precision"]["phases"]["train"]["grad_scaler"] == (dtype == "fp16")


def test_tf32_context_restores_the_flags_even_after_an_error():
    from lab.precision import tf32

    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    with pytest.raises(RuntimeError), tf32(not before[0]):
        assert torch.backends.cuda.matmul.allow_tf32 is (not before[0])
        assert torch.backends.cudnn.allow_tf32 is (not before[0])
        raise RuntimeError("arm failed")
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


# ------------------------------------------------------------------ model gate: fp16 convolutions on CPU

def _conv_model(spec=None) -> nn.Module:
    return nn.Sequential(nn.Unflatten(1, (1, 8)), nn.Conv1d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(32, 2))


@pytest.fixture
def conv_toy(toy_workload):
    from lab.workloads import register_workload

    return register_workload(dataclasses.replace(toy_workload, name="toy_conv", make_model=_conv_model),
                             overwrite=True)


def test_model_gate_refuses_fp16_convolutions_on_cpu_only():
    from lab.precision import model_gate

    conv = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    why = model_gate(conv, "fp16", "cpu")
    assert why and "1 Conv2d layer(s) (0)" in why and "bf16" in why and "--precision-fp32-modules Conv2d" in why
    assert model_gate(conv, "bf16", "cpu") is None and model_gate(conv, "fp32", "cpu") is None
    assert model_gate(conv, "fp16", "cuda") is None  # CUDA has fp16 convolution kernels
    assert model_gate(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)), "fp16", "cpu") is None
    assert model_gate(conv, "fp16", "cpu", ("Conv2d",)) is None  # kept in fp32: it trains as fp32
    assert model_gate(nn.Sequential(conv), "fp16", "cpu", ("0",)) is None  # a kept parent keeps its convs


def test_fp16_on_a_conv_model_is_refused_before_training_and_reads_does_not_apply_here(conv_toy):
    from lab.ablation import run_ablation
    from lab.plots import ablation_table
    from lab.plots.tables import why_lines
    from lab.precision import NotApplicable, not_applicable_reason
    from lab.recipes import from_techniques

    steps = []
    cfg = RunConfig(workload="toy_conv", size="tiny", threads=1, latency_repeats=0,
                    precision=PrecisionConfig(dtype="fp16"))
    with pytest.raises(NotApplicable, match=r"precision.dtype='fp16' cannot train this model here: .*Conv1d"):
        run(cfg, progress=steps.append)
    assert not [e for e in steps if "step" in e]  # refused before any training step
    base = RunConfig(workload="toy_conv", size="tiny", threads=1, latency_repeats=0, max_steps=4, warmup_steps=1)
    df = run_ablation(from_techniques("gate", base, [["fp16"], ["bf16"]]), repeats=1)
    rows = df.set_index("arm")
    assert rows.loc["bf16", "status"] == "ok"  # bf16 convolutions are allowed
    assert not_applicable_reason(rows.loc["fp16", "error"]).startswith("precision.dtype='fp16' cannot train")
    table = ablation_table(df).set_index("Arm")
    assert table.loc["fp16", "Step speedup (x, 95 % CI)"] == "does not apply here"
    assert table.loc["fp16", "Status"] == "does not apply here"
    assert any(w.startswith("**fp16** does not apply here") and "Conv1d" in w for w in why_lines(df))


def test_auto_does_not_try_fp16_on_convolutions(toy_workload, monkeypatch):
    from lab.context import prepare
    from lab.precision import policy_for

    asked = []
    monkeypatch.setattr(precision.gate, "cpu_flags", lambda: frozenset({"amx_bf16", "avx512_fp16"}))
    monkeypatch.setattr(precision.auto, "probe_plan", lambda n, arms: (precision.ProbePlan(3, 1, 20, n), "planted"))
    monkeypatch.setattr(precision.auto, "measure_arms",
                        lambda ctx, model, lr, arms, **kw: asked.append(arms) or {a: [5.0, 5.1, 4.9] for a in arms})
    cfg = RunConfig(workload="toy", size="tiny", threads=1, precision=PrecisionConfig(dtype="auto"))
    with prepare(cfg) as ctx:
        assert policy_for(ctx, _conv_model(), 0.01).dtype == "fp32"
        rec = ctx.result.details["precision"]["auto"]
    assert asked == [["fp32", "bf16"]] and "fp16 not tried: fp16 on CPU with 1 Conv1d" in rec["why"]
    with prepare(cfg) as ctx:  # an MLP: fp16 is measured like bf16
        policy_for(ctx, ctx.new_model(), 0.01)
    assert asked[-1] == ["fp32", "bf16", "fp16"]
