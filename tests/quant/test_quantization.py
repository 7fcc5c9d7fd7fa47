"""Int8 quantization, both flows.

Legacy flow (torch.ao, ``quant.flow='legacy'``): correctness against torch's own quantizer and the float model, the
swap guard, clear errors.

PT2E flow (torchao X86InductorQuantizer, ``quant.flow='pt2e'``, the default): agreement with the float model on every
built-in workload, the graph swap guard, the compiled model a run stores, clear errors. Stated tolerance: the int8
graph's outputs are within ``lab.quant.error_bound(method, reduce_range)`` relative L2 error of the float model's on
held-out inputs (a number of activation quantization steps: it doubles where the CPU has no VNNI and activations get
7 bits; static / dynamic: the same weights; QAT: after a few fine-tuning steps at a tiny lr). The converted graph is
checked eagerly (it computes what the compiled one computes, with explicit quantize / dequantize); compiling costs
20-60 s per graph on 2 busy cores, so only the ``slow`` tests compile, once each.

No timing assertions (speed lives in benchmarks/quantization.py).
"""

from __future__ import annotations

import io
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

from lab import quant as Q
from lab.config import PrecisionConfig, QuantConfig, RunConfig
from lab.quant import metric_delta, relative_error
from lab.train import run
from lab.workloads import get_workload


# ============================================================================================= legacy flow
def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).eval()


def _loader(n_batches: int, batch: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 32, generator=g), torch.zeros(batch, dtype=torch.long)) for _ in range(n_batches)]


def test_affine_round_trip_within_half_a_step_and_matches_torch():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 3 + 1
    scale, zp = Q.affine_qparams(x)
    q = Q.affine_quantize(x, scale, zp)
    back = Q.affine_dequantize(q, scale, zp)
    assert (back - x).abs().max() <= scale / 2 + 1e-6  # the theoretical bound inside the range
    with Q.ao_warnings_filtered():
        ref = torch.quantize_per_tensor(x, scale, zp, torch.quint8)
    assert torch.equal(q, ref.int_repr().to(torch.int32))
    assert torch.allclose(back, ref.dequantize())
    assert back[x.abs().argmin()].abs() <= scale / 2  # values near 0 stay near 0


def test_dynamic_int8_is_close_to_float_and_leaves_the_input_model_alone():
    model = _mlp()
    x = torch.randn(64, 32)
    q, info = Q.quantize_with_report(model, QuantConfig(flow="legacy", method="dynamic"))
    assert info["swap"]["n_swapped"] == 2 and info["swap"]["kept_float"] == []
    assert type(model[0]) is nn.Linear  # the caller's model is not modified in place
    assert relative_error(model(x), q(x)) < 0.03  # int8 weights + per-batch activation scales: ~1 % here
    assert info["engine"] == torch.backends.quantized.engine


def test_dynamic_int8_lstm_is_really_swapped():
    wl = get_workload("sequence")
    model = wl.make_model(wl.sizes["tiny"]).eval()
    x = torch.randn(8, 10, 100)
    q, info = Q.quantize_with_report(model, QuantConfig(flow="legacy", method="dynamic"))
    assert info["swap"]["swapped"]["lstm"] == "LSTM" and "lstm" not in info["swap"]["kept_float"]
    assert relative_error(model(x), q(x)) < 0.05


def test_swap_guard_raises_when_the_library_changes_nothing(monkeypatch):
    import torch.ao.quantization as tq

    monkeypatch.setattr(tq, "quantize_dynamic", lambda model, *a, **k: model)  # the silent LSTM no-op
    with pytest.raises(Q.QuantizationNoOpError, match="changed nothing"):
        Q.quantize(_mlp(), QuantConfig(flow="legacy", method="dynamic"))


def test_model_without_quantizable_layers_is_an_error():
    with pytest.raises(ValueError, match="no module of the types"):
        Q.quantize(nn.Sequential(nn.ReLU()), QuantConfig(flow="legacy", method="dynamic"))


