"""Ablations: a baseline plus named arms, run interleaved with repeats and seeds, summarised with CIs.

Why interleave (A B C A B C ...): on a shared machine the load drifts; running all of A then all of B
turns that drift into a fake speedup. Why a store write per run: a killed ablation keeps every finished
run and a resumed one skips them (label ``ablation:<key>:<arm>:r<repeat>``, see ``Ablation.key``, + config
hash).
Taught in ``notebooks/06_ablations``; the dashboard and ``lab.recipes`` build on it.

Definitions used by :func:`summarize` (one row per arm):

- ``train_speedup``: median end-to-end training time of the baseline / of the arm, over all its runs, with
  a bootstrap 95 % CI. End-to-end = training loop + pruning fine-tune + QAT fine-tune, because a technique
  that needs extra training is not free. ``step_speedup`` is the per-step ratio (pooled measured steps,
  warm-up excluded) of the main training loop only.
- ``infer_speedup``: baseline / arm median inference latency at the largest batch the runs stored
  (``batch_N`` with N = min(eval batch, test rows); ``latency_key`` overrides), pooled samples.
- ``acc_loss_pt``: 100 x (baseline - arm) of the primary metric (medians over runs), sign flipped for
  lower-is-better metrics, so positive always means worse. A lower-is-better metric (a loss, an error) is
  not a fraction, so its delta stays in the metric's own units; ``loss_unit`` says which ("pt" or the metric
  name). ``noise_pt`` = the larger seed-to-seed spread (IQR) of baseline and arm in the same unit;
  ``within_noise`` when ``|acc_loss_pt| <= noise_pt``. With fewer than two seeds there is no seed spread:
  ``noise_pt`` is NaN and ``within_noise`` None (unknown), never a false 0.
- ``baseline_learned``: False when the baseline's runs carry the "did not learn" tag (its trained metric is
  not clearly better than untrained or chance): every accuracy delta of that table is then meaningless.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lab.config import RunConfig
from lab.measure import bootstrap_ratio_ci, environment_stamp, median, spread
from lab.result import RunResult, new_run_id, utc_now_iso
from lab.store import ResultStore, config_hash
from lab.train import run

if TYPE_CHECKING:
    import pandas as pd

ProgressFn = Callable[[dict[str, Any]], None]
RunFn = Callable[..., RunResult]

COLUMNS = [
    "arm", "techniques", "status", "n_ok", "n_runs", "error", "train_time_s", "train_speedup",
    "train_speedup_lo", "train_speedup_hi", "step_speedup", "step_speedup_lo", "step_speedup_hi",
    "infer_speedup", "infer_speedup_lo", "infer_speedup_hi", "metric_name", "metric", "acc_loss_pt",
    "noise_pt", "loss_unit", "within_noise", "baseline_learned", "peak_memory_mb", "model_bytes", "size_ratio",
    "macs_per_sample", "macs_ratio", "why", "hardware_id", "device_name", "torch_version", "threads",
]


@dataclass
class Ablation:
    """A baseline config plus named arm configs (``arms["baseline"]`` is the baseline itself)."""

    name: str
    baseline: RunConfig
    arms: dict[str, RunConfig]
    techniques: dict[str, tuple[str, ...]] = field(default_factory=dict)  # arm -> technique stack

    def __post_init__(self) -> None:
        if not self.name or ":" in self.name:
            raise ValueError(f"Ablation.name={self.name!r} is invalid: allowed: a non-empty name without ':'")
        self.arms = {"baseline": self.baseline, **{k: v for k, v in self.arms.items() if k != "baseline"}}
        if len(self.arms) < 2:
            raise ValueError(f"Ablation.arms has {len(self.arms) - 1} arms besides the baseline: allowed: >= 1")
        for arm in self.arms:
            self.techniques.setdefault(arm, () if arm == "baseline" else (arm,))

    @property
    def key(self) -> str:
        """Name plus what makes runs comparable (workload, size, threads): ``stacked@ctr/tiny/t1``. Stored
        runs are grouped by it, so a stored view never mixes workloads, sizes or thread counts."""
        b = self.baseline
        return f"{self.name}@{b.workload}/{b.size}/t{b.threads or 0}"

    def label(self, arm: str, repeat: int) -> str:
        return f"ablation:{self.key}:{arm}:r{repeat}"

    def schedule(self, repeats: int, seeds: Sequence[int]) -> list[tuple[str, int, int, RunConfig]]:
        """(arm, repeat, seed, config) in run order: seeds outermost, then repeats, arms innermost, so
        every arm sees the same drift."""
        return [(arm, rep, s, cfg.with_overrides(seed=int(s)))
                for s in seeds for rep in range(repeats) for arm, cfg in self.arms.items()]


def _error_result(cfg: RunConfig, exc: BaseException) -> RunResult:
    return RunResult(run_id=new_run_id(), config=cfg.to_dict(), env=environment_stamp(), status="error",
                     error=f"{type(exc).__name__}: {exc}", started_at=utc_now_iso(), workload=cfg.workload)


def _finished(store: ResultStore, label: str, h: str) -> RunResult | None:
    for result, _, rh in store.iter_labelled(label=label, status="ok"):
        if rh == h:
            return result
    return None


def run_ablation(ablation: Ablation, repeats: int = 3, seeds: Sequence[int] = (0,),
                 store: ResultStore | None = None, progress: ProgressFn | None = None,
                 run_fn: RunFn | None = None) -> pd.DataFrame:
    """Run every (arm, repeat, seed) interleaved, store each as it finishes, skip those already in
    ``store``, and return :func:`summarize`'s table. A failing arm becomes an error row; the rest run.

    ``progress`` gets ``{"phase": "ablation", "done", "total", "arm", "repeat", "seed", "skipped"}``
    after each run (and the inner run's own events under ``"run"``). ``run_fn`` defaults to
    ``lab.run``; tests pass a fake to exercise failures cheaply."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} is invalid: allowed: an int >= 1")
    if not seeds:
        raise ValueError("seeds=() is invalid: allowed: one or more ints")
    run_fn = run if run_fn is None else run_fn
    plan = ablation.schedule(repeats, list(seeds))
    runs: dict[str, list[RunResult]] = {arm: [] for arm in ablation.arms}
    for i, (arm, rep, s, cfg) in enumerate(plan):
        label = ablation.label(arm, rep)
        done = _finished(store, label, config_hash(cfg.to_dict())) if store is not None else None
        skipped = done is not None
        if done is None:
            inner = (lambda ev, a=arm: progress({"phase": "run", "arm": a, "event": ev})) if progress else None
            try:
                done = run_fn(cfg, progress=inner, on_error="record")
            except Exception as exc:  # refused before any work, or a bug in the arm: an error row, not a crash
                done = _error_result(cfg, exc)
            if store is not None:
                store.add(done, label=label)
        runs[arm].append(done)
        if progress:
            progress({"phase": "ablation", "done": i + 1, "total": len(plan), "arm": arm, "repeat": rep,
                      "seed": s, "skipped": skipped, "status": done.status})
    return summarize(runs, techniques=ablation.techniques)


