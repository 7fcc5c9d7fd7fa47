"""Plot functions return figures whose traces carry the results' numbers."""

from __future__ import annotations

import pytest

pytest.importorskip("plotly")

from lab.plots import loss_curves, phase_breakdown  # noqa: E402
from lab.result import RunResult  # noqa: E402


def _result(run_id: str, forward: float, wait: float) -> RunResult:
    n = 6
    samples = {"data_wait": [wait] * n, "forward": [forward] * n, "backward": [1.0] * n, "optimizer": [0.5] * n,
               "comm": [0.0] * n, "total": [wait + forward + 1.5 + 0.25] * n}
    return RunResult(run_id=run_id, config={"size": "tiny", "seed": 0}, env={}, workload="ctr", steps=n,
                     warmup_steps=1, batch_size=8, step_times_ms=samples, losses=[1.0, 0.5, 0.25])


def test_phase_breakdown_stacks_phases_and_other():
    fig = phase_breakdown([_result("a" * 32, 2.0, 0.5), _result("b" * 32, 4.0, 0.0)], labels=["A", "B"])
    names = [t.name for t in fig.data]
    assert names == ["data_wait", "forward", "backward", "optimizer", "other"]  # comm is all zero: no trace
    forward = fig.data[1]
    assert list(forward.x) == [2.0, 4.0] and list(forward.y) == ["A", "B"]
    assert list(fig.data[-1].x) == pytest.approx([0.25, 0.25])


def test_loss_curves_one_line_per_run():
    fig = loss_curves([_result("a" * 32, 1, 0), _result("b" * 32, 1, 0)])
    assert len(fig.data) == 2 and list(fig.data[0].y) == [1.0, 0.5, 0.25]


def _ablation_table():
    import pandas as pd

    from lab.ablation import COLUMNS

    rows = [("baseline", 1.0, 1.0, 1.0, 0.0, True, 0.2), ("fast", 2.0, 1.5, 2.5, 0.5, False, None),
            ("broken", None, None, None, None, None, None)]
    out = []
    for arm, s, lo, hi, loss, noise, noise_pt in rows:
        row = {c: None for c in COLUMNS} | {"arm": arm, "status": "error" if s is None else "ok", "why": "",
                                             "acc_loss_pt": loss, "within_noise": noise, "noise_pt": noise_pt}
        for k in ("train_speedup", "infer_speedup"):
            row |= {k: s, f"{k}_lo": lo, f"{k}_hi": hi}
        out.append(row)
    return pd.DataFrame(out)


def test_speedup_vs_accuracy_has_whiskers_front_and_noise_band():
    from lab.plots import speedup_vs_accuracy

    fig = speedup_vs_accuracy(_ablation_table(), front=["fast", "baseline"], budget_pt=1.0)
    front, within, outside = fig.data
    assert front.name == "Pareto front" and list(front.x) == [1.0, 2.0]
    # one trace per noise class: the legend is the colour key (not the title); the error row is not plotted
    assert (within.name, list(within.text)) == ("within seed noise", ["baseline"])
    assert (outside.name, list(outside.text)) == ("outside seed noise", ["fast"])
    assert list(outside.error_x.array) == [0.5] and list(outside.error_x.arrayminus) == [0.5]
    assert len(fig.layout.title.text) <= 40 and fig.layout.title.subtitle.text
    rect = [s for s in fig.layout.shapes if s.type == "rect"][0]
    assert (rect.y0, rect.y1) == (-0.2, 0.2)  # the baseline's seed spread


def test_speedup_bars_one_trace_per_speed_with_ci():
    from lab.plots import speedup_bars

    fig = speedup_bars(_ablation_table())
    assert len(fig.data) == 2 and list(fig.data[1].x) == [1.0, 2.0]  # horizontal: arm names on the y axis
    assert list(fig.data[1].y) == ["baseline", "fast"] and fig.data[1].orientation == "h"
    assert list(fig.data[0].error_x.array) == [0.0, 0.5]
    assert "x" in fig.layout.xaxis.title.text and fig.layout.xaxis.title.text != "x"  # a unit, not a bare "x"


def test_wide_whiskers_are_clipped_and_the_clipping_is_drawn():
    from lab.plots import speedup_bars, speedup_vs_accuracy

    df = _ablation_table()
    df.loc[1, ["train_speedup_lo", "train_speedup_hi"]] = [0.09, 8.7]  # one noisy run's interval
    fig = speedup_bars(df)
    lo, hi = fig.layout.xaxis.range
    assert hi < 8.7 and hi >= 2.0  # the axis keeps to the estimates, not the one wild whisker
    train = fig.data[0]
    assert 2.0 + train.error_x.array[1] <= hi  # the whisker ends at the edge
    marker = next(t for t in fig.data if t.name.startswith("CI clipped"))
    assert list(marker.y) == ["fast"] and "8.7" in marker.hovertext[0]
    scatter = speedup_vs_accuracy(df, front=None)
    names = [t.name for t in scatter.data]
    assert "diamond: CI clipped (hover)" in names
    fast = next(t for t in scatter.data if t.name == "outside seed noise")
    assert list(fast.marker.symbol) == ["diamond"] and "clipped" in fast.customdata[0][0]


