"""A memory budget answered with the fastest configuration that fits: ``python -m lab run ... --memory-budget MB``.

Why a search and not a formula: what a lever saves and what it costs depends on the model (a transformer layer keeps
far more inside than a small ResNet block) and on this machine, so each candidate is *measured*: a short run
(:data:`TRY_STEPS` steps, no evaluation during training, no latency) whose peak memory and median step time are read
back. The candidates are the memory family's levers that keep the effective batch: batch-keeping accumulation
(``accum2`` / ``accum4``: the batch as 2 / 4 micro-batches), activation checkpointing per block
(``checkpoint_blocks``) and low-bit Adam state (``adam8bit`` / ``adam4bit``), alone and combined, tried cheapest
first by their expected step-time cost (:data:`LEVERS`); where the run has data-parallel ranks, FSDP2 sharding
(``fsdp2``, :data:`SHARD_LEVER`: a peak is then one rank's, and the answer says so; on one rank the record says why
it was not tried). A candidate that only adds levers to one that already fits
is skipped (it can only cost more time); a lever the model or the config refuses (no blocks, SGD) is refused once
for every candidate that holds it; one that adds levers to a measured lever set already :data:`SLOWER` than a
fitting one is skipped too; low-bit state (:data:`LAST_RESORT`: a compile and a slower update) is tried only when
nothing without it fits. The answer is the fastest measured candidate whose peak is <= the budget, with its step
time against the budget-free configuration's (measured first, the same way). Only when nothing keeps the batch and
fits is the batch halved (``batch="fallback"``), with the configuration that reached the smallest peak; that changes
the training (an effective batch the lr was not tuned for), and the answer says so. When nothing fits,
:class:`BudgetNotMet` says the smallest peak reached and by which configuration.

What "peak" is, by device (``measure``):

- ``cuda``: the allocator's peak over the try's training (``torch.cuda.max_memory_allocated``), in process.
- ``step`` (CPU default): the step's real peak at the tensor level, the one that must fit: parameters + optimizer
  state at rest plus the allocation high water of the try's second training step (``details["memory"]
  ["step_peak_bytes"]``, :class:`lab.measure.memory.StepPeak`, the definition ``benchmarks/memory.py --largest``
  uses; the try asks for it with :func:`lab.memory.roles.counting_step_peak`, so other runs do not pay for the
  profiler). It holds the transients no role holds: a checkpointed block's recompute in backward (8-28 MiB above
  the roles' sum at the transformer's rungs m..xl at batch 32, docs/memory.md), an op's workspace, the optimizer's
  temporaries; and it leaves out what a plain step frees before the rest exists (saved activations as the
  gradients appear). Why not the process RSS: on CPU it holds the Python and torch runtime (~0.3 GB that no
  lever moves), the data and the allocator's free lists, and one earlier try pins ``ru_maxrss``; for a small
  model the levers' bytes drown in it.
- ``roles``: the tensor-level bytes of the first training step by role (``details["memory"]``): parameters +
  gradients + optimizer state + activations saved for backward (one micro-batch's). What the step *keeps*, not
  what must fit: a checkpointed step's real peak is above it (the recompute), so a budget held by ``roles`` can
  answer "fits with checkpointing" for a step that does not. Kept to compare with earlier records.
- ``rss``: each try in a fresh process, its lifetime peak RSS (:func:`lab.ablation.memory_fit.try_batch`): what
  the machine must hold, runtime and data included.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lab.config import RunConfig
from lab.measure.memory import MIB
from lab.registry import OPTIONS

#: Steps per try: the warm-up plus a few measured ones (roles are counted in the first step; time is their median).
TRY_STEPS, TRY_WARMUP = 5, 2
MEASURES = ("auto", "step", "roles", "rss", "cuda")
#: A measured configuration this much slower than the fastest that fits makes every one that adds levers to it
#: not worth a try (a few-step try's time is noisy: a small margin is no evidence).
SLOWER = 1.10
BATCH_MODES = ("fallback", "never")
#: The levers: (config field, its values from off to strongest, each value's expected step-time cost, in rough
#: units of "one extra forward"). Accumulation runs the same rows in smaller pieces (a little dispatch overhead
#: per piece), checkpointing adds a forward of the blocks, low-bit Adam a slower update and a one-off compile.
LEVERS: tuple[tuple[str, tuple[Any, ...], tuple[float, ...]], ...] = (
    ("memory.micro_batches", (1, 2, 4), (0.0, 0.5, 1.0)),
    ("memory.checkpoint", ("none", "blocks"), (0.0, 2.0)),
    ("memory.optimizer_state", ("fp32", "int8", "int4"), (0.0, 3.0, 3.5)),
)
#: Levers tried only when nothing without them fits: low-bit Adam's first step compiles (a minute or two on 2
#: cores at the top rungs) and its update is 1.35-2.3x torch's Adam step here (docs/memory.md), so it is never the
#: faster way to fit when accumulation or checkpointing fits.
LAST_RESORT = frozenset({"memory.optimizer_state"})
#: Sharding: tried only where the run already has data-parallel ranks (``ddp.world_size`` >= 2): FSDP2 then shards
#: what DDP replicates at the same ranks and the same per-rank batch, so the effective batch is kept and a peak is
#: one rank's (rank 0's shards). Its cost: a block's parameters all-gathered for forward and again for backward,
#: its gradients reduce-scattered, where DDP all-reduces once. One rank has nobody to shard with, so it is not tried
#: there, and the record says so (``found["shard"]``); nor under ``rss``, whose fresh process's peak RSS is the
#: launcher's, not its ranks'.
SHARD_LEVER: tuple[str, tuple[Any, ...], tuple[float, ...]] = ("memory.shard", ("none", "fsdp2"), (0.0, 1.5))
MeasureFn = Callable[[RunConfig], dict[str, Any]]
ProgressFn = Callable[[str], None]


class BudgetNotMet(ValueError):
    """No configuration's measured peak is under the budget (one line: the smallest peak and its configuration)."""


