"""Issue 30: the map's ``int8_auto`` row is the run's own ``--quant-flow auto`` probe on the rung's model and
batch, and its speedup is the chosen candidate's, timed in the same rounds as both candidates (legacy
``static_int8`` and ``pt2e_static_int8``), so "auto within 90 % of the best candidate" is read off one map.

The candidates are planted (a legacy dynamic int8 model and the float model standing for PT2E's compiled one)
so nothing compiles here; the probe itself and the map's plumbing are the real ones. No timing assertions:
whichever flow the probe takes, the row must carry exactly that candidate's samples and say so."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import lab.quant
from lab.crossover import arms, check_schema, mapping
from lab.crossover.measure import measure_rung
from lab.workloads import get_workload


@pytest.fixture
def planted_flows(monkeypatch):
    """``(method, flow) -> model`` without PT2E's compile: legacy = real dynamic int8, pt2e = the float copy."""
    built: list[tuple[str, str]] = []

    def int8_built(bench, method, flow="legacy", pruned=None, derived=()):
        key = ("int8", method, flow)
        if key not in bench.built:
            built.append(key[1:])
            float_model = copy.deepcopy(bench.model).eval()
            model = torch.ao.quantization.quantize_dynamic(float_model, {nn.Linear}, dtype=torch.qint8) \
                if flow == "legacy" else float_model
            bench.built[key] = (model, {"flow": flow, "method": method})
        return bench.built[key]

    monkeypatch.setattr(arms, "int8_built", int8_built)  # the probe's builder and the arms' (the quant family's)
    monkeypatch.setattr(lab.quant, "int8_built", int8_built)
    return built


@pytest.mark.parametrize("asked", [["int8_auto"], ["int8_static_legacy", "int8_static", "int8_auto"]])
def test_int8_auto_row_is_the_probed_choice_timed_beside_both_candidates(planted_flows, asked):
    facts, rows = measure_rung(get_workload("mlp"), "xs", asked, repeats=3, batch_size=32)
    assert facts["workload"] == "mlp" and {r["axis"] for r in rows} == {"inference"}  # never the training step
    assert sorted(planted_flows) == [("static", "legacy"), ("static", "pt2e")]  # each candidate built once
    auto = next(r for r in rows if r["technique"] == "int8_auto")
    assert auto["speedup"] is not None and auto["ci_lo"] <= auto["speedup"] <= auto["ci_hi"]
    chosen = "pt2e" if "probe took pt2e" in auto["why"] else "legacy"
    assert f"the --quant-flow auto probe took {chosen}" in auto["why"] and ("faster" in auto["why"]
                                                                             or "within noise" in auto["why"])
    if len(asked) > 1:  # the candidates' own rows: auto's row carries exactly the chosen one's samples
        cand = {r["technique"]: r for r in rows if r["technique"] in arms.INT8_FLOW_ARMS.values()}
        same = cand[arms.INT8_FLOW_ARMS[chosen]]
        assert (auto["tech_ms"], auto["speedup"], auto["base_ms"]) == (same["tech_ms"], same["speedup"],
                                                                         same["base_ms"])
    else:
        assert [r["technique"] for r in rows] == ["int8_auto"]  # candidates timed, but rows only for what was asked


def test_a_flow_the_model_cannot_take_is_not_a_candidate_and_the_row_says_why(planted_flows, monkeypatch):
    from lab.quant import flow_auto

    monkeypatch.setattr(flow_auto, "candidate_refusals", lambda model, qc: {"legacy": "FX cannot trace it (planted)"})
    _, rows = measure_rung(get_workload("mlp"), "xs", ["int8_auto"], repeats=3, batch_size=32)
    assert planted_flows == [("static", "pt2e")]
    (auto,) = rows
    assert "probe took pt2e" in auto["why"] and "legacy not a candidate: FX cannot trace it (planted)" in auto["why"]


def test_the_full_map_times_both_static_flows_and_auto_on_sparse_rungs_only():
    assert {"int8_static_legacy", "int8_static", "int8_auto"} <= set(arms.TECHNIQUES)
    assert all(arms.TECHNIQUES[t] == (arms.INFER,) for t in ("int8_static", "int8_auto"))
    assert {"int8_static", "int8_auto"} <= set(mapping.SPARSE_RUNGS)  # a PT2E build compiles
    assert not {"int8_static", "int8_auto"} & set(mapping.QUICK_TECHNIQUES)


