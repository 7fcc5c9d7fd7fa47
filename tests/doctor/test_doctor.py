"""lab doctor: Amdahl predictions with intervals, planted bottlenecks get the matching top prescription,
the crossover-map loader, the verification table and the CLI. No timing assertion: rankings are checked on
synthetic breakdowns with given rates, and on planted cases extreme enough to hold on a busy machine."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lab.cli import main
from lab.config import DataConfig, RunConfig
from lab.doctor import (
    CompileCost,
    Rate,
    Rates,
    amdahl,
    compare,
    diagnose,
    find_crossover,
    format_diagnosis,
    load_crossover,
    load_history,
    predict_technique,
    rank,
    top1_hit,
)
from lab.measure.profile import OP_CLASSES, Breakdown
from lab.registry import OPTIONS
from lab.workloads import Datasets, SizeSpec, Workload, register_workload


def _bd(step_ms: float = 10.0, tiny: float = 0.0, ops: dict[str, float] | None = None, **shares: float) -> Breakdown:
    ms = {c: 0.0 for c in OP_CLASSES}
    for c, s in shares.items():
        ms[c] = s * step_ms
    ms["overhead"] += step_ms - sum(ms.values())
    return Breakdown(step_ms=step_ms, ms=ms, tiny_ms={"elementwise": tiny * step_ms} if tiny else {},
                     op_counts=dict(ops or {}))


#: What torch.compile saves per fusable op (20 us) and costs per compiled forward + backward (0.5 ms), as
#: :func:`lab.doctor.compile_cost` would measure it; 2 s + 10 ms per op to compile.
COMPILE = CompileCost(0.02, 0.015, 0.025, 0.5, 0.4, 0.6, compile_s_fixed=2.0, compile_s_per_op=0.01,
                      source="measured here: test")
RATES = Rates(precision={("bf16", "linear"): Rate(2.0, 1.8, 2.2, "measured here: test"),
                         ("fp16", "linear"): Rate(0.9, 0.8, 1.0, "measured here: test")},
              fused_optimizer=Rate(3.0, 2.5, 3.5, "measured here: test"), batch_bytes=4096, compile=COMPILE,
              steps=1000)


def _ranked(train: Breakdown, infer: Breakdown | None = None, rates: Rates = RATES) -> list:
    names = [n for n in OPTIONS if n != "fast_kernels"]
    prec = [predict_technique(n, OPTIONS[n].overrides, OPTIONS[n].axes, train, infer, rates)
            for n in ("bf16", "fp16")]
    preds = [predict_technique(n, OPTIONS[n].overrides, OPTIONS[n].axes, train, infer, rates, prec)
             for n in names]
    return rank([p for p in preds if p is not None])


def test_amdahl_matches_the_formula_and_unit_rates_change_nothing():
    s, lo, hi = amdahl({"matmul": 0.6, "optimizer": 0.1}, {"matmul": Rate(2.0, 2.0, 2.0, "x")})
    assert s == pytest.approx(1 / (0.4 + 0.6 / 2.0))
    assert lo == pytest.approx(s) and hi == pytest.approx(s)
    one = amdahl({"matmul": 0.5}, {"matmul": Rate(1.0, 1.0, 1.0, "x")})
    assert one == pytest.approx((1.0, 1.0, 1.0))


@settings(max_examples=40, deadline=None)
@given(share=st.floats(0.0, 1.0), r=st.floats(0.2, 5.0), width=st.floats(1.0, 2.0))
def test_the_interval_contains_the_estimate_and_stays_within_the_extremes(share, r, width):
    s, lo, hi = amdahl({"matmul": share}, {"matmul": Rate(r, r / width, r * width, "x")})
    assert lo <= s <= hi
    assert lo >= 1 / (1 - share + share / (r / width ** 1.5)) - 1e-9  # log-normal tails stay near the CI
    assert s == pytest.approx(1 / (1 - share + share / r))


def test_planted_data_wait_gets_a_loader_first():
    top = _ranked(_bd(data_wait=0.8, matmul=0.1, optimizer=0.02))[0]
    assert top.axis == "train_step" and top.technique in ("prefetch", "parallel_reads", "workers2")
    assert "data wait 80 %" in top.reason


def test_reads_in_flight_are_predicted_from_their_own_measurement_or_split_the_wait():
    """``parallel_reads`` and ``prefetch`` both use the thread loader: each reader count is its own prediction
    (one shared slot let the last measured overwrite the other's)."""
    b = _bd(data_wait=0.6, matmul=0.35, optimizer=0.05)
    t_one, t_two = OPTIONS["prefetch"], OPTIONS["parallel_reads"]

    def predict(t, rates):
        return predict_technique(t.name, t.overrides, t.axes, b, None, rates)

    prior_one, prior_two = predict(t_one, RATES), predict(t_two, RATES)  # priors: 2 readers halve the wait
    assert prior_two.speedup > prior_one.speedup and "2 reads in flight" in prior_two.reason
    measured = dataclasses.replace(RATES, thread_loader_ms=Rate(5.0, 4.0, 6.0, "measured here: one reader"),
                                   thread_readers_ms={2: Rate(0.5, 0.4, 0.6, "measured here: two readers")})
    one, two = predict(t_one, measured), predict(t_two, measured)
    assert "one reader" in one.sources[0] and "two readers" in two.sources[0]
    assert one.speedup == pytest.approx(10.0 / (4.0 + 5.0)) and two.speedup == pytest.approx(10.0 / (4.0 + 0.5))


def test_planted_matmul_gets_precision_first():
    top = _ranked(_bd(matmul=0.85, optimizer=0.02, data_wait=0.01))[0]
    assert top.technique in ("bf16", "amp_auto")
    assert "85 % of the step is fp32 linear" in top.reason and "2.00x here" in top.reason


def test_planted_overhead_gets_compile_first_and_batch_advice():
    from lab.doctor import larger_batch_advice

    b = _bd(tiny=0.3, elementwise=0.35, matmul=0.05, optimizer=0.01, ops={"elementwise": 300})
    top = _ranked(b)[0]
    assert top.technique == "compile"
    assert "compile or larger batches first" in top.reason
    s, text = larger_batch_advice(b)
    assert s > 1.3 and "batch" in text


def test_many_tiny_ops_rank_compile_higher_than_a_huge_linear():
    tiny_ops = _bd(elementwise=0.5, reduction=0.05, matmul=0.05, optimizer=0.02, ops={"elementwise": 300})
    huge_linear = _bd(matmul=0.9, elementwise=0.02, optimizer=0.02, ops={"elementwise": 2, "matmul": 3})
    on_tiny, on_huge = _ranked(tiny_ops), _ranked(huge_linear)
    c_tiny = next(p for p in on_tiny if p.technique == "compile")
    c_huge = next(p for p in on_huge if p.technique == "compile")
    # 300 ops x 20 us saved - 0.5 ms per call on a 10 ms step; 2 ops x 20 us - 0.5 ms on the huge Linear
    assert c_tiny.speedup == pytest.approx(10 / (10 - 6 + 0.5))
    assert c_huge.speedup == pytest.approx(10 / (10 - 0.04 + 0.5)) and c_huge.speedup < 1
    assert c_tiny.lo <= c_tiny.speedup <= c_tiny.hi
    train = [p.technique for p in on_tiny if p.axis == "train_step"]
    assert train.index("compile") < train.index("bf16")
    train = [p.technique for p in on_huge if p.axis == "train_step"]
    assert train.index("bf16") < train.index("compile")
    # compile time is a cost a run amortises: 2 s + 300 ops x 10 ms = 5 s over 5.5 ms saved per step
    assert "pays back after ~909 steps" in c_tiny.reason and "this run's 1000 steps" in c_tiny.reason
    assert "never pays back" in c_huge.reason


def test_compile_saving_never_exceeds_the_fusable_work_and_the_overhead():
    from lab.doctor import compile_step_ms

    b = _bd(elementwise=0.1, matmul=0.85, ops={"elementwise": 10_000})  # 10,000 ops x 20 us would be 200 ms
    assert compile_step_ms(b, 0.02, 0.0) == pytest.approx(10.0 - 1.0 - 0.5)  # only elementwise + overhead go


def test_the_chain_fit_recovers_saving_per_op_and_price_per_call():
    from lab.doctor import CHAIN_OPS, fit_chain

    n = CHAIN_OPS
    noise = [0.99, 1.0, 1.01, 1.0, 1.0]
    samples = {"e1": [0.05 * f for f in noise], "eN": [0.05 * n * f for f in noise],  # eager: 50 us per op
               "c1": [0.6 * f for f in noise], "cN": [(0.6 + 0.01 * (n - 1)) * f for f in noise]}  # 10 us per op
    (save, slo, shi), (call, clo, chi) = fit_chain(samples)
    assert save == pytest.approx(0.04) and call == pytest.approx(0.6 - 0.05 + 0.04)
    assert slo <= save <= shi and clo <= call <= chi


def test_compile_record_keeps_the_compile_out_of_the_steady_steps():
    from lab.compute import compile_record

    rec = compile_record([5000.0, 1.2, 1.0, 1.1, 1.0], {"graphs": 3, "graph_breaks": 1},
                         {"graphs": 5, "graph_breaks": 1})
    assert rec == {"compile_s": pytest.approx((5000.0 - 1.05) / 1e3), "graphs": 2, "graph_breaks": 0}


def test_breakdown_counts_the_ops_the_model_called_by_class():
    from lab.measure.profile import OpEvent, breakdown

    ev = [OpEvent("aten::tanh", 2.0, 2.0, ("ProfilerStep#3",), True) for _ in range(6)]
    ev += [OpEvent("autograd::engine::evaluate_function: TanhBackward0", 3.0, 3.0, (), True) for _ in range(6)]
    ev += [OpEvent("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 1.0, 1.0, (), True)]
    b = breakdown(ev, n_steps=2, step_ms=1.0)
    assert b.op_counts == {"elementwise": 6.0}  # 3 forward + 3 backward per step; AccumulateGrad is not the model's


def test_data_parallel_from_a_profiled_ddp_step_names_the_comm_share():
    from lab.doctor import predict_data_parallel

    b = _bd(comm=0.25, matmul=0.6)
    b.comm_inflight_ms = 4.0  # 2.5 ms exposed of 4 ms in flight
    p = predict_data_parallel(b, 2, measured=True)
    assert p.axis == "train" and p.speedup == pytest.approx(2 * 0.75)
    assert p.lo == pytest.approx(2 * 7.5 / (7.5 + 4.0)) and p.hi == 2.0
    assert "communication 25 % of the step" in p.reason


def test_data_parallel_from_one_process_follows_the_link():
    from lab.distributed.scaling import Link
    from lab.doctor import predict_data_parallel

    link = Link("test", alpha_s=100e-6, bandwidth_bytes_per_s=1e9)
    big_step = predict_data_parallel(_bd(step_ms=100.0, matmul=0.9), 2, grad_bytes=1e5, link=link)
    comm_bound = predict_data_parallel(_bd(step_ms=1.0, matmul=0.9), 2, grad_bytes=1e7, link=link)
    assert 1.9 < big_step.speedup <= 2.0  # 0.3 ms of all-reduce against a 100 ms step
    assert comm_bound.lo < 1.0 and comm_bound.speedup < big_step.speedup  # 10 ms of all-reduce, 1 ms step
    assert comm_bound.lo <= comm_bound.speedup <= comm_bound.hi
    shared = predict_data_parallel(_bd(step_ms=100.0, matmul=0.9), 2, grad_bytes=1e5, link=link, core_share=2.0)
    assert shared.speedup == pytest.approx(big_step.speedup / 2, rel=0.01)  # two ranks on one rank's cores
    assert predict_data_parallel(_bd(), 2) is None  # no link calibrated: not predicted


def test_planted_optimizer_gets_the_fused_optimizer_first():
    assert _ranked(_bd(optimizer=0.6, matmul=0.1))[0].technique == "fused_optim"


def test_inference_predictions_follow_the_inference_breakdown():
    preds = _ranked(_bd(matmul=0.5), infer=_bd(matmul=0.9))
    inf = [p for p in preds if p.axis == "inference"]
    assert inf[0].technique == "prune_channels50" and inf[0].speedup > 1.5
    masks = next(p for p in inf if p.technique == "prune50")
    assert masks.lo <= 1.0 <= masks.hi  # masks skip no work: ~1.0x


def test_the_gate_leaves_out_emulated_precision_and_what_the_baseline_has(monkeypatch, toy_workload):
    from lab.doctor import diagnosis
    from lab.precision import Capability

    monkeypatch.setattr(diagnosis, "capability",
                        lambda dtype, device: Capability(dtype, "cpu", False, "no flags (test)"))
    base = RunConfig(workload="toy", size="tiny")
    assert "capability gate: no native bf16" in diagnosis.gate(OPTIONS["bf16"], base)
    assert diagnosis.gate(OPTIONS["prefetch"], base.with_overrides(**{"data.loader": "thread"})) == \
        "already in the baseline"
    assert "fast_kernels" in diagnosis.gate(OPTIONS["fast_kernels"], base)  # toy has none: refused by check
    assert diagnosis.gate(OPTIONS["fused_optim"], base) is None


def test_calibration_finds_the_dominant_layers_and_measures_their_rates():
    from lab.doctor import dominant_layers, optimizer_rate, precision_rates

    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 2))
    shapes = dominant_layers(model, (torch.randn(16, 8),))
    assert shapes.linear[0] is model[2] and tuple(shapes.linear[1]) == (16, 64)
    assert shapes.conv is None and shapes.rnn is None
    rates = precision_rates(shapes, ["bf16"])
    assert set(rates) == {("bf16", "linear")} and rates[("bf16", "linear")].value > 0
    assert "measured here" in rates[("bf16", "linear")].source
    assert optimizer_rate(model, "adam", 1e-3).value > 0


# ----------------------------------------------------------------------------------------- crossover map

def _map(tmp_path, **extra: object):
    data = {"env": {"hardware_id": "testhw"}, "rows": [
        {"workload": "ctr", "rung": "s", "params": 1000, "macs_per_sample": 2e6, "technique": "bf16",
         "axis": "train_step", "speedup": 1.5, "ci_lo": 1.35, "ci_hi": 1.65, "base_ms": 3.0, "tech_ms": 2.0,
         "regime": "compute", "why": ""}],
        "crossovers": [], "fits": [
        {"workload": "ctr", "technique": "bf16", "axis": "train_step", "base_overhead_ms": 1.0,
         "base_ms_per_mmac": 1.0, "tech_overhead_ms": 1.0, "tech_ms_per_mmac": 0.5, "loo_error": 0.1},
        {"workload": "vision", "technique": "fused_optimizer", "axis": "train_step", "base_overhead_ms": 2.0,
         "base_ms_per_mmac": 0.0, "tech_overhead_ms": 1.0, "tech_ms_per_mmac": 0.0, "loo_error": 0.0}], **extra}
    path = tmp_path / "testhw" / "crossover.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))
    return path


def test_crossover_loader_evaluates_the_fits_at_the_models_size(tmp_path):
    _map(tmp_path)
    cmap = find_crossover("testhw", tmp_path)
    assert cmap is not None and find_crossover("otherhw", tmp_path) is None
    r = cmap.rate("bf16", "train_step", 2e6, "ctr")
    assert r.value == pytest.approx((1 + 2) / (1 + 1))  # (1 + 1*2) / (1 + 0.5*2)
    assert r.lo < r.value < r.hi and "crossover map" in r.source
    assert cmap.rate("bf16", "inference", 2e6, "ctr") is None
    fused = cmap.rate("fused_optim", "train_step", 5e5, "mine")  # crossover name mapped; other workload's fit
    assert fused.value == pytest.approx(2.0) and "1 workload" in fused.source


def test_static_int8_reads_the_maps_pt2e_row_where_there_is_one_and_the_legacy_row_otherwise():
    """The lab's ``int8_static`` runs PT2E compiled; the map's ``static_int8`` is the legacy eager flow."""
    from lab.doctor.rates import CrossoverMap

    def fit(tech, tech_per_mmac):
        return {"workload": "vision", "technique": tech, "axis": "inference", "base_overhead_ms": 0.0,
                "base_ms_per_mmac": 4.0, "tech_overhead_ms": 0.0, "tech_ms_per_mmac": tech_per_mmac}

    both = CrossoverMap(env={}, rows=[], fits=[fit("static_int8", 2.0), fit("pt2e_static_int8", 1.0)])
    assert both.rate("int8_static", "inference", 1e6, "vision").value == pytest.approx(4.0)  # PT2E's 4x
    legacy_only = CrossoverMap(env={}, rows=[], fits=[fit("static_int8", 2.0)])  # a map from before issue 30
    assert legacy_only.rate("int8_static", "inference", 1e6, "vision").value == pytest.approx(2.0)
    assert both.rate("pt2e_static_int8", "inference", 1e6, "vision") is None  # an old map name, not an option


def test_every_map_technique_is_an_option_and_shared_words_do_not_cross():
    """One vocabulary: every row the map times is a registered option (or a ``+`` stack of them), and the doctor
    reads an option's own row or its stated nearest one, never another option's: ``prune50`` (masks) must not
    read channel pruning's rate, which predicts a speedup masks cannot give. A map stored under the old names
    (where ``prune50`` was channel pruning) reads in today's."""
    from lab.crossover.arms import TECHNIQUES as MAP_TECHNIQUES
    from lab.doctor.rates import NEAREST_MAP_ROW, CrossoverMap, map_names
    from lab.registry import OPTIONS

    assert all(part in OPTIONS for name in MAP_TECHNIQUES for part in name.split("+"))
    named = {m for t in OPTIONS for m in map_names(t)} & set(MAP_TECHNIQUES)
    assert set(MAP_TECHNIQUES) - named == {"prune_channels50+int8_static"}  # a stack: no single option reads it
    assert all(map_names(t)[0] == t for t in OPTIONS)
    assert set(NEAREST_MAP_ROW.values()) <= set(MAP_TECHNIQUES) and set(NEAREST_MAP_ROW) <= set(OPTIONS)
    assert map_names("int8_dynamic") == ("int8_dynamic", "int8_eager")  # PT2E dynamic: no row, eager's nearest
    old = CrossoverMap(env={}, rows=[], fits=[
        {"workload": "mlp", "technique": "prune50", "axis": "inference", "base_overhead_ms": 0.0,
         "base_ms_per_mmac": 4.0, "tech_overhead_ms": 0.0, "tech_ms_per_mmac": 1.0}])
    assert old.rate("prune_channels50", "inference", 1e6, "mlp").value == pytest.approx(4.0)
    assert old.rate("prune50", "inference", 1e6, "mlp") is None


def test_crossover_loader_refuses_another_schema(tmp_path):
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({"rows": [], "fits": [{"workload": "ctr"}]}))
    with pytest.raises(ValueError, match="a fit lacks"):
        load_crossover(bad)
    bad.write_text("not json")
    with pytest.raises(ValueError, match="cannot read a crossover map"):
        load_crossover(bad)


