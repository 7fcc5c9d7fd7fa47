"""The ablation table: one row per arm with speedups and 95 % CIs, accuracy loss against the seed noise,
size and MACs ratios, the axes the arm competes on, and the "why" tags of its runs.

Definitions (one row per arm):

- ``train_speedup``: median end-to-end training time of the baseline / of the arm, over all its runs, with
  a bootstrap 95 % CI. End-to-end = training loop + pruning fine-tune + QAT fine-tune + the ``auto`` probe,
  because a technique that needs extra training is not free. ``step_speedup`` is the per-step ratio
  (pooled measured steps, warm-up excluded) of the main training loop only.
- ``infer_speedup``: baseline / arm median inference latency at the largest batch the runs stored
  (``batch_N`` with N = min(eval batch, test rows); ``latency_key`` overrides), pooled samples.
- ``axes``: what the arm's techniques can change (:data:`AXES`: ``train_step``, ``train``, ``inference``,
  ``size``). A speedup on another axis is blank: post-training int8 does not train faster, and a
  precision arm's inference runs in fp32, so neither may be crowned there. Below :data:`MIN_RUNS` runs
  per arm there is no interval (``*_lo`` / ``*_hi`` blank) and so no verdict.
- ``acc_loss_pt``: 100 x (baseline - arm) of the primary metric (medians over runs), sign flipped for
  lower-is-better metrics, so positive always means worse; ``acc_loss_lo`` / ``_hi`` its bootstrap CI over
  runs. A lower-is-better metric (a loss) keeps its delta in its own units; ``loss_unit`` says which.
  ``noise_pt`` = the larger seed-to-seed spread (IQR) of baseline and arm in the same unit; ``within_noise``
  when ``|acc_loss_pt| <= noise_pt``. With fewer than two seeds there is no seed spread: ``noise_pt`` is
  NaN and ``within_noise`` None (unknown), never a false 0.
- ``baseline_learned``: False when the baseline's runs carry the "did not learn" tag: every accuracy delta
  of that table is then meaningless.
- the A/A arm (``aa``): the baseline config again; its interval is the noise floor and must contain 1.
- ``ceiling`` / ``share_of_ceiling`` (:mod:`lab.measure.ceiling`): what the machine card and the baseline's
  measured phases allow the arm on its main speed axis (the step for a training technique, the inference call
  otherwise), the basis of that figure (``ceiling_basis``, or why there is none), and the measured speedup as
  a share of it with a why when low (``share_why``). Blank for the baseline and the A/A arm.
- ``ttt_speedup`` (:mod:`lab.ablation.target`): the time-to-target ratio with its CI, ``ttt_reached``
  saying when an arm's runs never got there; ``one_off_s`` / ``end_to_end_s``: the one-off costs and the time
  to a trained model (training + evaluations + one-off costs outside the loop), medians over the runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from lab.ablation import target as target_
from lab.measure import CEILING_KEYS, bootstrap_ratio_ci, config_parts, median, speedup_vs_ceiling, spread
from lab.result import RunResult, section
from lab.technique import AXES

if TYPE_CHECKING:
    import pandas as pd

#: Which axis each speedup column measures.
SPEED_AXIS = {"train_speedup": "train", "step_speedup": "train_step", "infer_speedup": "inference",
              "ttt_speedup": "train"}
#: The A/A arm: the baseline again, the table's noise floor.
AA_ARM = "aa"
#: Runs per arm below which there is no interval and no verdict.
MIN_RUNS = 3

COLUMNS = [
    "arm", "techniques", "axes", "status", "n_ok", "n_runs", "error", "train_time_s", "train_speedup",
    "train_speedup_lo", "train_speedup_hi", "step_speedup", "step_speedup_lo", "step_speedup_hi",
    "infer_speedup", "infer_speedup_lo", "infer_speedup_hi", "metric_name", "metric", "acc_loss_pt",
    "acc_loss_lo", "acc_loss_hi", "noise_pt", "loss_unit", "within_noise", "baseline_learned", "peak_memory_mb",
    "model_bytes", "size_ratio", "macs_per_sample", "macs_ratio", "why", "hardware_id", "device_name",
    "torch_version", "threads", "busy_runs", "others_cores", "train_utilisation", "infer_utilisation",
    *target_.COLUMNS, *CEILING_KEYS,
]


def end_to_end_train_s(result: RunResult) -> float:
    """Training loop + pruning fine-tune + QAT fine-tune + the ``auto`` precision probe: what a technique
    really costs to train."""
    extra = (section(result, "pruning").get("finetune", {}).get("time_s", 0.0)
             + result.details.get("quant", {}).get("qat", {}).get("time_s", 0.0)
             + result.details.get("precision", {}).get("auto", {}).get("probe_s", 0.0))
    return float(result.train_time_s) + float(extra)


def _busy_sentence(result: RunResult) -> str | None:
    """The "measured while busy" tag a run carries (summarised per arm by ``busy_runs``, not repeated)."""
    return (result.details.get("contention") or {}).get("sentence") or None


def _ratio(base: list[float], arm: list[float]) -> tuple[float, float, float]:
    if not base or not arm:
        return (math.nan, math.nan, math.nan)
    return bootstrap_ratio_ci(base, arm)


def _pooled(results: Sequence[RunResult], get: Callable[[RunResult], list[float]]) -> list[float]:
    return [x for r in results for x in get(r)]


def _loss_scale(higher_is_better: bool) -> float:
    """Points (x100) for a higher-is-better fraction (accuracy, AUC); the metric's own units otherwise."""
    return 100.0 if higher_is_better else 1.0


