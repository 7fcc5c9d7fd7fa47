"""Reading an ablation table honestly: the Pareto front, the best arm within an accuracy budget (only
beyond noise), the verdict sentence, and factorial effects with intervals.

Why conservative: on a shared 2-core machine one lucky run moves a median by tens of percent, so a winner
needs its speedup CI's lower bound above 1 and above the A/A arm's interval (the baseline run again) *and* its
accuracy-loss CI inside the budget, at least :data:`~lab.ablation.summary.MIN_RUNS` runs per arm, a baseline
that learned, no run measured while the machine was busy, and a competing axis (a technique competes only on
the axes it can change). Otherwise the verdict says so in words.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

from lab.ablation.summary import AA_ARM, MIN_RUNS, SPEED_AXIS

if TYPE_CHECKING:
    import pandas as pd

#: A 95 % interval of a log-normal ratio spans +-1.96 standard errors.
_Z95 = 1.96


def _ok(df: pd.DataFrame, speed: str) -> pd.DataFrame:
    return df[(df["status"] != "error") & df[speed].notna() & df["acc_loss_pt"].notna()]


def _contenders(df: pd.DataFrame, speed: str) -> pd.DataFrame:
    """Arms that may win on ``speed``: ok, eligible on its axis (not blank), not the baseline or A/A."""
    ok = _ok(df, speed)
    return ok[~ok["arm"].isin(["baseline", AA_ARM])]


def pareto_front(df: pd.DataFrame, speed: str = "train_speedup") -> list[str]:
    """Arms no other arm beats on both speed (higher) and accuracy loss (lower), fastest first. Only arms
    that can change ``speed``'s axis take part (and the baseline, the point they must beat)."""
    ok = _ok(df, speed)
    ok = ok[ok["arm"] != AA_ARM]
    front = []
    for _, r in ok.iterrows():
        dominated = ((ok[speed] >= r[speed]) & (ok["acc_loss_pt"] <= r["acc_loss_pt"])
                     & ((ok[speed] > r[speed]) | (ok["acc_loss_pt"] < r["acc_loss_pt"]))).any()
        if not dominated:
            front.append((r[speed], r["arm"]))
    return [arm for _, arm in sorted(front, reverse=True)]


def qualifying(df: pd.DataFrame, budget_pt: float = 1.0, speed: str = "train_speedup",
               conservative: bool = True) -> pd.DataFrame:
    """Every arm that wins on ``speed`` within ``budget_pt`` of accuracy loss, best first: the one rule the
    verdict, the recommendation card (:mod:`lab.doctor.recommendation`) and every tab read. ``conservative``
    (the default): the speedup CI's lower bound must be above 1 *and* above the A/A arm's upper bound (the
    baseline run again: how far noise alone reached in this table), and the accuracy-loss CI's upper bound
    within the budget, ranked by the lower bound, so noise cannot win; ``False`` ranks point estimates
    (a preview, never a verdict)."""
    if not budget_pt >= 0 or math.isinf(budget_pt):
        raise ValueError(f"budget_pt={budget_pt!r} is invalid: allowed: a finite number >= 0 (points of accuracy)")
    ok = _contenders(df, speed)
    if conservative:  # beyond noise: above 1 and above the A/A arm's own interval (the baseline run again)
        ok = ok[(ok[f"{speed}_lo"] > noise_bar(df, speed)) & (ok["acc_loss_hi"] <= budget_pt)]
    else:
        ok = ok[ok["acc_loss_pt"] <= budget_pt]
    return ok.sort_values(f"{speed}_lo" if conservative else speed, ascending=False, kind="stable")


def noise_bar(df: pd.DataFrame, speed: str = "train_speedup") -> float:
    """What a speedup's lower bound must clear to win: 1, or the A/A arm's upper bound when that is higher."""
    floor = noise_floor(df, speed)
    return max(1.0, floor[2]) if floor is not None else 1.0


def best_under_budget(df: pd.DataFrame, budget_pt: float = 1.0, speed: str = "train_speedup",
                      conservative: bool = True) -> pd.Series | None:
    """The fastest arm within ``budget_pt`` of accuracy loss (None if none qualifies): the first of
    :func:`qualifying`."""
    ok = qualifying(df, budget_pt, speed, conservative)
    return None if ok.empty else ok.iloc[0]


