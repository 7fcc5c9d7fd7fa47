"""How right the doctor was, in figures a user can act on: per technique and per set of cases.

Over verified rows (:func:`lab.doctor.compare`), grouped into cases (one model each):

- per technique, the median and max ``|predicted / measured - 1|`` of the **speedup**, and of the **step
  time** (``predicted_step_ms``: the profiled baseline's step over the predicted speedup, against the step
  the verification measured; rows without both fall back to ``|measured / predicted - 1|``, the step-time
  error on the same baseline);
- **coverage**: the share of measured speedups inside the predicted interval (the point, not an overlap),
  also once each interval is floored at its own verification's A/A deviation (:func:`covered_at_aa`), and how
  many intervals are under 1 % wide (:func:`zero_width`);
- for the prescription (the training-step rows of a case in the prescription's order; the pick is the first
  row, or the baseline when nothing was prescribed): **top-1** (the pick is the measured best or within its
  noise, :func:`lab.doctor.top1_hit`), **regret** ``1 - measured(pick) / max(1, max measured)`` (mean and
  worst over cases: what a user who tries only the pick leaves; keeping the baseline is always an option),
  how often the pick measured **slower than the baseline** (at all, and beyond the A/A noise), how often
  nothing was prescribed, each **over the run the pick was prescribed for**
  (:func:`lab.doctor.verification.over_the_run`: an arm's measured one-off, compile's first step, charged over
  that run as the doctor charged its predicted one; ``top1_per_step`` keeps the per-step figure beside it), and
  the **Spearman** rank correlation between predicted and measured speedups (mean over cases with >= 3 rows);
- the **A/A noise**: ``|A/A - 1|`` of each case's verification (median, worst), the floor under every figure.

Pure functions over plain dicts (tests feed synthetic predicted / measured pairs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lab.doctor.verification import over_the_run, picked, slower, top1_hit
from lab.measure import median

Row = Mapping[str, Any]


def _ranks(xs: Sequence[float]) -> list[float]:
    """Ranks from 1, ties sharing their average rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's over average ranks); ``None`` below 3 pairs or a constant side."""
    if len(x) != len(y):
        raise ValueError(f"spearman: {len(x)} x values against {len(y)} y values")
    if len(x) < 3:
        return None
    rx, ry = _ranks(x), _ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else None


def _measured(rows: Iterable[Row], axis: str = "train_step") -> list[Row]:
    return [r for r in rows if r.get("axis") == axis and r.get("measured") is not None]


def regret(rows: Sequence[Row], axis: str = "train_step") -> float | None:
    """``1 - measured(pick) / best`` on ``axis`` (rows in the prescription's order); the pick is the first row,
    or the baseline (1.0) when nothing was prescribed (:func:`lab.doctor.verification.picked`), and the best is
    the best measured or the baseline (keeping it is always an option: a pick measured 0.8x while everything
    else lost too left 20 %). 0: the pick was the best. ``None`` when nothing was measured."""
    on = _measured(rows, axis)
    if not on:
        return None
    pick = picked(rows, axis)
    got = pick["measured"] if pick is not None else 1.0
    return max(0.0, 1.0 - got / max(1.0, *(r["measured"] for r in on)))


def case_spearman(rows: Sequence[Row], axis: str = "train_step") -> float | None:
    on = _measured(rows, axis)
    return spearman([r["predicted"] for r in on], [r["measured"] for r in on])


def covered(r: Row) -> bool | None:
    """Is the measured speedup inside the predicted interval? ``None`` when not measured."""
    m = r.get("measured")
    return None if m is None else bool(r["predicted_lo"] <= m <= r["predicted_hi"])


def covered_at_aa(r: Row) -> bool | None:
    """Is the measured speedup inside the predicted interval once that interval is at least as wide as the A/A
    deviation of the very verification that measured it (``x/ A/A``)? A measurement cannot check a prediction
    closer than it reproduces itself. ``None`` when not measured."""
    m = r.get("measured")
    if m is None:
        return None
    aa = r.get("aa_measured")
    w = abs(math.log(aa)) if aa and aa > 0 else 0.0
    s = r["predicted"]
    return bool(min(r["predicted_lo"], s * math.exp(-w)) <= m <= max(r["predicted_hi"], s * math.exp(w)))


def zero_width(r: Row) -> bool:
    """An interval under 1 % wide (``1.11x [1.11, 1.11]`` as printed): no honest interval is that narrow."""
    return bool(r["predicted_hi"] <= r["predicted_lo"] * 1.01)


def step_error(r: Row) -> float | None:
    """``predicted step / measured step - 1`` (train-step rows): in ms when both were recorded, else from the
    speedups on the same baseline."""
    if r.get("axis") != "train_step" or r.get("measured") is None:
        return None
    p, m = r.get("predicted_step_ms"), r.get("measured_step_ms")
    return p / m - 1 if p and m else r["measured"] / r["predicted"] - 1


def _spread(xs: Sequence[float]) -> dict[str, float | None]:
    a = [abs(x) for x in xs]
    return {"median": median(a) if a else None, "max": max(a) if a else None}