@dataclass(frozen=True)
class Candidate:
    """One configuration the search may measure: the option names it adds and the config fields they set."""

    options: tuple[str, ...]
    overrides: dict[str, Any]
    levels: tuple[int, ...]  # per lever, the index of its value (for "adds levers to")
    cost: float
    last_resort: bool = False  # holds a lever of LAST_RESORT the config did not already set

    @property
    def name(self) -> str:
        return "+".join(self.options) or "baseline"

    def covers(self, other: Candidate) -> bool:
        """Whether this one holds every lever ``other`` holds, at least as strong (and is not ``other``)."""
        return self.levels != other.levels and all(a >= b for a, b in zip(self.levels, other.levels, strict=True))


def option_for(key: str, value: Any) -> str:
    """The registered option that sets ``key`` to ``value`` alone (``accum2``, ``checkpoint_blocks``)."""
    for name, option in OPTIONS.items():
        if option.overrides == {key: value}:
            return name
    return f"{key}={value}"


def shard_note(cfg: RunConfig, measure: str) -> dict[str, Any]:
    """Whether the search tries FSDP2 on ``cfg`` (:data:`SHARD_LEVER`): ``{"tried", "world_size", "why"}``."""
    n = cfg.ddp.world_size
    if n < 2:
        why = "fsdp2 not tried: one rank has nobody to shard with (with --ddp-world-size 2 the search tries it)"
    elif measure == "rss":
        why = "fsdp2 not tried under --memory-measure rss: a fresh process's peak RSS is the launcher's, not a rank's"
    else:
        why = f"fsdp2 tried at world size {n}, in place of DDP: a peak is one rank's (rank 0's shards)"
    return {"tried": n >= 2 and measure != "rss", "world_size": n, "why": why}