def _loss_pt(base: float | None, arm: float | None, higher_is_better: bool) -> float:
    if base is None or arm is None:
        return math.nan
    return _loss_scale(higher_is_better) * ((base - arm) if higher_is_better else (arm - base))


def _diff_ci(base: list[float], arm: list[float], scale: float, higher_is_better: bool) -> tuple[float, float]:
    """Bootstrap 95 % CI of the accuracy loss (difference of medians, in the loss's unit); NaN below 3 runs."""
    if len(base) < MIN_RUNS or len(arm) < MIN_RUNS:
        return math.nan, math.nan
    rng = np.random.default_rng(0)
    b, a = np.asarray(base, float), np.asarray(arm, float)
    bb = np.median(b[rng.integers(0, len(b), (2000, len(b)))], axis=1)
    ab = np.median(a[rng.integers(0, len(a), (2000, len(a)))], axis=1)
    diff = scale * ((bb - ab) if higher_is_better else (ab - bb))
    lo, hi = np.percentile(diff, [2.5, 97.5])
    return float(lo), float(hi)


def _apply_axes(row: dict[str, Any], arm_axes: tuple[str, ...], n: int) -> None:
    """Blank the speedups of axes the arm's techniques cannot change (a post-training int8 arm has no
    training speedup: its training is the baseline's), and every interval below :data:`MIN_RUNS` runs (one
    run is no interval, not a zero-width one)."""
    row["axes"] = ",".join(arm_axes)
    for column, axis in SPEED_AXIS.items():
        if axis not in arm_axes:
            row[column] = row[f"{column}_lo"] = row[f"{column}_hi"] = math.nan
        elif n < MIN_RUNS:
            row[f"{column}_lo"] = row[f"{column}_hi"] = math.nan
    if "size" not in arm_axes:
        row["size_ratio"] = math.nan


def stored_latency_key(results: Sequence[RunResult]) -> str:
    """The largest ``batch_N`` latency key the runs stored (a test split under 256 rows stores ``batch_<n>``)."""
    keys = {k for r in results for k in r.latency_ms if k.startswith("batch_") and k[6:].isdigit()}
    return max(keys, key=lambda k: int(k[6:]), default="batch_256")


def _phases_ms(results: Sequence[RunResult]) -> dict[str, float]:
    """Median per phase (and ``total``) over the pooled measured steps of ``results``."""
    names = dict.fromkeys(p for r in results for p in r.step_times_ms)
    pooled = {p: _pooled(results, lambda r, p=p: r.measured_ms(p)) for p in names}
    return {p: median(xs) for p, xs in pooled.items() if xs}


