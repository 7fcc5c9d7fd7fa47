"""The doctor checks itself: an interleaved ablation of its top predictions, predicted vs measured, kept.

Why keep every check: one prediction that came true says little; the lab's prediction accuracy on this
hardware id over many models says how far to trust the next one. Each verified technique is one line of
``<results folder>/doctor/<hardware-id>.jsonl`` (beside the results store, like the traces), appended as it
is measured; :func:`accuracy` summarises them (median absolute error, top-1 hits).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lab.ablation import AA_ARM, run_ablation
from lab.config import RunConfig
from lab.doctor.diagnosis import Diagnosis
from lab.doctor.predict import Prediction
from lab.doctor.risk import RunLength, over_run
from lab.measure import median
from lab.recipes import from_techniques
from lab.result import utc_now_iso
from lab.result.timeline import one_off_costs
from lab.store import ResultStore, default_store_path

#: A measured interval narrower than this share of its ends is a point (too few samples), never printed as one.
ZERO_WIDTH = 0.001
#: The ablation column that measures each prediction axis.
MEASURED_COLUMN = {"train_step": "step_speedup", "inference": "infer_speedup"}


def history_path(hardware_id: str) -> Path:
    return default_store_path().parent / "doctor" / f"{hardware_id}.jsonl"


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def compare(predictions: Sequence[Prediction], table: Any, *, base_step_ms: float | None = None,
            step_ms: dict[str, float] | None = None, one_off_s: dict[str, float] | None = None,
            run_steps: int | None = None) -> list[dict[str, Any]]:
    """Predicted vs measured, one row per prediction, from :func:`lab.ablation.summarize`'s table.
    ``error`` = predicted / measured - 1 (0.1: the doctor promised 10 % more than it got). With the profiled
    baseline's ``base_step_ms`` and the verification's median step per arm (``step_ms``), a training-step row
    also carries the predicted and the measured step time; with each arm's measured one-off seconds
    (``one_off_s``, :func:`_arm_one_off_s`) and the length of the run the doctor ranked for (``run_steps``), what
    :func:`over_the_run` scores the pick by."""
    rows = []
    step_ms, one_off_s = step_ms or {}, one_off_s or {}
    base_one_off = one_off_s.get("baseline", 0.0)
    by_arm = {r["arm"]: r for r in table.to_dict("records")}
    aa = by_arm.get(AA_ARM, {})
    for p in predictions:
        got = by_arm.get(p.technique, {})
        col = MEASURED_COLUMN[p.axis]
        m, lo, hi = _num(got.get(col)), _num(got.get(f"{col}_lo")), _num(got.get(f"{col}_hi"))
        point = lo is not None and hi is not None and hi <= lo * (1 + ZERO_WIDTH)
        if point:  # "[0.75, 0.75]" from 3 equal repeats is no interval, not a certainty: kept as a point, said so
            lo = hi = None
        rows.append({"technique": p.technique, "axis": p.axis, "predicted": p.speedup, "predicted_lo": p.lo,
                     "predicted_hi": p.hi, "measured": m, "measured_lo": lo, "measured_hi": hi,
                     "measured_point": point, "prescribed": p.prescribed, "run_speedup": p.run_speedup,
                     "run_lo": p.run_lo, "run_hi": p.run_hi, "one_off_s": p.one_off_s, "p_faster": p.p_faster,
                     "expected_saving": p.expected_saving,
                     "error": (p.speedup / m - 1) if m else None, "status": got.get("status", "missing"),
                     # why an arm failed, kept (a held-out run once lost every HF int8 arm's reason)
                     "arm_error": (str(got.get("error"))[:500] if got.get("error") and got.get("status") != "ok"
                                   else None),
                     "aa_measured": _num(aa.get(col)),  # the A/A arm on the same axis: this table's noise floor
                     # the intervals overlap; with one repeat (no measured interval) the point inside
                     "inside": (p.lo <= hi and lo <= p.hi) if lo is not None and hi is not None else
                     (m is not None and p.lo <= m <= p.hi),
                     "covered": None if m is None else bool(p.lo <= m <= p.hi),  # the point inside
                     "model_lo": p.model_lo, "model_hi": p.model_hi,
                     "predicted_step_ms": (base_step_ms / p.speedup if base_step_ms and p.axis == "train_step"
                                           else None),
                     "measured_step_ms": step_ms.get(p.technique) if p.axis == "train_step" else None,
                     # the baseline's step as profiled (what the prediction divides) and as the ablation measured it
                     "baseline_step_ms": base_step_ms, "measured_baseline_step_ms": step_ms.get("baseline"),
                     # what the arm paid once beyond the baseline (compile's first step): charged over the run
                     "measured_one_off_s": (max(one_off_s[p.technique] - base_one_off, 0.0)
                                            if p.axis == "train_step" and p.technique in one_off_s else None),
                     "run_steps": run_steps})
    return rows


def over_the_run(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with each training-step row's measured speedup (and interval) turned into the one over the run
    the doctor ranked for: ``run_steps`` steps of the measured baseline step, the arm's steps at its measured
    speedup plus its measured one-off (:func:`lab.doctor.risk.over_run`); the per-step figure kept as
    ``measured_per_step``. Why: the doctor charges compile its compile over the run it prescribes for (a
    40-step check cannot repay a 20 s compile), so its pick is scored over that same run; a row without a run
    length or a measured one-off (stored before they were kept) stays per step."""
    out = []
    for r in rows:
        steps, one_off = r.get("run_steps"), r.get("measured_one_off_s")
        step = r.get("measured_baseline_step_ms") or r.get("baseline_step_ms") or r.get("run_step_ms")
        if r.get("axis") != "train_step" or r.get("measured") is None or not steps or one_off is None or not step:
            out.append(r)
            continue
        run = RunLength(int(steps), float(step))
        out.append({**r, "measured_per_step": r["measured"], "measured": over_run(r["measured"], run, one_off),
                    **{k: over_run(r[k], run, one_off) if r.get(k) is not None else None
                       for k in ("measured_lo", "measured_hi")}})
    return out


