"""One derived record per arm: every figure a view of an ablation shows (table, bars, plot, details, why,
verdict), computed once from ``summarize``'s table and the arm's stored runs, each with its text written once.

Why one record: the views used to derive their own numbers (the table's size ratio was arm / baseline under
a "x smaller" header while the details said baseline / arm; the table's MACs counted the dense kernels, the
"why" the zeros a kernel could skip; the table's inference speedup was against the baseline's runs, the
details' against the arm's own float model in the same process) and so contradicted each other. Here:

- every ratio reads as "better when >= 1" and its text names the direction: ``2.1x smaller`` (``1.3x larger``
  below 1), ``1.67x fewer`` (``1.2x more``), speedups ``1.36x`` (> 1: faster);
- two measurements of one quantity are two named figures: ``speed["infer_speedup"]`` is against the
  baseline arm's runs, ``paired`` against the arm's own float / dense model interleaved in the same process
  (the cleaner one: no drift between runs), both at ``batch``; ``macs`` are the MACs the dense kernels run,
  ``macs_if_skipped`` those a kernel that skipped zeros would;
- numbers are rounded to their interval's precision (:func:`fmt_ratio`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lab.ablation.summary import AA_ARM, AXES, SPEED_AXIS, stored_latency_key
from lab.measure import bootstrap_ratio_ci, median
from lab.precision import not_applicable_reason
from lab.result import RunResult, section

if TYPE_CHECKING:
    import pandas as pd

#: The arm names a reader sees.
AA_LABEL = "A/A (baseline again: noise floor)"


def _finite(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def decimals_for(lo: float, hi: float) -> int:
    """Decimals that show an interval's half-width to one significant digit (1 to 3): ``1.4x [1.1, 1.7]``,
    ``1.00x [0.98, 1.02]``; a digit finer than the interval is noise, not information."""
    half = abs(hi - lo) / 2
    if not half > 0 or not math.isfinite(half):
        return 2
    return max(1, min(3, -math.floor(math.log10(half))))


def fmt_ratio(value: float, lo: float = math.nan, hi: float = math.nan) -> str:
    """``1.36x [1.12, 1.71]`` rounded to the interval's precision; ``1.36x`` (3 significant digits) without one."""
    if not _finite(value):
        return ""
    if _finite(lo) and _finite(hi):
        d = decimals_for(lo, hi)
        return f"{value:.{d}f}x [{lo:.{d}f}, {hi:.{d}f}]"
    return f"{value:.3g}x"


def fmt_sig(value: Any, digits: int = 3) -> str:
    """A figure without an interval at ``digits`` significant digits, never in exponent form: ``191``, ``15.4``,
    ``0.775``, ``1370`` (``.3g`` would print ``1.37e+03``); empty when missing. The rounding ``fmt_ratio``
    uses without an interval, for the pages' absolute figures (GFLOP/s, GB/s, microseconds)."""
    if not _finite(value):
        return ""
    v = float(value)
    if v == 0:
        return "0"
    exp = math.floor(math.log10(abs(v)))
    if exp >= digits - 1:
        return f"{round(v, digits - 1 - exp):.0f}"
    return f"{v:.{digits}g}"


@dataclass(frozen=True)
class Ratio:
    """A ratio that is better when >= 1, with its optional 95 % interval and the words for its direction."""

    value: float
    lo: float = math.nan
    hi: float = math.nan
    better: str = ""  # the word when >= 1 ("smaller", "fewer"); "" for a speedup
    worse: str = ""  # the word below 1 ("larger", "more")

    @property
    def has_ci(self) -> bool:
        return _finite(self.lo) and _finite(self.hi)

    @property
    def excludes_one(self) -> bool:
        return self.has_ci and not self.lo <= 1.0 <= self.hi

    @property
    def text(self) -> str:
        """A speedup: ``1.36x [1.12, 1.71]``; a size or count: ``2.1x smaller`` / ``1.3x larger``."""
        if not self.better:
            return fmt_ratio(self.value, self.lo, self.hi)
        if not _finite(self.value) or self.value <= 0:
            return ""
        if abs(self.value - 1) < 0.005:
            return {"smaller": "same size", "fewer": "as many"}.get(self.better, "same")
        if self.value >= 1:
            return f"{self.value:.3g}x {self.better}"
        return f"{1 / self.value:.3g}x {self.worse}"


