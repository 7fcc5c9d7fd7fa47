"""Models as people paste them (issue 45, tests/pasted_models.py) through int8: the patterns that met a traceback,
each through the door a user takes (``run`` with a spec, or the quantize API), now ok with the effect verified, a
fallback said in the record, or one line. No timing assertions. (DDP of the same models: tests/distributed.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pasted_models import LSTM_LM, ROBERTA, TRANSFORMER
from torch import nn

import lab.quant as Q
from lab import RunConfig, run
from lab.config import QuantConfig

SPEC = str(Path(__file__).resolve().parents[1] / "pasted_models.py")


def _cfg(name: str, **overrides) -> RunConfig:
    return RunConfig(workload=f"{SPEC}:{name}", size="tiny", threads=1, latency_repeats=2).with_overrides(**overrides)


def _model_and_batches(make, n_batches: int = 2):
    wl = make()
    torch.manual_seed(0)
    model = wl.make_model(wl.sizes["tiny"]).eval()
    data = wl.make_data(wl.sizes["tiny"], 0)
    loader = [tuple(t[i:i + 32] for t in data.train) for i in range(0, 32 * n_batches, 32)]
    return model, loader, tuple(t[:32] for t in data.test[:-1])


# ------------------------------------------------------------------ 1. integer tensors computed in forward


@pytest.mark.capability
def test_pt2e_static_int8_never_observes_the_integer_position_ids_roberta_computes():
    """RoBERTa's position ids (an int mask, its cumsum, their product) are int tensors made in ``forward``:
    X86InductorQuantizer annotated their ``mul`` and the histogram observer failed on them ("histogram_cpu" not
    implemented for 'Int'). Only float tensors are observed now; the int8 model agrees with the float one."""
    model, loader, x = _model_and_batches(ROBERTA)
    q, info = Q.quantize_with_report(model, QuantConfig(method="static", calibration_batches=2), loader)
    assert info["flow"] == "pt2e" and isinstance(q, Q.FrozenCompiled)
    assert info["swap"]["graph"]["int8_linear"] == info["swap"]["n_swapped"] == 3  # ff.0, ff.2, head
    skipped = info["integer_ops_not_observed"]
    assert any(op.startswith("mul") for op in skipped["ops"]) and "integer" in skipped["why"]
    with torch.no_grad():
        err = Q.relative_error(model(*x), Q.converted_graph(q)(*x))
    assert err < Q.error_bound("static", info["reduce_range"]["used"]), err


# ------------------------------------------------------------------ 2. next(self.parameters()) in forward


@pytest.mark.parametrize("flow", ["legacy", "pt2e"])
def test_dynamic_int8_of_a_model_reading_next_parameters_keeps_working(flow):
    """word_language_model's ``init_hidden`` reads ``next(self.parameters())`` on every call: dynamic int8 left no
    float parameter, so the int8 model raised StopIteration in the report. The converted model keeps one (empty)
    float parameter for such code, and the run says so."""
    r = run(_cfg("LSTM_LM", **{"quant.method": "dynamic", "quant.flow": flow}))
    assert r.status == "ok", r.error
    q = r.details["quant"]
    assert q["flow"] == "legacy" and (q.get("flow_asked") == "pt2e") == (flow == "pt2e")
    assert {"rnn": "LSTM", "decoder": "Linear"}.items() <= q["swap"]["swapped"].items()
    assert q["int8_model_macs_by_dtype"]["int8"] > 0
    anchor = q["float_parameter_kept"]
    assert anchor["parameter"] == Q.FLOAT_ANCHOR and "next(model.parameters())" in anchor["why"]
    assert q["output_rel_error"] < Q.error_bound("dynamic", True)


def test_the_converted_lstm_model_still_has_a_float_parameter_first():
    model, _, x = _model_and_batches(LSTM_LM)
    q = Q.quantize(model, QuantConfig(method="dynamic", flow="legacy"))
    first = next(q.parameters())
    assert first.dtype == torch.float32 and first.numel() == 0 and not first.requires_grad
    assert Q.relative_error(model(*x), q(*x)) < Q.error_bound("dynamic", True)
    mlp = Q.quantize(nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)), QuantConfig(method="dynamic", flow="legacy"))
    assert not hasattr(mlp, Q.FLOAT_ANCHOR)  # a float parameter is left (the LayerNorm's): nothing added


# ------------------------------------------------------------- 3. nn.Transformer subclass, float causal mask


@pytest.mark.capability
@pytest.mark.parametrize("method", ["dynamic", "static"])
def test_pt2e_int8_of_an_nn_transformer_subclass_with_a_causal_float_mask(method):
    """export met ``nn.TransformerEncoder``'s data-dependent causal-mask check (GuardOnDataDependentSymNode ...
    Eq(u0, 1)); the check is skipped while exporting (the mask is applied as given), which the record says."""
    model, loader, x = _model_and_batches(TRANSFORMER)
    q, info = Q.quantize_with_report(model, QuantConfig(method=method, calibration_batches=2), loader)
    assert info["flow"] == "pt2e" and "flow_fallback" not in info
    assert info["swap"]["graph"]["int8_linear"] >= 5  # per layer: linear1, linear2, (out_proj static) + decoder
    assert "causal" in info["export"]["why"] and info["export"]["causal_mask_checks_skipped"] >= 1
    with torch.no_grad():
        err = Q.relative_error(model(*x), Q.converted_graph(q)(*x))
    assert err < Q.error_bound(method, info["reduce_range"]["used"]), err


class DataDependentBranch(nn.Module):
    """A branch on a tensor's value (``if x.sum() > 0``): neither torch.export nor FX symbolic tracing passes it."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.sum() > 0:
            h = torch.relu(h)
        return self.b(h)


def test_pt2e_that_cannot_export_falls_back_to_legacy_or_refuses_in_one_line():
    model = DataDependentBranch().eval()
    x = torch.randn(16, 8)
    q, info = Q.quantize_with_report(model, QuantConfig(method="dynamic"), [(x, None)])
    assert info["flow"] == "legacy" and info["flow_asked"] == "pt2e"
    assert "torch.export" in info["flow_fallback"] and "\n" not in info["flow_fallback"]
    assert q(x).shape == (16, 2) and info["swap"]["n_swapped"] == 2
    with pytest.raises(ValueError, match=r"torch\.export.*FX symbolic tracing") as err:
        Q.quantize_with_report(model, QuantConfig(method="static", calibration_batches=1), [(x, None)])
    assert "\n" not in str(err.value)


def test_flow_auto_does_not_time_a_pt2e_that_fell_back_as_pt2e():
    model = DataDependentBranch().eval()
    x = torch.randn(16, 8)
    q, info = Q.probe_flows(model, QuantConfig(method="dynamic", flow="auto"),
                            lambda qc: Q.quantize_with_report(model, qc, [(x, None)]), (x,), repeats=2)
    auto = info["auto"]
    assert auto["chosen"] == info["flow"] == "legacy" and "torch.export" in auto["not_candidates"]["pt2e"]