def candidates(cfg: RunConfig, *, shard: bool | None = None) -> list[Candidate]:
    """Every combination of the levers, cheapest expected step first; a lever ``cfg`` already sets is kept at
    least as strong as it is (the budget-free configuration is ``cfg`` itself, the first candidate). ``shard``:
    add FSDP2 (:data:`SHARD_LEVER`; default: where ``cfg`` has 2 or more ranks)."""
    levers = (*LEVERS, SHARD_LEVER) if (cfg.ddp.world_size >= 2 if shard is None else shard) else LEVERS
    floors = []
    for key, values, _ in levers:
        fam, name = key.split(".")
        floors.append(values.index(getattr(getattr(cfg, fam), name)))
    out: dict[tuple[int, ...], Candidate] = {}
    for levels in itertools.product(*(range(len(values)) for _, values, _ in levers)):
        levels = tuple(max(a, b) for a, b in zip(levels, floors, strict=True))
        if levels in out:
            continue
        opts, over, cost, last = [], {}, 0.0, False
        for (key, values, costs), i, floor in zip(levers, levels, floors, strict=True):
            over[key] = values[i]
            cost += costs[i]
            if i != floor:
                opts.append(option_for(key, values[i]))
                last = last or key in LAST_RESORT
        out[levels] = Candidate(tuple(opts), over, levels, cost, last)
    return sorted(out.values(), key=lambda c: (c.last_resort, c.cost, sum(c.levels)))


def resolve_measure(cfg: RunConfig, measure: str) -> str:
    """``auto``: ``cuda`` on a GPU run, else ``step``. A compiled forward's saved tensors are not counted by
    role, so ``roles`` refuses ``compute.compile`` (``step`` and ``rss`` measure it)."""
    if measure not in MEASURES:
        raise ValueError(f"--memory-measure={measure} is invalid: allowed: {', '.join(MEASURES)}")
    if measure == "auto":
        from lab.context import resolve_device

        measure = "cuda" if resolve_device(cfg.device).type == "cuda" else "step"
    if measure == "roles" and cfg.compute.compile:
        raise ValueError("--memory-budget measured by role cannot count a compiled forward's saved activations; "
                         "drop --compute-compile or use --memory-measure rss")
    return measure


def try_config(cfg: RunConfig) -> RunConfig:
    """``cfg`` cut to a try: :data:`TRY_STEPS` steps (enough epochs for them), nothing evaluated or profiled on
    the way, no checkpoint written or resumed."""
    return cfg.with_overrides(epochs=TRY_STEPS, max_steps=TRY_STEPS, warmup_steps=TRY_WARMUP, latency_repeats=0,
                              eval_every=None, target_metric=None, profile=False, checkpoint_every=None, resume=None)


def measure_in_process(cfg: RunConfig, measure: str) -> dict[str, Any]:
    """One try in this process: ``{"peak_mb", "step_ms", "roles_mb"}`` (``step``: the second step's real peak,
    measured for this try only; ``roles``: the four roles' sum; ``cuda``: the allocator's peak over the training).
    A refusal (a model without blocks) raises ``ValueError``, and so does a ``step`` try whose peak was not
    measured (fewer than two steps ran): never another measure in its place."""
    from lab.train import run

    if measure == "step":
        from lab.memory.roles import counting_step_peak

        with counting_step_peak():
            r = run(cfg)
    else:
        r = run(cfg)
    rec = r.details.get("memory") or {}
    roles = {k[:-len("_bytes")]: rec[k] / MIB for k in ("params_bytes", "grads_bytes", "optimizer_state_bytes",
                                                          "saved_activations_bytes") if rec.get(k) is not None}
    peak = run_peak_mb(r, measure) if measure != "roles" else sum(roles.values())
    if peak is None:
        raise ValueError(f"the try's {measure} peak was not measured (status {r.status}: "
                         f"{r.error or 'fewer than two training steps'})")
    return {"peak_mb": peak, "step_ms": r.median_step_ms, "roles_mb": roles, "status": r.status}


