"""Quantization, legacy flow (torch.ao, ``quant.flow='legacy'``): correctness against torch's own quantizer and the
float model, the swap guard, clear errors. The PT2E flow is tested in tests/test_quant_pt2e.py.

No timing assertions here (speed lives in benchmarks/quantization.py)."""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from torch import nn

from lab import quant as Q
from lab.config import PrecisionConfig, QuantConfig, RunConfig
from lab.quant import metric_delta, relative_error
from lab.train import run
from lab.workloads import get_workload


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