def test_crossover_rates_replace_the_calibrated_ones():
    r = Rates(precision=dict(RATES.precision), crossover={("bf16", "train_step"): Rate(1.2, 1.1, 1.3, "crossover map")})
    p = predict_technique("bf16", OPTIONS["bf16"].overrides, OPTIONS["bf16"].axes, _bd(matmul=1.0), None, r)
    assert p.speedup == pytest.approx(1.2) and "crossover map" in p.reason


# ---------------------------------------------------------------------------------------- verification

def test_compare_and_top1_read_the_ablation_table():
    from lab.doctor import Prediction

    preds = [Prediction("bf16", "train_step", 1.5, 1.3, 1.7, ""),
             Prediction("prefetch", "train_step", 1.1, 1.0, 1.2, "")]
    table = pd.DataFrame([
        {"arm": "baseline", "step_speedup": 1.0, "step_speedup_lo": 1.0, "step_speedup_hi": 1.0, "status": "ok"},
        {"arm": "bf16", "step_speedup": 1.2, "step_speedup_lo": 1.1, "step_speedup_hi": 1.45, "status": "ok"},
        {"arm": "prefetch", "step_speedup": 1.4, "step_speedup_lo": 1.3, "step_speedup_hi": 1.5, "status": "ok"}])
    rows = compare(preds, table)
    assert rows[0]["error"] == pytest.approx(1.5 / 1.2 - 1) and rows[0]["inside"]
    assert top1_hit(rows)  # bf16 measured 1.2 but its interval reaches the best (1.4): within noise
    rows[0]["measured_hi"] = 1.3
    assert not top1_hit(rows)


