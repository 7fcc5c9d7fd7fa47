"""The ablation's tables as a person reads them: readable column names with units, every ratio the arm's
record's text (:mod:`lab.ablation.record`: rounded to its interval's precision, each interval next to its
estimate, "2.1x smaller" / "1.67x fewer" never an inverted ratio), "n = 1: no interval" instead of a
zero-width one, an axis the arm cannot change as "does not apply", an arm the capability gate refused
before training (:class:`lab.precision.NotApplicable`) as "does not apply here" with its reason, and the
"why" as sentences under the table rather than a column. The raw table (``summarize``'s, all 36 columns at
full precision) stays the CSV download.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from lab.ablation.record import AblationRecord, ArmRecord, Ratio, build_record, fmt_ratio
from lab.ablation.summary import MIN_RUNS, SPEED_AXIS, stored_latency_key, summarize
from lab.measure import bootstrap_ci, bootstrap_ratio_ci, median
from lab.measure.stats import as_float
from lab.result import RunResult

#: Readable names of the speed columns.
SPEED_NAMES = {"train_speedup": "Training speedup", "step_speedup": "Step speedup",
               "infer_speedup": "Inference speedup"}
AXIS_NAMES = {"train_step": "training step", "train": "training", "inference": "inference", "size": "size"}


def _sig(x: Any, digits: int = 3, unit: str = "") -> str:
    v = as_float(x)
    return "" if math.isnan(v) else f"{v:.{digits}g}{unit}"


def _text(x: Any) -> str:
    """A text cell's value; a missing one (None, or NaN for an arm with no finished run) is empty."""
    return x if isinstance(x, str) else ""


def _speed(rec: ArmRecord, col: str) -> str:
    if rec.refused:
        return "does not apply here"
    if rec.not_run:
        return "not run"
    if SPEED_AXIS[col] not in rec.axes:
        return "does not apply"
    ratio = rec.speed.get(col)
    if ratio is None:
        return ""
    if rec.arm == "baseline":
        return "1x (reference)"
    if not ratio.has_ci:
        return f"{ratio.text} (n = {rec.n_ok}: no interval)"
    return ratio.text


#: Metric names as a person reads them (a workload's ``metric_name``).
METRIC_WORDS = {"auc": "AUC", "accuracy": "Accuracy", "top1": "Top-1 accuracy"}


def change_column(df: pd.DataFrame) -> str:
    """The accuracy column's header: the metric's own name, its unit and its direction ("AUC change (pt, 95 % CI;
    higher is better)"): the table stores a loss, a person reads a change of a named metric."""
    names = [str(n) for n in df.get("metric_name", pd.Series(dtype=object)).dropna().unique()]
    units = [str(u) for u in df.get("loss_unit", pd.Series(dtype=object)).dropna().unique()]
    name = METRIC_WORDS.get(names[0], names[0]) if len(names) == 1 else "Metric"
    lower = bool(units) and units[0] not in ("pt", "points")
    unit = "" if lower else "pt, "
    return f"{name} change ({unit}95 % CI; {'lower' if lower else 'higher'} is better)"


def _change(row: pd.Series) -> str:
    """The arm's metric change against the baseline with its interval, sign as the metric moves (a higher-is-better
    metric's loss of 0.4 pt reads -0.4): the stored loss is positive-is-worse for every metric."""
    est = as_float(row.get("acc_loss_pt"))
    if math.isnan(est):
        return ""
    flip = -1.0 if str(row.get("loss_unit") or "pt") in ("pt", "points", "nan", "") else 1.0
    lo, hi = sorted((flip * as_float(row.get("acc_loss_lo")), flip * as_float(row.get("acc_loss_hi"))))
    value = flip * est + 0.0  # -0.0 reads 0
    if math.isnan(lo) or math.isnan(hi):
        return f"{value:+.2g}" + ("" if row["arm"] == "baseline" else " (no interval)")
    return f"{value:+.2g} [{lo + 0.0:+.2g}, {hi + 0.0:+.2g}]"


def _status(rec: ArmRecord) -> str:
    if rec.refused:
        return "does not apply here"
    return "not run" if rec.not_run else rec.status


def _of_ceiling(rec: ArmRecord) -> str:
    """"48 % of 4.4x": the arm's speedup as a share of what the card and the baseline allow on its main axis."""
    if rec.share_of_ceiling is None or rec.ceiling is None:
        return ""
    return f"{100 * rec.share_of_ceiling:.0f} % of {rec.ceiling:.2g}x"


