"""Running an ablation: the arms, interleaved with repeats and seeds, each run stored as it finishes.

Why interleave (A B C A B C ...): on a shared machine the load drifts; running all of A then all of B
turns that drift into a fake speedup. Why a store write per run: a killed ablation keeps every finished
run and a resumed one skips them (label ``ablation:<key>:<arm>:r<repeat>``, see ``Ablation.key``, + config
hash).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lab.ablation.summary import AA_ARM, AXES, summarize
from lab.config import RunConfig
from lab.measure import environment_stamp
from lab.result import RunResult, new_run_id, utc_now_iso
from lab.store import ResultStore, config_hash
from lab.train import run

if TYPE_CHECKING:
    import pandas as pd

ProgressFn = Callable[[dict[str, Any]], None]
RunFn = Callable[..., RunResult]



@dataclass
class Ablation:
    """A baseline config plus named arm configs (``arms["baseline"]`` is the baseline itself).

    ``aa`` adds the A/A arm: the baseline config again under its own name, run interleaved like any arm.
    Its speedup is the noise floor of the table (its interval must contain 1). ``axes[arm]`` are the axes
    the arm's techniques can change (:data:`AXES`); an arm competes only on those (default: every axis)."""

    name: str
    baseline: RunConfig
    arms: dict[str, RunConfig]
    techniques: dict[str, tuple[str, ...]] = field(default_factory=dict)  # arm -> technique stack
    axes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # arm -> axes it can change
    aa: bool = True

    def __post_init__(self) -> None:
        if not self.name or ":" in self.name or "#" in self.name:
            raise ValueError(f"Ablation.name={self.name!r} is invalid: allowed: a non-empty name without ':' or '#'")
        self.arms = {"baseline": self.baseline,
                     **{k: v for k, v in self.arms.items() if k not in ("baseline", AA_ARM)}}
        if len(self.arms) < 2:
            raise ValueError(f"Ablation.arms has {len(self.arms) - 1} arms besides the baseline: allowed: >= 1")
        if self.aa:
            self.arms[AA_ARM] = self.baseline
        for arm in self.arms:
            self.techniques.setdefault(arm, () if arm in ("baseline", AA_ARM) else (arm,))
            self.axes.setdefault(arm, AXES)

    @property
    def key(self) -> str:
        """Name, what makes runs comparable (workload, size, threads) and a hash of the arm list:
        ``stacked@ctr/tiny/t1#1a2b3c4d``. Stored runs are grouped by it, so a stored view never mixes
        workloads, sizes, thread counts or two different stacks under one name."""
        b = self.baseline
        arms = json.dumps(sorted((a, config_hash(c.to_dict())) for a, c in self.arms.items()))
        return f"{self.name}@{b.workload}/{b.size}/t{b.threads or 0}#{hashlib.sha1(arms.encode()).hexdigest()[:8]}"

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
    return summarize(runs, techniques=ablation.techniques, axes=ablation.axes)


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

__all__ = ["Ablation", "ProgressFn", "RunFn", "load_ablation", "load_stored", "run_ablation", "stored_ablations"]
