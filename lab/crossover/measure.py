"""Measure one rung: every technique's speedup of the training step and of inference, arms interleaved.

Per axis, the ``base`` arm and every technique's arm run in one :func:`lab.measure.interleaved_ms` loop
(base, bf16, fp16, ..., base, bf16, ...), so the machine's drift hits all alike and the baseline is shared;
a sample is a block of ``iters`` calls sized to ``block_ms`` from the base arm's own time (short calls are
batched, because one ~1 ms call is mostly clock noise on a shared box). A speedup is the ratio of medians
with a bootstrap 95 % CI that resamples the rounds together (:func:`lab.measure.rounds_ratio_ci`): sample ``i``
of every arm was taken in round ``i``, so a round the box slowed down moves both medians and cancels.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from lab.context import seed_everything
from lab.crossover.arms import AXES, INT8_FLOW_ARMS, TECHNIQUES, TRAIN, Bench, build_arms
from lab.measure import count_macs, count_params, interleaved_ms, median, rounds_ratio_ci, weights_used_per_sample
from lab.precision import MAX_ROUNDS, capability, compare_arms, decide_auto
from lab.workloads import Workload

ProgressFn = Callable[[str], None]


def make_bench(wl: Workload, rung: str | None, *, size: str = "small", batch_size: int | None = None) -> Bench:
    """The rung's model (seeded) on a fixed batch of the workload's own data at ``size`` (its batch size
    unless ``batch_size``), with a few batches of training rows for loaders and calibration."""
    spec = wl.spec_at(size, rung)
    batch = batch_size or spec.batch_size
    data_spec = dataclasses.replace(spec, n_train=batch * 6, n_test=max(1, batch // 4))
    data = wl.make_data(data_spec, 0)
    rows = tuple(t[: batch * 6] for t in data.train)
    seed_everything(0)
    model = wl.make_model(spec)
    return Bench(workload=wl, model=model, inputs=tuple(t[:batch] for t in rows[:-1]), target=rows[-1][:batch],
                 lr=spec.lr, train_rows=rows)


def size_of(bench: Bench) -> tuple[int, float]:
    """(parameters, MACs per sample of one forward) of the rung's model (MACs counted on <= 16 rows)."""
    n = min(16, bench.batch_size)
    macs = count_macs(bench.model, tuple(t[:n] for t in bench.inputs))
    return count_params(bench.model), macs / n


def _row(base: list[float], tech: list[float], **facts: Any) -> dict[str, Any]:
    est, lo, hi = rounds_ratio_ci(base, tech)
    return {**facts, "speedup": est, "ci_lo": lo, "ci_hi": hi, "base_ms": median(base), "tech_ms": median(tech)}


def _skip_row(why: str, **facts: Any) -> dict[str, Any]:
    return {**facts, "speedup": None, "ci_lo": None, "ci_hi": None, "base_ms": None, "tech_ms": None,
            "why": f"skipped: {why}"}


#: An arm this many times slower than the fp32 one on a single (warm) call is not timed further: a layer
#: without a fast kernel for the technique fell back to a reference path (fp16 convolution backward on a
#: CPU took 63 s against 0.24 s in fp32 here), and timing it would cost minutes to show what one call shows.
SLOW_FACTOR = 8.0
SLOW_MARK = "slower than fp32 on a single call"
#: ...and only when that costs real time: a 2 ms call that read 21 ms once on this shared box is contention,
#: cheap to time properly, and dropping it would drop the technique from every larger rung too.
SLOW_MIN_EXTRA_MS = 100.0


def _one_call_ms(arm: Callable[[], Any], budget_ms: float = 200.0) -> float:
    """The fastest of up to 3 warm calls (fewer when a call is long): one call on a shared box can be hit by
    a context switch, and a probe that drops an arm must not be fooled by one."""
    arm()  # warm: first-call allocation, torch.compile's compilation
    best, spent = math.inf, 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        arm()
        ms = (time.perf_counter() - t0) * 1e3
        best, spent = min(best, ms), spent + ms
        if spent > budget_ms:
            break
    return best


#: Rounds ``auto``'s candidates may reach, the axis's own included, while a verdict is still open (as the run's
#: own probe: :data:`lab.precision.auto.MAX_ROUNDS`).
AUTO_MAX_ROUNDS = MAX_ROUNDS