def default_measure_fn(measure: str) -> MeasureFn:
    """A short run in this process, or (``rss``) in a fresh one, whose refusal comes back as ``ValueError``."""
    if measure != "rss":
        return lambda cfg: measure_in_process(cfg, measure)
    from lab.ablation.memory_fit import try_batch

    def fresh(cfg: RunConfig) -> dict[str, Any]:
        try:
            return try_batch(cfg)
        except RuntimeError as exc:
            if "ValueError: " in str(exc):  # the child refused the config (no blocks, more micro-batches than rows)
                raise ValueError(str(exc).rsplit("ValueError: ", 1)[1].strip()) from None
            raise

    return fresh


def run_peak_mb(result: Any, measure: str) -> float | None:
    """The chosen run's own peak by the search's measure (``step``: its ``step_peak_bytes``, ``None`` where the run
    did not measure it; ``rss``: the sampled RSS peak of its training)."""
    rec = result.details.get("memory") or {}
    if measure == "step":
        got = rec.get("step_peak_bytes")
        return got / MIB if got is not None else None
    if measure == "roles":
        parts = [rec.get(k) for k in ("params_bytes", "grads_bytes", "optimizer_state_bytes",
                                      "saved_activations_bytes")]
        return sum(parts) / MIB if all(p is not None for p in parts) else None
    return result.peak_memory_mb


def fit_budget(cfg: RunConfig, budget_mb: float, *, measure: str = "auto", batch: str = "fallback",
               measure_fn: MeasureFn | None = None, progress: ProgressFn | None = None) -> dict[str, Any]:
    """The fastest measured configuration of ``cfg`` whose peak is <= ``budget_mb`` (module docstring), as a
    record: ``budget_mb``, ``measure``, ``baseline`` and ``chosen`` (rows: ``name``, ``options``, ``overrides``,
    ``peak_mb``, ``step_ms``, ``fits``), ``step_time_ratio`` (chosen / baseline), ``batch`` (``None``, or the
    smaller batch the fallback chose), every ``candidates`` row (measured, skipped or refused, with why) and
    ``search_s``. Raises :class:`BudgetNotMet` when nothing fits. ``measure_fn`` (default: a short run by
    ``measure``) measures one config; tests pass a planted one."""
    if not (isinstance(budget_mb, (int, float)) and math.isfinite(budget_mb) and budget_mb > 0):
        raise ValueError(f"memory budget {budget_mb!r} MB is invalid: allowed: a number of MB > 0")
    if batch not in BATCH_MODES:
        raise ValueError(f"batch={batch!r} is invalid: allowed: {', '.join(BATCH_MODES)}")
    kind = resolve_measure(cfg, measure) if measure_fn is None else measure
    measure_fn = measure_fn or default_measure_fn(kind)
    say = progress or (lambda line: None)
    t0 = time.perf_counter()
    shard = shard_note(cfg, kind)
    cands = candidates(cfg, shard=shard["tried"])
    rows: list[dict[str, Any]] = []
    refused: dict[str, str] = {}  # option -> why (the first refusal of a lever refuses every candidate with it)
    fitting: list[Candidate] = []
    timed: dict[tuple[int, ...], tuple[Candidate, float]] = {}  # measured candidates' step times

    def row(c: Candidate, **what: Any) -> dict[str, Any]:
        out = {"name": c.name, "options": list(c.options), "overrides": c.overrides, **what}
        rows.append(out)
        return out

    for i, c in enumerate(cands, 1):
        head = f"memory budget {budget_mb:g} MB: [{i}/{len(cands)}] {c.name}"
        bad = next((o for o in c.options if o in refused), None)
        if bad is not None:
            row(c, status="refused", why=f"{bad}: {refused[bad]}")
            continue
        over = next((f for f in fitting if c.covers(f)), None)
        if over is not None:
            row(c, status="skipped", why=f"adds levers to {over.name}, which fits")
            continue
        best = min((timed[f.levels][1] for f in fitting if f.levels in timed), default=math.inf)
        slow = next((m for m, ms in timed.values() if m.options and c.covers(m) and ms > SLOWER * best), None)
        if slow is not None:
            row(c, status="skipped", why=f"adds levers to {slow.name}, already slower than a configuration that fits")
            continue
        if c.last_resort and fitting:
            row(c, status="skipped", why="low-bit optimizer state (a compile, a slower update) is tried only when "
                                         "nothing without it fits")
            continue
        try:
            got = measure_fn(try_config(cfg.with_overrides(**c.overrides)))
        except ValueError as exc:
            why = str(exc).splitlines()[0]
            new = [o for o in c.options if o not in refused]
            if len(new) == 1:  # the one new lever is the one refused
                refused[new[0]] = why
            row(c, status="refused", why=why)
            say(f"{head}: refused ({why})")
            continue
        fits = got["peak_mb"] <= budget_mb
        if got.get("step_ms") is not None:
            timed[c.levels] = (c, got["step_ms"])
        row(c, status="measured", peak_mb=got["peak_mb"], step_ms=got.get("step_ms"), fits=fits,
            roles_mb=got.get("roles_mb"))
        say(f"{head}: peak {got['peak_mb']:.4g} MB, step {_ms(got.get('step_ms'))}"
            f" - {'fits' if fits else 'over'}")
        if fits:
            fitting.append(c)
            if i == 1:  # the budget-free configuration fits: no lever to pay for
                break
    measured = [r for r in rows if r["status"] == "measured"]
    if not measured:
        raise BudgetNotMet(f"memory budget {budget_mb:g} MB: no configuration could be measured "
                           f"({rows[0]['why'] if rows else 'no candidate'})")
    base = rows[0] if rows[0]["status"] == "measured" else None
    found: dict[str, Any] = {"budget_mb": budget_mb, "measure": kind, "measure_note": MEASURE_NOTES.get(kind, ""),
                             "try_steps": TRY_STEPS, "baseline": base, "candidates": rows, "batch": None,
                             "shard": shard}
    ok = [r for r in measured if r["fits"]]
    if not ok and batch == "fallback":
        ok = _smaller_batch(cfg, min(measured, key=lambda r: r["peak_mb"]), budget_mb, measure_fn, rows, say,
                            found)
    found["search_s"] = time.perf_counter() - t0
    if not ok:
        low = min((r for r in rows if r.get("peak_mb") is not None), key=lambda r: r["peak_mb"])
        at = f" at batch {low['batch_size']}" if "batch_size" in low else ""
        raise BudgetNotMet(f"memory budget {budget_mb:g} MB cannot be met: the smallest peak reached is "
                           f"{low['peak_mb']:.4g} MB ({low['name']}{at}, measured by {kind}); "
                           f"raise --memory-budget to at least {_up(low['peak_mb'])} MB"
                           + ("" if shard["tried"] else f"; {shard['why']}"))
    chosen = min(ok, key=lambda r: (r["step_ms"] if r.get("step_ms") is not None else math.inf))
    found["chosen"] = chosen
    b_ms, c_ms = (base or {}).get("step_ms"), chosen.get("step_ms")
    found["step_time_ratio"] = c_ms / b_ms if b_ms and c_ms else None
    return found