@pytest.mark.parametrize("per_channel", [True, False])
def test_static_int8_calibrated_close_to_float(per_channel):
    model = _mlp()
    q, info = Q.quantize_with_report(model, QuantConfig(flow="legacy", method="static", calibration_batches=4,
                                                        observer="minmax", per_channel=per_channel), _loader(8))
    assert info["calibration_batches_used"] == 4 and info["swap"]["n_swapped"] == 2
    scheme = q.get_submodule(next(iter(info["swap"]["swapped"]))).weight().qscheme()
    assert (scheme in (torch.per_channel_affine, torch.per_channel_symmetric)) == per_channel  # one scale per row
    x = _loader(1)[0][0]
    assert relative_error(model(x), q(x)) < 0.05


def test_static_resnet_with_plain_add_and_inplace_relu_quantizes_via_fx():
    wl = get_workload("vision")
    model = wl.make_model(wl.sizes["tiny"]).eval()
    data = wl.make_data(wl.sizes["tiny"], 0)
    loader = [(data.train[0][i:i + 32], data.train[1][i:i + 32]) for i in range(0, 128, 32)]
    q, info = Q.quantize_with_report(model, QuantConfig(flow="legacy", method="static", calibration_batches=4), loader)
    assert info["swap"]["kept_float"] == [] and info["swap"]["n_swapped"] == info["swap"]["n_asked"]
    x = data.test[0][:32]
    assert relative_error(model(x), q(x)) < 0.15  # an untrained net, 7-bit activations: a loose bound


def test_quantized_model_saves_and_loads():
    model = _mlp()
    x = torch.randn(4, 32)
    for method, loader in (("dynamic", None), ("static", _loader(2))):
        q = Q.quantize(model, QuantConfig(flow="legacy", method=method), loader)
        buf = io.BytesIO()
        torch.save(q.state_dict(), buf)
        # A fresh copy quantized from different weights gets the saved int8 weights and scales back.
        other = Q.quantize(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)),
                           QuantConfig(flow="legacy", method=method), loader)
        buf.seek(0)
        other.load_state_dict(torch.load(buf, weights_only=False))
        assert torch.equal(other(x), q(x))


def test_calibration_needs_batches():
    with pytest.raises(ValueError, match="calibration_batches=0"):
        QuantConfig(flow="legacy", method="static", calibration_batches=0)
    with pytest.raises(ValueError, match="yielded no batches"):
        Q.quantize(_mlp(), QuantConfig(flow="legacy", method="static"), [])
    with pytest.raises(ValueError, match="needs calibration data"):
        Q.quantize(_mlp(), QuantConfig(flow="legacy", method="static"))


def test_bad_quant_config_values_name_field_and_allowed():
    with pytest.raises(ValueError, match="quant.observer='mse'.*histogram"):
        QuantConfig(observer="mse")
    with pytest.raises(ValueError, match="quant.qat_lr_factor=0"):
        QuantConfig(qat_lr_factor=0)
    with pytest.raises(ValueError, match="quant.per_channel"):
        QuantConfig(per_channel=1)
    with pytest.raises(ValueError, match="method='none'"):
        Q.quantize(_mlp(), QuantConfig())
    cfg = RunConfig(quant=QuantConfig(flow="legacy", method="qat", observer="minmax", per_channel=False, qat_epochs=2))
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_reduced_precision_plus_int8_is_refused_before_training(dtype):
    cfg = RunConfig(workload="ctr", size="tiny", device="cpu", precision=PrecisionConfig(dtype=dtype),
                    quant=QuantConfig(flow="legacy", method="static"))
    with pytest.raises(ValueError, match=f"precision.dtype='{dtype}'"):
        Q.check_supported(cfg)
    with pytest.raises(ValueError, match="quant.method='static' is invalid"):
        run(cfg)