def load_ablation(ablation: Ablation, store: ResultStore, repeats: int = 3,
                  seeds: Sequence[int] = (0,)) -> dict[str, list[RunResult]]:
    """The finished runs of ``ablation`` in ``store`` (what a dashboard shows without re-running)."""
    runs: dict[str, list[RunResult]] = {arm: [] for arm in ablation.arms}
    for arm, rep, _, cfg in ablation.schedule(repeats, list(seeds)):
        found = _finished(store, ablation.label(arm, rep), config_hash(cfg.to_dict()))
        if found is not None:
            runs[arm].append(found)
    return runs


def stored_ablations(store: ResultStore) -> list[str]:
    """Keys (``Ablation.key``) of the ablations that have runs in ``store``, from their labels."""
    return sorted({lab.split(":")[1] for lab in store.labels() if lab.startswith("ablation:")})


def load_stored(store: ResultStore, name: str, hardware_id: str | None = None) -> dict[str, list[RunResult]]:
    """Every stored run of ablation key ``name`` grouped by arm (baseline first), optionally only those
    measured on ``hardware_id``: browse and compare past ablations without their recipe."""
    runs: dict[str, list[RunResult]] = {"baseline": []}
    for label in store.labels():
        parts = label.split(":")
        if len(parts) != 4 or parts[0] != "ablation" or parts[1] != name:
            continue
        for result in store.list_results(label=label):
            if hardware_id is None or result.hardware_id == hardware_id:
                runs.setdefault(parts[2], []).append(result)
    return runs


# ---------------------------------------------------------------------------------------------- summary

def end_to_end_train_s(result: RunResult) -> float:
    """Training loop + pruning fine-tune + QAT fine-tune + the ``auto`` precision probe: what a technique
    really costs to train."""
    extra = (result.details.get("prune", {}).get("finetune", {}).get("time_s", 0.0)
             + result.details.get("quant", {}).get("qat", {}).get("time_s", 0.0)
             + result.details.get("precision", {}).get("auto", {}).get("probe_s", 0.0))
    return float(result.train_time_s) + float(extra)


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