def test_a_pick_is_scored_over_the_run_it_was_prescribed_for_with_the_measured_compile_charged():
    """Per step, compile (1.3x) beats bf16 (1.1x); over the 40-step run of 10 ms steps the doctor ranked for,
    compile's measured 20 s compile leaves it at ~0.02x, so bf16 is the best and the pick is a hit. A row
    stored without a run length or a measured one-off keeps its per-step figure."""
    from lab.doctor import Prediction, over_the_run, scorecard

    preds = [Prediction("bf16", "train_step", 1.1, 1.0, 1.2, "", prescribed=True),
             Prediction("compile", "train_step", 1.3, 0.9, 1.6, "", prescribed=False)]
    table = pd.DataFrame([
        {"arm": "baseline", "step_speedup": 1.0, "step_speedup_lo": 1.0, "step_speedup_hi": 1.0, "status": "ok"},
        {"arm": "bf16", "step_speedup": 1.1, "step_speedup_lo": 1.08, "step_speedup_hi": 1.12, "status": "ok"},
        {"arm": "compile", "step_speedup": 1.3, "step_speedup_lo": 1.28, "step_speedup_hi": 1.32, "status": "ok"}])
    rows = compare(preds, table, step_ms={"baseline": 10.0}, one_off_s={"baseline": 0.5, "bf16": 0.5,
                                                                         "compile": 20.5}, run_steps=40)
    assert [r["measured_one_off_s"] for r in rows] == [0.0, 20.0]  # beyond the baseline's own one-off
    assert not top1_hit(rows)  # per step compile wins
    run = over_the_run(rows)
    assert run[1]["measured"] == pytest.approx(0.4 / (0.4 / 1.3 + 20.0)) and run[1]["measured_per_step"] == 1.3
    assert run[0]["measured"] == pytest.approx(1.1) and top1_hit(run)
    card = scorecard([{"rows": rows}])
    assert card["top1"] == 1.0 and card["top1_per_step"] == 0.0 and card["charged_one_off"] == 2
    old = [{k: v for k, v in r.items() if k != "measured_one_off_s"} for r in rows]  # stored before it was kept
    assert over_the_run(old) == old and scorecard([{"rows": old}])["top1"] == 0.0