def picked(rows: Sequence[dict[str, Any]], axis: str = "train_step") -> dict[str, Any] | None:
    """The doctor's pick among the measured rows of ``axis``: the first, unless it was not prescribed (nothing
    paid beyond noise: the pick is the baseline, ``None``). Rows stored before prescriptions existed (no
    ``prescribed`` key) count their first row as the pick, as they were scored then."""
    on = [r for r in rows if r["axis"] == axis and r["measured"] is not None]
    return on[0] if on and on[0].get("prescribed") is not False else None


def _aa_noise(rows: Sequence[dict[str, Any]]) -> float:
    """The A/A arm's deviation from 1 in this verification, as a factor >= 1 (1 when there was none)."""
    aa = next((r.get("aa_measured") for r in rows if r.get("aa_measured")), None)
    return max(aa, 1 / aa) if aa and aa > 0 else 1.0


def top1_hit(rows: Sequence[dict[str, Any]], axis: str = "train_step") -> bool | None:
    """Is the doctor's pick (:func:`picked`) the measured best, or within noise of it (its measured interval
    reaches the best measured speedup)? When it prescribed nothing, the pick is the baseline: a hit unless a
    measured technique beat 1 beyond noise (its measured interval, else the A/A deviation). ``None`` when
    nothing was measured."""
    on = [r for r in rows if r["axis"] == axis and r["measured"] is not None]
    if not on:
        return None
    best = max(r["measured"] for r in on)
    first = picked(rows, axis)
    if first is None:
        top = max(on, key=lambda r: r["measured"])
        clear = top["measured_lo"] if top.get("measured_lo") is not None else best / _aa_noise(rows)
        return bool(best <= 1.0 or clear <= 1.0)
    return bool(first["measured"] >= best or (first["measured_hi"] is not None and first["measured_hi"] >= best))


def slower(rows: Sequence[dict[str, Any]], axis: str = "train_step", *, beyond_noise: bool = False) -> bool | None:
    """Was the doctor's pick measured slower than the baseline (``beyond_noise``: below 1 by more than the A/A
    arm's deviation)? A baseline pick never is. ``None`` when nothing was measured."""
    if not any(r["axis"] == axis and r["measured"] is not None for r in rows):
        return None
    first = picked(rows, axis)
    if first is None:
        return False
    return bool(first["measured"] < (1 / _aa_noise(rows) if beyond_noise else 1.0))