def test_qat_needs_a_finetune_step():
    with pytest.raises(ValueError, match="needs finetune"):
        Q.quantize(_mlp(), QuantConfig(flow="legacy", method="qat"), _loader(1))


def test_deprecation_warnings_are_filtered_only_inside_our_calls():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Q.quantize(_mlp(), QuantConfig(flow="legacy", method="static"), _loader(1))
        assert not [w for w in caught if "torch.ao.quantization is deprecated" in str(w.message)]
        import torch.ao.quantization as tq

        tq.quantize_dynamic(_mlp(), {nn.Linear}, dtype=torch.qint8)  # outside: the warning still shows
    assert [w for w in caught if "torch.ao.quantization is deprecated" in str(w.message)]


def test_metric_delta_reports_noise_floor():
    torch.manual_seed(0)
    y = torch.randint(0, 2, (400,))
    out = torch.nn.functional.one_hot(y, 2).float() + 0.1 * torch.randn(400, 2)

    def acc(o: torch.Tensor, t: torch.Tensor) -> dict[str, float]:
        return {"accuracy": float((o.argmax(1) == t).float().mean())}

    same = metric_delta(acc, "accuracy", out, out.clone(), y)
    assert same["loss_pts"] == 0 and same["within_noise"]
    worse = metric_delta(acc, "accuracy", out, -out, y)
    assert worse["loss_pts"] == pytest.approx(100.0) and not worse["within_noise"]


@pytest.mark.parametrize("method", ["static", "qat"])
def test_run_records_int8_figures_engine_and_isa(method):
    cfg = RunConfig(workload="vision", size="tiny", device="cpu", threads=1, max_steps=4, latency_repeats=3,
                    quant=QuantConfig(flow="legacy", method=method, calibration_batches=2))
    res = run(cfg)
    q = res.details["quant"]
    assert res.status == "ok" and q["method"] == method and q["backend_engine"] in ("x86", "fbgemm", "qnnpack")
    assert "isa_flags" in q and q["swap"]["n_swapped"] > 0 and "torch.ao" in q["api"] and q["flow"] == "legacy"
    assert q["size_ratio"] > 1.5 and q["float_macs_per_sample"] > 0  # int8 convs count 0 MACs; float kept
    assert set(q["latency"]) == {"batch_1", "batch_256"} and q["latency"]["batch_1"]["ratio"] > 0
    assert abs(res.metric - res.metrics["accuracy"]) < 1e-9 and "accuracy" in q["accuracy"]
    if method == "qat":
        assert q["qat"]["steps"] > 0 and q["qat"]["qat_step_cost_ratio"] > 0


def test_narrow_embeddings_stay_float_on_purpose_and_wide_ones_are_int8():
    wl = get_workload("ctr")
    # A seeded init: the relative error of an untrained model's logits depends on the draw (0.005-0.12 over
    # seeds 0-11 on a Zen 5), and unseeded it followed whatever the randomly ordered tests before it drew: CI
    # once read 0.1612 against the bound's 0.1606.
    torch.manual_seed(0)
    model = wl.make_model(wl.sizes["tiny"]).eval()
    data = wl.make_data(wl.sizes["tiny"], 0)
    x = tuple(t[:64] for t in data.test[:-1])
    q, info = Q.quantize_with_report(model, QuantConfig(flow="legacy", method="dynamic"))
    assert info["swap"]["swapped"]["embedding"] == "EmbeddingBag" and "wide" in info["swap"]["kept_float"]
    assert "wide" in info["kept_float_on_purpose"]  # 1-wide rows would grow from 4 to 9 bytes in int8
    # The lab's own stated bound for dynamic int8 at the activation width used (7 bits here): a hand-typed 0.05
    # held at 0.031 on the AMX box and 0.017 capped at AVX2, but a real AMD EPYC's fbgemm kernels read 0.0500085.
    bound = Q.error_bound("dynamic", info["reduce_range"]["used"])
    assert relative_error(model(*x), q(*x)) < bound


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_int8_on_cuda_is_refused_before_training():
    cfg = RunConfig(workload="ctr", size="tiny", device="cuda", quant=QuantConfig(flow="legacy", method="dynamic"))
    with pytest.raises(ValueError, match="CPU only"):
        run(cfg)