# ------------------------------------------------------------------------------------- planted, for real

def _tiny_ops_model(spec: SizeSpec) -> nn.Module:
    class ManyTinyOps(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 2)
            self.scale = nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # 800 ops on a 8x4 tensor: every one is dispatch, none is arithmetic. Enough of them that the step
            # stays above the doctor's 2 ms tiny-step rule on a fast core: 300 ops stepped in 1.7 ms on an AMD
            # EPYC Zen 5, where the rule (rightly) predicts the compiled call's fixed price and not compile first.
            for _ in range(400):
                x = torch.tanh(x * self.scale)
            return self.lin(x)

    return ManyTinyOps()


def _tiny_data(spec: SizeSpec, seed: int) -> Datasets:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(spec.n_train + spec.n_test, 4, generator=g)
    y = (x[:, 0] > 0).long()
    return Datasets(train=(x[:spec.n_train], y[:spec.n_train]), test=(x[spec.n_train:], y[spec.n_train:]))


TINY_OPS = Workload(name="many_tiny_ops", description="800 tiny ops per forward",
                    sizes=SizeSpec(n_train=96, n_test=32, batch_size=8, epochs=1, lr=1e-3), make_data=_tiny_data,
                    make_model=_tiny_ops_model, loss=nn.functional.cross_entropy, metric_name="accuracy",
                    evaluate=lambda out, y: {"accuracy": (out.argmax(1) == y).float().mean().item()})