def _ratio(value: Any, lo: Any = math.nan, hi: Any = math.nan, better: str = "", worse: str = "") -> Ratio | None:
    if not _finite(value):
        return None
    return Ratio(float(value), float(lo) if _finite(lo) else math.nan, float(hi) if _finite(hi) else math.nan,
                 better, worse)


@dataclass(frozen=True)
class ArmRecord:
    """Every figure of one arm. ``speed[column]`` is None where the arm cannot change that axis (or has no
    finished run); ``not_run``: the arm has no run at all (a cancelled ablation never reached it)."""

    arm: str
    label: str
    status: str
    n_ok: int
    n_runs: int
    axes: tuple[str, ...]
    error: str | None = None
    refused: str | None = None  # the capability gate's reason: "does not apply here"
    speed: dict[str, Ratio | None] = field(default_factory=dict)
    batch: int | None = None  # the inference figures' batch
    paired: Ratio | None = None  # inference against its own float / dense model, same process
    paired_what: str = ""
    size: Ratio | None = None  # baseline bytes / arm bytes
    base_bytes: float | None = None
    arm_bytes: float | None = None
    macs: Ratio | None = None  # dense MACs per sample, baseline / arm
    macs_if_skipped: Ratio | None = None  # if a kernel skipped the pruned zeros
    why: tuple[str, ...] = ()  # the runs' tags, said once, without the numbers stated here
    # what the machine card and the baseline's phases allow on the arm's main axis (lab.measure.ceiling)
    ceiling: float | None = None
    share_of_ceiling: float | None = None
    ceiling_basis: str = ""
    share_why: str = ""

    @property
    def not_run(self) -> bool:
        """No run at all and no stored error: a cancelled (or still running) ablation never reached it."""
        return self.n_runs == 0 and not self.error

    def figure_lines(self) -> list[str]:
        """The record's own sentences: what the details panel and the "why" say, word for word."""
        out = []
        inf = self.speed.get("infer_speedup")
        at = f" at batch {self.batch}" if self.batch else ""
        if self.paired is not None:
            out.append(f"inference {self.paired_what}{at}: {self.paired.text}"
                       + (f"; against the baseline's runs {inf.text}" if inf is not None else ""))
            if inf is not None and self.paired.has_ci and inf.has_ci and (
                    self.paired.hi < inf.lo or inf.hi < self.paired.lo):
                out.append("the two inference figures disagree beyond their intervals: the paired one (same "
                           "process, interleaved) carries no drift between runs; read the other with the A/A arm")
        if self.size is not None and _finite(self.base_bytes) and _finite(self.arm_bytes) and self.size.value != 1:
            out.append(f"model {self.base_bytes / 1e3:.3g} kB -> {self.arm_bytes / 1e3:.3g} kB ({self.size.text})")
        if self.macs_if_skipped is not None:
            dense = self.macs.text if self.macs is not None else "?"
            out.append(f"{self.macs_if_skipped.text} MACs if zeros were skipped (theory); the dense kernels run "
                       f"{'as many as the baseline' if dense == 'as many' else dense}")
        if self.ceiling is not None and self.share_of_ceiling is not None:
            out.append(f"{100 * self.share_of_ceiling:.0f} % of its ceiling {fmt_sig(self.ceiling)}x on this machine "
                       f"({self.ceiling_basis})" + (f": {self.share_why}" if self.share_why else ""))
        return out