def settle_auto(arms: dict[str, Callable[[], Any]], samples: dict[str, list[float]], iters: int, *,
                device: torch.device | str = "cpu", max_rounds: int = AUTO_MAX_ROUNDS) -> int:
    """More interleaved rounds of ``base`` and the native low precisions, in place in ``samples``, while
    :func:`lab.precision.compare_arms` leaves a candidate ``undecided``, up to ``max_rounds`` rounds in all;
    returns the rounds added.

    Why: a top rung's step is one 100-600 ms call per sample, and the axis's budget stops after 5 rounds. A
    bootstrap CI of a median over 5 paired ratios reaches the lowest of them, so one slow round (a neighbour on
    the host, a page-fault burst) left bf16 at 1.4-2.1x "undecided" and ``auto`` at fp32 on ctr l and sequence xl
    of the full map on an AMD EPYC (native bf16); 8 rounds tolerate one such round. It costs a few calls of
    two or three arms, only where the verdict is open. Every arm added gets the same rounds, so the pairs stay."""
    dev = device if isinstance(device, torch.device) else torch.device(device)
    caps = {d: capability(d, "cpu" if dev.type == "cpu" else dev) for d in ("bf16", "fp16")}
    low = [d for d in ("bf16", "fp16") if d in samples and caps[d].native
           and len(samples[d]) == len(samples.get("base", ()))]
    added = 0
    while low and len(samples["base"]) < max_rounds:
        verdicts = compare_arms({"fp32": samples["base"], **{d: samples[d] for d in low}}, caps)
        if all(v["verdict"] != "undecided" for v in verdicts.values()):
            break
        more = interleaved_ms({n: arms[n] for n in ("base", *low)}, repeats=1, warmup=0, iters=iters)
        for name, ms in more.items():
            samples[name] += ms
        added += 1
    return added


def measure_axis(bench: Bench, techniques: list[str], axis: str, *, repeats: int, block_ms: float,
                 facts: dict[str, Any], deadline: float | None = None, budget_s: float | None = None,
                 skip: dict[str, str] | None = None, progress: ProgressFn | None = None) -> list[dict[str, Any]]:
    """The rows of one axis of one rung (one per technique, skipped ones with their reason); ``skip``:
    technique -> reason not to measure it here (it was pathologically slow on a smaller rung).
    ``budget_s``: the interleaved rounds stop after 3 once this many seconds of timing have passed (a large
    rung's 1-2 s steps would otherwise cost minutes per axis for a CI that 3 rounds already give)."""
    skip = skip or {}
    t_build = time.monotonic()
    arms, skipped = build_arms(bench, [t for t in techniques if t not in skip], axis, requested=techniques)
    skipped.update(skip)
    base_ms = _one_call_ms(arms["base"])
    iters = max(1, min(64, math.ceil(block_ms / max(base_ms, 1e-3))))
    errors: dict[str, str] = {}
    for name in [n for n in arms if n != "base" and not n.endswith("_base")]:
        try:
            ms = _one_call_ms(arms[name])
        except Exception as exc:  # noqa: BLE001 - reported as the technique's skip reason
            errors[name] = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
            del arms[name]
            continue
        if ms > SLOW_FACTOR * base_ms and ms - base_ms > SLOW_MIN_EXTRA_MS:
            errors[name] = (f"x{ms / base_ms:.0f} {SLOW_MARK} ({ms:.0f} ms vs {base_ms:.3g} ms): a layer without a "
                            f"fast {name} kernel on this machine runs a reference path; not timed further")
            del arms[name]
    t_time = time.monotonic()
    if budget_s is not None:
        deadline = min(deadline or math.inf, t_time + budget_s)
    # warmup=0: every arm was warmed (and compiled) by its probe above.
    samples = interleaved_ms(arms, repeats=repeats, warmup=0, iters=iters, deadline=deadline, errors=errors)
    if "amp_auto" in techniques:
        settle_auto(arms, samples, iters, device=bench.inputs[0].device)
    if progress:
        rounds = max((len(v) for v in samples.values()), default=0)
        progress(f"  {axis}: built + probed {t_time - t_build:.0f} s, timed {time.monotonic() - t_time:.0f} s "
                 f"({rounds} rounds x {iters} call(s) per arm)")
    base = samples.get("base")
    rows = []
    for tech in techniques:
        here = {**facts, "technique": tech, "axis": axis}
        if tech in skipped or tech in errors or base is None:
            why = skipped.get(tech) or errors.get(tech) or errors.get("base", "base arm failed")
            emulated = bench.notes.get(tech, "")  # an emulated precision says so whatever stopped it
            if emulated.startswith("emulated here") and emulated not in why:
                why = f"{why}; {emulated}"
            rows.append(_skip_row(why, **here))
            continue
        note = bench.notes.get(tech, "")
        if tech == "amp_auto":
            low = {d: samples[d] for d in ("bf16", "fp16") if d in samples}
            choice, why = decide_auto({"fp32": base, **low}, {d: capability(d, "cpu") for d in low})
            not_timed = [f"{d}: {skipped[d]}" for d in ("bf16", "fp16") if d in techniques and d in skipped]
            if not {"bf16", "fp16"} & set(techniques):  # build_arms let it through: neither is native here
                not_timed.append("bf16 / fp16 not timed: neither runs natively here")
            why = "; ".join([why, *not_timed])
            rows.append({**_row(base, samples.get(choice, base), **here), "why": why})
            continue
        if tech == "int8_auto":
            rows.append(_int8_auto_row(bench.choices["int8_auto"], base, samples, errors, here))
            continue
        own = f"{tech}_base"  # a family that feeds the step another way is timed against its own baseline
        if own in samples or own in errors:
            if own not in samples:
                rows.append(_skip_row(errors.get(own, "its own baseline arm failed"), **here))
                continue
            rows.append({**_row(samples[own], samples[tech], **here), "why": note})
            continue
        rows.append({**_row(base, samples[tech], **here), "why": note})
    return rows