TRAIN_TECHS = ["bf16", "fused_optim", "prefetch", "workers2", "compile"]


@pytest.fixture
def fixed_compile_cost(monkeypatch):
    """The planted cases check the ranking, not this machine's compiler: the chain micro-benchmark (two
    compiles, tens of seconds here) is replaced by :data:`COMPILE`."""
    from lab.doctor import diagnosis

    monkeypatch.setattr(diagnosis, "compile_cost", lambda shape: COMPILE)


def _slow_io_model(spec: SizeSpec) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 2))


#: Compute of the same order as the read: ~1 M multiply-accumulates per sample at batch 128 (~25 ms forward +
#: backward + SGD here) beside object_store's 20 ms per batch. A read ten times longer than the compute (the toy
#: on object_store) is not a planted loader case: a prefetch thread hides only as much reading as there is
#: compute beside it, and that is what the doctor measures and predicts (~1.02x there).
SLOW_IO = Workload(name="slow_io", description="a 1 M-MAC MLP whose batches come from emulated network storage",
                   sizes=SizeSpec(n_train=512, n_test=64, batch_size=32, epochs=1, lr=1e-3), make_data=_tiny_data,
                   make_model=_slow_io_model, loss=nn.functional.cross_entropy, metric_name="accuracy",
                   evaluate=lambda out, y: {"accuracy": (out.argmax(1) == y).float().mean().item()})


