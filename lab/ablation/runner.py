"""Running an ablation: the arms, interleaved with repeats and seeds, each run stored as it finishes.

Why interleave (A B C A B C ...): on a shared machine the load drifts; running all of A then all of B
turns that drift into a fake speedup. Why a store write per run: a killed ablation keeps every finished
run and a resumed one skips them (label ``ablation:<key>:<arm>:r<repeat>``, see ``Ablation.key``, + config
hash).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lab import jobs
from lab.ablation.summary import AA_ARM, AXES, summarize
from lab.config import RunConfig, load_workload
from lab.loop import raise_if_interrupted
from lab.measure import contention, environment_stamp
from lab.memory.roles import step_peak_where_free
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
    #: Arms the recipe left out on this machine -> why (an emulated bf16 cannot pay: :func:`lab.recipes.payable`).
    skipped: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or ":" in self.name or "#" in self.name:
            raise ValueError(f"Ablation.name={self.name!r} is invalid: allowed: a non-empty name without ':' or '#'")
        # the runs are prepared here: a workload spec is loaded, so the key and every label name the workload
        self.baseline = load_workload(self.baseline)
        self.arms = {"baseline": self.baseline,
                     **{k: load_workload(v) for k, v in self.arms.items() if k not in ("baseline", AA_ARM)}}
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
        """(arm, repeat, seed, config) in run order: seeds outermost, then repeats, arms innermost, so every
        arm sees the same drift; each round starts one arm later than the one before (round r runs arms r, r+1,
        ...), so no arm always runs first: with the baseline always first, a warm-up or order effect lands on
        it alone, and the A/A arm (always second) read 1.36x [1.12, 1.71] against it on a busy machine."""
        arms = list(self.arms.items())
        plan = []
        for i, (s, rep) in enumerate((s, rep) for s in seeds for rep in range(repeats)):
            k = i % len(arms)
            plan += [(arm, rep, s, cfg.with_overrides(seed=int(s))) for arm, cfg in arms[k:] + arms[:k]]
        return plan


def _error_result(cfg: RunConfig, exc: BaseException) -> RunResult:
    return RunResult(run_id=new_run_id(), config=cfg.to_dict(), env=environment_stamp(), status="error",
                     error=f"{type(exc).__name__}: {exc}", started_at=utc_now_iso(), workload=cfg.workload)


def _finished(store: ResultStore, label: str, h: str) -> RunResult | None:
    for result, _, rh in store.iter_labelled(label=label, status="ok"):
        if rh == h:
            return result
    return None


class _Progress:
    """Where the ablation stands, as the job state the dashboard shows: run i/n, arm, step, elapsed and an
    estimate of what is left (mean time of the runs trained so far x runs left, or within the first run
    its step rate)."""

    def __init__(self, total: int, hb: jobs.Heartbeat | None) -> None:
        self.total, self.hb = total, hb
        self.t0 = time.monotonic()
        self.trained_s: list[float] = []
        self.run_t0 = self.t0
        self.state: dict[str, Any] = {"done": 0, "total": total, "started_at": time.time()}

    def start_run(self, i: int, arm: str, rep: int, seed: int) -> None:
        self.run_t0 = time.monotonic()
        self.state.update(run=i + 1, arm=arm, repeat=rep, seed=seed, step=0, total_steps=None,
                          run_started_at=time.time())
        self._publish()

    def step(self, event: dict[str, Any]) -> None:
        if "step" in event:
            self.state.update(step=event["step"], total_steps=event.get("total_steps"), phase=event.get("phase"))
        self._publish()

    def end_run(self, i: int, trained: bool) -> None:
        if trained:
            self.trained_s.append(time.monotonic() - self.run_t0)
        self.state["done"] = i + 1
        self._publish()

    def _publish(self) -> None:
        now = time.monotonic()
        in_run = now - self.run_t0
        left = self.total - self.state["done"]
        if self.trained_s:
            eta = max(0.0, sum(self.trained_s) / len(self.trained_s) * left - in_run)
        elif self.state.get("step") and self.state.get("total_steps"):
            eta = in_run / (self.state["step"] / self.state["total_steps"]) * left - in_run
        else:
            eta = None
        self.state.update(elapsed_s=now - self.t0, run_elapsed_s=in_run, eta_s=eta, published_at=time.time())
        if self.hb is not None:
            self.hb.state = dict(self.state)
            self.hb.check()


class _Settling:
    """Quiet runs on a machine that is only bursty. Before each timed run, wait for a burst of other work to pass
    (:func:`lab.measure.contention.settle`); a run whose meter still says busy (a burst came during it: a page
    redrawing its progress, the dashboard's own included) is measured again, at most :data:`REDO` times, the
    discarded readings kept on the stored run (``details["contention"]["discarded"]``). After :data:`GIVE_UP`
    waits in a row that found no quiet window the machine is busy, not bursty: no more waiting or redoing (it
    would only lengthen the ablation), and every run's meter says busy, which withholds the verdict as before.
    Off when :data:`lab.measure.contention.SETTLE_MAX_S` is 0."""

    GIVE_UP = 3
    REDO = 2

    def __init__(self) -> None:
        self.in_vain = 0

    @property
    def on(self) -> bool:
        return contention.SETTLE_MAX_S > 0 and self.in_vain < self.GIVE_UP

    def before_run(self) -> None:
        if self.on:
            seen = contention.settle()
            self.in_vain = self.in_vain + 1 if seen is not None and seen.busy else 0

    def redo(self, result: RunResult, attempt: int) -> bool:
        """Whether to measure ``result``'s run again (its ``attempt``-th redo would be next)."""
        busy = (result.details.get("contention") or {}).get("busy")
        return bool(busy) and result.status == "ok" and attempt < self.REDO and self.on


def _turns_memory_on(configs: Sequence[RunConfig]) -> bool:
    """Whether a config turns a memory lever on (its ``memory`` family differs from the defaults)."""
    from lab.config.memory import MemoryConfig

    return any(cfg.memory != MemoryConfig() for cfg in configs)


def _measured_quietly(run_fn: RunFn, cfg: RunConfig, inner: ProgressFn, waits: _Settling) -> RunResult:
    """One run of the ablation, measured again while a burst spoiled it (:class:`_Settling`); an arm that fails
    or is refused before any work is an error row, not a crash."""
    discarded: list[dict[str, Any]] = []
    attempt = 0
    while True:
        waits.before_run()
        try:
            done = run_fn(cfg, progress=inner, on_error="record")
        except Exception as exc:
            return _error_result(cfg, exc)
        if not waits.redo(done, attempt):
            break
        seen = done.details["contention"]
        discarded.append({k: seen.get(k) for k in ("others_cores", "steal_share", "wall_s")})
        attempt += 1
    if discarded:
        done.details["contention"]["discarded"] = discarded
    return done


def run_ablation(ablation: Ablation, repeats: int = 3, seeds: Sequence[int] = (0,),
                 store: ResultStore | None = None, progress: ProgressFn | None = None,
                 run_fn: RunFn | None = None, job_token: str | None = None, budget_pt: float = 1.0,
                 estimate: dict[str, Any] | None = None, step_peak: bool | None = None) -> pd.DataFrame:
    """Run every (arm, repeat, seed) interleaved, store each as it finishes, skip those already in
    ``store``, and return :func:`summarize`'s table. A failing arm becomes an error row; the rest run.

    With a ``store`` the ablation holds its key's lock (:mod:`lab.jobs`) while it runs: a second
    run of the same key elsewhere is refused (:class:`~lab.jobs.AlreadyRunning`) instead of
    storing duplicate runs, its progress is the job's state, and a Cancel request stops it before the next
    step (:class:`~lab.jobs.Cancelled`; the run in flight is not stored). ``job_token``: the lock
    was claimed by a launcher (the dashboard) and is adopted here.

    ``progress`` gets ``{"phase": "ablation", "done", "total", "arm", "repeat", "seed", "skipped"}``
    after each run (and the inner run's own events under ``"run"``). ``run_fn`` defaults to
    ``lab.run``; tests pass a fake to exercise failures cheaply. ``budget_pt``: the accuracy budget that sets
    the default time-to-target target (:func:`lab.ablation.target.default_target`). ``estimate``: the
    :func:`estimate_ablation` said before it started; the job's spec keeps it (``spec["estimate"]``) and its
    state shows ``estimate_s``. The returned table's ``attrs`` hold ``skipped`` (arms the recipe left out,
    with the reason) and ``estimate``.

    ``step_peak``: each run also measures its step's real peak (``details["memory"]["step_peak_bytes"]``,
    :func:`lab.memory.roles.step_peak_where_free`: on its second step, when that is a warm-up step, so no reported
    figure pays the profiler); ``None``: when an arm turns a memory lever on (the memory trade reads it)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} is invalid: allowed: an int >= 1")
    if not seeds:
        raise ValueError("seeds=() is invalid: allowed: one or more ints")
    run_fn = run if run_fn is None else run_fn
    plan = ablation.schedule(repeats, list(seeds))
    if step_peak is None:
        step_peak = _turns_memory_on([cfg for _, _, _, cfg in plan])
    runs: dict[str, list[RunResult]] = {arm: [] for arm in ablation.arms}
    spec = {**to_spec(ablation, repeats, seeds), **({"estimate": estimate} if estimate else {})}
    held = jobs.holding(store, ablation.key, job_token, spec=spec) if store is not None else contextlib.nullcontext()
    with held as hb:
        track = _Progress(len(plan), hb)
        if estimate:
            track.state["estimate_s"] = float(estimate["total_s"])
        waits = _Settling()
        for i, (arm, rep, s, cfg) in enumerate(plan):
            raise_if_interrupted()  # a Ctrl-C Python swallowed (inside a DataLoader's fork) still stops here
            track.start_run(i, arm, rep, s)
            label = ablation.label(arm, rep)
            done = _finished(store, label, config_hash(cfg.to_dict())) if store is not None else None
            skipped = done is not None
            if done is None:
                def inner(ev: dict[str, Any], a: str = arm) -> None:
                    track.step(ev)
                    if progress:
                        progress({"phase": "run", "arm": a, "event": ev})
                with step_peak_where_free(cfg, step_peak):
                    done = _measured_quietly(run_fn, cfg, inner, waits)
                if store is not None:
                    store.add(done, label=label)
            runs[arm].append(done)
            track.end_run(i, trained=not skipped)
            if progress:
                progress({"phase": "ablation", "done": i + 1, "total": len(plan), "arm": arm, "repeat": rep,
                          "seed": s, "skipped": skipped, "status": done.status})
    df = summarize(runs, techniques=ablation.techniques, axes=ablation.axes, budget_pt=budget_pt)
    df.attrs.update(skipped=dict(ablation.skipped), estimate=estimate)
    return df


#: Steps each arm's probe run trains after the config's warm-up steps (:func:`estimate_ablation`).
PROBE_STEPS = 3


def _full_steps(cfg: RunConfig, resolved: dict[str, Any]) -> int:
    """The optimizer steps a full run of ``cfg`` takes: training (capped by ``max_steps``) plus the pruning
    fine-tune and the QAT epochs, which run the same loop (each capped by ``max_steps`` too)."""
    per_epoch = int(resolved.get("steps_per_epoch") or 0) // max(1, cfg.ddp.grad_accum_steps)
    cap = cfg.max_steps or float("inf")
    extra = [cfg.prune.finetune_epochs if cfg.prune.method != "none" else 0,
             cfg.quant.qat_epochs if cfg.quant.method == "qat" else 0]
    return int(sum(min(cap, e * per_epoch) for e in (int(resolved.get("epochs") or 0), *extra) if e))


def estimate_ablation(ablation: Ablation, repeats: int = 3, seeds: Sequence[int] = (0,),
                      run_fn: RunFn | None = None, probe_steps: int = PROBE_STEPS) -> dict[str, Any]:
    """How long the ablation will take, from one short probe run per arm (before any real run): the probe's
    wall time holds the arm's one-off costs (data, evaluation, latency, compile, calibration, the fine-tune's
    setup), its median measured step the per-step cost, so a run is ``probe wall + step x the steps the probe
    did not take``, and the ablation is the sum over arms x repeats x seeds. The A/A arm is the baseline's
    config, so it is not probed again; the baseline is probed twice (first and last, the faster kept), as the