MEASURE_NOTES = {
    "step": "the second training step's real peak in tensor bytes: parameters + optimizer state at rest + the "
            "step's allocation high water (recompute and transients included); process RSS not included",
    "roles": "what the step keeps, not what must fit: tensor bytes of the first step by role: parameters + "
             "gradients + optimizer state + saved activations "
             "(one micro-batch's); process RSS (runtime, data, allocator) not included",
    "rss": "each try's lifetime peak RSS in a fresh process (runtime and data included)",
    "cuda": "torch.cuda.max_memory_allocated over the try's training",
}


def _smaller_batch(cfg: RunConfig, smallest: dict[str, Any], budget_mb: float, measure_fn: MeasureFn,
                   rows: list[dict[str, Any]], say: ProgressFn, found: dict[str, Any]) -> list[dict[str, Any]]:
    """The configuration that reached the smallest peak, its batch halved until it fits (not below one row per
    micro-batch): the fitting row, or ``[]``."""
    from lab.context import resolve

    b = resolve(cfg).batch_size
    k = smallest["overrides"].get("memory.micro_batches", 1)
    while b // 2 >= k:
        b //= 2
        got = measure_fn(try_config(cfg.with_overrides(**smallest["overrides"], batch_size=b)))
        fits = got["peak_mb"] <= budget_mb
        rows.append({"name": smallest["name"], "options": smallest["options"], "batch_size": b,
                     "overrides": {**smallest["overrides"], "batch_size": b}, "status": "measured",
                     "peak_mb": got["peak_mb"], "step_ms": got.get("step_ms"), "fits": fits,
                     "roles_mb": got.get("roles_mb")})
        say(f"memory budget {budget_mb:g} MB: {smallest['name']} at batch {b}: peak {got['peak_mb']:.4g} MB, "
            f"step {_ms(got.get('step_ms'))} - {'fits' if fits else 'over'}")
        if fits:
            found["batch"] = {"from": resolve(cfg).batch_size, "to": b}
            return [rows[-1]]
    return []