def test_every_point_is_labelled_even_with_many_arms():
    import pandas as pd

    from lab.plots import speedup_vs_accuracy

    df = _ablation_table()
    many = pd.concat([df.iloc[[0]]] + [df.iloc[[1]].assign(arm=f"arm{i}") for i in range(8)], ignore_index=True)
    fig = speedup_vs_accuracy(many)
    points = [t for t in fig.data if t.type == "scatter" and t.text is not None and t.name != "Pareto front"]
    assert all(t.mode == "markers+text" for t in points)  # issue 31: nine unlabeled points read as a puzzle
    assert sorted(x for t in points for x in t.text) == sorted(["baseline", *[f"arm{i}" for i in range(8)]])
    positions = [p for t in points for p in t.textposition]
    assert {"top center", "bottom center"} <= set(positions)  # neighbours alternate above and below
    assert "%{text}" in fig.data[-1].hovertemplate


def test_the_humanised_table_reads_as_sentences():
    from lab.plots import ablation_table
    from lab.plots.tables import why_lines

    df = _ablation_table()
    df["axes"] = ["train_step,train,inference,size", "inference,size", ""]
    df["n_ok"], df["n_runs"] = [3, 1, 0], [3, 1, 1]
    df.loc[1, ["infer_speedup_lo", "infer_speedup_hi"]] = [float("nan"), float("nan")]
    df.loc[1, "why"] = "int8 slower at batch_1 (0.56x); stayed float: wide; int8 slower at batch_1 (0.61x)"
    t = ablation_table(df).set_index("Arm")
    assert t.loc["fast", "Training speedup (x, 95 % CI)"] == "does not apply"  # not an axis it can change
    assert t.loc["fast", "Inference speedup (x, 95 % CI)"] == "2x (n = 1: no interval)"
    assert t.loc["baseline", "Runs ok"] == "3/3" and "train_speedup_lo" not in t.columns
    # said once, not once per run; a run's own figure in brackets is left to the record (one number per figure)
    assert why_lines(df) == ["**fast**: int8 slower at batch_1 (in 2 runs); layers kept in float (not swapped to "
                             "int8): `wide`"]
    # each seed's own figures in the same words (5 seeds, 5 data-bound shares): one tag, the first run's numbers
    df.loc[1, "why"] = "; ".join(f"data-bound: {p}% of the step waits for data (ideal step {m} ms)"
                                 for p, m in ((14, 8.95), (12, 9.09), (14, 8.9)))
    assert why_lines(df) == ["**fast**: data-bound: 14% of the step waits for data (ideal step 8.95 ms) (in 3 runs; "
                             "figures from the first)"]
    df.loc[1, "why"] = "data-bound: 14% of the step; pruned 50% of the channels"  # other words: two tags
    assert why_lines(df) == ["**fast**: data-bound: 14% of the step; pruned 50% of the channels"]


def test_technique_figures_show_only_what_applies():
    from lab.plots import technique_figures

    plain = _result("a" * 32, 1.0, 0.5)
    assert list(technique_figures(plain)) == ["data wait per step"]
    pruned = _result("b" * 32, 1.0, 0.5)
    pruned.details = {"pruning": {"method": "l1_unstructured", "amount": 0.5, "schedule": "oneshot",
                                "layers": {"fc": {"sparsity": 0.5, "shape": [2, 2], "nonzero": 2}}},
                      "precision": {"phases": {"train": {"loss_scale_history": [65536.0, 32768.0],
                                                         "skipped_steps": [0], "grad_norms": [1.0, 0.9]}}}}
    figs = technique_figures(pruned)
    assert set(figs) == {"data wait per step", "per-layer sparsity", "loss scale (fp16)"}
    assert list(figs["per-layer sparsity"].data[0].y) == [50.0]
    assert list(figs["loss scale (fp16)"].data[0].y) == [65536.0, 32768.0]