def ablation_table(df: pd.DataFrame, record: AblationRecord | None = None) -> pd.DataFrame:
    """One row per arm, humanised (see the module docstring); every ratio is the record's text
    (:mod:`lab.ablation.record`), so the table says what the bars, the details and the why say."""
    record = record or build_record(df)
    rows = []
    change = change_column(df)
    for _, r in df.iterrows():
        rec = record.arms[str(r["arm"])]
        rows.append({
            "Arm": rec.label,
            "Techniques": ", ".join(r["techniques"]) if isinstance(r.get("techniques"), (list, tuple))
            else str(r.get("techniques") or "none"),
            "Competes on": ", ".join(AXIS_NAMES.get(a, a) for a in rec.axes),
            "Runs ok": f"{rec.n_ok}/{rec.n_runs}" if not math.isnan(as_float(r.get("n_runs"))) else "",
            **{f"{name} (x, 95 % CI)": _speed(rec, col) for col, name in SPEED_NAMES.items()},
            change: _change(r),
            "Seed noise (pt)": _sig(r.get("noise_pt"), 2),
            "Size": rec.size.text if rec.size else "",
            "MACs run (dense kernels)": rec.macs.text if rec.macs else "",
            "MACs if zeros skipped": rec.macs_if_skipped.text if rec.macs_if_skipped else "",
            "Of its ceiling": _of_ceiling(rec),
            "GEMM peak used, train step (%)": _sig(100 * as_float(r.get("train_utilisation")), 2),
            "Peak memory (MB)": _sig(r.get("peak_memory_mb"), 3),
            "Training time (s)": _sig(r.get("train_time_s"), 3),
            "Status": _status(rec),
        })
    out = pd.DataFrame(rows)
    return out.loc[:, [c for c in out.columns if (out[c] != "").any()]] if len(out) else out


def why_lines(df: pd.DataFrame, record: AblationRecord | None = None) -> list[str]:
    """One sentence per arm: the record's figures that explain it (the paired inference, size, MACs) and its
    runs' "why" tags, each said once with the count of runs that said it, without numbers of their own (the
    record states each figure once, so a tag's first-run number cannot contradict the table)."""
    record = record or build_record(df)
    out = []
    for rec in record.arms.values():
        if rec.refused:
            out.append(f"**{rec.arm}** does not apply here (refused before training): {rec.refused}")
            continue
        said = [*rec.figure_lines(), *rec.why] if rec.arm != "baseline" else list(rec.why)
        if said:
            out.append(f"**{rec.arm}**: " + "; ".join(said))
    return out


def effects_table(effects: pd.DataFrame) -> pd.DataFrame:
    """The factorial effects, humanised: term, techniques, speed effect with its CI, verdict, accuracy effect."""
    terms = {"main": "main effect", "2-way": "2-way interaction", "3-way": "3-way interaction"}
    return pd.DataFrame([{
        "Term": terms.get(e["term"], e["term"]),
        "Techniques": str(e["techniques"]).replace("+", " + "),
        "Speed effect (x, 95 % CI)": fmt_ratio(*(as_float(e[k]) for k in ("effect", "effect_lo", "effect_hi"))),
        "Reads as": _reads_as(e),
        "Accuracy effect (pt)": _sig_signed(e["loss_effect_pt"]),
    } for _, e in effects.iterrows()])


def _reads_as(e: pd.Series) -> str:
    """A main effect is one arm against the baseline: faster or slower, never "compound" / "cancel"."""
    if e["term"] == "main":
        return {"compound": "faster", "cancel": "slower"}.get(e["verdict"], e["verdict"])
    return e["verdict"]


def _sig_signed(x: Any) -> str:
    v = as_float(x)
    return "" if math.isnan(v) else f"{v:+.2g}"


def _median_ci(samples: list[float]) -> str:
    """``median [lo, hi]`` at 3 significant digits; one sample is no interval."""
    if len(samples) < 2:
        return f"{_sig(median(samples), 3)} (n = {len(samples)}: no interval)"
    est, lo, hi = bootstrap_ci(samples)
    return f"{est:.3g} [{lo:.3g}, {hi:.3g}]"


def _runs(x: RunResult | list[RunResult] | None) -> list[RunResult]:
    return [] if x is None else list(x) if isinstance(x, (list, tuple)) else [x]


def _seeds(rs: list[RunResult]) -> int:
    return len({(r.config or {}).get("seed") for r in rs})


def _no_interval(rs: list[RunResult]) -> str:
    """Why an accuracy loss has no interval: too few runs, or repeats of too few seeds (identical repeats of one
    seed would give a zero-width interval, which is no interval)."""
    if len(rs) >= MIN_RUNS:
        return f"{len(rs)} runs of {_seeds(rs)} seed(s): no interval"
    return f"n = {len(rs)}: no interval"