# =============================================================================================== PT2E flow
#: Every PT2E expectation rests on the CPU's int8 instructions (the compiled kernels saturate without VNNI): each
#: PT2E test is marked ``capability``, so ``make test-avx2`` runs it again with oneDNN capped at AVX2.


def tol(method: str, info: dict | None = None) -> float:
    """The bound for ``method`` at the activation range this run used (``info["reduce_range"]``), or at the one
    the PT2E flow picks on this CPU."""
    used = (info or {}).get("reduce_range", Q.reduce_range_choice("auto", "pt2e"))["used"]
    return Q.error_bound(method, used)


#: QAT fine-tunes in train mode: 2 batches move the running statistics of the untrained ResNet's BatchNorms
#: (initialised to 0 / 1) by their momentum, so its eval outputs drift from the float model's beyond rounding.
TOL_QAT_WITH_BN = 0.25
N_INT8 = {("vision", "static"): 10, ("vision", "qat"): 10, ("vision", "dynamic"): 1, ("ctr", "static"): 4,
          ("ctr", "dynamic"): 4, ("ctr", "qat"): 4, ("sequence", "static"): 1, ("sequence", "qat"): 1}


@pytest.fixture(scope="module")
def tiny() -> dict[str, tuple]:
    """Per workload: a float model (random init, seeded), 4 calibration batches of 32, 64 held-out inputs."""
    out = {}
    for name in ("vision", "ctr", "sequence"):
        wl = get_workload(name)
        torch.manual_seed(0)
        model = wl.make_model(wl.sizes["tiny"]).eval()
        data = wl.make_data(wl.sizes["tiny"], 0)
        loader = [tuple(t[i:i + 32] for t in data.train) for i in range(0, 128, 32)]
        out[name] = (wl, model, loader, tuple(t[:64] for t in data.test[:-1]))
    return out


def _finetune(wl, loader):
    def fit(prepared: nn.Module) -> None:
        opt = torch.optim.SGD(prepared.parameters(), lr=1e-5)
        prepared.train()
        for batch in loader[:2]:
            loss = wl.loss(prepared(*batch[:-1]), batch[-1])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return fit


def _check_agreement(tiny, name: str, method: str) -> dict:
    wl, model, loader, x = tiny[name]
    q, info = Q.quantize_with_report(model, QuantConfig(method=method, calibration_batches=4), loader,
                                     finetune=_finetune(wl, loader) if method == "qat" else None)
    assert info["flow"] == "pt2e" and isinstance(q, Q.FrozenCompiled)
    graph = Q.converted_graph(q)
    counts = info["swap"]["graph"]
    n_int8 = counts.get("int8_conv", 0) + counts.get("int8_linear", 0)
    assert n_int8 == N_INT8[(name, method)] == info["swap"]["n_swapped"]
    assert counts["dequantize_per_channel"] == n_int8  # every int8 layer's weight is an int8 constant
    assert (counts.get("choose_qparams", 0) > 0) == (method == "dynamic")  # per-batch activation scales
    with torch.no_grad():
        err = Q.relative_error(model(*x), graph(*x))
    bound = TOL_QAT_WITH_BN if (name, method) == ("vision", "qat") else tol(method, info)
    assert err < bound, f"{name}/{method}: relative error {err:.4f}"
    return info


@pytest.mark.capability
@pytest.mark.parametrize("name,method", [("vision", "static"), ("vision", "dynamic"), ("ctr", "static"),
                                         ("ctr", "dynamic"), ("sequence", "static")])