def ceiling_columns(row: dict[str, Any], arm_runs: Sequence[RunResult], base_runs: Sequence[RunResult],
                    arm_axes: tuple[str, ...]) -> dict[str, Any]:
    """The arm's :data:`~lab.measure.ceiling.CEILING_KEYS`: the technique read from its config against the
    baseline's, the ceiling from the baseline's machine card and phases, on the step for a training technique,
    on the inference call otherwise; the baseline's utilisation of the fp32 peak says why a share is low."""
    if not arm_runs or not base_runs:
        return {}
    speed, axis = (("step_speedup", "train_step") if "train_step" in arm_axes else
                   ("infer_speedup", "inference") if "inference" in arm_axes else (None, None))
    if speed is None:
        return {"ceiling_basis": "no speed axis"}
    base = base_runs[0]
    parts = config_parts(arm_runs[0].config or {}, base.config or {})
    if not parts:
        return {}
    util = ((base.details.get("utilisation") or {}).get("inference" if axis == "inference" else "train_step")
            or {}).get("share")
    macs = row.get("macs_ratio")
    arm = arm_runs[0]
    int8_share = arm.int8_macs_per_sample / arm.macs_per_sample if arm.macs_per_sample else None
    return speedup_vs_ceiling(
        row.get(speed), parts, axis, card=base.env.get("machine_card"), threads=base.env.get("torch_threads"),
        phases_ms=_phases_ms(base_runs) if axis == "train_step" else None,
        macs_ratio=1.0 / macs if macs and macs == macs and macs > 0 else None, int8_mac_share=int8_share,
        utilisation=util)


def _utilisation(results: Sequence[RunResult], axis: str) -> float | None:
    """The median share of the card's GEMM peak its runs reached on ``axis`` (``train_step`` / ``inference``,
    :func:`lab.measure.run_utilisation`), ``None`` where no run has one (no card, no timed work)."""
    shares = [u["share"] for r in results if (u := (r.details.get("utilisation") or {}).get(axis))]
    return median(shares) if shares else None


