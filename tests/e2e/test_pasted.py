"""Models as people paste them (issue 45, tests/pasted_models.py) through int8: the patterns that met a traceback,
each through the door a user takes (``run`` with a spec, or the quantize API), now ok with the effect verified, a
fallback said in the record, or one line. No timing assertions. (DDP of the same models: tests/distributed.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pasted_models import LSTM_LM
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