def test_a_slow_data_source_gets_a_loader_first(fixed_compile_cost):
    register_workload(SLOW_IO, overwrite=True)
    cfg = RunConfig(workload="slow_io", size="tiny", threads=1, latency_repeats=2, epochs=1, optimizer="sgd",
                    batch_size=128, data=DataConfig(loader="naive", storage="object_store"))
    d = diagnose(cfg, techniques=TRAIN_TECHS)
    assert d.train.share("data_wait") > 0.2
    best = max((p for p in d.predictions if p.axis == "train_step"), key=lambda p: p.speedup)
    assert best.technique in ("prefetch", "workers2"), [(p.technique, p.speedup) for p in d.predictions]
    assert sum(d.train.ms.values()) == pytest.approx(d.train.step_ms, rel=1e-6)
    assert "data wait" in format_diagnosis(d)


def test_many_tiny_ops_get_compile_first(fixed_compile_cost):
    register_workload(TINY_OPS, overwrite=True)
    d = diagnose(RunConfig(workload="many_tiny_ops", size="tiny", threads=1, latency_repeats=2),
                 techniques=TRAIN_TECHS)
    assert d.train.share("overhead") + d.train.tiny_share + d.train.share("elementwise") > 0.6
    mine = next(p for p in d.predictions if p.technique == "compile")
    assert mine.speedup > 1
    # ... per step; this run's few steps cannot repay its compile, so it is not prescribed for them (issue 45)
    assert mine.one_off_s > 0 and mine.run_speedup < 1 and not mine.prescribed
    long = next(p for p in d.for_run(10**7).predictions if p.technique == "compile")
    assert long.run_speedup == pytest.approx(long.speedup, rel=0.01) and long.run_speedup > 1  # a long run repays it
    assert "batch" in d.advice[0]


def test_a_baseline_the_contention_meter_saw_busy_prescribes_nothing(fixed_compile_cost, monkeypatch):
    """What the run's contention meter read reaches the diagnosis: busy, nothing is prescribed and it says why."""
    from lab.doctor import BUSY_REFUSAL
    from lab.measure import contention

    register_workload(TINY_OPS, overwrite=True)
    loud = contention.Contention(others_cores=1.5, steal_share=0.0, load1=3.5, cores=2, wall_s=1.0)
    monkeypatch.setattr(contention.ContentionMeter, "stop", lambda self: loud)
    d = diagnose(RunConfig(workload="many_tiny_ops", size="tiny", threads=1, latency_repeats=2),
                 techniques=TRAIN_TECHS).for_run(10**7)
    assert d.busy == loud.sentence() != "" and d.top() is None and d.predictions
    assert BUSY_REFUSAL in format_diagnosis(d)