def test_pt2e_post_training_int8_agrees_with_float(tiny, name, method):
    info = _check_agreement(tiny, name, method)
    if name == "ctr":  # embeddings have no PT2E int8 path: they stay float and the report says why
        assert {"embedding", "wide"} <= set(info["swap"]["kept_float"])
        assert "embedding lookup" in info["swap"]["kept_float_reasons"]["embedding"]
    if name == "sequence":
        assert info["swap"]["kept_float"] == ["lstm"] and info["swap"]["float_ops"].get("lstm") == 1
    if (name, method) == ("vision", "dynamic"):  # the x86 dynamic config is for Linear: convs run float
        assert info["swap"]["float_ops"]["conv2d"] == 9


@pytest.mark.capability
@pytest.mark.parametrize("name", ["ctr", "sequence"])
def test_pt2e_qat_agrees_with_float(tiny, name):
    _check_agreement(tiny, name, "qat")


@pytest.mark.capability
@pytest.mark.slow
def test_pt2e_qat_resnet_with_zero_init_bn_agrees_with_float(tiny):
    """The QAT flow on a ResNet whose BN scales start at zero: nudged, converted, int8 and close to float. The
    error is read off the converted graph, run as is; the flow's Inductor compile of it (a ResNet int8 conv graph,
    what [vision-static] above compiles) is skipped with torch.compile's force_eager stance (~6 s a pass)."""
    with torch.compiler.set_stance("force_eager"):
        info = _check_agreement(tiny, "vision", "qat")
    assert info["qat_bn_scales_nudged"]["modules"]  # the untrained ResNet's last BN per block has gamma = 0


@pytest.mark.capability
def test_dynamic_int8_of_an_lstm_falls_back_to_legacy_and_says_why(tiny):
    wl, model, _, x = tiny["sequence"]
    q, info = Q.quantize_with_report(model, QuantConfig(method="dynamic"))
    assert info["flow"] == "legacy" and info["flow_asked"] == "pt2e" and "aten.lstm" in info["flow_fallback"]
    assert info["swap"]["swapped"]["lstm"] == "LSTM"
    assert Q.relative_error(model(*x), q(*x)) < tol("dynamic", info)


@pytest.mark.capability
def test_swap_guard_refuses_a_graph_with_no_quantized_op(tiny, monkeypatch):
    wl, model, loader, _ = tiny["ctr"]
    from lab.quant import pt2e

    empty = pt2e.torchao_pt2e().X86InductorQuantizer()  # no config: annotates nothing, silently
    monkeypatch.setattr(pt2e, "make_quantizer", lambda method, reduce_range=False: empty)
    with pytest.raises(Q.QuantizationNoOpError, match="changed nothing.*0 quantize/dequantize"):
        Q.quantize(model, QuantConfig(method="static", calibration_batches=1), loader)


@pytest.mark.capability
def test_graph_report_of_a_float_graph_counts_nothing_int8():
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    gm = Q.export_for_quant(model, (torch.randn(4, 8),))
    report = Q.graph_swap_report(gm, model, "static")
    assert report["graph"] == {} and report["n_asked"] == 2 and report["kept_float"] == ["0", "2"]
    with pytest.raises(Q.QuantizationNoOpError):
        Q.check_graph_quantized(report, "static")


@pytest.mark.capability
def test_missing_torchao_is_one_clear_line(monkeypatch):
    for name in Q.pt2e._TORCHAO_MODULES:
        monkeypatch.setitem(sys.modules, name, None)  # `import name` now raises ImportError
    check = Q.TECHNIQUE.check  # the quantization technique's check stage

    cfg = RunConfig(workload="ctr", size="tiny", device="cpu", quant=QuantConfig(method="static"))
    with pytest.raises(ValueError, match=r"quant.flow='pt2e' needs torchao .*--quant-flow legacy"):
        check(cfg)
    check(RunConfig(workload="ctr", size="tiny", device="cpu", quant=QuantConfig(method="static", flow="legacy")))