def _up(mb: float) -> str:
    """``mb`` rounded up: to the MB from 10 MB, else to the hundredth (a budget of that figure holds the peak)."""
    return f"{math.ceil(mb)}" if mb >= 10 else f"{math.ceil(mb * 100) / 100:g}"


def _ms(ms: float | None) -> str:
    if ms is None:
        return "n/a"
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.3g} ms"


def chosen_config(cfg: RunConfig, found: dict[str, Any]) -> RunConfig:
    """``cfg`` with the chosen configuration's levers (and batch, when the fallback changed it)."""
    return cfg.with_overrides(**found["chosen"]["overrides"])


def format_budget(found: dict[str, Any]) -> str:
    """The answer in one line: what fits, at which peak, what it costs against the budget-free configuration."""
    c, base = found["chosen"], found.get("baseline")
    head = f"memory budget {found['budget_mb']:g} MB ({found['measure']}): "
    if base is not None and c is base:
        return head + f"the budget-free configuration fits (peak {c['peak_mb']:.4g} MB); no lever needed"
    line = head + f"fits with {c['name']} (peak {c['peak_mb']:.4g} MB"
    if base is not None:
        line += f", budget-free {base['peak_mb']:.4g} MB"
    line += ")"
    if found.get("step_time_ratio") is not None:
        line += (f", step {_ms(c['step_ms'])} = {found['step_time_ratio']:.2f}x the budget-free "
                 f"{_ms(base['step_ms'])} ({found['try_steps']}-step tries, no interval)")
    if (found.get("shard") or {}).get("tried"):
        line += f"; {found['shard']['why']}"
    if found.get("batch"):
        line += (f"; batch {found['batch']['from']} -> {found['batch']['to']}: nothing kept the batch and fit, so "
                 "the effective batch changes (lr not rescaled)")
    return line


def largest_fitting(peaks: Mapping[str, float], budget: float, *, what: str = "rung", unit: str = "MiB") -> str:
    """The largest model that trains in ``budget``: the last of ``peaks`` (ordered smallest model first: a ladder's
    rungs) whose measured peak is <= ``budget`` (the same unit). Why the last and not the largest under the budget:
    the order is the models' size, and a peak that happens to dip at a larger rung still names the larger model.
    Raises :class:`BudgetNotMet` (one line, the smallest peak and its rung) when none fits or ``peaks`` is empty."""
    if not peaks:
        raise BudgetNotMet(f"memory budget {budget:g} {unit}: no {what} was measured")
    fits = [name for name, peak in peaks.items() if math.isfinite(peak) and peak <= budget]
    if fits:
        return fits[-1]
    name, peak = min(peaks.items(), key=lambda kv: kv[1] if math.isfinite(kv[1]) else math.inf)
    raise BudgetNotMet(f"memory budget {budget:g} {unit} cannot be met by any {what}: the smallest peak is "
                       f"{peak:.4g} {unit} ({what} {name})")


__all__ = ["BATCH_MODES", "LEVERS", "MEASURES", "TRY_STEPS", "BudgetNotMet", "Candidate", "candidates",
           "chosen_config", "fit_budget", "format_budget", "largest_fitting", "option_for", "resolve_measure",
           "run_peak_mb", "shard_note"]