#: A parenthesis holding a figure (``(0.79x)``, ``(1.67x fewer MACs, 1.00x measured)``): the record states it.
_FIGURE = re.compile(r"\s*\([^()]*\d(?:\.\d+)?x[^()]*\)")


def _clean_tag(tag: str) -> str:
    tag = _FIGURE.sub("", tag).strip()
    if tag.startswith("stayed float: "):
        layers = ", ".join(f"`{n.strip()}`" for n in tag[len("stayed float: "):].split(","))
        tag = f"layers kept in float (not swapped to int8): {layers}"
    return tag


#: A number inside a tag (``14%``, ``8.95 ms``, ``x1.11``): tags that differ only in these are one tag.
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def _why(text: Any) -> tuple[str, ...]:
    """The tags said once each, numbers stated elsewhere removed, with the count of runs that said them. Tags
    that differ only in their numbers (each seed's "data-bound: 14% of the step ...") are one tag: the first
    run's words, and the count says its figures are that run's."""
    first: dict[str, str] = {}
    counts: dict[str, int] = {}
    varied: set[str] = set()
    for tag in (t.strip() for t in (text if isinstance(text, str) else "").split(";")):
        if tag:
            said = _clean_tag(tag)
            key = _NUMBER.sub("#", said)
            if key in first and first[key] != said:
                varied.add(key)
            first.setdefault(key, said)
            counts[key] = counts.get(key, 0) + 1
    return tuple(first[k] + (f" (in {n} runs{'; figures from the first' if k in varied else ''})" if n > 1 else "")
                 for k, n in counts.items())


def _pooled_paired(runs: Sequence[RunResult], key: str) -> tuple[Ratio | None, str]:
    """The arm's own same-process inference comparison at ``key``, pooled over its runs: int8 against its float
    model (``details["quant"]["latency"]``) or pruned against dense (``details["pruning"]["inference"]``)."""
    ref: list[float] = []
    arm: list[float] = []
    what = ""
    for r in runs:
        lat = ((r.details.get("quant") or {}).get("latency") or {}).get(key) or {}
        samples = lat.get("samples_ms") or {}
        # compiled int8 (PT2E) against fp32 compiled the same way; eager int8 against its eager float model
        ref_key = "fp32_compiled" if samples.get("fp32_compiled") else "float"
        if samples.get(ref_key) and samples.get("int8"):
            ref += list(samples[ref_key])
            arm += list(samples["int8"])
            what = ("int8 compiled vs fp32 compiled the same way (same process, interleaved)"
                    if ref_key == "fp32_compiled" else "int8 vs its own float model (same process, interleaved)")
            continue
        inf = section(r, "pruning").get("inference") or {}
        if inf.get("dense_ms") and inf.get("pruned_ms") and f"batch_{inf.get('batch')}" == key:
            ref += list(inf["dense_ms"])
            arm += list(inf["pruned_ms"])
            what = "pruned vs its own dense model (same process)"
    if not ref or not arm:
        return None, ""
    value, lo, hi = bootstrap_ratio_ci(ref, arm)
    return _ratio(value, lo, hi), what


@dataclass(frozen=True)
class AblationRecord:
    """Every arm's record (baseline first), the table they came from and the machine they were measured on."""

    arms: dict[str, ArmRecord]
    table: Any  # summarize's DataFrame
    hardware_ids: tuple[str, ...] = ()
    workload: str | None = None

    def verdict(self, budget_pt: float = 1.0, speed: str = "train_speedup") -> dict[str, Any]:
        from lab.ablation.verdicts import verdict

        return verdict(self.table, budget_pt, speed)