@pytest.mark.capability
def test_lab_imports_without_torchao():
    code = ("import sys; sys.modules['torchao'] = None\n"
            "import lab, lab.quant, lab.train\n"
            "assert 'torchao.quantization' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.capability
def test_pt2e_refuses_what_its_default_config_cannot_express():
    check = Q.TECHNIQUE.check  # the quantization technique's check stage

    for qc, field in ((QuantConfig(method="static", per_channel=False), "per_channel"),
                      (QuantConfig(method="static", observer="minmax"), "observer")):
        with pytest.raises(ValueError, match=f"quant.{field}=.*--quant-flow legacy"):
            check(RunConfig(workload="ctr", size="tiny", device="cpu", quant=qc))


@pytest.mark.capability
def test_zero_bn_scales_are_nudged_and_others_left_alone():
    bn = nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([0.0, 0.5, 0.0]))
    assert Q.nudge_zero_bn_scales(nn.Sequential(bn)) == ["0"]
    assert torch.equal(bn.weight.detach(), torch.tensor([Q.pt2e.BN_SCALE_FLOOR, 0.5, Q.pt2e.BN_SCALE_FLOOR]))


@pytest.mark.capability
def test_amdahl_bound_and_why_tags():
    assert Q.amdahl_bound(0.0) == 1.0 and Q.amdahl_bound(1.0) == Q.INT8_MAC_GAIN
    lat = {"batch_1": {"vs_fp32_compiled": {"ratio": 0.8}}, "batch_64": {"vs_fp32_compiled": {"ratio": 3.0}}}
    rows = Q.theory_vs_practice(1.0, lat, {"lstm": 1})["by_batch"]
    assert "batch 1" in rows["batch_1"]["why"] and rows["batch_64"]["why"] is None  # 3x of a 4x bound agrees


@pytest.mark.capability
@pytest.mark.slow
def test_fair_comparison_times_int8_against_fp32_eager_and_compiled():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)).eval()
    x = (torch.randn(32, 64),)
    q = Q.quantize(model, QuantConfig(method="static", calibration_batches=1), [(x[0], None)])
    lat, compile_s = Q.compiled_latency(model, q, x, [1, 32], repeats=3)
    assert set(lat) == {"batch_1", "batch_32"} and set(compile_s["int8"]) == {1, 32}
    for s in lat.values():
        assert set(s["samples_ms"]) == {"fp32_eager", "fp32_compiled", "int8"} and s["vs_fp32_compiled"]["ratio"] > 0
    with torch.no_grad():
        assert Q.relative_error(model(*x), q(*x)) < tol("static")  # the compiled kernels compute the same
        y = q(torch.randn(45, 64))  # another batch size: padded chunks through the bucket's graph, no compile
    assert y.shape == (45, 8) and set(q.compile_s) == {1, 32}


@pytest.mark.capability
@pytest.mark.slow
def test_run_default_flow_stores_a_compiled_int8_model():
    from lab.train import run

    cfg = RunConfig(workload="vision", size="tiny", device="cpu", threads=1, max_steps=6, latency_repeats=0,
                    quant=QuantConfig(method="static", calibration_batches=2))
    res = run(cfg)
    q = res.details["quant"]
    assert res.status == "ok" and q["flow"] == "pt2e" and "X86InductorQuantizer" in q["api"]
    assert q["inductor"]["freezing"] and q["swap"]["graph"]["int8_conv"] == 9 and q["swap"]["kept_float"] == []
    assert q["output_rel_error"] < tol("static", q)  # outputs of the compiled model against the trained float one
    assert abs(q["accuracy"]["accuracy"]["loss_pts"]) <= 2.0  # 500 test images: 10 images either way
    assert 3.0 < q["quantized_layers_size_ratio"] <= 4.0