def stored_latency_key(results: Sequence[RunResult]) -> str:
    """The largest ``batch_N`` latency key the runs stored (a test split under 256 rows stores ``batch_<n>``)."""
    keys = {k for r in results for k in r.latency_ms if k.startswith("batch_") and k[6:].isdigit()}
    return max(keys, key=lambda k: int(k[6:]), default="batch_256")


def summarize(runs: dict[str, list[RunResult]], techniques: dict[str, tuple[str, ...]] | None = None,
              baseline: str = "baseline", latency_key: str | None = None) -> pd.DataFrame:
    """One row per arm (columns in ``COLUMNS``; see the module docstring for the definitions)."""
    import pandas as pd

    techniques = techniques or {}
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
                why="; ".join(dict.fromkeys(t for r in ok for t in r.why)),
                hardware_id=first.hardware_id, device_name=first.env.get("device_name"),
                torch_version=first.env.get("torch_version") or first.env.get("torch"),
                threads=first.env.get("torch_threads"),
            )
            unknown = math.isnan(loss) or math.isnan(row["noise_pt"])
            row["within_noise"] = None if unknown else bool(abs(loss) <= row["noise_pt"])
            if arm == baseline:  # exactly 1 by definition, not a bootstrap artefact
                for k in ("train", "step", "infer"):
                    row.update({f"{k}_speedup": 1.0, f"{k}_speedup_lo": 1.0, f"{k}_speedup_hi": 1.0})
                row.update(acc_loss_pt=0.0, within_noise=True)
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


# ---------------------------------------------------------------------------------------------- analysis

def _ok(df: pd.DataFrame, speed: str) -> pd.DataFrame:
    return df[(df["status"] != "error") & df[speed].notna() & df["acc_loss_pt"].notna()]


def pareto_front(df: pd.DataFrame, speed: str = "train_speedup") -> list[str]:
    """Arms no other arm beats on both speed (higher) and accuracy loss (lower), fastest first."""
    ok = _ok(df, speed)
    front = []
    for _, r in ok.iterrows():
        dominated = ((ok[speed] >= r[speed]) & (ok["acc_loss_pt"] <= r["acc_loss_pt"])
                     & ((ok[speed] > r[speed]) | (ok["acc_loss_pt"] < r["acc_loss_pt"]))).any()
        if not dominated:
            front.append((r[speed], r["arm"]))
    return [arm for _, arm in sorted(front, reverse=True)]


def best_under_budget(df: pd.DataFrame, budget_pt: float = 1.0, speed: str = "train_speedup",
                      conservative: bool = False) -> pd.Series | None:
    """The fastest arm whose accuracy loss is at most ``budget_pt`` points (None if none qualifies).
    ``conservative`` ranks by the CI's lower bound, so a lucky run cannot win."""
    if budget_pt < 0:
        raise ValueError(f"budget_pt={budget_pt!r} is invalid: allowed: >= 0 (points of accuracy)")
    ok = _ok(df, speed)
    ok = ok[ok["acc_loss_pt"] <= budget_pt]
    if ok.empty:
        return None
    key = f"{speed}_lo" if conservative and f"{speed}_lo" in ok else speed
    return ok.loc[ok[key].idxmax()]


def interaction_effects(df: pd.DataFrame, speed: str = "train_speedup") -> pd.DataFrame:
    """For every pair of techniques whose single and joint arms were run: expected speedup if they
    compound (product of the singles) vs observed, and accuracy loss expected (sum) vs observed.
    ``speed_interaction`` > 1 means they compound better than independent, < 1 that they cancel."""
    import pandas as pd

    by = {tuple(t.split("+")) if t else (): r for t, r in zip(df["techniques"], df.to_dict("records"), strict=True)}
    rows = []
    for techs, r in by.items():
        if len(techs) != 2 or (techs[0],) not in by or (techs[1],) not in by:
            continue
        a, b = by[(techs[0],)], by[(techs[1],)]
        expected = a[speed] * b[speed]
        exp_loss = a["acc_loss_pt"] + b["acc_loss_pt"]
        inter = r[speed] / expected if expected else math.nan
        rows.append({"pair": "+".join(techs), "speedup_a": a[speed], "speedup_b": b[speed],
                     "expected_speedup": expected, "observed_speedup": r[speed], "speed_interaction": inter,
                     "expected_loss_pt": exp_loss, "observed_loss_pt": r["acc_loss_pt"],
                     "verdict": "compound" if inter > 1.05 else "cancel" if inter < 0.95 else "independent"})
    return pd.DataFrame(rows, columns=["pair", "speedup_a", "speedup_b", "expected_speedup", "observed_speedup",
                                       "speed_interaction", "expected_loss_pt", "observed_loss_pt", "verdict"])