def _ceiling(row: dict[str, Any]) -> dict[str, Any]:
    """The arm's ceiling fields from ``summarize``'s row (NaN / None where it has none)."""
    ceiling, share = row.get("ceiling"), row.get("share_of_ceiling")
    return {"ceiling": float(ceiling) if _finite(ceiling) else None,
            "share_of_ceiling": float(share) if _finite(share) else None,
            "ceiling_basis": row.get("ceiling_basis") if isinstance(row.get("ceiling_basis"), str) else "",
            "share_why": row.get("share_why") if isinstance(row.get("share_why"), str) else ""}


def build_record(df: pd.DataFrame, runs: dict[str, list[RunResult]] | None = None) -> AblationRecord:
    """The record of every arm of ``summarize``'s table ``df`` (``runs``: the arms' stored runs, for the
    figures only a run's details hold: the paired inference and the MACs a kernel skipping zeros would run)."""
    runs = runs or {}
    rows = df.to_dict("records")
    base = next((r for r in rows if r["arm"] == "baseline"), {})
    base_bytes, base_macs = base.get("model_bytes"), base.get("macs_per_sample")
    ok_runs = {a: [r for r in rs if r.status == "ok"] for a, rs in runs.items()}
    key = stored_latency_key(ok_runs.get("baseline") or [r for rs in ok_runs.values() for r in rs])
    batch = int(key[6:]) if key[6:].isdigit() else None
    arms: dict[str, ArmRecord] = {}
    for row in rows:
        arm = str(row["arm"])
        # summarize writes the axes of every arm that ran (and has already blanked the others' speedups)
        axes = tuple(a for a in row["axes"].split(",") if a) if isinstance(row.get("axes"), str) else AXES
        n_ok = int(row["n_ok"]) if _finite(row.get("n_ok")) else 0
        n_runs = int(row["n_runs"]) if _finite(row.get("n_runs")) else 0
        speed = {c: _ratio(row.get(c), row.get(f"{c}_lo"), row.get(f"{c}_hi")) for c in SPEED_AXIS}
        bytes_, macs_ = row.get("model_bytes"), row.get("macs_per_sample")
        other = arm != "baseline"
        size = (_ratio(base_bytes / bytes_, better="smaller", worse="larger")
                if other and "size" in axes and _finite(base_bytes) and _finite(bytes_) and bytes_ else None)
        macs = (_ratio(base_macs / macs_, better="fewer", worse="more")
                if other and _finite(base_macs) and _finite(macs_) and macs_ else None)
        mine = ok_runs.get(arm, [])
        skipped = [float(section(r, "pruning")["macs_ratio"]) for r in mine
                   if _finite(section(r, "pruning").get("macs_ratio"))]
        paired, what = _pooled_paired(mine, key) if "inference" in axes else (None, "")
        error = row.get("error") if isinstance(row.get("error"), str) else None
        arms[arm] = ArmRecord(
            arm=arm, label=AA_LABEL if arm == AA_ARM else arm, status=str(row.get("status") or ""), n_ok=n_ok,
            n_runs=n_runs, axes=axes, error=error, refused=not_applicable_reason(error), speed=speed, batch=batch,
            paired=paired, paired_what=what, size=size, base_bytes=base_bytes if size else None,
            arm_bytes=bytes_ if size else None, macs=macs,
            macs_if_skipped=_ratio(median(skipped), better="fewer", worse="more") if skipped else None,
            why=_why(row.get("why")), **_ceiling(row))
    hw = tuple(dict.fromkeys(str(h) for h in df.get("hardware_id", []) if isinstance(h, str)))
    base_run = next(iter(ok_runs.get("baseline") or []), None)
    cfg = (base_run.config if base_run is not None else None) or {}
    workload = cfg.get("workload_spec") or cfg.get("workload")
    if workload and cfg.get("size"):
        workload = f"{workload} (size {cfg['size']})"
    return AblationRecord(arms=arms, table=df, hardware_ids=hw, workload=workload)


__all__ = ["AA_LABEL", "AblationRecord", "ArmRecord", "Ratio", "build_record", "decimals_for", "fmt_ratio",
           "fmt_sig"]