def technique_table(runs: dict[str, RunResult | list[RunResult]],
                    reference: RunResult | list[RunResult] | None = None) -> pd.DataFrame:
    """A technique notebook's side-by-side table (the MIT labs' staple): one row per arm (one run, or a list of
    interleaved repeats pooled) with its latency (median ms at the largest batch it stored), its inference
    speedup with the 95 % CI (the record's paired figure: against its own float / dense model in the same
    process, else against ``reference``), size (against ``reference``, or an int8 run's own float model:
    ``details["quant"]["size_ratio"]``), MACs per sample, and accuracy with its loss in points (the paired
    95 % CI an int8 run stores over the test set; against ``reference``, the seeds' bootstrap CI from three seeds
    each, else "no interval"). Latency and training step carry the 95 % bootstrap CI of their median over the
    arm's own samples (timed batches, measured steps): step-to-step noise, not run-to-run; the step speedup
    against ``reference`` resamples both arms' steps (a data-loading or precision notebook's headline figure)."""
    ref = _runs(reference)
    ref_steps = [t for x in ref for t in x.measured_ms()]
    rows = []
    for name, arm in runs.items():
        rs = _runs(arm)
        r, is_ref = rs[0], bool(ref) and rs == ref
        arms = {"baseline": ref or rs, name: rs}
        df = summarize(arms)
        rec = build_record(df, arms).arms[name]
        row = df.set_index("arm").loc[name]
        key = stored_latency_key(rs)
        lat = [t for x in rs for t in x.latency_ms.get(key, [])]
        quant = r.details.get("quant") or {}
        acc = (quant.get("accuracy") or {}).get(r.metric_name) or {}
        inf = rec.paired or (rec.speed.get("infer_speedup") if ref else None)
        size = (rec.size if ref else
                Ratio(quant["size_ratio"], better="smaller", worse="larger") if quant.get("size_ratio") else None)
        if acc:
            loss = f"{acc['loss_pts']:+.2g} pt [{acc['ci_lo']:+.2g}, {acc['ci_hi']:+.2g}]"
        elif ref and not math.isnan(as_float(row["acc_loss_lo"])) and min(_seeds(rs), _seeds(ref)) >= MIN_RUNS:
            loss = f"{row['acc_loss_pt']:+.2g} pt [{row['acc_loss_lo']:+.2g}, {row['acc_loss_hi']:+.2g}]"
        else:
            loss = f"{row['acc_loss_pt']:+.2g} pt ({_no_interval(rs)})" if ref else ""
        steps = [t for x in rs for t in x.measured_ms()]
        step_up = Ratio(*bootstrap_ratio_ci(ref_steps, steps)) if ref_steps and steps and not is_ref else None
        metric = row.get("metric")
        rows.append({
            "Run": name, "Workload": r.workload,
            "Latency (ms, 95 % CI)": f"{_median_ci(lat)} at {key.replace('_', ' ')}" if lat else "",
            "Training step (ms, 95 % CI)": _median_ci(steps) if steps else "",
            "Step speedup (x, 95 % CI)": "1x (reference)" if is_ref else step_up.text if step_up else "",
            "Inference speedup (x, 95 % CI)": "1x (reference)" if is_ref and inf is not None and not rec.paired
            else inf.text if inf is not None else "",
            "Against": rec.paired_what or ("the reference run" if inf is not None else ""),
            "Size": size.text if size is not None else "",
            "MACs per sample": _sig(r.macs_per_sample, 3),
            "MACs if zeros skipped": rec.macs_if_skipped.text if rec.macs_if_skipped else "",
            "Metric": f"{r.metric_name} {_sig(metric, 3)}" if metric is not None and _sig(metric) else "",
            "Accuracy loss (95 % CI)": loss,
        })
    out = pd.DataFrame(rows)
    return out.loc[:, [c for c in out.columns if (out[c] != "").any()]] if len(out) else out


def crossover_table(the_map: dict[str, Any], workload: str, axis: str = "inference") -> pd.DataFrame:
    """07's side-by-side table: one row per (rung, technique) of ``workload`` on ``axis`` in a crossover map
    (:func:`lab.crossover.build_map`), smallest model first: parameters, MACs per sample, the fp32 and the
    technique's median time, the speedup with its 95 % CI (the map's interleaved repeats) and the regime.
    Accuracy is not a column: the map times steps, it trains nothing to convergence."""
    rows = sorted((r for r in the_map.get("rows", []) if r["workload"] == workload and r["axis"] == axis),
                  key=lambda r: (r["params"], r["technique"]))
    out = pd.DataFrame([{
        "Rung": r["rung"], "Technique": r["technique"], "Parameters": f"{r['params']:,}",
        "MACs per sample": _sig(r.get("macs_per_sample"), 3),
        "fp32 (ms)": _sig(r.get("base_ms"), 3), "Technique (ms)": _sig(r.get("tech_ms"), 3),
        "Speedup (x, 95 % CI)": Ratio(*(as_float(r.get(k)) for k in ("speedup", "ci_lo", "ci_hi"))).text
        if r.get("speedup") is not None else "not measured",
        "Regime": _text(r.get("regime")),
    } for r in rows])
    return out