def test_projections_carry_the_models_validation_error_as_a_band_and_a_label():
    from lab.distributed import scaling as sm
    from lab.plots.distributed import scaling_curves

    link = sm.LINK_PRESETS["10GbE"]
    exact = [sm.ring_allreduce_s(s, 2, link.alpha_s, link.beta_s_per_byte) for s in (1e4, 1e6)]
    assert sm.held_out_errors([1e4, 1e6], [t / 1.25 for t in exact], link, 2) == pytest.approx([0.25, 0.25])
    assert sm.trust(0.46).startswith("unvalidated") and sm.trust(-0.1).startswith("validated")
    rows = sm.project_band(0.1, 100e6, [1, 8, 64], link, 0.46, overlap=0.5)
    plain = sm.project(0.1, 100e6, [1, 8, 64], link, overlap=0.5)
    assert [r["speedup"] for r in rows] == [r["speedup"] for r in plain]
    assert all(r["speedup_lo"] < r["speedup"] < r["speedup_hi"] for r in rows[1:])  # p = 1 has no comm
    fig = scaling_curves({"10GbE": rows, "NVLink": sm.project_band(0.1, 100e6, [1, 8, 64],
                                                                  sm.LINK_PRESETS["NVLink"], 0.46)}, rel_error=0.46)
    assert "UNVALIDATED" in fig.layout.title.subtitle.text
    bands = [t for t in fig.data if t.fill == "toself"]
    assert len(bands) == 2 and list(bands[0].y[:3]) == [r["speedup_hi"] for r in rows]
    lines = {t.name: t.line for t in fig.data if t.name in ("10GbE", "NVLink", "ideal (p x)")}
    assert len({(ln.color, ln.dash) for ln in lines.values()}) == 3  # distinct in colour and dash


def test_every_family_has_its_own_details_figures_and_sentences():
    from lab.plots import technique_figures, technique_notes

    r = _result("c" * 32, 1.0, 0.0)
    r.batch_size = 64
    r.details = {
        "resolved": {"batch_size": 64},
        "precision": {"requested": "auto", "resolved": "fp32", "auto": {"why": "auto chose fp32: bf16 x0.88"},
                      "capability": {"reason": "fp32 is always native"},
                      "phases": {"train": {"layer_dtypes": [{"module": "fc", "type": "Linear", "input_dtype": "float32",
                                                             "output_dtype": "bfloat16", "fp32_reason": ""}]}}},
        "quant": {"method": "static", "api": "torch.ao.quantization.quantize_fx (...)", "float_bytes": 280069,
                  "int8_bytes": 143101, "size_ratio": 1.957, "output_rel_error": 0.0117,
                  "swap": {"asked": {"fc": "Linear", "wide": "EmbeddingBag"}, "swapped": {"fc": "LinearReLU"},
                           "kept_float_reasons": {"wide": "embedding_dim < 8"}, "n_asked": 2, "n_swapped": 1},
                  "latency": {"batch_1": {"ratio": 0.56, "ci_lo": 0.08, "ci_hi": 0.65},
                              "batch_256": {"ratio": 1.5, "ci_lo": 1.2, "ci_hi": 1.9}}},
        "pruning": {"method": "l1_unstructured", "amount": 0.5, "schedule": "oneshot", "macs_ratio": 1.67,
                  "inference": {"batch": 256, "speedup": 0.99, "ci95": [0.6, 1.4]}},
        "distributed": {"world_size": 2, "backend": "gloo", "launcher": "spawn", "grad_accum_steps": 2},
    }
    r.step_times_ms["comm"] = [3.0] * 6
    figs = technique_figures(r)
    assert {"dtypes per layer", "int8 swaps", "int8 latency", "MACs vs measured", "comm vs compute"} <= set(figs)
    swaps = figs["int8 swaps"].data[0].cells.values
    assert list(swaps[2]) == ["LinearReLU", "kept float"] and list(swaps[3]) == ["", "embedding_dim < 8"]
    lat = figs["int8 latency"].data[0]
    assert list(lat.x) == [0.56, 1.5] and list(lat.error_x.array) == pytest.approx([0.09, 0.4])
    comm = figs["comm vs compute"].data
    assert comm[1].x[0] == 3.0 and comm[0].x[0] == pytest.approx(1.0 + 1.0 + 0.5)  # forward + backward + optimizer
    notes = " | ".join(technique_notes(r))
    assert "asked auto, trained in fp32" in notes and "auto chose fp32" in notes
    assert "280 kB -> 143 kB (2x smaller)" in notes and "1.7x fewer MACs" in notes
    assert "effective batch 256 = 64 per rank x 2 ranks x 2 accumulation step(s)" in notes


