"""The crossover map: measure every workload x rung x technique, fit the lines, find the crossovers.

:func:`build_map` measures (:mod:`.measure`); :func:`analyse` turns rows into fits, crossovers and regime
tags (:mod:`.fit`) and is pure, so a stored map can be re-analysed and the tests can feed it synthetic rows.
The JSON (``benchmarks/results/<hardware-id>/crossover.json``) is ``{"env", "rows", "crossovers", "fits"}``,
a fixed schema (``lab doctor`` reads it without importing this package), plus the benchmark envelope
(``benchmark``, ``quick``, ``measured_at``, ``figures``) that ``python -m lab bench`` reports, and
``rungs`` (each rung's size facts, for placing a user's model). ``null`` where a value does not exist.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from lab.context import thread_count
from lab.crossover.arms import AXES, TECHNIQUES
from lab.crossover.fit import (
    PAYS_GAIN,
    crossover_macs,
    first_paying_rung,
    fit_line,
    loo_error,
    params_at,
    regime,
    rung_of_macs,
    within_one_rung,
)
from lab.crossover.measure import SLOW_MARK, ProgressFn, make_bench, measure_rung
from lab.crossover.reference import compare as compare_with_plain
from lab.goals import map_row_ceiling
from lab.measure import ContentionMeter, card_summary, environment_stamp, limit_sentence, load_card
from lab.precision import capability
from lab.workloads import SCALE_NAMES, get_workload

ROW_KEYS = ("workload", "rung", "params", "macs_per_sample", "technique", "axis", "speedup", "ci_lo", "ci_hi",
            "base_ms", "tech_ms", "regime", "why")
CROSSOVER_KEYS = ("workload", "technique", "axis", "measured_params", "measured_macs", "predicted_params",
                  "predicted_macs")
FIT_KEYS = ("workload", "technique", "axis", "base_overhead_ms", "base_ms_per_mmac", "tech_overhead_ms",
            "tech_ms_per_mmac", "loo_error")
#: The ladders a map covers by default: the four built-in families and the dense reference.
#: The map's file in a machine's results folder (``benchmarks/results/<hardware-id>/``); where that folder is, and
#: which machine's map a reader wants, :func:`lab.doctor.rates.crossover_path` says.
MAP_FILE = "crossover.json"
MAP_WORKLOADS = ("ctr", "sequence", "vision", "transformer", "mlp")
#: ``--quick``: techniques cheap to build (no compile, no FX calibration, no worker processes) and, per
#: workload, the four rungs that span >= 100x parameters (ctr's embeddings make its lower rungs close).
QUICK_TECHNIQUES = ("bf16", "fp16", "amp_auto", "int8_eager", "prune_channels50", "fused_optim")
QUICK_RUNGS = {"ctr": ("xs", "s", "m", "xl")}
QUICK_BATCH_DIVISOR = 4  # quick: a quarter of the workload's batch (the fits say per which batch)
#: The batch of every rung of a ladder (fixed along it: the fits are per step at one batch). Full map: about
#: half the workload's ``small`` batch, ctr a quarter (2048 rows made its xl step ~2 s, and each arm is timed
#: ~6 times); mlp keeps the 128 rows of the plain-PyTorch reference table in both modes, so the reference
#: compares like with like. Other ladders: half their batch (full), a quarter (quick).
MAP_BATCH = {False: {"ctr": 512, "sequence": 64, "vision": 16, "transformer": 32, "mlp": 128},
             True: {"mlp": 128}}
#: Techniques timed on some rungs only, because building their arm costs far more than timing it: one
#: torch.compile of a training step took 20-50 s on this 2-core box (cold Inductor cache), ~60 % of the full
#: map's time when compiled at every rung; a PT2E int8 build (export, calibrate, Inductor with freezing) costs
#: the same. Three rungs still span the ladder and give the fit two degrees.
SPARSE_RUNGS = {t: ("xs", "m", "xl") for t in ("compile", "int8_static", "int8_auto", "prune_channels50+int8_static")}
#: Seconds of interleaved timing per rung x axis after which the rounds stop (at least 3 are always run):
#: the xl rungs' 1-2 s steps made the full map take 45 min on this 2-core box at 5 fixed rounds.
AXIS_BUDGET_S = {True: 8.0, False: 20.0}


def check_names(workloads: Sequence[str], techniques: Sequence[str]) -> None:
    """One ``ValueError`` line for an unknown technique or a workload without a ladder, before any work."""
    unknown = [t for t in techniques if t not in TECHNIQUES]
    if unknown:
        raise ValueError(f"unknown technique(s) {', '.join(unknown)}; known: {', '.join(TECHNIQUES)}")
    for name in workloads:
        wl = get_workload(name)  # unknown names raise with the list
        if not wl.scales:
            raise ValueError(f"workload {name!r} has no model-size ladder (Workload.scales); the map needs one")


def default_rungs(name: str, quick: bool) -> list[str]:
    rungs = get_workload(name).rungs()
    if not quick:
        return rungs
    return [r for r in QUICK_RUNGS.get(name, ("xs", "s", "m", "l")) if r in rungs]


def map_batch(name: str, quick: bool) -> int:
    """The batch the map times ``name``'s ladder at (:data:`MAP_BATCH`, else a share of its ``small`` batch)."""
    if name in MAP_BATCH[quick]:
        return MAP_BATCH[quick][name]
    return max(8, get_workload(name).size("small").batch_size // (QUICK_BATCH_DIVISOR if quick else 2))


def cite_machine_card(the_map: dict[str, Any]) -> None:
    """Set each low-precision / int8 row against this machine's card (``lab machine``): its ``why`` ends with
    what the GEMM peaks allow ("bf16 GEMM peak here is 0.06x fp32 ...: bf16 cannot pay on this machine"), and
    the map keeps the card's summary. Only a cached card is read (never measured here); none: nothing cited."""
    card = load_card()
    if card is None:
        return
    the_map["machine_card"] = card_summary()
    for row in the_map["rows"]:
        limit = limit_sentence(card, row["technique"])
        if limit:
            row["why"] = f"{row['why']}; card: {limit}" if row.get("why") else f"card: {limit}"


def attach_ceilings(the_map: dict[str, Any], card: dict[str, Any] | None = None) -> dict[str, Any]:
    """Give every row its ceiling and the share of it measured (:func:`lab.goals.map_row_ceiling`):
    ``ceiling``, ``ceiling_basis``, ``share_of_ceiling``, ``share_why``. The card is ``card``, else the one the map
    cited, else its environment stamp's; none: each row says "no card" rather than a guessed ceiling. A map
    row times a step whole, so a precision's ceiling is its GEMM ratio alone and a loader or a fused optimizer
    (which act on one phase) have none here. Pure over the stored rows: a committed map gains them when read.
    Returns the map (mutated)."""
    card = card or the_map.get("machine_card") or (the_map.get("env") or {}).get("machine_card")
    threads = the_map.get("threads") or (the_map.get("env") or {}).get("torch_threads") or 1
    for row in the_map["rows"]:
        row.update(map_row_ceiling(row, card, threads))
    return the_map


def emulated_skips(techniques: Sequence[str], device: str = "cpu") -> dict[tuple[str, str], str]:
    """(technique, axis) -> why not to time it, for each low precision this machine runs emulated
    (:func:`lab.precision.capability`): an emulated dtype is a reference path at 0.02-0.45x fp32 (bf16 on an
    AVX2 box), so timing it says only what the capability check already says, and it was most of the quick
    map's time there (153 s against 60-80 s with native bf16)."""
    out: dict[tuple[str, str], str] = {}
    for tech in ("bf16", "fp16"):
        cap = capability(tech, device) if tech in techniques else None
        if cap is not None and not cap.native:
            for axis in TECHNIQUES[tech]:
                out[(tech, axis)] = (f"{tech} is emulated here ({cap.reason}): it cannot pay, so this map does not "
                                     "time it (--include-emulated does)")
    return out


def slow_skips(rows: Sequence[dict[str, Any]], rung: str) -> dict[tuple[str, str], str]:
    """``{(technique, axis): why}`` for the arms of one rung's ``rows`` that were dropped as pathologically slow
    (a skipped row citing :data:`SLOW_MARK`): such an arm only gets slower with size, so it is not built again
    on the rungs above. Only the dropped arm's own row counts: ``auto``'s row quotes the fp16 arm's slow note
    while being measured itself, and reading that note as its own dropped ``auto`` from every top rung."""
    return {(row["technique"], row["axis"]): f"not measured above rung {rung}, where it was "
            + row["why"].removeprefix("skipped: ")
            for row in rows if row.get("speedup") is None and SLOW_MARK in (row.get("why") or "")}


def build_map(workloads: Sequence[str], techniques: Sequence[str], *, quick: bool = False, threads: int = 1,
              repeats: int | None = None, rungs: dict[str, Sequence[str]] | None = None,
              batch_size: dict[str, int] | None = None, progress: ProgressFn | None = None,
              skip_emulated: bool | None = None) -> dict[str, Any]:
    """Measure and analyse the map. ``rungs`` / ``batch_size`` override the per-workload defaults (all rungs,
    ``quick``: :data:`QUICK_RUNGS`; the batch of :func:`map_batch`). ``skip_emulated`` (default: ``quick``):
    bf16 / fp16 cells this machine would run emulated are skipped rows with the reason
    (:func:`emulated_skips`); the full map times them, so it shows how slow emulation is."""
    check_names(workloads, techniques)
    repeats = repeats or (4 if quick else 5)
    emulated = emulated_skips(techniques) if (quick if skip_emulated is None else skip_emulated) else {}
    if emulated and progress:
        progress("not timed: " + "; ".join(dict.fromkeys(v for v in emulated.values())))
    rows: list[dict[str, Any]] = []
    facts: list[dict[str, Any]] = []
    t0 = time.monotonic()
    meter = ContentionMeter().start()  # was the machine busy while the map was timed?
    with thread_count(threads):
        env = environment_stamp("cpu")
        for name in workloads:
            wl = get_workload(name)
            batch = (batch_size or {}).get(name) or map_batch(name, quick)
            too_slow: dict[tuple[str, str], str] = {}
            ladder = list((rungs or {}).get(name) or default_rungs(name, quick))
            for rung in ladder:
                sparse = {(t, a): f"{t} is timed on rungs {', '.join(at)} only (building its arm costs 20-50 s here)"
                          for t, at in SPARSE_RUNGS.items() if t in techniques and rung not in at
                          and len([g for g in ladder if g in at]) >= 2 for a in TECHNIQUES[t]}
                f, r = measure_rung(wl, rung, list(techniques), repeats=repeats, block_ms=15.0 if quick else 40.0,
                                    batch_size=batch, skip={**sparse, **too_slow, **emulated}, progress=progress,
                                    axis_budget_s=AXIS_BUDGET_S[quick])
                facts.append(f)
                rows += r
                for key, why in slow_skips(r, rung).items():
                    too_slow.setdefault(key, why)
        reference = _plain_reference(workloads, rungs, quick, batch_size, repeats, progress)
    out = analyse(rows, facts)
    out["reference"] = reference
    cite_machine_card(out)
    attach_ceilings(out, (env or {}).get("machine_card"))
    out["skipped_emulated"] = sorted({t for t, _ in emulated})
    out.update({"env": env, "benchmark": "crossover", "quick": quick, "threads": threads,
                "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "wall_s": round(time.monotonic() - t0, 1)})
    seen = meter.stop()
    out["contention"] = seen.to_dict() if seen is not None else None
    return out


#: The dense ladder whose largest rung is checked against plain PyTorch (:mod:`.reference`).
REFERENCE_WORKLOAD = "mlp"


def _plain_reference(workloads: Sequence[str], rungs: dict[str, Sequence[str]] | None, quick: bool,
                     batch_size: dict[str, int] | None, repeats: int,
                     progress: ProgressFn | None) -> list[dict[str, Any]]:
    """The lab's arms against plain PyTorch on the largest measured rung of the dense ladder (when mapped)."""
    if REFERENCE_WORKLOAD not in workloads:
        return []
    wl = get_workload(REFERENCE_WORKLOAD)
    rung = list((rungs or {}).get(wl.name) or default_rungs(wl.name, quick))[-1]
    if progress:
        progress(f"{wl.name} {rung}: the lab's arms against plain PyTorch (bf16, dynamic int8, half width)")
    bench = make_bench(wl, rung, batch_size=(batch_size or {}).get(wl.name) or map_batch(wl.name, quick))
    return compare_with_plain(bench, repeats=repeats, block_ms=15.0 if quick else 40.0, rung=rung)


def _order(rung: str) -> int:
    return SCALE_NAMES.index(rung) if rung in SCALE_NAMES else len(SCALE_NAMES)


def analyse(rows: list[dict[str, Any]], facts: list[dict[str, Any]]) -> dict[str, Any]:
    """Fits, crossovers and regime tags for measured ``rows`` (mutated: ``regime`` and ``why`` filled).
    ``facts``: per rung ``workload, rung, params, macs_per_sample, batch_size`` (+ ``weight_params``)."""
    fits, crossovers = [], []
    by_rung = {(f["workload"], f["rung"]): f for f in facts}
    for name in dict.fromkeys(f["workload"] for f in facts):
        ladder = sorted((f for f in facts if f["workload"] == name), key=lambda f: _order(f["rung"]))
        for axis in AXES:
            here = [r for r in rows if r["workload"] == name and r["axis"] == axis]
            base_of = {r["rung"]: r["base_ms"] for r in here
                       if r["base_ms"] is not None and r["technique"] != "workers1"}
            base_line = fit_line([by_rung[(name, g)]["macs_per_sample"] for g in base_of], list(base_of.values())) \
                if len(base_of) >= 2 else None
            for r in here:
                f = by_rung[(name, r["rung"])]
                if base_line is None or r["rung"] not in base_of:
                    r["regime"] = None
                    r["why"] = r.get("why") or ""
                    continue
                weights = f.get("weight_params", {}).get(axis, f["params"])
                tag, evidence = regime(base_line, base_of[r["rung"]], f["macs_per_sample"], f["batch_size"],
                                       weights, axis)
                r["regime"] = tag
                r["why"] = f"{tag}: {evidence}" + (f"; {r['why']}" if r.get("why") else "")
            for tech in dict.fromkeys(r["technique"] for r in here):
                fit, cross = _pair(name, tech, axis, ladder, [r for r in here if r["technique"] == tech])
                if fit is not None:
                    fits.append(fit)
                    crossovers.append(cross)
    return {"rows": [{k: r.get(k) for k in ROW_KEYS} for r in rows], "crossovers": crossovers, "fits": fits,
            "rungs": facts}


def _pair(name: str, tech: str, axis: str, ladder: list[dict[str, Any]],
          rows: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    got = {r["rung"]: r for r in rows if r["speedup"] is not None}
    steps = [f for f in ladder if f["rung"] in got]
    if len(steps) < 2:
        return None, None
    macs = [f["macs_per_sample"] for f in steps]
    base_ms = [got[f["rung"]]["base_ms"] for f in steps]
    tech_ms = [got[f["rung"]]["tech_ms"] for f in steps]
    base, t = fit_line(macs, base_ms), fit_line(macs, tech_ms)
    fit = {"workload": name, "technique": tech, "axis": axis, "base_overhead_ms": base.overhead_ms,
           "base_ms_per_mmac": base.ms_per_mmac, "tech_overhead_ms": t.overhead_ms, "tech_ms_per_mmac": t.ms_per_mmac,
           "loo_error": loo_error(macs, base_ms, tech_ms)}
    measured = first_paying_rung([got[f["rung"]]["ci_lo"] for f in steps], [got[f["rung"]]["ci_hi"] for f in steps])
    pred_macs = crossover_macs(base, t, PAYS_GAIN)
    pred_idx = rung_of_macs(macs, pred_macs)
    cross = {"workload": name, "technique": tech, "axis": axis,
             "measured_params": steps[measured]["params"] if measured is not None else None,
             "measured_macs": steps[measured]["macs_per_sample"] if measured is not None else None,
             "predicted_params": params_at(macs, [f["params"] for f in steps], pred_macs), "predicted_macs": pred_macs,
             "measured_rung": steps[measured]["rung"] if measured is not None else None,
             "predicted_rung": (steps[pred_idx]["rung"] if pred_idx < len(steps) else "above the ladder")
             if pred_idx is not None else None,
             "within_one_rung": within_one_rung(measured, pred_idx, len(steps))}
    return fit, cross


def agreement(crossovers: list[dict[str, Any]]) -> tuple[int, int]:
    """(pairs whose predicted crossover lands within one rung of the measured one, pairs)."""
    return sum(1 for c in crossovers if c.get("within_one_rung")), len(crossovers)