def scorecard(cases: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The figures over ``cases`` (each ``{"rows": [...]}``, rows in the diagnosis' ranked order)."""
    rows = [r for c in cases for r in c["rows"]]
    errs = [r["error"] for r in rows if r.get("error") is not None]
    cov = [x for r in rows if (x := covered(r)) is not None]
    cov_aa = [x for r in rows if (x := covered_at_aa(r)) is not None]
    runs = [over_the_run(c["rows"]) for c in cases]  # the pick scored over the run it was prescribed for
    hits = [h for rs in runs if (h := top1_hit(rs)) is not None]
    step_hits = [h for c in cases if (h := top1_hit(c["rows"])) is not None]
    regrets = [g for rs in runs if (g := regret(rs)) is not None]
    rhos = [s for c in cases if (s := case_spearman(c["rows"])) is not None]
    zero = sum(1 for r in rows if zero_width(r))
    slow = [x for rs in runs if (x := slower(rs)) is not None]
    slow_noise = [x for rs in runs if (x := slower(rs, beyond_noise=True)) is not None]
    none = sum(1 for c in cases if _measured(c["rows"]) and picked(c["rows"]) is None)
    aa = [abs(a - 1) for c in cases if (a := next((r.get("aa_measured") for r in c["rows"]
                                                   if r.get("aa_measured")), None))]
    per: dict[str, dict[str, Any]] = {}
    for t in dict.fromkeys(r["technique"] for r in rows):
        mine = [r for r in rows if r["technique"] == t]
        e = [r["error"] for r in mine if r.get("error") is not None]
        se = [x for r in mine if (x := step_error(r)) is not None]
        c = [x for r in mine if (x := covered(r)) is not None]
        per[t] = {"n": len(e), "speedup_error": _spread(e), "step_error": _spread(se),
                  "coverage": sum(c) / len(c) if c else None}
    return {"cases": len(cases), "pairs": len(errs), "median_abs_error": _spread(errs)["median"],
            "max_abs_error": _spread(errs)["max"], "coverage": sum(cov) / len(cov) if cov else None,
            "coverage_at_aa": sum(cov_aa) / len(cov_aa) if cov_aa else None,
            "zero_width": zero, "top1_hits": sum(hits), "top1_n": len(hits), "nothing_prescribed": none,
            "slower": sum(slow), "slower_rate": sum(slow) / len(slow) if slow else None,
            "slower_beyond_noise": sum(slow_noise),
            "top1": sum(hits) / len(hits) if hits else None,
            "top1_per_step": sum(step_hits) / len(step_hits) if step_hits else None,
            "charged_one_off": sum(1 for rs in runs for r in rs if "measured_per_step" in r),
            "regret_mean": sum(regrets) / len(regrets) if regrets else None,
            "regret_worst": max(regrets) if regrets else None,
            "spearman_mean": sum(rhos) / len(rhos) if rhos else None, "aa_noise": _spread(aa), "per_technique": per}


def _p(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def format_scorecard(card: Mapping[str, Any], title: str = "") -> str:
    """A few lines: the set's headline figures, then one line per technique."""
    rho = card["spearman_mean"]
    head = (f"{title + ': ' if title else ''}{card['cases']} case(s), {card['pairs']} pairs; median |speedup error| "
            f"{_p(card['median_abs_error'])} (max {_p(card['max_abs_error'])}); measured inside the interval "
            f"{_p(card['coverage'])} ({_p(card['coverage_at_aa'])} at the check's own A/A noise); zero-width "
            f"intervals {card['zero_width']}")
    lines = [head]
    if card["aa_noise"]["max"] is not None:
        lines.append(f"  A/A arm (the baseline against itself): |A/A - 1| median {_p(card['aa_noise']['median'])}, "
                     f"worst {_p(card['aa_noise']['max'])}: no figure here is finer than that")
    if card["top1_n"]:
        lines.append(f"  top-1 {card['top1_hits']} of {card['top1_n']} ({_p(card['top1'])}); regret mean "
                     f"{_p(card['regret_mean'])}, worst {_p(card['regret_worst'])}; Spearman "
                     + ("n/a" if rho is None else f"{rho:+.2f}"))
        if card.get("charged_one_off"):
            lines.append(f"  scored over the run the pick is for ({card['charged_one_off']} rows charged their "
                         f"measured one-off); per step, one-offs not charged: top-1 {_p(card['top1_per_step'])}")
        if "slower" in card:
            lines.append(f"  pick slower than the baseline: {card['slower']} of {card['top1_n']} "
                         f"({card['slower_beyond_noise']} beyond the A/A noise); nothing prescribed: "
                         f"{card['nothing_prescribed']}")
    lines.append(f"  {'technique':<17} {'n':>3} {'speedup |err| med / max':>24} {'step |err| med / max':>21} "
                 f"{'coverage':>9}")
    for t, v in card["per_technique"].items():
        se, st = v["speedup_error"], v["step_error"]
        lines.append(f"  {t:<17} {v['n']:>3} {_p(se['median']):>11} / {_p(se['max']):<10} "
                     f"{_p(st['median']):>9} / {_p(st['max']):<9} {_p(v['coverage']):>9}")
    return "\n".join(lines)


__all__ = ["case_spearman", "covered", "covered_at_aa", "format_scorecard", "regret", "scorecard", "spearman",
           "step_error", "zero_width"]