def verdict(df: pd.DataFrame, budget_pt: float = 1.0, speed: str = "train_speedup") -> dict[str, Any]:
    """``{"winner": arm or None, "reason": ..., "text": one sentence}``: what a reader may conclude from the table.
    ``reason`` is ``winner``, ``none`` (nothing beat the baseline beyond noise: a trusted table), or why the table
    crowns nothing at all: ``preview`` (too few runs), ``unlearned``, ``busy``, ``unstable`` (an A/A interval that
    excludes 1: the noise floor is not at 1; also ``"unstable": True``)."""
    runs = df.loc[df["status"] != "error", "n_ok"]
    n = int(runs.min()) if len(runs) else 0
    axis = "time to target" if speed == "ttt_speedup" else SPEED_AXIS.get(speed, speed)
    if n < MIN_RUNS:
        return {"winner": None, "reason": "preview",
                "text": f"n = {n}: no interval, no verdict (run >= {MIN_RUNS} repeats x seeds per arm; this table is "
                        "a preview)"}
    if (df["baseline_learned"] == False).any():  # noqa: E712 - True / False / None column
        return {"winner": None, "reason": "unlearned",
                "text": "no verdict: the baseline did not learn, so its accuracy deltas mean nothing (train longer or "
                        "pick a larger size)"}
    busy = busy_text(df)
    if busy:
        return {"winner": None, "busy": True, "reason": "busy", "text": busy}
    best = best_under_budget(df, budget_pt, speed)
    floor_ci = noise_floor(df, speed)
    floor = ""
    if floor_ci is not None:
        value, lo, hi = floor_ci
        if not lo <= 1.0 <= hi:
            return {"winner": None, "unstable": True, "reason": "unstable",
                    "text": unstable_text(axis, value, lo, hi, n, best)}
        floor = f"; A/A noise floor [{lo:.2f}, {hi:.2f}] (contains 1, as it should)"
    if best is None:
        return {"winner": None, "reason": "none",
                "text": f"no technique beat the baseline beyond noise on {axis} within {budget_pt:g} {_unit(df)} of "
                        f"accuracy{floor}"}
    return {"winner": best["arm"], "reason": "winner",
            "text": f"{best['arm']}: {best[speed]:.2f}x {axis} [{best[f'{speed}_lo']:.2f}, "
                    f"{best[f'{speed}_hi']:.2f}], accuracy loss {best['acc_loss_pt']:.2f} {_unit(df)} "
                    f"[{best['acc_loss_lo']:.2f}, {best['acc_loss_hi']:.2f}]: beats the baseline beyond noise{floor}"}


def busy_text(df: pd.DataFrame) -> str:
    """Why the table crowns nothing when any of its runs was measured on a busy machine (other processes
    taking cores or the hypervisor stealing them, :mod:`lab.measure.contention`); empty when none was."""
    if "busy_runs" not in df.columns:
        return ""
    busy = df["busy_runs"].fillna(0)
    if not (busy > 0).any():
        return ""
    n_busy, n_all = int(busy.sum()), int(df["n_ok"].fillna(0).sum())
    worst = float(df["others_cores"].fillna(0).max())
    return (f"measured while this machine was busy: other processes used up to {worst:.1f} cores in {n_busy} of "
            f"{n_all} runs, which moves timings more than their intervals show; no verdict: rerun when idle")


def noise_floor(df: pd.DataFrame, speed: str = "train_speedup") -> tuple[float, float, float] | None:
    """The A/A arm's (speedup, lo, hi) on ``speed``, or None without an A/A arm or an interval."""
    aa = df[df["arm"] == AA_ARM]
    if not len(aa) or not aa[f"{speed}_lo"].notna().all() or not aa[f"{speed}_hi"].notna().all():
        return None
    row = aa.iloc[0]
    return float(row[speed]), float(row[f"{speed}_lo"]), float(row[f"{speed}_hi"])


def unstable_text(axis: str, value: float, lo: float, hi: float, n: int, best: Any = None) -> str:
    """What a verdict says when the A/A interval excludes 1: the machine moved more than the intervals allow,
    so no interval of this table can be trusted to name a winner."""
    candidate = f" ({best['arm']} would have been named)" if best is not None else ""
    return (f"measurement unstable: the A/A arm (the baseline run again) came out {value:.2f}x [{lo:.2f}, "
            f"{hi:.2f}] on {axis}, an interval that excludes 1, so load, thermal or order effects moved the timings "
            f"more than the intervals allow; no winner is named{candidate}. Rerun with more repeats "
            f"(e.g. {max(2 * n, MIN_RUNS + 3)} per arm) on a quieter machine")