def test_a_map_with_int8_auto_passes_the_schema(planted_flows):
    the_map = mapping.build_map(["mlp"], ["int8_static_legacy", "int8_static", "int8_auto"], rungs={"mlp": ["xs", "s"]},
                                repeats=3, batch_size={"mlp": 32})
    check_schema(the_map)
    got = {(r["rung"], r["technique"]) for r in the_map["rows"] if r["speedup"] is not None}
    assert {("xs", "int8_auto"), ("s", "int8_auto"), ("xs", "int8_static")} <= got


def _row(rung, params, tech, axis, speedup):
    return {"workload": "w", "rung": rung, "params": params, "technique": tech, "axis": axis, "speedup": speedup,
            "ci_lo": speedup, "ci_hi": speedup}


def test_auto_share_is_read_at_the_top_rung_against_the_best_candidate():
    from lab.crossover import report

    rows = [_row("xs", 10, "amp_auto", "train_step", 1.0), _row("xs", 10, "bf16", "train_step", 0.5),
            _row("xl", 1000, "amp_auto", "train_step", 1.0), _row("xl", 1000, "bf16", "train_step", 2.0),
            _row("xl", 1000, "fp16", "train_step", None),
            _row("xl", 1000, "int8_static_legacy", "inference", 0.8), _row("xl", 1000, "int8_static", "inference", 2.0),
            _row("xl", 1000, "int8_auto", "inference", 2.0)]
    kept_fp32 = report.auto_share(rows, "w", "amp_auto")  # auto kept fp32 where bf16 was 2x: half the gain
    assert kept_fp32["rung"] == "xl" and kept_fp32["best"] == "bf16" and kept_fp32["share"] == pytest.approx(0.5)
    assert kept_fp32["candidates"] == {"fp32": 1.0, "bf16": 2.0}  # fp16 unmeasured: not a candidate
    assert report.auto_share(rows, "w", "int8_auto")["share"] == pytest.approx(1.0)
    figs = {f["name"].split(") ")[1]: f for f in report.auto_share_figures(rows)}
    assert figs["amp_auto train step: share of the best candidate"]["met"] is False
    assert figs["int8_auto inference: share of the best candidate"]["met"] is True
    # one candidate only: nothing to compare an int8 flow choice with
    assert report.auto_share([r for r in rows if r["technique"] != "int8_static_legacy"], "w", "int8_auto") is None


@pytest.mark.capability
def test_a_pt2e_rows_note_gives_its_int8_mac_share_and_stored_size_within_the_formats_bound():
    """A real PT2E static build of mlp xs (export, calibrate, convert; the compile is lazy and not triggered):
    every int8 MAC is in a Linear, and its layers as stored are smaller by no more than the format allows."""
    import re

    from lab.crossover.measure import make_bench
    from lab.quant import size_bound
    from lab.quant.timed import int8_built, int8_share_note

    bench = make_bench(get_workload("mlp"), "xs", batch_size=32)
    model, info = int8_built(bench, "static", "pt2e")
    note = int8_share_note(bench, model, info)
    assert "int8 MAC share 100% (MAC bound 4.00x)" in note
    ratio = float(re.search(r"int8 layers ([0-9.]+)x smaller as stored", note).group(1))
    widest = max(m.in_features for m in bench.model.modules() if isinstance(m, nn.Linear))
    assert 1.5 < ratio <= size_bound(widest) + 0.005


def test_the_int8_size_figure_is_read_at_the_top_pt2e_row():
    from lab.crossover import report

    rows = [{**_row("xs", 10, "int8_static", "inference", 0.5), "why": "int8 layers 3.10x smaller as stored"},
            {**_row("xl", 1000, "int8_static", "inference", 4.0), "why": "x; int8 layers 3.97x smaller as stored"},
            {**_row("xl", 1000, "int8_static_legacy", "inference", 4.0), "why": "int8 layers 9.99x smaller as stored"}]
    (fig,) = report.int8_size_figures(rows)
    assert fig["value"] == pytest.approx(3.97) and fig["met"] and "w xl" in fig["name"]
    rows[1]["why"] = "int8 layers 3.80x smaller as stored"
    assert report.int8_size_figures(rows)[0]["met"] is False
    assert report.int8_size_figures([rows[2]]) == []  # only PT2E's stored format is held to the goal