def verify(d: Diagnosis, k: int, *, repeats: int = 3, store: ResultStore | None = None, progress: Any = None,
           record: bool = True, techniques: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """An interleaved ablation (:func:`lab.ablation.run_ablation`) of the baseline and the top ``k``
    predictions (or of ``techniques``), then :func:`compare`; appended to :func:`history_path` unless
    ``record`` is False."""
    return verify_predictions(d.cfg, top_predictions(d.predictions, k, techniques), repeats=repeats, store=store,
                              progress=progress, record=record, base_step_ms=d.train.step_ms,
                              hardware_id=d.hardware_id, rate_source=d.rate_source,
                              run_steps=d.run.steps if d.run else None)


def top_predictions(predictions: Sequence[Prediction], k: int,
                    techniques: Sequence[str] | None = None) -> list[Prediction]:
    """The predictions a verification measures: the first ``k`` of the ranked ``predictions``, or those of
    ``techniques``; a bad ``k`` or nothing to measure is a ``ValueError``."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"verify={k!r} is invalid: allowed: an int >= 1 (how many top predictions to measure)")
    chosen = ([p for p in predictions if p.technique in techniques] if techniques is not None
              else list(predictions[:k]))
    if not chosen:
        raise ValueError("nothing to verify: the doctor made no prediction")
    return chosen


def verify_predictions(cfg: RunConfig, chosen: Sequence[Prediction], *, repeats: int = 3,
                       store: ResultStore | None = None, progress: Any = None, record: bool = True,
                       base_step_ms: float | None = None, hardware_id: str = "",
                       rate_source: str = "", run_steps: int | None = None) -> list[dict[str, Any]]:
    """:func:`verify` from what a diagnosis keeps (its config, its ``chosen`` predictions, the profiled step,
    its machine and rates' source), so a diagnosis read back from the store (:mod:`lab.doctor.stored`, a
    background job's) is verified as one fresh from :func:`~lab.doctor.diagnosis.diagnose`."""
    base = dataclasses.replace(cfg, profile=False)
    ablation = from_techniques("doctor", base, [[p.technique] for p in chosen])
    table = run_ablation(ablation, repeats=repeats, store=store, progress=progress)
    rows = compare(chosen, table, base_step_ms=base_step_ms, step_ms=_arm_step_ms(ablation, repeats, store),
                   one_off_s=_arm_one_off_s(ablation, repeats, store), run_steps=run_steps)
    if record:
        path = history_path(hardware_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            for row in rows:
                f.write(json.dumps({"at": utc_now_iso(), "workload": cfg.workload, "size": cfg.size,
                                    "hardware_id": hardware_id, "rate_source": rate_source, **row}) + "\n")
    return rows


def _arm_step_ms(ablation: Any, repeats: int, store: ResultStore | None) -> dict[str, float]:
    """The median measured step (ms) of each arm's stored runs (empty without a store)."""
    if store is None:
        return {}
    out = {}
    for arm in ablation.arms:
        ms = [x for rep in range(repeats) for r in store.list_results(label=ablation.label(arm, rep), status="ok")
              for x in r.measured_ms()]
        if ms:
            out[arm] = median(ms)
    return out


def _arm_one_off_s(ablation: Any, repeats: int, store: ResultStore | None) -> dict[str, float]:
    """Each arm's one-off seconds (:func:`lab.result.timeline.one_off_costs`' total), the largest over its
    repeats: a user's first run pays the cold compile, the later repeats may read Inductor's cache."""
    if store is None:
        return {}
    out = {}
    for arm in ablation.arms:
        paid = [float((r.details.get("one_off_s") or one_off_costs(r.details)).get("total", 0.0))
                for rep in range(repeats) for r in store.list_results(label=ablation.label(arm, rep), status="ok")]
        if paid:
            out[arm] = max(paid)
    return out


def load_history(hardware_id: str, path: Path | None = None) -> list[dict[str, Any]]:
    path = path or history_path(hardware_id)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def accuracy(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median absolute error of predicted vs measured over ``rows`` (those measured), and how many
    measured speedups fell inside the predicted interval."""
    errs = [abs(r["error"]) for r in rows if r.get("error") is not None]
    inside = [bool(r.get("inside")) for r in rows if r.get("measured") is not None]
    return {"n": len(errs), "median_abs_error": median(errs) if errs else None,
            "inside_interval": (sum(inside) / len(inside)) if inside else None}


def format_verification(rows: Sequence[dict[str, Any]]) -> str:
    lines = [f"{'technique':<17} {'axis':<10} {'predicted':>22} {'measured':>22} {'error':>7}"]
    for r in rows:
        m = ("n/a" if r["measured"] is None else
             f"{r['measured']:.2f}x" + (f" [{r['measured_lo']:.2f}, {r['measured_hi']:.2f}]"
                                        if r["measured_lo"] is not None else
                                        " (a point: too few repeats for an interval)" if r.get("measured_point")
                                        else ""))
        e = "n/a" if r["error"] is None else f"{100 * r['error']:+.0f} %"
        if r.get("arm_error"):
            m = f"{r['status']}: {r['arm_error'][:120]}"
        lines.append(f"{r['technique']:<17} {r['axis']:<10} {r['predicted']:.2f}x [{r['predicted_lo']:.2f}, "
                     f"{r['predicted_hi']:.2f}] {m:>22} {e:>7}")
    return "\n".join(lines + summary_lines(rows))


def summary_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """What a verification says beyond its rows: the median error, how many measured inside the predicted
    interval, and whether the prescribed pick was the measured best (the dashboard prints them under its table)."""
    lines = []
    acc = accuracy(rows)
    if acc["n"]:
        lines.append(f"median absolute error {100 * acc['median_abs_error']:.0f} % over {acc['n']}; measured inside "
                     f"the predicted interval: {100 * (acc['inside_interval'] or 0):.0f} %")
    runs = over_the_run(rows)  # the pick judged over the run it was prescribed for, one-offs charged
    hit = top1_hit(runs)
    if hit is not None:
        first = picked(runs)
        what = f"the prescribed pick ({first['technique']})" if first else "the baseline (nothing was prescribed)"
        lines.append(f"{what} is the measured best (or within noise): {'yes' if hit else 'no'}"
                     + ("; it measured slower than the baseline" if slower(runs) else "")
                     + (" (over this run, one-offs charged)" if any("measured_per_step" in r for r in runs) else ""))
    return lines


__all__ = ["MEASURED_COLUMN", "ZERO_WIDTH", "accuracy", "compare", "format_verification", "history_path",
           "load_history", "over_the_run", "picked", "slower", "summary_lines", "top1_hit", "top_predictions", "verify",
           "verify_predictions"]
