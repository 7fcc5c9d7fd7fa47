"""Goals from the machine, not constants: planted benchmark envelopes (a card, map rows, figures as the
benchmarks write them) give the exact goal, ceiling and share; a result without a card says "no card"; a retired
constant keeps its old goal beside the reason; the report counts met before and after."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from lab import bench as br
from lab import goals
from lab.crossover.report import figures

CARD = {"hardware_id": "planted", "peaks": {"gemm_gflops": {"fp32": {"1": 100.0}, "bf16": {"1": 400.0},
                                                            "int8": {"1": 800.0}}}}
ENV = {"hardware_id": "planted-2c", "device_name": "Planted CPU", "git_sha": "abc", "machine_card": CARD}


def _row(tech: str, axis: str, speedup: float, why: str = "") -> dict:
    return {"workload": "mlp", "rung": "xl", "params": 7.2e6, "technique": tech, "axis": axis, "speedup": speedup,
            "ci_lo": speedup * 0.9, "ci_hi": speedup * 1.1, "base_ms": 10.0, "tech_ms": 10.0 / speedup,
            "regime": "compute-bound", "why": why}


def _fig(name: str, value: float, goal: str | None, met: bool | None, note: str = "") -> dict:
    return {"name": name, "value": value, "unit": "x", "ci95": None, "goal": goal, "met": met, "note": note}


# the committed maps' vocabulary (dynamic_int8, prune50) and their constants, as the benchmark wrote them
ROWS = [_row("bf16", "train_step", 2.5), _row("dynamic_int8", "inference", 3.0),
        _row("prune50", "inference", 3.0, "50% of the channels removed: 3.60x fewer MACs")]
FIGS = [_fig("mlp xl (7.2 M params) bf16 train step", 2.5, ">= 1.8x", True),
        _fig("mlp xl (7.2 M params) dynamic_int8 inference", 3.0, ">= 2.5x", True),
        _fig("mlp xl (7.2 M params) prune50 inference", 3.0, ">= 2.70x (0.75 x its MACs ratio)", True)]


def test_crossover_goals_are_shares_of_the_cards_gemm_ratio_and_of_the_macs_ratio():
    env = {"benchmark": "crossover", "threads": 1, "env": ENV, "rows": ROWS}
    bf16, int8, prune = (goals.derive(env, f) for f in FIGS)
    # bf16 GEMMs 4x fp32 on this card: >= 2x needed, 2.5x measured is 62.5 % of the ceiling
    assert bf16["goal"] == ">= 2.00x (50 % of the card's bf16/fp32 GEMM ratio 4.00x)" and bf16["met"] is True
    assert (bf16["ceiling"], bf16["share_of_ceiling"], bf16["goal_before"]) == (4.0, 0.625, ">= 1.8x")
    # int8 GEMMs 8x: >= 4x needed; 3x (met against the old 2.5x) is 37.5 % of the ceiling, and says why
    assert int8["goal"].startswith(">= 4.00x (50 %") and int8["met"] is False and int8["met_before"] is True
    assert int8["share_of_ceiling"] == pytest.approx(0.375) and int8["share_why"].startswith("overhead")
    assert prune["goal"] == ">= 2.70x (75 % of its MACs ratio 3.60x)" and prune["met"] is True
    assert prune["ceiling"] == pytest.approx(3.6) and prune["share_of_ceiling"] == pytest.approx(3.0 / 3.6)
    blind = goals.derive({**env, "env": {"hardware_id": "old"}}, FIGS[0])  # measured before the card existed
    assert blind["goal"] == ">= 50 % of the card's bf16/fp32 GEMM ratio: no card" and blind["met"] is None
    assert blind["ceiling"] is None and br.ceiling_cell(blind) == "no card"
    # a map written from now on carries the same goal in its own figures
    new = {f["name"]: f for f in figures({"rows": [_row("bf16", "train_step", 2.5)], "crossovers": [],
                                          "env": ENV, "threads": 1})}
    assert new["mlp xl (7.2 M params) bf16 train step"]["goal"] == bf16["goal"]
    assert "62 % of its ceiling 4.00x" in new["mlp xl (7.2 M params) bf16 train step"]["note"]


def test_pruning_loader_retired_and_kept_goals():
    prune = goals.derive({"benchmark": "pruning", "env": ENV}, _fig(
        "vision: channels 30% inference speedup", 1.21, ">= 0.7 x MACs ratio", False,
        "layers too small to be compute-bound: (2.10x fewer MACs, 1.21x measured)"))
    assert prune["goal"] == ">= 1.47x (70 % of its MACs ratio 2.10x)" and prune["ceiling"] == 2.1
    assert prune["share_of_ceiling"] == pytest.approx(1.21 / 2.1) and prune["share_why"] == "layer too small"
    loader = goals.derive({"benchmark": "data_loading", "env": ENV},
                          _fig("auto-tuned pick: / in-memory", 0.97, ">= 0.95", True))
    assert "ideal-loader bound" in loader["goal"] and loader["share_of_ceiling"] == 0.97 and loader["met"] is True
    gradual = goals.derive({"benchmark": "pruning", "env": ENV},
                           _fig("ctr: gradual - one-shot at 80 % (auc)", -0.03, ">= 1 pt", False))
    assert gradual["goal"] is None and gradual["met"] is None and gradual["goal_kind"] == "retired"
    assert gradual["goal_before"] == ">= 1 pt" and "no physical basis" in gradual["retired_why"]
    assert br.met_cell(gradual).startswith("retired") and br.goal_cell(gradual) == "~~>= 1 pt~~"
    quant = goals.derive({"benchmark": "quantization", "env": ENV}, _fig(
        "ctr dynamic speedup vs fp32, batch 64", 0.97, ">= 2.5x with <= 0.5 pt loss", False, "loss 0.02 pts [0, 1]"))
    assert quant["goal"].startswith("loss <= 0.5 pt") and quant["met"] is True  # the accuracy half stays
    assert quant["ceiling"] == 8.0 and quant["share_of_ceiling"] == pytest.approx(0.97 / 8)
    kept = goals.derive({"benchmark": "ablation", "env": ENV}, _fig("default ablation wall time", 13.0, "<= 120 s",
                                                                    True))
    assert (kept["goal"], kept["met"], kept["goal_kind"]) == ("<= 120 s", True, "absolute")


def test_the_report_counts_met_before_and_after_and_lists_the_retired(tmp_path):
    for name, envelope in (("crossover", {"benchmark": "crossover", "quick": False, "threads": 1, "env": ENV,
                                          "rows": ROWS, "figures": FIGS}),
                           ("pruning", {"benchmark": "pruning", "quick": False, "env": ENV, "figures": [
                               _fig("ctr: gradual - one-shot at 80 % (auc)", -0.03, ">= 1 pt", False)]})):
        (tmp_path / f"{name}.json").write_text(json.dumps(envelope))
    _, md_path, rep = br.write_report(tmp_path)
    assert rep["goals"] == {"before": (3, 4), "after": (2, 3)}  # int8 now short of its ceiling; gradual retired
    md = md_path.read_text()
    assert "## Goals from the machine" in md and "**2 of 3**" in md and "3 of 4 with the constants" in md
    assert "Retired constants" in md and "gradual - one-shot at 80 % (auc) (>= 1 pt)" in md
    assert "| 62 % of 4x |" in md and "met against `>= 2.5x` -> not met" in md


def test_the_report_table_reads_rows_back_through_pandas_where_a_missing_why_is_nan():
    """The dashboard's report table reads rows from a DataFrame: a share with no why there is NaN, not None (the
    Performance report page raised on ``NaN.split``)."""
    from lab.plots.report import report_table

    row = {"hardware": "hw", "family": "precision", "name": "mlp xl bf16 train step", "value": 2.1, "unit": "x",
           "share_of_ceiling": 0.9, "ceiling": 2.3, "share_why": None}
    assert br.ceiling_cell({**row, "share_why": float("nan")}) == "90 % of 2.3x"
    table = report_table(pd.DataFrame([row, {**row, "share_why": "overhead: small layers"}]))
    assert list(table["of ceiling"]) == ["90 % of 2.3x", "90 % of 2.3x (overhead)"]
