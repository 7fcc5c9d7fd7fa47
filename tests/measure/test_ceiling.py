"""Every speedup beside its ceiling: planted card and planted records give the exact ceiling and share, the
ablation's arm rows and the crossover map's rows carry them, and a real tiny run has a share above 0."""

from __future__ import annotations

import math

import pytest

from lab import RunConfig, run
from lab.ablation.record import build_record
from lab.ablation.summary import summarize
from lab.crossover.mapping import attach_ceilings
from lab.measure.ceiling import amdahl, config_parts, gemm_ratio, share_of_ceiling, technique_ceiling
from lab.result import RunResult

CARD = {"hardware_id": "planted", "measured_at": "t",
        "peaks": {"gemm_gflops": {"fp32": {"1": 100.0, "all": 200.0}, "bf16": {"1": 400.0, "all": 800.0},
                                  "fp16": {"1": 2.0}, "int8": {"1": 800.0, "all": 1600.0}}}}
#: A 10 ms step: 2 ms data wait, 3 + 3 ms forward / backward, 1 ms optimizer, 1 ms outside the named phases.
PHASES = {"total": 10.0, "data_wait": 2.0, "forward": 3.0, "backward": 3.0, "optimizer": 1.0}


def test_each_technique_gets_the_ceiling_its_card_and_phases_allow():
    assert gemm_ratio(CARD, "bf16", 1) == 4.0 and gemm_ratio(CARD, "int8", 1) == 8.0
    assert gemm_ratio(CARD, "fp8", 1) is None and gemm_ratio(None, "bf16") is None
    assert amdahl(PHASES, {"data_wait": math.inf}) == pytest.approx(10 / 8)
    assert amdahl(PHASES, {}, rest=2.0) == pytest.approx(2.0)  # everything twice as fast
    bf16 = [{"precision.dtype": "bf16"}]
    # forward + backward (6 of 10 ms) 4x faster: 4 + 6 / 4 = 5.5 ms -> 10 / 5.5
    assert technique_ceiling(bf16, "train_step", card=CARD, threads=1, phases_ms=PHASES)["ceiling"] == \
        pytest.approx(10 / 5.5)
    whole = technique_ceiling(bf16, "train_step", card=CARD, threads=1)  # a step timed whole: the ratio alone
    assert whole["ceiling"] == 4.0 and "not split into phases" in whole["basis"]
    auto = technique_ceiling([{"precision.dtype": "auto"}], "inference", card=CARD, threads=1)
    assert auto["ceiling"] == 4.0  # the best of fp32 / bf16 / fp16 (fp16 at 0.02x)
    assert technique_ceiling([{"quant.method": "static"}], "inference", card=CARD, threads=1)["ceiling"] == 8.0
    half = technique_ceiling([{"quant.method": "static"}], "inference", card=CARD, threads=1, int8_mac_share=0.5)
    assert half["ceiling"] == pytest.approx(1 / (0.5 + 0.5 / 8))  # Amdahl over the MACs: the float half stays
    assert technique_ceiling([{"quant.method": "static"}], "train_step", card=CARD)["ceiling"] is None
    channels = {"prune.method": "structured_channels", "prune.amount": 0.5}
    assert technique_ceiling([channels], "inference", card=None, macs_ratio=3.0)["ceiling"] == 3.0
    assert technique_ceiling([{"prune.method": "l1_unstructured"}], "inference", card=None)["ceiling"] == 1.0
    stack = technique_ceiling([channels, {"quant.method": "static"}], "inference", card=CARD, threads=1,
                              macs_ratio=3.0)
    assert stack["ceiling"] == 24.0  # 3x fewer MACs, each 8x faster in int8
    assert technique_ceiling([{"data.loader": "thread"}], "train_step", card=None,
                             phases_ms=PHASES)["ceiling"] == pytest.approx(1.25)  # the ideal-loader bound
    assert technique_ceiling([{"compute.fused_optimizer": True}], "train_step", card=None,
                             phases_ms=PHASES)["ceiling"] == pytest.approx(10 / 9)  # Amdahl: optimizer removed
    assert "phases" in technique_ceiling([{"data.loader": "thread"}], "train_step", card=None)["why"]
    assert technique_ceiling(bf16, "train_step", card=None)["why"] == "no card"  # never a guessed ceiling
    assert "compute.compile" in technique_ceiling([{"compute.compile": True}], "train_step", card=CARD)["why"]


def test_the_share_says_why_when_low_or_above_the_ceiling():
    assert share_of_ceiling(3.0, 4.0) == (0.75, "")
    share, why = share_of_ceiling(1.2, 4.0, utilisation=0.03)
    assert share == pytest.approx(0.3) and "not GEMM-bound" in why and "3.0%" in why
    assert "layer too small" in share_of_ceiling(1.2, 4.0, regime="dispatch-bound")[1]
    assert "overhead" in share_of_ceiling(1.2, 4.0, utilisation=0.5, regime="compute-bound")[1]
    assert "above the ceiling" in share_of_ceiling(5.0, 4.0)[1]
    assert share_of_ceiling(0.5, 0.02) == (None, "the ceiling is 0.02x: this technique cannot pay on this machine")
    assert share_of_ceiling(None, 4.0)[0] is None and share_of_ceiling(2.0, None) == (None, "no ceiling")