@pytest.mark.capability
@pytest.mark.parametrize("name", ["gallery_mlp", "gallery_dscnn", "gallery_transformer"])
def test_pt2e_static_int8_of_a_user_model_agrees_with_float(name):
    """The user-model gallery (tests/gallery.py) through the default flow: real int8 layers in the converted
    graph, outputs within the static tolerance of the float model's, and what stayed float is named."""
    from gallery import GALLERY

    wl = GALLERY[name]
    torch.manual_seed(0)
    model = wl.make_model(wl.sizes["tiny"]).eval()
    data = wl.make_data(wl.sizes["tiny"], 0)
    loader = [tuple(t[i:i + 32] for t in data.train) for i in range(0, 128, 32)]
    q, info = Q.quantize_with_report(model, QuantConfig(method="static", calibration_batches=4), loader)
    assert info["flow"] == "pt2e" and info["swap"]["n_swapped"] > 0
    counts = info["swap"]["graph"]
    assert counts.get("int8_conv", 0) + counts.get("int8_linear", 0) == info["swap"]["n_swapped"]
    x = tuple(t[:64] for t in data.test[:-1])
    with torch.no_grad():
        err = Q.relative_error(model(*x), Q.converted_graph(q)(*x))
    assert err < tol("static", info), f"{name}: relative error {err:.4f}"


# ------------------------------------------------------------------ int8 numerics follow the CPU (issue 25)

@pytest.mark.capability
@pytest.mark.parametrize(("flags", "used"), [(frozenset({"avx2", "fma"}), True),
                                             (frozenset({"avx2", "avx512f", "avx512_vnni"}), True),
                                             (frozenset({"avx2", "avx_vnni"}), False),
                                             (frozenset({"avx2", "amx_int8", "amx_tile"}), False)])
def test_reduce_range_follows_the_int8_dot_product_instructions(monkeypatch, flags, used):
    """Both sides on any machine: 7-bit activations exactly where no VNNI / AMX int8 instruction is usable
    (the AVX512_VNNI case is capped at AVX512_CORE by the environment, as ONEDNN_MAX_CPU_ISA would)."""
    from lab.measure import capabilities_of
    from lab.quant import numerics

    env = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"} if "avx512_vnni" in flags else {}
    monkeypatch.setattr(numerics, "cpu_capabilities", lambda: capabilities_of(flags, env, "AVX2"))
    choice = Q.reduce_range_choice("auto", "pt2e")
    assert choice["used"] is used
    if used:
        assert "saturating 16 bits" in choice["why"] and "avx512_vnni" in choice["why"]
    else:
        assert "VNNI" in choice["why"]
    if "avx512_vnni" in flags:
        assert "hidden by ONEDNN_MAX_CPU_ISA=AVX512_CORE" in choice["why"]
    assert Q.reduce_range_choice("off", "pt2e")["used"] is False and Q.reduce_range_choice("on", "pt2e")["used"]
    assert Q.reduce_range_choice("auto", "legacy", "x86")["used"] and not Q.reduce_range_choice("auto", "legacy",
                                                                                              "qnnpack")["used"]
    assert Q.error_bound("static", True) == pytest.approx(2 * Q.error_bound("static", False), rel=0.02)