def summarize(runs: dict[str, list[RunResult]], techniques: dict[str, tuple[str, ...]] | None = None,
              baseline: str = "baseline", latency_key: str | None = None,
              axes: dict[str, tuple[str, ...]] | None = None, budget_pt: float = 1.0) -> pd.DataFrame:
    """One row per arm (columns in ``COLUMNS``; see the module docstring for the definitions). ``budget_pt``
    sets the default time-to-target target (the baseline's final metric minus it)."""
    import pandas as pd

    techniques, axes = techniques or {}, axes or {}
    base_ok = [r for r in runs.get(baseline, []) if r.status == "ok"]
    latency_key = latency_key or stored_latency_key(base_ok)
    base_learned = not any("did not learn" in w for r in base_ok for w in r.why) if base_ok else None
    base_train = [end_to_end_train_s(r) for r in base_ok]
    base_steps = _pooled(base_ok, lambda r: r.measured_ms())
    base_lat = _pooled(base_ok, lambda r: r.latency_ms.get(latency_key, []))
    base_metrics = [r.metric for r in base_ok if r.metric is not None]
    base_metric = median(base_metrics) if base_metrics else None
    base_seeds = len({(r.config or {}).get("seed") for r in base_ok})
    base_bytes = median([r.model_bytes for r in base_ok]) if base_ok else None
    base_macs = median([r.macs_per_sample for r in base_ok]) if base_ok else None
    target = target_.default_target(base_ok, budget_pt)
    rows = []
    for arm, results in runs.items():
        ok = [r for r in results if r.status == "ok"]
        errors = sorted({r.error or "error" for r in results if r.status != "ok"})
        row: dict[str, Any] = {c: None for c in COLUMNS}
        row.update(arm=arm, techniques="+".join(techniques.get(arm, ())), n_ok=len(ok), n_runs=len(results),
                   status="ok" if ok and not errors else ("error" if not ok else "partial"),
                   error="; ".join(errors) or None)
        if ok:
            first = ok[0]
            metrics = [r.metric for r in ok if r.metric is not None]
            metric = median(metrics) if metrics else None
            # the noise band is a *seed* spread: identical repeats of one seed would give a false 0
            noise = [spread(m) for m in (base_metrics, metrics) if m] if base_seeds >= 2 else []
            loss = _loss_pt(base_metric, metric, first.higher_is_better)
            ts, tl, th = _ratio(base_train, [end_to_end_train_s(r) for r in ok])
            ss, sl, sh = _ratio(base_steps, _pooled(ok, lambda r: r.measured_ms()))
            is_, il, ih = _ratio(base_lat, _pooled(ok, lambda r: r.latency_ms.get(latency_key, [])))
            mbytes = median([r.model_bytes for r in ok])
            macs = median([r.macs_per_sample for r in ok])
            mem = [r.peak_memory_mb for r in ok if r.peak_memory_mb is not None]
            row.update(
                train_time_s=median([end_to_end_train_s(r) for r in ok]), train_speedup=ts, train_speedup_lo=tl,
                train_speedup_hi=th, step_speedup=ss, step_speedup_lo=sl, step_speedup_hi=sh, infer_speedup=is_,
                infer_speedup_lo=il, infer_speedup_hi=ih, metric_name=first.metric_name, metric=metric,
                acc_loss_pt=loss, noise_pt=_loss_scale(first.higher_is_better) * max(noise) if noise else math.nan,
                loss_unit="pt" if first.higher_is_better else first.metric_name, baseline_learned=base_learned,
                peak_memory_mb=median(mem) if mem else None, model_bytes=mbytes,
                size_ratio=mbytes / base_bytes if base_bytes else math.nan, macs_per_sample=macs,
                macs_ratio=macs / base_macs if base_macs else math.nan,
                why="; ".join(dict.fromkeys(t for r in ok for t in r.why if t != _busy_sentence(r))),
                busy_runs=sum(bool((r.details.get("contention") or {}).get("busy")) for r in ok),
                others_cores=max(((r.details.get("contention") or {}).get("others_cores") or 0.0 for r in ok),
                                 default=None),
                hardware_id=first.hardware_id, device_name=first.env.get("device_name"),
                torch_version=first.env.get("torch_version") or first.env.get("torch"),
                threads=first.env.get("torch_threads"),
                train_utilisation=_utilisation(ok, "train_step"), infer_utilisation=_utilisation(ok, "inference"),
            )
            lo, hi = _diff_ci(base_metrics, metrics, _loss_scale(first.higher_is_better), first.higher_is_better)
            row.update(acc_loss_lo=lo, acc_loss_hi=hi)
            row.update(target_.ttt_columns(base_ok, ok, target))
            unknown = math.isnan(loss) or math.isnan(row["noise_pt"])
            row["within_noise"] = None if unknown else bool(abs(loss) <= row["noise_pt"])
            _apply_axes(row, axes.get(arm, AXES), n=min(len(ok), len(base_ok)))
            if arm not in (baseline, AA_ARM):
                row.update(ceiling_columns(row, ok, base_ok, axes.get(arm, AXES)))
            if arm == baseline:  # exactly 1 by definition, not a bootstrap artefact
                for k in ("train", "step", "infer"):
                    row.update({f"{k}_speedup": 1.0, f"{k}_speedup_lo": 1.0, f"{k}_speedup_hi": 1.0})
                row.update(acc_loss_pt=0.0, acc_loss_lo=0.0, acc_loss_hi=0.0, within_noise=True)
                if not math.isnan(row["ttt_speedup"]):
                    row.update(ttt_speedup=1.0, ttt_speedup_lo=1.0, ttt_speedup_hi=1.0)
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)

__all__ = ["AA_ARM", "AXES", "COLUMNS", "MIN_RUNS", "SPEED_AXIS", "ceiling_columns", "end_to_end_train_s",
           "stored_latency_key", "summarize"]