def test_cli_doctor_prints_breakdown_prescription_and_verification(toy_workload, capsys, tmp_path):
    code = main(["doctor", "--workload", "toy", "--size", "tiny", "--epochs", "1", "--latency-repeats", "2",
                 "--techniques", "fused_optim,prefetch", "--verify", "1", "--repeats", "1",
                 "--store", str(tmp_path / "v.sqlite")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "training step:" in out and "prescription, training step" in out and "verification" in out
    assert "90 % interval" in out  # every interval carries the doctor's own error (lab.doctor.calibration)
    assert "this verification: 1 case(s)" in out and "regret mean" in out  # the scorecard of the check
    from lab.measure import environment_stamp

    hist = load_history(environment_stamp("cpu")["hardware_id"])
    assert len(hist) == 1 and hist[0]["workload"] == "toy" and hist[0]["predicted"] > 0
    from lab.doctor.stored import last_diagnosis
    from lab.store import ResultStore

    with ResultStore(tmp_path / "v.sqlite") as store:  # kept for the recommendation card
        kept = last_diagnosis(store, "toy", "tiny", environment_stamp("cpu")["hardware_id"])
    assert kept is not None and {p.technique for p in kept.predictions} <= {"fused_optim", "prefetch"}


@pytest.mark.parametrize("argv", [["--verify", "-1"], ["--techniques", "nope"], ["--repeats", "0"]])
def test_cli_doctor_bad_input_is_one_line_and_exit_2(toy_workload, capsys, argv):
    assert main(["doctor", "--workload", "toy", "--size", "tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lab: error:") and len(err.strip().splitlines()) == 1


@pytest.mark.native_fp16
@pytest.mark.native_bf16
def test_the_doctor_neither_prescribes_nor_verifies_fp16_on_convolutions_on_cpu() -> None:
    from lab.doctor.diagnosis import gate
    from lab.registry import OPTIONS as RECIPE_TECHNIQUES

    vision = RunConfig(workload="vision", size="tiny", device="cpu")
    assert "fp16 convolution backward" in gate(RECIPE_TECHNIQUES["fp16"], vision)
    assert gate(RECIPE_TECHNIQUES["bf16"], vision) is None  # bf16 has fast conv kernels
    assert gate(RECIPE_TECHNIQUES["fp16"], RunConfig(workload="mlp", size="tiny", device="cpu")) is None


@pytest.mark.native_bf16(False)
def test_without_native_low_precision_the_doctor_names_the_missing_instructions() -> None:
    """The other side: on an AVX2-only CPU neither precision is predicted, and the reason names the flags that
    would make it native (not a model property such as fp16 convolutions)."""
    from lab.doctor.diagnosis import gate
    from lab.registry import OPTIONS as RECIPE_TECHNIQUES

    for dtype, flag in (("bf16", "avx512_bf16"), ("fp16", "avx512_fp16")):
        why = gate(RECIPE_TECHNIQUES[dtype], RunConfig(workload="vision", size="tiny", device="cpu"))
        assert why.startswith(f"capability gate: no native {dtype} on this CPU") and flag in why


def test_auto_is_predicted_as_the_precision_its_probe_would_pick() -> None:
    from lab.doctor.predict import Prediction, predict_auto

    bf16 = Prediction("bf16", "train_step", 1.16, 0.95, 1.40, "matmul 60 % at 1.3x -> bf16 predicted", [])
    fp16 = Prediction("fp16", "train_step", 0.90, 0.80, 1.00, "matmul 60 % at 0.9x -> fp16 predicted", [])
    auto = predict_auto("amp_auto", [bf16, fp16])
    assert auto.speedup == pytest.approx(1.16) and 0.97 <= auto.lo <= 1.0 and auto.hi == pytest.approx(1.40)
    assert "pick bf16" in auto.reason
    flat = predict_auto("amp_auto", [dataclasses.replace(bf16, speedup=1.02, hi=1.10), fp16])
    assert flat.speedup == 1.0 and "keep fp32" in flat.reason


# --------------------------------------------------------------- the model's own precision and loader costs

class _SeenDtypes(nn.Module):
    seen: list[torch.dtype] = []  # class-level: the rate measures deep copies of the model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _SeenDtypes.seen.append(x.dtype)
        return x


def test_the_models_precision_rate_runs_both_arms_through_the_policy_and_leaves_the_model_alone():
    from lab.doctor import model_precision_rates

    _SeenDtypes.seen = []
    model = nn.Sequential(nn.Linear(16, 32), _SeenDtypes(), nn.ReLU(), nn.Linear(32, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.randn(8, 16), torch.randint(0, 2, (8,))
    rates = model_precision_rates(model, (x,), y, nn.functional.cross_entropy, ["bf16"])
    assert set(rates) == {"bf16"} and "this model's forward + backward" in rates["bf16"].source
    assert rates["bf16"].lo <= rates["bf16"].value <= rates["bf16"].hi
    assert {torch.float32, torch.bfloat16} <= set(_SeenDtypes.seen)  # the fp32 arm and the autocast arm both ran
    assert "forward" not in model[1].__dict__ and all(model.state_dict()[k].equal(v) for k, v in before.items())
    assert all(p.grad is None for p in model.parameters())


def test_the_models_own_precision_rate_wins_and_covers_forward_and_backward_only():
    r = dataclasses.replace(RATES, model_precision={"bf16": Rate(0.5, 0.4, 0.6, "measured here: model")},
                            crossover={("bf16", "train_step"): Rate(1.2, 1.1, 1.3, "crossover map")})
    b = _bd(matmul=0.3, elementwise=0.3, optimizer=0.3, data_wait=0.1)  # forward + backward: 60 %
    p = predict_technique("bf16", OPTIONS["bf16"].overrides, OPTIONS["bf16"].axes, b, None, r)
    assert p.speedup == pytest.approx(1 / (0.4 + 0.6 / 0.5))
    assert p.lo < p.speedup < p.hi < 1 and "this model's forward + backward under bf16" in p.reason
    assert "outweighs" in p.reason


class _SleepyLoader:
    """Three batches, each read costs a sleep (the GIL is released, as on a slow disk)."""

    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def __iter__(self):
        import time as _t

        for _ in range(3):
            _t.sleep(self.sleep_s)
            yield (torch.randn(4, 16), torch.randint(0, 2, (4,)))


def test_loader_extra_ms_holds_at_least_the_read_it_cannot_hide_and_predicts_from_it():
    from lab.doctor import loader_extra_ms

    model = nn.Sequential(nn.Linear(16, 2))
    x, y = torch.randn(4, 16), torch.randint(0, 2, (4,))
    extra = loader_extra_ms(model, (x,), y, nn.functional.cross_entropy, _SleepyLoader(0.004), "sleepy test loader")
    # a plain loader hides nothing: each batch costs at least its 4 ms sleep (a lower bound, not a speed claim)
    assert extra.value >= 3.0 and extra.lo <= extra.value <= extra.hi and "sleepy" in extra.source
    r = dataclasses.replace(RATES, thread_loader_ms=Rate(1.0, 0.5, 2.0, "measured here: test"))
    b = _bd(step_ms=10.0, data_wait=0.4, matmul=0.5)
    p = predict_technique("prefetch", OPTIONS["prefetch"].overrides, OPTIONS["prefetch"].axes, b, None, r)
    assert p.speedup == pytest.approx(10 / (6 + 1.0))
    assert p.lo == pytest.approx(10 / 8) and p.hi == pytest.approx(10 / 6.5)
    assert "a thread prefetcher added 1.00 ms" in p.reason and "data wait 40 %" in p.reason
    r = dataclasses.replace(RATES, worker_loader_ms={2: Rate(4.0, 3.0, 5.0, "measured here: test")})
    w = predict_technique("workers2", OPTIONS["workers2"].overrides, OPTIONS["workers2"].axes, b, None, r)
    assert w.speedup == pytest.approx(10 / (6 + 4.0)) and "2 loader worker processes added 4.00 ms" in w.reason


def _batch_fit(workload="vision"):
    return {"workload": workload, "technique": "prune50", "axis": "inference", "base_overhead_ms": 1.0,
            "base_ms_per_mmac": 1.0, "tech_overhead_ms": 1.0, "tech_ms_per_mmac": 0.25}


def test_a_map_rate_is_read_at_the_calls_batch_not_the_maps():
    """A fit is per call at its ladder's batch: at 8x the batch the call does 8x the work and the fixed overhead
    weighs less, so the speedup moves toward the slopes' ratio."""
    from lab.doctor.rates import CrossoverMap

    cmap = CrossoverMap(env={}, rows=[], fits=[_batch_fit()], batches={"vision": 32})
    at_map = cmap.rate("prune_channels50", "inference", 1e6, "vision", batch=32)
    assert at_map.value == pytest.approx(2.0 / 1.25)
    assert cmap.rate("prune_channels50", "inference", 1e6, "vision").value == pytest.approx(at_map.value)
    big = cmap.rate("prune_channels50", "inference", 1e6, "vision", batch=256)
    assert big.value == pytest.approx(9.0 / 3.0) and "batch 256 vs the map's 32" in big.source
    old = CrossoverMap(env={}, rows=[], fits=[_batch_fit()])  # a map that does not say its batch: read as is
    assert old.rate("prune_channels50", "inference", 1e6, "vision", batch=256).value == pytest.approx(at_map.value)


@settings(max_examples=40, deadline=None)
@given(mmac=st.floats(1e-3, 1e3), small=st.integers(1, 512), factor=st.integers(2, 64))
def test_a_larger_batch_moves_the_map_rate_from_the_overhead_ratio_toward_the_slope_ratio(mmac, small, factor):
    from lab.doctor.rates import CrossoverMap

    cmap = CrossoverMap(env={}, rows=[], fits=[_batch_fit()], batches={"vision": 64})
    lo = cmap.rate("prune_channels50", "inference", mmac * 1e6, "vision", batch=small).value
    hi = cmap.rate("prune_channels50", "inference", mmac * 1e6, "vision", batch=small * factor).value
    assert 1.0 <= lo <= hi * (1 + 1e-9) <= 4.0 * (1 + 1e-9)  # overhead ratio 1, slope ratio 4


def test_load_crossover_reads_each_ladders_batch(tmp_path):
    path = tmp_path / "crossover.json"
    path.write_text(json.dumps({"rows": [], "fits": [_batch_fit()], "rungs": [
        {"workload": "vision", "rung": "xs", "batch_size": 32}, {"workload": "ctr", "rung": "xs", "batch_size": 512}]}))
    assert load_crossover(path).batches == {"vision": 32, "ctr": 512}