first probe pays the process's one-off costs. What it cannot see: ``auto`` precision's own probe inside a full run (a
    short run is too short to probe) and evaluations every ``eval_every`` steps; so it is a floor for those.

    Returns ``{"total_s", "probe_s", "runs", "per_run_s": {arm: s}, "failed", "rule"}``; an arm whose probe
    fails counts its probe time and is named under ``"failed"`` (the real run will record the error)."""
    run_fn = run if run_fn is None else run_fn
    per_run: dict[str, float] = {}
    failed: dict[str, str] = {}
    t0 = time.monotonic()

    def probe(arm: str, cfg: RunConfig) -> None:
        t = time.monotonic()
        try:
            result = run_fn(cfg.with_overrides(max_steps=cfg.warmup_steps + probe_steps), on_error="record")
        except Exception as exc:  # refused before any work: the real run is refused the same way, at once
            result = _error_result(cfg, exc)
        wall = time.monotonic() - t
        steps = int(result.steps or 0)
        if result.status != "ok" or not steps:
            per_run[arm], failed[arm] = wall, str(result.error or "no step")
            return
        measured = [float(x) for x in result.measured_ms("total")]
        step_s = sorted(measured)[len(measured) // 2] / 1e3 if measured else float(result.train_time_s) / steps
        s = wall + step_s * max(0, _full_steps(cfg, result.details.get("resolved") or {}) - steps)
        per_run[arm] = min(s, per_run.get(arm, s))

    for arm, cfg in ablation.arms.items():
        if arm != AA_ARM:
            probe(arm, cfg)
    if "baseline" in per_run and "baseline" not in failed:
        # the first probe of a process also pays its one-offs (lazy imports, the data made and cached, first
        # kernels): 4.7 s against a 1.8 s baseline run on ctr/tiny, which the A/A arm then doubled
        probe("baseline", ablation.arms["baseline"])
    if AA_ARM in ablation.arms and "baseline" in per_run:
        per_run[AA_ARM] = per_run["baseline"]
    rounds = int(repeats) * len(seeds)
    return {"total_s": sum(per_run.values()) * rounds, "probe_s": time.monotonic() - t0,
            "runs": len(ablation.arms) * rounds, "per_run_s": per_run, "failed": failed,
            "rule": f"per arm: a {probe_steps}-step probe run's wall time + its median step x the steps it did "
                    f"not take (baseline: the faster of two probes); x {repeats} repeat(s) x {len(seeds)} "
                    "seed(s); A/A = baseline"}


def estimate_text(estimate: dict[str, Any]) -> str:
    """One sentence for the CLI (and anything else that shows an estimate before a long wait)."""
    slow = sorted(estimate["per_run_s"].items(), key=lambda kv: -kv[1])[:3]
    return (f"estimated {estimate['total_s']:.0f} s for {estimate['runs']} runs (probes took "
            f"{estimate['probe_s']:.0f} s); slowest arms per run: "
            + ", ".join(f"{a} {s:.1f} s" for a, s in slow)
            + (f"; probe failed: {', '.join(estimate['failed'])}" if estimate.get("failed") else ""))


def to_spec(ablation: Ablation, repeats: int, seeds: Sequence[int]) -> dict[str, Any]:
    """The ablation as plain JSON (what a job row keeps, so a worker or a reloaded page can rebuild it)."""
    return {"name": ablation.name, "baseline": ablation.baseline.to_dict(),
            "arms": {a: c.to_dict() for a, c in ablation.arms.items() if a not in ("baseline", AA_ARM)},
            "techniques": {a: list(t) for a, t in ablation.techniques.items()},
            "axes": {a: list(x) for a, x in ablation.axes.items()}, "aa": ablation.aa,
            "skipped": dict(ablation.skipped), "repeats": int(repeats), "seeds": [int(s) for s in seeds]}


def from_spec(spec: dict[str, Any]) -> tuple[Ablation, int, list[int]]:
    """Inverse of :func:`to_spec`: (ablation, repeats, seeds); its key equals the original's."""
    ab = Ablation(name=spec["name"], baseline=RunConfig.from_dict(spec["baseline"]),
                  arms={a: RunConfig.from_dict(c) for a, c in spec["arms"].items()},
                  techniques={a: tuple(t) for a, t in spec["techniques"].items()},
                  axes={a: tuple(x) for a, x in spec["axes"].items()}, aa=spec["aa"],
                  skipped=dict(spec.get("skipped") or {}))
    return ab, int(spec["repeats"]), [int(s) for s in spec["seeds"]]


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

__all__ = ["PROBE_STEPS", "Ablation", "ProgressFn", "RunFn", "estimate_ablation", "estimate_text", "from_spec",
           "load_ablation", "load_stored", "run_ablation", "stored_ablations", "to_spec"]