@pytest.mark.capability
def test_the_chosen_activation_range_is_what_the_quantizer_uses():
    """The recorded choice is not just a label: with ``reduce_range`` the observer in front of the Linear layers
    has quant_max 127 while the convolution's input keeps 255 (convolutions did not saturate: see
    ``make_quantizer``); without it every observer has 255."""
    from lab.quant.pt2e import export_for_quant, torchao_pt2e

    ao = torchao_pt2e()
    conv = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 8), nn.ReLU(),
                         nn.Linear(8, 2)).eval()
    x = (torch.randn(2, 1, 8, 8),)
    for rr, want in ((True, {127, 255}), (False, {255})):
        prepared = ao.prepare_pt2e(export_for_quant(conv, x), Q.make_quantizer("static", rr))
        observers = [m for m in prepared.modules() if type(m).__name__ == "HistogramObserver"]
        assert observers and {o.quant_max for o in observers} == want
        image = next(n for n in prepared.graph.nodes if n.op == "call_module" and n.args
                     and getattr(n.args[0], "op", None) == "placeholder"
                     and type(getattr(prepared, n.target)).__name__ == "HistogramObserver")
        assert getattr(prepared, image.target).quant_max == 255  # the image into the convolution: 8 bits
    mlp = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    prepared = ao.prepare_pt2e(export_for_quant(mlp, (torch.randn(4, 8),)), Q.make_quantizer("static", True))
    assert {o.quant_max for o in prepared.modules() if type(o).__name__ == "HistogramObserver"} == {127}


def _compiled_static_error(reduce_range: str) -> tuple[float, dict]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)).eval()
    x = torch.randn(32, 64)
    qc = QuantConfig(method="static", calibration_batches=1, reduce_range=reduce_range)
    q, info = Q.quantize_with_report(model, qc, [(x, None)])
    with torch.no_grad():
        return Q.relative_error(model(x), q(x)), info


@pytest.mark.capability
@pytest.mark.slow
@pytest.mark.int8_vnni(False)
def test_without_vnni_full_range_activations_overflow_and_auto_avoids_it():
    """On a CPU without int8 dot products the compiled int8 kernels saturate full-range activations: forced
    8-bit activations leave the bound (measured 0.121 against 0.05 with oneDNN capped at AVX2), ``auto`` picks 7
    bits, records why, and stays inside its own bound."""
    forced, _ = _compiled_static_error("off")
    chosen, info = _compiled_static_error("auto")
    assert info["reduce_range"]["used"] and "saturating" in info["reduce_range"]["why"]
    assert forced > Q.error_bound("static", False) and chosen < Q.error_bound("static", True) and chosen < forced


@pytest.mark.capability
@pytest.mark.slow
@pytest.mark.int8_vnni
def test_with_vnni_auto_keeps_full_range_activations():
    chosen, info = _compiled_static_error("auto")
    assert info["reduce_range"]["used"] is False and "VNNI" in info["reduce_range"]["why"]
    assert chosen < Q.error_bound("static", False)


def test_a_pt2e_int8_model_stays_fused_after_dynamo_drops_its_graph():
    """Another PT2E build or a ``torch._dynamo.reset()`` clears Dynamo's cache; the next call recompiles, and
    without the freezing patch Inductor leaves quantize -> int8 GEMM -> dequantize unfused (a map read PT2E
    static on ctr xl at 0.99x fp32 for it). Inductor's int8 weight-prepack pass runs only under freezing: it
    must run again on the recompile."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    x = torch.randn(32, 64)
    calib = [(x, torch.zeros(32))] * 2

    def build(width):
        model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10)).eval()
        return Q.quantize_with_report(model, QuantConfig(method="static", calibration_batches=2), calib,
                                      example_inputs=(x,))[0]

    def prepacked(fn):
        before = counters["inductor"]["qlinear_weight_prepack_matcher_count"]
        out = fn()
        return counters["inductor"]["qlinear_weight_prepack_matcher_count"] - before, out

    first = build(128)
    n, ref = prepacked(lambda: first(x))
    assert n > 0  # the first call compiles frozen: the int8 weights are prepacked for oneDNN
    build(32)(x)  # another PT2E build: it clears Dynamo's cache of the first graph
    n, out = prepacked(lambda: first(x))
    assert n > 0, "the recompile after another PT2E build ran without freezing (int8 unfused)"
    torch._dynamo.reset()
    n, out = prepacked(lambda: first(x))
    assert n > 0 and torch.equal(out, ref)
    n, _ = prepacked(lambda: first(x))
    assert n == 0  # cached again: no compile, no patch