def _unit(df: pd.DataFrame) -> str:
    units = df["loss_unit"].dropna().unique()
    return str(units[0]) if len(units) == 1 else "pt"


def _log_se(row: dict[str, Any], speed: str) -> float:
    lo, hi = row.get(f"{speed}_lo"), row.get(f"{speed}_hi")
    if lo is None or hi is None or not (lo > 0 and hi > 0) or math.isnan(lo) or math.isnan(hi):
        return math.nan
    return (math.log(hi) - math.log(lo)) / (2 * _Z95)


def interaction_effects(df: pd.DataFrame, speed: str = "train_speedup") -> pd.DataFrame:
    """Factorial effects on ``speed`` with 95 % intervals: each technique's main effect (its single arm),
    every 2-way term (observed joint / product of the singles) and every 3-way term (the joint arm over what
    its pairs and singles predict), wherever the arms of the term were run. An interaction above 1 means the
    techniques compound, below 1 that they cancel (a main effect gets the same word here;
    ``lab.plots.tables.effects_table`` reads it as "faster" / "slower"); "within noise" when its interval
    contains 1. Intervals
    combine the arms' CIs on the log scale (log-normal, independent arms): approximate, and blank when an
    arm has no interval (fewer than 3 runs)."""
    import pandas as pd

    recs = {tuple(t.split("+")) if t else (): r for t, r in zip(df["techniques"], df.to_dict("records"), strict=True)}
    recs = {k: r for k, r in recs.items() if r["status"] != "error" and r.get(speed) == r.get(speed)
            and r.get(speed) is not None}
    singles = sorted({t for k in recs for t in k if len(k) >= 1})
    rows = []

    Parts = list[tuple[tuple[str, ...], int]]  # (arm's technique stack, +1 / -1 on the log scale)

    def term(kind: str, name: str, parts: Parts, loss_parts: Parts) -> None:
        if not all(k in recs for k, _ in parts):
            return
        log_value = sum(sign * math.log(recs[k][speed]) for k, sign in parts)
        se = math.sqrt(sum(_log_se(recs[k], speed) ** 2 for k, _ in parts))
        value = math.exp(log_value)
        lo, hi = (math.exp(log_value - _Z95 * se), math.exp(log_value + _Z95 * se)) if se == se else (math.nan,) * 2
        label = ("within noise" if lo <= 1.0 <= hi else "compound" if value > 1 else "cancel") if lo == lo else (
            "no interval")
        loss = sum(sign * recs[k]["acc_loss_pt"] for k, sign in loss_parts)
        rows.append({"term": kind, "techniques": name, "effect": value, "effect_lo": lo, "effect_hi": hi,
                     "verdict": label, "loss_effect_pt": loss})

    for a in singles:
        term("main", a, [((a,), 1)], [((a,), 1)])
    for a, b in itertools.combinations(singles, 2):
        key = tuple(t for t in recs if set(t) == {a, b})
        if key:
            term("2-way", "+".join(key[0]), [(key[0], 1), ((a,), -1), ((b,), -1)],
                 [(key[0], 1), ((a,), -1), ((b,), -1)])
    for a, b, c in itertools.combinations(singles, 3):
        triple = next((t for t in recs if set(t) == {a, b, c}), None)
        pairs = [next((t for t in recs if set(t) == set(p)), None) for p in ((a, b), (a, c), (b, c))]
        if triple is None or None in pairs:
            continue
        parts = [(triple, 1), *[(p, -1) for p in pairs], ((a,), 1), ((b,), 1), ((c,), 1)]
        term("3-way", "+".join(triple), parts, parts)
    return pd.DataFrame(rows, columns=["term", "techniques", "effect", "effect_lo", "effect_hi", "verdict",
                                       "loss_effect_pt"])


__all__ = ["best_under_budget", "busy_text", "interaction_effects", "noise_bar", "noise_floor", "pareto_front",
           "qualifying", "unstable_text", "verdict"]