def _record(cfg: dict, total_ms: float, latency_ms: float = 8.0) -> RunResult:
    phases = PHASES if total_ms == PHASES["total"] else {"total": total_ms}
    return RunResult(run_id="r" * 32, config=cfg, env={"hardware_id": "planted", "machine_card": CARD,
                                                       "torch_threads": 1},
                     metric_name="accuracy", metric=0.9, warmup_steps=0, batch_size=10, train_time_s=1.0,
                     step_times_ms={k: [v] * 3 for k, v in phases.items()}, latency_ms={"batch_256": [latency_ms] * 3},
                     details={"utilisation": {"inference": {"share": 0.05}, "train_step": {"share": 0.4}}})


def test_the_ablations_arm_rows_carry_the_exact_ceiling_and_share():
    base = RunConfig(workload="mlp").to_dict()
    arms = {"baseline": (base, 10.0, 8.0),
            "bf16": ({**base, "precision": {**base["precision"], "dtype": "bf16"}}, 6.875, 8.0),
            "prefetch": ({**base, "data": {**base["data"], "loader": "thread"}}, 9.0, 8.0),
            "int8_static": ({**base, "quant": {**base["quant"], "method": "static"}}, 10.0, 4.0)}
    assert config_parts(arms["bf16"][0], base) == [{"precision.dtype": "bf16"}]
    runs = {arm: [_record(cfg, t, lat)] for arm, (cfg, t, lat) in arms.items()}
    df = summarize(runs, axes={"int8_static": ("inference", "size")}).set_index("arm")
    bf16 = df.loc["bf16"]  # step 10 / 6.875 ms = 1.4545x of an Amdahl ceiling of 10 / 5.5 ms: 80 %
    assert bf16["ceiling"] == pytest.approx(10 / 5.5) and bf16["share_of_ceiling"] == pytest.approx(0.8)
    assert bf16["share_why"] == "" and "forward 30%" in bf16["ceiling_basis"]
    pre = df.loc["prefetch"]  # 10 / 9 ms = 1.11x of the ideal-loader bound 1.25x
    assert pre["ceiling"] == pytest.approx(1.25) and pre["share_of_ceiling"] == pytest.approx(10 / 9 / 1.25)
    q = df.loc["int8_static"]  # inference 8 / 4 ms = 2x of the card's int8 ratio 8x: 25 %, baseline at 5 %
    assert q["ceiling"] == 8.0 and q["share_of_ceiling"] == pytest.approx(0.25) and "not GEMM-bound" in q["share_why"]
    said = " ".join(build_record(df.reset_index(), runs).arms["bf16"].figure_lines())  # what every view shows
    assert "80 % of its ceiling 1.82x on this machine (card: bf16 GEMM peak 4.00x fp32" in said
    assert math.isnan(df.loc["baseline", "ceiling"])  # the baseline and A/A arm: nothing to bound


def test_the_crossover_maps_rows_carry_the_ceiling_or_say_no_card():
    rows = [{"workload": "mlp", "rung": "xl", "technique": t, "axis": a, "speedup": s, "regime": "compute-bound",
             "why": w} for t, a, s, w in (("bf16", "train_step", 2.0, ""), ("int8_eager", "inference", 6.0, ""),
                                          ("prune_channels50", "inference", 3.0, "50% removed: 3.60x fewer MACs"),
                                          ("workers1", "train_step", 1.1, ""))]
    m = attach_ceilings({"rows": [dict(r) for r in rows], "threads": 1}, CARD)
    got = {r["technique"]: r for r in m["rows"]}
    assert (got["bf16"]["ceiling"], got["bf16"]["share_of_ceiling"]) == (4.0, 0.5)
    assert (got["int8_eager"]["ceiling"], got["int8_eager"]["share_of_ceiling"]) == (8.0, 0.75)
    assert got["prune_channels50"]["ceiling"] == pytest.approx(3.6)
    assert got["workers1"]["ceiling"] is None and "phases" in got["workers1"]["ceiling_basis"]
    blind = attach_ceilings({"rows": [dict(r) for r in rows], "env": {}}, None)["rows"]
    assert blind[0]["ceiling"] is None and blind[0]["ceiling_basis"] == "no card"


def test_a_real_tiny_run_has_a_share_above_zero(toy_workload):
    """Two real toy runs (a fused optimizer against the baseline): the ceiling from their measured phases."""
    cfgs = {"baseline": RunConfig(workload="toy", size="tiny", threads=1, max_steps=12, warmup_steps=2,
                                  latency_repeats=3)}
    cfgs["fused"] = RunConfig.from_dict({**cfgs["baseline"].to_dict(), "compute": {
        **cfgs["baseline"].to_dict()["compute"], "fused_optimizer": True}})
    runs = {arm: [run(cfg)] for arm, cfg in cfgs.items()}
    row = summarize(runs).set_index("arm").loc["fused"]
    assert row["ceiling"] > 1 and "optimizer" in row["ceiling_basis"]
    assert row["share_of_ceiling"] > 0