def _int8_auto_row(choice: dict[str, Any], base: list[float], samples: dict[str, list[float]],
                   errors: dict[str, str], here: dict[str, Any]) -> dict[str, Any]:
    """``int8_auto``'s row: the samples of the candidate arm its probe chose (timed in these rounds with the
    other candidate), and the probe's reason."""
    arm = INT8_FLOW_ARMS[choice["chosen"]]
    if arm not in samples:
        return _skip_row(f"its probe took {choice['chosen']}, whose arm failed: {errors.get(arm, 'not timed')}",
                         **here)
    others = ", ".join(f"{f} not a candidate: {why[:120]}" for f, why in choice.get("not_candidates", {}).items())
    why = f"the --quant-flow auto probe took {choice['chosen']} ({choice['why']})" + (f"; {others}" if others else "")
    return {**_row(base, samples[arm], **here), "why": why}


def measure_rung(wl: Workload, rung: str, techniques: list[str], *, repeats: int = 7, block_ms: float = 40.0,
                 size: str = "small", batch_size: int | None = None, deadline: float | None = None,
                 axis_budget_s: float | None = None,
                 skip: dict[tuple[str, str], str] | None = None,
                 progress: ProgressFn | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(facts, rows)`` of one rung: facts = workload, rung, params, macs_per_sample; rows as in the JSON
    (without ``regime``, which needs the whole ladder's fit). Both axes; a technique is measured on the
    axes it can change (:data:`TECHNIQUES`), the others are skipped rows with the reason."""
    unknown = sorted(set(techniques) - set(TECHNIQUES))
    if unknown:
        raise ValueError(f"unknown technique(s) {', '.join(unknown)}; known: {', '.join(TECHNIQUES)}")
    bench = make_bench(wl, rung, size=size, batch_size=batch_size)
    params, macs = size_of(bench)
    facts = {"workload": wl.name, "rung": rung, "params": params, "macs_per_sample": macs}
    rows: list[dict[str, Any]] = []
    for axis in AXES:
        techs = [t for t in techniques if axis in TECHNIQUES[t]]
        if progress:
            progress(f"{wl.name} {rung} ({params:,} params, {macs / 1e6:.3g} MMACs/sample) {axis}: "
                     + ", ".join(techs))
        if techs:
            with torch.random.fork_rng():
                rows += measure_axis(bench, techs, axis, repeats=repeats, block_ms=block_ms, facts=facts,
                                     deadline=deadline, budget_s=axis_budget_s, progress=progress,
                                     skip={t: why for (t, a), why in (skip or {}).items() if a == axis})
    weights = {TRAIN: params, "inference": weights_used_per_sample(bench.model)}
    return {**facts, "batch_size": bench.batch_size, "weight_params": weights}, rows
