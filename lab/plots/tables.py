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
from lab.ablation.summary import SPEED_AXIS, stored_latency_key, summarize
from lab.measure import bootstrap_ci, bootstrap_ratio_ci, median
from lab.result import RunResult

#: Readable names of the speed columns.
SPEED_NAMES = {"train_speedup": "Training speedup", "step_speedup": "Step speedup",
               "infer_speedup": "Inference speedup"}
AXIS_NAMES = {"train_step": "training step", "train": "training", "inference": "inference", "size": "size"}


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def _sig(x: Any, digits: int = 3, unit: str = "") -> str:
    v = _num(x)
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


def _loss(row: pd.Series) -> str:
    est = _num(row.get("acc_loss_pt"))
    if math.isnan(est):
        return ""
    unit = " pt" if str(row.get("loss_unit") or "pt") in ("pt", "points", "nan", "") else f" {row.get('loss_unit')}"
    lo, hi = _num(row.get("acc_loss_lo")), _num(row.get("acc_loss_hi"))
    if math.isnan(lo) or math.isnan(hi):
        return f"{est:+.2g}{unit}" + ("" if row["arm"] == "baseline" else " (no interval)")
    return f"{est:+.2g}{unit} [{lo:+.2g}, {hi:+.2g}]"


def _status(rec: ArmRecord) -> str:
    if rec.refused:
        return "does not apply here"
    return "not run" if rec.not_run else rec.status


def ablation_table(df: pd.DataFrame, record: AblationRecord | None = None) -> pd.DataFrame:
    """One row per arm, humanised (see the module docstring); every ratio is the record's text
    (:mod:`lab.ablation.record`), so the table says what the bars, the details and the why say."""
    record = record or build_record(df)
    rows = []
    for _, r in df.iterrows():
        rec = record.arms[str(r["arm"])]
        rows.append({
            "Arm": rec.label,
            "Techniques": ", ".join(r["techniques"]) if isinstance(r.get("techniques"), (list, tuple))
            else str(r.get("techniques") or "none"),
            "Competes on": ", ".join(AXIS_NAMES.get(a, a) for a in rec.axes),
            "Runs ok": f"{rec.n_ok}/{rec.n_runs}" if not math.isnan(_num(r.get("n_runs"))) else "",
            **{f"{name} (x, 95 % CI)": _speed(rec, col) for col, name in SPEED_NAMES.items()},
            "Accuracy loss (95 % CI)": _loss(r),
            "Seed noise (pt)": _sig(r.get("noise_pt"), 2),
            "Size": rec.size.text if rec.size else "",
            "MACs run (dense kernels)": rec.macs.text if rec.macs else "",
            "MACs if zeros skipped": rec.macs_if_skipped.text if rec.macs_if_skipped else "",
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
        "Speed effect (x, 95 % CI)": fmt_ratio(_num(e["effect"]), _num(e["effect_lo"]), _num(e["effect_hi"])),
        "Reads as": _reads_as(e),
        "Accuracy effect (pt)": _sig_signed(e["loss_effect_pt"]),
    } for _, e in effects.iterrows()])


def _reads_as(e: pd.Series) -> str:
    """A main effect is one arm against the baseline: faster or slower, never "compound" / "cancel"."""
    if e["term"] == "main":
        return {"compound": "faster", "cancel": "slower"}.get(e["verdict"], e["verdict"])
    return e["verdict"]


def _sig_signed(x: Any) -> str:
    v = _num(x)
    return "" if math.isnan(v) else f"{v:+.2g}"


def _median_ci(samples: list[float]) -> str:
    """``median [lo, hi]`` at 3 significant digits; one sample is no interval."""
    if len(samples) < 2:
        return f"{_sig(median(samples), 3)} (n = {len(samples)}: no interval)"
    est, lo, hi = bootstrap_ci(samples)
    return f"{est:.3g} [{lo:.3g}, {hi:.3g}]"


def technique_table(runs: dict[str, RunResult], reference: RunResult | None = None) -> pd.DataFrame:
    """A technique notebook's side-by-side table (the MIT labs' staple): one row per run with its latency
    (median ms at the largest batch it stored), its inference speedup with the 95 % CI (the record's paired
    figure: against its own float / dense model in the same process, else against ``reference``), size (against
    ``reference``, or an int8 run's own float model: ``details["quant"]["size_ratio"]``), MACs per sample, and
    accuracy with its loss in points (the paired 95 % CI an int8 run stores over the test set; one run against
    ``reference`` has no interval). Latency and training step carry the 95 % bootstrap CI of their median over
    the run's own samples (timed batches, measured steps): within-run noise, not run-to-run; the step speedup
    against ``reference`` resamples both runs' steps (a data-loading or precision notebook's headline figure)."""
    rows = []
    for name, r in runs.items():
        arms = {"baseline": [reference if reference is not None else r], name: [r]}
        df = summarize(arms)
        rec = build_record(df, arms).arms[name]
        row = df.set_index("arm").loc[name]
        key = stored_latency_key([r])
        quant = r.details.get("quant") or {}
        acc = (quant.get("accuracy") or {}).get(r.metric_name) or {}
        inf = rec.paired or (rec.speed.get("infer_speedup") if reference is not None else None)
        size = (rec.size if reference is not None else
                Ratio(quant["size_ratio"], better="smaller", worse="larger") if quant.get("size_ratio") else None)
        if acc:
            loss = f"{acc['loss_pts']:+.2g} pt [{acc['ci_lo']:+.2g}, {acc['ci_hi']:+.2g}]"
        else:
            loss = f"{row['acc_loss_pt']:+.2g} pt (n = 1: no interval)" if reference is not None else ""
        steps = r.measured_ms()
        ref_steps = reference.measured_ms() if reference is not None else []
        step_up = Ratio(*bootstrap_ratio_ci(ref_steps, steps)) if ref_steps and steps and r is not reference else None
        rows.append({
            "Run": name, "Workload": r.workload,
            "Latency (ms, 95 % CI)": f"{_median_ci(r.latency_ms[key])} at {key.replace('_', ' ')}"
            if r.latency_ms.get(key) else "",
            "Training step (ms, 95 % CI)": _median_ci(steps) if steps else "",
            "Step speedup (x, 95 % CI)": "1x (reference)" if r is reference else step_up.text if step_up else "",
            "Inference speedup (x, 95 % CI)": inf.text if inf is not None else "",
            "Against": rec.paired_what or ("the reference run" if inf is not None else ""),
            "Size": size.text if size is not None else "",
            "MACs per sample": _sig(r.macs_per_sample, 3),
            "MACs if zeros skipped": rec.macs_if_skipped.text if rec.macs_if_skipped else "",
            "Metric": f"{r.metric_name} {_sig(r.metric, 3)}" if r.metric is not None else "",
            "Accuracy loss (95 % CI)": loss,
        })
    out = pd.DataFrame(rows)
    return out.loc[:, [c for c in out.columns if (out[c] != "").any()]] if len(out) else out
