"""PT2E int8 (torchao X86InductorQuantizer, ``quant.flow='pt2e'``): agreement with the float model on every built-in
workload, the graph swap guard, the compiled model a run stores, clear errors.

Stated tolerance: the int8 graph's outputs are within ``lab.quant.error_bound(method, reduce_range)`` relative L2
error of the float model's on held-out inputs (a number of activation quantization steps: it doubles where the CPU
has no VNNI and activations get 7 bits; static / dynamic: the same weights; QAT: after a few fine-tuning steps at a
tiny lr). The converted graph is
checked eagerly (it computes what the compiled one computes, with explicit quantize / dequantize); compiling costs
20-60 s per graph on 2 busy cores, so only the ``slow`` tests compile, once each. No timing assertions.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from lab import quant as Q
from lab.config import QuantConfig, RunConfig
from lab.workloads import get_workload

#: Every expectation here rests on the CPU's int8 instructions (the compiled kernels saturate without VNNI):
#: ``make test-avx2`` runs the module again with oneDNN capped at AVX2.
pytestmark = pytest.mark.capability


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


@pytest.mark.parametrize("name", ["ctr", "sequence"])
def test_pt2e_qat_agrees_with_float(tiny, name):
    _check_agreement(tiny, name, "qat")


@pytest.mark.slow
def test_pt2e_qat_resnet_with_zero_init_bn_agrees_with_float(tiny):
    info = _check_agreement(tiny, "vision", "qat")
    assert info["qat_bn_scales_nudged"]["modules"]  # the untrained ResNet's last BN per block has gamma = 0


def test_dynamic_int8_of_an_lstm_falls_back_to_legacy_and_says_why(tiny):
    wl, model, _, x = tiny["sequence"]
    q, info = Q.quantize_with_report(model, QuantConfig(method="dynamic"))
    assert info["flow"] == "legacy" and info["flow_asked"] == "pt2e" and "aten.lstm" in info["flow_fallback"]
    assert info["swap"]["swapped"]["lstm"] == "LSTM"
    assert Q.relative_error(model(*x), q(*x)) < tol("dynamic", info)


def test_swap_guard_refuses_a_graph_with_no_quantized_op(tiny, monkeypatch):
    wl, model, loader, _ = tiny["ctr"]
    from lab.quant import pt2e

    empty = pt2e.torchao_pt2e().X86InductorQuantizer()  # no config: annotates nothing, silently
    monkeypatch.setattr(pt2e, "make_quantizer", lambda method, reduce_range=False: empty)
    with pytest.raises(Q.QuantizationNoOpError, match="changed nothing.*0 quantize/dequantize"):
        Q.quantize(model, QuantConfig(method="static", calibration_batches=1), loader)


def test_graph_report_of_a_float_graph_counts_nothing_int8():
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    gm = Q.export_for_quant(model, (torch.randn(4, 8),))
    report = Q.graph_swap_report(gm, model, "static")
    assert report["graph"] == {} and report["n_asked"] == 2 and report["kept_float"] == ["0", "2"]
    with pytest.raises(Q.QuantizationNoOpError):
        Q.check_graph_quantized(report, "static")


def test_missing_torchao_is_one_clear_line(monkeypatch):
    for name in Q.pt2e._TORCHAO_MODULES:
        monkeypatch.setitem(sys.modules, name, None)  # `import name` now raises ImportError
    from lab.quant import check

    cfg = RunConfig(workload="ctr", size="tiny", device="cpu", quant=QuantConfig(method="static"))
    with pytest.raises(ValueError, match=r"quant.flow='pt2e' needs torchao .*--quant-flow legacy"):
        check(cfg)
    check(RunConfig(workload="ctr", size="tiny", device="cpu", quant=QuantConfig(method="static", flow="legacy")))


def test_lab_imports_without_torchao():
    code = ("import sys; sys.modules['torchao'] = None\n"
            "import lab, lab.quant, lab.train\n"
            "assert 'torchao.quantization' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_pt2e_refuses_what_its_default_config_cannot_express():
    from lab.quant import check

    for qc, field in ((QuantConfig(method="static", per_channel=False), "per_channel"),
                      (QuantConfig(method="static", observer="minmax"), "observer")):
        with pytest.raises(ValueError, match=f"quant.{field}=.*--quant-flow legacy"):
            check(RunConfig(workload="ctr", size="tiny", device="cpu", quant=qc))


def test_zero_bn_scales_are_nudged_and_others_left_alone():
    bn = nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([0.0, 0.5, 0.0]))
    assert Q.nudge_zero_bn_scales(nn.Sequential(bn)) == ["0"]
    assert torch.equal(bn.weight.detach(), torch.tensor([Q.pt2e.BN_SCALE_FLOOR, 0.5, Q.pt2e.BN_SCALE_FLOOR]))


def test_amdahl_bound_and_why_tags():
    assert Q.amdahl_bound(0.0) == 1.0 and Q.amdahl_bound(1.0) == Q.INT8_MAC_GAIN
    lat = {"batch_1": {"vs_fp32_compiled": {"ratio": 0.8}}, "batch_64": {"vs_fp32_compiled": {"ratio": 3.0}}}
    rows = Q.theory_vs_practice(1.0, lat, {"lstm": 1})["by_batch"]
    assert "batch 1" in rows["batch_1"]["why"] and rows["batch_64"]["why"] is None  # 3x of a 4x bound agrees


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


@pytest.mark.slow
@pytest.mark.int8_vnni
def test_with_vnni_auto_keeps_full_range_activations():
    chosen, info = _compiled_static_error("auto")
    assert info["reduce_range"]["used"] is False and "VNNI" in info["reduce_range"]["why"]
    assert chosen < Q.error_bound("static", False)