def test_the_tables_accuracy_column_names_the_metric_its_direction_and_reads_as_a_change():
    """ctr's metric is AUC and a negative loss is a gain: the column says "AUC change ... higher is better" and
    a loss of 4.1 pt reads -4.1, a gain +0.66 (issue 44: the page said "accuracy loss" and "-4.1 pt" for a gain)."""
    from lab.plots import ablation_table

    df = _ablation_table()
    df["metric_name"], df["loss_unit"] = "auc", "pt"
    df.loc[1, ["acc_loss_pt", "acc_loss_lo", "acc_loss_hi"]] = [4.1, 3.0, 5.0]
    t = ablation_table(df).set_index("Arm")
    col = "AUC change (pt, 95 % CI; higher is better)"
    assert t.loc["fast", col] == "-4.1 [-5, -3]" and t.loc["baseline", col] == "+0"
    df.loc[1, ["acc_loss_pt", "acc_loss_lo", "acc_loss_hi"]] = [-0.66, -0.9, -0.4]
    assert ablation_table(df).set_index("Arm").loc["fast", col] == "+0.66 [+0.4, +0.9]"
    df["metric_name"], df["loss_unit"] = "loss", "loss"  # a lower-is-better metric keeps its units and sign
    df.loc[1, ["acc_loss_pt", "acc_loss_lo", "acc_loss_hi"]] = [0.02, 0.01, 0.03]
    t = ablation_table(df).set_index("Arm")
    assert t.loc["fast", "loss change (95 % CI; lower is better)"] == "+0.02 [+0.01, +0.03]"


def test_the_full_run_has_whiskers_on_its_stacked_bars_and_a_table_at_three_digits():
    from lab.plots.projection import full_run_bars, projection_table

    rows = [{"arm": "baseline", "full run (s)": 21.4785, "lo": 20.7698, "hi": 22.4373, "training steps (s)": 21.4586,
             "evaluations (s)": 0.0, "one-off costs (s)": 0.0199, "peak memory (MB)": 426.2227, "runs": 3,
             "steps": 2560},
            {"arm": "prune50+int8_eager", "full run (s)": 20.0, "lo": 19.0, "hi": 20.0, "training steps (s)": 18.5,
             "evaluations (s)": 0.5, "one-off costs (s)": 1.0, "peak memory (MB)": None, "runs": 3, "steps": 2560}]
    fig = full_run_bars(rows, "s")
    assert [t.name for t in fig.data] == ["training steps", "evaluations", "one-off costs"]
    assert fig.layout.barmode == "stack" and list(fig.data[0].x) == ["baseline", "prune50+int8_eager"]  # names whole
    whisker = fig.data[-1].error_y  # on the top of the stack: the whole run's interval
    assert list(whisker.array) == pytest.approx([22.4373 - 21.4785, 0.0])
    assert list(whisker.arrayminus) == pytest.approx([21.4785 - 20.7698, 1.0])
    t = projection_table(rows, "s").set_index("Arm")
    assert t.loc["baseline", "Full run (s, 95 % CI)"] == "21.5 [20.8, 22.4]"
    assert t.loc["baseline", "Peak memory (MB)"] == "426" and t.loc["prune50+int8_eager", "Peak memory (MB)"] == ""
    assert t.loc["baseline", "One-off costs (s)"] == "0.0199" and t.loc["baseline", "Steps"] == "2560"


def test_where_it_pays_tables_read_in_words_and_three_digits():
    from lab.plots.scale import crossover_table, placement_table

    (row,) = placement_table([{"technique": "prune_channels50+int8_static", "axis": "inference",
                               "predicted_speedup": 2.9156, "pays": True, "loo_error": 0.4692}])
    assert row == {"Technique": "prune_channels50+int8_static", "Axis": "inference", "Predicted speedup (x)": "2.92",
                   "Pays": "yes", "Fit's error on a held-out rung": "47 %"}
    (c,) = crossover_table([{"workload": "ctr", "technique": "bf16", "axis": "train_step", "measured_params": 209434,
                             "measured_rung": "s", "predicted_params": 202005.69, "predicted_rung": "s",
                             "within_one_rung": True}])
    assert c["Axis"] == "training step" and c["Measured at (params)"] == "209,434" and c["Predicted at (params)"] \
        == "202,006" and c["Prediction within one rung"] == "yes"
    assert not any("_" in k for k in [*row, *c])  # no snake_case header


def test_the_loading_table_reads_the_chart_s_median_step_beside_the_share_of_all_time():
    """Both figures from the same measured steps, each named for what it is: a median step that waits 1 ms, and a
    share of all measured time that one long stall makes large (the page said "waits 20.6 %" beside ~1 ms)."""
    from lab.plots.data import loader_row, phase_bars
    from lab.result import RunResult

    wait = [50.0] + [1.0] * 9  # the first measured step stalls on an empty buffer
    res = RunResult(run_id="x" * 32, config={}, env={}, step_times_ms={"total": [w + 18.0 for w in wait],
                                                                 "data_wait": wait}, warmup_steps=0)
    row = loader_row("thread", res)
    assert row["Median step (ms)"] == "19" and row["Data wait in the median step (ms)"] == "1"
    assert row["Data wait, share of all measured time"] == f"{100 * 59 / (59 + 180):.1f} %"
    fig = phase_bars({"thread": {p: res.measured_ms(p) for p in res.step_times_ms}}, skip=0)
    assert fig.data[0].name == "data_wait" and list(fig.data[0].y) == [1.0]  # the chart's slice is the table's
